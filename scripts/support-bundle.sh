#!/usr/bin/env bash
# Copy the sysfs/procfs files gpunuma discovery reads into DIR, so the node's
# topology can be rebuilt anywhere with gpu_topology_info sysfs_root=DIR
# (add an NVML dump from record_nvml_dump= for GPU identity and links).
# Read-only on the node. Usage: scripts/support-bundle.sh DIR [ROOT]
set -euo pipefail
out=${1:?usage: support-bundle.sh DIR [ROOT]}
root=${2:-}
copy() {  # copy one readable file, keeping its path under $out
  local src=$root$1
  [ -r "$src" ] && [ -f "$src" ] || return 0
  mkdir -p "$out$(dirname "$1")"
  cat "$src" > "$out$1" 2>/dev/null || rm -f "$out$1"
}
for f in online possible; do copy /sys/devices/system/node/$f; done
for d in "$root"/sys/devices/system/node/node[0-9]*; do
  [ -d "$d" ] || continue
  n=${d#"$root"}
  for f in cpulist cpumap meminfo distance; do copy "$n/$f"; done
done
copy /sys/devices/system/cpu/online
for d in "$root"/sys/devices/system/cpu/cpu[0-9]*; do
  c=${d#"$root"}
  copy "$c/online"
  for f in physical_package_id core_id thread_siblings_list package_cpus_list core_siblings_list; do
    copy "$c/topology/$f"
  done
done
for d in "$root"/sys/bus/pci/devices/*; do
  [ -e "$d" ] || continue
  p=${d#"$root"}
  for f in vendor device class numa_node local_cpulist local_cpus max_link_speed max_link_width \
           current_link_speed current_link_width subsystem_vendor subsystem_device; do
    copy "$p/$f"
  done
  mkdir -p "$out$p"
  # Symlinks do not survive copies: keep where the device really sits.
  readlink -f "$d" > "$out$p/_realpath"
  for sub in net infiniband nvme; do
    for n in "$d/$sub"/*; do [ -e "$n" ] && mkdir -p "$out$p/$sub/$(basename "$n")"; done
  done
  for v in "$d"/virtio*/net/*; do
    [ -e "$v" ] && mkdir -p "$out$p/${v#"$d"/}"
  done
done
copy /proc/meminfo
copy /proc/sys/kernel/numa_balancing
echo "gpunuma: support bundle written to $out" >&2
