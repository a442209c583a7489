"""A node that grants its services fewer CPUs than sysfs lists: a systemd container started with --cpuset-cpus.

sysfs in the container lists every CPU of the machine; PID 1 may run on one. Discovery reads the grant
(cpus_granted), the planner binds inside it, and the unit starts: numactl refuses a --physcpubind CPU outside
the process's allowed CPUs ("cpu argument out of range"), which is how such units failed before the grant was read.
"""

import json
import os

import pytest

from containers import Node, needs_docker
from test_roles_numa_binding import apply

pytestmark = [pytest.mark.container, needs_docker]


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs a machine of 2 CPUs or more to grant one of them")
def test_units_start_bound_inside_a_restricted_cpuset(tmp_path):
    last = os.cpu_count() - 1
    node = Node(extra_args=["--cpuset-cpus", str(last)])
    try:
        assert node.sh("grep Cpus_allowed_list /proc/1/status").split()[-1] == str(last)
        worker = {"name": "worker", "numa_node": 0, "share_cpus": True, "command": ["/bin/sleep", "infinity"]}
        # No housekeeping: the one granted CPU is the worker's (a node of one core keeps none for workers otherwise).
        proc = apply(node, tmp_path, [worker], numa_binding_housekeeping_cores_per_node=0)
        assert proc.returncode == 0, proc.stdout[-4000:]
        topology = json.loads(node.sh("cat /etc/gpunuma/topology.json"))
        assert topology["cpus_granted"] == str(last)
        plan = json.loads(node.sh("cat /etc/gpunuma/plan.json"))
        assert plan["instances"][0]["cpus"] == str(last)
        assert any("outside what the node grants" in w for w in plan["warnings"]), plan["warnings"]
        assert node.sh("systemctl is-active gpunuma-worker.service").strip() == "active"
        pid = node.main_pid("gpunuma-worker.service")
        allowed = node.sh("grep Cpus_allowed_list /proc/%d/status" % pid).split()[-1]
        assert allowed == str(last)
    finally:
        node.remove()
