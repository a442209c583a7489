"""Housekeeping confinement and irqbalance's banned CPUs (module_utils/gpunuma/node/housekeeping.py)."""

import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible.module_utils.gpunuma.common.cpulist import parse_cpulist
from ansible.module_utils.gpunuma.node.housekeeping import banned_in_default, hex_mask, housekeeping_files
from ansible.module_utils.gpunuma.plan.planner import build_plan
from ansible.module_utils.gpunuma.plan.profiles import load_profile
from conftest import examples, FIXTURES, REPO_ROOT

pytestmark = pytest.mark.unit

PROFILES_DIR = os.path.join(REPO_ROOT, "policies", "profiles")
UNIT_DIR = "/etc/systemd/system"
CONFINE = ["%s/%s.d/50-gpunuma-housekeeping.conf" % (UNIT_DIR, u) for u in ("system.slice", "user.slice", "init.scope")]
IRQ = UNIT_DIR + "/irqbalance.service.d/50-gpunuma-banned-cpus.conf"
SLICE = UNIT_DIR + "/gpunuma.slice"
SCRIPT = "/usr/local/libexec/gpunuma/irq-affinity"
PIN_UNIT = UNIT_DIR + "/gpunuma-irq-affinity.service"



def _paths(absent):
    """The paths of housekeeping's absent entries (a path, or {path, unit} for a drop-in of a service not ours)."""
    return [a["path"] if isinstance(a, dict) else a for a in absent]

def hgx_topology():
    with open(os.path.join(FIXTURES, "topologies", "hgx-h200-8gpu-2socket-ht.json")) as handle:
        return json.load(handle)


def hgx_plan(profile="strict", **options):
    topo = hgx_topology()
    instances = [{"name": "vllm-%d" % g, "gpus": [g], "memory": "8G", "command": ["/bin/sleep", "infinity"]}
                 for g in (0, 4)]
    return build_plan(topo, load_profile(profile, PROFILES_DIR), instances, **options)


def by_path(result):
    return {f["path"]: f["content"] for f in result["files"]}


def allowed_cpus(content):
    lines = [line for line in content.splitlines() if line.startswith("AllowedCPUs=")]
    assert len(lines) == 1, content
    return parse_cpulist(lines[0].split("=", 1)[1])


def test_confinement_holds_system_user_and_init_to_the_housekeeping_cpus():
    plan = hgx_plan()
    housekeeping = frozenset().union(*(parse_cpulist(t) for t in plan["housekeeping"].values()))
    assert housekeeping  # auto keeps one core (two threads) per node
    result = housekeeping_files(plan, confine=True)
    assert result["problems"] == [] and result["confined"] and result["slice"] == "gpunuma.slice"
    files = by_path(result)
    assert set(files) == set(CONFINE + [SLICE])
    for path in CONFINE:
        assert allowed_cpus(files[path]) == housekeeping
    assert "[Scope]" in files[CONFINE[2]] and "[Slice]" in files[CONFINE[0]]
    # The instances' CPUs are outside the confinement: nothing of theirs is a housekeeping CPU.
    for instance in plan["instances"]:
        assert not parse_cpulist(instance["cpus"]) & housekeeping
    # The ban is off: its drop-in is in the removals (turning it off is the way back).
    assert IRQ in _paths(result["absent"]) and not set(CONFINE) & set(_paths(result["absent"]))
    # irqbalance is not gpunuma's: once its drop-in goes it is restarted, when it runs, by gpunuma_apply
    assert {"path": IRQ, "unit": "irqbalance.service"} in result["absent"]


@pytest.mark.parametrize("confine, profile", [(False, "strict"), (True, "off")])
def test_off_or_the_off_profile_removes_everything(confine, profile):
    result = housekeeping_files(hgx_plan(profile), confine=confine, irqbalance_ban=confine, irqbalance_loaded=True)
    assert result["files"] == [] and result["slice"] is None and result["problems"] == []
    assert set(_paths(result["absent"])) == set(CONFINE + [SLICE, IRQ, SCRIPT])


def test_no_housekeeping_cpus_is_refused_naming_the_setting():
    result = housekeeping_files(hgx_plan(housekeeping_cores_per_node=0), confine=True, host="gpu-a01")
    assert result["files"] == []
    assert any("gpu-a01" in p and "gpunuma_housekeeping_cores_per_node" in p for p in result["problems"])


def test_no_cpuset_controller_is_refused():
    result = housekeeping_files(hgx_plan(), confine=True, cpuset_available=False, host="gpu-a01")
    assert result["files"] == [] and not result["confined"]
    assert any("cpuset" in p and "gpu-a01" in p for p in result["problems"])


@pytest.mark.parametrize("name", ["system.slice", "-.slice", "kubepods.slice", "gpunuma", "../x.slice", 3])
def test_a_slice_that_is_not_gpunumas_own_is_refused(name):
    result = housekeeping_files(hgx_plan(), confine=True, slice_name=name)
    assert any("numa_binding_slice" in p for p in result["problems"])
    assert result["files"] == []


def test_irqbalance_is_told_the_workers_cpus():
    plan = hgx_plan()
    housekeeping = frozenset().union(*(parse_cpulist(t) for t in plan["housekeeping"].values()))
    every = frozenset().union(*(parse_cpulist(t) for t in plan["worker_cpus"].values())) | housekeeping
    result = housekeeping_files(plan, irqbalance_ban=True, irqbalance_loaded=True,
                                irqbalance_default='IRQBALANCE_ARGS=""\n#IRQBALANCE_BANNED_CPULIST=0-3\n')
    assert result["problems"] == []
    entry = [f for f in result["files"] if f["path"] == IRQ][0]
    assert entry["unit"] == "irqbalance.service"
    env = dict(line.split("=", 2)[1:] for line in entry["content"].splitlines() if line.startswith("Environment="))
    banned = parse_cpulist(env["IRQBALANCE_BANNED_CPULIST"])
    assert banned == every - housekeeping and banned
    mask = int(env["IRQBALANCE_BANNED_CPUS"].replace(",", ""), 16)
    assert {c for c in range(mask.bit_length()) if mask >> c & 1} == banned
    assert set(CONFINE) <= set(_paths(result["absent"]))


def test_irqbalance_setting_of_its_own_is_refused_not_overridden():
    result = housekeeping_files(hgx_plan(), irqbalance_ban=True, irqbalance_loaded=True,
                                irqbalance_default='export IRQBALANCE_BANNED_CPUS="ff"\n', host="gpu-a01")
    assert result["files"] == [] and IRQ not in _paths(result["absent"])
    assert any("/etc/default/irqbalance" in p and "IRQBALANCE_BANNED_CPUS" in p for p in result["problems"])


def test_irqbalance_setting_in_el_sysconfig_is_refused_naming_that_file():
    # EL and Fedora: irqbalance.service reads /etc/sysconfig/irqbalance.
    result = housekeeping_files(hgx_plan(), irqbalance_ban=True, irqbalance_loaded=True, host="gpu-a01",
                                irqbalance_default={"/etc/default/irqbalance": "",
                                                    "/etc/sysconfig/irqbalance": "IRQBALANCE_BANNED_CPULIST=0-3\n"})
    assert result["files"] == [] and IRQ not in _paths(result["absent"])
    (problem,) = result["problems"]
    assert "/etc/sysconfig/irqbalance on gpu-a01 already sets IRQBALANCE_BANNED_CPULIST=0-3" in problem
    # Commented out in either file: the ban is written.
    result = housekeeping_files(hgx_plan(), irqbalance_ban=True, irqbalance_loaded=True, host="gpu-a01",
                                irqbalance_default={"/etc/default/irqbalance": "#IRQBALANCE_BANNED_CPUS=ff\n",
                                                    "/etc/sysconfig/irqbalance": "#IRQBALANCE_BANNED_CPULIST=0-3\n"})
    assert result["problems"] == [] and IRQ in _paths(result["files"])


def test_no_irqbalance_means_nothing_to_tell():
    result = housekeeping_files(hgx_plan(), irqbalance_ban=True, irqbalance_loaded=False)
    assert result["files"] == [] and result["problems"] == [] and IRQ in _paths(result["absent"])
    assert any("not installed" in n for n in result["notes"])


@pytest.mark.parametrize("cpus, text", [({0}, "1"), ({0, 1, 2, 3}, "f"), ({32}, "1,00000000"),
                                        ({0, 63, 64}, "1,80000000,00000001"), (set(), "0")])
def test_hex_mask_is_the_kernel_cpumask_text(cpus, text):
    assert hex_mask(cpus) == text


@pytest.mark.parametrize("text, found", [
    ("IRQBALANCE_BANNED_CPULIST=1-3", 1), ("#IRQBALANCE_BANNED_CPUS=ff", 0), ('IRQBALANCE_BANNED_CPUS=""', 0),
    ("  export IRQBALANCE_BANNED_CPUS=f0\nIRQBALANCE_ARGS=-x", 1), ("", 0), (None, 0)])
def test_banned_lines_in_etc_default(text, found):
    assert len(banned_in_default(text)) == found


@settings(max_examples=examples(60), deadline=None)
@given(st.integers(min_value=0, max_value=3), st.booleans(), st.booleans(), st.booleans(),
       st.sampled_from(["strict", "preferred", "interleave", "off"]))
def test_any_option_mix_gives_files_or_problems_and_never_both_write_and_remove(cores, confine, ban, loaded, profile):
    result = housekeeping_files(hgx_plan(profile, housekeeping_cores_per_node=cores), confine=confine,
                                irqbalance_ban=ban, irqbalance_loaded=loaded)
    written = {f["path"] for f in result["files"]}
    assert not written & set(_paths(result["absent"]))
    if result["problems"]:
        assert not result["confined"]
    for content in by_path(result).values():
        assert content.endswith("\n") and "None" not in content


def test_irq_pinning_puts_each_devices_interrupts_on_its_own_nodes_housekeeping_cpus():
    plan, topo = hgx_plan(), hgx_topology()
    result = housekeeping_files(plan, irq_pin=True, topology=topo)
    assert result["problems"] == [] and result["services"] == ["gpunuma-irq-affinity.service"]
    files = by_path(result)
    assert set(files) == {SCRIPT, PIN_UNIT} and SCRIPT not in _paths(result["absent"])
    pinned = {p["pci_bus_id"]: p for p in result["irq_pinned"]}
    gpus = {g["index"]: g for g in topo["gpus"]}
    nics = {n["name"]: n for n in topo["nics"]}
    expected = set()
    for instance in plan["instances"]:
        for device in [gpus[g] for g in instance["gpus"]] + [nics[n] for n in instance["nics"]]:
            expected.add(device["pci_bus_id"].lower())
            own = parse_cpulist(plan["housekeeping"][str(device["numa_node"])])
            assert parse_cpulist(pinned[device["pci_bus_id"].lower()]["cpus"]) == own
    assert set(pinned) == expected and len(expected) >= 4  # two GPUs and their NICs
    unit = files[PIN_UNIT]
    assert "# gpunuma instance " in unit  # pruned (stopped, so reset) like an instance when turned off
    (start,) = [line for line in unit.splitlines() if line.startswith("ExecStart=")]
    (stop,) = [line for line in unit.splitlines() if line.startswith("ExecStop=")]
    words = start.split()[2:]
    assert start.split()[1] == "apply" and stop.split()[1:] == ["reset"] + words
    for word in words:
        cpus, bdfs = word.split("=")
        for bdf in bdfs.split(","):
            assert pinned[bdf]["cpus"] == cpus


def test_irq_pinning_is_refused_while_irqbalance_runs_or_without_housekeeping():
    running = housekeeping_files(hgx_plan(), irq_pin=True, topology=hgx_topology(), irqbalance_active=True, host="h")
    assert running["files"] == [] and any("irqbalance" in p and "numa_binding_irq_pin" in p for p in running["problems"])
    empty = housekeeping_files(hgx_plan(housekeeping_cores_per_node=0), irq_pin=True, topology=hgx_topology())
    assert empty["files"] == [] and any("housekeeping" in p for p in empty["problems"])


def test_irq_pinning_off_removes_the_script_and_leaves_the_unit_to_the_prune():
    result = housekeeping_files(hgx_plan(), irq_pin=False, topology=hgx_topology())
    assert SCRIPT in _paths(result["absent"]) and PIN_UNIT not in _paths(result["absent"]) and result["services"] == []


def nps4_topology(distances_known=True):
    """Two sockets of four NUMA nodes each (EPYC NPS4): SLIT 10 local, 12 on the socket, 32 across."""
    nodes = []
    for n in range(8):
        row = [10 if m == n else (12 if m // 4 == n // 4 else 32) for m in range(8)] if distances_known else []
        nodes.append({"id": n, "cpus": "%d-%d" % (n * 8, n * 8 + 7), "has_cpus": True, "distances": row})
    gpus = [{"index": i, "pci_bus_id": "0000:%02x:00.0" % (0x10 + i), "numa_node": node}
            for i, node in enumerate((1, 3, 5, 7))]
    return {"sockets": 2, "numa_nodes": nodes, "gpus": gpus, "nics": []}


def nps4_plan(housekeeping):
    return {"profile": "strict", "housekeeping": housekeeping,
            "worker_cpus": {str(n): "%d-%d" % (n * 8, n * 8 + 7) for n in range(8)},
            "instances": [{"name": "g%d" % i, "unit": "gpunuma-g%d.service" % i, "gpus": [i], "nics": []}
                          for i in range(4)]}


def test_irq_pinning_never_crosses_a_socket():
    # Housekeeping only on node 0 (socket 0) and node 6 (socket 1): the GPUs on nodes 1 and 3 go to node 0's
    # CPUs, those on 5 and 7 to node 6's, never the other socket's, although the union has both.
    plan = nps4_plan({"0": "0-1", "1": "", "2": "", "3": "", "4": "", "5": "", "6": "48-49", "7": ""})
    result = housekeeping_files(plan, irq_pin=True, topology=nps4_topology())
    assert result["problems"] == [], result["problems"]
    pinned = {p["pci_bus_id"]: (p["cpus"], p["cpus_node"]) for p in result["irq_pinned"]}
    assert pinned == {"0000:10:00.0": ("0-1", 0), "0000:11:00.0": ("0-1", 0),
                      "0000:12:00.0": ("48-49", 6), "0000:13:00.0": ("48-49", 6)}, pinned


def test_a_device_whose_socket_keeps_no_housekeeping_cpu_keeps_the_default_affinity():
    plan = nps4_plan({"0": "0-1", "1": "", "2": "", "3": "", "4": "", "5": "", "6": "", "7": ""})
    result = housekeeping_files(plan, irq_pin=True, topology=nps4_topology())
    pinned = {p["pci_bus_id"] for p in result["irq_pinned"]}
    assert pinned == {"0000:10:00.0", "0000:11:00.0"}
    assert any("GPU 2 (0000:12:00.0) keeps the kernel's default affinity: no housekeeping CPU on its socket" in n
               for n in result["notes"]), result["notes"]
    # Unknown distances: only a device's own node counts (a guess could cross a socket).
    result = housekeeping_files(plan, irq_pin=True, topology=nps4_topology(distances_known=False))
    assert result["irq_pinned"] == [] and not result["services"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.booleans(), min_size=8, max_size=8))
def test_every_pinned_device_stays_on_its_socket(keeps):
    """Property: whichever nodes keep housekeeping CPUs, a device is pinned to CPUs of its own socket only, and
    to its own node's when that node keeps some."""
    housekeeping = {str(n): ("%d" % (n * 8) if keep else "") for n, keep in enumerate(keeps)}
    result = housekeeping_files(nps4_plan(housekeeping), irq_pin=True, topology=nps4_topology())
    for item in result["irq_pinned"]:
        node = item["numa_node"]
        assert item["cpus_node"] // 4 == node // 4, item
        if keeps[node]:
            assert item["cpus_node"] == node, item
    for i, node in enumerate((1, 3, 5, 7)):
        on_socket = any(keeps[n] for n in range(node // 4 * 4, node // 4 * 4 + 4))
        assert any(p["pci_bus_id"] == "0000:%02x:00.0" % (0x10 + i) for p in result["irq_pinned"]) == on_socket
