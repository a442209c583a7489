#!/usr/bin/env bash
# Start and stop the gpunuma test VM: a QEMU guest with two real NUMA nodes
# and its only NIC behind a PCI expander bridge on node 1. KVM when it works,
# TCG (emulated) otherwise; see GPUNUMA_VM_ACCEL below.
#
#   numa-vm.sh start --state-dir DIR --image-dir DIR --pubkey FILE [--port N]
#       Creates DIR/overlay.qcow2 (copy-on-write over the cached image, which
#       stays untouched), boots QEMU in the background and prints the
#       loopback SSH port on stdout. Does not wait for the guest to boot.
#   numa-vm.sh stop --state-dir DIR
#       Stops that QEMU and removes DIR. Succeeds when nothing is running.
#   numa-vm.sh status --state-dir DIR
#       Exit 0 and print the pid when the VM runs, exit 1 otherwise.
#
# Guest layout (what the verifier asserts):
#   node 0: CPUs 0-1 (socket 0), 1 GiB    node 1: CPUs 2-3 (socket 1), 1 GiB
#   `pxb` PCI expander bridge (root bus 0x20, numa_node=1; QEMU puts its
#   own PCI-PCI bridge at 20:00.0, so the NIC is 0000:21:01.0)
#     └─ vmxnet3 NIC on QEMU user-mode networking, SSH forwarded from
#        127.0.0.1:PORT; its sysfs numa_node is 1. vmxnet3 rather than
#        e1000 (which Debian's cloud kernel lacks) or virtio-net (whose
#        netdev `device` link is the virtio device, not the PCI function
#        that carries numa_node, unlike a physical NIC).
#     └─ pci-testdev at 0000:21:02.0 (1b36:0005, class 0x00ff): the GPU's
#        stand-in. QEMU cannot emulate an NVIDIA GPU; the numa_vm scenario
#        maps a recorded NVML dump's GPU onto this bus id, so the GPU's
#        identity comes from the dump and its placement (numa_node 1,
#        local_cpulist 2-3, PCI path) from the guest's real sysfs. No kernel
#        driver claims the device.
#
# The kernel boots with numa_balancing=enable, so kernel.numa_balancing is 1
# until something (gpunuma's sysctl.d file) sets it otherwise.
#
# One VM per host at a time: four TCG vCPUs already saturate a small host, and
# two of them make boots time out. GPUNUMA_VM_ALLOW_CONCURRENT=1 lifts this.
#
# Accelerator (GPUNUMA_VM_ACCEL): auto (default) uses KVM when /dev/kvm opens
# read-write and a probe VM (the guest's own kernel, no disk, one vCPU) boots
# under KVM to its kernel banner within 10 s; otherwise TCG, with one line on
# stderr saying why. kvm insists on KVM (an error when the probe fails), tcg
# skips the probe. The choice is written to DIR/accel.
#
# Environment: GPUNUMA_VM_NODE_MEM_MB (default 1024 per node), GPUNUMA_QEMU
# (default qemu-system-x86_64), GPUNUMA_VM_ALLOW_CONCURRENT, GPUNUMA_VM_ACCEL.
set -euo pipefail

qemu="${GPUNUMA_QEMU:-qemu-system-x86_64}"
node_mem_mb="${GPUNUMA_VM_NODE_MEM_MB:-1024}"
accel_wanted="${GPUNUMA_VM_ACCEL:-auto}"

usage() {
  sed -n '2,12p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit 2
}
die() { echo "numa-vm: error: $*" >&2; exit 1; }

action="${1:-}"
[ -n "$action" ] || usage
shift
state_dir="" image_dir="" pubkey="" port=""
while [ $# -gt 0 ]; do
  case "$1" in
    --state-dir) state_dir="${2:?--state-dir needs a value}"; shift 2 ;;
    --image-dir) image_dir="${2:?--image-dir needs a value}"; shift 2 ;;
    --pubkey) pubkey="${2:?--pubkey needs a value}"; shift 2 ;;
    --port) port="${2:?--port needs a value}"; shift 2 ;;
    *) die "unknown argument '$1'; allowed: --state-dir, --image-dir, --pubkey, --port" ;;
  esac
done
[ -n "$state_dir" ] || die "--state-dir is required"

running_pid() {
  local pid
  [ -f "$state_dir/qemu.pid" ] || return 1
  pid="$(cat "$state_dir/qemu.pid")"
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
  # A recycled pid must not make us kill an unrelated process.
  grep -q qemu-system "/proc/$pid/cmdline" 2>/dev/null || return 1
  echo "$pid"
}

# Boot the guest kernel under KVM with no root disk: it prints its banner,
# fails to mount a root and panics; panic=-1 with -no-reboot makes QEMU exit.
# Sets kvm_why when KVM is not usable.
kvm_works() {
  local log
  kvm_why=""
  [ -c /dev/kvm ] || { kvm_why="/dev/kvm does not exist"; return 1; }
  (exec 3<>/dev/kvm) 2>/dev/null || { kvm_why="/dev/kvm cannot be opened read-write"; return 1; }
  log="$(mktemp)"
  "$qemu" -accel kvm -machine pc -nodefaults -display none -vga none -smp 1 -m 256M \
    -kernel "$image_dir/vmlinuz" -append "console=ttyS0 panic=-1" -no-reboot \
    -serial file:"$log" >"$log.err" 2>&1 &
  probe=$!
  # Under KVM the banner is there within a second; TCG-speed or a hung vCPU is not KVM.
  for _ in $(seq 1 50); do
    grep -q "Linux version" "$log" 2>/dev/null && break
    kill -0 "$probe" 2>/dev/null || break
    sleep 0.2
  done
  kill -KILL "$probe" 2>/dev/null || true
  wait "$probe" 2>/dev/null || true
  if grep -q "Linux version" "$log"; then
    rm -f "$log" "$log.err"
    return 0
  fi
  local err
  err="$(grep -v 'warning' "$log.err" | head -n 1 | cut -c1-120)"
  kvm_why="a probe VM printed no kernel banner under KVM within 10 s${err:+ ($err)}"
  rm -f "$log" "$log.err"
  return 1
}

choose_accel() {
  case "$accel_wanted" in
    tcg) echo tcg ;;
    kvm) kvm_works || die "GPUNUMA_VM_ACCEL=kvm but $kvm_why"; echo kvm ;;
    auto)
      if kvm_works; then
        echo kvm
      else
        echo "numa-vm: $kvm_why; using TCG (emulated, several times slower)" >&2
        echo tcg
      fi ;;
    *) die "GPUNUMA_VM_ACCEL must be auto, kvm or tcg, got '$accel_wanted'" ;;
  esac
}

port_in_use() {
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

pick_port() {
  local p _
  for _ in $(seq 1 50); do
    p=$(( 20000 + RANDOM % 20000 ))
    port_in_use "$p" || { echo "$p"; return 0; }
  done
  die "no free loopback port found in 20000-39999"
}

start() {
  [ -n "$image_dir" ] || die "--image-dir is required for start"
  [ -n "$pubkey" ] || die "--pubkey is required for start"
  local f
  for f in rootfs.raw vmlinuz initrd.img; do
    [ -f "$image_dir/$f" ] || die "image dir '$image_dir' has no $f; run scripts/build-vm-image.sh"
  done
  [ -s "$pubkey" ] || die "public key file '$pubkey' is missing or empty"
  command -v "$qemu" >/dev/null || die "'$qemu' not found; install qemu-system-x86"
  command -v qemu-img >/dev/null || die "qemu-img not found; install qemu-utils"
  if pid="$(running_pid)"; then
    die "a VM already runs from '$state_dir' (pid $pid); stop it first"
  fi
  case "$node_mem_mb" in ''|*[!0-9]*) die "GPUNUMA_VM_NODE_MEM_MB must be a whole number of MiB, got '$node_mem_mb'" ;; esac

  if [ "${GPUNUMA_VM_ALLOW_CONCURRENT:-0}" != 1 ]; then
    local other
    other="$(pgrep -f -- '-name gpunuma-numa-vm ' | head -n 1 || true)"
    [ -z "$other" ] || die "another gpunuma VM runs (pid $other); stop it first or set GPUNUMA_VM_ALLOW_CONCURRENT=1"
  fi

  [ -n "$port" ] || port="$(pick_port)"
  case "$port" in ''|*[!0-9]*) die "--port must be a TCP port number, got '$port'" ;; esac
  port_in_use "$port" && die "127.0.0.1:$port is already in use"

  mkdir -p "$state_dir"
  rm -f "$state_dir/overlay.qcow2" "$state_dir/console.log" "$state_dir/qemu.pid"
  qemu-img create -q -f qcow2 -F raw -b "$(readlink -f "$image_dir/rootfs.raw")" \
    "$state_dir/overlay.qcow2"
  cp "$pubkey" "$state_dir/authorized_keys"

  local accel accel_opt
  accel="$(choose_accel)"
  case "$accel" in
    kvm) accel_opt=kvm ;;
    *) accel_opt=tcg,thread=multi ;;
  esac
  echo "$accel" >"$state_dir/accel"

  # -nodefaults keeps
  # QEMU from adding its own NIC on bus 0 (node 0), which would muddy the
  # "NIC on node 1" fact. The disk is placed on bus 0 explicitly: left to
  # itself QEMU may pick the pxb bus, which refuses it.
  "$qemu" \
    -name gpunuma-numa-vm \
    -machine pc -accel "$accel_opt" \
    -nodefaults -display none -vga none \
    -smp 4,sockets=2,cores=2,threads=1 \
    -m "$(( node_mem_mb * 2 ))M" \
    -object memory-backend-ram,id=mem0,size="${node_mem_mb}M" \
    -object memory-backend-ram,id=mem1,size="${node_mem_mb}M" \
    -numa node,nodeid=0,cpus=0-1,memdev=mem0 \
    -numa node,nodeid=1,cpus=2-3,memdev=mem1 \
    -kernel "$image_dir/vmlinuz" -initrd "$image_dir/initrd.img" \
    -append "root=/dev/vda rw console=ttyS0 net.ifnames=1 numa_balancing=enable" \
    -drive file="$state_dir/overlay.qcow2",if=none,id=disk0,format=qcow2,cache=unsafe \
    -device virtio-blk-pci,drive=disk0,bus=pci.0 \
    -device pxb,id=pxb1,bus=pci.0,bus_nr=32,numa_node=1 \
    -netdev user,id=net0,hostfwd=tcp:127.0.0.1:"$port"-:22 \
    -device vmxnet3,netdev=net0,bus=pxb1,addr=0x1 \
    -device pci-testdev,bus=pxb1,addr=0x2 \
    -fw_cfg name=opt/gpunuma/authorized_keys,file="$state_dir/authorized_keys" \
    -serial file:"$state_dir/console.log" \
    -pidfile "$state_dir/qemu.pid" \
    -daemonize
  echo "$port" >"$state_dir/ssh_port"
  echo "$port"
}

stop() {
  local pid _
  if pid="$(running_pid)"; then
    kill -TERM "$pid"
    for _ in $(seq 1 50); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.2
    done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
  fi
  rm -rf "$state_dir"
}

case "$action" in
  start) start ;;
  stop) stop ;;
  status) running_pid || exit 1 ;;
  *) die "unknown action '$action'; allowed: start, stop, status" ;;
esac
