"""site.yml on a two-node fleet: bad input on one node stops the whole run
before any node changes, with a message naming the host, the variable and
what is allowed.

One run: the good node, and every bad case as an inventory host of its own
whose connection reaches the second container (ansible_host), so each
message can be checked per host and both nodes are checked untouched once.
A case caught on the controller never reaches a node; one caught by the
planner (a GPU or CPUs the node lacks, an account it lacks) reads the node
first."""

import pytest
import yaml

from ansible_run import run_playbook_json
from containers import Node, needs_docker

pytestmark = [pytest.mark.container, needs_docker]

GOOD = [{"name": "worker", "numa_node": 0, "share_cpus": True, "command": ["/bin/sleep", "infinity"]}]


@pytest.fixture(scope="module")
def fleet():
    nodes = [Node(), Node()]
    yield nodes
    for node in nodes:
        node.remove()


CASES = {
    "unknown-profile": ({"gpunuma_profile": "fastest"}, ["gpunuma_profile", "fastest", "allowed", "strict"]),
    "missing-gpu": ({"gpunuma_instances": [{"name": "llm", "gpus": [3], "command": ["/bin/true"]}]},
                    ["gpunuma_instances[0].gpus[0]", "GPU 3", "allowed"]),
    "cpus-outside-node": ({"gpunuma_instances": [{"name": "w", "numa_node": 0, "cpus": "4096-4097",
                                                  "command": ["/bin/true"]}]},
                          ["gpunuma_instances[0].cpus", "allowed"]),
    "duplicate-names": ({"gpunuma_instances": GOOD + GOOD}, ["gpunuma_instances[1].name", "unique names"]),
    "command-not-list": ({"gpunuma_instances": [{"name": "w", "numa_node": 0, "command": "/bin/sleep infinity"}]},
                         ["gpunuma_instances[0].command", "list"]),
    "memlock-lots": ({"memlock_limit": "lots"}, ["memlock_limit", "lots", "allowed"]),
    # Caught by the planning step from the run's node read (the account is checked before any host changes).
    "missing-account": ({"gpunuma_instances": [dict(GOOD[0], user="svc-llm")]},
                        ["no account svc-llm on the node", "instances worker run as it"]),
}


@pytest.fixture(scope="module")
def run(fleet, tmp_path_factory):
    """One site.yml run: the good node, and each bad case as an inventory host of its own on the bad node's container."""
    good, bad = fleet
    tmp = tmp_path_factory.mktemp("bad-input")
    common = {
        "ansible_connection": "community.docker.docker",
        "ansible_python_interpreter": "/usr/bin/python3",
        "gpu_topology_controller_dir": str(tmp / "topology"),
        "numa_binding_settle_seconds": 2,
        "memlock_limit": "4M",
        "memlock_users": ["root"],
        "gpunuma_instances": GOOD,
    }
    hosts = {good.name: {}}
    for case, (bad_vars, _) in CASES.items():
        hosts["bad-" + case] = dict(bad_vars, ansible_host=bad.name)
    path = tmp / "inventory.yml"
    path.write_text(yaml.safe_dump({"all": {"vars": common, "hosts": hosts}}))
    return run_playbook_json("playbooks/site.yml", path)


def untouched(node):
    return node.sh("ls /etc/gpunuma/topology.json /etc/gpunuma/plan.json /etc/systemd/system/gpunuma-*.service "
                   "/etc/security/limits.d/90-gpunuma-memlock.conf /etc/sysctl.d/60-gpunuma-* 2>/dev/null || true").strip() == ""


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_on_one_node_is_named(run, case):
    rc, failures, out = run
    host = "bad-" + case
    assert rc != 0, out[-3000:]
    assert host in failures, out[-3000:]
    (stop,) = [f for f in failures[host] if f["task"] == "Stop every host when any host's input is bad"]
    for needle in CASES[case][1]:
        assert needle in stop["msg"], (needle, stop["msg"])
    assert host in stop["msg"]


def test_bad_input_changes_no_node(fleet, run):
    rc, failures, out = run
    good, bad = fleet
    # The good node has nothing wrong, yet the run stops before the apply play
    # (any_errors_fatal), and nothing is written anywhere.
    assert good.name not in failures and "Provision the GPU nodes" not in out
    assert untouched(good) and untouched(bad)
