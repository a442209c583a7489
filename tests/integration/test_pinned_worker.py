"""Pinned memory seen in running workers, on a real systemd container.

Stand-in workers lock N MiB with mlock(2) under units gpunuma wrote from their pinned budgets; audit.yml reads
each process's VmLck and VmPin and its memlock limit. One locks within its budget (no finding), one locks more
than its budget (pinned-over-budget), one locks nearly all its memlock limit (memlock-at-limit, the point where
a further pinned buffer falls back to pageable copies). Every limit stays under the 8 MiB hard memlock limit
Docker gives a container here (raising it needs CAP_SYS_RESOURCE).
"""

import json
import os
import subprocess

import pytest
import yaml

from ansible_run import run_playbook
from conftest import REPO_ROOT
from containers import Node, needs_docker
from test_roles_numa_binding import apply

pytestmark = [pytest.mark.container, needs_docker]

KIB, MIB = 1 << 10, 1 << 20
# Lock ``KiB`` KiB of an anonymous mapping, touch it, then wait to be audited.
LOCKER = ("import ctypes, mmap, sys, time\n"
          "n = int(sys.argv[1]) << 10\n"
          "m = mmap.mmap(-1, n)\n"
          "m.write(b'x' * n)\n"
          "libc = ctypes.CDLL(None, use_errno=True)\n"
          "addr = ctypes.addressof(ctypes.c_char.from_buffer(m))\n"
          "assert libc.mlock(ctypes.c_void_p(addr), ctypes.c_size_t(n)) == 0, ctypes.get_errno()\n"
          "time.sleep(86400)\n")


def locker(name, kib, **extra):
    spec = {"name": name, "numa_node": 0, "share_cpus": True, "command": ["/usr/bin/python3", "-c", LOCKER, str(kib)]}
    spec.update(extra)
    return spec


@pytest.fixture(scope="module")
def audited(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pinned")
    node = Node()
    try:
        instances = [
            locker("within", 2048, pinned="4M"),
            locker("greedy", 2048, pinned="1M"),
            locker("starved", 3968, memlock="4M"),
        ]
        proc = apply(node, tmp, instances, memlock_limit="6M", numa_binding_pinned_headroom="2M")
        assert proc.returncode == 0, proc.stdout[-4000:]
        inventory = tmp / "audit-inventory.yml"
        inventory.write_text(yaml.safe_dump({"all": {"hosts": {node.name: {
            "ansible_connection": "community.docker.docker", "ansible_python_interpreter": "/usr/bin/python3"}}}}))
        reports, metrics = tmp / "audit", tmp / "gpunuma.prom"
        audit = run_playbook("playbooks/audit.yml", str(inventory),
                             {"gpunuma_audit_dir": str(reports), "gpunuma_audit_textfile": str(metrics),
                              "autonuma_numa_balancing": None})
        report = json.loads((reports / (node.name + ".json")).read_text())
        yield node, report, metrics.read_text(), audit
    finally:
        node.remove()


def test_units_get_the_limit_the_plan_decided(audited):
    node, _, _, _ = audited
    limits = {name: int(node.sh("systemctl show --property=LimitMEMLOCK --value gpunuma-%s.service" % name))
              for name in ("within", "greedy", "starved")}
    # Budget plus the headroom asked for; an instance's own memlock wins.
    assert limits == {"within": 6 * MIB, "greedy": 3 * MIB, "starved": 4 * MIB}, limits


def test_the_audit_reads_what_each_worker_locks(audited):
    _, report, _, _ = audited
    live = {i["name"]: i["live"] for i in report["instances"]}
    assert live["within"]["locked_bytes"] == 2 * MIB, live["within"]
    assert live["greedy"]["locked_bytes"] == 2 * MIB, live["greedy"]
    assert live["starved"]["locked_bytes"] == 3968 * KIB, live["starved"]
    assert all(live[n]["pinned_bytes"] == 0 for n in live), live


def test_over_budget_and_at_limit_are_flagged_and_only_they(audited):
    _, report, _, audit = audited
    found = sorted((f["id"], f["instance"]) for f in report["findings"]
                   if f["id"] in ("pinned-over-budget", "memlock-at-limit"))
    # greedy locks 2 MiB, over its 1 MiB budget (of a 3 MiB limit); starved 3968 KiB of its 4 MiB limit (97 %).
    assert found == [("memlock-at-limit", "starved"), ("pinned-over-budget", "greedy")], (found, audit.stdout[-3000:])


def test_metrics_export_locked_bytes_and_budgets(audited):
    """The node's collector (verify/metrics.py, what the gpunuma_metrics role installs) and the audit's textfile."""
    node, _, audit_metrics, _ = audited
    subprocess.run(["docker", "cp", os.path.join(REPO_ROOT, "module_utils", "gpunuma", "verify", "metrics.py"),
                    "%s:/tmp/gpunuma_metrics_collect.py" % node.name], check=True, capture_output=True)
    text = node.sh("cd /tmp && python3 -c 'import subprocess, gpunuma_metrics_collect as m\n"
                   "pid = lambda u: int(subprocess.check_output([\"systemctl\", \"show\", \"-p\", \"MainPID\", "
                   "\"--value\", u]))\n"
                   "print(m.collect(plan_path=\"/etc/gpunuma/plan.json\", main_pid=pid)[0])'")
    assert 'gpunuma_instance_locked_bytes{instance="within"} %d' % (2 * MIB) in text, text
    assert 'gpunuma_instance_locked_bytes{instance="starved"} %d' % (3968 * KIB) in text, text
    assert 'gpunuma_instance_pinned_budget_bytes{instance="greedy"} %d' % MIB in text, text
    assert 'gpunuma_instance_memlock_limit_bytes{instance="starved"} %d' % (4 * MIB) in text, text
    assert ('gpunuma_audit_findings{host="%s",id="pinned-over-budget",severity="warning"} 1' % node.name
            in audit_metrics), audit_metrics
