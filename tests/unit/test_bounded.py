"""Bounded reading (module_utils/gpunuma/common/bounded.py) and every JSON reader of gpunuma's own files."""

import json
import os

import pytest
from hypothesis import given, settings, strategies as st

from ansible.module_utils.gpunuma.common import bounded
from ansible.module_utils.gpunuma.discovery.nvidia import nvml
from ansible.module_utils.gpunuma.common import errors
from ansible.module_utils.gpunuma.kubelet import config as kubelet_config
from ansible.module_utils.gpunuma.kubelet.plan import checkpoint_policy
from ansible.module_utils.gpunuma.common import seal
from ansible.module_utils.gpunuma.plan import state
from conftest import examples

pytestmark = pytest.mark.unit

DEEP = "[" * 200_000 + "]" * 200_000
DEEP_OBJECT = '{"a":' * 100_000 + "1" + "}" * 100_000


@pytest.mark.parametrize("text, depth", [("{}", 1), ("[]", 1), ('{"a": [1, {"b": []}]}', 4), ('"[[[["', 0),
                                          ('{"k": "a\\"[[["}', 1), ("5", 0)])
def test_depth_skips_strings(text, depth):
    assert bounded.json_depth(text) == depth


@pytest.mark.parametrize("text", [DEEP, DEEP_OBJECT, b"[" * 70 + b"]" * 70])
def test_deep_documents_are_refused_as_bad_json_not_a_recursion_error(text):
    with pytest.raises(ValueError, match="nested deeper than 64 levels"):
        bounded.loads_json(text)


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=3), children,
                                                                                        max_size=3), max_leaves=20))
@settings(max_examples=examples(100), deadline=None)
def test_shallow_documents_load_as_json_loads_them(value):
    text = json.dumps(value)
    if bounded.json_depth(text) <= bounded.MAX_JSON_DEPTH:
        assert bounded.loads_json(text) == json.loads(text)


@pytest.mark.parametrize("reader", ["state", "seal", "checkpoint", "kubelet", "nvml"])
def test_every_reader_of_gpunumas_json_refuses_a_deep_document_with_its_own_message(reader, tmp_path):
    if reader == "state":
        with pytest.raises(state.StateCorrupt, match="state.json: not valid JSON"):
            state.parse_state(DEEP, "/etc/gpunuma/state.json")
    elif reader == "seal":
        result = seal.read_state_file(DEEP, "/etc/gpunuma/plan.json", "gpunuma.plan/v1", "move it aside",
                                             encoding="text")
        assert "not valid JSON" in result["problem"] and result["data"] is None
    elif reader == "checkpoint":
        assert checkpoint_policy(DEEP) is None
    elif reader == "kubelet":
        for text in (DEEP, DEEP_OBJECT, "kind: KubeletConfiguration\nx: " + DEEP):
            with pytest.raises(kubelet_config.KubeletConfigError, match="/var/lib/kubelet/config.yaml: is not valid"):
                kubelet_config.parse_config(text, "/var/lib/kubelet/config.yaml")
    else:
        dump = tmp_path / "nvml-dump.json"
        dump.write_text(DEEP)
        with pytest.raises(errors.NvmlError, match="is not valid JSON: nested deeper than 64 levels"):
            nvml.load_dump(str(dump))


@pytest.mark.parametrize("kind", ["fifo", "dev-zero-link", "directory", "too-big"])
def test_the_reader_refuses_what_is_not_a_small_regular_file(tmp_path, kind):
    path = tmp_path / "state.json"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero-link":
        path.symlink_to("/dev/zero")
    elif kind == "directory":
        path.mkdir()
    else:
        path.write_bytes(b"x" * 2048)
    with pytest.raises(OSError) as err:
        bounded.read_bounded(str(path), 1024, follow_symlinks=True, what="a gpunuma state file")
    assert "gpunuma state file" in str(err.value.strerror)
