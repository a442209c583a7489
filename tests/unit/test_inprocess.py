"""ControllerModule, AnsibleModule's stand-in for a module's body called in the controller's process."""

import pytest

from ansible.module_utils.gpunuma.common.inprocess import run_module

pytestmark = pytest.mark.unit

SPEC = dict(argument_spec=dict(name=dict(type="str", required=True), token=dict(type="str", no_log=True),
                               count=dict(type="int", default=2)),
            mutually_exclusive=[("name", "token")], supports_check_mode=True)


def echo(module):
    module.warn("careful with %s" % module.params["name"])
    module.exit_json(changed=module.check_mode, seen=dict(module.params))


def test_validated_arguments_defaults_and_check_mode():
    result = run_module(SPEC, echo, {"name": "a", "count": "3"}, check_mode=True, name="echo")
    assert result["seen"] == {"name": "a", "token": None, "count": 3}
    assert result["changed"] is True and result["warnings"] == ["careful with a"]
    assert result["invocation"]["module_args"] == {"name": "a", "token": None, "count": 3}


def test_no_log_values_are_masked_everywhere():
    def leak(module):
        module.fail_json(msg="cannot use %s" % module.params["token"], token=module.params["token"])

    result = run_module(dict(SPEC, mutually_exclusive=[]), leak, {"name": "a", "token": "s3cret-value"}, name="leak")
    assert result["failed"] is True
    assert "s3cret-value" not in repr(result)
    assert result["msg"] == "cannot use ********"


def test_argument_errors_name_the_option():
    assert run_module(SPEC, echo, {}, name="echo")["msg"] == "missing required arguments: name"
    assert run_module(SPEC, echo, {"name": "a", "token": "tok-123"}, name="echo")["msg"] == \
        "parameters are mutually exclusive: name|token"
    unsupported = run_module(SPEC, echo, {"name": "a", "colour": 1}, name="echo")["msg"]
    assert unsupported.startswith("Unsupported parameters for (echo) module: colour.")
    assert "count must be" not in unsupported


def test_a_crash_is_a_failure_with_its_traceback():
    def crash(module):
        return {}["missing"]

    result = run_module(SPEC, crash, {"name": "a"}, name="crash")
    assert result["failed"] is True and result["msg"] == "crash failed: KeyError: 'missing'"
    assert "Traceback" in result["exception"]


def test_a_body_that_never_exits_fails():
    result = run_module(SPEC, lambda module: None, {"name": "a"}, name="quiet")
    assert result == {"failed": True, "msg": "quiet ended without a result (neither exit_json nor fail_json)"}
