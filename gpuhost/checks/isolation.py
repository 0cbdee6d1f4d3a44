"""One answer to "is this GPU alone in its IOMMU group?", for the audit, the planner and render.

A GPU can be given to a guest only with its whole IOMMU group. The group holds the card's own
functions (the GPU, its audio/USB companions), bridges (never bound, harmless), and possibly
other GPUs' cards or other devices ("intruders") that would leave the host with it. When the
group's `devices/` listing could not be read, is empty, or names an address that is not on the
PCI bus as gathered, nothing is known about the group: that is reported as unknown, never as clean.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuhost.facts.model import HostFacts, PciFunction, TextEnum
from gpuhost.selection import GpuCard, gpu_cards


class GroupListing(TextEnum):
    """How much is known about a GPU's IOMMU group."""

    LISTED = "listed"  # /sys/kernel/iommu_groups/N/devices was read and every entry is a known function
    NO_GROUP = "no-group"  # the GPU has no iommu_group link: the IOMMU does not cover it (or is off)
    UNKNOWN = "unknown"  # the listing is missing, empty, lacks the GPU, or names a function not gathered


@dataclass(frozen=True)
class GroupIsolation:
    card: GpuCard
    group: int | None
    listing: GroupListing
    members: tuple[PciFunction, ...]  # every function of the group (LISTED only; else empty)
    intruders: tuple[PciFunction, ...]  # neither a GPU card's function nor a bridge
    other_cards: tuple[GpuCard, ...]  # other GPUs with a function in the group
    unknown_reason: str = ""  # why the listing is UNKNOWN, for the message

    @property
    def to_bind(self) -> tuple[PciFunction, ...]:
        """What vfio-pci must own to pass the group through: every member that is not a bridge."""
        return tuple(member for member in self.members if not member.is_bridge)

    @property
    def isolated(self) -> bool:
        return self.listing is GroupListing.LISTED and not self.intruders and not self.other_cards


def analyse_group(facts: HostFacts, card: GpuCard) -> GroupIsolation:
    gpu = card.gpu
    if gpu.iommu_group is None:
        return GroupIsolation(card, None, GroupListing.NO_GROUP, (), (), ())
    group = gpu.iommu_group
    addresses = facts.iommu.groups.get(group)
    listing_path = f"/sys/kernel/iommu_groups/{group}/devices"
    if not addresses:
        reason = f"{listing_path} is {'empty' if addresses is not None else 'missing'} or could not be read"
        return _unknown(card, reason)
    if gpu.address not in addresses:
        return _unknown(card, f"{listing_path} does not list the GPU itself")
    members = [facts.function(address) for address in addresses]
    unlisted = [address for address, member in zip(addresses, members, strict=True) if member is None]
    if unlisted:
        return _unknown(card, f"{listing_path} names {', '.join(unlisted)}, which is not on the PCI bus as gathered")
    known = tuple(member for member in members if member is not None)
    card_of = {function.address: other for other in gpu_cards(facts) for function in other.functions}
    own = {function.address for function in card.functions}
    intruders = tuple(m for m in known if m.address not in card_of and not m.is_bridge)
    others = {
        card_of[m.address].gpu.address: card_of[m.address]
        for m in known
        if m.address in card_of and m.address not in own
    }
    return GroupIsolation(card, group, GroupListing.LISTED, known, intruders, tuple(others[a] for a in sorted(others)))


def _unknown(card: GpuCard, reason: str) -> GroupIsolation:
    return GroupIsolation(card, card.gpu.iommu_group, GroupListing.UNKNOWN, (), (), (), reason)
