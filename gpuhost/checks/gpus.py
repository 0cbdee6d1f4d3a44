"""Each GPU to be passed through: its IOMMU group, driver, vfio-pci binding, reset, link, BARs, NUMA."""

from __future__ import annotations

from collections.abc import Iterator

from gpuhost.checks.base import CheckContext, Finding, Severity, class_name, describe_function
from gpuhost.facts.model import PciFunction
from gpuhost.selection import GpuCard, functions_to_bind, group_members

ERROR, WARNING, INFO = Severity.ERROR, Severity.WARNING, Severity.INFO

VFIO_DRIVER = "vfio-pci"
HOST_GPU_DRIVERS = frozenset({"nvidia", "nouveau", "nvidiafb", "snd_hda_intel", "xhci_hcd", "i2c-nvidia-gpu"})
GIB = 1024**3
MIB = 1024**2


def check_gpu_presence(ctx: CheckContext) -> Iterator[Finding]:
    selection = ctx.selection
    for function in selection.other_nvidia:
        yield ctx.finding(
            "gpu.other_nvidia",
            INFO,
            function.address,
            f"{describe_function(function)} is an NVIDIA function that is not a GPU (e.g. an NVSwitch); "
            "it is reported, not treated as a GPU",
        )
    if selection.passthrough:
        return
    if not selection.kept:
        yield ctx.finding(
            "gpu.none",
            ERROR,
            "GPUs",
            "no GPU (PCI class 0300 or 0302) is on this host's PCI bus",
            "Check that the cards are seated and powered (lspci should list them), or audit the right host.",
        )
        return
    kept = ", ".join(describe_function(card.gpu) for card in selection.kept)
    yield ctx.finding(
        "gpu.none_selected",
        ERROR,
        "GPUs",
        f"no GPU is selected for passthrough ({ctx.policy.gpus.describe()}); the GPUs found are {kept}",
        "Name the GPUs to pass through with gpuhost_gpus (addresses or vendor:device IDs) in the inventory "
        "or --gpus; a GPU with boot_vga=1 is the host's console and is never selected by 'all'.",
    )


def check_gpu_cards(ctx: CheckContext) -> Iterator[Finding]:
    for card in ctx.selection.passthrough:
        yield from _check_group(ctx, card)
        yield from _check_binding(ctx, card)
        yield from _check_reset(ctx, card.gpu)
        yield from check_link(ctx, card.gpu)
        yield from _check_bars(ctx, card.gpu)
        yield from check_numa(ctx, card.gpu)
        yield from _check_boot_display(ctx, card.gpu)
    yield from _check_kept_gpus(ctx)


def _check_group(ctx: CheckContext, card: GpuCard) -> Iterator[Finding]:
    gpu = card.gpu
    if not ctx.facts.iommu.active:
        return  # check_iommu already says there are no groups at all
    if gpu.iommu_group is None:
        yield ctx.finding(
            "gpu.group.missing",
            ERROR,
            gpu.address,
            f"GPU {gpu.describe()} is in no IOMMU group",
            "Check that the IOMMU covers this PCIe root port (kernel log: DMAR/AMD-Vi lines).",
        )
        return
    own = {f.address for f in card.functions}
    members = group_members(ctx.facts, gpu)
    other_gpus = [m for m in members if m.is_gpu and m.address not in own]
    intruders = [m for m in members if m.address not in own and not m.is_bridge and not m.is_gpu]
    allowed = gpu.address in ctx.policy.allow_shared_group
    for intruder in intruders:
        yield ctx.finding(
            "gpu.group.intruder",
            WARNING if allowed else ERROR,
            gpu.address,
            f"GPU {gpu.describe()} shares IOMMU group {gpu.iommu_group} with {describe_function(intruder)}, "
            "which is neither one of the card's functions nor a bridge: the whole group goes to the guest together"
            + (" (allowed by gpuhost_allow_shared_group)" if allowed else ""),
            "Move the card to a slot behind its own PCIe root port (or another CPU root complex); "
            "list the GPU in gpuhost_allow_shared_group only if giving the guest that device too is acceptable.",
        )
    if other_gpus:
        names = ", ".join(m.describe() for m in other_gpus)
        yield ctx.finding(
            "gpu.group.shared",
            ERROR,
            gpu.address,
            f"GPU {gpu.describe()} shares IOMMU group {gpu.iommu_group} with other GPU(s) {names}: "
            "they can only be passed through together, to one guest",
            "Place the GPUs behind separate PCIe root ports (check ACS support of the switch/root port).",
        )
    if not intruders and not other_gpus:
        names = ", ".join(f.address for f in members)
        yield ctx.finding(
            "gpu.group.clean",
            INFO,
            gpu.address,
            f"GPU {gpu.describe()} is isolated: IOMMU group {gpu.iommu_group} holds only {names}",
        )


def _check_binding(ctx: CheckContext, card: GpuCard) -> Iterator[Finding]:
    facts = ctx.facts
    cmdline_ids = set(facts.cmdline.list_value("vfio-pci.ids")) if facts.cmdline else set()
    modprobe_ids = {
        item
        for directive in facts.modprobe
        if directive.command == "options" and directive.module == "vfio_pci"
        for word in directive.arguments.split()
        if word.startswith("ids=")
        for item in word[4:].split(",")
        if item
    }
    for function in functions_to_bind(facts, card):
        if function.driver == VFIO_DRIVER:
            pass
        elif function.driver is None:
            yield ctx.finding(
                "gpu.driver",
                WARNING,
                function.address,
                f"{describe_function(function)} has no driver bound: vfio-pci has not claimed it",
                "Bind it to vfio-pci early: vfio-pci.ids on the kernel command line (gpuhost apply does this).",
            )
        else:
            yield ctx.finding(
                "gpu.driver",
                ERROR,
                function.address,
                f"{describe_function(function)} is bound to the host driver {function.driver}, not vfio-pci: "
                "it is not ready for passthrough",
                "Bind it to vfio-pci at boot: vfio-pci.ids on the kernel command line, vfio modules in the "
                "initramfs, the host driver blacklisted (gpuhost apply).",
            )
        covered_by_override = function.driver_override == VFIO_DRIVER
        if function.vendor_device in cmdline_ids or covered_by_override:
            continue
        if function.vendor_device in modprobe_ids:
            yield ctx.finding(
                "gpu.vfio_ids.modprobe_only",
                WARNING,
                function.address,
                f"{function.describe()} is bound to vfio-pci only through 'options vfio-pci ids=' in modprobe.d, "
                "which takes effect only if vfio-pci loads before the host driver",
                f"Put {function.vendor_device} in vfio-pci.ids on the kernel command line instead.",
            )
            continue
        yield ctx.finding(
            "gpu.vfio_ids.missing",
            ERROR,
            function.address,
            f"vfio-pci.ids on the kernel command line does not cover {describe_function(function)}, "
            "so after a reboot a host driver can claim it",
            f"Add {function.vendor_device} to vfio-pci.ids on the kernel command line (gpuhost apply).",
        )


def _check_kept_gpus(ctx: CheckContext) -> Iterator[Finding]:
    cmdline = ctx.facts.cmdline
    if cmdline is None:
        return
    ids = set(cmdline.list_value("vfio-pci.ids"))
    passthrough_ids = {f.vendor_device for card in ctx.selection.passthrough for f in card.functions}
    for card in ctx.selection.kept:
        reason = "is the host's boot display (boot_vga=1)" if card.gpu.boot_vga else "is not selected for passthrough"
        for function in card.functions:
            if function.vendor_device in ids:
                shared = function.vendor_device in passthrough_ids
                yield ctx.finding(
                    "gpu.vfio_ids.captures_kept",
                    ERROR,
                    function.address,
                    f"vfio-pci.ids={','.join(sorted(ids))} also takes {describe_function(function)}, which {reason}",
                    "Bind the passthrough GPUs by address (driver_override) instead of by ID"
                    if shared
                    else f"Remove {function.vendor_device} from vfio-pci.ids, or select this GPU for passthrough.",
                )


def _check_reset(ctx: CheckContext, gpu: PciFunction) -> Iterator[Finding]:
    methods = gpu.reset_methods
    if methods is None:
        yield ctx.finding(
            "gpu.reset.unknown",
            INFO,
            gpu.address,
            f"{gpu.describe()}: reset_method could not be read (kernels before 5.15 do not publish it)",
        )
    elif "flr" not in methods:
        how = f"only {', '.join(methods)}" if methods else "none"
        yield ctx.finding(
            "gpu.reset",
            WARNING,
            gpu.address,
            f"{gpu.describe()} has no function-level reset (reset methods: {how}): after a guest stops, the "
            "card may not come back in a clean state (the 'reset bug')",
            "Prefer cards with FLR; stop guests cleanly, and reboot the host if a GPU stops appearing to guests.",
        )


def check_link(ctx: CheckContext, gpu: PciFunction) -> Iterator[Finding]:
    link = gpu.link
    if link.current_width is None or link.max_width is None:
        if gpu.parents or link.current_speed_gts is not None:
            yield ctx.finding(
                "gpu.link.unknown", INFO, gpu.address, f"{gpu.describe()}: the PCIe link width could not be read"
            )
        return
    if link.current_width < link.max_width:
        yield ctx.finding(
            "gpu.link.width",
            ERROR,
            gpu.address,
            f"{gpu.describe()} link trained at x{link.current_width} of x{link.max_width} "
            f"({link.describe()}): the card gets a fraction of its host bandwidth",
            "Reseat the card, check the riser/slot wiring and the BIOS lane bifurcation settings.",
        )
    elif (
        link.current_speed_gts is not None
        and link.max_speed_gts is not None
        and link.current_speed_gts < link.max_speed_gts
    ):
        yield ctx.finding(
            "gpu.link.speed",
            INFO,
            gpu.address,
            f"{gpu.describe()} link runs at {link.describe()}: GPUs lower the link speed when idle, "
            "so check it again under load (gpuhost smoke-test does)",
        )
    else:
        yield ctx.finding("gpu.link", INFO, gpu.address, f"{gpu.describe()} link {link.describe()}")


def _check_bars(ctx: CheckContext, gpu: PciFunction) -> Iterator[Finding]:
    prefetchable = [bar for bar in gpu.bars if bar.is_prefetchable]
    if not prefetchable:
        return
    largest = max(prefetchable, key=lambda bar: bar.size)
    yield ctx.finding(
        "gpu.bar",
        INFO,
        gpu.address,
        f"{gpu.describe()} BAR{largest.index} is {_size(largest.size)}"
        + (" (64-bit)" if largest.is_64bit else " (32-bit)"),
    )
    sizes = gpu.resizable_bar_sizes.get(largest.index)
    if sizes:
        # resourceN_resize: bit n set means a size of 2^n MiB is supported.
        supported = (1 << (sizes.bit_length() - 1)) * MIB
        if supported > largest.size:
            yield ctx.finding(
                "gpu.rebar",
                WARNING,
                gpu.address,
                f"{gpu.describe()} supports a {_size(supported)} BAR{largest.index} (Resizable BAR) but has "
                f"{_size(largest.size)}",
                "Enable 'Above 4G decoding' and 'Resizable BAR' in the firmware; add pci=realloc if BARs fail to fit.",
            )


def check_numa(ctx: CheckContext, gpu: PciFunction) -> Iterator[Finding]:
    nodes = ctx.facts.numa_nodes
    if gpu.numa_node is None:
        return
    if gpu.numa_node < 0:
        if len(nodes) > 1:
            yield ctx.finding(
                "gpu.numa",
                WARNING,
                gpu.address,
                f"{gpu.describe()} reports no NUMA node on a host with {len(nodes)} nodes",
                "Check the firmware's ACPI SRAT/_PXM tables (BIOS update); pin guests by hand meanwhile.",
            )
        return
    node = next((n for n in nodes if n.node_id == gpu.numa_node), None)
    message = f"{gpu.describe()} is on NUMA node {gpu.numa_node}"
    if gpu.local_cpulist:
        message += f" (CPUs {gpu.local_cpulist})"
    pool = node.pool(1048576) if node else None
    host_pool = ctx.facts.hugepage_pool(1048576)
    if host_pool and host_pool.total and pool is not None and not pool.total:
        yield ctx.finding(
            "gpu.numa.hugepages",
            WARNING,
            gpu.address,
            f"{message}, but none of the host's {host_pool.total} 1 GiB pages are on that node: "
            "a guest with this GPU gets remote memory",
            "Split the 1 GiB pages across the GPUs' NUMA nodes (gpuhost apply does).",
        )
    else:
        yield ctx.finding("gpu.numa", INFO, gpu.address, message)


def _check_boot_display(ctx: CheckContext, gpu: PciFunction) -> Iterator[Finding]:
    if not gpu.boot_vga:
        return
    log = ctx.facts.kernel_log
    holders = []
    if log is not None:
        for name in ("efifb", "simpledrm", "vesafb"):
            if log.matching(name):
                holders.append(name)
    held = f"; the kernel log shows {', '.join(holders)} in use" if holders else ""
    yield ctx.finding(
        "gpu.boot_display",
        WARNING,
        gpu.address,
        f"{gpu.describe()} is the boot display (boot_vga=1){held}: the firmware framebuffer can hold its "
        "memory and the guest may fail to initialize it",
        "Give the host another console (BMC/onboard VGA), or add video=efifb:off / initcall_blacklist=simpledrm "
        "and nomodeset.",
    )


def _size(size: int) -> str:
    if size >= GIB:
        return f"{size / GIB:g} GiB"
    return f"{size / MIB:g} MiB"


def gpu_function_summary(gpu: PciFunction) -> str:
    return f"{gpu.describe()} {class_name(gpu.base_class)}"
