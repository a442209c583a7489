"""ansible-pull: a node applies its own plan from a git checkout of the
inventory repository, with a local connection.

The controller builds, in tmp_path, a bare git repository holding gpunuma's
tracked files (as they are in the working tree) and an inventory for one
node, inventory/pull.yml. A systemd container from the fleet's base image
(gpunuma/debian-systemd:bookworm) gets, read-only, that repository, the
controller's Ansible (its site-packages, run by the node's python3) and the
controller's git (the image has none), and runs inside:

    ansible-pull -U file:///srv/gpunuma.git -C main -i inventory/pull.yml \
        -d /var/lib/gpunuma-pull playbooks/site.yml

The first pull must start the instances and record the plan; the second
must change nothing and restart nothing. Skipped only when there is no
Docker engine or no base image.
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


@pytest.fixture
def pull_node(tmp_path):
    name = "gpunuma-pull-%s" % uuid.uuid4().hex[:8]  # container, hostname and inventory host
    bare = build_repository(tmp_path, name)
    mounts = [(_site_packages(), SITE_IN_NODE), (str(write_entry_points(tmp_path)), BIN_IN_NODE),
              (str(bare), REPO_IN_NODE)] + _git_mounts()
    node = Node(name=name, hostname=True, mounts=mounts)
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
