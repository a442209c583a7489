#!/usr/bin/env bash
# Build the Debian bookworm disk image that the numa_vm molecule scenario boots
# under QEMU: an ext4 filesystem written straight onto a raw file (no
# partition table, no bootloader; QEMU boots the kernel and initrd extracted
# next to it with `root=/dev/vda`).
#
# The result is cached under $GPUNUMA_VM_CACHE (default /var/cache/gpunuma/vm)
# in a directory named after a hash of this script, so an unchanged script
# costs nothing on the next run and a changed one can never reuse a stale
# image. Downloaded .deb files are kept in a shared cache so a rebuild after an
# edit does not download them again.
#
# Prints the image directory on stdout (the only stdout line); it holds:
#   rootfs.raw   ext4 root filesystem (sparse), booted as /dev/vda
#   vmlinuz      kernel, initrd.img initramfs
#   image.env    KERNEL_VERSION, BUILT_AT, SCRIPT_SHA256
#
# Guest facts the scenario relies on:
#   - root may log in over SSH with a key only; the key is read at boot from
#     the QEMU fw_cfg entry opt/gpunuma/authorized_keys (see
#     scripts/vm/numa-vm.sh), so one cached image serves throwaway keys.
#   - SSH host keys are generated on first boot, never shipped in the image.
#   - systemd-networkd runs DHCP on every en*/eth* interface.
#
# Needs root, debootstrap and e2fsprogs (mkfs.ext4 -d). Environment knobs:
#   GPUNUMA_VM_CACHE        cache root (default /var/cache/gpunuma/vm)
#   GPUNUMA_DEBIAN_MIRROR   Debian mirror (default http://deb.debian.org/debian)
#   GPUNUMA_VM_IMAGE_SIZE   filesystem size (default 4G; the file is sparse)
set -euo pipefail

script_path="$(readlink -f "${BASH_SOURCE[0]}")"
cache_root="${GPUNUMA_VM_CACHE:-/var/cache/gpunuma/vm}"
mirror="${GPUNUMA_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
image_size="${GPUNUMA_VM_IMAGE_SIZE:-4G}"
suite=bookworm

log() { echo "build-vm-image: $*" >&2; }
die() { log "error: $*"; exit 1; }

script_sha="$(sha256sum "$script_path" | cut -c1-64)"
key="${suite}-${script_sha:0:16}"
image_dir="$cache_root/$key"

if [ -f "$image_dir/.complete" ]; then
  echo "$image_dir"
  exit 0
fi

[ "$(id -u)" = 0 ] || die "must run as root (debootstrap, chroot, mounts)"
for tool in debootstrap mkfs.ext4 chroot flock sha256sum; do
  command -v "$tool" >/dev/null 2>&1 || die "'$tool' not found; install debootstrap and e2fsprogs"
done

mkdir -p "$cache_root" "$cache_root/../debs"
deb_cache="$(readlink -f "$cache_root/../debs")"

# One build at a time: a second caller waits, then finds the finished image.
exec 9>"$cache_root/.build.lock"
flock 9
if [ -f "$image_dir/.complete" ]; then
  echo "$image_dir"
  exit 0
fi

started=$(date +%s)
work="$(mktemp -d "$cache_root/.build.XXXXXX")"
root="$work/rootfs"

cleanup() {
  local m
  # Unmount anything left under the rootfs, deepest first.
  for m in $(awk -v r="$root" '$2 ~ "^"r {print $2}' /proc/mounts | sort -r); do
    umount -l "$m" 2>/dev/null || true
  done
  rm -rf "$work"
}
trap cleanup EXIT

packages=(
  linux-image-cloud-amd64 initramfs-tools zstd
  systemd systemd-sysv udev dbus
  openssh-server python3 python3-apt sudo
  numactl procps iproute2 pciutils kmod irqbalance
)
log "debootstrap $suite from $mirror (debs cached in $deb_cache)"
debootstrap --variant=minbase --include="$(IFS=,; echo "${packages[*]}")" \
  --cache-dir="$deb_cache" "$suite" "$root" "$mirror" >"$work/debootstrap.log" 2>&1 || {
  tail -n 40 "$work/debootstrap.log" >&2
  die "debootstrap failed"
}

log "configuring the guest"
echo numa-vm >"$root/etc/hostname"
cat >"$root/etc/hosts" <<'EOF'
127.0.0.1	localhost
127.0.1.1	numa-vm
::1		localhost ip6-localhost ip6-loopback
EOF
cat >"$root/etc/fstab" <<'EOF'
/dev/vda	/	ext4	rw,errors=remount-ro	0	1
EOF
cat >"$root/etc/apt/sources.list" <<EOF
deb $mirror $suite main
deb $mirror $suite-updates main
deb http://deb.debian.org/debian-security $suite-security main
EOF
# QEMU user-mode networking answers DNS on 10.0.2.3; a static file keeps
# systemd-resolved out of the image.
echo "nameserver 10.0.2.3" >"$root/etc/resolv.conf"

cat >"$root/etc/systemd/network/20-dhcp.network" <<'EOF'
[Match]
Name=en* eth*

[Network]
DHCP=yes
EOF

cat >"$root/etc/ssh/sshd_config.d/gpunuma.conf" <<'EOF'
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UseDNS no
EOF
rm -f "$root"/etc/ssh/ssh_host_*

install -d -m 0755 "$root/usr/local/sbin"
cat >"$root/usr/local/sbin/gpunuma-vm-firstboot" <<'EOF'
#!/bin/sh
# Per-boot guest set-up for the gpunuma test VM: SSH host keys (once) and
# root's authorized_keys from the QEMU fw_cfg entry opt/gpunuma/authorized_keys.
set -eu
ssh-keygen -A
modprobe qemu_fw_cfg 2>/dev/null || true
src=/sys/firmware/qemu_fw_cfg/by_name/opt/gpunuma/authorized_keys/raw
if [ -r "$src" ]; then
  install -d -m 0700 /root/.ssh
  tmp=$(mktemp /root/.ssh/authorized_keys.XXXXXX)
  cat "$src" >"$tmp"
  chmod 0600 "$tmp"
  mv "$tmp" /root/.ssh/authorized_keys
else
  echo "gpunuma-vm-firstboot: no fw_cfg entry opt/gpunuma/authorized_keys; keeping existing keys" >&2
fi
EOF
chmod 0755 "$root/usr/local/sbin/gpunuma-vm-firstboot"
cat >"$root/etc/systemd/system/gpunuma-vm-firstboot.service" <<'EOF'
[Unit]
Description=gpunuma test VM: SSH host keys and root authorized_keys from fw_cfg
Before=ssh.service
After=local-fs.target

[Service]
Type=oneshot
ExecStart=/usr/local/sbin/gpunuma-vm-firstboot
RemainAfterExit=yes

[Install]
WantedBy=multi-user.target ssh.service
EOF

# Small initramfs: only what mounting an ext4 root on virtio-blk needs.
cat >"$root/etc/initramfs-tools/conf.d/gpunuma.conf" <<'EOF'
MODULES=list
RESUME=none
EOF
cat >>"$root/etc/initramfs-tools/modules" <<'EOF'
virtio_pci
virtio_blk
EOF

chroot "$root" /bin/sh -eu <<'EOF'
systemctl enable systemd-networkd.service ssh.service gpunuma-vm-firstboot.service >/dev/null 2>&1
usermod -p '*' root
update-initramfs -u -k all >/dev/null 2>&1
apt-get clean
rm -rf /var/lib/apt/lists/* /var/log/*.log
EOF
: >"$root/etc/machine-id"

kernel_version="$(basename "$(ls -1 "$root"/boot/vmlinuz-* | sort -V | tail -n 1)" | sed 's/^vmlinuz-//')"
[ -n "$kernel_version" ] && [ -f "$root/boot/initrd.img-$kernel_version" ] \
  || die "no kernel/initrd found under $root/boot"

# Unmount what debootstrap or the chroot left mounted before copying the tree.
for m in $(awk -v r="$root" '$2 ~ "^"r {print $2}' /proc/mounts | sort -r); do
  umount "$m"
done

log "writing ext4 image ($image_size, sparse)"
out="$work/out"
mkdir -p "$out"
cp "$root/boot/vmlinuz-$kernel_version" "$out/vmlinuz"
cp "$root/boot/initrd.img-$kernel_version" "$out/initrd.img"
truncate -s "$image_size" "$out/rootfs.raw"
mkfs.ext4 -q -F -L gpunuma-root -d "$root" "$out/rootfs.raw"
cat >"$out/image.env" <<EOF
KERNEL_VERSION=$kernel_version
BUILT_AT=$(date -u +%Y-%m-%dT%H:%M:%SZ)
SCRIPT_SHA256=$script_sha
EOF
touch "$out/.complete"

rm -rf "$image_dir"
mv "$out" "$image_dir"
# Older images of this suite are dead weight once a new one exists.
for old in "$cache_root/$suite"-*; do
  [ "$old" = "$image_dir" ] || rm -rf "$old"
done
log "image ready in $image_dir ($(( $(date +%s) - started ))s)"
echo "$image_dir"
