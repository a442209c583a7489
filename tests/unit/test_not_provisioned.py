"""The line site.yml ends a failed host with (filter gpunuma_not_provisioned)."""

import importlib.util
import os

import pytest

from conftest import REPO_ROOT

pytestmark = pytest.mark.unit

_spec = importlib.util.spec_from_file_location("gpunuma_filters_np", os.path.join(REPO_ROOT, "filter_plugins", "gpunuma.py"))
filters = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(filters)
line = filters.gpunuma_not_provisioned

# What ansible-core 2.19 returns for a module whose node rebooted mid-run.
REBOOTED = {"failed": True, "msg": "Module result deserialization failed: No start of json char found",
            "module_stdout": "", "module_stderr": "", "rc": -1}
MODULE_FAILURE = {"failed": True, "msg": "MODULE FAILURE\nSee stdout/stderr for the exact error",
                  "module_stdout": "", "module_stderr": "Shared connection to gpu-a01 closed.\r\n", "rc": 255}
DOCKER_GONE = {"failed": True, "msg": "MODULE FAILURE", "module_stderr": "Error response from daemon: container "
               "abc is not running", "rc": 1}
LOCK = {"failed": True, "msg": "another gpunuma run holds this node: controller c1, user oncall, playbook site.yml"}


@pytest.mark.parametrize("result", [REBOOTED, MODULE_FAILURE, DOCKER_GONE, {"unreachable": True, "msg": "timed out"}])
def test_a_node_that_went_away_is_said_to_have_gone(result):
    text = line("gpu-a01", "Install and start the bound instances", result)
    assert text.startswith('NOT PROVISIONED: gpu-a01 failed at "Install and start the bound instances": ')
    assert "the node stopped answering during this step" in text and "a plain re-run converges it" in text
    assert str(result["msg"]).strip() in text


def test_any_other_failure_keeps_its_own_message():
    text = line("gpu-a01", "Take the node lock", LOCK)
    assert text == 'NOT PROVISIONED: gpu-a01 failed at "Take the node lock": ' + LOCK["msg"]
    assert "stopped answering" not in text


@pytest.mark.parametrize("result", [None, {}, "x", {"msg": None}])
def test_a_result_without_a_message_still_names_host_and_step(result):
    assert line("h", "", result) == 'NOT PROVISIONED: h failed at "an unnamed step": no message'
