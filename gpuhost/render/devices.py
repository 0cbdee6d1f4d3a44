"""The devices a VM gets: its GPUs, their IOMMU groups whole, the NVSwitches beside them, all bound to vfio-pci."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpuhost.facts.model import HostFacts
from gpuhost.facts.pci import CLASS_PCI_BRIDGE, VENDOR_NVIDIA, PciFunction
from gpuhost.inventory.spec import HostPolicy, VmSpec
from gpuhost.passthrough import GpuCard, GroupListing, analyse_groups
from gpuhost.problems import Problem, Severity, Stage, listed, register
from gpuhost.render.conflicts import render_conflict
from gpuhost.selection import (
    VmGpuMiss,
    gpus_declared_twice,
    nvswitch_functions_to_bind,
    nvswitch_group_intruders,
    select_gpus,
    vm_gpus,
)

VFIO_PCI = "vfio-pci"

# Render's conflicts: each refuses the VM on that host (RenderRefused lists them all).
GPU_NONE = register("render.gpu.none", Stage.RENDER, Severity.ERROR, "the host has no passthrough GPU (gpus: all)")

GPU_UNKNOWN = register(
    "render.gpu.unknown",
    Stage.RENDER,
    Severity.ERROR,
    "a GPU named in gpus is no passthrough GPU alias or address of the host",
)

GPU_KEPT = register("render.gpu.kept", Stage.RENDER, Severity.ERROR, "a GPU named in gpus is one the host keeps")

GPU_DUPLICATE = register(
    "render.gpu.duplicate", Stage.RENDER, Severity.ERROR, "the same GPU is named twice (an alias and its address)"
)

GPU_TAKEN = register(
    "render.gpu.taken", Stage.RENDER, Severity.ERROR, "a function is already a hostdev of another defined domain"
)

GPU_DECLARED_TWICE = register(
    "render.gpu.declared_twice",
    Stage.RENDER,
    Severity.ERROR,
    "the same GPU is declared for two VMs of the host's gpuhost_vms",
)

FUNCTION_NOT_VFIO = register(
    "render.function.not_vfio",
    Stage.RENDER,
    Severity.ERROR,
    "a function to pass is not bound to vfio-pci (gpuhost apply first)",
)

GROUP_UNKNOWN = register(
    "render.group.unknown",
    Stage.RENDER,
    Severity.ERROR,
    "a GPU's IOMMU group listing is empty, unreadable or names unknown devices",
)

GROUP_SPLIT = register(
    "render.group.split",
    Stage.RENDER,
    Severity.ERROR,
    "the GPU's IOMMU group holds another GPU that the VM does not ask for",
)

GROUP_INTRUDER = register(
    "render.group.intruder",
    Stage.RENDER,
    Severity.ERROR,
    "the GPU's IOMMU group holds another device (unless gpuhost_allow_shared_group)",
)

NVSWITCH_PARTIAL = register(
    "render.nvswitch.partial",
    Stage.RENDER,
    Severity.ERROR,
    "a VM on an NVSwitch host that does not take every NVIDIA GPU (full passthrough: all GPUs and NVSwitches)",
)


def check_declared_once(
    facts: HostFacts, spec: VmSpec, policy: HostPolicy, host_vms: Sequence[VmSpec], conflicts: list[Problem]
) -> None:
    """A GPU this VM shares with another declared VM (selection.gpus_declared_twice, the planner's
    answer too): the VMs of gpuhost_vms run at once, so the declaration is wrong, not the host."""
    vms = [*(vm for vm in host_vms if vm.name != spec.name), spec]
    for twice in gpus_declared_twice(facts, policy.gpus, [(vm.name, vm.gpus) for vm in vms]):
        if spec.name in (twice.first, twice.second):
            other = twice.first if twice.second == spec.name else twice.second
            conflicts.append(
                render_conflict(
                    GPU_DECLARED_TWICE,
                    twice.address,
                    f"GPU {twice.address} is declared for VM {other!r} too (gpuhost_vms): a GPU goes to one guest "
                    "at a time, and the VMs' CPUs and huge pages are allocated as if all of them run;",
                    "give each GPU to one VM.",
                )
            )


def resolve_gpus(facts: HostFacts, spec: VmSpec, policy: HostPolicy, conflicts: list[Problem]) -> tuple[GpuCard, ...]:
    if not spec.gpus:  # gpus: none, asked for explicitly
        return ()
    picked = vm_gpus(facts, policy.gpus, spec.gpus)
    if spec.gpus == ("all",) and not picked.available:
        conflicts.append(
            render_conflict(GPU_NONE, "GPUs", f"the host has no passthrough GPU ({policy.gpus.describe()}).")
        )
    known = ", ".join(f"gpu{i} ({card.gpu.address})" for i, card in enumerate(picked.available)) or "none"
    for name, miss in picked.misses:
        if miss is VmGpuMiss.NO_SUCH_INDEX:
            conflicts.append(
                render_conflict(GPU_UNKNOWN, name, f"unknown GPU {name!r}: the host's passthrough GPUs are {known}.")
            )
        elif miss is VmGpuMiss.KEPT:
            conflicts.append(
                render_conflict(
                    GPU_KEPT,
                    name,
                    f"GPU {name} is not one of the host's passthrough GPUs ({policy.gpus.describe()}): "
                    f"the host keeps it. Passthrough GPUs: {known}.",
                )
            )
        else:
            conflicts.append(
                render_conflict(
                    GPU_UNKNOWN,
                    name,
                    f"unknown GPU {name!r}: the host has no GPU at that address. Passthrough GPUs: {known}.",
                )
            )
    unique = {card.gpu.address: card for card in picked.cards}
    if len(unique) < len(picked.cards):
        conflicts.append(
            render_conflict(GPU_DUPLICATE, "GPUs", "the same GPU is named twice (an alias and its address).")
        )
    return tuple(sorted(unique.values(), key=lambda card: card.gpu.address))


@dataclass(frozen=True)
class Group:
    """What one card brings to the guest: its functions, plus what shares its IOMMU group."""

    card: GpuCard
    devices: tuple[tuple[PciFunction, ...], ...]  # by host slot, the card's own slot first


def passthrough_groups(
    facts: HostFacts, cards: Sequence[GpuCard], policy: HostPolicy, conflicts: list[Problem]
) -> tuple[Group, ...]:
    groups: list[Group] = []
    placed: set[str] = set()
    for isolation in analyse_groups(facts, cards):  # judged for this VM's GPUs: a GPU of the group left out splits it
        card = isolation.card
        if isolation.listing is GroupListing.UNKNOWN:
            conflicts.append(
                render_conflict(
                    GROUP_UNKNOWN,
                    card.gpu.address,
                    f"GPU {card.gpu.address} is in IOMMU group {card.gpu.iommu_group}, but {isolation.unknown_reason}: "
                    "what else would go to the guest is unknown;",
                    "audit the host as root (gpuhost audit) and check the group's devices.",
                )
            )
        for other in isolation.kept_cards:
            conflicts.append(
                render_conflict(
                    GROUP_SPLIT,
                    card.gpu.address,
                    f"GPU {card.gpu.address} shares IOMMU group {card.gpu.iommu_group} with GPU "
                    f"{other.gpu.address}: both go to the same guest or neither does;",
                    "add it to gpus.",
                )
            )
        intruders = isolation.intruders
        if intruders and card.gpu.address not in policy.allow_shared_group:
            conflicts.append(
                render_conflict(
                    GROUP_INTRUDER,
                    card.gpu.address,
                    f"GPU {card.gpu.address} shares IOMMU group {card.gpu.iommu_group} with "
                    f"{', '.join(f.describe() for f in intruders)}, which would go to the guest too;",
                    "accept that with gpuhost_allow_shared_group, or move the card.",
                )
            )
        # What vfio-pci owns for this card, laid out by slot: its functions and its group's intruders (other
        # GPUs of the group are laid out with their own card).
        mine = {f.address for f in (*card.functions, *intruders)}
        functions = [f for f in isolation.to_bind if f.address in mine and f.address not in placed]
        placed.update(f.address for f in functions)
        by_slot: dict[str, list[PciFunction]] = {}
        for function in sorted(functions, key=lambda f: (f.slot != card.gpu.slot, f.address)):
            by_slot.setdefault(function.slot, []).append(function)
        groups.append(Group(card, tuple(tuple(slot) for slot in by_slot.values())))
    return tuple(groups)


def host_switch_of(facts: HostFacts, function: PciFunction) -> str | None:
    """The upstream port of the PCIe switch `function` sits behind on the host, or None (behind a
    root port, or its parents unknown).

    sysfs gives a function's bridges, nearest first: behind a switch they are its downstream port,
    the switch's upstream port, then the root port (or a higher switch's downstream port) above it:
    three PCI-to-PCI bridges at least. Behind a root port there is one; behind a PCIe-to-PCI bridge
    on a root port, two. Nested switches: the nearest one, which the function shares with its
    siblings (what NCCL calls the function's PCI switch too: the grandparent in sysfs)."""
    if len(function.parents) < 3:
        return None
    bridges = [facts.function(address) for address in function.parents[:3]]
    if any(bridge is None or bridge.base_class != CLASS_PCI_BRIDGE for bridge in bridges):
        return None
    return function.parents[1]


def host_switches(facts: HostFacts, groups: Sequence[Group]) -> dict[str, str]:
    """Each passed device (its first function's host address) behind a host PCIe switch -> that switch."""
    found: dict[str, str] = {}
    for group in groups:
        for device in group.devices:
            switch = host_switch_of(facts, device[0])
            if switch is not None:
                found[device[0].address] = switch
    return found


def passthrough_nvswitches(
    facts: HostFacts, cards: Sequence[GpuCard], policy: HostPolicy, conflicts: list[Problem]
) -> tuple[PciFunction, ...]:
    """An NVSwitch host's VM with GPUs takes every NVIDIA GPU and every NVSwitch (NVIDIA's full
    passthrough model, the one gpuhost supports); anything less is refused: its GPUs' NVLinks would
    need a Fabric Manager outside the guest (the shared NVSwitch model)."""
    selection = select_gpus(facts, policy.gpus)
    if not selection.nvswitches or not any(card.gpu.vendor == VENDOR_NVIDIA for card in cards):
        return ()
    every_gpu = {card.gpu.address for card in (*selection.passthrough_nvidia, *selection.kept_nvidia)}
    missing = sorted(every_gpu - {card.gpu.address for card in cards})
    if missing:
        conflicts.append(
            render_conflict(
                NVSWITCH_PARTIAL,
                "NVSwitch",
                f"the host has {len(selection.nvswitches)} NVSwitch(es); a VM there takes every NVIDIA GPU and "
                f"NVSwitch (NVIDIA's full passthrough model), but this one leaves out {listed(missing)}; "
                "splitting the NVLink fabric between VMs needs the shared NVSwitch model, which gpuhost does "
                "not support:",
                "give this VM gpus: all, and declare no other VM with GPUs on this host.",
            )
        )
        return ()
    for intruder in nvswitch_group_intruders(facts, selection):
        conflicts.append(
            render_conflict(
                GROUP_INTRUDER,
                intruder.address,
                f"{intruder.describe()} shares IOMMU group {intruder.iommu_group} with an NVSwitch and would go to "
                "the guest too;",
                "move the device to another slot.",
            )
        )
    return nvswitch_functions_to_bind(facts, selection)


def check_functions(
    groups: Sequence[Group],
    spec: VmSpec,
    taken: Mapping[str, str],
    conflicts: list[Problem],
    extra: Sequence[PciFunction] = (),
) -> None:
    functions = [f for group in groups for device in group.devices for f in device] + list(extra)
    for function in functions:
        if function.driver != VFIO_PCI:
            bound = (
                "on a driver the snapshot cannot say (its driver link is unreadable)"
                if function.driver_unknown
                else f"bound to {function.driver}"
                if function.driver
                else "bound to no driver"
            )
            conflicts.append(
                render_conflict(
                    FUNCTION_NOT_VFIO,
                    function.address,
                    f"{function.describe()} is {bound}, not vfio-pci:",
                    "run `gpuhost apply` on the host (and reboot) before giving it to a guest.",
                )
            )
        owner = taken.get(function.address)
        if owner is not None and owner != spec.name:
            conflicts.append(
                render_conflict(
                    GPU_TAKEN, function.address, f"{function.describe()} is already given to domain {owner!r}."
                )
            )
