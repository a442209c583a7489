"""benchmarks/fleet_bench.py's comparison of two revisions: the order they run in, the statistics and the rule
of its verdict, and the side-by-side table (from recorded JSON-callback reports, no fleet needed)."""

import importlib.util
import os
import sys

import pytest
import yaml

from conftest import REPO_ROOT

pytestmark = pytest.mark.unit

_spec = importlib.util.spec_from_file_location("fleet_bench", os.path.join(REPO_ROOT, "benchmarks", "fleet_bench.py"))
fleet_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fleet_bench)


def test_the_revisions_take_turns():
    assert fleet_bench.round_order(3) == [("this", "baseline"), ("baseline", "this"), ("this", "baseline")]


def test_spread_is_median_and_range():
    assert fleet_bench.spread([3.0]) == (3.0, 3.0, 3.0)
    assert fleet_bench.spread([62.2, 58.3]) == (60.25, 58.3, 62.2)
    assert fleet_bench.spread([5.0, 1.0, 3.0]) == (3.0, 1.0, 5.0)


@pytest.mark.parametrize("this, baseline, words", [
    ([58.3, 62.2], [84.5, 82.0], "measurable: faster"),
    ([90.0, 91.0], [84.5, 82.0], "measurable: slower"),
    ([5.0, 5.9], [5.2, 5.0], "no measurable difference"),
    ([5.0, 5.9], [5.9, 6.5], "no measurable difference"),  # touching ranges overlap
    ([58.3], [84.5], "one round each: no verdict (run --rounds 2 or more)"),
])
def test_the_verdict_follows_its_rule(this, baseline, words):
    ratio, said = fleet_bench.verdict(this, baseline)
    assert said == words
    assert ratio == pytest.approx(fleet_bench.spread(this)[0] / fleet_bench.spread(baseline)[0])


def _report(host, tasks):
    """A JSON-callback report of one play: (action, status) per task for one host."""
    rows = []
    for action, status in tasks:
        result = {"action": action, "changed": status == "changed", "skipped": status == "skipped"}
        rows.append({"task": {"name": action}, "hosts": {host: result}})
    return {"plays": [{"play": {"name": "p"}, "tasks": rows}]}


def _measured(floor, converge, rerun, first_tasks):
    return {"floor": floor, "names": ["n1"], "converge": converge, "rerun": rerun, "boot": 1.0,
            "first": _report("n1", first_tasks), "second": _report("n1", [("gpunuma_converge", "ok")])}


def test_the_comparison_prints_both_revisions_and_a_verdict(capsys):
    class Args:
        hosts, rounds = 1, 2

    first = [("gpunuma_converge", "ok"), ("ansible.builtin.set_fact", "ok"), ("gpunuma_apply", "changed"),
             ("ansible.builtin.debug", "skipped")]
    samples = {"this": [_measured(3.0, 58.0, 5.0, first), _measured(3.2, 62.0, 5.9, first)],
               "baseline": [_measured(3.1, 84.0, 5.2, first + [("gpunuma_lock", "ok")]),
                            _measured(3.3, 82.0, 5.0, first + [("gpunuma_lock", "ok")])]}
    changed = fleet_bench.print_comparison(Args, 1, {"this": REPO_ROOT, "baseline": REPO_ROOT}, samples)
    out = capsys.readouterr().out
    assert changed == 0
    lines = {line.split()[0]: line for line in out.splitlines() if line.split()[:1] in (["this"], ["baseline"])}
    assert "60.0 [58.0-62.0]" in lines["this"] and "83.0 [82.0-84.0]" in lines["baseline"]
    # Tasks a host (ok + changed + skipped) and round trips (modules run on the host) of the first converge.
    assert lines["this"].split()[-2:] == ["4.0", "2.0"] and lines["baseline"].split()[-2:] == ["5.0", "3.0"]
    assert "rule: " + fleet_bench.RULE in out
    assert "first converge: this / baseline = 0.72 (medians): measurable: faster" in out
    assert "idempotent re-run: this / baseline = 1.07 (medians): no measurable difference" in out


def test_round_trips_count_a_task_delegated_to_its_own_host():
    """The discovery delegates to the host itself (or to the controller for offline inputs): only the controller
    spares a round trip."""
    def task(name, action, delegated=None, **extra):
        result = dict({"action": action}, **extra)
        if delegated:
            result["_ansible_delegated_vars"] = delegated
        return {"task": {"name": name}, "hosts": {"n1": result}}

    report = {"plays": [{"tasks": [
        task("discover", "gpu_topology_info", {"ansible_connection": "community.docker.docker", "ansible_host": "n1"}),
        task("plan", "gpu_binding_plan", {"ansible_connection": "local", "ansible_host": "localhost"}),
        task("copy", "gpunuma_copy", {"ansible_host": "127.0.0.1"}),
        task("apply", "gpunuma_apply", changed=True),
        task("facts", "ansible.builtin.set_fact"),
        task("check", "gpunuma_converge", gpunuma_round_trips=1),
        task("skipped read", "gpunuma_node_info", skipped=True),
    ]}]}
    per_host, _slow = fleet_bench.summarise(report)
    assert per_host["n1"]["round_trips"] == 3
    assert per_host["n1"]["skipped"] == 1 and per_host["n1"]["changed"] == 1


def test_a_run_says_what_it_cost_in_cpu_on_the_controller_and_on_the_machine():
    """A command that burns about 0.4 CPU-seconds: counted as the controller's (a process the benchmark waited
    for), and the machine was busy at least that long meanwhile."""
    cpu = {}
    burn = "import time\nend = time.process_time() + 0.4\nwhile time.process_time() < end: pass\n"
    wall, proc = fleet_bench.run_timed([sys.executable, "-c", burn], dict(os.environ), REPO_ROOT, cpu)
    assert proc.returncode == 0
    assert 0.35 <= cpu["controller"] <= wall + 0.2, cpu
    assert cpu["machine"] >= 0.3, cpu
    controller, rest, share = fleet_bench.cpu_cells(cpu, wall)
    assert float(controller) == round(cpu["controller"], 1) and share.endswith("%")
    assert fleet_bench.cpu_cells({}, 1.0) == ("-", "-", "-")


def test_the_comparison_prints_the_first_converges_cpu_when_measured(capsys):
    class Args:
        hosts, rounds = 1, 2

    first = [("gpunuma_converge", "ok")]
    runs = [dict(_measured(3.0, 50.0 + i, 5.0, first), cpu={"first": {"controller": 50.0 + i, "machine": 80.0 + i}})
            for i in range(2)]
    fleet_bench.print_comparison(Args, 1, {"this": REPO_ROOT, "baseline": REPO_ROOT},
                                 {"this": runs, "baseline": [_measured(3.0, 52.0, 5.0, first)] * 2})
    out = capsys.readouterr().out
    assert "first converge CPU-seconds (medians): controller 50.5, rest of this machine 30.0" in out
    assert out.count("CPU-seconds (medians)") == 1  # the baseline measured none: no line for it


def test_kubelet_fleets_are_kubernetes_nodes_running_the_stand_in(tmp_path):
    plain = fleet_bench.write_inventory(str(tmp_path / "plain"), ["n-00"])
    kube = fleet_bench.write_inventory(str(tmp_path / "kube"), ["n-00"], kubelet=True)
    read = lambda path: yaml.safe_load(open(os.path.join(os.path.dirname(path), "group_vars", "bench.yml")))
    assert "gpunuma_kubelet" not in read(plain)
    kube_vars = read(kube)
    assert kube_vars["gpunuma_kubelet"] is True
    assert kube_vars["kubelet_topology_config_path"] in fleet_bench.KUBELET_UNIT
    # The unit says what runs: the stand-in, never presented as the kubelet.
    assert "STAND-IN" in fleet_bench.KUBELET_UNIT and "kubelet-standin" in fleet_bench.KUBELET_UNIT
