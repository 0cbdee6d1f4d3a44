#!/bin/sh
# gpuhost gather: copy everything the audit reads into a private temporary tree that mirrors the
# host's paths, add the output of a few read-only commands under commands/, and write the tree to
# stdout as a gzip-compressed tar. The controller unpacks it as a snapshot directory.
#
# Read-only on the host: the only writes go to the temporary tree, which is removed on exit.
# POSIX sh plus coreutils/findutils; no loop runs a process per file, because a large server has
# hundreds of PCI functions and the audit must stay fast over high-latency links.
#
# Symbolic links (a function's driver and iommu_group, an IOMMU group's members) are recorded as
# regular files holding the link's target, so that the snapshot never contains a link that could
# point outside it.

set -u
umask 077
LC_ALL=C
export LC_ALL
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH

# The tree is a few hundred small files written once and read once: build it in RAM when the host
# has a writable tmpfs (about 4x less CPU than an ext4 /tmp), unless the caller chose TMPDIR.
if [ -z "${TMPDIR-}" ] && [ -d /dev/shm ] && [ -w /dev/shm ]; then
    T=$(mktemp -d -p /dev/shm gpuhost-gather.XXXXXX 2> /dev/null) || T=
fi
[ -n "${T-}" ] || T=$(mktemp -d) || { echo "gpuhost-gather: cannot create a temporary directory" >&2; exit 70; }
trap 'rm -rf "$T"' EXIT
trap 'exit 130' INT TERM HUP
mkdir -p "$T/commands"

KREL=$(cat /proc/sys/kernel/osrelease 2>/dev/null || uname -r)

# copy_files PATH...: copy the readable regular files among PATH, keeping their paths under $T.
# --no-preserve=mode: --parents would give the new directories the modes of /proc and /sys
# (0555), so that a non-root user could not add the next file into them.
copy_files() {
    given=$#
    for p in "$@"; do
        [ -f "$p" ] && [ -r "$p" ] && set -- "$@" "$p"
    done
    shift "$given"
    [ $# -gt 0 ] || return 0
    cp --parents --no-preserve=mode -- "$@" "$T/" 2>/dev/null
    return 0
}

# record_links PATH...: for each symbolic link among PATH, write its target into $T/PATH.
# One find lists every link with its target; the loop uses shell builtins only (sysfs paths
# hold no blanks), so a server with hundreds of functions costs no process per link.
record_links() {
    find "$@" -maxdepth 0 -type l -printf '%p %l\n' 2> /dev/null | while read -r p target; do
        parent=${p%/*}
        [ -d "$T$parent" ] || mkdir -p "$T$parent"
        printf '%s\n' "$target" > "$T$p"
    done
}

# run_command NAME COMMAND...: store stdout in commands/NAME.txt and the exit status in status.txt.
run_command() {
    name=$1
    shift
    "$@" > "$T/commands/$name.txt" 2> /dev/null
    printf '%s %s\n' "$name" "$?" >> "$T/commands/status.txt"
}

# --- plain files -------------------------------------------------------------------------------
copy_files \
    /proc/cmdline /proc/cpuinfo /proc/meminfo /proc/modules /proc/mounts /proc/version \
    /proc/sys/kernel/hostname /proc/sys/kernel/osrelease /proc/driver/nvidia/version \
    /etc/os-release /etc/hostname /etc/fstab /etc/default/grub /etc/default/grub.d/*.cfg \
    /etc/kernel/cmdline /boot/grub/grubenv /boot/grub/grub.cfg /boot/grub2/grub.cfg \
    /etc/kernel/install.conf /etc/kernel/entry-token /etc/kernel/proxmox-boot-uuids \
    /boot/efi/loader/loader.conf /efi/loader/loader.conf /boot/loader/loader.conf \
    /boot/efi/loader/entries/*.conf /efi/loader/entries/*.conf /boot/loader/entries/*.conf \
    /etc/modprobe.d/*.conf /lib/modprobe.d/*.conf /usr/lib/modprobe.d/*.conf \
    /etc/modules /etc/modules-load.d/*.conf /etc/initramfs-tools/modules \
    /etc/initramfs-tools/initramfs.conf /etc/initramfs-tools/conf.d/* /etc/dracut.conf.d/*.conf \
    /etc/X11/xorg.conf /lib/modules/"$KREL"/modules.builtin \
    /sys/class/dmi/id/sys_vendor /sys/class/dmi/id/product_name /sys/hypervisor/type \
    /sys/kernel/mm/hugepages/hugepages-*/nr_hugepages /sys/kernel/mm/hugepages/hugepages-*/free_hugepages \
    /sys/kernel/mm/hugepages/hugepages-*/resv_hugepages /sys/kernel/mm/hugepages/hugepages-*/surplus_hugepages \
    /sys/devices/system/node/online /sys/devices/system/node/node*/meminfo /sys/devices/system/node/node*/cpulist \
    /sys/devices/system/cpu/cpu*/topology/thread_siblings_list \
    /sys/devices/system/node/node*/hugepages/hugepages-*/nr_hugepages \
    /sys/devices/system/node/node*/hugepages/hugepages-*/free_hugepages \
    /sys/kernel/iommu_groups/*/type \
    /sys/module/vfio_pci/parameters/ids /sys/module/nvidia/version \
    /sys/module/kvm_intel/parameters/nested /sys/module/kvm_amd/parameters/nested \
    /sys/module/vfio/initstate /sys/module/vfio_pci/initstate /sys/module/vfio_iommu_type1/initstate \
    /sys/module/nvidia/initstate /sys/module/nouveau/initstate /sys/module/snd_hda_intel/initstate \
    /sys/class/watchdog/watchdog*/identity /sys/class/watchdog/watchdog*/timeout \
    /sys/class/watchdog/watchdog*/state /sys/class/watchdog/watchdog*/nowayout \
    /proc/sys/kernel/panic /proc/sys/kernel/panic_on_oops /proc/sys/kernel/softlockup_panic \
    /proc/sys/kernel/hung_task_panic /proc/sys/kernel/hardlockup_panic \
    /proc/sys/kernel/hung_task_timeout_secs /proc/sys/kernel/watchdog_thresh \
    /proc/sys/kernel/panic_on_rcu_stall /sys/module/rcupdate/parameters/rcu_cpu_stall_timeout \
    /etc/systemd/system.conf /etc/systemd/system.conf.d/*.conf /usr/lib/systemd/system.conf.d/*.conf \
    /etc/nccl.conf /var/run/nvidia-topologyd/virtualTopology.xml
# The NCCL topology file /etc/nccl.conf names (its first NCCL_TOPO_FILE= line, as NCCL reads it),
# as commands/nccl-topology.txt. Only an absolute path ending in .xml to a readable regular file of
# at most 1 MiB: the gather copies nothing else a configuration file points it at.
nccl_topology=$(sed -n 's/^NCCL_TOPO_FILE=//p' /etc/nccl.conf 2> /dev/null | head -n 1 | tr -d '\r')
case $nccl_topology in
    /*.xml)
        if [ -f "$nccl_topology" ] && [ -r "$nccl_topology" ] &&
            [ "$(wc -c < "$nccl_topology" 2> /dev/null)" -le 1048576 ] 2> /dev/null; then
            run_command nccl-topology cat -- "$nccl_topology"
        fi
        ;;
esac
# The watchdog devices (what can reset a host whose boot hangs); its exit status marks that this
# gather read them: an older snapshot has no such line, and its rescue facts are unknown.
run_command watchdogs ls /sys/class/watchdog

# --- PCI functions: attributes of every function, in one cp --------------------------------------
set --
for d in /sys/bus/pci/devices/*; do
    [ -d "$d" ] || continue
    for a in vendor device subsystem_vendor subsystem_device class revision numa_node local_cpulist \
        current_link_speed current_link_width max_link_speed max_link_width reset_method resource \
        boot_vga d3cold_allowed driver_override enable power_state power/control power/runtime_status \
        sriov_totalvfs sriov_numvfs; do
        [ -r "$d/$a" ] && set -- "$@" "$d/$a"
    done
    for a in "$d"/resource*_resize; do
        [ -r "$a" ] && set -- "$@" "$a"
    done
done
[ $# -gt 0 ] && cp --parents --no-preserve=mode -- "$@" "$T/" 2>/dev/null

# --- links: drivers, IOMMU groups, IOMMU units ---------------------------------------------------
set -- "$T/sys/class/iommu"
for g in /sys/kernel/iommu_groups/*/devices; do
    [ -d "$g" ] && set -- "$@" "$T$g"
done
mkdir -p -- "$@"
record_links /sys/bus/pci/devices/*/driver /sys/bus/pci/devices/*/iommu_group \
    /sys/kernel/iommu_groups/*/devices/* /sys/class/iommu/*
# Where each function sits in the PCI hierarchy (which bridges are above it).
run_command pci-device-paths find /sys/bus/pci/devices/ -mindepth 1 -maxdepth 1 -printf '%f %l\n'

# --- what exists, without reading it (binary or root-only files) ----------------------------------
{
    for p in /sys/firmware/efi /sys/firmware/acpi/tables/DMAR /sys/firmware/acpi/tables/IVRS \
        /sys/kernel/iommu_groups /sys/class/iommu /dev/vfio /dev/hugepages /usr/bin/nvidia-uninstall \
        /var/log/nvidia-installer.log /usr/bin/nvidia-smi /boot/efi/EFI /boot/loader/entries \
        /boot/efi/loader/entries /efi/loader/entries /etc/kernel/proxmox-boot-uuids \
        /etc/kernel/install.conf /boot/initrd.img-"$KREL" /boot/initramfs-"$KREL".img \
        /sys/module/vfio_pci /sys/module/vfio /sys/module/nvidia /sys/module/nouveau /etc/X11/xorg.conf \
        /dev/ipmi0 /dev/ipmi/0 /dev/ipmidev/0; do
        [ -e "$p" ] && printf '%s\n' "$p"
    done
} > "$T/commands/exists.txt"
run_command acpi-tables ls /sys/firmware/acpi/tables
{
    for c in update-grub grub-mkconfig grub2-mkconfig grub-reboot grub-editenv grubby bootctl kernel-install \
        proxmox-boot-tool kernelstub update-initramfs lsinitramfs dracut lsinitrd lspci dpkg-query rpm \
        nvidia-smi nvidia-uninstall journalctl dmesg sudo ipmitool; do
        command -v "$c"
    done
} > "$T/commands/which.txt" 2>/dev/null

# --- firmware: EFI variables, the ESP, modules Secure Boot checks ---------------------------------
# efivarfs files are binary (4 bytes of attributes, then the value): recorded as od's hex.
EFIVARS=/sys/firmware/efi/efivars
# systemd-boot's LoaderEntryDefault and LoaderEntryOneShot: the entry `bootctl set-default` and
# `bootctl set-oneshot` chose (a one-shot is cleared by systemd-boot when it boots it).
for v in SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c LoaderInfo-4a67b082-0a4c-41cf-b6c7-440b29bb8c4f \
    LoaderEntrySelected-4a67b082-0a4c-41cf-b6c7-440b29bb8c4f LoaderEntryDefault-4a67b082-0a4c-41cf-b6c7-440b29bb8c4f \
    LoaderEntryOneShot-4a67b082-0a4c-41cf-b6c7-440b29bb8c4f; do
    [ -r "$EFIVARS/$v" ] && run_command "efivar-${v%%-*}" od -An -v -tx1 "$EFIVARS/$v"
done
# The EFI programs on every mounted FAT file system with an EFI directory (the ESP), as
# '<mount>/EFI <path below it>'.
: > "$T/commands/esp-files.txt"
while read -r _ mnt fstype _; do
    [ "$fstype" = vfat ] && [ -d "$mnt/EFI" ] &&
        find "$mnt/EFI" -maxdepth 2 -type f -iname '*.efi' -printf '%H %P\n' >> "$T/commands/esp-files.txt" 2> /dev/null
done < /proc/mounts
# Modules outside the kernel package (DKMS builds them into updates/, other installers into
# extra/) and who signed each: a handful at most, so one modinfo per module is affordable.
if command -v modinfo > /dev/null; then
    find /lib/modules/"$KREL"/updates /lib/modules/"$KREL"/extra -name '*.ko*' 2> /dev/null |
        while read -r m; do
            printf '%s\t%s\n' "$m" "$(modinfo -F signer "$m" 2> /dev/null)"
        done > "$T/commands/out-of-tree-modules.txt"
fi

# NVIDIA's driver modules of every installed kernel, wherever they lie: DKMS's updates/dkms, Ubuntu's
# precompiled packages' kernel/nvidia-<branch>/, the .run installer's kernel/drivers/video/, extra/.
# Per file a 'module PATH' line, then what modinfo says of its version, license (the flavour:
# "NVIDIA" or the open modules' "Dual MIT/GPL") and signer. A few per kernel: one modinfo each.
find /lib/modules/ -mindepth 2 \( -name 'nvidia.ko*' -o -name 'nvidia-*.ko*' \) -type f 2> /dev/null |
    while read -r m; do
        printf 'module %s\n' "$m"
        command -v modinfo > /dev/null && modinfo "$m" 2> /dev/null | grep -E '^(version|license|signer):'
    done > "$T/commands/nvidia-modules.txt"
printf 'nvidia-modules 0\n' >> "$T/commands/status.txt"
# The machine's architecture as the kernel reports it (x86_64, aarch64): gpuhost supports x86_64.
run_command machine uname -m

# --- commands -----------------------------------------------------------------------------------
command -v lspci > /dev/null && run_command lspci-nn lspci -Dnn
# Only the kernel messages the checks read: IOMMU, interrupt remapping, VFIO, GPU drivers,
# framebuffers, BAR assignment, huge pages. A long-running host's full log can be megabytes.
KLOG_PATTERN='DMAR|IOMMU|AMD-Vi|remapping|vfio|nvidia|nouveau|NVRM|efifb|simpledrm|vesafb|BAR [0-9]|hugepage|HugeTLB|ACS|Command line|[Ss]ecure ?[Bb]oot|Lockdown|unsigned module|module verification'
if command -v journalctl > /dev/null && journalctl -k -b 0 -q --no-pager -n 1 > /dev/null 2>&1; then
    journalctl -k -b 0 -q --no-pager -o short-monotonic 2>/dev/null | grep -E "$KLOG_PATTERN" > "$T/commands/dmesg.txt"
    printf 'dmesg 0\n' >> "$T/commands/status.txt"
elif dmesg > /dev/null 2>&1; then
    dmesg 2>/dev/null | grep -E "$KLOG_PATTERN" > "$T/commands/dmesg.txt"
    printf 'dmesg 0\n' >> "$T/commands/status.txt"
else
    printf 'dmesg 1\n' >> "$T/commands/status.txt"
fi
# The initramfs of the running kernel, reduced to the modules the checks ask about.
list_initramfs() {
    "$@" > "$T/initramfs-list" 2> /dev/null
    rc=$?
    grep -E 'vfio|nvidia|nouveau' "$T/initramfs-list" > "$T/commands/lsinitramfs.txt"
    rm -f "$T/initramfs-list"
    printf 'lsinitramfs %s\n' "$rc" >> "$T/commands/status.txt"
}
if command -v lsinitramfs > /dev/null && [ -r /boot/initrd.img-"$KREL" ]; then
    list_initramfs lsinitramfs /boot/initrd.img-"$KREL"
elif command -v lsinitrd > /dev/null && [ -r /boot/initramfs-"$KREL".img ]; then
    list_initramfs lsinitrd /boot/initramfs-"$KREL".img
fi
# shellcheck disable=SC2016 # dpkg-query expands these fields itself
command -v dpkg-query > /dev/null &&
    run_command dpkg dpkg-query -W -f '${db:Status-Abbrev} ${Package} ${Version}\n'
command -v rpm > /dev/null && run_command rpm rpm -qa --qf '%{NAME} %{VERSION}-%{RELEASE}\n'

# The GRUB command line as grub-mkconfig computes it: /etc/default/grub, then each
# /etc/default/grub.d/*.cfg, sourced by the shell in that order. Checked for syntax first.
if [ -r /etc/default/grub ]; then
    if sh -n /etc/default/grub 2> "$T/commands/grub-syntax.txt"; then
        for f in /etc/default/grub.d/*.cfg; do
            [ -r "$f" ] && { sh -n "$f" 2>> "$T/commands/grub-syntax.txt" || printf 'syntax error in %s\n' "$f" >> "$T/commands/grub-syntax.txt"; }
        done
        (
            set +u
            # shellcheck source=/dev/null
            . /etc/default/grub
            for f in /etc/default/grub.d/*.cfg; do
                # shellcheck source=/dev/null
                [ -r "$f" ] && . "$f"
            done
            printf 'GRUB_CMDLINE_LINUX=%s\n' "${GRUB_CMDLINE_LINUX-}"
            printf 'GRUB_CMDLINE_LINUX_DEFAULT=%s\n' "${GRUB_CMDLINE_LINUX_DEFAULT-}"
            printf 'GRUB_DEFAULT=%s\n' "${GRUB_DEFAULT-}"
            printf 'GRUB_DISABLE_RECOVERY=%s\n' "${GRUB_DISABLE_RECOVERY-}"
        ) > "$T/commands/grub-effective.txt" 2> /dev/null < /dev/null
        printf 'grub-effective %s\n' "$?" >> "$T/commands/status.txt"
    else
        printf 'grub-effective 2\n' >> "$T/commands/status.txt"
    fi
fi
printf '%s\n' "$(id -u)" > "$T/commands/uid.txt"

# Fast compression: the archive is tens of KiB, and CPU on the host matters more than bytes.
tar -C "$T" -cf - . | gzip -1
