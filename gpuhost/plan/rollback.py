"""(HostFacts, what apply recorded on the host) -> RollbackPlan: the exact inverse of apply's files.

Pure, as the planner: the rollback role carries this plan out (gpuhost.passthrough.rollback_plan,
then host_files) and decides nothing. Every path apply changes is either gpuhost's alone
(gpuhost.plan.files.GPUHOST_FILES: removed) or the host's (recorded before apply's first change:
a copy under BACKUP_DIR, put back, or a note in ABSENT_RECORD_PATH that it was absent, removed).
What rebuilds the boot comes from the host's facts with the planner's own knowledge of its boot
loader (gpuhost.plan.platform), not from the tools a host happens to have installed.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import asdict, dataclass
from typing import Any

from gpuhost.facts.model import BootloaderKind, HostFacts
from gpuhost.plan.files import GPUHOST_FILES
from gpuhost.plan.model import (
    ABSENT_RECORD_PATH,
    ABSENT_SUFFIX,
    APT_PIN_PATH,
    BACKUP_DIR,
    DEADLINE_SERVICE_PATH,
    DEADLINE_TIMER_PATH,
    FSTAB_MARKER,
    FSTAB_PATH,
    GRUB_DROPIN_PATH,
    INITRAMFS_MODULES_MARKER,
    INITRAMFS_MODULES_PATH,
    KERNEL_CMDLINE_PATH,
    KERNEL_INSTALL_REFRESH,
    PROXMOX_BOOT_TOOL_REFRESH,
    REBOOT_COMMAND,
    TRIAL_GRUB_SCRIPT_PATH,
    TRIAL_LOADER_ENTRY_ID,
    TRIAL_SETTINGS_PATH,
    FileChange,
    FileState,
    KernelCmdlineWriter,
    Regenerates,
)
from gpuhost.plan.platform import choose_kernel_cmdline_writer


def read_backups_command(backup_dir: str = BACKUP_DIR) -> str:
    """One read-only command on the host: every file under `backup_dir` (NUL-separated), an empty
    name, then the record of the paths that were absent (JSON)."""
    record = shlex.quote(backup_dir + ABSENT_SUFFIX)
    return f"find {shlex.quote(backup_dir)} ! -type d -print0 2>/dev/null; printf '\\0'; cat {record} 2>/dev/null; true"


# gpuhost's marked blocks in files of the host's: a copy is put back only where the file, without
# the block, is still the copy (else only the block goes, and the host's later edits stay).
BLOCK_MARKERS = {INITRAMFS_MODULES_PATH: INITRAMFS_MODULES_MARKER, FSTAB_PATH: FSTAB_MARKER}
UPDATE_INITRAMFS = "update-initramfs -u -k all"
UPDATE_GRUB = "update-grub"
_REBUILDS_NOTHING = (FSTAB_PATH, APT_PIN_PATH, DEADLINE_TIMER_PATH, DEADLINE_SERVICE_PATH)


class BackupsUnreadable(ValueError):
    """What apply recorded on the host cannot be read (the message says what and where)."""


@dataclass(frozen=True)
class Backups:
    """What apply recorded on one host before its first change."""

    copied: tuple[str, ...]  # host paths with a copy under BACKUP_DIR (the original file)
    absent: tuple[str, ...]  # host paths that did not exist before apply


def parse_backups(output: bytes, backup_dir: str = BACKUP_DIR) -> Backups:
    """read_backups_command's output -> Backups (BackupsUnreadable when the record is not a list of paths)."""
    listing, _, record = output.partition(b"\0\0") if not output.startswith(b"\0") else (b"", b"", output[1:])
    prefix = backup_dir + "/"
    copied = sorted(
        name[len(prefix) - 1 :]
        for name in (item.decode("utf-8", "surrogateescape") for item in listing.split(b"\0") if item)
        if name.startswith(prefix)
    )
    absent: list[str] = []
    if record.strip():
        try:
            absent = json.loads(record)
        except ValueError as error:
            raise BackupsUnreadable(f"{ABSENT_RECORD_PATH} is not JSON ({error}): restore it or remove it") from error
        if not isinstance(absent, list) or not all(isinstance(p, str) and p.startswith("/") for p in absent):
            raise BackupsUnreadable(f"{ABSENT_RECORD_PATH} is not a list of absolute paths: restore it or remove it")
    return Backups(copied=tuple(copied), absent=tuple(absent))


@dataclass(frozen=True)
class RollbackPlan:
    host: str
    files: tuple[FileChange, ...]  # in order: gpuhost's files removed, the host's put back
    # What rebuilds the boot from the files, by what a changed file calls for (host_files' regenerate).
    rebuild: dict[str, str]
    reboot_command: str
    reboot_timeout: int  # seconds the host may take to come back (gpuhost_verify_reboot_timeout, --reboot-timeout)
    backup_dir: str
    absent_record: str
    backups: Backups
    notes: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["schema"] = "gpuhost.rollback/1"
        plain: dict[str, Any] = json.loads(json.dumps(data, default=str))
        return plain


def plan_rollback(host: str, facts: HostFacts, backups: Backups, reboot_timeout: int) -> RollbackPlan:
    """Every path apply may have changed, undone: gpuhost's files removed, each recorded path of the
    host's put back as it was (its copy, or removed where it was absent), gpuhost's blocks taken out
    of files an earlier gpuhost changed without a copy."""
    notes: list[str] = []
    # A trial loader entry lies beside the entries it copied: every directory the host has them in.
    entry_dirs = sorted({entry.path.rsplit("/", 1)[0] for entry in facts.firmware.loader_entries or ()})
    owned = tuple(dict.fromkeys([*GPUHOST_FILES, *(f"{d}/{TRIAL_LOADER_ENTRY_ID}" for d in entry_dirs)]))
    changes = [FileChange(path, FileState.ABSENT, regenerates=_regenerates(path)) for path in owned]
    for path in backups.copied:
        changes.append(
            FileChange(path, FileState.RESTORED, regenerates=_regenerates(path), marker=BLOCK_MARKERS.get(path, ""))
        )
    for path, marker in BLOCK_MARKERS.items():
        if path not in backups.copied and path not in backups.absent:
            changes.append(FileChange(path, FileState.BLOCK, "", regenerates=_regenerates(path), marker=marker))
    changes += [
        FileChange(path, FileState.ABSENT, regenerates=_regenerates(path))
        for path in backups.absent
        if path not in owned
    ]
    rebuild = {Regenerates.INITRAMFS.value: UPDATE_INITRAMFS}
    loader = facts.bootloader.kind
    if loader is BootloaderKind.GRUB:
        rebuild[Regenerates.GRUB.value] = UPDATE_GRUB
    elif loader is BootloaderKind.SYSTEMD_BOOT:
        writer = choose_kernel_cmdline_writer(facts)
        if writer is None:
            notes.append(
                "systemd-boot without kernel-install or proxmox-boot-tool: the loader entries are not written "
                f"again from the restored {KERNEL_CMDLINE_PATH}"
            )
        else:
            rebuild[Regenerates.LOADER_ENTRIES.value] = (
                PROXMOX_BOOT_TOOL_REFRESH if writer is KernelCmdlineWriter.PROXMOX_BOOT_TOOL else KERNEL_INSTALL_REFRESH
            )
    else:
        notes.append(f"the host boots with {loader}: only the initramfs is built again")
    if not backups.copied and not backups.absent:
        notes.append(f"no record of apply under {BACKUP_DIR}: only gpuhost's own files and blocks are removed")
    return RollbackPlan(
        host=host,
        files=tuple(changes),
        rebuild=rebuild,
        reboot_command=REBOOT_COMMAND,
        reboot_timeout=reboot_timeout,
        backup_dir=BACKUP_DIR,
        absent_record=ABSENT_RECORD_PATH,
        backups=backups,
        notes=tuple(notes),
    )


def _regenerates(path: str) -> Regenerates | None:
    """What the host builds again when `path` changes: what apply's change of it calls for
    (gpuhost.plan.files; tests/plan/test_rollback_plan.py keeps the two equal). A file of the host's
    not named here (modprobe.d's, the driver's) may be in the initramfs: it is built again."""
    if path in (GRUB_DROPIN_PATH, TRIAL_SETTINGS_PATH, TRIAL_GRUB_SCRIPT_PATH):
        return Regenerates.GRUB
    if path == KERNEL_CMDLINE_PATH:
        return Regenerates.LOADER_ENTRIES
    if path in _REBUILDS_NOTHING or path.endswith("/" + TRIAL_LOADER_ENTRY_ID):
        return None
    return Regenerates.INITRAMFS
