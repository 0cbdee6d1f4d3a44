"""The kernel command line: every option gpuhost reads or writes, who owns it, and what the audit makes of it.

One table, `KERNEL_OPTIONS`, answers each question about the line in one place:

* which options the plan writes, and how much of each it claims: the claimed options are taken out of
  the host's own lines before gpuhost's are appended (the planner, the GRUB drop-in's filter, the
  reboot reasons) -- `claim`;
* which options the audit compares between GRUB's line and /proc/cmdline (`cmdline.pending_reboot`)
  -- `PENDING_REBOOT_KEYS`;
* which options the audit reports when they sit in a file the active boot loader never reads
  (`bootloader.cmdline_ignored`) -- `IGNORED_FILE_KEYS`;
* which options the boot loader itself puts before the configured line, which the rollback's
  verification skips -- `BOOT_LOADER_KEYS`.

The trial entry's own options (panic=N, the trial marker `gpuhost.trial=1`, the stall panics and the
deadline timer) are not in this table: they go on the one-shot trial entry only, never on the default
line, and gpuhost.plan.rescue (`STALL_SETTINGS`) and gpuhost.plan.model (`TRIAL_MARKER`) define them.
None of them is an option of this table, so a committed trial, which runs on with them until its next
reboot, is not taken for a pending reboot (tests/plan/test_cmdline_table.py checks it).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpuhost.facts.model import KernelCommandLine, TextEnum


class Owner(TextEnum):
    """Who sets an option, and how much of it gpuhost's plan claims from the host's own lines."""

    # Every value is gpuhost's, whether or not this plan writes the option: gpuhost's is the one setting
    # (a host's own hugepages= goes even where the plan reserves no page).
    GPUHOST = "gpuhost"
    # Every value is gpuhost's where this plan writes the option; where it does not, the host's stays.
    GPUHOST_WHEN_WRITTEN = "gpuhost-when-written"
    # Only the exact value this plan writes: the host's other values stay (its own modprobe.blacklist=).
    GPUHOST_VALUE = "gpuhost-value"
    HOST = "host"  # the host's own: the audit reads it, the plan never writes it
    BOOT_LOADER = "boot-loader"  # put before the configured line by the boot loader (update-grub's root= and ro)


class AuditUse(TextEnum):
    """What the audit does with an option wherever it finds it."""

    # cmdline.pending_reboot: GRUB's line and /proc/cmdline differ in it, so the next boot changes it.
    PENDING_REBOOT = "pending-reboot"
    # bootloader.cmdline_ignored: set in a file the active boot loader never reads, it does nothing.
    IGNORED_FILE = "ignored-file"


@dataclass(frozen=True)
class KernelOption:
    """One option of the kernel command line, as gpuhost reads or writes it."""

    key: str  # as the kernel reads it: the part before '=' ('vfio-pci.ids'), or the whole of a bare flag
    purpose: str
    owner: Owner
    audit: frozenset[AuditUse] = frozenset()
    # The value the plan writes where it is fixed ('pt' for iommu); '' for a bare flag (nomodeset);
    # None where the plan computes it per host (vfio-pci.ids) or never writes the option.
    value: str | None = None

    def token(self, value: str | None = None) -> str:
        """The option as the plan writes it: `key=value`, or the bare key of a flag."""
        chosen = self.value if value is None else value
        if chosen is None:
            raise ValueError(f"kernel option {self.key}: its value is computed per host; pass it")
        return f"{self.key}={chosen}" if chosen else self.key


_BOTH = frozenset(AuditUse)
_PENDING = frozenset({AuditUse.PENDING_REBOOT})

VFIO_PCI_IDS = KernelOption(
    "vfio-pci.ids", "the vendor:device IDs vfio-pci takes at boot, before any host driver", Owner.GPUHOST, _BOTH
)
MODPROBE_BLACKLIST = KernelOption(
    "modprobe.blacklist",
    "modules never loaded: the host GPU drivers (nouveau, nvidia, nvidiafb) and, by choice, snd_hda_intel",
    Owner.GPUHOST_VALUE,
    _BOTH,
)
IOMMU = KernelOption(
    "iommu", "pt: the host's own devices bypass IOMMU translation; off turns the IOMMU off", Owner.GPUHOST, _BOTH, "pt"
)
INTEL_IOMMU = KernelOption(
    "intel_iommu",
    "on: turns VT-d on where the kernel does not by itself (kept once an earlier apply added it)",
    Owner.GPUHOST_WHEN_WRITTEN,
    _BOTH,
    "on",
)
AMD_IOMMU = KernelOption(
    "amd_iommu", "AMD-Vi's tuning (on by default: no 'on' value); off turns it off", Owner.HOST, _BOTH
)
HUGEPAGES = KernelOption(
    "hugepages", "the 1 GiB pages reserved at boot (hugepages=N, or per NUMA node)", Owner.GPUHOST, _BOTH
)
HUGEPAGE_SIZE = KernelOption("hugepagesz", "the size hugepages= reserves", Owner.GPUHOST, _BOTH, "1G")
DEFAULT_HUGEPAGE_SIZE = KernelOption(
    "default_hugepagesz", "the size of the default hugetlbfs pool", Owner.GPUHOST, _BOTH, "1G"
)
PCI = KernelOption(
    "pci",
    "realloc (gpuhost_pci_realloc): the kernel reassigns the BARs the firmware left too small",
    Owner.GPUHOST_VALUE,
    _BOTH,
    "realloc",
)
PCIE_ASPM = KernelOption(
    "pcie_aspm", "off (gpuhost_pcie_aspm_off): no PCIe link power saving", Owner.GPUHOST_VALUE, _BOTH, "off"
)
NOMODESET = KernelOption(
    "nomodeset",
    "gpuhost_nomodeset: no kernel mode setting, so no DRM driver takes a GPU for the console",
    Owner.GPUHOST_VALUE,
    _BOTH,
    "",
)
PCIE_ACS_OVERRIDE = KernelOption(
    "pcie_acs_override",
    "pretends devices are isolated (cmdline.acs_override: not for production)",
    Owner.HOST,
    _PENDING,
)
VIDEO = KernelOption("video", "the console's framebuffer (video=efifb:off and the like)", Owner.HOST, _BOTH)

# update-grub's entry puts the kernel image, root= and ro before GRUB_CMDLINE_LINUX; systemd-boot puts
# an entry's initrd before its options (initrd=\debian\<kver>\initrd.img-<kver>).
BOOT_IMAGE = KernelOption("BOOT_IMAGE", "the kernel image GRUB booted", Owner.BOOT_LOADER)
ROOT = KernelOption("root", "the root filesystem", Owner.BOOT_LOADER)
RO = KernelOption("ro", "mount the root filesystem read-only first", Owner.BOOT_LOADER)
ROOTFLAGS = KernelOption("rootflags", "the root filesystem's mount options", Owner.BOOT_LOADER)
INITRD = KernelOption("initrd", "the initramfs systemd-boot loaded", Owner.BOOT_LOADER)

# The order is the order of the plan's owned keys and of the GRUB drop-in's patterns.
KERNEL_OPTIONS = (
    VFIO_PCI_IDS,
    MODPROBE_BLACKLIST,
    IOMMU,
    INTEL_IOMMU,
    AMD_IOMMU,
    HUGEPAGES,
    HUGEPAGE_SIZE,
    DEFAULT_HUGEPAGE_SIZE,
    PCI,
    PCIE_ASPM,
    NOMODESET,
    PCIE_ACS_OVERRIDE,
    VIDEO,
    BOOT_IMAGE,
    ROOT,
    RO,
    ROOTFLAGS,
    INITRD,
)
_BY_KEY = {option.key: option for option in KERNEL_OPTIONS}


def _keys(*, owner: Owner | None = None, audit: AuditUse | None = None) -> tuple[str, ...]:
    return tuple(
        option.key
        for option in KERNEL_OPTIONS
        if (owner is None or option.owner is owner) and (audit is None or audit in option.audit)
    )


# Every value of these is gpuhost's: taken out of the host's lines whatever the plan writes.
OWNED_KEYS = _keys(owner=Owner.GPUHOST)
PENDING_REBOOT_KEYS = _keys(audit=AuditUse.PENDING_REBOOT)
IGNORED_FILE_KEYS = _keys(audit=AuditUse.IGNORED_FILE)
BOOT_LOADER_KEYS = _keys(owner=Owner.BOOT_LOADER)


def key_of(token: str) -> str:
    """'vfio-pci.ids=10de:2330' -> 'vfio-pci.ids'; a bare flag is its own key."""
    return token.split("=", 1)[0]


def option_for(token: str) -> KernelOption:
    """The table's row for a token; a token gpuhost does not know is a programming error."""
    option = _BY_KEY.get(key_of(token))
    if option is None:
        raise ValueError(f"kernel option {token!r} is not in gpuhost.cmdline.KERNEL_OPTIONS")
    return option


def with_keys(tokens: Iterable[str], keys: Iterable[str]) -> tuple[str, ...]:
    """The tokens whose key is one of `keys`, in their order."""
    wanted = frozenset(keys)
    return tuple(token for token in tokens if key_of(token) in wanted)


@dataclass(frozen=True)
class Claim:
    """What a plan takes out of the host's own lines before it appends its options: every value of
    `keys`, and the exact `tokens`."""

    keys: tuple[str, ...]
    tokens: tuple[str, ...]

    def covers(self, token: str) -> bool:
        return key_of(token) in self.keys or token in self.tokens

    def remove_from(self, line: KernelCommandLine | None) -> tuple[str, ...]:
        """The line's tokens without the claimed ones (the host's own options)."""
        if line is None:
            return ()
        return tuple(token for token in line.tokens if not self.covers(token))

    def shell_patterns(self) -> list[str]:
        """Shell case patterns matching what `remove_from` removes (values are validated: no quoting needed)."""
        return [f"{key}=*" for key in self.keys] + list(self.tokens)


def claim(written: Iterable[str]) -> Claim:
    """What a plan that writes `written` (its options, in order) claims, by each option's owner."""
    keys = list(OWNED_KEYS)
    tokens: list[str] = []
    for token in written:
        option = option_for(token)
        if option.owner is Owner.GPUHOST_WHEN_WRITTEN and option.key not in keys:
            keys.append(option.key)
        elif option.owner is Owner.GPUHOST_VALUE:
            tokens.append(token)
        elif option.owner not in (Owner.GPUHOST, Owner.GPUHOST_WHEN_WRITTEN):
            raise ValueError(f"kernel option {token!r} is the {option.owner}'s: gpuhost's plan never writes it")
    return Claim(tuple(keys), tuple(tokens))
