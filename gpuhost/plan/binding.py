"""What vfio-pci takes: the selected GPUs' whole IOMMU groups, the NVSwitches, and how they are bound."""

from __future__ import annotations

from gpuhost.facts.model import HostFacts
from gpuhost.inventory.plan_settings import BIND_AUTO, PlanSettings
from gpuhost.passthrough import GroupListing, analyse_groups
from gpuhost.plan.model import BindBy, BoundFunction
from gpuhost.plan.platform import Refuse
from gpuhost.problems import Severity, Stage, register
from gpuhost.selection import GpuSelection, NvSwitchModel, nvswitch_functions_to_bind, nvswitch_group_intruders

REFUSE_GROUP_MISSING = register("plan.group.missing", Stage.PLAN, Severity.ERROR, "a selected GPU is in no IOMMU group")

REFUSE_GROUP_UNKNOWN = register(
    "plan.group.unknown",
    Stage.PLAN,
    Severity.ERROR,
    "a selected GPU's IOMMU group listing is empty, unreadable or names unknown devices",
)

REFUSE_GROUP_INTRUDER = register(
    "plan.group.intruder",
    Stage.PLAN,
    Severity.ERROR,
    "a device in the GPU's IOMMU group is neither its function nor a bridge (audit: gpu.group.intruder)",
)

REFUSE_GROUP_KEPT_GPU = register(
    "plan.group.kept_gpu", Stage.PLAN, Severity.ERROR, "the GPU's IOMMU group holds a GPU the host keeps"
)

REFUSE_VFIO_IDS_CAPTURES_KEPT = register(
    "plan.vfio_ids.captures_kept",
    Stage.PLAN,
    Severity.ERROR,
    "gpuhost_bind_by: ids, but an ID also takes a GPU the host keeps",
)

REFUSE_NVSWITCH_SHARED = register(
    "plan.nvswitch.shared",
    Stage.PLAN,
    Severity.ERROR,
    "an NVSwitch host with some NVIDIA GPUs selected and others kept (shared NVSwitch model: not supported)",
)


def passthrough_functions(
    facts: HostFacts, selection: GpuSelection, settings: PlanSettings, refuse: Refuse
) -> tuple[BoundFunction, ...]:
    bound: list[BoundFunction] = []
    for isolation in analyse_groups(facts, selection.passthrough):
        card = isolation.card
        if isolation.listing is GroupListing.NO_GROUP and facts.iommu.active:
            refuse(
                REFUSE_GROUP_MISSING,
                card.gpu.address,
                f"GPU {card.gpu.describe()} is in no IOMMU group.",
                "Check that the IOMMU covers this PCIe root port (kernel log: DMAR/AMD-Vi lines).",
            )
        if isolation.listing is GroupListing.UNKNOWN:
            refuse(
                REFUSE_GROUP_UNKNOWN,
                card.gpu.address,
                f"GPU {card.gpu.describe()} is in IOMMU group {card.gpu.iommu_group}, but {isolation.unknown_reason}: "
                "what binding the group to vfio-pci would take from the host is unknown.",
                "Connect as root (ansible_user: root, or become) and check that the group's devices are on the bus "
                "(lspci), then run gpuhost plan again.",
            )
        if isolation.intruders and card.gpu.address not in settings.allow_shared_group:
            names = ", ".join(_describe(m) for m in isolation.intruders)
            refuse(
                REFUSE_GROUP_INTRUDER,
                card.gpu.address,
                f"GPU {card.gpu.describe()} shares IOMMU group {card.gpu.iommu_group} with {names}, which is not "
                "one of its functions or a bridge: binding the group to vfio-pci would take that device from the host.",
                "Never bind that device for this: the group is shared because a PCIe port above the GPU lacks ACS. "
                "Move the GPU to another slot with its own IOMMU group (behind a root port with ACS), or enable ACS "
                "in the firmware; if the device may go to the guest too, "
                f"name the GPU in gpuhost_allow_shared_group: [{card.gpu.address}].",
            )
        kept_in_group = [member for other in isolation.kept_cards for member in other.functions]
        if kept_in_group:
            refuse(
                REFUSE_GROUP_KEPT_GPU,
                card.gpu.address,
                f"GPU {card.gpu.describe()} shares IOMMU group {card.gpu.iommu_group} with the GPU(s) "
                f"{', '.join(_describe(m) for m in kept_in_group)} that the host keeps.",
                "Pass the whole group through (add those GPUs to gpuhost_gpus) or move the cards apart.",
            )
        # Without a listing (no group, or unknown: refused above) the card's own functions are what is bound.
        seen = {b.address for b in bound}
        bound.extend(
            BoundFunction(m.address, m.vendor_device, card.gpu.address, m.driver)
            for m in isolation.to_bind
            if m.address not in seen
        )
    return tuple(bound)


def passthrough_nvswitches(
    facts: HostFacts, selection: GpuSelection, refuse: Refuse, notes: list[str]
) -> tuple[BoundFunction, ...]:
    """An HGX host's NVSwitches: to vfio-pci with every GPU (NVIDIA's full passthrough model), or refused."""
    model = selection.nvswitch_model
    count = len(selection.nvswitches)
    if model is NvSwitchModel.SHARED:
        kept = ", ".join(card.gpu.address for card in selection.kept_nvidia)
        refuse(
            REFUSE_NVSWITCH_SHARED,
            "NVSwitch",
            f"the host has {count} NVSwitch(es) joining its GPUs in one NVLink fabric; passing "
            f"{len(selection.passthrough_nvidia)} GPU(s) while the host keeps {kept} needs NVIDIA's shared NVSwitch "
            "model (a Fabric Manager outside the guests partitions the NVSwitches), which gpuhost does not support.",
            "Select every NVIDIA GPU (gpuhost_gpus: all): all GPUs and NVSwitches then go to one VM (full "
            "passthrough). Or select none and keep the host bare metal.",
        )
        return ()
    if model is NvSwitchModel.FULL_PASSTHROUGH:
        bound = nvswitch_functions_to_bind(facts, selection)
        for intruder in nvswitch_group_intruders(facts, selection):
            refuse(
                REFUSE_GROUP_INTRUDER,
                intruder.address,
                f"{_describe(intruder)} shares an IOMMU group (group {intruder.iommu_group}) with an NVSwitch, and "
                "is neither an NVSwitch nor a bridge: binding the group to vfio-pci would take it from the host.",
                "Move the device to another slot, or check the platform's ACS settings (the NVSwitches of an HGX "
                "baseboard each have a group of their own).",
            )
        notes.append(
            f"NVSwitch host: its {count} NVSwitch(es) go to vfio-pci with the GPUs (NVIDIA's full passthrough model): "
            "one VM takes every GPU and NVSwitch and runs nvidia-fabricmanager of its driver branch; a VM with "
            "only some of them is refused by render"
        )
        return tuple(BoundFunction(f.address, f.vendor_device, f.address, f.driver) for f in bound)
    return ()


def _describe(function: object) -> str:
    from gpuhost.checks.base import describe_function  # one wording of devices for audit and plan
    from gpuhost.facts.pci import PciFunction

    assert isinstance(function, PciFunction)
    return describe_function(function)


def plan_binding(
    selection: GpuSelection,
    functions: tuple[BoundFunction, ...],
    settings: PlanSettings,
    refuse: Refuse,
    notes: list[str],
) -> tuple[BindBy, tuple[str, ...], tuple[str, ...]]:
    """By ID (vfio-pci.ids) unless an ID would also take a function the host keeps: then by address."""
    kept: dict[str, list[str]] = {}
    for card in selection.kept:
        for function in card.functions:
            kept.setdefault(function.vendor_device, []).append(function.address)
    ids = tuple(dict.fromkeys(f.vendor_device for f in functions))
    clashing = [i for i in ids if i in kept]
    if settings.bind_by == BindBy.ADDRESS or (clashing and settings.bind_by == BIND_AUTO):
        if clashing:
            notes.append(
                f"vfio-pci.ids={','.join(ids)} would also take {', '.join(a for i in clashing for a in kept[i])} "
                "which the host keeps: the passthrough functions are bound by address (driver_override) instead"
            )
        return BindBy.ADDRESS, (), tuple(f.address for f in functions)
    if clashing:
        refuse(
            REFUSE_VFIO_IDS_CAPTURES_KEPT,
            ",".join(clashing),
            f"vfio-pci.ids={','.join(ids)} would also take {', '.join(a for i in clashing for a in kept[i])}, "
            "which the host keeps (not selected for passthrough, or its console).",
            "Set gpuhost_bind_by: address (or auto) to bind the passthrough functions by address with "
            "driver_override instead, or select those GPUs too.",
        )
    return BindBy.IDS, ids, ()
