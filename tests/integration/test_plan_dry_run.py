"""The documented dry run, as a new user runs it: copy inventory/example.yml,
point a host at a real systemd node, run playbooks/plan.yml.

It must work with nothing but the copied inventory (every role default
reachable: no inventory/group_vars/, no variable only the demo sets), and it
must change nothing on the node: every file under /etc keeps its type, mode,
owner, mtime and content (sha256), as the numa_vm scenario checks for
check mode. The topology and the plan land on the controller only.
"""

import json
import os
import shutil
import subprocess

import pytest

from ansible_run import BINDIR, ansible_env
from conftest import FIXTURES, REPO_ROOT
from containers import Node, needs_docker

pytestmark = [pytest.mark.container, needs_docker]

TOPO_TEXT = os.path.join(FIXTURES, "published", "hgx-h200-8gpu-10nic-tabs.topo.txt")
NODE_TOPO_TEXT = "/root/hgx-h200.topo.txt"

# type, mode, owner, mtime and sha256 of every path under /etc, read on the node.
SNAPSHOT = r"""
import hashlib, json, os, stat, sys
out = {}
for top in sys.argv[1:]:
    for root, dirs, files in os.walk(top):
        for name in sorted(dirs + files):
            path = os.path.join(root, name)
            st = os.lstat(path)
            entry = [stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, st.st_mtime_ns]
            if stat.S_ISREG(st.st_mode):
                with open(path, "rb") as handle:
                    entry.append(hashlib.sha256(handle.read()).hexdigest())
            elif stat.S_ISLNK(st.st_mode):
                entry.append(os.readlink(path))
            out[path] = entry
    st = os.lstat(top)
    out[top] = [stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, st.st_mtime_ns]
print(json.dumps(out, sort_keys=True))
"""


def snapshot(node):
    proc = subprocess.run(["docker", "exec", "-i", node.name, "python3", "-", "/etc"], input=SNAPSHOT,
                          capture_output=True, text=True, check=True)
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    node = Node()
    tmp = tmp_path_factory.mktemp("my-fleet")
    controller_dir = os.path.join(REPO_ROOT, "topology")
    try:
        subprocess.run(["docker", "cp", TOPO_TEXT, "%s:%s" % (node.name, NODE_TOPO_TEXT)], check=True,
                       capture_output=True)
        # cp inventory/example.yml my-fleet.yml, then put a real host where
        # the example has gpu-a01.example.net (its connection in host_vars/).
        with open(os.path.join(REPO_ROOT, "inventory", "example.yml"), encoding="utf-8") as handle:
            example = handle.read()
        assert "gpu-a01.example.net" in example
        (tmp / "my-fleet.yml").write_text(example.replace("gpu-a01.example.net", node.name))
        (tmp / "host_vars").mkdir()
        (tmp / "host_vars" / (node.name + ".yml")).write_text(
            "ansible_connection: community.docker.docker\n"
            "ansible_user: root\n"
            "ansible_python_interpreter: /usr/bin/python3\n"
            # No GPU in a container: the node's topology comes from a saved
            # `nvidia-smi topo -m` of an 8-GPU H200 server, read on the node.
            "gpu_topology_nvidia_smi_topo_file: %s\n" % NODE_TOPO_TEXT
        )
        before = snapshot(node)
        proc = subprocess.run(
            [os.path.join(BINDIR, "ansible-playbook"), "-i", str(tmp / "my-fleet.yml"), "playbooks/plan.yml",
             "--limit", node.name],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=900, env=ansible_env(),
        )
        after = snapshot(node)
        files = {}
        for suffix in (".json", ".plan.json"):
            path = os.path.join(controller_dir, node.name + suffix)
            if os.path.exists(path):
                with open(path, encoding="utf-8") as handle:
                    files[suffix] = json.load(handle)
        yield node, proc, before, after, files
    finally:
        for suffix in (".json", ".plan.json", ".pending.json"):
            path = os.path.join(controller_dir, node.name + suffix)
            if os.path.exists(path):
                os.remove(path)
        if os.path.isdir(controller_dir) and not os.listdir(controller_dir):
            shutil.rmtree(controller_dir)
        node.remove()


def test_dry_run_works_with_a_copy_of_the_example_inventory(dry_run):
    node, proc, _, _, _ = dry_run
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-5000:]
    assert "is undefined" not in out
    # The example passes the shipped policies (GN-LIM-001: unlimited memlock only for the named servers).
    assert "policy GN-" not in out, [line for line in out.splitlines() if "policy GN-" in line]
    summary = [line for line in out.splitlines() if node.name in line and "[WARNING]" not in line
               and len(line.split()) > 1 and line.split()[1].startswith("vllm")]
    # One plan line per example instance (vllm0..vllm7).
    assert sorted(line.split()[1] for line in summary) == ["vllm%d" % n for n in range(8)], out[-5000:]
    # The planner's warnings are shown once each, naming the host they are about.
    warned = [line for line in out.splitlines() if "[WARNING]" in line and "was not checked" in line]
    assert warned and all(line.count(node.name + ": vllm") == 1 for line in warned), warned
    assert len(warned) == len(set(warned)), warned


def test_dry_run_says_what_site_would_change_per_host(dry_run):
    node, proc, _, after, _ = dry_run
    out = proc.stdout
    assert "WHAT (site.yml would do this; nothing was done)" in out, out[-5000:]
    changes = [line.strip().strip('",').split(None, 2)[1:] for line in out.splitlines()
               if line.strip().startswith('"%s ' % node.name) and len(line.split()) > 2
               and line.split()[1] in ("write", "remove", "start", "restart", "stop", "install", "sysctl", "create",
                                       "record")]
    # The units a new node gets, each named with its path, and the node's own files; none of them exists after.
    for n in range(8):
        unit = "/etc/systemd/system/gpunuma-vllm%d.service" % n
        assert ["write", unit + " (new)"] in changes, changes
        assert unit not in after
    assert ["write", "/etc/gpunuma/topology.json (new)"] in changes, changes
    assert any(c[0] == "write" and c[1].startswith("/etc/security/limits.d/") for c in changes), changes
    # Its instances would start (numa_binding_start: true in the example), and its profile would be recorded.
    assert ["start", "gpunuma-vllm0.service"] in changes, changes
    assert ["record", "profile strict in the node's state"] in changes, changes


def test_dry_run_keeps_topology_and_plan_on_the_controller(dry_run):
    node, _, _, _, files = dry_run
    assert files[".json"]["schema"] == "gpunuma.topology/v1" and len(files[".json"]["gpus"]) == 8
    plan = files[".plan.json"]
    assert plan["schema"] == "gpunuma.plan/v1"
    assert sorted(i["name"] for i in plan["instances"]) == ["vllm%d" % n for n in range(8)]


def test_dry_run_changes_nothing_under_etc(dry_run):
    node, _, before, after, _ = dry_run
    assert "/etc/gpunuma" not in after
    changed = sorted(path for path in set(before) | set(after) if before.get(path) != after.get(path))
    assert changed == [], [(path, before.get(path), after.get(path)) for path in changed]
    for watched in ("/etc/systemd/system", "/etc/sysctl.d", "/etc/security/limits.d"):
        assert watched in before
