"""Turn a snapshot tree into HostFacts, file by file through the pure parsers."""

from __future__ import annotations

import dataclasses
import re

from gpuhost.facts import parsers as p
from gpuhost.facts import rescue
from gpuhost.facts.model import (
    GPUHOST_GRUB_DROPIN,
    NCCL_CONF,
    NCCL_DEFAULT_TOPOLOGY,
    ActiveLoader,
    Bootloader,
    BootloaderKind,
    Firmware,
    FirmwareFacts,
    GrubConfig,
    HostFacts,
    HugePagePool,
    Initramfs,
    Iommu,
    KernelLog,
    LoaderEntryFile,
    ModprobeDirective,
    Modules,
    NcclTopologyFile,
    NumaNode,
    NvidiaInstall,
    Package,
    VfioPci,
    VirtualizationSoftware,
)
from gpuhost.facts.nccl import parse_nccl_conf_topology, parse_nccl_topology
from gpuhost.facts.pci import PcieLinkStatus, PciFunction
from gpuhost.facts.snapshot import Tree

PCI_DEVICES = "/sys/bus/pci/devices"
XORG_CONF = "/etc/X11/xorg.conf"
MODPROBE_DIRS = ("/etc/modprobe.d", "/lib/modprobe.d", "/usr/lib/modprobe.d")
ESP_MOUNTS = ("/boot/efi", "/efi", "/boot")
SHIM_FILES = frozenset({"shimx64.efi", "shimaa64.efi", "mmx64.efi", "mmaa64.efi"})
# The host NVIDIA driver's package families: NVIDIA's and the distributions' (Debian, Ubuntu's
# ubuntu-drivers: nvidia-driver-<branch>[-open|-server], nvidia-dkms-*), Ubuntu's precompiled, signed
# modules per kernel (linux-modules-nvidia-<branch>[-server][-open]-<kernel>, with -generic
# metapackages that follow each kernel upgrade; linux-objects-nvidia-* and linux-signatures-nvidia-*
# they are linked from), and RHEL's kmod-nvidia.
NVIDIA_PACKAGE_PREFIXES = (
    "nvidia-",
    "libnvidia-",
    "cuda-drivers",
    "xserver-xorg-video-nvidia",
    "kmod-nvidia",
    "linux-modules-nvidia-",
    "linux-objects-nvidia-",
    "linux-signatures-nvidia-",
)


def build_facts(tree: Tree) -> HostFacts:
    exists = _exists_set(tree)
    status = p.parse_command_status(tree.command("status") or "")
    cmdline_text = tree.read("/proc/cmdline")
    cpuinfo_text = tree.read("/proc/cpuinfo")
    meminfo_text = tree.read("/proc/meminfo")
    mounts_text = tree.read("/proc/mounts")
    uid_text = tree.command("uid")
    os_release = p.parse_os_release(tree.read("/etc/os-release") or "")
    hostname = _first_line(tree.read("/proc/sys/kernel/hostname")) or _first_line(tree.read("/etc/hostname"))
    kernel_release = _first_line(tree.read("/proc/sys/kernel/osrelease"))
    modules = _modules(tree, kernel_release)
    bootloader = _bootloader(tree, exists)
    packages = _packages(tree)
    return HostFacts(
        hostname=hostname,
        kernel_release=kernel_release,
        os_pretty_name=os_release.get("PRETTY_NAME"),
        running_as_root=None if uid_text is None else uid_text.strip() == "0",
        cpu=None if cpuinfo_text is None else p.parse_cpuinfo(cpuinfo_text),
        cmdline=None if cmdline_text is None else p.parse_cmdline(cmdline_text),
        memory=None if meminfo_text is None else p.parse_meminfo(meminfo_text),
        hugepage_pools=_hugepage_pools(tree, "/sys/kernel/mm/hugepages"),
        numa_nodes=_numa_nodes(tree),
        mounts=None if mounts_text is None else p.parse_mounts(mounts_text),
        pci=_pci_functions(tree),
        iommu=_iommu(tree, exists),
        modules=modules,
        vfio_pci=_vfio_pci_kind(modules, exists),
        vfio_pci_module_ids=_vfio_module_ids(tree),
        initramfs=_initramfs(tree, status),
        grub=_grub(tree, status),
        bootloader=bootloader,
        firmware=_firmware(tree, exists, bootloader),
        nvidia=_nvidia(tree, exists, packages),
        modprobe=_modprobe(tree),
        kernel_log=_kernel_log(tree, status),
        dmi_vendor=_first_line(tree.read("/sys/class/dmi/id/sys_vendor")),
        dmi_product=_first_line(tree.read("/sys/class/dmi/id/product_name")),
        virtualization=_virtualization(packages),
        thread_siblings=_thread_siblings(tree),
        rescue=_rescue(tree, exists, status),
        xorg_conf=_present(tree, exists, XORG_CONF),
        nccl_topology=_nccl_topology(tree),
        machine=_machine(tree, cpuinfo_text),
    )


def _machine(tree: Tree, cpuinfo: str | None) -> str | None:
    """`uname -m` where the gather ran it; else what /proc/cpuinfo's form says (a snapshot from before)."""
    return _first_line(tree.command("machine")) or (None if cpuinfo is None else p.parse_cpuinfo_machine(cpuinfo))


def _nccl_topology(tree: Tree) -> NcclTopologyFile | None:
    """The topology file NCCL_CONF names (the gather records it as commands/nccl-topology when it is
    an absolute .xml path to a readable file of at most 1 MiB), else NCCL's default file."""
    conf = tree.read(NCCL_CONF)
    named = parse_nccl_conf_topology(conf) if conf is not None else None
    if named is not None:
        text, where = tree.command("nccl-topology"), NCCL_CONF
        path = named
    else:
        text, where = tree.read(NCCL_DEFAULT_TOPOLOGY), None
        path = NCCL_DEFAULT_TOPOLOGY
        if text is None:
            return None
    if text is None:
        return NcclTopologyFile(path, where, None, "missing, unreadable, not an absolute .xml path, or over 1 MiB")
    try:
        return NcclTopologyFile(path, where, parse_nccl_topology(text), None)
    except ValueError as error:
        return NcclTopologyFile(path, where, None, str(error))


def _first_line(text: str | None) -> str | None:
    if text is None:
        return None
    stripped = text.strip()
    return stripped.splitlines()[0] if stripped else None


def _present(tree: Tree, exists: frozenset[str] | None, path: str) -> bool | None:
    """Whether a file the gather copies exists: copied, or in the existence list; None where neither
    tells (no existence list, as in snapshots taken before it listed the file)."""
    if tree.read(path) is not None or (exists is not None and path in exists):
        return True
    return False if exists is not None else None


def _exists_set(tree: Tree) -> frozenset[str] | None:
    text = tree.command("exists")
    return None if text is None else frozenset(line.strip() for line in text.splitlines() if line.strip())


def _pci_functions(tree: Tree) -> tuple[PciFunction, ...]:
    parents = p.parse_pci_device_paths(tree.command("pci-device-paths") or "")
    functions = []
    for address in tree.list(PCI_DEVICES):
        if not p.is_pci_address(address):
            continue
        base = f"{PCI_DEVICES}/{address}"

        def attr(name: str, base: str = base) -> str | None:
            return tree.read(f"{base}/{name}")

        resizable = {}
        for name in tree.list(base):
            if name.startswith("resource") and name.endswith("_resize"):
                index = p.parse_int(name[len("resource") : -len("_resize")])
                sizes = p.parse_hex(attr(name))
                if index is not None and sizes is not None:
                    resizable[index] = sizes
        driver = p.parse_driver_link(tree.link(f"{base}/driver"))
        functions.append(
            PciFunction(
                address=address,
                vendor=p.parse_hex(attr("vendor")),
                device=p.parse_hex(attr("device")),
                subsystem_vendor=p.parse_hex(attr("subsystem_vendor")),
                subsystem_device=p.parse_hex(attr("subsystem_device")),
                class_code=p.parse_hex(attr("class")),
                revision=p.parse_hex(attr("revision")),
                driver=driver,
                driver_unknown=driver is None and tree.has_entry(f"{base}/driver"),
                driver_override=p.parse_optional_text(attr("driver_override")),
                iommu_group=p.parse_int(p.parse_link_target_basename(tree.link(f"{base}/iommu_group"))),
                numa_node=p.parse_int(attr("numa_node")),
                local_cpulist=p.parse_optional_text(attr("local_cpulist")),
                link=PcieLinkStatus(
                    current_speed_gts=p.parse_link_speed(attr("current_link_speed")),
                    current_width=p.parse_int(attr("current_link_width")),
                    max_speed_gts=p.parse_link_speed(attr("max_link_speed")),
                    max_width=p.parse_int(attr("max_link_width")),
                ),
                reset_methods=p.parse_reset_methods(attr("reset_method")),
                bars=p.parse_pci_resource(attr("resource")),
                resizable_bar_sizes=resizable,
                boot_vga=p.parse_bool_attribute(attr("boot_vga")),
                d3cold_allowed=p.parse_bool_attribute(attr("d3cold_allowed")),
                parents=parents.get(address, ()),
            )
        )
    return tuple(functions)


def _iommu(tree: Tree, exists: frozenset[str] | None) -> Iommu:
    acpi_text = tree.command("acpi-tables")
    acpi_tables = None if acpi_text is None else set(acpi_text.split())
    groups: dict[int, tuple[str, ...]] = {}
    group_types: dict[int, str] = {}
    malformed: list[str] = []
    for name in tree.list("/sys/kernel/iommu_groups"):
        group = p.parse_int(name)
        if group is None:
            continue
        if not p.is_plain_number(name):
            malformed.append(f"/sys/kernel/iommu_groups/{name}")
        groups[group] = tuple(
            member for member in tree.list(f"/sys/kernel/iommu_groups/{name}/devices") if p.is_pci_address(member)
        )
        group_type = _first_line(tree.read(f"/sys/kernel/iommu_groups/{name}/type"))
        if group_type:
            group_types[group] = group_type

    for address in tree.list(PCI_DEVICES):
        linked = p.parse_link_target_basename(tree.link(f"{PCI_DEVICES}/{address}/iommu_group"))
        if p.is_pci_address(address) and linked is not None and not p.is_plain_number(linked):
            malformed.append(f"{PCI_DEVICES}/{address}/iommu_group -> {linked}")

    def table(name: str) -> bool | None:
        if acpi_tables is not None:
            return name in acpi_tables
        if exists is not None:
            return f"/sys/firmware/acpi/tables/{name}" in exists
        return None

    return Iommu(
        dmar_table=table("DMAR"),
        ivrs_table=table("IVRS"),
        units=tuple(tree.list("/sys/class/iommu")),
        groups=dict(sorted(groups.items())),
        group_types=group_types,
        malformed_names=tuple(malformed),
    )


def _hugepage_pools(tree: Tree, directory: str) -> tuple[HugePagePool, ...]:
    pools = []
    for name in tree.list(directory):
        size = p.parse_hugepage_dir_size(name)
        if size is not None:
            pools.append(
                p.hugepage_pool(
                    size,
                    tree.read(f"{directory}/{name}/nr_hugepages"),
                    tree.read(f"{directory}/{name}/free_hugepages"),
                )
            )
    return tuple(sorted(pools, key=lambda pool: pool.size_kib))


def _numa_nodes(tree: Tree) -> tuple[NumaNode, ...]:
    nodes = []
    for name in tree.list("/sys/devices/system/node"):
        if not re.fullmatch("node[0-9]+", name):  # not isdigit(): 'node²' would reach int()
            continue
        base = f"/sys/devices/system/node/{name}"
        meminfo = tree.read(f"{base}/meminfo")
        nodes.append(
            NumaNode(
                node_id=int(name[4:]),
                mem_total_kib=None if meminfo is None else p.parse_node_meminfo_total(meminfo),
                cpulist=p.parse_optional_text(tree.read(f"{base}/cpulist")),
                hugepages=_hugepage_pools(tree, f"{base}/hugepages"),
            )
        )
    return tuple(sorted(nodes, key=lambda node: node.node_id))


def _thread_siblings(tree: Tree) -> dict[int, tuple[int, ...]]:
    """Each logical CPU's core (topology/thread_siblings_list): which CPUs are SMT siblings."""
    siblings: dict[int, tuple[int, ...]] = {}
    for name in tree.list("/sys/devices/system/cpu"):
        if not re.fullmatch("cpu[0-9]+", name):
            continue
        text = tree.read(f"/sys/devices/system/cpu/{name}/topology/thread_siblings_list")
        if text is not None and text.strip():
            siblings[int(name[3:])] = p.parse_cpulist(text)
    return siblings


def _modules(tree: Tree, kernel_release: str | None) -> Modules | None:
    loaded_text = tree.read("/proc/modules")
    if loaded_text is None:
        return None
    builtin_text = None if kernel_release is None else tree.read(f"/lib/modules/{kernel_release}/modules.builtin")
    return Modules(
        loaded=p.parse_proc_modules(loaded_text),
        builtin=None if builtin_text is None else p.parse_modules_builtin(builtin_text),
    )


def _vfio_pci_kind(modules: Modules | None, exists: frozenset[str] | None) -> VfioPci | None:
    if modules is not None and modules.builtin is not None:
        if "vfio_pci" in modules.builtin:
            return VfioPci.BUILTIN
        if modules.is_loaded("vfio_pci"):
            return VfioPci.MODULE
    if modules is not None and modules.is_loaded("vfio_pci"):
        return VfioPci.MODULE
    if modules is not None and modules.builtin is not None:
        # Not built in and not loaded: a module that may or may not be installed. Debian and
        # Ubuntu kernels ship it as a module, so call it one unless the kernel has no IOMMU at all.
        return VfioPci.MODULE if exists is None or "/sys/class/iommu" in exists else VfioPci.ABSENT
    return None


def _vfio_module_ids(tree: Tree) -> tuple[str, ...] | None:
    text = tree.read("/sys/module/vfio_pci/parameters/ids")
    if text is None:
        return None
    return tuple(item for item in text.strip().split(",") if item)


def _initramfs(tree: Tree, status: dict[str, int]) -> Initramfs:
    text = tree.command("lsinitramfs")
    if text is None or status.get("lsinitramfs", 0) != 0:
        return Initramfs(entries=None)
    return Initramfs(entries=tuple(line.strip() for line in text.splitlines() if line.strip()))


def _grub(tree: Tree, status: dict[str, int]) -> GrubConfig:
    present = tree.read("/etc/default/grub") is not None
    dropins = tuple(f"/etc/default/grub.d/{name}" for name in tree.list("/etc/default/grub.d") if name.endswith(".cfg"))
    effective = tree.command("grub-effective")
    syntax = tree.command("grub-syntax")
    syntax_error = syntax.strip() if syntax and syntax.strip() else None
    if status.get("grub-effective", 0) == 2 and syntax_error is None:
        syntax_error = "/etc/default/grub is not valid shell"
    values = p.parse_key_value_lines(effective) if effective is not None and syntax_error is None else {}
    linux = values.get("GRUB_CMDLINE_LINUX")
    default = values.get("GRUB_CMDLINE_LINUX_DEFAULT")
    ours = tree.read(GPUHOST_GRUB_DROPIN)
    return GrubConfig(
        present=present,
        syntax_error=syntax_error,
        cmdline_linux=None if linux is None else p.parse_cmdline(linux),
        cmdline_linux_default=None if default is None else p.parse_cmdline(default),
        dropins=dropins,
        gpuhost_options=None if ours is None else p.parse_gpuhost_grub_dropin(ours),
    )


def _efivar(tree: Tree, name: str) -> bytes | None:
    text = tree.command(f"efivar-{name}")
    return None if text is None else p.parse_od_bytes(text)


def _bootloader(tree: Tree, exists: frozenset[str] | None) -> Bootloader:
    which = {line.strip().rsplit("/", 1)[-1] for line in (tree.command("which") or "").splitlines() if line}
    found = _which_bootloader(tree, exists, which)
    return dataclasses.replace(
        found, has_kernel_install="kernel-install" in which, has_proxmox_boot_tool="proxmox-boot-tool" in which
    )


def _which_bootloader(tree: Tree, exists: frozenset[str] | None, which: set[str]) -> Bootloader:
    efi = None if exists is None else "/sys/firmware/efi" in exists
    has_bls = exists is not None and "/boot/loader/entries" in exists
    esp_entries = exists is not None and bool({"/boot/efi/loader/entries", "/efi/loader/entries"} & exists)
    loader_info = p.parse_efivar_string(_efivar(tree, "LoaderInfo"))
    if "grubby" in which and has_bls:
        return Bootloader(BootloaderKind.GRUBBY_BLS, efi, "grubby", "grubby and /boot/loader/entries (BLS) are present")
    if "proxmox-boot-tool" in which and tree.read("/etc/kernel/cmdline") is not None:
        return Bootloader(
            BootloaderKind.SYSTEMD_BOOT, efi, "proxmox-boot-tool refresh", "/etc/kernel/cmdline with proxmox-boot-tool"
        )
    if loader_info is not None and loader_info.startswith("systemd-boot"):
        # What booted, whatever files are lying around (a leftover /etc/default/grub included).
        return Bootloader(
            BootloaderKind.SYSTEMD_BOOT,
            efi,
            "/etc/kernel/cmdline and kernel-install" if "kernel-install" in which or "bootctl" in which else None,
            f"the LoaderInfo EFI variable says {loader_info} started this kernel",
        )
    if "bootctl" in which and (has_bls or esp_entries) and tree.read("/etc/default/grub") is None:
        return Bootloader(BootloaderKind.SYSTEMD_BOOT, efi, "bootctl", "systemd-boot entries and no /etc/default/grub")
    if tree.read("/etc/default/grub") is not None or tree.read("/boot/grub/grub.cfg") is not None:
        command = "update-grub" if "update-grub" in which else "grub-mkconfig" if "grub-mkconfig" in which else None
        if command is None and "grub2-mkconfig" in which:
            command = "grub2-mkconfig"
        return Bootloader(BootloaderKind.GRUB, efi, command, "/etc/default/grub is present")
    return Bootloader(BootloaderKind.UNKNOWN, efi, None, "no GRUB, systemd-boot or BLS configuration found")


# Package names of libvirt, QEMU and OVMF on Debian/Ubuntu and on RHEL-like hosts.
LIBVIRT_PACKAGES = ("libvirt-daemon",)
QEMU_PACKAGES = ("qemu-system-x86", "qemu-kvm")
OVMF_PACKAGES = ("ovmf", "edk2-ovmf")


def _packages(tree: Tree) -> tuple[Package, ...] | None:
    """The host's package database (dpkg's status, else rpm's list), parsed once for every fact that
    reads it; None when neither could be read."""
    dpkg, rpm = tree.command("dpkg"), tree.command("rpm")
    if dpkg is not None:
        return p.parse_dpkg_status(dpkg)
    if rpm is not None:
        return p.parse_rpm_list(rpm)
    return None


def _virtualization(packages: tuple[Package, ...] | None) -> VirtualizationSoftware | None:
    """What render needs to know of the host's libvirt, QEMU and OVMF, from the package database."""
    if packages is None:
        return None
    versions = {pkg.name: pkg.version for pkg in packages}

    def version(names: tuple[str, ...]) -> str | None:
        return next((versions[name] for name in names if name in versions), None)

    return VirtualizationSoftware(version(LIBVIRT_PACKAGES), version(QEMU_PACKAGES), version(OVMF_PACKAGES))


def _firmware(tree: Tree, exists: frozenset[str] | None, bootloader: Bootloader) -> FirmwareFacts:
    mode = None if exists is None else Firmware.UEFI if "/sys/firmware/efi" in exists else Firmware.BIOS
    secure_boot: bool | None = False if mode is Firmware.BIOS else None
    if mode is Firmware.UEFI:
        secure_boot = p.parse_efivar_bool(_efivar(tree, "SecureBoot"))
    loader_info = p.parse_efivar_string(_efivar(tree, "LoaderInfo"))
    esp_files = tree.command("esp-files")
    esp = None
    binaries: list[str] = []
    for line in (esp_files or "").splitlines():
        directory, _, relative = line.strip().partition(" ")
        if directory and relative:
            esp = esp or directory.removesuffix("/EFI")
            binaries.append(f"{directory.rsplit('/', 1)[-1]}/{relative}")
    if esp is None:
        # No EFI programs listed (not root, or a BIOS host): the fstab's vfat mount, if any.
        esp = next(
            (
                m.target
                for m in p.parse_mounts(tree.read("/proc/mounts") or "")
                if m.fstype == "vfat" and m.target in ESP_MOUNTS
            ),
            None,
        )
    proxmox = (exists is not None and "/etc/kernel/proxmox-boot-uuids" in exists) or tree.read(
        "/etc/kernel/proxmox-boot-uuids"
    ) is not None
    # shim installed as itself (EFI/debian/shimx64.efi), or at the removable path as BOOTX64.EFI,
    # where its MOK manager (mmx64.efi) beside it gives it away.
    shim = any(name.rsplit("/", 1)[-1].lower() in SHIM_FILES for name in binaries)
    if loader_info is not None and loader_info.startswith("systemd-boot"):
        loader = ActiveLoader.SYSTEMD_BOOT
    elif bootloader.kind is BootloaderKind.GRUB and mode is Firmware.BIOS:
        loader = ActiveLoader.GRUB_BIOS
    elif bootloader.kind is BootloaderKind.GRUB and mode is Firmware.UEFI:
        # Under Secure Boot only shim can start GRUB; without it, shim on the ESP is the evidence.
        loader = ActiveLoader.SHIM_GRUB if shim or secure_boot else ActiveLoader.GRUB_EFI
    elif bootloader.kind is BootloaderKind.SYSTEMD_BOOT:
        loader = ActiveLoader.SYSTEMD_BOOT
    else:
        loader = ActiveLoader.UNKNOWN
    modules_text = tree.command("out-of-tree-modules")
    kernel_cmdline = tree.read("/etc/kernel/cmdline")
    return FirmwareFacts(
        mode=mode,
        secure_boot=secure_boot,
        loader=loader,
        loader_info=loader_info,
        loader_entry=p.parse_efivar_string(_efivar(tree, "LoaderEntrySelected")),
        esp=esp,
        esp_binaries=tuple(binaries),
        proxmox_boot_tool=proxmox,
        cmdline_source=_cmdline_source(tree, bootloader, proxmox),
        kernel_cmdline_file=None if kernel_cmdline is None else p.parse_cmdline(kernel_cmdline),
        out_of_tree_modules=None if modules_text is None else p.parse_out_of_tree_modules(modules_text),
        loader_entries=_loader_entries(tree),
        loader_entry_oneshot=p.parse_efivar_string(_efivar(tree, "LoaderEntryOneShot")),
        loader_entry_default=p.parse_efivar_string(_efivar(tree, "LoaderEntryDefault")),
    )


# Where kernel-install and bootctl put Boot Loader Specification entries ($BOOT/loader/entries).
LOADER_ENTRY_DIRECTORIES = ("/boot/efi/loader/entries", "/efi/loader/entries", "/boot/loader/entries")


def _loader_entries(tree: Tree) -> tuple[LoaderEntryFile, ...]:
    found = []
    for directory in LOADER_ENTRY_DIRECTORIES:
        for name in tree.list(directory):
            text = tree.read(f"{directory}/{name}") if name.endswith(".conf") else None
            if text is not None:
                found.append(LoaderEntryFile(f"{directory}/{name}", p.parse_loader_entry(text)))
    return tuple(found)


def _cmdline_source(tree: Tree, bootloader: Bootloader, proxmox: bool) -> str | None:
    """The file the next boot's kernel command line is made from, by the active loader's tools."""
    if proxmox or bootloader.kind is BootloaderKind.SYSTEMD_BOOT:
        # kernel-install (and proxmox-boot-tool refresh) write loader entries from it; without it
        # kernel-install copies the running /proc/cmdline.
        return "/etc/kernel/cmdline" if tree.read("/etc/kernel/cmdline") is not None else "/proc/cmdline"
    if bootloader.kind is BootloaderKind.GRUB:
        return "/etc/default/grub"
    if bootloader.kind is BootloaderKind.GRUBBY_BLS:
        return "/boot/loader/entries (grubby --update-kernel)"
    return None


def _nvidia(tree: Tree, exists: frozenset[str] | None, packages: tuple[Package, ...] | None) -> NvidiaInstall:
    if packages is not None:
        packages = tuple(pkg for pkg in packages if pkg.name.startswith(NVIDIA_PACKAGE_PREFIXES))
    version, flavour = p.parse_nvidia_release(tree.read("/proc/driver/nvidia/version") or "")
    modules_text = tree.command("nvidia-modules")
    return NvidiaInstall(
        packages=packages,
        runfile_installed=exists is not None and "/usr/bin/nvidia-uninstall" in exists,
        loaded_version=version,
        loaded_flavour=flavour,
        module_files=None if modules_text is None else p.parse_nvidia_modules(modules_text),
    )


def _modprobe(tree: Tree) -> tuple[ModprobeDirective, ...]:
    directives: list[ModprobeDirective] = []
    for directory in MODPROBE_DIRS:
        for name in tree.list(directory):
            if name.endswith(".conf"):
                path = f"{directory}/{name}"
                directives.extend(p.parse_modprobe_conf(path, tree.read(path) or ""))
    return tuple(directives)


def _kernel_log(tree: Tree, status: dict[str, int]) -> KernelLog | None:
    text = tree.command("dmesg")
    if text is None or status.get("dmesg", 0) != 0:
        return None
    return KernelLog(tuple(text.splitlines()))


def _systemd_conf_texts(tree: Tree) -> list[str] | None:
    main = tree.read(rescue.SYSTEMD_CONF)
    dropins: dict[str, str] = {}
    for directory in rescue.SYSTEMD_CONF_DIRS:  # /etc after /usr/lib: a drop-in of the same name in /etc wins
        for name in tree.list(directory):
            text = tree.read(f"{directory}/{name}") if name.endswith(".conf") else None
            if text is not None:
                dropins[name] = text
    if main is None and not dropins:
        return None
    return [main or "", *(dropins[name] for name in sorted(dropins))]


def _rescue(tree: Tree, exists: frozenset[str] | None, command_status: dict[str, int]) -> rescue.RescueFacts | None:
    """The rescue facts of a snapshot; None where its gather did not read them (a snapshot taken
    before gather.sh listed the watchdogs, whose exit status is the mark)."""
    if "watchdogs" not in command_status or exists is None:
        return None
    listing = tree.command("watchdogs") if command_status.get("watchdogs") == 0 else ""
    watchdogs = tuple(
        rescue.Watchdog(
            name=name,
            identity=(tree.read(f"{rescue.WATCHDOG_CLASS}/{name}/identity") or "").strip() or None,
            timeout_s=rescue.parse_int(tree.read(f"{rescue.WATCHDOG_CLASS}/{name}/timeout")),
            active=None
            if (state := tree.read(f"{rescue.WATCHDOG_CLASS}/{name}/state")) is None
            else state.strip() == "active",
            nowayout=rescue.parse_flag(tree.read(f"{rescue.WATCHDOG_CLASS}/{name}/nowayout")),
        )
        for name in rescue.parse_watchdog_names(listing or "")
    )
    ipmi = next((device for device in rescue.IPMI_DEVICES if device in exists), None)
    read = {name: tree.read(f"/proc/sys/kernel/{name}") for name in rescue.KERNEL_PANIC_SETTINGS}
    kernel = rescue.KernelPanics(
        panic_s=rescue.parse_int(read["panic"]),
        panic_on_oops=rescue.parse_flag(read["panic_on_oops"]),
        softlockup_panic=rescue.parse_flag(read["softlockup_panic"]),
        hung_task_panic=rescue.parse_flag(read["hung_task_panic"]),
        hardlockup_panic=rescue.parse_flag(read["hardlockup_panic"]),
        hung_task_timeout_s=rescue.parse_int(read["hung_task_timeout_secs"]),
        watchdog_thresh_s=rescue.parse_int(read["watchdog_thresh"]),
        rcu_stall_panic=rescue.parse_flag(read["panic_on_rcu_stall"]),
        rcu_stall_timeout_s=rescue.parse_int(tree.read(rescue.RCU_STALL_TIMEOUT_PATH)),
    )
    texts = _systemd_conf_texts(tree)
    systemd = None if texts is None else rescue.parse_systemd_watchdogs(texts)
    return rescue.RescueFacts(
        watchdogs=watchdogs,
        ipmi_device=ipmi,
        kernel=kernel,
        systemd_runtime_watchdog_s=None if systemd is None else systemd["RuntimeWatchdogSec"],
        systemd_reboot_watchdog_s=None if systemd is None else systemd["RebootWatchdogSec"],
        ipmitool=next(
            (line.strip() for line in (tree.command("which") or "").splitlines() if line.strip().endswith("/ipmitool")),
            None,
        ),
    )
