"""The fault suite's lab (tests/lab/test_faults_lab.py): hosts named as an operator's inventory names
them, booted together, with the hashes of every file apply or rollback may write.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpuhost.cli.main import main
from gpuhost.lab import fleet
from gpuhost.lab.paths import LabPaths
from gpuhost.lab.recipe import STALL_MODULE_NAME
from gpuhost.lab.state import VmRecord

from .conftest import BOOT_TIMEOUT

OPTIONS = ("vfio-pci.ids=1234:1111,8086:293e", "modprobe.blacklist=nouveau,nvidia,nvidiafb", "iommu=pt")
REBOOT_TIMEOUT = 600  # generous for TCG on a loaded machine
# Everything apply or rollback may write, and the boot_id (a reboot shows as a change); Molecule's
# scenario checks the same list.
HASH_SCRIPT = (Path(__file__).resolve().parents[2] / "playbooks/molecule/default/files/state-hashes.sh").read_text()
GPU_FUNCTIONS = ("0000:01:00.0", "0000:01:00.1")


@dataclass(frozen=True)
class HostLayout:
    """One lab host of a module: image variant, memory, its own inventory variables."""

    variant: str
    memory_mib: int
    variables: Mapping[str, Any]
    topology: str = "gpu-pair"


def timing(message: str) -> None:
    print(f"[fault timing] {message}", flush=True)


@dataclass
class Host:
    paths: LabPaths
    name: str

    @property
    def record(self) -> VmRecord:
        return fleet.find_host(self.paths, "lab-1")

    def sh(self, script: str, timeout: float = 600) -> str:
        result = fleet.run_on(self.paths, self.record, ["sh", "-s"], stdin=script, timeout=timeout)
        assert result.returncode == 0, result.stderr
        return result.stdout

    def hashes(self) -> str:
        return self.sh(HASH_SCRIPT)

    def cmdline(self) -> list[str]:
        return self.sh("cat /proc/cmdline").split()

    def manifest(self) -> Manifest:
        return parse_manifest(self.sh(MANIFEST_SCRIPT))


@dataclass(frozen=True)
class Lab:
    hosts: dict[str, Host]
    layout: Mapping[str, HostLayout]
    root: Path

    def inventory(self, name: str, **overrides: dict[str, Any]) -> Path:
        """One inventory for all the module's hosts, as an operator has it; `overrides` per host name."""
        entries: dict[str, Any] = {}
        for host_name, host in self.hosts.items():
            data = yaml.safe_load(host.paths.inventory.read_text())
            (variables,) = data["all"]["hosts"].values()
            entries[host_name] = {
                **variables,
                **self.layout[host_name].variables,
                "gpuhost_verify_reboot_timeout": REBOOT_TIMEOUT,
                **overrides.get(host_name, {}),
            }
        path = self.root / f"{name}-inventory.yml"
        path.write_text(yaml.safe_dump({"all": {"hosts": entries}}))
        return path


@contextmanager
def booted_lab(root: Path, image_dir: Path, layout: Mapping[str, HostLayout]) -> Iterator[Lab]:
    """Boot every host of `layout` in parallel; stop them all at the end."""
    labs = {name: LabPaths(root=root / name, images=image_dir) for name in layout}
    started = time.monotonic()
    try:
        for name, host in layout.items():
            fleet.up(
                labs[name],
                hosts=1,
                topology=host.topology,
                variant=host.variant,
                memory_mib=host.memory_mib,
                wait=False,
            )
        with ThreadPoolExecutor(len(labs)) as pool:
            waits = [pool.submit(fleet.wait_for_ssh, p, fleet.status(p)[0].hosts, BOOT_TIMEOUT) for p in labs.values()]
            for future in waits:
                future.result()
        timing(f"{len(labs)} host(s) up in {time.monotonic() - started:.0f} s")
        yield Lab(hosts={name: Host(paths, name) for name, paths in labs.items()}, layout=layout, root=root)
    finally:
        for paths in labs.values():
            fleet.down(paths)


def apply(lab: Lab, inventory: Path, label: str, *extra: str) -> tuple[int, dict[str, Any], float]:
    report = lab.root / f"{label}-report.json"
    started = time.monotonic()
    code = main(["apply", "-i", str(inventory), "--yes", "--report", str(report), *extra])
    seconds = time.monotonic() - started
    timing(f"{label}: apply {' '.join(extra)} in {seconds:.0f} s")
    return code, json.loads(report.read_text()), seconds


# The fault the panic tests inject (TRIAL_TESTING_OPTIONS_ENV): an rdinit= that names no file in
# the initramfs, so the trial kernel mounts no root and panics for real; panic=N reboots it.
PANIC_TRIAL_OPTION = "rdinit=/gpuhost-fault-injection"


# Issue 31's root-device hang (TRIAL_TESTING_OPTIONS_ENV): a root= naming a device that never comes,
# after the entry's own (the last root= wins, for the kernel and the initramfs). Debian's initramfs
# waits max(30 s, rootdelay=) for it, then panics; without panic= its panic is a shell on the
# console, a host that hangs for good. The trial entry's panic=N turns it into a reboot onto the old
# default.
ROOT_HANG_TRIAL_OPTION = "root=/dev/disk/by-partlabel/gpuhost-no-such-root"


# The userspace stall: ssh.service masked on the trial entry only (systemd-debug-generator): the trial
# boots on but never answers, as a unit that never finishes leaves it. No watchdog sees that (PID 1
# runs on); the trial's deadline timer is what resets it. A short reboot wait keeps the deadline short.
USERSPACE_STALL_OPTION = "systemd.mask=ssh.service"
USERSPACE_STALL_REBOOT_TIMEOUT = 100

# The kernel stall: the lab image's gpuhost_stall.ko (gpuhost/data/lab_stall_module.c, built in the
# image against its own kernel), loaded on the trial boot only (modules-load=, a testing-only option).
STALL_MODULE_OPTION = f"modules-load={STALL_MODULE_NAME}"
# Whether the image carries it, as modinfo says on the host: its name, else nothing.
STALL_MODULE_CHECK = f"modinfo -F name {STALL_MODULE_NAME} 2>/dev/null || true"
# The trial entry's two panics for a CPU stuck in the kernel, as each announces itself.
STALL_PANICS = {
    "RCU stall": "Kernel panic - not syncing: RCU Stall",
    "soft lockup": "Kernel panic - not syncing: softlockup: hung tasks",
}


# The six kernel settings a trial entry changes to turn stalls into panics (gpuhost.plan.rescue), read on
# the host: a committed or reverted trial must leave the host's own values.
STALL_SETTINGS = (
    "cd /proc/sys/kernel && cat softlockup_panic panic_on_rcu_stall hung_task_panic hung_task_timeout_secs "
    "watchdog_thresh /sys/module/rcupdate/parameters/rcu_cpu_stall_timeout"
)


def console_since(serial_log: Path, offset: int) -> str:
    """What a lab host wrote to its serial console (console=ttyS0) after `offset` bytes."""
    with serial_log.open("rb") as log:
        log.seek(offset)
        return log.read().decode(errors="replace")


def trial_console(console: str, marker: str) -> str:
    """`console` from the trial kernel's command line (it carries `marker`) on; asserts there is one."""
    start = next((i for i, line in enumerate(console.splitlines()) if "Command line:" in line and marker in line), None)
    assert start is not None, "no trial kernel booted:\n" + console[-3000:]
    return "\n".join(console.splitlines()[start:])


def panicked_and_rebooted(console: str, marker: str) -> str:
    """The part of `console` from the trial kernel's command line (it carries `marker`) to its panic
    reboot; asserts the kernel booted with the marker, panicked and announced the reboot."""
    trial = trial_console(console, marker)
    assert "Kernel panic - not syncing" in trial, trial[-3000:]
    assert "Rebooting in 10 seconds" in trial, trial[-3000:]
    return trial[: trial.index("Rebooting in 10 seconds")]


def gave_up_on_root_and_rebooted(console: str, marker: str) -> str:
    """The part of `console` from the trial kernel's command line (it carries `marker`) to the
    initramfs's reboot; asserts the initramfs gave up on the root device and rebooted because of
    panic= (instead of dropping to its shell, which is the hang)."""
    trial = trial_console(console, marker)
    assert "Gave up waiting for root file system device" in trial, trial[-3000:]
    assert "Rebooting automatically due to panic= boot argument" in trial, trial[-3000:]
    return trial[: trial.index("Rebooting automatically due to panic= boot argument")]


# Issue 47's proof that rollback is apply's inverse: every file under these (path, type, mode, owner,
# link target, sha256), and /proc/cmdline. grubenv is GRUB's one-shot state (grub-reboot), not a file
# apply writes; the ESP is read only for the loader entries (its random-seed changes at each boot).
MANIFEST_ROOTS = ("/etc", "/boot/grub", "/boot/efi/loader/entries", "/boot/loader/entries", "/efi/loader/entries")
MANIFEST_SCRIPT = (
    "for root in " + " ".join(MANIFEST_ROOTS) + '; do [ -d "$root" ] || continue\n'
    "  find \"$root\" -xdev -path /boot/grub/grubenv -prune -o -printf 'E\\t%p\\t%y\\t%m\\t%u:%g\\t%l\\n'\n"
    '  find "$root" -xdev -path /boot/grub/grubenv -prune -o -type f -print0 | xargs -0 -r sha256sum'
    " | sed 's/^/H\\t/'\n"
    "done\n"
    # A '\r' the host's own GRUB line may carry (fault 5) shown as \r: the output is read with universal newlines.
    "printf 'C\\t'; sed 's/\\r/\\\\r/g' /proc/cmdline\n"
)
Manifest = dict[str, str]


def parse_manifest(text: str) -> Manifest:
    """MANIFEST_SCRIPT's output -> {path: 'type mode owner [-> target] [sha256]', '/proc/cmdline': line}."""
    entries: dict[str, list[str]] = {}
    for line in text.splitlines():
        kind, _, rest = line.partition("\t")
        if kind == "E":
            path, kind_of, mode, owner, target = rest.split("\t")
            entries[path] = [kind_of, mode, owner] + ([f"-> {target}"] if target else [])
        elif kind == "H":
            digest, _, path = rest.partition("  ")
            entries.setdefault(path, ["?"]).append(digest)
        elif kind == "C":
            entries["/proc/cmdline"] = [rest]
    return {path: " ".join(fields) for path, fields in entries.items()}


def manifest_differences(before: Manifest, after: Manifest) -> list[str]:
    """One line per path whose entry differs (absent on one side included), for the failure message."""
    return [
        f"{path}: {before.get(path, '(absent)')} -> {after.get(path, '(absent)')}"
        for path in sorted(set(before) | set(after))
        if before.get(path) != after.get(path)
    ]
