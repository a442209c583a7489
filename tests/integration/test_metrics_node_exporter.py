"""gpunuma_metrics against Debian's real prometheus-node-exporter in a systemd container.

The role installs the collector and its timer; node_exporter's textfile
collector reads the directory; the test scrapes node_exporter over HTTP and
parses the answer with prometheus_client's text-format parser.  The probe
result is the one recorded on a real H200; the instance is a real unit
holding memory, so its numa_maps share is live.
"""

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from ansible_run import BINDIR, ansible_env
from conftest import FIXTURES, REPO_ROOT
from containers import Node, needs_docker

RECORDED = os.path.join(FIXTURES, "recorded", "h200-probe", "run2", "h2d-probe.json")
UUID = "GPU-17feaaa1-be79-190b-6694-75d1b3c48504"
TEXTFILE_DIR = "/var/lib/gpunuma/textfile"
HOLDER = ("[Service]\nExecStart=/usr/bin/python3 -c \"b = bytearray(64 << 20); import time; time.sleep(10**6)\"\n"
          "[Install]\nWantedBy=multi-user.target\n")


def playbook(tmp_path, hosts, check=False, **role_vars):
    inv = tmp_path / "inventory.yml"
    inv.write_text(yaml.safe_dump({"all": {"hosts": hosts, "vars": role_vars}}))
    play = tmp_path / "metrics.yml"
    play.write_text(yaml.safe_dump([{"hosts": "all", "gather_facts": False, "roles": ["gpunuma_metrics"]}]))
    cmd = [os.path.join(BINDIR, "ansible-playbook"), "-i", str(inv), str(play)] + (["--check"] if check else [])
    return subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600, env=ansible_env())


@pytest.mark.ansible
def test_bad_settings_named_before_anything_changes(tmp_path):
    proc = playbook(tmp_path, {"localhost": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}},
                    check=True, gpunuma_metrics_interval="soon", gpunuma_metrics_textfile_dir="/var/lib/node exporter",
                    gpunuma_metrics_python="/usr/bin/python3\n")
    assert proc.returncode != 0
    assert 'gpunuma_metrics_textfile_dir is "/var/lib/node exporter"; allowed: an absolute path of' in proc.stdout
    # A trailing newline is no part of a path ($ would match before it; the check anchors with \Z).
    assert 'gpunuma_metrics_python is "/usr/bin/python3\\n"; allowed: an absolute path of' in proc.stdout
    assert 'gpunuma_metrics_interval is "soon"; allowed: a systemd time span' in proc.stdout
    assert "Create the textfile collector directory" not in proc.stdout
    assert "Install the collector, its service and timer" not in proc.stdout


def install_node_exporter(node):
    """Debian's package from the mirror, else from this host's apt cache; skip when neither is reachable."""
    apt = "DEBIAN_FRONTEND=noninteractive apt-get"
    if subprocess.run(["docker", "exec", node.name, "sh", "-c",
                       "%s update -qq >/dev/null 2>&1 && %s install -y -qq --no-install-recommends prometheus-node-exporter >/dev/null 2>&1"
                       % (apt, apt)], capture_output=True).returncode == 0:
        return
    cached = [f for f in os.listdir("/var/cache/apt/archives") if f.startswith("prometheus-node-exporter_")] \
        if os.path.isdir("/var/cache/apt/archives") else []
    if not cached:
        pytest.skip("prometheus-node-exporter: no Debian mirror from the container and no .deb in /var/cache/apt/archives")
    subprocess.run(["docker", "cp", os.path.join("/var/cache/apt/archives", cached[0]), node.name + ":/tmp/ne.deb"], check=True)
    node.sh("%s install -y -qq /tmp/ne.deb >/dev/null 2>&1" % apt)


def scrape(ip):
    with urllib.request.urlopen("http://%s:9100/metrics" % ip, timeout=10) as resp:
        text = resp.read().decode()
    fams = list(text_string_to_metric_families(text))
    return {s.name + json.dumps(s.labels, sort_keys=True): s for f in fams for s in f.samples}, fams


def find(samples, name, **labels):
    return [s for s in samples.values() if s.name == name and all(s.labels.get(k) == str(v) for k, v in labels.items())]


@pytest.mark.container
@needs_docker
def test_node_exporter_scrapes_gpunuma_metrics(tmp_path):
    node = Node()
    try:
        install_node_exporter(node)
        # point Debian's node_exporter at a non-default directory: the role follows the setting
        node.sh("echo 'ARGS=\"--collector.textfile.directory=%s\"' > /etc/default/prometheus-node-exporter && "
                "mkdir -p /var/lib/gpunuma /etc/gpunuma && systemctl restart prometheus-node-exporter" % TEXTFILE_DIR)
        subprocess.run(["docker", "cp", RECORDED, node.name + ":/var/lib/gpunuma/h2d-probe.json"], check=True)
        plan = {"schema": "gpunuma.plan/v1", "hostname": node.name, "topology_fingerprint": "sha256:f00d", "profile": "strict",
                "instances": [{"name": "llm0", "unit": "gpunuma-llm0.service", "gpus": [0], "gpu_uuids": [UUID],
                               "numa_nodes": [0], "cpus": "0", "mem_policy": "bind", "mem_nodes": [0], "profile": "strict"}]}
        (tmp_path / "plan.json").write_text(json.dumps(plan))
        subprocess.run(["docker", "cp", str(tmp_path / "plan.json"), node.name + ":/etc/gpunuma/plan.json"], check=True)
        node.sh("printf '%s' > /etc/systemd/system/gpunuma-llm0.service && systemctl daemon-reload && "
                "systemctl start gpunuma-llm0.service" % HOLDER.replace("\n", "\\n"))
        node.sh("""echo '{"status": "drifted", "timestamp": 1796000000}' > /var/lib/gpunuma/audit.json""")
        hosts = {node.name: {"ansible_connection": "community.docker.docker", "ansible_python_interpreter": "/usr/bin/python3"}}
        # node_exporter's own directory, as its package or an admin left it: the role writes into it and changes
        # neither its owner nor its mode.
        node.sh("mkdir -p %s && chown prometheus:prometheus %s && chmod 2770 %s" % ((TEXTFILE_DIR,) * 3))
        # gpunuma_metrics_textfile_dir left at auto: the role finds TEXTFILE_DIR in node_exporter's ARGS.
        first = playbook(tmp_path, hosts, gpunuma_metrics_interval="2s")
        assert first.returncode == 0, first.stdout[-4000:]
        assert node.sh("stat -c '%%U:%%G %%a' %s" % TEXTFILE_DIR).strip() == "prometheus:prometheus 2770"
        second = playbook(tmp_path, hosts, gpunuma_metrics_interval="2s")
        assert second.returncode == 0 and "changed=0" in second.stdout, second.stdout[-3000:]
        assert node.sh("systemctl is-enabled gpunuma-metrics.timer").strip() == "enabled"
        # No temporary file left: the timer is held while one run of the oneshot collector completes (systemctl
        # start waits for a oneshot to finish), so the listing never meets a write in flight; then it runs again.
        node.sh("systemctl stop gpunuma-metrics.timer && systemctl start gpunuma-metrics.service")
        assert node.sh("ls -a %s" % TEXTFILE_DIR).split() == [".", "..", "gpunuma-node.prom"]
        node.sh("systemctl start gpunuma-metrics.timer")

        ip = subprocess.run(["docker", "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", node.name],
                            capture_output=True, text=True, check=True).stdout.strip()
        deadline = time.time() + 30
        while True:
            try:
                samples, fams = scrape(ip)
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(1)
        # node_exporter read our file without complaint
        assert find(samples, "node_textfile_scrape_error")[0].value == 0
        assert find(samples, "node_textfile_mtime_seconds", file=TEXTFILE_DIR + "/gpunuma-node.prom") or \
            find(samples, "node_textfile_mtime_seconds", file="gpunuma-node.prom")
        types = {f.name: f.type for f in fams}
        assert types["gpunuma_h2d_copy_duration_seconds"] == "summary"
        assert types["gpunuma_numa_other_node_pages"] == "counter"
        bw = find(samples, "gpunuma_h2d_copy_bandwidth_bytes_per_second", gpu_uuid=UUID, placement="local",
                  memory="pinned", direction="h2d", size_bytes=268435456)
        assert bw and bw[0].value == pytest.approx(55.446e9)
        assert find(samples, "gpunuma_h2d_copy_duration_seconds", placement="local", size_bytes=4096, quantile="0.99")
        assert find(samples, "gpunuma_numa_hit_pages_total", node="0")[0].value > 0
        assert find(samples, "gpunuma_numa_other_node_pages_total", node="0")
        info = find(samples, "gpunuma_instance_info", instance="llm0")[0]
        assert info.labels["gpu_uuids"] == UUID and info.labels["topology_fingerprint"] == "sha256:f00d"
        assert info.labels["cpus"] == "0" and info.labels["mem_policy"] == "bind"
        assert find(samples, "gpunuma_instance_up", instance="llm0")[0].value == 1
        resident = find(samples, "gpunuma_instance_memory_resident_bytes", instance="llm0", node=0)
        assert resident and resident[0].value >= 64 << 20  # the holder's 64 MiB buffer, live from numa_maps
        assert find(samples, "gpunuma_instance_local_pages_ratio", instance="llm0", kind="all")[0].value == 1.0
        assert find(samples, "gpunuma_node_profile_info", profile="strict")[0].value == 1
        assert find(samples, "gpunuma_audit_state", state="drifted")[0].value == 1

        # the timer refreshes the file: the collector's run timestamp moves on
        first_run = find(samples, "gpunuma_metrics_last_run_timestamp_seconds")[0].value
        deadline = time.time() + 30
        while time.time() < deadline:
            time.sleep(2)
            samples, _ = scrape(ip)
            if find(samples, "gpunuma_metrics_last_run_timestamp_seconds")[0].value > first_run:
                break
        else:
            raise AssertionError("gpunuma-metrics.timer did not refresh the textfile within 30 s")
    finally:
        node.remove()
