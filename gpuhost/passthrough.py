"""One answer to "which devices must vfio-pci own for the selected GPUs, and is each IOMMU group usable".

The audit's checks, the planner, render and the verification after apply's reboot all ask this
module; none of them filters group members on its own.

A GPU goes to a guest with its whole IOMMU group. The group's members fall in three kinds:

* a function of a GPU card (the GPU and its audio/USB/UCSI companions in the same slot): vfio-pci
  owns it. When the card is another GPU's, that GPU must go to the same guest (selected with it).
* a bridge that vfio-pci need not own. The rule is the kernel's group viability check
  (drivers/vfio/group.c, vfio_dev_driver_allowed): a PCI-to-PCI bridge (class 0604: root ports and
  PCIe switch ports, type-1 header) is accepted on any driver (pcieport); a host bridge (class
  0600, a normal header) is accepted only while no driver is bound to it.
* anything else is an intruder: binding the group would take it from the host.

A group is USABLE when it holds only the selected GPUs' functions and such bridges. It is UNKNOWN,
and never usable, when its listing could not be read or is empty, lacks the GPU, names an address
that was not gathered, or when the facts contradict each other: a function whose iommu_group link
names the group but which the listing omits (or the reverse), or a group name (a directory or a
link) that is not plain ASCII digits, which the kernel never writes (`+6`, `٦`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from gpuhost.facts.model import HostFacts, TextEnum
from gpuhost.facts.pci import CLASS_HOST_BRIDGE, CLASS_PCI_BRIDGE, GPU_COMPANION_CLASSES, LONE_GPU_CLASSES, PciFunction


@dataclass(frozen=True)
class GpuCard:
    """A GPU's display function with the other functions of the same card (audio, USB, ...)."""

    gpu: PciFunction
    companions: tuple[PciFunction, ...]

    @property
    def functions(self) -> tuple[PciFunction, ...]:
        return (self.gpu, *self.companions)


def gpu_cards(facts: HostFacts) -> tuple[GpuCard, ...]:
    by_slot: dict[str, list[PciFunction]] = {}
    for function in facts.pci:
        by_slot.setdefault(function.slot, []).append(function)
    cards = []
    for function in facts.pci:
        slot = by_slot[function.slot]
        leads = function.is_gpu or (function.base_class in LONE_GPU_CLASSES and not any(other.is_gpu for other in slot))
        if not leads:
            continue
        companions = tuple(
            other for other in slot if other.address != function.address and other.base_class in GPU_COMPANION_CLASSES
        )
        cards.append(GpuCard(gpu=function, companions=companions))
    return tuple(cards)


def needs_no_binding(function: PciFunction) -> bool:
    """Whether vfio accepts `function` in a passed group without owning it (the module's rule above)."""
    if function.base_class == CLASS_PCI_BRIDGE:
        return True
    return function.base_class == CLASS_HOST_BRIDGE and function.driver is None and not function.driver_unknown


class GroupListing(TextEnum):
    """How much is known about a GPU's IOMMU group."""

    LISTED = "listed"  # the listing was read, names the GPU, every entry is gathered, no contradiction
    NO_GROUP = "no-group"  # the GPU has no iommu_group link: the IOMMU does not cover it (or is off)
    UNKNOWN = "unknown"  # missing, empty, lacks the GPU, names a function not gathered, or contradictory


@dataclass(frozen=True)
class GroupIsolation:
    """One card's IOMMU group, judged for the GPUs `selected` with it (analyse_group)."""

    card: GpuCard
    group: int | None
    listing: GroupListing
    members: tuple[PciFunction, ...]  # every function of the group (LISTED only; else empty)
    intruders: tuple[PciFunction, ...]  # neither a GPU card's function nor a bridge vfio accepts unbound
    other_cards: tuple[GpuCard, ...]  # other GPUs with a function in the group
    kept_cards: tuple[GpuCard, ...] = ()  # those of other_cards that are not selected with this card
    unknown_reason: str = ""  # why the listing is UNKNOWN, for the message

    @property
    def to_bind(self) -> tuple[PciFunction, ...]:
        """What vfio-pci must own to pass this card: every member but the bridges it need not own.
        Where the group is not LISTED, the card's own functions: never nothing, so their drivers are
        still judged and shown (issue 13.2: an empty listing once left an nvidia-bound GPU 'ready')."""
        members = self.members if self.listing is GroupListing.LISTED else self.card.functions
        return tuple(member for member in members if not needs_no_binding(member))

    @property
    def isolated(self) -> bool:
        """Alone in its group: only the card's functions and bridges."""
        return self.listing is GroupListing.LISTED and not self.intruders and not self.other_cards

    @property
    def usable(self) -> bool:
        """The group may go to one guest with the selected GPUs: known, no intruder, no GPU left out."""
        return self.listing is GroupListing.LISTED and not self.intruders and not self.kept_cards


def analyse_group(facts: HostFacts, card: GpuCard, selected: Collection[str] = ()) -> GroupIsolation:
    """`card`'s group; `selected` are the GPU addresses that go to the same place with it (the host's
    passthrough selection for audit and plan, one VM's GPUs for render): any other GPU of the group
    is a kept card, which makes the group unusable."""
    gpu = card.gpu
    if gpu.iommu_group is None:
        return GroupIsolation(card, None, GroupListing.NO_GROUP, (), (), ())
    group = gpu.iommu_group
    listing_path = f"/sys/kernel/iommu_groups/{group}/devices"
    if facts.iommu.malformed_names:
        names = ", ".join(facts.iommu.malformed_names)
        return _unknown(card, f"the IOMMU group facts contradict each other (names that are not numbers: {names})")
    addresses = facts.iommu.groups.get(group)
    if not addresses:
        reason = f"{listing_path} is {'empty' if addresses is not None else 'missing'} or could not be read"
        return _unknown(card, reason)
    if gpu.address not in addresses:
        return _unknown(card, f"{listing_path} does not list the GPU itself")
    members = [facts.function(address) for address in addresses]
    unlisted = [address for address, member in zip(addresses, members, strict=True) if member is None]
    if unlisted:
        return _unknown(card, f"{listing_path} names {', '.join(unlisted)}, which is not on the PCI bus as gathered")
    linked_elsewhere = [m.address for m in members if m is not None and m.iommu_group != group]
    if linked_elsewhere:
        return _unknown(
            card, f"{listing_path} names {', '.join(linked_elsewhere)}, whose iommu_group link names another group"
        )
    hidden = [f.address for f in facts.pci if f.iommu_group == group and f.address not in addresses]
    if hidden:
        return _unknown(
            card,
            f"the iommu_group link of {', '.join(hidden)} names group {group}, but {listing_path} does not list it",
        )
    known = tuple(member for member in members if member is not None)
    card_of = {function.address: other for other in gpu_cards(facts) for function in other.functions}
    own = {function.address for function in card.functions}
    intruders = tuple(m for m in known if m.address not in card_of and not needs_no_binding(m))
    others = {
        card_of[m.address].gpu.address: card_of[m.address]
        for m in known
        if m.address in card_of and m.address not in own
    }
    other_cards = tuple(others[a] for a in sorted(others))
    kept = tuple(other for other in other_cards if other.gpu.address not in selected)
    return GroupIsolation(card, group, GroupListing.LISTED, known, intruders, other_cards, kept)


def _unknown(card: GpuCard, reason: str) -> GroupIsolation:
    return GroupIsolation(card, card.gpu.iommu_group, GroupListing.UNKNOWN, (), (), (), (), reason)


def analyse_groups(facts: HostFacts, cards: Sequence[GpuCard]) -> tuple[GroupIsolation, ...]:
    """Each card's group, judged for `cards` going together (one host's selection, one VM's GPUs)."""
    selected = {card.gpu.address for card in cards}
    return tuple(analyse_group(facts, card, selected) for card in cards)


def functions_to_bind(facts: HostFacts, cards: Sequence[GpuCard]) -> tuple[PciFunction, ...]:
    """What vfio-pci must own to pass `cards` through together: each group's `to_bind`, once each,
    in the order met (GPUs sharing a group share its functions)."""
    return _once(f for isolation in analyse_groups(facts, cards) for f in isolation.to_bind)


def function_group_to_bind(facts: HostFacts, function: PciFunction) -> tuple[PciFunction, ...]:
    """What vfio-pci must own to pass a non-GPU function (an NVSwitch) with its group: every member
    but the bridges it need not own; the function alone where its group is not known."""
    if facts.iommu.malformed_names:
        return (function,)
    return tuple(member for member in group_members(facts, function) if not needs_no_binding(member))


def group_members(facts: HostFacts, function: PciFunction) -> tuple[PciFunction, ...]:
    """Every gathered function of `function`'s IOMMU group listing, itself included; only itself
    where the listing is not known (no group, missing, empty, or not naming it)."""
    addresses = facts.iommu.groups.get(function.iommu_group) if function.iommu_group is not None else None
    if not addresses or function.address not in addresses:
        return (function,)
    return tuple(member for member in (facts.function(a) for a in addresses) if member is not None)


def _once(functions: Iterable[PciFunction]) -> tuple[PciFunction, ...]:
    found: dict[str, PciFunction] = {}
    for function in functions:
        found.setdefault(function.address, function)
    return tuple(found.values())
