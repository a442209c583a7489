"""The HTML fleet report (module_utils/gpunuma/report/, scripts/report.py) on artefacts written by gpunuma's code."""

import copy
import html
import json
import os
import re
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ansible.module_utils.gpunuma.report import base as report_base, page as report
from conftest import examples, FIXTURES, REPO_ROOT

sys.path.insert(0, os.path.join(FIXTURES, "report"))
import make_artefacts  # noqa: E402

pytestmark = pytest.mark.unit

HOSTILE = "<script>alert(1)</script>"
SCRIPT = os.path.join(REPO_ROOT, "scripts", "report.py")


@pytest.fixture(scope="module")
def docs():
    return make_artefacts.fleet()


@pytest.fixture
def fleet_dir(tmp_path, docs):
    make_artefacts.write_fleet(str(tmp_path), copy.deepcopy(docs))
    return tmp_path


def render(path, only=None):
    page, fleet = report.build_report(str(path), only=only)
    return page, fleet


def section(page, host):
    """The HTML of one host's section."""
    start = page.index('<section class="host" id="%s"' % html.escape(report._anchor(host)))
    return page[start:page.index("</section>", start)]


def instance_row(page, host, name):
    sec = section(page, host)
    start = sec.index('<tr class="instance" data-instance="%s">' % html.escape(name))
    return sec[start:sec.index("</tr>", start)]


def test_every_host_and_instance_is_in_the_report(fleet_dir, docs):
    page, fleet = render(fleet_dir)
    assert sorted(fleet["hosts"]) == sorted(docs)
    for host, kinds in docs.items():
        assert fleet["hosts"][host]["problems"] == []
        sec = section(page, host)
        assert '<svg class="topology"' in sec
        names = [i["name"] for i in kinds["plan"]["instances"]]
        assert re.findall(r'<tr class="instance" data-instance="([^"]*)"', sec) == names
        assert '<tr data-host="%s">' % host in page          # the fleet table row
    # Each GPU of the 8-GPU host is drawn, filled with its instance's colour.
    sec = section(page, "gpu-a01")
    for gpu in range(8):
        assert '<g class="gpu" data-gpu="%d">' % gpu in sec
    colours = {i: report_base.PALETTE[k] for k, i in enumerate(i["name"] for i in docs["gpu-a01"]["plan"]["instances"])}
    assert re.search(r'data-gpu="3"><rect [^>]*fill="%s"' % colours["span-34"], sec)


def test_fleet_table_columns(fleet_dir, docs):
    page, fleet = render(fleet_dir)
    a01 = report.host_summary(fleet["hosts"]["gpu-a01"])
    assert a01["compliance"] == "drifted: 1 finding (1 error)"
    assert a01["profile"] == "strict (pinned by rollback)"
    assert a01["fingerprint"] == docs["gpu-a01"]["topology"]["fingerprint"].split(":")[1][:12]
    assert a01["instances"] == len(docs["gpu-a01"]["plan"]["instances"])
    vm = report.host_summary(fleet["hosts"]["h200-vm"])
    assert vm["compliance"] == "ok"
    assert vm["probe"] == "passed: no measurable difference"
    assert report.host_summary(fleet["hosts"]["pcie-b03"])["probe"] == "no probe"
    # Drift and rollback history, per node.
    drift = page[page.index("<h2>Drift found</h2>"):page.index("<h2>Rollback history</h2>")]
    assert "<td>gpu-a01</td><td>error</td><td>cpu-affinity</td><td>vllm-2</td>" in drift
    history = page[page.index("<h2>Rollback history</h2>"):page.index('<section class="host"')]
    assert ("<td>gpu-a01</td><td>2026-11-28T03:02:11Z</td><td>strict</td><td>preferred</td><td>down</td>"
            "<td>bob</td><td>P99 spike after strict, INC-4711</td>") in history
    assert history.count("<td>gpu-a01</td>") == 3 and history.count("<td>h200-vm</td>") == 1


def test_housekeeping_cpus_are_marked(fleet_dir, docs):
    page, _ = render(fleet_dir)
    for host in ("gpu-a01", "gb200-n17", "dgx-a100-07"):
        plan = docs[host]["plan"]
        expected = set()
        for cpus in plan["housekeeping"].values():
            expected |= report_base.parse_cpulist(cpus, "housekeeping")
        assert expected
        sec = section(page, host)
        marked = {int(c) for c in re.findall(r'class="cpu housekeeping"[^>]*><title>CPU (\d+): housekeeping', sec)}
        assert marked == expected, host
        # An instance's CPU is drawn in its colour, never as housekeeping.
        first = plan["instances"][0]
        cpu = min(report_base.parse_cpulist(first["cpus"], "cpus"))
        assert "<title>CPU %d: %s</title>" % (cpu, first["name"]) in sec


def test_cpu_less_memory_nodes_of_gb200(fleet_dir, docs):
    page, _ = render(fleet_dir)
    sec = section(page, "gb200-n17")
    topo = docs["gb200-n17"]["topology"]
    memory_only = [n["id"] for n in topo["numa_nodes"] if not n["cpus"]]
    assert len(topo["numa_nodes"]) == 34 and len(memory_only) == 32
    assert sorted(int(n) for n in re.findall(r'<g class="node memory-node" data-node="(\d+)"', sec)) == memory_only
    for gpu in topo["gpus"]:
        assert "GPU%d memory" % gpu["index"] in sec
    # 34 nodes wrap into rows: the picture stays narrow enough to read.
    width, height = map(int, re.search(r'<svg class="topology"[^>]*viewBox="0 0 (\d+) (\d+)"', sec).groups())
    assert width <= 1200 and height < 1600


def test_cross_socket_instance_is_marked(fleet_dir, docs):
    page, _ = render(fleet_dir)
    span = instance_row(page, "gpu-a01", "span-34")       # GPUs 3 (node 0) and 4 (node 1): interleave over both
    assert '<span class="cross-badge cross-socket">crosses sockets</span>' in span
    for name in ("vllm-0", "vllm-7", "tokenizer"):
        assert "cross-badge" not in instance_row(page, "gpu-a01", name)
    assert section(page, "gpu-a01").count('<line class="cross"') == 2
    assert "cross-badge" not in section(page, "pcie-b03") and '<line class="cross"' not in section(page, "pcie-b03")


def test_gpus_of_unknown_node_are_drawn_apart(fleet_dir, docs):
    page, _ = render(fleet_dir)
    sec = section(page, "pcie-b04")
    assert "NUMA node unknown: GPUs and NICs that cannot be placed" in sec
    assert re.findall(r'<g class="gpu" data-gpu="(\d+)">', sec) == [str(g) for g in range(8)]
    assert "not bound" in instance_row(page, "pcie-b04", "vllm-0")
    assert "cross-badge" not in sec


def test_hand_edited_instance_bound_to_the_other_socket(tmp_path, docs):
    """A plan whose single-GPU instance has its CPUs and memory on the other socket is marked crossing."""
    fleet = copy.deepcopy(docs)
    plan = fleet["gpu-a01"]["plan"]
    vllm0 = next(i for i in plan["instances"] if i["name"] == "vllm-0")     # GPU 0 on node 0
    vllm0.update(cpus="49-52", mem_nodes=[1], numa_nodes=[1])
    make_artefacts.write_fleet(str(tmp_path), fleet)
    page, _ = render(tmp_path)
    row = instance_row(page, "gpu-a01", "vllm-0")
    assert "crosses sockets" in row and "CPUs on node 1, memory on node 1, GPU on node 0" in row
    assert re.search(r'<text class="cross-label"[^>]*>vllm-0 crosses sockets</text>', section(page, "gpu-a01"))


def test_crossing_within_one_socket_is_named_so(tmp_path, docs):
    fleet = copy.deepcopy(docs)
    plan = fleet["dgx-a100-07"]["plan"]      # NPS4: nodes 0-3 on socket 0 (SLIT 12), 4-7 on socket 1 (32)
    tp2a = plan["instances"][0]              # GPUs 0 and 1 on node 3
    tp2a.update(cpus="33-40", mem_nodes=[2])
    make_artefacts.write_fleet(str(tmp_path), fleet)
    page, _ = render(tmp_path)
    assert "crosses NUMA nodes</span>" in instance_row(page, "dgx-a100-07", tp2a["name"])


def test_artefact_text_is_escaped(tmp_path, docs):
    fleet = copy.deepcopy(docs)
    host = fleet.pop("gpu-a01")
    for doc in host.values():
        doc["hostname"] = HOSTILE
    host["plan"]["instances"][0]["name"] = HOSTILE
    host["plan"]["instances"][1]["warnings"] = ['"><img src=x onerror=alert(2)>']
    host["state"]["history"][1]["reason"] = "</td></tr></table><script>alert(3)</script>"
    host["audit"]["findings"][0]["instance"] = HOSTILE
    host["topology"]["nics"][0]["name"] = "<b onmouseover=alert(4)>"
    host["topology"]["gpu_links"][0][1] = "<i>"
    fleet[HOSTILE] = host
    make_artefacts.write_fleet(str(tmp_path / "x"), fleet)   # hostile hostname: files named by stem elsewhere
    page, parsed = render(tmp_path)
    assert HOSTILE in parsed["hosts"]
    assert "<script" not in page.lower()
    for raw in ("<img", "<b onmouseover", "<i>", "</td></tr></table><script>"):
        assert raw not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&quot;&gt;&lt;img src=x onerror=alert(2)&gt;" in page
    assert page.count('<section class="host"') == len(fleet)


def test_broken_artefacts_are_problems_not_tracebacks(fleet_dir):
    (fleet_dir / "topology" / "pcie-b03.plan.json").write_text(json.dumps(
        {"schema": "gpunuma.plan/v1", "hostname": "pcie-b03", "instances": "everything on node 0"}))
    topo = json.loads((fleet_dir / "topology" / "gb200-n17.json").read_text())
    topo["numa_nodes"][0]["cpus"] = "0-71,banana"
    (fleet_dir / "topology" / "gb200-n17.json").write_text(json.dumps(topo))
    (fleet_dir / "audit" / "h200-vm.json").write_text(json.dumps(
        {"schema": "gpunuma.audit/v1", "hostname": "h200-vm", "status": "drifted", "findings": [{"id": 7}]}))
    # Neither JSON nor gpunuma: ignored.
    (fleet_dir / "notes.txt").write_text("not json {")
    (fleet_dir / "topology" / "truncated.json").write_text('{"schema": "gpunuma.topology/v1", "numa_')
    (fleet_dir / "other.json").write_text(json.dumps({"schema": "someone.else/v3", "hostname": "ghost"}))
    (fleet_dir / "list.json").write_text("[1, 2]")
    page, fleet = render(fleet_dir)
    assert sorted(fleet["hosts"]) == sorted(make_artefacts.TOPOLOGIES)
    assert fleet["hosts"]["pcie-b03"]["problems"] == [
        'topology/pcie-b03.plan.json (plan): instances is "everything on node 0", not a list']
    assert fleet["hosts"]["gb200-n17"]["problems"] == [
        'topology/gb200-n17.json (topology): numa_nodes[0].cpus: "0-71,banana" is not a CPU list (e.g. 0-3,8)']
    assert fleet["hosts"]["h200-vm"]["problems"] == [
        "audit/h200-vm.json (audit): findings[0].id is 7, not text"]
    for host in ("pcie-b03", "gb200-n17", "h200-vm"):
        sec = section(page, host)
        assert '<div class="problem">' in sec and html.escape(fleet["hosts"][host]["problems"][0]) in sec
    assert "Traceback" not in page
    # The rest of each host is still shown: pcie-b03's topology is drawn; gb200-n17 still lists its plan.
    assert '<svg class="topology"' in section(page, "pcie-b03")
    assert '<tr class="instance" data-instance="trt-0">' in section(page, "gb200-n17")
    assert re.search(r'<tr data-host="pcie-b03">.*?<td class="bad">1</td></tr>', page)


def test_missing_and_empty_directories(tmp_path):
    with pytest.raises(report_base.ReportError, match="^%s does not exist$" % re.escape(str(tmp_path / "nope"))):
        report.build_report(str(tmp_path / "nope"))
    with pytest.raises(report_base.ReportError, match="^%s is empty" % re.escape(str(tmp_path))):
        report.build_report(str(tmp_path))
    (tmp_path / "README").write_text("hello")
    with pytest.raises(report_base.ReportError, match="holds no gpunuma artefact"):
        report.build_report(str(tmp_path))
    (tmp_path / "file").write_text("x")
    with pytest.raises(report_base.ReportError, match="is not a directory"):
        report.build_report(str(tmp_path / "file"))


def test_host_name_from_hostname_else_file_stem(tmp_path, docs):
    state = copy.deepcopy(docs["gpu-a01"]["state"])
    del state["hostname"]
    (tmp_path / "bundle").mkdir()
    (tmp_path / "bundle" / "gpu-z9.state.json").write_text(json.dumps(state))
    validation = copy.deepcopy(docs["h200-vm"]["validation"])
    validation["hostname"] = None
    (tmp_path / "gpu-z8.validation.json").write_text(json.dumps(validation))
    # Controller files of a host named rack1/gpu-z7 (role_inputs.host_file_stem).
    (tmp_path / "rack1%2Fgpu-z7.state.json").write_text(json.dumps(state))
    pending = copy.deepcopy(docs["h200-vm"]["topology"])
    _page, fleet = render(tmp_path)
    assert sorted(fleet["hosts"]) == ["gpu-z8", "gpu-z9", "rack1/gpu-z7"]
    assert fleet["hosts"]["gpu-z9"]["state"]["profile"] == "strict"
    # A pending topology beside the accepted one is a note, not a second topology.
    (tmp_path / "h200-vm.json").write_text(json.dumps(docs["h200-vm"]["topology"]))
    pending["fingerprint"] = "sha256:" + "ab" * 32
    (tmp_path / "h200-vm.pending.json").write_text(json.dumps(pending))
    page, fleet = render(tmp_path)
    assert fleet["hosts"]["h200-vm"]["topology"]["fingerprint"] == docs["h200-vm"]["topology"]["fingerprint"]
    assert "a pending topology change (fingerprint sha256:abab" in page


def test_cli_writes_the_page_and_prints_a_summary(fleet_dir):
    proc = subprocess.run([sys.executable, SCRIPT, str(fleet_dir)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = fleet_dir / "fleet-report.html"
    assert out.read_text().startswith("<!DOCTYPE html>")
    lines = proc.stdout.splitlines()
    assert lines[-1] == "open %s" % out
    assert "gpu-a01      profile strict (pinned by rollback), 8 instances, compliance drifted: 1 finding (1 error), " \
           "probe no probe" in lines
    assert any(line.startswith("h200-vm ") and line.endswith("compliance ok, probe passed: no measurable difference")
               for line in lines)
    # Run again: its own page in DIR is not an artefact; -o elsewhere.
    proc = subprocess.run([sys.executable, SCRIPT, str(fleet_dir), "-o", str(fleet_dir / "x.html")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and len(proc.stdout.splitlines()) == len(make_artefacts.TOPOLOGIES) + 1


def test_cli_never_writes_through_a_planted_link(fleet_dir, tmp_path_factory):
    # A support bundle can hold links: neither the page nor a temporary name
    # beside it may carry the page to a file outside DIR.
    outside = tmp_path_factory.mktemp("reader")
    victims = {name: outside / name for name in ("page", "tmp", "dot")}
    for victim in victims.values():
        victim.write_text("the reader's file\n")
    os.symlink(str(victims["page"]), str(fleet_dir / "fleet-report.html"))
    os.symlink(str(victims["tmp"]), str(fleet_dir / "fleet-report.html.tmp"))
    for n in range(20):
        os.symlink(str(victims["dot"]), str(fleet_dir / (".fleet-report.html.%d" % n)))
    proc = subprocess.run([sys.executable, SCRIPT, str(fleet_dir)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for victim in victims.values():
        assert victim.read_text() == "the reader's file\n"
    page = fleet_dir / "fleet-report.html"
    assert not page.is_symlink() and page.read_text().startswith("<!DOCTYPE html>")
    assert oct(page.stat().st_mode & 0o777) == "0o644"


@pytest.mark.parametrize("make", ["missing", "empty"])
def test_cli_errors_in_one_line(tmp_path, make):
    target = tmp_path / "d"
    if make == "empty":
        target.mkdir()
    proc = subprocess.run([sys.executable, SCRIPT, str(target)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("report: %s " % target)
    assert not (target / "fleet-report.html").exists()


def test_no_network_and_no_script(fleet_dir):
    page, _ = render(fleet_dir)
    assert "<script" not in page and "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "https://" not in page and "@import" not in page and "url(" not in page
    assert "default-src 'none'" in page


# ---------------------------------------------------------------- property: mutated topologies

FIXTURE_TOPOLOGIES = sorted(f[:-5] for f in os.listdir(os.path.join(FIXTURES, "topologies")) if f.endswith(".json"))
_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-3, 1 << 40), st.floats(allow_nan=False),
                    st.text(max_size=12), st.just("0-3,x"), st.just("99999"), st.just([]), st.just({}),
                    st.lists(st.integers(-2, 40), max_size=4), st.just([["NV18"]]), st.just([{"id": 0}]))


def _paths(doc, prefix=()):
    yield prefix
    if isinstance(doc, dict):
        for key in sorted(doc):
            yield from _paths(doc[key], prefix + (key,))
    elif isinstance(doc, list):
        for i, item in enumerate(doc[:6]):
            yield from _paths(item, prefix + (i,))


def _mutate(doc, path, value, delete):
    if not path:
        return value
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    if delete and isinstance(parent, dict):
        del parent[path[-1]]
    elif delete and isinstance(parent, list):
        parent.pop(path[-1])
    else:
        parent[path[-1]] = value
    return doc


@st.composite
def mutated_topologies(draw):
    name = draw(st.sampled_from(FIXTURE_TOPOLOGIES))
    with open(os.path.join(FIXTURES, "topologies", name + ".json")) as handle:
        doc = json.load(handle)
    for _ in range(draw(st.integers(1, 3))):
        if not isinstance(doc, dict):
            break
        paths = [p for p in _paths(doc) if p and p != ("schema",)]
        path = draw(st.sampled_from(paths))
        doc = _mutate(doc, path, draw(_VALUES), draw(st.booleans()))
    return name, doc


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(case=mutated_topologies())
def test_mutated_topology_renders_or_is_a_clear_problem(tmp_path_factory, docs, case):
    name, doc = case
    root = tmp_path_factory.mktemp("fleet")
    (root / "topology").mkdir()
    (root / "topology" / "mutant.json").write_text(json.dumps(doc))
    good = docs["h200-vm"]
    (root / "topology" / "h200-vm.json").write_text(json.dumps(good["topology"]))
    (root / "topology" / "h200-vm.plan.json").write_text(json.dumps(good["plan"]))
    page, fleet = render(root)
    host = doc.get("hostname") if isinstance(doc.get("hostname"), str) and doc.get("hostname").strip() else "mutant"
    assert set(fleet["hosts"]) == {host, "h200-vm"} or (host == "h200-vm" and set(fleet["hosts"]) == {"h200-vm"})
    for name_ in fleet["hosts"]:
        assert 'data-host="%s"' % html.escape(name_) in page
    mutant = fleet["hosts"][host]
    if mutant.get("topology") is not None:
        # Accepted: drawn, and nothing went wrong while drawing it.
        assert not any(p.startswith(("could not draw", "summary:")) for p in mutant["problems"]), mutant["problems"]
        assert '<svg class="topology"' in section(page, host)
    else:
        # Refused: one problem naming the file and what is wrong, shown in the host's section.
        problems = [p for p in mutant["problems"] if p.startswith("topology/mutant.json (topology): ")]
        assert problems, mutant["problems"]
        assert html.escape(problems[0]) in section(page, host)
    assert "Traceback" not in page


def test_policy_violations_of_the_audit(tmp_path, docs):
    """audit.yml adds the policy results to the report: a violation without a finding is still drift."""
    from ansible.module_utils.gpunuma.gate import policy

    fleet = copy.deepcopy(docs)
    audit = fleet["h200-vm"]["audit"]
    result = {"id": "gpunuma-bind-01", "title": "GPU instances are bound to their GPU's node",
              "violations": ["vllm-0 is not bound"], "source": "docs/policies.md"}
    audit["policy"] = {"results": [], "violations": [policy.violation_message("h200-vm", result)], "warnings": [],
                       "expired_waivers": []}
    audit["status"] = "drifted"
    make_artefacts.write_fleet(str(tmp_path), fleet)
    page, fleet_ = render(tmp_path)
    assert report.host_summary(fleet_["hosts"]["h200-vm"])["compliance"] == "drifted: 0 findings, 1 policy violation"
    drift = page[page.index("<h2>Drift found</h2>"):page.index("<h2>Rollback history</h2>")]
    assert "<td>h200-vm</td><td>error</td><td>policy</td><td></td><td></td><td></td><td>h200-vm: policy gpunuma-bind-01" \
        in drift


def test_cli_keeps_control_characters_off_the_terminal(tmp_path, docs):
    topo = copy.deepcopy(docs["h200-vm"]["topology"])
    topo["hostname"] = "vm\x1b[2J\x07"
    (tmp_path / "t.json").write_text(json.dumps(topo))
    proc = subprocess.run([sys.executable, SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stdout and "\x07" not in proc.stdout
    assert proc.stdout.startswith("vm\\x1b[2J\\x07  profile -, - instances, compliance no audit, probe no probe\n")


def test_duplicate_artefacts_newest_state_shown_with_a_note(tmp_path, docs):
    old = make_artefacts.state_for("gpu-a01", [("strict", "site", "site.yml", "alice", "2026-11-20T10:00:00Z")])
    new = docs["gpu-a01"]["state"]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "state.json").write_text(json.dumps(new))
    (tmp_path / "b" / "state.json.bak").write_text(json.dumps(old))
    page, fleet = render(tmp_path)
    host = fleet["hosts"]["gpu-a01"]
    assert host["state"]["updated"] == new["updated"] and len(host["state"]["history"]) == 3
    assert host["notes"] == ["state artefact found twice: a/state.json and b/state.json.bak; a/state.json is shown"]
    assert html.escape(host["notes"][0]) in section(page, "gpu-a01")


def test_each_instance_shows_its_locked_memory_and_each_node_its_pinned_budget(tmp_path):
    """The plan's pinned budget and LimitMEMLOCK= per instance, what the audit saw its process hold, and the
    budgets per NUMA node, as the planner decided them (plan/pinned.py)."""
    topo = make_artefacts.topology("h200-vm")
    plan = make_artefacts.plan_for("h200-vm", topo, instances=[
        {"name": "vllm-0", "gpus": [0], "command": make_artefacts.CMD, "memory": "2G", "pinned": "1G"}])
    assert plan["pinned_budget"] and plan["instances"][0]["pinned_bytes"] == 1 << 30
    audit = make_artefacts.audit_for("h200-vm", plan, topo, None, held={"vllm-0": (4096, 524288)})
    make_artefacts.write_fleet(str(tmp_path), {"h200-vm": {"topology": topo, "plan": plan, "audit": audit}})
    page, _ = report.build_report(str(tmp_path))
    row = re.search(r'<tr class="instance" data-instance="vllm-0">.*?</tr>', page).group(0)
    # The limit is the budget plus the planner's default headroom (1 GiB).
    assert plan["instances"][0]["limit_memlock"] == 2 << 30
    cell = re.search(r'<td class="memlock">([^<]*)</td>', row).group(1)
    assert cell == "pinned 1 GiB; limit 2 GiB; now locked 4 MiB, pinned 512 MiB", cell
    node = next(iter(plan["pinned_budget"]))
    assert re.search(r'<p class="pinned">[^<]*node %s 1 GiB' % node, page), page[page.find("pinned"):][:500]


def test_a_plan_whose_pinned_budget_is_not_bytes_is_a_problem_of_its_host(tmp_path, docs):
    bad = copy.deepcopy(docs["h200-vm"])
    bad["plan"]["pinned_budget"] = {"0": "lots"}
    make_artefacts.write_fleet(str(tmp_path), {"h200-vm": bad})
    _, fleet = report.build_report(str(tmp_path))
    assert any("pinned_budget is" in p for p in fleet["hosts"]["h200-vm"]["problems"]), fleet["hosts"]["h200-vm"]
