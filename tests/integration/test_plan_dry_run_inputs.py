"""Hostile inventories and damaged nodes, on localhost.

* The corpus tests/fixtures/hostile/inventory/*.yml: every file's host is
  refused by site.yml's validation play with a message naming the variable
  the user set, and nothing is written anywhere (one --check run for all).
* Inventory host names such as ../../x name controller files inside
  gpu_topology_controller_dir, through the documented %XX mapping.
* A damaged /etc/gpunuma/topology.json or plan.json stops the host with a
  message naming the file and how to recover; the file is left as it is, and
  replaced only with gpu_topology_accept_changes, keeping a backup.

Hosts run locally (ansible_connection: local); their "node" files live in a
temporary directory and their topology comes from a published
`nvidia-smi topo -m` of an 8-GPU H200 server, read on the controller.
"""

import glob
import json
import os
import sys

import pytest
import yaml

from ansible.module_utils.gpunuma.common import seal
from ansible_run import run_playbook, run_playbook_json as run_json
from conftest import FIXTURES, REPO_ROOT

pytestmark = pytest.mark.ansible

HOSTILE = sorted(glob.glob(os.path.join(FIXTURES, "hostile", "inventory", "*.yml")))
TOPO_TEXT = os.path.join(FIXTURES, "published", "hgx-h200-8gpu-10nic-tabs.topo.txt")
GOOD = [{"name": "worker", "gpus": [0], "command": ["/bin/sleep", "infinity"]}]


def local_vars(tmp, node):
    """Variables that keep every file a host could write under ``node``."""
    return {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        "gpu_topology_nvidia_smi_topo_file": TOPO_TEXT,
        "gpu_topology_offline_on_controller": True,
        "gpu_topology_controller_dir": str(tmp / "controller"),
        "gpu_topology_node_path": str(node / "etc/gpunuma/topology.json"),
        "numa_binding_plan_path": str(node / "etc/gpunuma/plan.json"),
        "numa_binding_unit_dir": str(node / "etc/systemd/system"),
        "numa_binding_start": False,
        "memlock_limits_path": str(node / "etc/security/limits.d/90-gpunuma-memlock.conf"),
        "memlock_containerd_dropin_path": str(node / "etc/systemd/system/containerd.service.d/50-gpunuma.conf"),
        "autonuma_sysctl_file": str(node / "etc/sysctl.d/60-gpunuma-numa-balancing.conf"),
    }


def files_under(path):
    return sorted(os.path.relpath(os.path.join(root, f), str(path)) for root, _, fs in os.walk(str(path)) for f in fs)


# ------------------------------------------------------------------ corpus


def _case(path):
    with open(path, encoding="utf-8") as handle:
        inventory = yaml.safe_load(handle)
    ((host, host_vars),) = inventory["all"]["hosts"].items()
    return host, host_vars


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hostile")
    node = tmp / "node"
    hosts = {}
    for path in HOSTILE:
        host, host_vars = _case(path)
        hosts[host] = {k: v for k, v in host_vars.items()}
    common = dict(local_vars(tmp, node), gpunuma_instances=GOOD)
    # The hostile files are loaded as they are (YAML 1.1 booleans included):
    # each is its own inventory source, and the group variables come last.
    (tmp / "common.yml").write_text(yaml.safe_dump({"all": {"vars": common}}))
    sources = []
    for path in HOSTILE:
        sources += ["-i", path]
    rc, failures, out = run_json("playbooks/site.yml", tmp / "common.yml", *sources, "--check")
    return tmp, node, rc, failures, out, hosts


@pytest.mark.parametrize("path", HOSTILE, ids=[os.path.basename(p)[:-4] for p in HOSTILE])
def test_hostile_inventory_is_refused_naming_the_variable(hostile_run, path):
    tmp, node, rc, failures, out, _ = hostile_run
    host, host_vars = _case(path)
    assert rc != 0
    assert host in failures, "%s was not refused:\n%s" % (host, out[-3000:])
    (stop,) = [f for f in failures[host] if f["task"] == "Stop every host when any host's input is bad"]
    message = stop["msg"]
    for needle in host_vars["hostile_expect"]:
        assert needle in message, (needle, message)
    # A sentence a user can act on: never the argument spec, never a traceback.
    assert "argument_spec" not in message and "Traceback" not in message and "<class" not in message
    assert host in message


def test_hostile_inventories_change_nothing(hostile_run):
    tmp, node, rc, failures, out, hosts = hostile_run
    assert set(failures) >= set(hosts)
    assert not node.exists() or files_under(node) == []
    assert files_under(tmp / "controller") == [] if (tmp / "controller").exists() else True
    assert "Provision the GPU nodes" not in out


# ------------------------------------------------------- controller file names


def test_host_names_cannot_leave_the_controller_dir(tmp_path):
    controller = tmp_path / "a" / "b" / "controller"
    inventory = {"all": {"vars": dict(local_vars(tmp_path, tmp_path / "node"), gpunuma_instances=GOOD,
                                      gpu_topology_controller_dir=str(controller),
                                      gpu_topology_node_path="/nonexistent/gpunuma/topology.json",
                                      numa_binding_plan_path="/nonexistent/gpunuma/plan.json"),
                         "hosts": {"../../x": {}, ".hidden": {}, "100%": {}, "gpu-a01.example.net": {}}}}
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump(inventory))
    rc, failures, out = run_json("playbooks/plan.yml", tmp_path / "inventory.yml")
    assert rc == 0, out[-4000:]
    assert files_under(tmp_path / "a") == sorted(
        "b/controller/" + stem + suffix
        for stem in ("%2E.%2F..%2Fx", "%2Ehidden", "100%25", "gpu-a01.example.net")
        for suffix in (".json", ".plan.json")
    )
    assert not (tmp_path / "x").exists() and not (tmp_path / "a" / "x").exists()
    assert not (tmp_path / "node").exists()


# ------------------------------------------------------------ damaged state

PLAN_OK = {"schema": "gpunuma.plan/v1", "instances": []}


def _edited(document, key, value):
    """``document`` as gpunuma writes it (sealed), then edited by hand."""
    sealed = seal.seal(document)
    sealed[key] = value
    return sealed


def _edited_topology():
    topology = json.load(open(os.path.join(FIXTURES, "topologies", "hgx-h200-8gpu-2socket-ht.json")))
    edited = seal.seal(topology)
    edited["numa_nodes"][0]["cpus"] += ",4095"  # a CPU moved to the node by hand, the fingerprint untouched
    return edited


@pytest.fixture(scope="module")
def damaged_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("damaged")
    cases = {
        "topology-not-json": ("etc/gpunuma/topology.json", "{\"schema\": \"gpunuma.topology/v1\", \"fingerp"),
        "topology-binary": ("etc/gpunuma/topology.json", b"\xff\xfe\x00garbage"),
        "topology-empty": ("etc/gpunuma/topology.json", ""),
        "topology-wrong-schema": ("etc/gpunuma/topology.json", json.dumps({"schema": "other/v9"})),
        "plan-not-json": ("etc/gpunuma/plan.json", "{\"instances\": [\n"),
        "plan-a-list": ("etc/gpunuma/plan.json", "[]"),
        "plan-malformed": ("etc/gpunuma/plan.json",
                           json.dumps({"schema": "gpunuma.plan/v1", "instances": [{"name": 5, "memory_bytes": "x"}]})),
        "controller-copy-not-json": ("controller", "not json"),
        "topology-edited": ("etc/gpunuma/topology.json", json.dumps(_edited_topology(), indent=1)),
        "plan-edited": ("etc/gpunuma/plan.json", json.dumps(_edited(
            {"schema": "gpunuma.plan/v1", "profile": "strict", "instances": []}, "profile", "interleave"))),
    }
    hosts = {}
    for host, (relative, content) in cases.items():
        node = tmp / host
        host_vars = dict(local_vars(tmp, node), gpunuma_instances=GOOD,
                         gpu_topology_controller_dir=str(tmp / host / "controller"))
        target = node / relative if relative != "controller" else tmp / host / "controller" / (host + ".json")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content if isinstance(content, bytes) else content.encode())
        hosts[host] = host_vars
    (tmp / "inventory.yml").write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    before = {h: {f: (tmp / h / f).read_bytes() for f in files_under(tmp / h)} for h in hosts}
    rc, failures, out = run_json("playbooks/plan.yml", tmp / "inventory.yml")
    after = {h: {f: (tmp / h / f).read_bytes() for f in files_under(tmp / h)} for h in hosts}
    return tmp, rc, failures, out, before, after


@pytest.mark.parametrize(
    "host, needles",
    [
        ("topology-not-json", ["etc/gpunuma/topology.json is not valid JSON", "gpu_topology_accept_changes=true",
                               "kept as a backup", "move it aside"]),
        ("topology-binary", ["etc/gpunuma/topology.json is not UTF-8 text"]),
        ("topology-empty", ["etc/gpunuma/topology.json is empty"]),
        ("topology-wrong-schema", ['is not a gpunuma.topology/v1 document (schema: "other/v9")']),
        ("plan-not-json", ["etc/gpunuma/plan.json is not valid JSON", "move it aside", "It is left as it is"]),
        ("plan-a-list", ["etc/gpunuma/plan.json holds a JSON list, not a gpunuma.plan/v1 object"]),
        ("controller-copy-not-json", ["controller file", "controller-copy-not-json.json is not valid JSON",
                                      "gpu_topology_accept_changes=true"]),
        ("topology-edited", ["etc/gpunuma/topology.json was changed after gpunuma wrote it",
                             "gpu_topology_accept_changes=true"]),
        ("plan-edited", ["etc/gpunuma/plan.json was changed after gpunuma wrote it", "move it aside"]),
    ],
)
def test_damaged_state_file_is_named_and_kept(damaged_run, host, needles):
    tmp, rc, failures, out, before, after = damaged_run
    assert host in failures, out[-3000:]
    message = " ".join(str(f.get("msg")) for f in failures[host])
    for needle in needles:
        assert needle in message, (needle, message)
    assert "Traceback" not in message and "MODULE FAILURE" not in message
    # Nothing rewritten: the damaged file is exactly as it was, and no new file.
    assert set(after[host]) - set(before[host]) <= {"controller/%s.json" % host}
    for name, content in before[host].items():
        assert after[host][name] == content, name


def test_malformed_applied_plan_does_not_crash_the_module(damaged_run):
    tmp, rc, failures, out, before, after = damaged_run
    for failure in failures.get("plan-malformed", []):
        message = str(failure.get("msg"))
        assert "Traceback" not in message and "MODULE FAILURE" not in message, message
        assert "plan.json" in message, message
    assert after["plan-malformed"]["etc/gpunuma/plan.json"] == before["plan-malformed"]["etc/gpunuma/plan.json"]


def test_accepting_replaces_a_damaged_topology_and_keeps_a_backup(tmp_path):
    node = tmp_path / "node"
    damaged = node / "etc" / "gpunuma" / "topology.json"
    damaged.parent.mkdir(parents=True)
    damaged.write_text("{truncated")
    inventory = {"all": {"hosts": {"node1": local_vars(tmp_path, node)}}}
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump(inventory))
    rc, failures, out = run_json("playbooks/discover.yml", tmp_path / "inventory.yml")
    assert rc != 0 and "node1" in failures
    assert damaged.read_text() == "{truncated"
    rc, failures, out = run_json("playbooks/discover.yml", tmp_path / "inventory.yml",
                                 "-e", "gpu_topology_accept_changes=true")
    assert rc == 0, out[-3000:]
    written = json.loads(damaged.read_text())
    assert written["schema"] == "gpunuma.topology/v1"
    assert seal.is_sealed(written) and seal.problem(written) is None
    backups = [p for p in damaged.parent.iterdir() if p.name.startswith("topology.json.") and p.name.endswith("~")]
    assert [b.read_text() for b in backups] == ["{truncated"]
    # Its checksum removed (same hardware): refused like an edit, left as it is; accepted, replaced with a backup.
    stripped = {k: v for k, v in written.items() if k != "checksum"}
    damaged.write_text(json.dumps(stripped, indent=1))
    rc, failures, out = run_json("playbooks/discover.yml", tmp_path / "inventory.yml")
    assert rc != 0 and "carries no checksum" in json.dumps(failures["node1"]), out[-3000:]
    assert json.loads(damaged.read_text()) == stripped
    rc, failures, out = run_json("playbooks/discover.yml", tmp_path / "inventory.yml",
                                 "-e", "gpu_topology_accept_changes=true")
    assert rc == 0, out[-3000:]
    assert json.loads(damaged.read_text()) == written
    backups = [p for p in damaged.parent.iterdir() if p.name.startswith("topology.json.") and p.name.endswith("~")]
    contents = [b.read_text() for b in backups]
    assert len(contents) == 2 and "{truncated" in contents
    assert json.loads(next(c for c in contents if c != "{truncated")) == stripped


# ------------------------------------------------------- the dry run's verdict


def _refusing_gate(tmp_path):
    """An inventory whose one host's plan fails an error rule (SITE-HK-099: 64 housekeeping cores, more than any
    node keeps); returns (the node directory, the rules directory, the rule)."""
    rules = tmp_path / "rules"
    rules.mkdir()
    with open(os.path.join(REPO_ROOT, "policies", "rules", "GN-HK-001.yml"), encoding="utf-8") as handle:
        rule = yaml.safe_load(handle)
    rule.update(id="SITE-HK-099", severity="error", params={"min_cores": 64})
    (rules / "SITE-HK-099.yml").write_text(yaml.safe_dump(rule))
    node = tmp_path / "node"
    host_vars = dict(local_vars(tmp_path, node), gpunuma_instances=GOOD, policy_gate_rules_dir=str(rules),
                     gpunuma_housekeeping_cores_per_node=1)
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump({"all": {"hosts": {"gpu-a01": host_vars}}}))
    return node, rules, rule


def test_dry_run_stops_where_site_would_on_a_policy_refusal(tmp_path):
    """plan.yml runs site.yml's checks: an error rule the plan fails stops the dry run too, naming the rule, and
    leaves no plan on the controller; the same inventory without the rule plans."""
    node, rules, rule = _refusing_gate(tmp_path)
    rc, failures, out = run_json("playbooks/plan.yml", tmp_path / "inventory.yml")
    assert rc != 0 and "gpu-a01" in failures, out[-3000:]
    (stop,) = [f for f in failures["gpu-a01"] if f["task"] == "Stop every host when any host's input is bad"]
    assert stop["msg"].startswith("gpu-a01: policy SITE-HK-099"), stop["msg"]
    assert not os.path.exists(tmp_path / "controller" / "gpu-a01.plan.json")
    assert not node.exists() or files_under(node) == []
    # The same host with a rule it passes: planned, the plan kept on the controller.
    rule.update(params={"min_cores": 1})
    (rules / "SITE-HK-099.yml").write_text(yaml.safe_dump(rule))
    rc, failures, out = run_json("playbooks/plan.yml", tmp_path / "inventory.yml")
    assert rc == 0, out[-3000:]
    assert json.loads((tmp_path / "controller" / "gpu-a01.plan.json").read_text())["instances"][0]["name"] == "worker"


def test_a_misspelt_variable_is_named_once_with_the_one_meant(tmp_path):
    # Each host keeps its own node files, as two machines would: two hosts writing one topology file at once
    # is a race of the test, not a case of the fleet.
    hosts = {name: local_vars(tmp_path, tmp_path / name) for name in ("gpu-a01", "gpu-a02")}
    common = {"gpunuma_instances": GOOD, "gpunuma_profle": "preferred"}
    inventory = {"all": {"vars": common, "hosts": hosts}}
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump(inventory))
    rc, failures, out = run_json("playbooks/plan.yml", tmp_path / "inventory.yml")
    assert rc == 0, failures
    said = [line for line in out.splitlines() if "gpunuma_profle is not a variable gpunuma reads" in line]
    assert len(said) == 1 and "did you mean gpunuma_profile?" in said[0], said
    assert "gpu-a01 (and 1 more host): gpunuma_profle" in said[0], said


@pytest.mark.parametrize("case", ["input", "planner"])
def test_a_bad_input_is_printed_once_by_the_stop(tmp_path, case):
    """The input step and the planner return their problems; the last step of the validation play stops with
    them. ansible-core's default callback prints a failed task twice ([ERROR] with its origin, then fatal:), so a
    problem printed by that one task alone shows up exactly twice, never by the step that found it as well."""
    node = tmp_path / "node"
    if case == "input":
        host_vars = dict(local_vars(tmp_path, node), gpunuma_instances=GOOD, gpunuma_profile="fastest")
        problem = "gpu-a01: gpunuma_profile: 'fastest'"
    else:  # the 8-GPU topology has no GPU 9: the planner's problem
        host_vars = dict(local_vars(tmp_path, node), gpunuma_instances=[dict(GOOD[0], gpus=[9])])
        problem = "gpunuma_instances[0].gpus[0]"
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump({"all": {"hosts": {"gpu-a01": host_vars}}}))
    proc = run_playbook("playbooks/plan.yml", str(tmp_path / "inventory.yml"))
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert out.count(problem) == 2, out[-5000:]
    assert out.count("[ERROR]") == 1 and out.count("fatal: [gpu-a01]") == 1, out[-5000:]
    assert "Stop every host when any host's input is bad" in out.split("[ERROR]")[0].rsplit("TASK [", 1)[1]
    assert not node.exists() or files_under(node) == []


def test_a_policy_refusal_is_printed_once_by_the_stop(tmp_path):
    """The gate hands its violations to the validation play's stop (no failed gate step): the refusal shows up in
    that one failure's two lines ([ERROR] and fatal:) and nowhere else."""
    _refusing_gate(tmp_path)
    proc = run_playbook("playbooks/plan.yml", str(tmp_path / "inventory.yml"))
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert out.count("gpu-a01: policy SITE-HK-099") == 2, out[-5000:]
    assert out.count("[ERROR]") == 1 and out.count("fatal: [gpu-a01]") == 1, out[-5000:]


def test_one_knob_read_by_two_roles_is_named_once_by_the_name_set(tmp_path):
    """memlock_limit is the memlock role's and the default of numa_binding_limit_memlock: a bad value is one
    problem, named memlock_limit; set under numa_binding's own name, it is named so."""
    node = tmp_path / "node"
    host_vars = dict(local_vars(tmp_path, node), gpunuma_instances=GOOD, memlock_limit="lots")
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump({"all": {"hosts": {"gpu-a01": host_vars}}}))
    rc, failures, out = run_json("playbooks/plan.yml", tmp_path / "inventory.yml")
    (stop,) = [f for f in failures["gpu-a01"] if f["task"] == "Stop every host when any host's input is bad"]
    assert stop["msg"] == ("gpu-a01: memlock_limit: 'lots' is not a limit; allowed: unlimited, infinity, bytes as an "
                           "integer, or a size such as 64G"), stop["msg"]
    host_vars.update(memlock_limit="4G", numa_binding_limit_memlock="lots")
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump({"all": {"hosts": {"gpu-a01": host_vars}}}))
    rc, failures, out = run_json("playbooks/plan.yml", tmp_path / "inventory.yml")
    (stop,) = [f for f in failures["gpu-a01"] if f["task"] == "Stop every host when any host's input is bad"]
    assert stop["msg"].startswith("gpu-a01: numa_binding_limit_memlock: 'lots' is not a limit"), stop["msg"]


@pytest.mark.parametrize("playbook", ["playbooks/plan.yml", "playbooks/site.yml"])
def test_an_inventory_that_does_not_parse_stops_the_run(tmp_path, playbook):
    """ansible.cfg's unparsed_is_failed: without it Ansible warns, falls back to the implicit localhost and ends
    green having done nothing."""
    inventory = tmp_path / "fleet.yml"
    inventory.write_text("all:\n  hosts:\n    gpu-a01: {ansible_connection: local\n  vars: [\n")
    proc = run_playbook(playbook, str(inventory))
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert "No inventory was parsed" in out and str(inventory) in out, out[-3000:]
    assert "PLAY RECAP" not in out


@pytest.mark.parametrize("name, value, needle", [
    ("gpunuma_lock_ttl", "1h", "is not a whole number"),
    ("gpunuma_lock_timeout", "5min", "is not a whole number"),
    ("gpunuma_lock_break", "maybe", "is not a boolean"),
    ("gpunuma_lock_path", "run/lock", "is not an absolute path"),
])
def test_a_variable_the_playbook_reads_itself_is_checked_by_its_spec(tmp_path, name, value, needle):
    """site.yml's own variables (playbooks/vars/argument_specs.yml, entry point site) go through the input step:
    a TTL of 1h is named, never read as 0 by Jinja's int filter; nothing is read or written on the node."""
    node = tmp_path / "node"
    host_vars = dict(local_vars(tmp_path, node), gpunuma_instances=GOOD, **{name: value})
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump({"all": {"hosts": {"gpu-a01": host_vars}}}))
    rc, failures, out = run_json("playbooks/plan.yml", tmp_path / "inventory.yml")
    assert rc != 0 and "gpu-a01" in failures, out[-3000:]
    text = json.dumps(failures["gpu-a01"])
    assert "%s: %s %s" % (name, json.dumps(value).replace('"', '\\"'), needle) in text, text[-2000:]
    assert not node.exists()
