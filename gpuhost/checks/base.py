"""The context every check reads. Checks return `Problem`s (the audit's findings); they never print."""

from __future__ import annotations

from dataclasses import dataclass

from gpuhost.facts.model import HostFacts
from gpuhost.facts.pci import PciFunction

# AuditPolicy is re-exported: the collection's plugins (playbooks/) import it from here.
from gpuhost.inventory.policy import AuditPolicy as AuditPolicy
from gpuhost.inventory.policy import Role
from gpuhost.problems import Problem, Severity
from gpuhost.selection import GpuSelection


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
