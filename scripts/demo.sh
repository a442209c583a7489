#!/usr/bin/env bash
# The live demo (docs/demo.md): a small fleet of systemd containers, each
# given a real-shaped GPU topology, taken through the whole life of a fleet,
# one real playbook a step:
#
#   plan.yml -> site.yml (strict) -> audit.yml -> rollback.yml (one node to
#   preferred) -> audit.yml -> validate.yml
#
# then the JSON artefacts are collected into .demo/artefacts/ and rendered as
# the HTML fleet report (playbooks/report.yml).
#
# Only the GPU-less node discovered live (its own sysfs) runs its instance:
# a stand-in worker (scripts/demo-worker.py) that reports the binding the
# kernel gave it. The other nodes' topologies are offline inputs (published
# `nvidia-smi topo -m` outputs, a recorded H200 VM): their units are installed
# and verified but not started, since the CPUs and nodes they plan do not
# exist on this machine.
#
# Where Docker cannot run, falls back to the plan-only demo (inventory/demo.yml:
# discovery and plan of this machine and fixture hosts; nothing provisioned).
#
# Usage: scripts/demo.sh [--plan-only | --clean] [ansible-playbook options]
#   --plan-only  the plan-only demo, even where Docker could run
#   --clean      remove the demo containers (gpunuma-demo-*) and .demo/
# Environment:
#   GPUNUMA_DEMO_HOSTS=demo-live,h200-vm,...  a smaller fleet (default: all six)
#   GPUNUMA_DEMO_DOCKER=0                     never use Docker (plan-only demo)
#   GPUNUMA_DEMO_DIR=DIR                      the demo's files (default .demo/)
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"

readonly IMAGE=gpunuma/debian-systemd:bookworm
readonly PREFIX=gpunuma-demo-
readonly DEMO_DIR="$(realpath -m "${GPUNUMA_DEMO_DIR:-$REPO/.demo}")"
readonly FLEET_DIR="$DEMO_DIR/fleet"
readonly ARTEFACTS="$DEMO_DIR/artefacts"
# Where the node sees the repository's fixtures and the stand-in worker.
readonly NODE_FIXTURES=/opt/gpunuma-demo/fixtures
readonly NODE_WORKER=/opt/gpunuma-demo/demo-worker.py
readonly ALL_HOSTS="demo-live hgx-h200-8gpu gb200-4gpu dgx-a100-nps4 h200-vm mi300x-cpx"
# The AMD node's sysfs tree (scripts/gen-amd-demo-host.py), unpacked where its discovery reads it.
readonly AMD_TREE=tests/fixtures/hosts/mi300x-cpx-sysfs.tar.gz
readonly NODE_AMD_ROOT=/opt/gpunuma-demo/hosts/mi300x-cpx
readonly LIVE_HOST=demo-live
readonly WORKER_PORT=8081

say() { printf '%s\n' "$*"; }
header() { printf '\n== %s\n' "$*"; }

mode=live
case "${1:-}" in
  --clean) mode=clean; shift ;;
  --plan-only) mode=plan-only; shift ;;
esac

demo_containers() {
  command -v docker >/dev/null 2>&1 || return 0
  docker ps -a --filter "name=^${PREFIX}" --filter label=org.gpunuma.demo --format '{{.Names}}' 2>/dev/null || true
}

if [ "$mode" = clean ]; then
  names="$(demo_containers)"
  if [ -n "$names" ]; then
    # shellcheck disable=SC2086  # one name a word
    docker rm -f $names >/dev/null
    say "gpunuma demo: removed $(echo "$names" | wc -w) demo container(s)"
  fi
  rm -rf "$DEMO_DIR"
  say "gpunuma demo: removed $DEMO_DIR"
  exit 0
fi

scripts/setup-venv.sh
export PATH="$REPO/.venv/bin:$PATH"
PY="$REPO/.venv/bin/python"
export ANSIBLE_CONFIG="$REPO/ansible.cfg" ANSIBLE_NOCOLOR=1 ANSIBLE_RETRY_FILES_ENABLED=0 \
  ANSIBLE_LOCALHOST_WARNING=0 ANSIBLE_INVENTORY_UNPARSED_WARNING=0

plan_only() {
  say "gpunuma demo: plan only: $1; discovering and planning inventory/demo.yml, nothing is provisioned"
  shift
  # inventory/demo.yml reads the AMD node's tree under the demo directory.
  rm -rf "$DEMO_DIR/hosts/mi300x-cpx" && mkdir -p "$DEMO_DIR/hosts/mi300x-cpx"
  tar -xzf "$AMD_TREE" -C "$DEMO_DIR/hosts/mi300x-cpx"
  exec ansible-playbook -i inventory/demo.yml playbooks/plan.yml -e "{\"gpunuma_demo_dir\": \"$DEMO_DIR\"}" "$@"
}

[ "$mode" = plan-only ] && plan_only "--plan-only asked for it" "$@"

# Why Docker cannot run the fleet here (empty: it can). As root, the engine
# and the base image are installed, started and built when missing.
docker_problem() {
  if [ "${GPUNUMA_DEMO_DOCKER:-1}" = 0 ]; then
    echo "GPUNUMA_DEMO_DOCKER=0 turns the Docker fleet off"; return
  fi
  if [ "$(id -u)" = 0 ]; then
    scripts/setup-host.sh >"$DEMO_DIR/setup-host.log" 2>&1 \
      || { echo "scripts/setup-host.sh could not install or start the Docker engine ($DEMO_DIR/setup-host.log)"; return; }
  fi
  if ! command -v docker >/dev/null 2>&1; then
    echo "no docker client on PATH (as root, scripts/setup-host.sh installs it)"; return
  fi
  if ! docker info >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then echo "the Docker engine does not run"; else echo "not root, and no Docker engine this user may use"; fi
    return
  fi
  if ! docker image inspect "$IMAGE" >/dev/null 2>&1; then
    if [ "$(id -u)" != 0 ]; then
      echo "the base image $IMAGE is missing and building it needs root"; return
    fi
    scripts/build-base-image.sh >"$DEMO_DIR/build-base-image.log" 2>&1 \
      || { echo "the base image $IMAGE could not be built ($DEMO_DIR/build-base-image.log)"; return; }
  fi
}

mkdir -p "$DEMO_DIR"
problem="$(docker_problem)"
[ -n "$problem" ] && plan_only "$problem" "$@"

# --- The fleet ---------------------------------------------------------------
hosts=()
IFS=', ' read -r -a wanted <<<"${GPUNUMA_DEMO_HOSTS:-$ALL_HOSTS}"
for h in "${wanted[@]}"; do
  [ -z "$h" ] && continue
  case " $ALL_HOSTS " in
    *" $h "*) hosts+=("$h") ;;
    *) say "gpunuma demo: unknown host '$h' in GPUNUMA_DEMO_HOSTS; allowed: $ALL_HOSTS" >&2; exit 2 ;;
  esac
done
[ ${#hosts[@]} -gt 0 ] || { say "gpunuma demo: GPUNUMA_DEMO_HOSTS names no host" >&2; exit 2; }
# The node moved down the ladder: the live one (its worker shows the change).
rollback_host="${hosts[0]}"
case " ${hosts[*]} " in *" $LIVE_HOST "*) rollback_host=$LIVE_HOST ;; esac

# A container is reused while it runs this repository's mounts on this image.
config="$(printf '%s\n' "$REPO" "$(docker image inspect -f '{{.Id}}' "$IMAGE")" | sha256sum | cut -c1-12)"

header "fleet: ${#hosts[@]} systemd containers (${PREFIX}*)"
for name in $(demo_containers); do
  case " ${hosts[*]} " in *" ${name#"$PREFIX"} "*) continue ;; esac
  docker rm -f "$name" >/dev/null  # a host left out of GPUNUMA_DEMO_HOSTS this time
done
started=()
for h in "${hosts[@]}"; do
  name="$PREFIX$h"
  have="$(docker inspect -f '{{index .Config.Labels "org.gpunuma.demo"}} {{.State.Running}}' "$name" 2>/dev/null || true)"
  if [ "$have" = "$config true" ]; then
    # Reused: the life of the fleet starts again from a node gpunuma never touched.
    docker exec "$name" sh -c 'rm -rf /etc/gpunuma' >/dev/null
    say "  $h: reusing $name (its /etc/gpunuma cleared)"
    continue
  fi
  [ -n "$have" ] && docker rm -f "$name" >/dev/null
  docker run -d --name "$name" --hostname "$h" --label "org.gpunuma.demo=$config" \
    --cap-add SYS_ADMIN --cap-add SYS_NICE --cgroupns host \
    -v /sys/fs/cgroup:/sys/fs/cgroup:rw --tmpfs /run --tmpfs /run/lock \
    -v "$REPO/tests/fixtures:$NODE_FIXTURES:ro" -v "$REPO/scripts/demo-worker.py:$NODE_WORKER:ro" \
    --stop-signal SIGRTMIN+3 "$IMAGE" /lib/systemd/systemd >/dev/null
  started+=("$h")
done
case " ${hosts[*]} " in
  *" mi300x-cpx "*)
    docker exec -i "${PREFIX}mi300x-cpx" sh -c "rm -rf $NODE_AMD_ROOT && mkdir -p $NODE_AMD_ROOT && tar -xzf - -C $NODE_AMD_ROOT" \
      <"$AMD_TREE" ;;
esac
for h in "${started[@]}"; do
  state=
  for _ in $(seq 1 300); do
    state="$(timeout 300 docker exec "$PREFIX$h" systemctl is-system-running --wait 2>/dev/null || true)"
    case "$state" in running|degraded) break ;; esac
    sleep 1
  done
  case "$state" in
    running|degraded) say "  $h: started $PREFIX$h (systemd $state)" ;;
    *) say "gpunuma demo: $PREFIX$h did not finish booting (systemd: ${state:-no answer})" >&2; exit 1 ;;
  esac
done

# --- The inventory -------------------------------------------------------------
# systemd in a container cannot give units more locked memory than its own
# hard limit (8 MiB under Docker's defaults): ask for what the nodes have.
memlock_hard="$(docker exec "$PREFIX${hosts[0]}" awk '/^Max locked memory/ {print $5}' /proc/1/limits)"
mkdir -p "$FLEET_DIR"
rm -rf "$FLEET_DIR/topology" "$FLEET_DIR"/audit-* "$FLEET_DIR/validation" "$ARTEFACTS"
INVENTORY="$FLEET_DIR/inventory.yml"
"$PY" - "$INVENTORY" "$REPO" "${hosts[@]}" <<EOF
import json, sys
import yaml

out, repo, hosts = sys.argv[1], sys.argv[2], sys.argv[3:]
demo = yaml.safe_load(open(repo + "/inventory/demo.yml"))["all"]["children"]
instances = {name: h["gpunuma_instances"] for group in demo.values() for name, h in group["hosts"].items()}
fx = "$NODE_FIXTURES"
published = {"gpunuma_allow_unknown_siblings": True}
offline = {
    "hgx-h200-8gpu": dict(published, gpu_topology_nvidia_smi_topo_file=fx + "/published/hgx-h200-8gpu-10nic-tabs.topo.txt"),
    "gb200-4gpu": dict(published, gpu_topology_nvidia_smi_topo_file=fx + "/published/gb200-4gpu-gpunumaid.topo.txt"),
    "dgx-a100-nps4": dict(published, gpu_topology_nvidia_smi_topo_file=fx + "/published/dgxa100-epyc7742-nps4-10nic.topo.txt"),
    # An AMD node: 8 MI300X in CPX mode, 63 compute partitions (a published KFD capture).
    "mi300x-cpx": {"gpu_topology_sysfs_root": "$NODE_AMD_ROOT"},
    "h200-vm": {"gpu_topology_sysfs_root": fx + "/recorded/h200-vm/sysfs",
                "gpu_topology_nvml_dump": fx + "/recorded/h200-vm/nvml-dump.json",
                # No GPU here: validate.yml replays the probe recorded on that H200.
                "gpu_validate_probe_replay": repo + "/tests/fixtures/recorded/h200-probe/run2/h2d-probe.json"},
}
inv = {}
for host in hosts:
    hv = {"ansible_host": "$PREFIX" + host}
    if host == "$LIVE_HOST":
        # Discovered live (the container's own sysfs): the stand-in worker
        # really runs, bound through numactl like a real server.
        hv["gpunuma_instances"] = [{"name": "worker", "numa_node": 0, "memory": "256M",
                                    "command": ["/usr/bin/python3", "$NODE_WORKER", "--port", "$WORKER_PORT"]}]
    else:
        hv.update(offline[host])
        hv["gpunuma_instances"] = instances[host]
        # The planned CPUs and nodes are not this machine's: install and verify, never start.
        hv["numa_binding_start"] = False
    inv[host] = hv
doc = {"all": {"vars": {
    "ansible_connection": "community.docker.docker",
    "ansible_python_interpreter": "/usr/bin/python3",
    "gpunuma_profile": "strict",
    "gpu_topology_controller_dir": "$FLEET_DIR/topology",
    "numa_binding_settle_seconds": 2,
    "memlock_limit": "$memlock_hard",
}, "hosts": inv}}
with open(out, "w") as handle:
    handle.write("# Written by scripts/demo.sh: the live demo fleet (docs/demo.md).\n")
    yaml.safe_dump(doc, handle, sort_keys=False)
EOF

# --- The steps ---------------------------------------------------------------
# Each playbook's full output goes to .demo/fleet/logs/; the terminal gets its
# tables (the debug messages) and, on failure, the end of the log.
mkdir -p "$FLEET_DIR/logs"
step_no=0
play() {
  local title="$1"; shift
  step_no=$((step_no + 1))
  local log
  log="$FLEET_DIR/logs/$step_no-$(basename "$1" .yml).log"
  header "$step_no. $title"
  local rc=0
  ansible-playbook -i "$INVENTORY" "$@" "${PASSTHROUGH[@]}" >"$log" 2>&1 || rc=$?
  "$PY" - "$log" <<'EOF'
import json, re, sys

def short(text, width=160):
    """The full text stays in the step's log."""
    return text if len(text) <= width else text[:width - 3].rstrip() + "..."

lines = open(sys.argv[1], encoding="utf-8", errors="replace").read().splitlines()
i = notes = 0
while i < len(lines):
    m = re.match(r"^(ok|changed): \[[^\]]+\] => \{$", lines[i])
    if m:
        j = i + 1
        while j < len(lines) and lines[j] != "}":
            j += 1
        try:
            msg = json.loads("\n".join(["{"] + lines[i + 1:j] + ["}"])).get("msg")
        except ValueError:
            msg = None
        table = isinstance(msg, list) and msg and str(msg[0]).lower().startswith("host ")
        if table or (isinstance(msg, str) and len(msg) <= 160):
            for line in ([msg] if isinstance(msg, str) else msg):
                print("   " + short(str(line)))
        elif msg:
            notes += len(msg) if isinstance(msg, list) else 1
        i = j + 1
        continue
    if lines[i].startswith(("fatal:", "failed:")):
        print("   " + lines[i][:400])
    i += 1
if notes:
    print("   (%d more message%s: planning warnings and notes, in %s)" % (notes, "s" * (notes != 1), sys.argv[1]))
EOF
  if [ "$rc" != 0 ]; then
    say "   ... $1 exited $rc; the end of its log ($log):"
    tail -n 25 "$log" | sed 's/^/   | /'
    return "$rc"
  fi
}
PASSTHROUGH=("$@")

# Live binding of the stand-in worker, as it reports it (saved under artefacts/workers/).
show_worker() {
  local when="$1" out
  case " ${hosts[*]} " in *" $LIVE_HOST "*) ;; *) return 0 ;; esac
  mkdir -p "$ARTEFACTS/workers"
  out="$ARTEFACTS/workers/$LIVE_HOST.worker.$when.json"
  if docker exec "$PREFIX$LIVE_HOST" python3 -c "
import sys, time, urllib.request
for _ in range(30):
    try:
        sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:$WORKER_PORT/', timeout=2).read().decode()); break
    except OSError:
        time.sleep(1)
else:
    sys.exit(1)" >"$out"; then
    docker exec "$PREFIX$LIVE_HOST" cat /etc/gpunuma/plan.json >"$FLEET_DIR/$LIVE_HOST.applied-plan.json"
    "$PY" - "$out" "$FLEET_DIR/$LIVE_HOST.applied-plan.json" <<'EOF'
import json, sys
w = json.load(open(sys.argv[1]))
plan = {i["name"]: i for i in json.load(open(sys.argv[2]))["instances"]}["worker"]
print("   %s/worker runs (pid %s): CPUs %s, memory nodes allowed %s, memory policy %s  (applied plan: %s, CPUs %s, %s:%s)" % (
    w["hostname"], w["pid"], w["cpus"], w["mems_allowed"], w["mempolicy"], plan["profile"], plan["cpus"],
    plan["mem_policy"], ",".join(map(str, plan["mem_nodes"] or [])) or "-"))
EOF
  else
    rm -f "$out"
    say "   $LIVE_HOST/worker: no answer on port $WORKER_PORT" >&2
    return 1
  fi
}

# Offline-topology hosts: what is installed, and why it is not started.
show_not_started() {
  local h units active
  for h in "${hosts[@]}"; do
    [ "$h" = "$LIVE_HOST" ] && continue
    units="$(docker exec "$PREFIX$h" sh -c 'ls /etc/systemd/system/gpunuma-*.service 2>/dev/null | wc -l')"
    active="$(docker exec "$PREFIX$h" sh -c 'systemctl list-units --state=active --no-legend "gpunuma-*.service" | wc -l')"
    say "   $h: installed, not started: $units unit(s) written and verified ($active active); its topology is offline input, and this machine has $(nproc) CPU(s) on $(ls -d /sys/devices/system/node/node* 2>/dev/null | wc -l) NUMA node(s), not the ones it plans"
  done
}

play "plan: discover every node and plan its bindings (nothing changes)" playbooks/plan.yml
play "site: provision the fleet, profile strict" playbooks/site.yml
show_not_started
show_worker after-site
play "audit: live state against the applied plan" playbooks/audit.yml -e "gpunuma_audit_dir=$FLEET_DIR/audit-1"
play "rollback: $rollback_host from strict to preferred" playbooks/rollback.yml --limit "$rollback_host" \
  -e gpunuma_profile=preferred -e '{"gpunuma_reason": "demo: P99 latency under strict, trying preferred"}'
show_worker after-rollback
play "audit again: the rolled-back node is compliant on its new profile" playbooks/audit.yml \
  -e "gpunuma_audit_dir=$FLEET_DIR/audit-2"
validate_note="no GPU on this machine: h200-vm replays the probe recorded on a real H200 (tests/fixtures/recorded/h200-probe/run2), the others are probed and skipped"
case " ${hosts[*]} " in *" h200-vm "*) ;; *) validate_note="no GPU on this machine: every node is probed and skipped" ;; esac
play "validate: host-to-device copies ($validate_note)" playbooks/validate.yml \
  -e "gpu_validate_report_dir=$FLEET_DIR/validation"

# --- Artefacts ---------------------------------------------------------------
header "artefacts: $ARTEFACTS"
mkdir -p "$ARTEFACTS/state"
cp -r "$FLEET_DIR/topology" "$ARTEFACTS/topology"
cp -r "$FLEET_DIR/audit-2" "$ARTEFACTS/audit"
cp -r "$FLEET_DIR/validation" "$ARTEFACTS/validation"
for h in "${hosts[@]}"; do
  docker cp "$PREFIX$h:/etc/gpunuma/state.json" "$ARTEFACTS/state/$h.json" >/dev/null
done
for d in topology audit validation state workers; do
  [ -d "$ARTEFACTS/$d" ] && say "   $d/: $(find "$ARTEFACTS/$d" -name '*.json' | wc -l) JSON file(s)"
done
play "report: the HTML fleet report from the artefacts" playbooks/report.yml \
  -e "{\"gpunuma_report_src\": [\"$ARTEFACTS\"], \"gpunuma_report_dest\": \"$ARTEFACTS/fleet-report.html\"}"
say ""
say "open the report: xdg-open $ARTEFACTS/fleet-report.html"
