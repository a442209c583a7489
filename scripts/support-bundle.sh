#!/usr/bin/env bash
# Copy the sysfs/procfs files gpunuma discovery reads into DIR, so the node's
# topology can be rebuilt anywhere with gpu_topology_info sysfs_root=DIR
# (add an NVML dump from record_nvml_dump= for GPU identity and links).
# Read-only on the node. Usage: scripts/support-bundle.sh DIR [ROOT]
#
# Reads are bounded as discovery bounds them: only regular files that are not
# symbolic links (never a FIFO, a device node or a link into /dev), at most
# 65536 bytes each (one sysfs attribute is at most a page), each read under a
# 5 s timeout. A file skipped for any of these reasons is named on stderr and
# in DIR/SKIPPED, so the bundle says what it lacks.
set -euo pipefail
out=${1:?usage: support-bundle.sh DIR [ROOT]}
root=${2:-}
max_bytes=65536
skip() {  # note a file left out, and why
  printf '%s: %s\n' "$1" "$2" >> "$out/SKIPPED"
  echo "gpunuma: support bundle: skipped $1: $2" >&2
}
copy() {  # copy one regular, readable, small file, keeping its path under $out
  local src=$root$1
  [ -e "$src" ] || [ -L "$src" ] || return 0
  if [ -L "$src" ]; then skip "$src" "a symbolic link, not a sysfs attribute"; return 0; fi
  if [ ! -f "$src" ]; then skip "$src" "not a regular file"; return 0; fi
  [ -r "$src" ] || return 0
  mkdir -p "$out$(dirname "$1")"
  if ! timeout 5 head -c $((max_bytes + 1)) -- "$src" > "$out$1" 2>/dev/null; then
    rm -f "$out$1"; skip "$src" "unreadable or slower than 5 s"; return 0
  fi
  if [ "$(wc -c < "$out$1")" -gt "$max_bytes" ]; then
    rm -f "$out$1"; skip "$src" "larger than $max_bytes bytes"
  fi
}
mkdir -p "$out"
: > "$out/SKIPPED"
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
  if [ ! -e "$d" ]; then [ -L "$d" ] && skip "$d" "a dangling or looping link"; continue; fi
  p=${d#"$root"}
  for f in vendor device class numa_node local_cpulist local_cpus max_link_speed max_link_width \
           current_link_speed current_link_width subsystem_vendor subsystem_device; do
    copy "$p/$f"
  done
  mkdir -p "$out$p"
  # Symlinks do not survive copies: keep where the device really sits.
  readlink -f -- "$d" > "$out$p/_realpath" || rm -f "$out$p/_realpath"
  for sub in net infiniband nvme; do
    for n in "$d/$sub"/*; do [ -e "$n" ] && mkdir -p "$out$p/$sub/$(basename "$n")"; done
  done
  for v in "$d"/virtio*/net/*; do
    [ -e "$v" ] && mkdir -p "$out$p/${v#"$d"/}"
  done
done
copy /proc/meminfo
copy /proc/sys/kernel/numa_balancing
copy /proc/sys/kernel/osrelease
echo "gpunuma: support bundle written to $out" >&2
