"""The extended lab set: lab modules too long for every landing, one of which each CI run adds.

Every CI run runs the per-landing lab suite and one module of `EXTENDED`, chosen from the commit
alone: the number of commits reachable from HEAD (`git rev-list --count HEAD`) modulo the set's
size. Consecutive landings therefore cover the whole set, one module each, and a re-run of one
commit runs the same module. `GPUHOST_LAB_EXTENDED` chooses by hand: `all` runs the whole set,
`none` none of it, a module's file name (or several, comma-separated) those.

Pure but for `commit_count` and `current`: tests/lab/conftest.py collects by `current()`, tests/conftest.py
names it in pytest's header, and .ci/stage_table.py in CI's stage table (it loads this file by path: no
pytest, no gpuhost import).
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

EXTENDED_ENV = "GPUHOST_LAB_EXTENDED"

# Each module says what it proves and on which boot loader; all run in the lab-rest xdist group,
# the lighter of the two per-landing groups (docs/maintainers/testing.md has their times).
EXTENDED: tuple[str, ...] = (
    "test_bmc_power_on_lab.py",  # BIOS GRUB: a host gone dark in its trial boot, powered on by its BMC
    "test_panic_rescues_lab.py",  # BIOS GRUB: the root-device hang and the kernel stall, each ending in panic=N
    "test_userspace_stall_lab.py",  # BIOS GRUB: the userspace stall, reset by the trial's deadline timer
    "test_systemd_boot_hangs_lab.py",  # systemd-boot: the root-device hang; the userspace stall
    "test_systemd_boot_kernel_stall_lab.py",  # systemd-boot: the kernel stall
    "test_bmc_watchdog_lab.py",  # BIOS GRUB: apply's arming of the BMC's watchdog, a stall with interrupts off
    "test_secure_boot_panic_lab.py",  # shim + signed GRUB under Secure Boot: a trial kernel that panics
)


class RotationError(ValueError):
    """A GPUHOST_LAB_EXTENDED value that names no module of the set."""


@dataclass(frozen=True)
class Rotation:
    chosen: tuple[str, ...]  # file names under tests/lab/, in EXTENDED's order
    why: str  # one line for the test header and CI's stage table

    @property
    def left_out(self) -> tuple[str, ...]:
        return tuple(module for module in EXTENDED if module not in self.chosen)


def choose(setting: str | None, commit_count: int | None) -> Rotation:
    """The extended modules to run: by `setting` (GPUHOST_LAB_EXTENDED) when given, else by the
    commit count. Without either (not a git checkout) none, and the reason says so."""
    if setting is not None and setting.strip():
        value = setting.strip()
        if value == "all":
            return Rotation(EXTENDED, f"{EXTENDED_ENV}=all: the whole extended set")
        if value == "none":
            return Rotation((), f"{EXTENDED_ENV}=none: no extended module")
        named = [name.strip() for name in value.split(",") if name.strip()]
        unknown = [name for name in named if name not in EXTENDED]
        if unknown or not named:
            raise RotationError(
                f"{EXTENDED_ENV}={value!r} names no module of the extended set ({', '.join(unknown) or 'empty'}); "
                f"use all, none, or some of: {', '.join(EXTENDED)}"
            )
        return Rotation(tuple(m for m in EXTENDED if m in named), f"{EXTENDED_ENV}={value}")
    if commit_count is None:
        return Rotation((), "no extended module: no git commit count (not a git checkout)")
    index = commit_count % len(EXTENDED)
    return Rotation(
        (EXTENDED[index],),
        f"commit count {commit_count}, {commit_count} mod {len(EXTENDED)} = {index}: {EXTENDED[index]}",
    )


def commit_count(repository: Path) -> int | None:
    """`git rev-list --count HEAD` in `repository`; None where git or the history is missing."""
    try:
        done = subprocess.run(
            ["git", "-C", str(repository), "rev-list", "--count", "HEAD"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    text = done.stdout.strip()
    return int(text) if done.returncode == 0 and text.isdigit() else None


REPOSITORY = Path(__file__).resolve().parents[2]


def current() -> Rotation:
    """This checkout's choice: GPUHOST_LAB_EXTENDED, else this commit's count."""
    return choose(os.environ.get(EXTENDED_ENV), commit_count(REPOSITORY))
