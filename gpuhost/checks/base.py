"""The context every check reads. Checks return `Problem`s (the audit's findings); they never print."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuhost.facts.model import HostFacts, PciFunction, TextEnum
from gpuhost.problems import Problem, Severity
from gpuhost.selection import GpuSelection, GpuSelector

if TYPE_CHECKING:
    from gpuhost.render.spec import VmSpec


class Role(TextEnum):
    """What the audit judges a machine as (gpuhost_role / --role)."""

    AUTO = "auto"  # detect: a VM without an IOMMU whose NVIDIA GPU runs nvidia is a guest, else a host
    HOST = "host"  # a VM host that passes GPUs through
    GUEST = "guest"  # a passthrough guest, seen from inside


ROLES = tuple(Role)  # the accepted values, for validation messages


@dataclass(frozen=True)
class AuditPolicy:
    """What the operator asked for: which GPUs, and whether the host is a VM host or a guest."""

    gpus: GpuSelector
    role: str = Role.AUTO  # a Role value (targets validate the inventory's string against ROLES)
    allow_shared_group: tuple[str, ...] = ()  # addresses whose group may hold other devices
    vms: tuple[VmSpec, ...] = ()  # gpuhost_vms: the VMs whose memory the host's NUMA nodes must hold


@dataclass(frozen=True)
class CheckContext:
    host: str
    facts: HostFacts
    policy: AuditPolicy
    selection: GpuSelection
    role: Role

    def unreadable(self, code: str, subject: str, path: str, consequence: str) -> Problem:
        """A warning that a file the check needs could not be read, and what is unknown because of it."""
        return self.finding(
            code,
            Severity.WARNING,
            subject,
            f"{path} could not be read, so {consequence}",
            f"Run the audit as root (or a user that can read {path}).",
        )

    def finding(self, code: str, severity: Severity, subject: str, fact: str, remedy: str = "") -> Problem:
        return Problem(code=code, severity=severity, subject=subject, message=f"{self.host}: {fact}", remedy=remedy)


def describe_function(function: PciFunction) -> str:
    """'0000:41:00.0 [10de:2330] (3D controller, driver nvidia)'."""
    parts = [class_name(function.base_class)]
    if function.driver_unknown:
        parts.append("driver unknown")
    else:
        parts.append(f"driver {function.driver}" if function.driver else "no driver")
    return f"{function.describe()} ({', '.join(parts)})"


_CLASS_NAMES = {
    0x0100: "SCSI controller",
    0x0106: "SATA controller",
    0x0108: "NVMe controller",
    0x0200: "Ethernet controller",
    0x0207: "InfiniBand controller",
    0x0280: "network controller",
    0x0300: "VGA controller",
    0x0302: "3D controller",
    0x0380: "display controller",
    0x0403: "HD audio",
    0x0600: "host bridge",
    0x0601: "ISA bridge",
    0x0604: "PCI bridge",
    0x0680: "bridge",
    0x0C03: "USB controller",
    0x0C05: "SMBus controller",
    0x0C80: "serial bus controller",
    0x0880: "system peripheral",
    0x00FF: "unassigned class",
}


def class_name(base_class: int | None) -> str:
    if base_class is None:
        return "unknown class"
    return _CLASS_NAMES.get(base_class, f"class {base_class:04x}")
