"""Each GPU to be passed through: its IOMMU group, driver, vfio-pci binding, reset, link, BARs, NUMA."""

from __future__ import annotations

from collections.abc import Iterator

from gpuhost.checks.base import CheckContext, class_name, describe_function
from gpuhost.facts.model import GIB_BYTES, GIB_KIB, MIB_BYTES
from gpuhost.facts.pci import PciFunction
from gpuhost.passthrough import GpuCard, GroupListing, analyse_group
from gpuhost.problems import Problem, Severity, Stage, listed, register
from gpuhost.selection import NvSwitchModel, nvswitch_functions_to_bind

ERROR, WARNING, INFO = Severity.ERROR, Severity.WARNING, Severity.INFO

GPU_OTHER_NVIDIA = register(
    "gpu.other_nvidia",
    Stage.AUDIT,
    Severity.INFO,
    "NVIDIA functions that are neither GPUs nor NVSwitches: reported, not passed",
)
GPU_NVSWITCH = register(
    "gpu.nvswitch",
    Stage.AUDIT,
    Severity.INFO,
    "an NVSwitch (HGX/DGX baseboard): its IOMMU group, driver, and where it goes (NVIDIA's virtualization model)",
)
GPU_NVSWITCH_SHARED = register(
    "gpu.nvswitch.shared",
    Stage.AUDIT,
    Severity.ERROR,
    "NVSwitch host with some GPUs selected and others kept: the shared NVSwitch model is not supported",
)
GPU_NVSWITCH_DRIVER = register(
    "gpu.nvswitch.driver",
    Stage.AUDIT,
    Severity.ERROR,
    "full passthrough, but an NVSwitch (or a function of its IOMMU group) is not on vfio-pci",
)
GPU_NONE = register("gpu.none", Stage.AUDIT, Severity.ERROR, "no GPU on the PCI bus")
GPU_NONE_SELECTED = register(
    "gpu.none_selected", Stage.AUDIT, Severity.ERROR, "GPUs on the bus, but none selected for passthrough"
)
GPU_GROUP_MISSING = register("gpu.group.missing", Stage.AUDIT, Severity.ERROR, "the GPU is in no IOMMU group")
GPU_GROUP_UNKNOWN = register(
    "gpu.group.unknown",
    Stage.AUDIT,
    Severity.ERROR,
    "the GPU's IOMMU group listing is empty or unreadable, or names a device not on the bus: isolation unknown",
)
GPU_GROUP_INTRUDER = register(
    "gpu.group.intruder",
    Stage.AUDIT,
    None,
    "a device in the GPU's IOMMU group is neither its function nor a bridge (warning if gpuhost_allow_shared_group)",
)
GPU_GROUP_SHARED = register(
    "gpu.group.shared",
    Stage.AUDIT,
    None,
    "several GPUs in one IOMMU group: a warning when all of them are selected (the whole group goes to one "
    "guest), an error when the host keeps one of them",
)
GPU_GROUP_CLEAN = register(
    "gpu.group.clean", Stage.AUDIT, Severity.INFO, "the GPU's IOMMU group holds only its functions and bridges"
)
GPU_DRIVER = register(
    "gpu.driver", Stage.AUDIT, None, "a function on nvidia/nouveau/snd_hda_intel/... (error) or on no driver (warning)"
)
GPU_DRIVER_UNKNOWN = register(
    "gpu.driver.unknown",
    Stage.AUDIT,
    Severity.ERROR,
    "a passed function's driver link was recorded but is unreadable: its binding is unknown",
)
GPU_VFIO_IDS_MODPROBE_ONLY = register(
    "gpu.vfio_ids.modprobe_only", Stage.AUDIT, Severity.WARNING, "only `options vfio-pci ids=` in modprobe.d binds it"
)
GPU_VFIO_IDS_MISSING = register(
    "gpu.vfio_ids.missing", Stage.AUDIT, Severity.ERROR, "`vfio-pci.ids` does not cover a function of the group"
)
GPU_VFIO_IDS_CAPTURES_KEPT = register(
    "gpu.vfio_ids.captures_kept",
    Stage.AUDIT,
    Severity.ERROR,
    "`vfio-pci.ids` also takes a GPU the host keeps (boot display or not selected)",
)
GPU_RESET_UNKNOWN = register(
    "gpu.reset.unknown", Stage.AUDIT, Severity.INFO, "reset_method unreadable (kernels before 5.15)"
)
GPU_RESET = register("gpu.reset", Stage.AUDIT, Severity.WARNING, 'no FLR among the reset methods (the "reset bug")')
GPU_LINK_UNKNOWN = register("gpu.link.unknown", Stage.AUDIT, Severity.INFO, "the PCIe link width is unreadable")
GPU_LINK_WIDTH = register("gpu.link.width", Stage.AUDIT, Severity.ERROR, "the link trained below its maximum width")
GPU_LINK_UPSTREAM_WIDTH = register(
    "gpu.link.upstream_width",
    Stage.AUDIT,
    Severity.ERROR,
    "a bridge above the GPU (a PCIe switch's upstream link) trained below its maximum width",
)
GPU_LINK_SPEED = register(
    "gpu.link.speed", Stage.AUDIT, Severity.INFO, "the link runs below its maximum speed (GPUs lower it at idle)"
)
GPU_LINK = register("gpu.link", Stage.AUDIT, Severity.INFO, "the link's speed and width, at their maximum")
GPU_BAR = register("gpu.bar", Stage.AUDIT, Severity.INFO, "the size of the GPU's largest prefetchable BAR")
GPU_REBAR = register("gpu.rebar", Stage.AUDIT, Severity.WARNING, "Resizable BAR supported but not used")
GPU_NUMA = register(
    "gpu.numa", Stage.AUDIT, None, "the GPU's NUMA node (info), or none reported on a multi-node host (warning)"
)
GPU_NUMA_HUGEPAGES = register(
    "gpu.numa.hugepages", Stage.AUDIT, Severity.WARNING, "no 1 GiB pages on the GPU's NUMA node"
)
GPU_BOOT_DISPLAY = register(
    "gpu.boot_display", Stage.AUDIT, Severity.WARNING, "the GPU is the boot display (efifb/simpledrm)"
)

VFIO_DRIVER = "vfio-pci"


def check_gpu_presence(ctx: CheckContext) -> Iterator[Problem]:
    selection = ctx.selection
    for function in selection.other_nvidia:
        yield ctx.finding(
            GPU_OTHER_NVIDIA,
            INFO,
            function.address,
            f"{describe_function(function)} is an NVIDIA function that is neither a GPU nor an NVSwitch; "
            "it is reported, not treated as a GPU",
        )
    if selection.passthrough:
        return
    if not selection.kept:
        yield ctx.finding(
            GPU_NONE,
            ERROR,
            "GPUs",
            "no GPU (PCI class 0300 or 0302) is on this host's PCI bus",
            "Check that the cards are seated and powered (lspci should list them), or audit the right host.",
        )
        return
    kept = listed(describe_function(card.gpu) for card in selection.kept)
    yield ctx.finding(
        GPU_NONE_SELECTED,
        ERROR,
        "GPUs",
        f"no GPU is selected for passthrough ({ctx.policy.gpus.describe()}); the GPUs found are {kept}",
        "Name the GPUs to pass through with gpuhost_gpus (addresses or vendor:device IDs) in the inventory "
        "or --gpus; a GPU with boot_vga=1 is the host's console and is never selected by 'all'.",
    )


def check_nvswitches(ctx: CheckContext) -> Iterator[Problem]:
    """NVSwitch functions (an HGX/DGX baseboard), and whether the GPU selection fits NVIDIA's full
    passthrough model: every GPU and every NVSwitch to vfio-pci, for one VM that runs Fabric Manager."""
    selection = ctx.selection
    model = selection.nvswitch_model
    if model is NvSwitchModel.NONE:
        return
    fabric = ctx.facts.nvidia.fabric_packages
    installed = ", ".join(f"{p.name} {p.version}" for p in fabric) or "no Fabric Manager package"
    where = {
        NvSwitchModel.BARE_METAL: "it stays on the host (no NVIDIA GPU is selected), whose Fabric Manager manages it",
        NvSwitchModel.FULL_PASSTHROUGH: "it goes to vfio-pci with every GPU, for the one VM that takes all GPUs "
        "(NVIDIA's full passthrough model; the guest runs nvidia-fabricmanager of its driver branch)",
        NvSwitchModel.SHARED: "some GPUs are selected and others kept (the shared NVSwitch model, not supported)",
    }[model]
    for nvswitch in selection.nvswitches:
        group = f"IOMMU group {nvswitch.iommu_group}" if nvswitch.iommu_group is not None else "no IOMMU group"
        yield ctx.finding(
            GPU_NVSWITCH,
            INFO,
            nvswitch.address,
            f"NVSwitch {describe_function(nvswitch)} in {group}: {where}; host packages: {installed}",
        )
    if model is NvSwitchModel.SHARED:
        kept = listed(card.gpu.address for card in selection.kept_nvidia)
        yield ctx.finding(
            GPU_NVSWITCH_SHARED,
            ERROR,
            "NVSwitch",
            f"this host has {len(selection.nvswitches)} NVSwitch(es) and "
            f"{len(selection.passthrough_nvidia)} GPU(s) are selected while it keeps the NVIDIA GPU(s) {kept}: "
            "the GPUs share one NVLink fabric, which only NVIDIA's shared NVSwitch model (a Fabric Manager "
            "in a service VM partitioning the NVSwitches) can split; "
            "gpuhost does not support it",
            "Select every NVIDIA GPU (gpuhost_gpus: all) for one VM with all GPUs and NVSwitches (full passthrough), "
            "or none, to keep the host bare metal.",
        )
        return
    if model is NvSwitchModel.FULL_PASSTHROUGH:
        for function in nvswitch_functions_to_bind(ctx.facts, selection):
            if function.driver != VFIO_DRIVER:
                yield ctx.finding(
                    GPU_NVSWITCH_DRIVER,
                    ERROR,
                    function.address,
                    f"{describe_function(function)} is not on vfio-pci, so it cannot go to the guest with the GPUs "
                    "(a multi-GPU guest without its NVSwitches fails CUDA init: error 802, system not yet initialized)",
                    "Run gpuhost apply: it binds the NVSwitches to vfio-pci with the GPUs.",
                )


def check_gpu_cards(ctx: CheckContext) -> Iterator[Problem]:
    checked: set[str] = set()  # functions whose binding was judged: GPUs sharing a group share them
    for card in ctx.selection.passthrough:
        yield from _check_group(ctx, card)
        yield from _check_binding(ctx, card, checked)
        yield from _check_reset(ctx, card.gpu)
        yield from check_link(ctx, card.gpu)
        yield from _check_bars(ctx, card.gpu)
        yield from check_numa(ctx, card.gpu)
        yield from _check_boot_display(ctx, card.gpu)
    yield from _check_kept_gpus(ctx)


def _check_group(ctx: CheckContext, card: GpuCard) -> Iterator[Problem]:
    gpu = card.gpu
    if not ctx.facts.iommu.active:
        return  # check_iommu already says there are no groups at all
    isolation = analyse_group(ctx.facts, card, {selected.gpu.address for selected in ctx.selection.passthrough})
    if isolation.listing is GroupListing.NO_GROUP:
        yield ctx.finding(
            GPU_GROUP_MISSING,
            ERROR,
            gpu.address,
            f"GPU {gpu.describe()} is in no IOMMU group",
            "Check that the IOMMU covers this PCIe root port (kernel log: DMAR/AMD-Vi lines).",
        )
        return
    if isolation.listing is GroupListing.UNKNOWN:
        yield ctx.finding(
            GPU_GROUP_UNKNOWN,
            ERROR,
            gpu.address,
            f"GPU {gpu.describe()} is in IOMMU group {gpu.iommu_group}, but {isolation.unknown_reason}: "
            "what else would go to the guest with it is unknown",
            "Run the audit as root, and check that the group's devices are on the bus (lspci).",
        )
        return
    allowed = gpu.address in ctx.policy.allow_shared_group
    for intruder in isolation.intruders:
        yield ctx.finding(
            GPU_GROUP_INTRUDER,
            WARNING if allowed else ERROR,
            gpu.address,
            f"GPU {gpu.describe()} shares IOMMU group {gpu.iommu_group} with {describe_function(intruder)}, "
            "which is neither one of the card's functions nor a bridge: the whole group goes to the guest together"
            + (" (allowed by gpuhost_allow_shared_group)" if allowed else ""),
            "Never bind that device to vfio-pci for this: the group is shared because a PCIe port above the "
            "card lacks ACS (Access Control Services). Move the card to another slot, behind a root port with ACS "
            "(or another CPU root complex), or enable ACS in the firmware; list the GPU in "
            "gpuhost_allow_shared_group only if giving the guest that device too is acceptable.",
        )
    if isolation.kept_cards:
        names = listed(other.gpu.describe() for other in isolation.kept_cards)
        yield ctx.finding(
            GPU_GROUP_SHARED,
            ERROR,
            gpu.address,
            f"GPU {gpu.describe()} shares IOMMU group {gpu.iommu_group} with the GPU(s) {names}, which the host "
            "keeps: a group goes to one guest whole, so this GPU cannot be passed without them",
            "Select the whole group (add those GPUs to gpuhost_gpus), or place the GPUs behind separate PCIe "
            "ports with ACS (check the switch's and root port's ACS support in the firmware).",
        )
    elif isolation.other_cards:
        names = listed(other.gpu.describe() for other in isolation.other_cards)
        count = len(isolation.other_cards)
        yield ctx.finding(
            GPU_GROUP_SHARED,
            WARNING,
            gpu.address,
            f"GPU {gpu.describe()} shares IOMMU group {gpu.iommu_group} with {count} other GPU(s) {names}, "
            "all selected: render refuses to split the group, they are passed through together, to one guest",
            "Declare them in one VM; to give them to different guests, place the GPUs behind PCIe ports with ACS.",
        )
    if isolation.isolated:
        names = ", ".join(f.address for f in isolation.members)
        yield ctx.finding(
            GPU_GROUP_CLEAN,
            INFO,
            gpu.address,
            f"GPU {gpu.describe()} is isolated: IOMMU group {gpu.iommu_group} holds only {names}",
        )


def _check_binding(ctx: CheckContext, card: GpuCard, checked: set[str]) -> Iterator[Problem]:
    """The binding of each function of the card's group, once per function (`checked` is updated):
    with several GPUs in one group, each GPU's pass over the group used to report every function again."""
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
    isolation = analyse_group(facts, card, {selected.gpu.address for selected in ctx.selection.passthrough})
    # An intruder (no GPU card's function) is never proposed for vfio-pci: it may hold the host's root file
    # system (issue 27.4); gpu.group.intruder names it with its fix. Only where the operator gave it away
    # (gpuhost_allow_shared_group) does the plan bind it, and its binding is judged.
    intruders = set() if card.gpu.address in ctx.policy.allow_shared_group else {f.address for f in isolation.intruders}
    for function in isolation.to_bind:
        if function.address in checked or function.address in intruders:
            continue
        checked.add(function.address)
        listed_already = function.vendor_device in cmdline_ids
        if function.driver_unknown:
            # Never read as "no driver" (a warning): a selected GPU's binding is never an unknown
            # that leaves the host READY.
            yield ctx.finding(
                GPU_DRIVER_UNKNOWN,
                ERROR,
                function.address,
                f"{describe_function(function)}: its driver link was gathered but names no driver (an empty "
                "record, a directory or another kind of file), so whether a host driver holds it is unknown",
                "Audit the host again (gpuhost audit HOST, or a new gpuhost snapshot): the gather records the "
                "link's target; a snapshot edited or damaged since cannot say what the host runs.",
            )
        elif function.driver == VFIO_DRIVER:
            pass
        elif function.driver is None:
            yield ctx.finding(
                GPU_DRIVER,
                WARNING,
                function.address,
                f"{describe_function(function)} has no driver bound: vfio-pci has not claimed it",
                f"vfio-pci.ids on the kernel command line already names {function.vendor_device}: check that "
                "vfio-pci is loaded at boot (the initramfs's vfio modules; gpuhost apply adds them)."
                if listed_already
                else "Bind it to vfio-pci early: vfio-pci.ids on the kernel command line (gpuhost apply does this).",
            )
        else:
            yield ctx.finding(
                GPU_DRIVER,
                ERROR,
                function.address,
                f"{describe_function(function)} is bound to the host driver {function.driver}, not vfio-pci: "
                "it is not ready for passthrough",
                f"vfio-pci.ids on the kernel command line already names {function.vendor_device}, but "
                f"{function.driver} claimed it first: load vfio-pci from the initramfs before it and blacklist "
                "the host driver (gpuhost apply does both)."
                if listed_already
                else "Bind it to vfio-pci at boot: vfio-pci.ids on the kernel command line, vfio modules in the "
                "initramfs, the host driver blacklisted (gpuhost apply).",
            )
        covered_by_override = function.driver_override == VFIO_DRIVER
        if function.vendor_device in cmdline_ids or covered_by_override:
            continue
        if function.vendor_device in modprobe_ids:
            yield ctx.finding(
                GPU_VFIO_IDS_MODPROBE_ONLY,
                WARNING,
                function.address,
                f"{function.describe()} is bound to vfio-pci only through 'options vfio-pci ids=' in modprobe.d, "
                "which takes effect only if vfio-pci loads before the host driver",
                f"Put {function.vendor_device} in vfio-pci.ids on the kernel command line instead.",
            )
            continue
        yield ctx.finding(
            GPU_VFIO_IDS_MISSING,
            ERROR,
            function.address,
            f"vfio-pci.ids on the kernel command line does not cover {describe_function(function)}, "
            "so after a reboot a host driver can claim it",
            f"Add {function.vendor_device} to vfio-pci.ids on the kernel command line (gpuhost apply).",
        )


def _check_kept_gpus(ctx: CheckContext) -> Iterator[Problem]:
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
                    GPU_VFIO_IDS_CAPTURES_KEPT,
                    ERROR,
                    function.address,
                    f"vfio-pci.ids={','.join(sorted(ids))} also takes {describe_function(function)}, which {reason}",
                    "Bind the passthrough GPUs by address (driver_override) instead of by ID"
                    if shared
                    else f"Remove {function.vendor_device} from vfio-pci.ids, or select this GPU for passthrough.",
                )


def _check_reset(ctx: CheckContext, gpu: PciFunction) -> Iterator[Problem]:
    methods = gpu.reset_methods
    if methods is None:
        yield ctx.finding(
            GPU_RESET_UNKNOWN,
            INFO,
            gpu.address,
            f"{gpu.describe()}: reset_method could not be read (kernels before 5.15 do not publish it)",
        )
    elif "flr" not in methods:
        how = f"only {', '.join(methods)}" if methods else "none"
        yield ctx.finding(
            GPU_RESET,
            WARNING,
            gpu.address,
            f"{gpu.describe()} has no function-level reset (reset methods: {how}): after a guest stops, the "
            "card may not come back in a clean state (the 'reset bug')",
            "Prefer cards with FLR; stop guests cleanly, and reboot the host if a GPU stops appearing to guests.",
        )


def check_link(ctx: CheckContext, gpu: PciFunction) -> Iterator[Problem]:
    link = gpu.link
    if link.current_width is None or link.max_width is None:
        if gpu.parents or link.current_speed_gts is not None:
            yield ctx.finding(
                GPU_LINK_UNKNOWN, INFO, gpu.address, f"{gpu.describe()}: the PCIe link width could not be read"
            )
        return
    if link.current_width < link.max_width:
        yield ctx.finding(
            GPU_LINK_WIDTH,
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
            GPU_LINK_SPEED,
            INFO,
            gpu.address,
            f"{gpu.describe()} link runs at {link.describe()}: GPUs lower the link speed when idle, "
            "so check it again under load (gpuhost smoke-test does)",
        )
    else:
        yield ctx.finding(GPU_LINK, INFO, gpu.address, f"{gpu.describe()} link {link.describe()}")
    yield from _check_upstream_width(ctx, gpu)


def _check_upstream_width(ctx: CheckContext, gpu: PciFunction) -> Iterator[Problem]:
    """The links above the GPU's own. parents[0] is the port at the other end of the GPU's own link
    (judged above); each bridge beyond it carries the traffic of every GPU below it, so a switch
    whose upstream link trained at x8 of x16 halves the host bandwidth of all its GPUs while each
    GPU's own link reads x16. Both ends of that link (the switch's upstream port and the root port)
    report it: one finding per GPU, the nearest."""
    by_address = {function.address: function for function in ctx.facts.pci}
    for address in gpu.parents[1:]:
        bridge = by_address.get(address)
        link = bridge.link if bridge is not None else None
        if bridge is None or link is None or link.current_width is None or link.max_width is None:
            continue
        if link.current_width < link.max_width:
            yield ctx.finding(
                GPU_LINK_UPSTREAM_WIDTH,
                ERROR,
                gpu.address,
                f"{gpu.describe()} sits behind {bridge.describe()}, whose link trained at x{link.current_width} of "
                f"x{link.max_width} ({link.describe()}): every GPU below it shares that fraction of the host "
                "bandwidth, though the GPU's own link reads full width",
                "Reseat the switch's card or riser, check its slot's wiring and the BIOS lane bifurcation settings.",
            )
            return


def _check_bars(ctx: CheckContext, gpu: PciFunction) -> Iterator[Problem]:
    prefetchable = [bar for bar in gpu.bars if bar.is_prefetchable]
    if not prefetchable:
        return
    largest = max(prefetchable, key=lambda bar: bar.size)
    yield ctx.finding(
        GPU_BAR,
        INFO,
        gpu.address,
        f"{gpu.describe()} BAR{largest.index} is {_size(largest.size)}"
        + (" (64-bit)" if largest.is_64bit else " (32-bit)"),
    )
    sizes = gpu.resizable_bar_sizes.get(largest.index)
    if sizes:
        # resourceN_resize: bit n set means a size of 2^n MiB is supported.
        supported = (1 << (sizes.bit_length() - 1)) * MIB_BYTES
        if supported > largest.size:
            yield ctx.finding(
                GPU_REBAR,
                WARNING,
                gpu.address,
                f"{gpu.describe()} supports a {_size(supported)} BAR{largest.index} (Resizable BAR) but has "
                f"{_size(largest.size)}",
                "Enable 'Above 4G decoding' and 'Resizable BAR' in the firmware; add pci=realloc if BARs fail to fit.",
            )


def check_numa(ctx: CheckContext, gpu: PciFunction) -> Iterator[Problem]:
    nodes = ctx.facts.numa_nodes
    if gpu.numa_node is None:
        return
    if gpu.numa_node < 0:
        if len(nodes) > 1:
            yield ctx.finding(
                GPU_NUMA,
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
    pool = node.pool(GIB_KIB) if node else None
    host_pool = ctx.facts.hugepage_pool(GIB_KIB)
    if host_pool and host_pool.total and pool is not None and not pool.total:
        yield ctx.finding(
            GPU_NUMA_HUGEPAGES,
            WARNING,
            gpu.address,
            f"{message}, but none of the host's {host_pool.total} 1 GiB pages are on that node: "
            "a guest with this GPU gets remote memory",
            "Split the 1 GiB pages across the GPUs' NUMA nodes (gpuhost apply does).",
        )
    else:
        yield ctx.finding(GPU_NUMA, INFO, gpu.address, message)


def _check_boot_display(ctx: CheckContext, gpu: PciFunction) -> Iterator[Problem]:
    if not gpu.boot_vga:
        return
    log = ctx.facts.kernel_log
    claimed = log.firmware_framebuffer_bars(gpu.address) if log is not None else ()
    holders = []
    if log is not None:
        for name in ("efifb", "simpledrm", "vesafb"):
            if log.matching(name):
                holders.append(name)
    held = f"; the kernel log shows {', '.join(holders)} in use" if holders else ""
    bars = f"; BAR {', '.join(claimed)} assigned to efifb" if claimed else ""
    yield ctx.finding(
        GPU_BOOT_DISPLAY,
        WARNING,
        gpu.address,
        f"{gpu.describe()} is the boot display (boot_vga=1){bars}{held}: the firmware framebuffer can hold "
        "its memory and the guest may fail to initialize it",
        # The guide: video=efifb:off no longer has any effect on modern kernels; simpledrm is what binds.
        "Make the firmware draw on another display (BMC/onboard VGA as the primary display in the firmware setup), "
        "or add initcall_blacklist=simpledrm (and nomodeset) to the host's kernel command line.",
    )


def _size(size: int) -> str:
    if size >= GIB_BYTES:
        return f"{size / GIB_BYTES:g} GiB"
    return f"{size / MIB_BYTES:g} MiB"


def gpu_function_summary(gpu: PciFunction) -> str:
    return f"{gpu.describe()} {class_name(gpu.base_class)}"
