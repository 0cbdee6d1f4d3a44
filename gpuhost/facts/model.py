"""What the audit knows about a host: typed, frozen facts built from a snapshot.

`None` always means "could not be read" (file missing, tool not installed, permission): an
unknown is a fact of its own and the checks say so, rather than guessing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property

from gpuhost.facts.pci import PciFunction
from gpuhost.facts.rescue import RescueFacts

# Sizes: /proc/meminfo and the huge page pools count KiB; 1 GiB pages are the pool "hugepages-1048576kB".
GIB_KIB = 1024 * 1024

MIB_BYTES = 1024 * 1024

GIB_BYTES = 1024 * GIB_KIB

# Host GPU driver modules: loaded, they hold the GPU before vfio-pci can (the audit's nvidia.loaded,
# the plan's reboot reasons, the verification after the reboot).
HOST_DRIVER_MODULES = ("nvidia", "nvidia_drm", "nvidia_modeset", "nvidia_uvm", "nouveau", "nvidiafb")

# NVIDIA Fabric Manager's packages (Ubuntu/CUDA repository names; the driver branch is a suffix).
FABRIC_MANAGER_PACKAGE_PREFIXES = ("nvidia-fabricmanager", "libnvidia-nscq", "nvlsm")

# What the initramfs must load for vfio-pci to claim the GPU before a host driver (vfio-pci as a module).
VFIO_INITRAMFS_MODULES = ("vfio", "vfio_iommu_type1", "vfio_pci")


@dataclass(frozen=True)
class CpuInfo:
    vendor: str | None  # GenuineIntel, AuthenticAMD
    model_name: str | None
    logical_cpus: int
    flags: frozenset[str]
    physical_address_bits: int | None = None  # 'address sizes: 46 bits physical' (None: not reported)
    family: int | None = None  # 'cpu family' (6 on Intel's cores, 25 on AMD Zen 4); None: not reported
    model: int | None = None  # 'model', the number (0x8f: Sapphire Rapids); None: not reported

    @property
    def has_virtualization(self) -> bool:
        return "vmx" in self.flags or "svm" in self.flags

    @property
    def is_virtual_machine(self) -> bool:
        return "hypervisor" in self.flags


@dataclass(frozen=True)
class KernelCommandLine:
    """/proc/cmdline or a GRUB variable, split the way the kernel splits it."""

    tokens: tuple[str, ...]

    def values(self, key: str) -> list[str]:
        """Every value given to `key` (`key=value`), in order; '' for a bare `key`."""
        found = []
        for token in self.tokens:
            name, sep, value = token.partition("=")
            if name == key:
                found.append(value if sep else "")
        return found

    def value(self, key: str) -> str | None:
        """The value the kernel uses: the last one given."""
        values = self.values(key)
        return values[-1] if values else None

    def has(self, key: str) -> bool:
        return bool(self.values(key))

    def list_value(self, key: str) -> tuple[str, ...]:
        """Comma-separated values of `key`, all occurrences joined (modprobe.blacklist, vfio-pci.ids)."""
        items: list[str] = []
        for value in self.values(key):
            items.extend(item for item in value.split(",") if item)
        return tuple(items)

    def __str__(self) -> str:
        return " ".join(self.tokens)


@dataclass(frozen=True)
class MemInfo:
    """/proc/meminfo, in KiB."""

    total_kib: int | None
    available_kib: int | None
    hugepages_total: int | None
    hugepages_free: int | None
    hugepage_size_kib: int | None
    hugetlb_kib: int | None


@dataclass(frozen=True)
class HugePagePool:
    """One huge page size, host-wide or on one NUMA node."""

    size_kib: int
    total: int | None
    free: int | None


@dataclass(frozen=True)
class NumaNode:
    node_id: int
    mem_total_kib: int | None
    cpulist: str | None
    hugepages: tuple[HugePagePool, ...]

    def pool(self, size_kib: int) -> HugePagePool | None:
        return next((p for p in self.hugepages if p.size_kib == size_kib), None)


@dataclass(frozen=True)
class Mount:
    source: str
    target: str
    fstype: str
    options: tuple[str, ...]


@dataclass(frozen=True)
class ModprobeDirective:
    """One line of a modprobe.d file that concerns the GPU drivers or vfio."""

    path: str
    line_number: int
    command: str  # blacklist, options, install, softdep, alias
    module: str
    arguments: str
    # The directive's lines as the file has them (a continued directive: each of its lines, joined
    # with newlines): what apply comments out, and checks is still there before it does.
    source: str = ""


# gpuhost's own GRUB drop-in (written by apply): the plan reads back the options it set there.
GPUHOST_GRUB_DROPIN = "/etc/default/grub.d/gpuhost.cfg"


@dataclass(frozen=True)
class GrubConfig:
    """GRUB's configuration as grub-mkconfig sees it (files sourced on the host by sh)."""

    present: bool  # /etc/default/grub exists
    syntax_error: str | None  # what `sh -n` said, when the file is not valid shell
    cmdline_linux: KernelCommandLine | None
    cmdline_linux_default: KernelCommandLine | None
    dropins: tuple[str, ...]  # /etc/default/grub.d/*.cfg, in the order they are sourced
    # The options gpuhost's drop-in (GPUHOST_GRUB_DROPIN) appends, as the last apply wrote them;
    # None where there is no such drop-in (or it is not in gpuhost's form).
    gpuhost_options: KernelCommandLine | None = None

    @property
    def effective(self) -> KernelCommandLine | None:
        """What update-grub puts on a normal boot entry: LINUX then LINUX_DEFAULT."""
        if self.cmdline_linux is None or self.cmdline_linux_default is None:
            return None
        return KernelCommandLine(self.cmdline_linux.tokens + self.cmdline_linux_default.tokens)


class TextEnum(str, Enum):
    """A closed set of strings (kinds, statuses, roles) that prints as its value, in messages and JSON."""

    def __str__(self) -> str:
        return str(self.value)


class BootloaderKind(TextEnum):
    """How the kernel command line is set on this host."""

    GRUB = "grub"
    SYSTEMD_BOOT = "systemd-boot"
    GRUBBY_BLS = "grubby"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Bootloader:
    kind: BootloaderKind
    efi: bool | None
    update_command: str | None  # update-grub, grub2-mkconfig, grubby, ...
    evidence: str  # why we think so
    # The programs that write systemd-boot's entries from /etc/kernel/cmdline, when installed.
    has_kernel_install: bool = False
    has_proxmox_boot_tool: bool = False


class Firmware(TextEnum):
    """What a machine boots from: a host (facts), a lab host (`lab up --firmware`) or a VM (VmSpec)."""

    UEFI = "uefi"
    BIOS = "bios"


class ActiveLoader(TextEnum):
    """The boot loader that started the running kernel (not the one a file suggests)."""

    SYSTEMD_BOOT = "systemd-boot"  # its LoaderInfo EFI variable says so
    SHIM_GRUB = "shim+grub-efi"  # GRUB on UEFI with shim on the ESP (the only way under Secure Boot)
    GRUB_EFI = "grub-efi"
    GRUB_BIOS = "grub-bios"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class LoaderEntry:
    """A Boot Loader Specification type 1 entry (loader/entries/*.conf), as systemd-boot reads it.

    Paths are as written: relative to the root of the partition holding the entry (the ESP).
    """

    title: str | None
    version: str | None
    sort_key: str | None  # entries with one sort before entries without (systemd 252's order)
    linux: str | None
    initrds: tuple[str, ...]  # every `initrd` line, in order (the loader loads them all)
    options: KernelCommandLine  # every `options` line joined, as systemd-boot joins them


@dataclass(frozen=True)
class LoaderEntryFile:
    """A loader entry as found on the host: where it lies and what it says."""

    path: str  # /boot/efi/loader/entries/debian-6.1.0-50-amd64.conf
    entry: LoaderEntry

    @property
    def id(self) -> str:
        """The entry's id as systemd-boot and `bootctl set-oneshot` name it: its file name."""
        return self.path.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class OutOfTreeModule:
    """A kernel module outside the kernel package (DKMS: updates/dkms, or extra/), and its signer."""

    path: str
    signer: str | None  # None: unsigned; the kernel refuses it when Secure Boot is enforcing

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1].split(".ko", 1)[0]


@dataclass(frozen=True)
class FirmwareFacts:
    """How the host booted: firmware, Secure Boot, the ESP, the loader and its command line file."""

    mode: Firmware | None  # None: unknown (the existence list could not be read)
    secure_boot: bool | None  # False on BIOS; None on UEFI when the SecureBoot variable is unreadable
    loader: ActiveLoader
    loader_info: str | None  # systemd-boot's LoaderInfo variable ("systemd-boot 252.30-1~deb12u2")
    loader_entry: str | None  # systemd-boot's LoaderEntrySelected: the entry that booted
    esp: str | None  # where the EFI system partition is mounted (/boot/efi, /efi, /boot)
    esp_binaries: tuple[str, ...]  # EFI programs on the ESP, relative to it (EFI/BOOT/BOOTX64.EFI)
    proxmox_boot_tool: bool  # /etc/kernel/proxmox-boot-uuids: proxmox-boot-tool syncs the ESPs
    cmdline_source: str | None  # the file the next boot's kernel command line is made from
    kernel_cmdline_file: KernelCommandLine | None  # /etc/kernel/cmdline (kernel-install, proxmox-boot-tool)
    out_of_tree_modules: tuple[OutOfTreeModule, ...] | None  # None: not listed
    # Boot Loader Specification entries on the ESP (/boot/efi, /efi) or /boot, sorted by path.
    loader_entries: tuple[LoaderEntryFile, ...] = ()
    loader_entry_oneshot: str | None = None  # LoaderEntryOneShot: booted once at the next boot
    loader_entry_default: str | None = None  # LoaderEntryDefault (bootctl set-default)

    def describe(self) -> str:
        """'UEFI, Secure Boot enabled, shim+grub-efi' style text for the audit."""
        if self.mode is None:
            return "firmware unknown"
        if self.mode is Firmware.BIOS:
            return f"BIOS, {self.loader}"
        secure = {True: "Secure Boot enabled", False: "Secure Boot disabled", None: "Secure Boot unknown"}
        return f"UEFI, {secure[self.secure_boot]}, {self.loader}"


@dataclass(frozen=True)
class Package:
    name: str
    version: str


class NvidiaFlavour(TextEnum):
    """Which of NVIDIA's two kernel module sources a driver is built from."""

    PROPRIETARY = "proprietary"  # license "NVIDIA"; /proc/driver/nvidia/version "NVIDIA UNIX x86_64 Kernel Module"
    OPEN = "open"  # license "Dual MIT/GPL"; "NVIDIA UNIX Open Kernel Module for x86_64" (default from branch 560)


class ModuleOrigin(TextEnum):
    """How an NVIDIA kernel module came to be in /lib/modules/<kernel>/, read from where it lies."""

    DKMS = "dkms"  # updates/dkms/: built by DKMS (nvidia-dkms-*, a .run install with --dkms)
    PRECOMPILED = "precompiled"  # kernel/nvidia-<branch>/: a distribution's package (Ubuntu's linux-modules-nvidia-*)
    OTHER = "other"  # kernel/drivers/video/ (NVIDIA's .run installer), extra/, updates/ by hand


# Modules of the kernel's own tree whose names start as NVIDIA's driver modules do: not the driver.
# Every other nvidia*.ko is (nvidia, nvidia-drm, ...; Debian's DKMS builds rename them nvidia-current*,
# nvidia-tesla-*). The gather lists files named nvidia.ko* and nvidia-*.ko*, which nvidiafb is not.
NVIDIA_IN_TREE_NAMESAKES = frozenset({"nvidiafb", "nvidia_wmi_ec_backlight"})


@dataclass(frozen=True)
class NvidiaModuleFile:
    """One NVIDIA driver module file of one installed kernel, and what modinfo says of it."""

    path: str  # /lib/modules/5.15.0-113-generic/kernel/nvidia-535/nvidia.ko
    version: str | None  # modinfo's version: 535.183.01 (None: not read)
    flavour: NvidiaFlavour | None  # from modinfo's license (None: not read, or neither license)
    signer: str | None  # None: unsigned, or not read

    @property
    def kernel(self) -> str:
        """The kernel release whose tree holds it: /lib/modules/<kernel>/..."""
        return self.path.split("/")[3]

    @property
    def name(self) -> str:
        """The module's name as the kernel spells it: nvidia_drm for nvidia-drm.ko."""
        return self.path.rsplit("/", 1)[-1].split(".ko", 1)[0].replace("-", "_")

    @property
    def origin(self) -> ModuleOrigin:
        relative = self.path.split("/", 4)[4] if self.path.count("/") >= 4 else ""
        if relative.startswith("updates/dkms/"):
            return ModuleOrigin.DKMS
        if re.match(r"kernel/nvidia-\d+[^/]*/", relative):
            return ModuleOrigin.PRECOMPILED
        return ModuleOrigin.OTHER


@dataclass(frozen=True)
class NvidiaInstall:
    """A host NVIDIA driver: from packages, from NVIDIA's .run installer, or loaded."""

    packages: tuple[Package, ...] | None  # None when no package database could be read
    runfile_installed: bool
    loaded_version: str | None  # /proc/driver/nvidia/version first line, when loaded
    loaded_flavour: NvidiaFlavour | None = None  # of the loaded driver (None: not loaded, or not said)
    # Every NVIDIA driver module file of every installed kernel (/lib/modules/*/), however it was
    # installed; None where the gather did not list them (a snapshot taken before it did).
    module_files: tuple[NvidiaModuleFile, ...] | None = None

    @property
    def installed(self) -> bool:
        return bool(self.packages) or self.runfile_installed or bool(self.module_files)

    @property
    def fabric_packages(self) -> tuple[Package, ...]:
        """Fabric Manager and what it needs (NSCQ; NVLSM on 4th-generation NVSwitches): an NVSwitch host's."""
        return tuple(p for p in self.packages or () if p.name.startswith(FABRIC_MANAGER_PACKAGE_PREFIXES))


@dataclass(frozen=True)
class KernelLog:
    """The lines of the kernel log the checks read (None when the log could not be read)."""

    lines: tuple[str, ...]

    def matching(self, *needles: str) -> list[str]:
        lowered = [n.lower() for n in needles]
        return [line for line in self.lines if any(n in line.lower() for n in lowered)]

    @property
    def iommu_address_bits(self) -> int | None:
        """The narrowest DMA address width of the Intel IOMMUs the kernel reported: MGAW (bits 21:16
        of each unit's capability register, 'DMAR: dmar0: ... cap d2008c22260286') plus one; None
        when no unit is reported (an AMD IOMMU, or the log was cut)."""
        widths = [((int(m.group(1), 16) >> 16) & 0x3F) + 1 for line in self.lines for m in _DMAR_CAP.finditer(line)]
        return min(widths) if widths else None

    def firmware_framebuffer_bars(self, address: str) -> tuple[str, ...]:
        """The BARs of the function at `address` that the kernel handed to the firmware framebuffer
        ('pci 0000:01:00.0: BAR 0: assigned to efifb'): which memory the framebuffer holds, for the
        boot-display finding (seen on a lab host under OVMF whose GOP was the stand-in GPU's)."""
        matches = (_EFIFB_BAR.search(line) for line in self.lines)
        return tuple(m.group(2) for m in matches if m is not None and m.group(1) == address)


_DMAR_CAP = re.compile(r"DMAR: dmar\d+: reg_base_addr \S+ ver \S+ cap ([0-9a-f]+) ecap")

_EFIFB_BAR = re.compile(r"pci ([0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]): BAR (\d+): assigned to efifb")


class VfioPci(TextEnum):
    """How the running kernel has vfio-pci."""

    BUILTIN = "builtin"
    MODULE = "module"
    ABSENT = "absent"


@dataclass(frozen=True)
class Modules:
    loaded: frozenset[str]  # /proc/modules
    builtin: frozenset[str] | None  # names from modules.builtin (None: unreadable)

    def is_loaded(self, name: str) -> bool:
        return name.replace("-", "_") in self.loaded


@dataclass(frozen=True)
class Initramfs:
    """The modules of interest found in the running kernel's initramfs (None: could not list)."""

    entries: tuple[str, ...] | None

    def has_module(self, name: str) -> bool | None:
        if self.entries is None:
            return None
        wanted = {f"{name}.ko", f"{name.replace('_', '-')}.ko"}
        return any(entry.rsplit("/", 1)[-1].split(".ko")[0] + ".ko" in wanted for entry in self.entries)


@dataclass(frozen=True)
class Iommu:
    dmar_table: bool | None  # Intel VT-d ACPI table
    ivrs_table: bool | None  # AMD-Vi ACPI table
    units: tuple[str, ...]  # /sys/class/iommu entries (dmar0, ivhd0, ...)
    groups: dict[int, tuple[str, ...]]  # group -> member addresses
    group_types: dict[int, str]  # DMA, DMA-FQ, identity, ...
    # Group names (a /sys/kernel/iommu_groups directory, or a function's iommu_group link) that are
    # not plain ASCII digits ('+6', '٦'): the kernel never writes them, so every group is unknown.
    malformed_names: tuple[str, ...] = ()

    @property
    def firmware_present(self) -> bool | None:
        if self.dmar_table is None and self.ivrs_table is None:
            return None
        return bool(self.dmar_table or self.ivrs_table)

    @property
    def active(self) -> bool:
        return bool(self.groups)


@dataclass(frozen=True)
class VirtualizationSoftware:
    """The host's libvirt, QEMU and OVMF, as package versions (None: not installed)."""

    libvirt: str | None  # libvirt-daemon
    qemu: str | None  # qemu-system-x86 (Debian), qemu-kvm (RHEL)
    ovmf: str | None  # ovmf (Debian), edk2-ovmf (RHEL)

    @property
    def libvirt_release(self) -> tuple[int, int] | None:
        """(8, 0) from '8.0.0-1ubuntu7.10'; None when not installed."""
        match = re.match(r"(?:\d+:)?(\d+)\.(\d+)", self.libvirt or "")
        return (int(match.group(1)), int(match.group(2))) if match else None

    @property
    def qemu_release(self) -> tuple[int, int] | None:
        """(7, 2) from Debian's '1:7.2+dfsg-7+deb12u18+b3' or RHEL's '8.2.0-11.el9'; None when not installed."""
        match = re.match(r"(?:\d+:)?(\d+)\.(\d+)", self.qemu or "")
        return (int(match.group(1)), int(match.group(2))) if match else None

    @property
    def ovmf_release(self) -> int | None:
        """The edk2 stable tag as YYYYMM: 202211 from Debian's '2022.11-6+deb12u2', 202202 from Ubuntu's
        '2022.02-3ubuntu0.22.04.2', 201911 from '0~20191122.bd85bf54-2ubuntu3', 202305 from RHEL's
        '20230524-4.el9'; None when not installed or not of these forms."""
        match = re.search(r"(20\d\d)\.?(\d\d)", self.ovmf or "")
        return int(match.group(1) + match.group(2)) if match else None


NCCL_CONF = "/etc/nccl.conf"
NCCL_GUEST_TOPOLOGY = "/etc/gpuhost/nccl-topology.xml"  # where `gpuhost guest up` installs the VM's file
# Where NCCL looks for a topology file when NCCL_TOPO_FILE is not set (src/graph/topo.cc).
NCCL_DEFAULT_TOPOLOGY = "/var/run/nvidia-topologyd/virtualTopology.xml"


@dataclass(frozen=True)
class NcclTopologyFile:
    """The NCCL topology file NCCL will read on this machine (as root, without NCCL_TOPO_FILE in
    its environment or ~/.nccl.conf), as the gather found it."""

    path: str
    named_in: str | None  # NCCL_CONF (its NCCL_TOPO_FILE line); None: NCCL's default path
    gpus: dict[str, int] | None  # the bus IDs of its GPU <pci> nodes -> their <cpu>'s numaid; None: see error
    error: str | None  # why gpus is None: missing or unreadable, or not an NCCL topology


@dataclass(frozen=True)
class HostFacts:
    """Everything the audit read from one host."""

    hostname: str | None
    kernel_release: str | None
    os_pretty_name: str | None
    running_as_root: bool | None
    cpu: CpuInfo | None
    cmdline: KernelCommandLine | None
    memory: MemInfo | None
    hugepage_pools: tuple[HugePagePool, ...]
    numa_nodes: tuple[NumaNode, ...]
    mounts: tuple[Mount, ...] | None
    pci: tuple[PciFunction, ...]
    iommu: Iommu
    modules: Modules | None
    vfio_pci: VfioPci | None  # None: unknown
    vfio_pci_module_ids: tuple[str, ...] | None  # /sys/module/vfio_pci/parameters/ids
    initramfs: Initramfs
    grub: GrubConfig
    bootloader: Bootloader
    firmware: FirmwareFacts
    nvidia: NvidiaInstall
    modprobe: tuple[ModprobeDirective, ...]
    kernel_log: KernelLog | None
    dmi_vendor: str | None
    dmi_product: str | None
    virtualization: VirtualizationSoftware | None = None  # None: no package database could be read
    # Logical CPU -> the logical CPUs of its core, itself included (SMT siblings); {}: not captured.
    thread_siblings: dict[int, tuple[int, ...]] = field(default_factory=dict)
    # What can reset the host when a boot hangs (watchdogs, the BMC); None: not gathered.
    rescue: RescueFacts | None = None
    xorg_conf: bool | None = None  # /etc/X11/xorg.conf exists (None: unknown)
    nccl_topology: NcclTopologyFile | None = None  # None: none named in NCCL_CONF and none at the default path
    machine: str | None = None  # the architecture, `uname -m`'s (x86_64, aarch64); None: unknown

    def function(self, address: str) -> PciFunction | None:
        return self._functions_by_address.get(address)

    @cached_property
    def _functions_by_address(self) -> dict[str, PciFunction]:
        # Looked up once per group member per GPU: a scan of `pci` each time made a host with
        # hundreds of GPUs in one group cubic (issue 13 class 13). The first of a duplicate wins, as before.
        index: dict[str, PciFunction] = {}
        for function in self.pci:
            index.setdefault(function.address, function)
        return index

    def hugepage_pool(self, size_kib: int) -> HugePagePool | None:
        return next((p for p in self.hugepage_pools if p.size_kib == size_kib), None)
