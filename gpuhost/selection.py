"""Which GPUs of a host are to be passed through, and which functions go with each.

One place for this logic: the audit's checks and the planner (apply) both call it. What vfio-pci
must own for the selected GPUs, and whether their IOMMU groups are usable: gpuhost.passthrough.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuhost.errors import InputError
from gpuhost.facts.model import HostFacts, TextEnum
from gpuhost.facts.pci import VENDOR_NVIDIA, PciFunction
from gpuhost.passthrough import GpuCard, function_group_to_bind, gpu_cards

_ADDRESS = re.compile(r"^(?:[0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
_VENDOR_DEVICE = re.compile(r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{4}$")


@dataclass(frozen=True)
class GpuSelector:
    """`gpuhost_gpus`: 'all' (every NVIDIA GPU that is not the host's console), or a list of
    PCI addresses ('0000:41:00.0', '41:00.0') and vendor:device IDs ('10de:2330')."""

    select_all_nvidia: bool
    addresses: tuple[str, ...] = ()
    vendor_devices: tuple[str, ...] = ()

    @classmethod
    def parse(cls, value: object, where: str, variable: str = "gpuhost_gpus") -> GpuSelector:
        """Validate an inventory or command-line value; `where` names it in the error."""
        if value is None or value == "all":
            return cls(select_all_nvidia=True)
        items: list[object]
        if isinstance(value, str):
            items = [item.strip() for item in value.split(",") if item.strip()]
        elif isinstance(value, list):
            items = list(value)
        else:
            raise InputError(
                f"{where}: {variable} must be 'all' or a list of PCI addresses or vendor:device IDs, not {value!r}"
            )
        addresses, ids = [], []
        for item in items:
            if isinstance(item, int | float) and not isinstance(item, bool):
                # YAML 1.1 reads an unquoted 0000:41:00.0 as a base-60 number (2460.0).
                raise InputError(
                    f"{where}: {variable} entry {item!r} is a number: YAML read an unquoted PCI address as one. "
                    "Quote PCI addresses, e.g. - '0000:41:00.0'."
                )
            text = str(item).strip()
            if _ADDRESS.fullmatch(text):
                addresses.append(text.lower() if text.count(":") == 2 else f"0000:{text.lower()}")
            elif _VENDOR_DEVICE.fullmatch(text):
                ids.append(text.lower())
            else:
                raise InputError(
                    f"{where}: {variable} entry {text!r} is neither a PCI address (0000:41:00.0) "
                    f"nor a vendor:device ID (10de:2330). Fix {variable}."
                )
        if not addresses and not ids:
            raise InputError(f"{where}: {variable} is an empty list; use 'all' or name the GPUs.")
        return cls(select_all_nvidia=False, addresses=tuple(addresses), vendor_devices=tuple(ids))

    def describe(self) -> str:
        if self.select_all_nvidia:
            return "all NVIDIA GPUs"
        return ", ".join(self.addresses + self.vendor_devices)

    def selects(self, function: PciFunction) -> bool:
        if self.select_all_nvidia:
            return function.vendor == VENDOR_NVIDIA and function.boot_vga is not True
        return function.address in self.addresses or function.vendor_device in self.vendor_devices


@dataclass(frozen=True)
class GpuSelection:
    passthrough: tuple[GpuCard, ...]
    kept: tuple[GpuCard, ...]  # GPUs the host keeps: its console, or GPUs not selected
    other_nvidia: tuple[PciFunction, ...]  # NVIDIA functions that are neither GPUs nor NVSwitches
    nvswitches: tuple[PciFunction, ...] = ()  # NVIDIA class 0x0680 functions: an HGX/DGX baseboard

    @property
    def nvswitch_model(self) -> NvSwitchModel:
        """How this selection uses the host's NVSwitches (NVIDIA Fabric Manager guide's models)."""
        if not self.nvswitches:
            return NvSwitchModel.NONE
        if not self.passthrough_nvidia:  # NVSwitches join NVIDIA GPUs only
            return NvSwitchModel.BARE_METAL
        return NvSwitchModel.SHARED if self.kept_nvidia else NvSwitchModel.FULL_PASSTHROUGH

    @property
    def passthrough_nvidia(self) -> tuple[GpuCard, ...]:
        return tuple(card for card in self.passthrough if card.gpu.vendor == VENDOR_NVIDIA)

    @property
    def kept_nvidia(self) -> tuple[GpuCard, ...]:
        return tuple(card for card in self.kept if card.gpu.vendor == VENDOR_NVIDIA)


class NvSwitchModel(TextEnum):
    """Where an NVSwitch host's GPUs and NVSwitches go, in the terms of NVIDIA's Fabric Manager guide.

    Full passthrough (every GPU and every NVSwitch to vfio-pci, for one VM that takes them all; the
    guest runs nvidia-fabricmanager) is what gpuhost supports. Passing some GPUs while the host keeps
    others needs the NVSwitches partitioned by a Fabric Manager outside the guests (the shared
    NVSwitch model, with a service VM): gpuhost refuses it."""

    NONE = "none"  # no NVSwitch on the host
    BARE_METAL = "bare metal"  # no NVIDIA GPU passed: the host keeps them, the NVSwitches and its Fabric Manager
    FULL_PASSTHROUGH = "full passthrough"
    SHARED = "shared NVSwitch"  # some GPUs passed, some kept: refused


def select_gpus(facts: HostFacts, selector: GpuSelector) -> GpuSelection:
    cards = gpu_cards(facts)
    passthrough = tuple(card for card in cards if selector.selects(card.gpu))
    kept = tuple(card for card in cards if not selector.selects(card.gpu))
    card_functions = {f.address for card in cards for f in card.functions}
    other_nvidia = tuple(
        f
        for f in facts.pci
        if f.vendor == VENDOR_NVIDIA and f.address not in card_functions and not f.is_bridge and not f.is_nvswitch
    )
    nvswitches = tuple(f for f in facts.pci if f.is_nvswitch)
    return GpuSelection(passthrough=passthrough, kept=kept, other_nvidia=other_nvidia, nvswitches=nvswitches)


def card_numa_node(facts: HostFacts, card: GpuCard) -> int | None:
    """The NUMA node of a card: its GPU's numa_node, that node on a one-node host without NUMA
    information, else None (unknown)."""
    node = card.gpu.numa_node
    if node is not None and node >= 0:
        return node
    if len(facts.numa_nodes) == 1:
        return facts.numa_nodes[0].node_id
    return None


def passthrough_in_order(facts: HostFacts, selector: GpuSelector) -> tuple[GpuCard, ...]:
    """The host's passthrough GPUs in PCI address order: gpu0, gpu1, ... in a VM spec."""
    return tuple(sorted(select_gpus(facts, selector).passthrough, key=lambda card: card.gpu.address))


class VmGpuMiss(TextEnum):
    """Why a name in a VM's `gpus` picks none of the host's passthrough GPUs."""

    NO_SUCH_INDEX = "no-such-index"  # gpuN past the last passthrough GPU
    KEPT = "kept"  # a GPU the host keeps (boot display, or not selected)
    NO_SUCH_ADDRESS = "no-such-address"  # no GPU at that PCI address


@dataclass(frozen=True)
class VmGpus:
    """What a VM's `gpus` names on one host: the cards it picks, in the order named, and the names
    that pick none."""

    available: tuple[GpuCard, ...]  # the host's passthrough GPUs, gpu0 first
    cards: tuple[GpuCard, ...]
    misses: tuple[tuple[str, VmGpuMiss], ...]


def vm_gpus(facts: HostFacts, selector: GpuSelector, names: Sequence[str]) -> VmGpus:
    """Resolve a VM's `gpus` ('all', gpuN aliases, PCI addresses: render.spec.validate_gpus) against
    the host's facts. Render turns the misses into refusals; the page placement skips such a VM."""
    available = passthrough_in_order(facts, selector)
    if tuple(names) == ("all",):
        return VmGpus(available, available, ())
    by_address = {card.gpu.address: card for card in available}
    every_card = {card.gpu.address for card in gpu_cards(facts)}
    cards: list[GpuCard] = []
    misses: list[tuple[str, VmGpuMiss]] = []
    for name in names:
        if name.startswith("gpu"):
            index = int(name[3:])
            if index < len(available):
                cards.append(available[index])
            else:
                misses.append((name, VmGpuMiss.NO_SUCH_INDEX))
        elif name in by_address:
            cards.append(by_address[name])
        else:
            misses.append((name, VmGpuMiss.KEPT if name in every_card else VmGpuMiss.NO_SUCH_ADDRESS))
    return VmGpus(available, tuple(cards), tuple(misses))


@dataclass(frozen=True)
class DeclaredTwice:
    """A GPU that two declared VMs both name (by alias or by address)."""

    address: str
    first: str  # the VM that declares it first (gpuhost_vms order)
    second: str


def gpus_declared_twice(
    facts: HostFacts, selector: GpuSelector, declared: Sequence[tuple[str, Sequence[str]]]
) -> tuple[DeclaredTwice, ...]:
    """Each GPU that two of the declared VMs ((name, gpus) in gpuhost_vms order) resolve to. The VMs
    of gpuhost_vms run at once (CPUs and 1 GiB pages are sized for all of them), so render and the
    planner both refuse what this finds."""
    owner: dict[str, str] = {}
    twice: list[DeclaredTwice] = []
    for name, gpus in declared:
        for address in dict.fromkeys(
            card.gpu.address for card in (vm_gpus(facts, selector, gpus).cards if gpus else ())
        ):
            if address in owner:
                twice.append(DeclaredTwice(address, owner[address], name))
            else:
                owner[address] = name
    return tuple(twice)


def nvswitch_functions_to_bind(facts: HostFacts, selection: GpuSelection) -> tuple[PciFunction, ...]:
    """What vfio-pci must own for the full passthrough model: each NVSwitch's IOMMU group but its
    bridges (gpuhost.passthrough's rule) (the NVSwitch itself; anything else there is an intruder the checks name)."""
    if selection.nvswitch_model is not NvSwitchModel.FULL_PASSTHROUGH:
        return ()
    found: dict[str, PciFunction] = {}
    for nvswitch in selection.nvswitches:
        for member in function_group_to_bind(facts, nvswitch):
            found.setdefault(member.address, member)
    return tuple(found.values())


def nvswitch_group_intruders(facts: HostFacts, selection: GpuSelection) -> tuple[PciFunction, ...]:
    """Functions sharing an NVSwitch's IOMMU group that are neither NVSwitches nor bridges: binding
    the group to vfio-pci would take them from the host (the planner and render refuse that)."""
    return tuple(f for f in nvswitch_functions_to_bind(facts, selection) if not f.is_nvswitch)


def allowed_shared_groups(variables: Mapping[str, Any], where: str) -> tuple[str, ...]:
    """gpuhost_allow_shared_group: GPU addresses whose shared IOMMU group the operator accepts."""
    shared = variables.get("gpuhost_allow_shared_group", [])
    if isinstance(shared, str):
        shared = [shared]
    if not isinstance(shared, list):
        raise InputError(f"{where}: gpuhost_allow_shared_group must be a list of GPU PCI addresses.")
    return GpuSelector.parse(shared, where, "gpuhost_allow_shared_group").addresses if shared else ()
