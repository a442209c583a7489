"""numa_binding's unit templates rendered from real plans, read back the way
systemd reads them, and checked with systemd-analyze verify.

No systemd needs to run here: templates render on the controller, the
ExecStart=/Environment= words are parsed back with systemd's quoting rules
(systemd.syntax(7), systemd.service(5)), and systemd-analyze verify works
on unit files alone. Running units are the molecule fleet's job.
"""

import json
import os
import shutil
import subprocess
import sys

import pytest
import yaml

from ansible_run import BINDIR, ansible_env
from conftest import FIXTURES, REPO_ROOT

pytestmark = pytest.mark.ansible

ROLE = os.path.join(REPO_ROOT, "roles", "numa_binding")
HGX = os.path.join(FIXTURES, "topologies", "hgx-h200-8gpu-2socket-ht.json")
NUMACTL = "/usr/bin/numactl"
METACHAR_ARGV = ["/bin/echo", "$HOME", "a b", "; rm -rf /", "%h %n", '"q" \\x', "`id`", "$(id)", "tab\there"]

# Memory declared: under strict, bind is planned only for a checked size.
INSTANCES = [
    {"name": "llm0", "gpus": [0], "memory": "8G", "command": ["/bin/sleep", "infinity"], "memlock": "64G", "user": "svc",
     "group": "gpu"},
    {"name": "meta", "gpus": [1], "memory": "8G", "command": METACHAR_ARGV, "environment": {"NOTE": 'x $Y %n "q" \\z'}},
    {"name": "sysd", "gpus": [4], "memory": "8G", "binding_method": "systemd", "command": ["/bin/sleep", "infinity"]},
    {"name": "vendor", "unit": "vendor.service", "gpus": [5], "memory": "8G"},
    {"name": "wrapped", "unit": "other.service", "gpus": [6], "memory": "8G", "command": ["/bin/sleep", "1"]},
]

RENDER_PLAYBOOK = """
- hosts: localhost
  gather_facts: false
  vars:
    numa_binding_numactl_path: {numactl}
    numa_binding_limit_memlock: "4194304"
    numa_binding_restart_policy: on-failure
    numa_binding_plan_path: /etc/gpunuma/plan.json
    numa_binding_start_limit_interval_sec: 600
    numa_binding_start_limit_burst: 5
    # What the role derives from the node: a cgroup v2 cpuset (fences on) and nvidia-persistenced.
    __numa_binding_fence_on: true
    __numa_binding_gpu_deps: [nvidia-persistenced.service]
    __numa_binding_housekeeping: {{slice: null}}
    ansible_managed: Managed by gpunuma; local edits are overwritten
  tasks:
    - gpu_binding_plan:
        topology: "{{{{ lookup('ansible.builtin.file', '{topology}') | from_json }}}}"
        profile_data: "{{{{ lookup('ansible.builtin.file', '{profiles}/{profile}.yml') | from_yaml }}}}"
        instances: "{{{{ lookup('ansible.builtin.file', '{instances}') | from_json }}}}"
        # As roles/numa_binding/tasks/plan.yml passes it: the templates read each instance's limit_memlock.
        limit_memlock: "{{{{ numa_binding_limit_memlock }}}}"
      register: planned
    - ansible.builtin.copy:
        content: "{{{{ planned.plan | to_json }}}}"
        dest: "{out}/plan.json"
        mode: "0644"
    - ansible.builtin.template:
        src: "{role}/templates/instance.service.j2"
        dest: "{out}/{{{{ item.unit }}}}"
        mode: "0644"
      loop: "{{{{ planned.plan.instances | selectattr('mode', 'eq', 'service') | list }}}}"
    - ansible.builtin.template:
        src: "{role}/templates/instance-dropin.conf.j2"
        dest: "{out}/{{{{ item.unit }}}}.conf"
        mode: "0644"
      loop: "{{{{ planned.plan.instances | selectattr('mode', 'eq', 'dropin') | list }}}}"
"""


def _unescape_word(word, expand_dollar):
    out = []
    pos = 0
    while pos < len(word):
        char = word[pos]
        if char == "\\":
            nxt = word[pos + 1]
            simple = {"\\": "\\", '"': '"', "'": "'", "n": "\n", "t": "\t", "r": "\r"}
            if nxt in simple:
                out.append(simple[nxt])
                pos += 2
                continue
            if nxt == "x":
                out.append(chr(int(word[pos + 2:pos + 4], 16)))
                pos += 4
                continue
            raise AssertionError("unexpected escape in %r" % word)
        if char == "%":
            assert word[pos + 1] == "%", "unescaped specifier in %r" % word
            out.append("%")
            pos += 2
            continue
        if char == "$" and expand_dollar:
            assert word[pos + 1] == "$", "unescaped variable in %r" % word
            out.append("$")
            pos += 2
            continue
        out.append(char)
        pos += 1
    return "".join(out)


def _split_quoted(value):
    """Words of a value made of double-quoted words separated by spaces."""
    words = []
    pos = 0
    while pos < len(value):
        assert value[pos] == '"', "word not quoted at %d in %r" % (pos, value)
        end = pos + 1
        while value[end] != '"':
            end += 2 if value[end] == "\\" else 1
        words.append(value[pos + 1:end])
        pos = end + 1
        if pos < len(value):
            assert value[pos] == " "
            pos += 1
    return words


def parse_exec_start(value):
    """argv systemd runs for an ExecStart= value of quoted words."""
    words = _split_quoted(value)
    # No variable expansion in the executable name, only in arguments.
    return [_unescape_word(words[0], False)] + [_unescape_word(w, True) for w in words[1:]]


def parse_environment(value):
    (word,) = _split_quoted(value)
    name, _, text = _unescape_word(word, False).partition("=")
    return name, text


def directives(text):
    """Service-section directives in order, as (key, value) pairs."""
    pairs = []
    for line in text.splitlines():
        if line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            pairs.append((key, value))
    return pairs


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    out = tmp_path_factory.mktemp("units")
    instances = out / "instances.json"
    instances.write_text(json.dumps(INSTANCES))
    playbook = out / "render.yml"
    playbook.write_text(
        RENDER_PLAYBOOK.format(
            numactl=NUMACTL, topology=HGX, profiles=os.path.join(REPO_ROOT, "policies", "profiles"),
            profile="strict", instances=instances, role=ROLE, out=out,
        )
    )
    proc = subprocess.run(
        [os.path.join(BINDIR, "ansible-playbook"), "-i", "localhost,", "-c", "local",
         "-e", "ansible_python_interpreter=" + sys.executable, str(playbook)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
        # The repository's ansible.cfg names filter_plugins/, where the role's filters live.
        env=ansible_env(),
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    plan = json.loads((out / "plan.json").read_text())
    return out, {i["name"]: i for i in plan["instances"]}


def _unit_text(rendered, name):
    out, plan = rendered
    instance = plan[name]
    suffix = ".conf" if instance["mode"] == "dropin" else ""
    return (out / (instance["unit"] + suffix)).read_text(), instance


@pytest.mark.parametrize("name", ["llm0", "meta"])
def test_exec_start_runs_numactl_then_the_command_verbatim(rendered, name):
    text, instance = _unit_text(rendered, name)
    (exec_start,) = [v for k, v in directives(text) if k == "ExecStart"]
    assert parse_exec_start(exec_start) == [NUMACTL] + instance["numactl_args"] + instance["command"]
    assert instance["command"] == next(i["command"] for i in INSTANCES if i["name"] == name)


def _by_key(text):
    values = {}
    for key, value in directives(text):
        values.setdefault(key, []).append(value)
    return values


def test_fences_start_limit_and_gpu_ordering(rendered):
    text, instance = _unit_text(rendered, "llm0")
    values = _by_key(text)
    assert values["AllowedCPUs"] == [instance["cpus"]]
    assert instance["mem_policy"] == "bind"
    assert values["AllowedMemoryNodes"] == [",".join(str(n) for n in instance["mem_nodes"])]
    assert values["StartLimitBurst"] == ["5"] and values["StartLimitIntervalSec"] == ["600"]
    assert "nvidia-persistenced.service" in values["After"] and "nvidia-persistenced.service" in values["Wants"]
    dropin, vendor = _unit_text(rendered, "vendor")
    dvalues = _by_key(dropin)
    assert dvalues["AllowedCPUs"] == [vendor["cpus"]]
    assert dvalues["After"] == ["nvidia-persistenced.service"]
    # A drop-in leaves the vendor unit's own LimitMEMLOCK= alone unless the instance sets one.
    assert "LimitMEMLOCK" not in dvalues


def test_environment_reaches_the_program_verbatim(rendered):
    text, instance = _unit_text(rendered, "meta")
    environment = dict(parse_environment(v) for k, v in directives(text) if k == "Environment")
    assert environment == instance["environment"]
    assert environment["NOTE"] == 'x $Y %n "q" \\z'
    assert environment["CUDA_VISIBLE_DEVICES"].startswith("GPU-")


def test_systemd_method_renders_directives_and_a_bare_command(rendered):
    text, instance = _unit_text(rendered, "sysd")
    found = dict(directives(text))
    assert parse_exec_start(found["ExecStart"]) == ["/bin/sleep", "infinity"]
    assert found["CPUAffinity"] == instance["cpus"]
    assert (found["NUMAPolicy"], found["NUMAMask"]) == ("bind", "1")


def test_account_and_limits(rendered):
    text, _ = _unit_text(rendered, "llm0")
    found = dict(directives(text))
    assert (found["User"], found["Group"]) == ("svc", "gpu")
    assert found["LimitMEMLOCK"] == str(64 << 30)
    assert found["Restart"] == "on-failure"
    assert found["Type"] == "exec"
    other, _ = _unit_text(rendered, "meta")
    assert dict(directives(other))["LimitMEMLOCK"] == "4194304"
    assert "Group" not in dict(directives(other))


def test_dropin_resets_list_settings_before_binding(rendered):
    text, instance = _unit_text(rendered, "vendor")
    pairs = directives(text)
    assert ("ExecStart", "") not in pairs
    assert pairs.index(("CPUAffinity", "")) + 1 == pairs.index(("CPUAffinity", instance["cpus"]))
    assert pairs.index(("NUMAMask", "")) + 1 == pairs.index(("NUMAMask", "1"))
    assert ("NUMAPolicy", "bind") in pairs


def test_dropin_with_a_command_replaces_exec_start(rendered):
    text, instance = _unit_text(rendered, "wrapped")
    pairs = directives(text)
    starts = [v for k, v in pairs if k == "ExecStart"]
    assert starts[0] == ""
    assert parse_exec_start(starts[1]) == [NUMACTL] + instance["numactl_args"] + ["/bin/sleep", "1"]


def test_every_template_starts_with_the_managed_header(rendered):
    out, plan = rendered
    for instance in plan.values():
        text, _ = _unit_text(rendered, instance["name"])
        assert text.startswith("#\n# Managed by gpunuma; local edits are overwritten\n#\n")


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze is not installed")
@pytest.mark.skipif(not os.path.exists(NUMACTL), reason="numactl is not installed")
@pytest.mark.parametrize("name", ["llm0", "meta", "sysd"])
def test_rendered_unit_passes_systemd_analyze_verify(rendered, name, tmp_path):
    text, instance = _unit_text(rendered, name)
    # The accounts named in llm0 need not exist for verify; copy under the unit's name.
    unit = tmp_path / instance["unit"]
    unit.write_text(text)
    proc = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


# ----------------------------------------------------- validation in the role


def _role_playbook(tmp_path, plan):
    playbook = tmp_path / "apply.yml"
    playbook.write_text(yaml.safe_dump([{
        "hosts": "localhost",
        "gather_facts": False,
        "vars": {
            "gpunuma_plan": plan,
            "ansible_managed": "Managed by gpunuma; local edits are overwritten",
            "numa_binding_unit_dir": str(tmp_path / "units"),
            "numa_binding_plan_path": str(tmp_path / "plan.json"),
            "numa_binding_start": False,
            "numa_binding_prune": False,
        },
        "roles": ["numa_binding"],
    }]))
    (tmp_path / "units").mkdir()
    return playbook


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze is not installed")
@pytest.mark.skipif(not os.path.exists(NUMACTL), reason="numactl is not installed")
def test_unit_failing_systemd_analyze_verify_is_not_installed(rendered, tmp_path):
    _, plan = rendered
    broken = dict(plan["sysd"], command=["/opt/gpunuma-test/missing/server", "--port", "8000"])
    playbook = _role_playbook(tmp_path, {"schema": "gpunuma.plan/v1", "instances": [broken], "warnings": []})
    proc = subprocess.run(
        [os.path.join(BINDIR, "ansible-playbook"), "-i", "localhost,", "-c", "local",
         "-e", "ansible_python_interpreter=" + sys.executable, str(playbook)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, env=ansible_env(),
    )
    assert proc.returncode != 0
    assert "failed to validate" in proc.stdout
    assert "/opt/gpunuma-test/missing/server is not executable" in proc.stdout
    assert os.listdir(tmp_path / "units") == []
    assert not (tmp_path / "plan.json").exists()


# ------------------------------------------- housekeeping options through the role


def _plan_through_role(tmp_path, extra_vars):
    """gpunuma_plan from the role's validate and plan entry points on localhost (HGX fixture)."""
    playbook = tmp_path / "plan.yml"
    play_vars = {
        "gpu_topology": json.load(open(HGX)),
        "gpunuma_profile": "strict",
        "gpunuma_instances": [{"name": "llm0", "gpus": [0], "memory": "8G", "command": ["/bin/sleep", "infinity"]}],
        "numa_binding_plan_path": str(tmp_path / "applied.json"),
        "numa_binding_start": False,
    }
    play_vars.update(extra_vars)
    playbook.write_text(yaml.safe_dump([{
        "hosts": "localhost",
        "gather_facts": False,
        "vars": play_vars,
        "tasks": [
            {"ansible.builtin.include_role": {"name": "numa_binding", "tasks_from": "validate"}},
            {"ansible.builtin.include_role": {"name": "numa_binding", "tasks_from": "plan"}},
            {"ansible.builtin.copy": {"content": "{{ gpunuma_plan | to_json }}", "dest": str(tmp_path / "out.json"),
                                      "mode": "0644"}},
        ],
    }]))
    proc = subprocess.run(
        [os.path.join(BINDIR, "ansible-playbook"), "-i", "localhost,", "-c", "local",
         "-e", "ansible_python_interpreter=" + sys.executable, str(playbook)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, env=ansible_env(),
    )
    return proc, (json.loads((tmp_path / "out.json").read_text()) if proc.returncode == 0 else None)


def _expected_auto_housekeeping(topology):
    """ceil(cores / 24), at least 1, lowest cores with their siblings, per CPU node (docs/plan-v1.md)."""
    from ansible.module_utils.gpunuma.common.cpulist import format_cpulist, parse_cpulist

    expected = {}
    for node in topology["numa_nodes"]:
        cores = sorted(node["cores"], key=lambda core: min(parse_cpulist(core)))
        count = max(1, -(-len(cores) // 24))
        expected[str(node["id"])] = format_cpulist(set().union(*(parse_cpulist(c) for c in cores[:count])))
    return expected


def test_role_passes_auto_housekeeping_to_the_planner(tmp_path):
    topology = json.load(open(HGX))
    proc, plan = _plan_through_role(tmp_path, {})  # nothing set: the default, auto
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert plan["options"]["housekeeping_cores_per_node"] == "auto"
    # 48 cores per node: 2 whole cores with their siblings, not the 1 (or 0) a forced int gave.
    assert plan["housekeeping"] == _expected_auto_housekeeping(topology) == {"0": "0-1,96-97", "1": "48-49,144-145"}


def test_role_passes_a_count_as_given(tmp_path):
    proc, plan = _plan_through_role(tmp_path, {"gpunuma_housekeeping_cores_per_node": "3"})
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert plan["housekeeping"] == {"0": "0-2,96-98", "1": "48-50,144-146"}


def test_role_passes_an_explicit_housekeeping_cpu_list(tmp_path):
    proc, plan = _plan_through_role(tmp_path, {"gpunuma_housekeeping_cpus": "0-3,96-99,48,144"})
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert plan["housekeeping"] == {"0": "0-3,96-99", "1": "48,144"}
    from ansible.module_utils.gpunuma.common.cpulist import parse_cpulist

    assert parse_cpulist(plan["options"]["housekeeping_cpus"]) == {0, 1, 2, 3, 96, 97, 98, 99, 48, 144}
    worker = set()

    for instance in plan["instances"]:
        worker |= parse_cpulist(instance["cpus"])
    assert not worker & {0, 1, 2, 3, 96, 97, 98, 99, 48, 144}


def test_role_passes_the_memory_reserve(tmp_path):
    # A reserve larger than the node: the declared 8G no longer fits, strict falls back to preferred.
    proc, plan = _plan_through_role(tmp_path, {"gpunuma_memory_reserve_per_node": "2000G"})
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert plan["options"]["memory_reserve_per_node"] == 2000 * 2**30
    (instance,) = plan["instances"]
    assert instance["mem_policy"] == "preferred" and instance["fallback"]


@pytest.mark.parametrize("name, value, needle", [
    ("gpunuma_housekeeping_cores_per_node", -1, "gpunuma_housekeeping_cores_per_node: -1 is not a core count"),
    ("gpunuma_housekeeping_cores_per_node", "lots", 'gpunuma_housekeeping_cores_per_node: "lots" is not a core count'),
    ("gpunuma_housekeeping_cpus", "0-x", 'gpunuma_housekeeping_cpus: "0-x" is not a CPU list'),
])
def test_role_refuses_bad_housekeeping_before_planning(tmp_path, name, value, needle):
    proc, plan = _plan_through_role(tmp_path, {name: value})
    assert proc.returncode != 0 and plan is None
    assert needle in proc.stdout, proc.stdout[-3000:]
    assert "Traceback" not in proc.stdout + proc.stderr
