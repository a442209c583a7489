"""The kubelet_topology role against the upstream kubelet (docs/kubelet.md, "Tested against the real kubelet").

The kubelet is built from the k8s.io/kubernetes module (scripts/build-kubelet.sh,
cached under /var/cache/gpunuma/kubelet) for the oldest and the newest minor
gpunuma supports. Each runs in a systemd container of the fleet image with
Debian's containerd 1.6 as its runtime, standalone (no API server):

* the cgroupfs driver under a cgroup root of the node's own (the host's
  cgroup v1 hierarchies are shared; ``failCgroupV1: false`` from 1.35);
* the kernel settings the kubelet insists on (vm.overcommit_memory=1,
  kernel.panic=10, ...) bind-mounted as files over /proc/sys inside the node,
  so the host is untouched; /dev/kmsg is /dev/null;
* containerd with ``restrict_oom_score_adj``, runc's ``NoNewKeyring`` and
  ``NoPivotRoot`` (what a container-in-container needs), and a pause image
  made from Debian's busybox-static under containerd's default sandbox name.

The node is a real one-NUMA-node machine (this host), which is what the
upstream kubelet checks reservedMemory and NUMA ids against; what needs more
nodes, SMT, GPUs or device plugins stays with the stand-in of
molecule/kubelet (its docstring says which test covers the rest).
"""

import json
import os
import subprocess
import sys
import time

import pytest
import yaml

from ansible.module_utils.gpunuma.common.cpulist import parse_cpulist
from ansible_run import BINDIR, ansible_env
from conftest import REPO_ROOT
from containers import Node, needs_docker

pytestmark = [pytest.mark.kubelet_real, pytest.mark.container, needs_docker]

VERSIONS = tuple(os.environ.get("GPUNUMA_KUBELET_VERSIONS", "v1.34.4 v1.37.2").split())
RUNTIME_CACHE = os.path.join(os.environ.get("GPUNUMA_CACHE_DIR", "/var/cache/gpunuma"), "kubelet-runtime")
RUNTIME_DEBS = ("containerd", "runc", "busybox-static")
PAUSE_IMAGE = "registry.k8s.io/pause:3.6"  # containerd 1.6's default sandbox_image
CONFIG = "/var/lib/kubelet/config.yaml"
# What a fresh node's kubelet runs with: no NUMA policy (the defaults none / None / none).
FRESH_CONFIG = """\
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
cgroupRoot: /{root}
failCgroupV1: false
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
staticPodPath: /etc/kubernetes/manifests
failSwapOn: false
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
kubeReserved:
  cpu: 100m
  memory: 256Mi
evictionHard:
  memory.available: 100Mi
"""
UNIT = """\
[Unit]
Description=kubelet {version} (upstream, standalone; gpunuma tests)
After=containerd.service
Requires=containerd.service

[Service]
ExecStart=/usr/local/bin/kubelet --config={config} --hostname-override={name}
# The real unit restarts on failure; here a refusal shows at once.
Restart=no

[Install]
WantedBy=multi-user.target
"""
SYSCTLS = {"vm/overcommit_memory": "1", "vm/panic_on_oom": "0", "kernel/panic": "10", "kernel/panic_on_oops": "1",
           "kernel/keys/root_maxkeys": "1000000", "kernel/keys/root_maxbytes": "25000000"}
HIERARCHIES = ("cpu", "cpuacct", "cpuset", "memory", "pids", "hugetlb", "blkio", "devices", "freezer", "net_cls",
               "perf_event", "net_prio", "systemd", "unified")


def _run(argv, timeout=600, **kwargs):
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kwargs)


def _runtime_debs():
    os.makedirs(RUNTIME_CACHE, exist_ok=True)
    have = {name: [f for f in os.listdir(RUNTIME_CACHE) if f.startswith(name + "_") and f.endswith(".deb")]
            for name in RUNTIME_DEBS}
    missing = [name for name, files in have.items() if not files]
    if missing:
        proc = _run(["apt-get", "download"] + missing, cwd=RUNTIME_CACHE)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return RUNTIME_CACHE


def _pause_tarball():
    """A pause image from busybox-static (no registry is reachable), saved once as a docker archive."""
    tarball = os.path.join(RUNTIME_CACHE, "pause-3.6.tar")
    if os.path.isfile(tarball):
        return tarball
    work = os.path.join(RUNTIME_CACHE, "pause-build")
    _run(["rm", "-rf", work])
    os.makedirs(os.path.join(work, "root"))
    (deb,) = [f for f in os.listdir(RUNTIME_CACHE) if f.startswith("busybox-static_")]
    assert _run(["dpkg-deb", "-x", os.path.join(RUNTIME_CACHE, deb), os.path.join(work, "x")]).returncode == 0
    os.replace(os.path.join(work, "x", "bin", "busybox"), os.path.join(work, "root", "busybox"))
    assert _run(["tar", "-C", os.path.join(work, "root"), "-cf", os.path.join(work, "rootfs.tar"), "."]).returncode == 0
    proc = _run(["docker", "import", "--change", 'ENTRYPOINT ["/busybox", "sleep", "2147483647"]',
                 os.path.join(work, "rootfs.tar"), PAUSE_IMAGE])
    assert proc.returncode == 0, proc.stderr
    proc = _run(["docker", "save", "-o", tarball + ".part", PAUSE_IMAGE])
    assert proc.returncode == 0, proc.stderr
    os.replace(tarball + ".part", tarball)
    _run(["rm", "-rf", work])
    return tarball


def _kubelet(version):
    proc = _run([os.path.join(REPO_ROOT, "scripts", "build-kubelet.sh"), version], timeout=3600)
    assert proc.returncode == 0, "scripts/build-kubelet.sh %s failed:\n%s" % (version, proc.stderr[-4000:])
    return proc.stdout.strip().splitlines()[-1]


class KubeletNode:
    """A systemd container running containerd and the upstream kubelet ``version``."""

    def __init__(self, version):
        self.version = version
        binary = _kubelet(version)
        debs = _runtime_debs()
        pause = _pause_tarball()
        self.node = Node(hostname=True, mounts=[(debs, "/debs")],
                         extra_args=["--tmpfs", "/var/lib/containerd:exec", "--tmpfs", "/var/lib/kubelet:exec"])
        self.name = self.node.name
        self.root = self.name + "-pods"
        sh = self.node.sh
        sh("dpkg -i /debs/runc_*.deb /debs/containerd_*.deb /debs/busybox-static_*.deb >/dev/null")
        sh("mkdir -p /etc/containerd && containerd config default | sed -e "
           "'s/restrict_oom_score_adj = false/restrict_oom_score_adj = true/' -e 's/NoNewKeyring = false/NoNewKeyring = true/' "
           "-e 's/NoPivotRoot = false/NoPivotRoot = true/' > /etc/containerd/config.toml && systemctl restart containerd")
        for cmd in (["docker", "cp", pause, "%s:/pause.tar" % self.name],
                    ["docker", "cp", binary, "%s:/usr/local/bin/kubelet" % self.name]):
            proc = _run(cmd)
            assert proc.returncode == 0, proc.stderr
        sh("ctr -n k8s.io images import /pause.tar >/dev/null && rm /pause.tar")
        sh("ln -sf /dev/null /dev/kmsg; mkdir -p /run/gpunuma-sysctl /etc/kubernetes/manifests")
        for key, value in SYSCTLS.items():
            fake = "/run/gpunuma-sysctl/" + key.replace("/", "_")
            sh("echo %s > %s; [ \"$(cat /proc/sys/%s)\" = %s ] || mount --bind %s /proc/sys/%s"
               % (value, fake, key, value, fake, key))
        sh(" ".join("[ -d /sys/fs/cgroup/%s ] && mkdir -p /sys/fs/cgroup/%s/%s;" % (h, h, self.root)
                    for h in HIERARCHIES) + " true")
        sh("cat > %s <<'EOF'\n%sEOF" % (CONFIG, FRESH_CONFIG.format(root=self.root)))
        sh("cat > /etc/systemd/system/kubelet.service <<'EOF'\n%sEOF\nsystemctl daemon-reload && "
           "systemctl enable --now kubelet.service" % UNIT.format(version=version, config=CONFIG, name=self.name))
        self.wait_healthy()

    def wait_healthy(self, seconds=90):
        deadline = time.time() + seconds
        while time.time() < deadline:
            if self.node.sh("python3 -c \"import urllib.request as u; print(u.urlopen('http://127.0.0.1:10248/healthz',"
                            " timeout=2).read().decode())\" 2>/dev/null", check=False).strip() == "ok":
                return
            time.sleep(1)
        raise AssertionError("kubelet %s not healthy:\n%s" % (self.version, self.journal()))

    def journal(self, lines=40):
        return self.node.sh("journalctl -u kubelet.service --no-pager -n %d" % lines, check=False)

    def read(self, path):
        return self.node.sh("cat %s" % path, check=False)

    def starts(self):
        return int(self.node.sh("systemctl show --property=NRestarts --value kubelet.service") or 0)

    def remove(self):
        self.node.sh("systemctl stop kubelet.service; crictl rmp -af >/dev/null 2>&1; "
                     "ctr -n k8s.io tasks ls -q | xargs -r -n1 ctr -n k8s.io tasks kill -s KILL", check=False)
        self.node.remove()
        for hierarchy in HIERARCHIES:
            top = "/sys/fs/cgroup/%s/%s" % (hierarchy, self.root)
            if os.path.isdir(top):
                for root, dirs, _files in sorted(os.walk(top), key=lambda w: -w[0].count("/")):
                    try:
                        os.rmdir(root)
                    except OSError:
                        pass


def _playbook(node, tmp_path, extra_vars):
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {node.name: {
        "ansible_connection": "community.docker.docker", "ansible_python_interpreter": "/usr/bin/python3",
        "kubelet_topology_config_path": CONFIG, "kubelet_topology_kubelet_version": node.version.lstrip("v"),
        "kubelet_topology_health_retries": 30, "kubelet_topology_health_delay": 1,
        "gpu_topology_persist_on_node": False, "gpu_topology_controller_dir": str(tmp_path / "topology")}}}}))
    playbook = tmp_path / "kubelet.yml"
    playbook.write_text(yaml.safe_dump([{
        "name": "Discover the node and set its kubelet policies", "hosts": "all", "gather_facts": False,
        "tasks": [{"name": "Discover", "ansible.builtin.include_role": {"name": "gpu_topology"}},
                  {"name": "Kubelet", "ansible.builtin.include_role": {"name": "kubelet_topology"}}]}]))
    proc = subprocess.run(
        [os.path.join(BINDIR, "ansible-playbook"), "-i", str(inventory), str(playbook), "-e", json.dumps(extra_vars)],
        cwd=REPO_ROOT, env=ansible_env(), capture_output=True, text=True, timeout=900)
    return proc


@pytest.fixture(scope="module", params=VERSIONS)
def kubelet_node(request):
    node = KubeletNode(request.param)
    yield node
    node.remove()


def _state(node, name):
    text = node.read("/var/lib/kubelet/" + name)
    return json.loads(text) if text.strip() else None


def test_fresh_node_to_static_and_back_with_checkpoints(kubelet_node, tmp_path):
    node = kubelet_node
    assert _state(node, "cpu_manager_state")["policyName"] == "none"
    # strict: static CPU Manager with the plan's housekeeping CPUs reserved, Static Memory Manager.
    proc = _playbook(node, tmp_path, {"gpunuma_profile": "strict"})
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    node.wait_healthy()
    config = yaml.safe_load(node.read(CONFIG))
    assert config["cpuManagerPolicy"] == "static" and config["memoryManagerPolicy"] == "Static"
    assert config["reservedSystemCPUs"] and config["reservedMemory"], config
    # The upstream kubelet accepted it: its checkpoints now say static / Static (the old ones were removed).
    assert _state(node, "cpu_manager_state")["policyName"] == "static", node.journal()
    assert _state(node, "memory_manager_state")["policyName"] == "Static", node.journal()
    # Idempotent: a second run neither changes nor restarts.
    before = node.node.main_pid("kubelet.service")
    proc = _playbook(node, tmp_path, {"gpunuma_profile": "strict"})
    assert proc.returncode == 0 and "changed=0" in proc.stdout, proc.stdout[-4000:]
    assert node.node.main_pid("kubelet.service") == before
    # off: back to none, and the kubelet accepts the move (the static checkpoint is removed first).
    proc = _playbook(node, tmp_path, {"gpunuma_profile": "off"})
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    node.wait_healthy()
    assert yaml.safe_load(node.read(CONFIG)).get("cpuManagerPolicy", "none") == "none"
    assert _state(node, "cpu_manager_state")["policyName"] == "none", node.journal()


GUARANTEED_POD = """\
apiVersion: v1
kind: Pod
metadata:
  name: pinned
  namespace: default
spec:
  hostNetwork: true
  containers:
    - name: work
      image: {image}
      imagePullPolicy: Never
      resources:
        requests: {{cpu: "1", memory: 64Mi}}
        limits: {{cpu: "1", memory: 64Mi}}
"""


def test_a_guaranteed_pod_gets_the_cpus_the_plan_left_for_pods(kubelet_node, tmp_path):
    node = kubelet_node
    proc = _playbook(node, tmp_path, {"gpunuma_profile": "strict"})
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    node.wait_healthy()
    reserved = yaml.safe_load(node.read(CONFIG))["reservedSystemCPUs"]
    node.node.sh("cat > /etc/kubernetes/manifests/pinned.yaml <<'EOF'\n%sEOF" % GUARANTEED_POD.format(image=PAUSE_IMAGE))
    deadline, pid = time.time() + 120, ""
    while time.time() < deadline and not pid:
        pid = node.node.sh("for t in $(ctr -n k8s.io tasks ls -q); do ctr -n k8s.io containers info $t 2>/dev/null "
                           "| grep -q '\"io.kubernetes.container.name\": \"work\"' && ctr -n k8s.io tasks ls "
                           "| awk -v t=$t '$1==t {print $2}'; done", check=False).strip()
        time.sleep(2)
    assert pid, "the pod's container never ran:\n" + node.journal(60)
    allowed = node.node.sh("grep Cpus_allowed_list /proc/%s/status" % pid).split(":")[1].strip()
    state = _state(node, "cpu_manager_state")
    (assigned,) = [cpus for containers in state["entries"].values() for cpus in containers.values()]
    # Exclusive CPUs from the pods' share, never the plan's housekeeping (reservedSystemCPUs), and the
    # process really runs on them.
    assert parse_cpulist(allowed) == parse_cpulist(assigned), (allowed, state)
    assert not parse_cpulist(assigned) & parse_cpulist(reserved), (assigned, reserved)
    # The pod goes, and its exclusive CPUs go back to the shared pool (the next test starts from a node
    # without pods).
    node.node.sh("rm /etc/kubernetes/manifests/pinned.yaml")
    deadline = time.time() + 120
    while time.time() < deadline and (_state(node, "cpu_manager_state") or {}).get("entries"):
        time.sleep(2)
    assert not _state(node, "cpu_manager_state").get("entries"), node.journal()


def test_a_change_the_kubelet_refuses_is_restored_byte_for_byte(kubelet_node, tmp_path):
    node = kubelet_node
    proc = _playbook(node, tmp_path, {"gpunuma_profile": "strict"})
    assert proc.returncode == 0, proc.stdout[-6000:]
    node.wait_healthy()
    before = {path: node.read(path) for path in (CONFIG, "/var/lib/kubelet/cpu_manager_state",
                                                 "/var/lib/kubelet/memory_manager_state",
                                                 "/var/lib/kubelet/dra_manager_state")}
    # Every checkpoint the kubelet keeps is there to be restored, the DRA manager's included.
    assert all(text.strip() for text in before.values()), before
    # reservedMemory on NUMA node 1, which this one-node machine does not have: only the kubelet can tell.
    with open(os.path.join(REPO_ROOT, "tests", "fixtures", "topologies", "hgx-h200-8gpu-2socket-ht.json")) as handle:
        two_nodes = json.load(handle)
    proc = _playbook(node, tmp_path, {"gpunuma_profile": "strict", "kubelet_topology_topology": two_nodes,
                                      "kubelet_topology_memory_spread": "cpu_nodes",
                                      "kubelet_topology_housekeeping_cpus": "0"})
    assert proc.returncode != 0, proc.stdout[-4000:]
    after = {path: node.read(path) for path in before}
    assert after == before, proc.stdout[-6000:]
    node.wait_healthy()
    # The failure quotes the kubelet's own reason for refusing, from its journal: the error that stopped the
    # refused start (klog's "Failed to start ContainerManager" / "command failed" line).
    journal = node.node.sh("journalctl -u kubelet.service --no-pager -o cat", check=False)
    fatal = [line for line in journal.splitlines()
             if line[:1] in "EF" and ("Failed to start ContainerManager" in line or "command failed" in line
                                      or "failed to run Kubelet" in line)]
    assert fatal, journal[-4000:]
    reason = fatal[-1].split("] ", 1)[1]
    assert reason[:100] in proc.stdout, "kubelet said: %s\nthe role said:\n%s" % (reason, proc.stdout[-6000:])


DROPIN = "/etc/systemd/system/kubelet.service.d/50-gpunuma-memory-checkpoint.conf"


def test_a_memory_checkpoint_a_reboot_left_behind_is_moved_aside_before_the_kubelet_starts(kubelet_node, tmp_path):
    """The drop-in's check runs before the real kubelet starts (docs/kubelet.md, "The Memory Manager checkpoint
    after a reboot"). A moved kernel image is played inside the node: node 0's meminfo, which the kubelet's
    cAdvisor and the check both read, is bind-mounted with MemTotal 8 KiB higher, and the checkpoint is dated
    before the boot. Without the check the kubelet refuses its own, intact checkpoint; with it, it starts."""
    node = kubelet_node
    sh = node.node.sh
    proc = _playbook(node, tmp_path, {"gpunuma_profile": "strict"})
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    node.wait_healthy()
    assert "kubelet-memory-checkpoint" in node.read(DROPIN)
    assert "kubelet-memory-checkpoint" in sh("systemctl show --property=ExecStartPre kubelet.service")
    meminfo = "/sys/devices/system/node/node0/meminfo"
    sh("systemctl stop kubelet.service")
    sh("awk '/MemTotal:/ {$(NF-1) += 8} {print}' %s > /run/gpunuma-meminfo && mount --bind /run/gpunuma-meminfo %s && "
       "touch -d @$(( $(awk '/^btime/ {print $2}' /proc/stat) - 3600 )) /var/lib/kubelet/memory_manager_state"
       % (meminfo, meminfo))
    try:
        stale = node.read("/var/lib/kubelet/memory_manager_state")
        # Without the check, the kubelet refuses it.
        sh("mv %s /root/dropin.conf && systemctl daemon-reload && systemctl start kubelet.service" % DROPIN, check=False)
        # Its refusal, in its own words (its health endpoint may answer for a moment before the memory manager
        # starts and fails, so health alone cannot tell).
        deadline = time.time() + 90
        while "the expected machine state is different from the real one" not in node.journal(200):
            assert time.time() < deadline, node.journal(200)
            time.sleep(1)
        assert node.read("/var/lib/kubelet/memory_manager_state") == stale
        # With it, the checkpoint is moved aside (kept byte for byte) and the kubelet starts.
        sh("systemctl stop kubelet.service; systemctl reset-failed kubelet.service; mv /root/dropin.conf %s && "
           "systemctl daemon-reload && systemctl start kubelet.service" % DROPIN, check=False)
        node.wait_healthy()
        moved = sh("ls /var/lib/gpunuma/kubelet-backup/stale").split()
        assert len(moved) == 1 and moved[0].startswith("memory_manager_state.stale-"), moved
        assert node.read("/var/lib/gpunuma/kubelet-backup/stale/" + moved[0]) == stale
        assert "gpunuma memory checkpoint check: /var/lib/kubelet/memory_manager_state: moved to" in node.journal(200)
        assert "node 0 +8192 bytes" in node.journal(200)
        assert _state(node, "memory_manager_state")["policyName"] == "Static", node.journal()
        # The next start, on the kubelet's own fresh checkpoint, keeps it.
        sh("systemctl restart kubelet.service")
        node.wait_healthy()
        assert sh("ls /var/lib/gpunuma/kubelet-backup/stale").split() == moved
        assert "memory_manager_state: kept; memory totals match the machine" in node.journal(200)
    finally:
        # The node's own memory again, and a checkpoint of it.
        sh("systemctl stop kubelet.service; umount %s; rm -f /var/lib/kubelet/memory_manager_state; "
           "systemctl reset-failed kubelet.service; systemctl start kubelet.service" % meminfo, check=False)
    node.wait_healthy()


def test_gpu_and_cpu_hands_the_cpus_to_a_cpu_dra_driver(kubelet_node, tmp_path):
    """kubelet_topology_dra gpu_and_cpu on a strict node: CPU Manager none, Memory Manager None, the housekeeping
    CPUs still reserved; the real kubelet accepts it once the static checkpoints are gone."""
    node = kubelet_node
    proc = _playbook(node, tmp_path, {"gpunuma_profile": "strict"})
    assert proc.returncode == 0, proc.stdout[-6000:]
    node.wait_healthy()
    reserved = yaml.safe_load(node.read(CONFIG))["reservedSystemCPUs"]
    proc = _playbook(node, tmp_path, {"gpunuma_profile": "strict", "kubelet_topology_dra": "gpu_and_cpu"})
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    node.wait_healthy()
    config = yaml.safe_load(node.read(CONFIG))
    assert config.get("cpuManagerPolicy", "none") == "none" and config.get("memoryManagerPolicy", "None") == "None"
    assert "reservedMemory" not in config and config["reservedSystemCPUs"] == reserved, config
    assert _state(node, "cpu_manager_state")["policyName"] == "none", node.journal()
    assert _state(node, "memory_manager_state")["policyName"] == "None", node.journal()
    assert "--reserved-cpus=%s" % reserved in proc.stdout + proc.stderr
    # No Static Memory Manager: the check is gone with it.
    assert not node.node.sh("ls %s 2>/dev/null" % DROPIN, check=False).strip()
