"""A host's PCI functions as read from sysfs: class codes, BARs, PCIe link status (typed, frozen; None = unknown)."""

from __future__ import annotations

from dataclasses import dataclass, field

# PCI class codes (base class and subclass, the upper 16 bits of the 24-bit class).
CLASS_VGA = 0x0300

CLASS_3D = 0x0302

CLASS_DISPLAY_OTHER = 0x0380

CLASS_AUDIO_HDA = 0x0403

CLASS_HOST_BRIDGE = 0x0600

CLASS_PCI_BRIDGE = 0x0604

CLASS_BRIDGE_OTHER = 0x0680  # "Bridge [0680]": what an NVSwitch reports (HGX/DGX baseboards)

CLASS_USB = 0x0C03

CLASS_SERIAL_BUS_OTHER = 0x0C80  # NVIDIA's USB Type-C UCSI controller on consumer cards

VENDOR_NVIDIA = 0x10DE

GPU_CLASSES = frozenset({CLASS_VGA, CLASS_3D})

# A display controller (0380) leads a card of its own where its slot has no VGA or 3D function:
# AMD Instinct MI100/MI200 and Intel's Data Center GPU Max report that class. Beside a VGA or 3D
# function it is that card's secondary display, a companion.
LONE_GPU_CLASSES = frozenset({CLASS_DISPLAY_OTHER})

BRIDGE_CLASSES = frozenset({CLASS_HOST_BRIDGE, CLASS_PCI_BRIDGE})

# Functions a graphics card carries beside its display function.
GPU_COMPANION_CLASSES = frozenset({CLASS_AUDIO_HDA, CLASS_USB, CLASS_SERIAL_BUS_OTHER, CLASS_DISPLAY_OTHER})

# Link speed in GT/s -> PCIe generation.
PCIE_GENERATION_BY_SPEED = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}


@dataclass(frozen=True)
class Bar:
    """One base address register from the `resource` file."""

    index: int
    start: int
    end: int
    flags: int

    @property
    def size(self) -> int:
        return self.end - self.start + 1 if self.end > self.start else 0

    @property
    def is_memory(self) -> bool:
        return bool(self.flags & 0x00000200)  # IORESOURCE_MEM (I/O port BARs carry IORESOURCE_IO)

    @property
    def is_64bit(self) -> bool:
        return bool(self.flags & 0x00100000)  # IORESOURCE_MEM_64

    @property
    def is_prefetchable(self) -> bool:
        return bool(self.flags & 0x00002000)  # IORESOURCE_PREFETCH


@dataclass(frozen=True)
class PcieLinkStatus:
    """A function's PCIe link as sysfs reports it: trained (current_*) and capable (max_*) speed and width."""

    current_speed_gts: float | None
    current_width: int | None
    max_speed_gts: float | None
    max_width: int | None

    @property
    def current_generation(self) -> int | None:
        return _generation(self.current_speed_gts)

    @property
    def max_generation(self) -> int | None:
        return _generation(self.max_speed_gts)

    @property
    def known(self) -> bool:
        return any(v is not None for v in (self.current_speed_gts, self.current_width, self.max_speed_gts))

    def describe(self) -> str:
        """'Gen5 x16' style text of the current link, with the maximum when it differs."""
        if not self.known:
            return "no PCIe link"  # a conventional PCI function, or attributes not captured
        current = _describe_link(self.current_generation, self.current_speed_gts, self.current_width)
        maximum = _describe_link(self.max_generation, self.max_speed_gts, self.max_width)
        if current == maximum:
            return current
        return f"{current} (max {maximum})"


def _generation(speed: float | None) -> int | None:
    return None if speed is None else PCIE_GENERATION_BY_SPEED.get(speed)


def _describe_link(generation: int | None, speed: float | None, width: int | None) -> str:
    if generation is not None:
        speed_text = f"Gen{generation}"
    elif speed is not None:
        speed_text = f"{speed:g} GT/s"
    else:
        speed_text = "Gen?"
    return f"{speed_text} x{width if width is not None else '?'}"


@dataclass(frozen=True)
class PciFunction:
    address: str  # domain:bus:device.function, e.g. 0000:41:00.0
    vendor: int | None
    device: int | None
    subsystem_vendor: int | None
    subsystem_device: int | None
    class_code: int | None  # 24-bit, e.g. 0x030200
    revision: int | None
    driver: str | None  # None when no driver is bound (or unknown)
    driver_override: str | None
    iommu_group: int | None
    numa_node: int | None  # None when unknown; -1 (no NUMA information) is kept as -1
    local_cpulist: str | None
    link: PcieLinkStatus
    reset_methods: tuple[str, ...] | None
    bars: tuple[Bar, ...]
    resizable_bar_sizes: dict[int, int] = field(default_factory=dict)  # BAR index -> supported sizes bitmask
    boot_vga: bool | None = None
    d3cold_allowed: bool | None = None
    parents: tuple[str, ...] = ()  # upstream bridges, nearest first
    # A driver link was recorded but names no driver (an empty record, a directory, a FIFO): whether
    # a driver holds the function is unknown, which is never read as "no driver" (driver is None).
    driver_unknown: bool = False

    @property
    def base_class(self) -> int | None:
        """The class and subclass (0x0300), without the programming interface."""
        return None if self.class_code is None else self.class_code >> 8

    @property
    def vendor_device(self) -> str:
        """'10de:2330', the form vfio-pci.ids and lspci -nn use."""
        return f"{_hex4(self.vendor)}:{_hex4(self.device)}"

    @property
    def slot(self) -> str:
        """The address without the function number: functions of one card share it."""
        return self.address.rsplit(".", 1)[0]

    @property
    def is_gpu(self) -> bool:
        return self.base_class in GPU_CLASSES

    @property
    def is_bridge(self) -> bool:
        return self.base_class in BRIDGE_CLASSES

    @property
    def is_nvswitch(self) -> bool:
        """An NVIDIA function of class 0x0680: an NVSwitch of an HGX/DGX baseboard (10de:22a3 on H100/H200)."""
        return self.vendor == VENDOR_NVIDIA and self.base_class == CLASS_BRIDGE_OTHER

    def describe(self) -> str:
        return f"{self.address} [{self.vendor_device}]"


def _hex4(value: int | None) -> str:
    return "????" if value is None else f"{value:04x}"
