"""ansible-pull: a node applies its own plan from a git checkout of the
inventory repository, with a local connection.

The controller builds, in tmp_path, a bare git repository holding gpunuma's
tracked files (as they are in the working tree) and an inventory for one
node, inventory/pull.yml. A systemd container of Debian trixie
(gpunuma/debian-systemd:trixie: ansible-pull runs ansible-core on the node,
and 2.20+ needs Python 3.12 or later; bookworm's is 3.11) gets, read-only,
that repository, the controller's Ansible (its site-packages, run by the
node's python3) and the controller's git (the image has none), and runs
inside:

    ansible-pull -U file:///srv/gpunuma.git -C main -i inventory/pull.yml \
        -d /var/lib/gpunuma-pull playbooks/site.yml

The first pull must start the instances and record the plan; the second
must change nothing and restart nothing.

Then Ctrl-C: on the node the pulls left (profile preferred), a site.yml run
from the checkout moves to interleave with a long settle; once the first
instance restarted on its new file, the run's process group gets SIGINT, as
a terminal's Ctrl-C sends it. The apply step (which the local connection
runs in the controller's worker group) must not die mid-step nor go on with
the second instance: at the next batch boundary it puts the first instance
back on its old file, leaves the second untouched, writes neither plan.json
nor state.json, gives the run's lease back and ends. The units, plan.json,
state.json and the running processes' memory policy agree on preferred, and
a plain pull then changes nothing.

Last, a controller run beside a local one: while a site.yml run on the node
(local connection) holds the node lock, a site.yml run from the controller
(docker connection) with a one-second gpunuma_lock_timeout stops naming the
local run's holder (the node's own host name, playbook site.yml) with
nothing changed; the local run ends with units, plan.json and state.json on
its plan. Skipped only when there is no Docker engine or no base image; the
trixie image is built (or found cached) by scripts/build-base-image.sh.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid

import pytest
import yaml

from ansible_run import BINDIR, ansible_env
from conftest import REPO_ROOT
from containers import Node, needs_docker

pytestmark = [pytest.mark.container, needs_docker]

REPO_IN_NODE = "/srv/gpunuma.git"
SITE_IN_NODE = "/opt/gpunuma-ansible/site-packages"
BIN_IN_NODE = "/opt/gpunuma-ansible/bin"
CHECKOUT = "/var/lib/gpunuma-pull"
INSTANCES = [
    {"name": "worker-a", "numa_node": 0, "share_cpus": True, "command": ["/bin/sleep", "infinity"]},
    {"name": "worker-b", "numa_node": 0, "share_cpus": True, "command": ["/bin/sleep", "infinity"]},
]
# The entry points ansible-pull runs next to itself (ansible for the checkout,
# ansible-playbook for the play), for the node's own python3.
BUILD_BASE_IMAGE = os.path.join(REPO_ROOT, "scripts", "build-base-image.sh")
# ansible-pull runs ansible-core on the node: 2.20 and later need Python 3.12+, which Debian ships from trixie on.
NODE_SUITE = "trixie"
ENTRY_POINTS = {"ansible-pull": "pull", "ansible": "adhoc", "ansible-playbook": "playbook"}


def _site_packages():
    import ansible

    return os.path.dirname(os.path.dirname(os.path.abspath(ansible.__file__)))


def _git_mounts():
    """Read-only mounts that give the node the controller's git."""
    git = shutil.which("git")
    assert git, "the controller has no git"
    git = os.path.realpath(git)
    exec_path = subprocess.run([git, "--exec-path"], capture_output=True, text=True, check=True).stdout.strip()
    mounts = [(git, "/usr/bin/git"), (exec_path, exec_path)]
    if os.path.isdir("/usr/share/git-core"):
        mounts.append(("/usr/share/git-core", "/usr/share/git-core"))
    return mounts


def build_repository(tmp_path, hostname):
    """A bare repository (branch main): gpunuma's tracked files from the
    working tree, plus inventory/pull.yml for the one node."""
    work = tmp_path / "work"
    work.mkdir()
    listed = subprocess.run(["git", "-C", REPO_ROOT, "ls-files", "-z"], capture_output=True, check=True).stdout
    for rel in filter(None, listed.decode().split("\0")):
        source = os.path.join(REPO_ROOT, rel)
        if not os.path.lexists(source) or (os.path.isdir(source) and not os.path.islink(source)):
            continue  # deleted in the working tree, or a submodule
        target = work / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target, follow_symlinks=False)
    inventory = {"all": {"hosts": {hostname: {
        "ansible_connection": "local",
        "ansible_python_interpreter": "/usr/bin/python3",
        "gpu_topology_controller_dir": "/var/lib/gpunuma-topology",
        "gpunuma_profile": "preferred",
        "memlock_limit": "4M",
        "memlock_groups": ["gpunuma"],
        "autonuma_numa_balancing": 0,
        "gpunuma_instances": INSTANCES,
    }}}}
    (work / "inventory").mkdir(exist_ok=True)
    (work / "inventory" / "pull.yml").write_text(yaml.safe_dump(inventory, sort_keys=False))

    def git(*args, cwd=work):
        subprocess.run(["git", "-c", "user.name=gpunuma", "-c", "user.email=gpunuma@example.invalid",
                        "-c", "init.defaultBranch=main", *args], cwd=cwd, check=True, capture_output=True)

    git("init", "-q", "-b", "main")
    git("add", "-A")
    git("commit", "-q", "-m", "Fleet inventory")
    bare = tmp_path / "gpunuma.git"
    git("clone", "-q", "--bare", str(work), str(bare), cwd=tmp_path)
    return bare


def write_entry_points(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name, module in ENTRY_POINTS.items():
        script = bindir / name
        script.write_text("#!/usr/bin/python3\nimport sys\nfrom ansible.cli.%s import main\n"
                          "sys.exit(main())\n" % module)
        script.chmod(0o755)
    return bindir


@pytest.fixture(scope="module")
def pull_node(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("pull")
    name = "gpunuma-pull-%s" % uuid.uuid4().hex[:8]  # container, hostname and inventory host
    bare = build_repository(tmp_path, name)
    mounts = [(_site_packages(), SITE_IN_NODE), (str(write_entry_points(tmp_path)), BIN_IN_NODE),
              (str(bare), REPO_IN_NODE)] + _git_mounts()
    built = subprocess.run([BUILD_BASE_IMAGE, "--suite", NODE_SUITE], capture_output=True, text=True)
    assert built.returncode == 0, (built.stdout + built.stderr)[-4000:]
    node = Node(name=name, hostname=True, mounts=mounts, image="gpunuma/debian-systemd:%s" % NODE_SUITE)
    yield node
    node.remove()


def pull(node):
    """Run ansible-pull on the node; return (returncode, output, seconds)."""
    cmd = ["docker", "exec", "-e", "PYTHONPATH=%s" % SITE_IN_NODE, "-e", "ANSIBLE_NOCOLOR=1",
           "-e", "ANSIBLE_FORCE_COLOR=0", node.name,
           "python3", "%s/ansible-pull" % BIN_IN_NODE,
           "-U", "file://%s" % REPO_IN_NODE, "-C", "main", "-i", "inventory/pull.yml",
           "-d", CHECKOUT, "playbooks/site.yml"]
    started = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1500)
    elapsed = time.monotonic() - started
    sys.stderr.write("ansible-pull on %s: rc=%d in %.0f s\n" % (node.name, proc.returncode, elapsed))
    return proc.returncode, proc.stdout + proc.stderr, elapsed


def recap(output, host):
    match = re.search(r"^%s\s*:\s*(.*)$" % re.escape(host), output.split("PLAY RECAP")[-1], re.M)
    assert match, "no PLAY RECAP line for %s:\n%s" % (host, output[-4000:])
    return {key: int(value) for key, value in re.findall(r"(\w+)=(\d+)", match.group(1))}


def test_ansible_pull_applies_the_nodes_plan_and_is_idempotent(pull_node):
    node = pull_node
    assert node.sh("git --version").startswith("git version")

    rc, out, _ = pull(node)
    assert rc == 0, out[-6000:]
    first = recap(out, node.name)
    assert first["failed"] == 0 and first["unreachable"] == 0
    assert first["changed"] > 0
    # The checkout is the pulled branch of the repository.
    assert node.sh("git -C %s rev-parse --abbrev-ref HEAD" % CHECKOUT).strip() == "main"
    for instance in INSTANCES:
        unit = "gpunuma-%s.service" % instance["name"]
        assert node.sh("systemctl is-active %s" % unit, check=False).strip() == "active", out[-6000:]
    plan = json.loads(node.sh("cat /etc/gpunuma/plan.json"))
    assert plan["hostname"] == node.name
    assert sorted(i["name"] for i in plan["instances"]) == ["worker-a", "worker-b"]
    pids = {i["name"]: node.main_pid("gpunuma-%s.service" % i["name"]) for i in INSTANCES}
    assert all(pids.values())

    rc, out, _ = pull(node)
    assert rc == 0, out[-6000:]
    second = recap(out, node.name)
    assert second["changed"] == 0, out[-6000:]
    assert second["failed"] == 0 and second["unreachable"] == 0
    assert {i["name"]: node.main_pid("gpunuma-%s.service" % i["name"]) for i in INSTANCES} == pids


def _start_local_run(node, *extra):
    """site.yml from the node's checkout, in a session of its own (as a terminal's foreground job): its process
    group id is its pid, in /tmp/run.pid; its output in /tmp/local-run.log."""
    node.sh("cd %s && (PYTHONPATH=%s ANSIBLE_NOCOLOR=1 setsid sh -c 'echo $$ > /tmp/run.pid; exec python3 "
            "%s/ansible-playbook -i inventory/pull.yml playbooks/site.yml %s' > /tmp/local-run.log 2>&1 "
            "< /dev/null &)" % (CHECKOUT, SITE_IN_NODE, BIN_IN_NODE, " ".join(extra)))


def _wait_local_run(node, deadline):
    """Until the local run and its modules are gone (a pipelined module runs as a bare python3 reading stdin)."""
    while node.sh("ps -eo args | grep -E '^[^ ]*python3( .*(ansible-playbook|AnsiballZ).*)?$' || true").strip():
        assert time.time() < deadline, node.sh("ps -ef; tail -c 4000 /tmp/local-run.log")
        time.sleep(0.5)
    return node.sh("cat /tmp/local-run.log")


def _policy(node, unit):
    """The memory policy the unit's running process has (numa_maps' first policy word, e.g. prefer:0, bind:0)."""
    pid = node.main_pid(unit)
    words = node.sh("awk '{print $2}' /proc/%d/numa_maps | sort -u" % pid).split()
    return pid, sorted(set(words))


def test_ctrl_c_during_the_restarts_leaves_the_node_on_its_old_plan(pull_node):
    # Runs after the pull test, on the node it left: both instances on preferred.
    node = pull_node
    units = ["gpunuma-%s.service" % i["name"] for i in INSTANCES]
    files = {u: node.sh("cat /etc/systemd/system/%s" % u) for u in units}
    plan_before = node.sh("cat /etc/gpunuma/plan.json")
    state_before = node.sh("cat /etc/gpunuma/state.json")
    before = {u: _policy(node, u) for u in units}
    assert all(p == ["prefer:0"] for _, p in before.values()), before
    invocation = node.sh("systemctl show -p InvocationID --value %s" % units[0]).strip()

    _start_local_run(node, "-e gpunuma_profile=interleave -e numa_binding_settle_seconds=20")
    deadline = time.time() + 300
    while node.sh("systemctl show -p InvocationID --value %s" % units[0]).strip() == invocation:
        assert time.time() < deadline, node.sh("tail -c 4000 /tmp/local-run.log")
        time.sleep(0.5)
    # The first instance restarted on its interleave file; the run settles it for 20 s. Ctrl-C.
    assert "--interleave" in node.sh("cat /etc/systemd/system/%s" % units[0])
    pgid = int(node.sh("cat /tmp/run.pid"))
    node.sh("python3 -c 'import os, signal; os.killpg(%d, signal.SIGINT)'" % pgid)
    log = _wait_local_run(node, deadline)

    for unit in units:
        assert node.sh("cat /etc/systemd/system/%s" % unit) == files[unit], (unit, log[-4000:])
        assert node.sh("systemctl is-active %s" % unit, check=False).strip() == "active", unit
        assert _policy(node, unit)[1] == ["prefer:0"], (unit, _policy(node, unit))
    # The second instance was never touched; the first runs its old file again.
    assert _policy(node, units[1])[0] == before[units[1]][0]
    assert node.sh("cat /etc/gpunuma/plan.json") == plan_before
    assert node.sh("cat /etc/gpunuma/state.json") == state_before
    assert node.sh("cat /var/lib/gpunuma/pending-restarts.json 2>/dev/null || echo '[]'").strip() == "[]"
    lease = node.sh("cat /run/gpunuma/lock 2>/dev/null || true").strip()
    assert not lease or json.loads(lease) is None, "the run's lease was not given back: " + lease
    assert node.sh("ls -d /root/.ansible/tmp/ansible-tmp-* 2>/dev/null || true").strip() == ""
    # Why it stopped is in the node's journal (the controller that would have printed it is gone).
    journal = node.sh("journalctl --no-pager -q | grep 'gpunuma_apply: stopped' || true")
    assert "the controller went away (signal SIGINT)" in journal, (journal, log[-4000:])

    rc, out, _ = pull(node)
    assert rc == 0, out[-6000:]
    assert recap(out, node.name)["changed"] == 0, out[-6000:]


def test_a_controller_run_meets_the_lease_of_a_local_run(pull_node, tmp_path):
    # Runs after the Ctrl-C test, on the node it left: both instances on preferred, no lease.
    node = pull_node
    invocation = node.sh("systemctl show -p InvocationID --value gpunuma-worker-a.service").strip()
    _start_local_run(node, "-e gpunuma_profile=interleave -e numa_binding_settle_seconds=15")
    deadline = time.time() + 300
    while node.sh("systemctl show -p InvocationID --value gpunuma-worker-a.service").strip() == invocation:
        assert time.time() < deadline, node.sh("tail -c 4000 /tmp/local-run.log")
        time.sleep(0.5)

    inventory = tmp_path / "controller.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {node.name: {
        "ansible_connection": "community.docker.docker",
        "ansible_python_interpreter": "/usr/bin/python3",
        "gpu_topology_controller_dir": str(tmp_path / "topology"),
        "gpunuma_profile": "preferred", "memlock_limit": "4M", "memlock_groups": ["gpunuma"],
        "autonuma_numa_balancing": 0, "gpunuma_instances": INSTANCES}}}}))
    files = node.sh("cat /etc/systemd/system/gpunuma-worker-*.service")
    proc = subprocess.run([os.path.join(BINDIR, "ansible-playbook"), "-i", str(inventory), "playbooks/site.yml",
                           "-e", "gpunuma_lock_timeout=1"], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=900, env=ansible_env())
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-4000:]
    assert "another gpunuma run holds this node" in out, out[-4000:]
    for needle in ("controller %s" % node.name, "playbook site.yml"):
        assert needle in out, (needle, out[-4000:])
    # Refused before any change: the local run's files as it wrote them.
    assert node.sh("cat /etc/systemd/system/gpunuma-worker-*.service") == files

    log = _wait_local_run(node, time.time() + 300)
    assert recap(log, node.name)["failed"] == 0, log[-4000:]
    plan = json.loads(node.sh("cat /etc/gpunuma/plan.json"))
    state = json.loads(node.sh("cat /etc/gpunuma/state.json"))
    assert plan["profile"] == state["profile"] == "interleave", (plan["profile"], state["profile"])
    for instance in INSTANCES:
        unit = "gpunuma-%s.service" % instance["name"]
        assert "--interleave=0" in node.sh("cat /etc/systemd/system/%s" % unit)
        assert _policy(node, unit)[1] == ["interleave:0"], unit
