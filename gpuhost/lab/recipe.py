"""The image recipe: everything that decides what the base disk image contains.

The recipe is data; its hash names the cached image, so an image is rebuilt exactly when the
recipe changes. `STEPS_VERSION` stands for the build steps themselves (gpuhost/lab/image.py):
bump it whenever they change in a way that changes the image.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from gpuhost.lab.boot import DiskLayout

STEPS_VERSION = 2

SUITE = "bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"

# The kernel command line of every lab host. The serial console carries boot messages and a
# getty to the per-VM serial log. No console on tty0: drawing text into the emulated display
# costs CPU under TCG that the boot needs.
# no_timer_check: under TCG on a loaded machine the IO-APIC timer check can miss its ticks and
# the kernel panics ("timer doesn't work through Interrupt-remapped IO-APIC"); measured here.
# mitigations=off: QEMU's TCG CPU says GenuineIntel with no arch-capabilities, so the kernel turns
# on PTI and retpolines, and under emulation every syscall's page-table switch flushes the emulated
# TLB. Measured on a lab host (2-core machine): fork+exec 73 -> 31 ms, mkinitramfs 136 -> 80 s, a
# reboot 124 -> 82 s. A lab host runs only the test's own code: nothing to protect it from.
GUEST_SPEED_OPTIONS = "mitigations=off"
KERNEL_CMDLINE = f"console=ttyS0,115200n8 no_timer_check {GUEST_SPEED_OPTIONS}"

BASE_PACKAGES: tuple[str, ...] = (
    "systemd-sysv",
    "udev",
    "kmod",
    "linux-image-amd64",
    "grub-pc",
    "initramfs-tools",
    "zstd",
    "openssh-server",
    "python3",
    "pciutils",
    "iproute2",
    "procps",
)

# What a nested guest needs inside a lab host: installing these at test time took ~12 minutes
# under TCG, almost all of it update-initramfs, so they are baked into a separate variant.
# They are installed by apt-get in the chroot after debootstrap: debootstrap's own resolver fails
# to configure libvirt's dependencies (systemd-container) when they are in --include.
NESTED_PACKAGES: tuple[str, ...] = (
    "qemu-system-x86",
    "qemu-utils",
    "libvirt-daemon-system",
    "libvirt-clients",
    "busybox-static",
)

# What a `gpuhost guest` test guest needs beyond the base: cloud-init reads the NoCloud seed
# (user, keys, host keys), python3-venv holds gpuhost in the guest, sudo runs provisioning as the
# cloud-init user. Baked in so that the lifecycle test installs nothing from a mirror under TCG.
GUEST_PACKAGES: tuple[str, ...] = (
    "cloud-init",
    "python3-venv",
    "sudo",
    "ca-certificates",
    # `guest up` asks libvirt for the guest's address from the DHCP lease, else from the agent
    # (bridged networks): the lab guest has it, so the agent's answer is tested too.
    "qemu-guest-agent",
)

# cloud-init on a guest image: only the NoCloud seed (no metadata-service probes, each of which
# times out under TCG), no network rendering (systemd-networkd's DHCP file covers it), and only
# the modules a gpuhost seed uses: each costs seconds of Python under TCG, and some fail on a
# minbase system (locale: no locales package).
CLOUD_INIT_CONF = """\
# gpuhost guest image: the seed is a NoCloud CD-ROM; the network is DHCP by systemd-networkd.
datasource_list: [NoCloud, None]
network:
  config: disabled
cloud_init_modules:
  - seed_random
  - bootcmd
  - write_files
  - set_hostname
  - update_hostname
  - update_etc_hosts
  - users_groups
  - ssh
cloud_config_modules:
  - runcmd
cloud_final_modules:
  - package_update_upgrade_install
  - scripts_user
  - final_message
"""

VARIANTS = ("base", "nested", "guest")

# UEFI disks boot without grub-pc. They are installed by apt-get after debootstrap, like the
# nested packages: the signed packages pin exact versions of their unsigned twins.
# shim + GRUB: Debian's shim (signed by Microsoft's UEFI CA) and GRUB and kernel (signed by
# Debian), so the same disk boots with Secure Boot enforcing; mokutil says so inside the host.
EFI_GRUB_PACKAGES: tuple[str, ...] = (
    "grub-efi-amd64",
    "grub-efi-amd64-signed",
    "shim-signed",
    "mokutil",
    "efibootmgr",
    "dosfstools",
    "mtools",  # the image build writes the ESP with it (no vfat mount needed)
)
# Where shim and GRUB go on the ESP (\\EFI\\BOOT, the removable path), as grub-install
# --uefi-secure-boot --removable lays them out: (file in the image, name on the ESP).
EFI_REMOVABLE_FILES: tuple[tuple[str, str], ...] = (
    ("/usr/lib/shim/shimx64.efi.signed", "BOOTX64.EFI"),
    ("/usr/lib/shim/mmx64.efi.signed", "mmx64.efi"),
    ("/usr/lib/grub/x86_64-efi-signed/grubx64.efi.signed", "grubx64.efi"),
)
# systemd-boot: bootctl and kernel-install (the systemd-boot package's hooks put every new kernel
# and initramfs on the ESP with a loader entry built from /etc/kernel/cmdline).
EFI_SYSTEMD_BOOT_PACKAGES: tuple[str, ...] = ("systemd-boot", "efibootmgr", "dosfstools", "mtools")

ESP_SIZE_MIB = 256  # kernels and initramfs images live on it under systemd-boot
ESP_MOUNT = "/boot/efi"

FSTAB_EFI = "UUID={root_uuid} / ext4 errors=remount-ro 0 1\nUUID={esp_uuid} /boot/efi vfat umask=0077 0 1\n"

# systemd-boot: kernel-install builds each loader entry's options from this file.
KERNEL_CMDLINE_FILE = "root=UUID={root_uuid} ro " + KERNEL_CMDLINE + "\n"
# kernel-install names entries and their ESP directory after this token; without it the
# machine-id, which the image leaves empty so that every host makes its own.
KERNEL_ENTRY_NAME = "debian\n"
LOADER_CONF = "# gpuhost lab: boot the newest entry at once\ntimeout 0\neditor no\n"

# Units that only cost CPU on a lab host (measured under TCG: e2scrub_reap ~17 s, getty-static
# ~11 s of a loaded boot) or would start background work in the middle of a test.
MASKED_UNITS: tuple[str, ...] = (
    "systemd-networkd-wait-online.service",
    "e2scrub_reap.service",
    "e2scrub_all.timer",
    "getty-static.service",
    "apt-daily.timer",
    "apt-daily-upgrade.timer",
    "fstrim.timer",
    "dpkg-db-backup.timer",
)

# Debian's initramfs defaults (MODULES=most) take ~10 min per update-initramfs under TCG.
# MODULES=list takes the modules of /etc/initramfs-tools/modules (the lab disk's, below, and
# the vfio ones gpuhost apply adds there) and what the hooks force; zstd -1 compresses fast.
# Measured in one lab host under CI load, back to back: MODULES=dep 166.9 s (1725 processes,
# 36 modules: it also walks sysfs and takes the stand-in GPU's DRM driver), list 114.7 s (1164
# processes, 15 modules). Every apply and rollback of the lab runs one.
INITRAMFS_CONF = "# gpuhost lab: fast under emulation\nMODULES=list\nCOMPRESS=zstd\nCOMPRESSLEVEL=1\n"

# What the lab's disk needs in the initramfs to mount its root.
ROOT_DISK_MODULES = ("virtio_pci", "virtio_blk", "ext4", "crc32c_generic")
INITRAMFS_MODULES = (
    "# gpuhost lab: the modules that mount the root file system (MODULES=list)\n" + "\n".join(ROOT_DISK_MODULES) + "\n"
)

DEFAULT_GRUB = f"""\
# gpuhost lab: boot at once, console on the serial port (logged per VM) and the BMC display.
GRUB_DEFAULT=0
GRUB_TIMEOUT=0
GRUB_TIMEOUT_STYLE=hidden
GRUB_DISTRIBUTOR="Debian"
GRUB_CMDLINE_LINUX_DEFAULT=""
GRUB_CMDLINE_LINUX="{KERNEL_CMDLINE}"
GRUB_TERMINAL="serial console"
GRUB_SERIAL_COMMAND="serial --unit=0 --speed=115200"
GRUB_DISABLE_OS_PROBER=true
"""

# The UEFI GRUB disk's video mode for the kernel, chosen so that GRUB hands the kernel the BMC's
# display. Without Secure Boot, Debian's GRUB 2.06 boots Linux through its own loader, not the
# kernel's EFI stub, and gives the kernel the framebuffer of the first of its video drivers that
# sets the mode; its built-in `video_bochs` (a native driver, tried before the firmware's GOP)
# drives any 1234:1111 VGA, so it took the stand-in GPU and efifb took its BAR 0 (seen, lab-uefi
# capture). No real GPU has a native GRUB driver. `video_bochs` refuses more than 1200 lines and
# `video_cirrus` takes up to 2048, so a 1280-line mode lands on the BMC's cirrus display (2.5 MiB
# of its 4 MiB at 16 bits). Under Secure Boot GRUB hands over to the EFI stub, which takes the
# firmware's console (the BMC's), and ignores this.
EFI_GRUB_GFXPAYLOAD = "1024x1280x16"
DEFAULT_GRUB_EFI = DEFAULT_GRUB + f"GRUB_GFXPAYLOAD_LINUX={EFI_GRUB_GFXPAYLOAD}\n"

SSHD_CONF = """\
# gpuhost lab: root by key only, one host key whose public half the lab knows.
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
HostKey /etc/ssh/ssh_host_ed25519_key
UseDNS no
"""

NETWORK_CONF = """\
# gpuhost lab: QEMU user networking hands out an address by DHCP.
[Match]
Name=en* eth*

[Network]
DHCP=ipv4
"""

# The host name comes from the SMBIOS serial QEMU is given (-smbios type=1,serial=lab-N), so
# every overlay of the one image names itself after its inventory entry.
HOSTNAME_SCRIPT = """\
#!/bin/sh
# gpuhost lab: take the host name from the SMBIOS serial number set by `gpuhost lab up`.
serial=$(cat /sys/class/dmi/id/product_serial 2>/dev/null)
case "$serial" in
  lab-[0-9]|lab-[0-9][0-9]|lab-[0-9][0-9][0-9])
    echo "$serial" > /etc/hostname
    hostname "$serial"
    printf '127.0.1.1\\t%s\\n127.0.0.1\\tlocalhost\\n' "$serial" > /etc/hosts
    ;;
esac
"""

HOSTNAME_UNIT = """\
[Unit]
Description=gpuhost lab: host name from the SMBIOS serial number
DefaultDependencies=no
After=local-fs.target
Before=network-pre.target sysinit.target

[Service]
Type=oneshot
ExecStart=/usr/local/sbin/gpuhost-lab-hostname

[Install]
WantedBy=sysinit.target
"""

FSTAB = "UUID={root_uuid} / ext4 errors=remount-ro 0 1\n"

# The tiny nested guest: a busybox initramfs whose init lists the PCI functions it sees
# (vendor:device and class, as `1234:1111 class 0x030000`) between two markers on the serial
# console, then powers off. Kept tiny because at two levels of emulation a distribution would
# take far too long to boot.
NESTED_GUEST_INIT = """\
#!/bin/busybox sh
/bin/busybox --install -s /bin
mkdir -p /proc /sys /dev
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
echo "GPUHOST-GUEST-PCI-BEGIN"
for d in /sys/bus/pci/devices/*; do
  v=$(cat "$d/vendor"); p=$(cat "$d/device"); c=$(cat "$d/class")
  echo "${d##*/} ${v#0x}:${p#0x} class $c"
done
echo "GPUHOST-GUEST-PCI-END"
poweroff -f
"""

NESTED_GUEST_DIR = "/opt/gpuhost/nested-guest"

# Boots the tiny guest; extra arguments go to QEMU (e.g. -device vfio-pci,host=0000:01:00.0).
# vmlinux, not vmlinuz: an ELF kernel QEMU starts through PVH, without the XZ decompressor (the
# image build extracts it; changing this text also re-keys the nested image).
NESTED_GUEST_RUNNER = f"""\
#!/bin/sh
# gpuhost lab: boot the tiny nested guest under TCG; extra arguments are passed to QEMU.
set -e
dir=/opt/gpuhost/nested-guest
exec qemu-system-x86_64 -accel tcg -machine q35 -cpu max -m 512 -nographic -no-reboot \\
  -kernel "$dir/vmlinux" -initrd "$dir/initrd.gz" -append "console=ttyS0 quiet panic=-1 {GUEST_SPEED_OPTIONS}" "$@"
"""


# The kernel stall the lab's hang faults inject (gpuhost/data/lab_stall_module.c): a module built
# in the image against its own kernel's headers, installed only for the build and removed after it,
# so that a fresh machine needs no headers of a kernel the mirror may no longer carry. Only the
# base images of the two boot loaders whose trial rescues are tested with it carry it.
STALL_MODULE_NAME = "gpuhost_stall"
STALL_MODULE_SOURCE = Path(__file__).resolve().parents[1] / "data" / "lab_stall_module.c"
STALL_MODULE_LAYOUTS = (DiskLayout.BIOS_GRUB, DiskLayout.EFI_SYSTEMD_BOOT)
# What the build installs in the image to compile it (with the headers of the image's kernel), and
# purges again afterwards.
STALL_BUILD_PACKAGES = ("gcc", "make", "binutils")


@dataclass(frozen=True)
class Recipe:
    variant: str
    suite: str
    packages: tuple[str, ...]  # installed by debootstrap
    apt_packages: tuple[str, ...]  # installed by apt-get afterwards, without recommends
    kernel_cmdline: str
    disk_size_gib: int
    # (path inside the image, mode, content); content may use {root_uuid}
    files: tuple[tuple[str, int, str], ...]
    masked_units: tuple[str, ...]
    steps_version: int
    # Last, with a default: a BIOS recipe hashes as it did before UEFI disks existed (see recipe_hash).
    layout: str = DiskLayout.BIOS_GRUB.value
    # The stall module's C source where the image carries it built, else empty (and left out of the
    # hash, so that images without it keep their names).
    stall_module_source: str = ""


def recipe_for(variant: str, layout: DiskLayout = DiskLayout.BIOS_GRUB) -> Recipe:
    if variant not in VARIANTS:
        raise ValueError(f"unknown image variant {variant!r}; known: {', '.join(VARIANTS)}")
    files: list[tuple[str, int, str]] = [
        ("/etc/initramfs-tools/conf.d/gpuhost-lab.conf", 0o644, INITRAMFS_CONF),
        ("/etc/initramfs-tools/modules", 0o644, INITRAMFS_MODULES),
        ("/etc/default/grub", 0o644, DEFAULT_GRUB_EFI if layout is DiskLayout.EFI_SHIM_GRUB else DEFAULT_GRUB),
        ("/etc/ssh/sshd_config.d/gpuhost-lab.conf", 0o644, SSHD_CONF),
        ("/etc/systemd/network/20-gpuhost-lab.network", 0o644, NETWORK_CONF),
        ("/usr/local/sbin/gpuhost-lab-hostname", 0o755, HOSTNAME_SCRIPT),
        ("/etc/systemd/system/gpuhost-lab-hostname.service", 0o644, HOSTNAME_UNIT),
        ("/etc/fstab", 0o644, FSTAB),
    ]
    apt_packages: tuple[str, ...] = ()
    if variant == "nested":
        apt_packages = NESTED_PACKAGES
        files += [
            (f"{NESTED_GUEST_DIR}/init", 0o755, NESTED_GUEST_INIT),
            ("/usr/local/bin/gpuhost-nested-guest", 0o755, NESTED_GUEST_RUNNER),
        ]
    if variant == "guest":
        apt_packages = GUEST_PACKAGES
        files.append(("/etc/cloud/cloud.cfg.d/90-gpuhost.cfg", 0o644, CLOUD_INIT_CONF))
    packages = BASE_PACKAGES
    if layout is not DiskLayout.BIOS_GRUB:
        packages = tuple(p for p in BASE_PACKAGES if p != "grub-pc")
        files = [f for f in files if f[0] != "/etc/fstab"] + [("/etc/fstab", 0o644, FSTAB_EFI)]
    if layout is DiskLayout.EFI_SHIM_GRUB:
        apt_packages = EFI_GRUB_PACKAGES + apt_packages
    if layout is DiskLayout.EFI_SYSTEMD_BOOT:
        apt_packages = EFI_SYSTEMD_BOOT_PACKAGES + apt_packages
        # No GRUB on this disk, so no /etc/default/grub either.
        files = [f for f in files if f[0] != "/etc/default/grub"]
        files += [
            ("/etc/kernel/cmdline", 0o644, KERNEL_CMDLINE_FILE),
            ("/etc/kernel/entry-token", 0o644, KERNEL_ENTRY_NAME),
        ]
    stall_source = STALL_MODULE_SOURCE.read_text() if variant == "base" and layout in STALL_MODULE_LAYOUTS else ""
    return Recipe(
        variant=variant,
        suite=SUITE,
        packages=packages,
        apt_packages=apt_packages,
        kernel_cmdline=KERNEL_CMDLINE,
        disk_size_gib=8 if variant == "base" else 12,
        files=tuple(files),
        masked_units=MASKED_UNITS,
        steps_version=STEPS_VERSION,
        layout=layout.value,
        stall_module_source=stall_source,
    )


def recipe_hash(recipe: Recipe) -> str:
    """A short stable digest of the recipe (names the cached image)."""
    fields = asdict(recipe)
    if fields["layout"] == DiskLayout.BIOS_GRUB.value:
        # BIOS images were hashed before the layout existed: their cached images stay valid.
        del fields["layout"]
    if not fields["stall_module_source"]:
        del fields["stall_module_source"]
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def mirror_from_sources(texts: list[str]) -> str | None:
    """The first Debian mirror named in apt sources (one-line or deb822 format), if any."""
    for text in texts:
        for raw in text.splitlines():
            line = raw.strip()
            if line.startswith("#") or not line:
                continue
            words = line.split()
            if line.startswith("URIs:"):
                uris = words[1:]
            elif words[0] == "deb":
                uris = [w for w in words[1:] if w.startswith(("http://", "https://"))][:1]
            else:
                continue
            for uri in uris:
                if uri.startswith(("http://", "https://")) and uri.rstrip("/").endswith("/debian"):
                    return uri.rstrip("/")
    return None
