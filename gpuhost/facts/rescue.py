"""What can bring a host back when a boot hangs instead of panicking: its watchdogs, its BMC, and
whether the kernel turns a stall into a panic (which `panic=N` then turns into a reboot).

A trial boot that panics comes back by itself; one that hangs (an initramfs waiting for a root
device, a stalled driver, a kernel that stops without a panic) stays down until something resets
the machine: a hardware watchdog that nobody pets any more, the BMC's watchdog, or a power cycle
through the BMC. These are the facts the audit reports and apply will arm (issue 31).

Pure: text in, frozen values out (gpuhost.facts.build reads the files). Sources, all
world-readable (gather.sh):
- /sys/class/watchdog/watchdogN/{identity,timeout,state,nowayout}: one registered watchdog device
  each (iTCO_wdt on Intel chipsets, sp5100_tco on AMD, i6300esb in QEMU, ...), the list from
  `ls /sys/class/watchdog` (commands/watchdogs.txt, whose exit status says it was gathered);
- /dev/ipmi0 (or /dev/ipmi/0, /dev/ipmidev/0; ipmi_devintf with ipmi_si): the BMC's interface,
  whose watchdog (ipmi_watchdog, or `ipmitool mc watchdog`) a host reset does not stop, and
  `command -v ipmitool` (commands/which.txt): apply arms that watchdog with ipmitool;
- /proc/sys/kernel/{panic,panic_on_oops,softlockup_panic,hung_task_panic,hardlockup_panic,
  panic_on_rcu_stall} and {hung_task_timeout_secs,watchdog_thresh}, and RCU's stall timeout
  (/sys/module/rcupdate/parameters/rcu_cpu_stall_timeout): a trial changes them for its boot, and
  they are put back;
- /etc/systemd/system.conf and its drop-ins: RuntimeWatchdogSec (systemd pets the hardware watchdog
  while it runs, so a hung userspace is reset) and RebootWatchdogSec (a reboot that hangs).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

WATCHDOG_CLASS = "/sys/class/watchdog"
IPMI_DEVICES = ("/dev/ipmi0", "/dev/ipmi/0", "/dev/ipmidev/0")
KERNEL_PANIC_SETTINGS = (
    "panic",
    "panic_on_oops",
    "softlockup_panic",
    "hung_task_panic",
    "hardlockup_panic",
    "panic_on_rcu_stall",
    "hung_task_timeout_secs",
    "watchdog_thresh",
)
# Seconds a CPU may hold up an RCU grace period before RCU reports a stall (CONFIG_RCU_CPU_STALL_TIMEOUT,
# 21 s in Debian's kernels), and with panic_on_rcu_stall, panics. Writable at run time.
RCU_STALL_TIMEOUT_PATH = "/sys/module/rcupdate/parameters/rcu_cpu_stall_timeout"

SYSTEMD_CONF = "/etc/systemd/system.conf"
SYSTEMD_CONF_DIRS = ("/usr/lib/systemd/system.conf.d", "/etc/systemd/system.conf.d")
# systemd's defaults where system.conf leaves them commented out (systemd 252, Debian 12's
# system.conf: "#RuntimeWatchdogSec=off", "#RebootWatchdogSec=10min").
SYSTEMD_DEFAULTS = {"RuntimeWatchdogSec": 0.0, "RebootWatchdogSec": 600.0}
# systemd.time(7)'s time span units, in seconds.
_SPAN_UNITS = {
    "us": 1e-6, "usec": 1e-6, "ms": 1e-3, "msec": 1e-3, "": 1.0, "s": 1.0, "sec": 1.0, "second": 1.0,
    "seconds": 1.0, "m": 60.0, "min": 60.0, "minute": 60.0, "minutes": 60.0, "h": 3600.0, "hr": 3600.0,
    "hour": 3600.0, "hours": 3600.0, "d": 86400.0, "day": 86400.0, "days": 86400.0, "w": 604800.0,
    "week": 604800.0, "weeks": 604800.0,
}  # fmt: skip
_SPAN_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*([a-z]*)")


@dataclass(frozen=True)
class Watchdog:
    """One device of /sys/class/watchdog."""

    name: str  # watchdog0
    identity: str | None  # the driver's name for it: "iTCO_wdt", "i6300ESB timer", "SP5100 TCO timer"
    timeout_s: int | None
    active: bool | None  # state: something has opened and is petting it
    nowayout: bool | None  # once started it cannot be stopped

    def describe(self) -> str:
        timeout = f", {self.timeout_s} s" if self.timeout_s is not None else ""
        return f"{self.name} ({self.identity or 'unidentified'}{timeout})"


@dataclass(frozen=True)
class KernelPanics:
    """/proc/sys/kernel settings that decide whether a stall or an oops ends in a reboot."""

    panic_s: int | None  # seconds from a panic to the reboot; 0: the host stays halted
    panic_on_oops: bool | None
    softlockup_panic: bool | None  # a CPU stuck in the kernel for 2 x watchdog_thresh
    hung_task_panic: bool | None  # a task blocked for hung_task_timeout_secs
    hardlockup_panic: bool | None  # a CPU stuck with interrupts off
    hung_task_timeout_s: int | None = None  # how long a task may block before it is reported (or panics)
    watchdog_thresh_s: int | None = None  # soft lockups are reported after twice this
    # A CPU that holds up RCU's grace period for rcu_stall_timeout_s. RCU's stall reports also touch
    # the soft-lockup timer, so on a host where they come sooner than 2 x watchdog_thresh, a CPU spinning
    # in the kernel is never reported as a soft lockup: only this panic catches it (the lab, 2026-11-28).
    rcu_stall_panic: bool | None = None
    rcu_stall_timeout_s: int | None = None

    def _stall_panics(self) -> tuple[tuple[str, bool | None], ...]:
        return (
            ("softlockup_panic", self.softlockup_panic),
            ("hung_task_panic", self.hung_task_panic),
            ("hardlockup_panic", self.hardlockup_panic),
            ("panic_on_rcu_stall", self.rcu_stall_panic),
        )

    def stalls_that_panic(self) -> tuple[str, ...]:
        return tuple(name for name, value in self._stall_panics() if value)

    def stalls_that_do_not_panic(self) -> tuple[str, ...]:
        """Those read as off (an unread setting is neither)."""
        return tuple(name for name, value in self._stall_panics() if value is False)


@dataclass(frozen=True)
class RescueFacts:
    watchdogs: tuple[Watchdog, ...]
    ipmi_device: str | None  # the BMC's interface device, or None: none found
    kernel: KernelPanics
    systemd_runtime_watchdog_s: float | None  # 0: off; None: no systemd configuration read
    systemd_reboot_watchdog_s: float | None
    ipmitool: str | None = None  # its path (`command -v ipmitool`), or None: not installed or not gathered

    def to_json(self) -> dict[str, object]:
        return {
            "watchdogs": [
                {
                    "name": w.name,
                    "identity": w.identity,
                    "timeout_s": w.timeout_s,
                    "active": w.active,
                    "nowayout": w.nowayout,
                }
                for w in self.watchdogs
            ],
            "ipmi_device": self.ipmi_device,
            "kernel": {
                "panic_s": self.kernel.panic_s,
                "panic_on_oops": self.kernel.panic_on_oops,
                "softlockup_panic": self.kernel.softlockup_panic,
                "hung_task_panic": self.kernel.hung_task_panic,
                "hardlockup_panic": self.kernel.hardlockup_panic,
                "hung_task_timeout_s": self.kernel.hung_task_timeout_s,
                "watchdog_thresh_s": self.kernel.watchdog_thresh_s,
                "rcu_stall_panic": self.kernel.rcu_stall_panic,
                "rcu_stall_timeout_s": self.kernel.rcu_stall_timeout_s,
            },
            "systemd_runtime_watchdog_s": self.systemd_runtime_watchdog_s,
            "systemd_reboot_watchdog_s": self.systemd_reboot_watchdog_s,
            "ipmitool": self.ipmitool,
        }


def parse_int(text: str | None) -> int | None:
    """A sysfs/procfs integer ("30\\n"); None when absent or not one ASCII integer."""
    if text is None:
        return None
    value = text.strip()
    return int(value) if re.fullmatch(r"-?[0-9]+", value, flags=re.ASCII) else None


def parse_flag(text: str | None) -> bool | None:
    value = parse_int(text)
    return None if value is None else value != 0


def parse_watchdog_names(listing: str) -> tuple[str, ...]:
    """`ls /sys/class/watchdog`: the devices' names (watchdog0, watchdog1, ...), in number order."""
    names = [name for name in listing.split() if re.fullmatch(r"watchdog[0-9]+", name, flags=re.ASCII)]
    return tuple(sorted(names, key=lambda name: int(name.removeprefix("watchdog"))))


def parse_time_span(text: str) -> float | None:
    """A systemd time span ("10min", "1min 30s", "off", "infinity", "0") in seconds: 0 for off,
    inf for infinity; None where it is not one (systemd then keeps its default)."""
    value = text.strip().lower()
    if value in ("off", "0", "default"):
        return 0.0
    if value == "infinity":
        return float("inf")
    total, position = 0.0, 0
    for match in _SPAN_PART.finditer(value):
        if value[position : match.start()].strip() or match.group(2) not in _SPAN_UNITS:
            return None
        total += float(match.group(1)) * _SPAN_UNITS[match.group(2)]
        position = match.end()
    return total if position and not value[position:].strip() else None


def parse_systemd_watchdogs(texts: Iterable[str]) -> dict[str, float]:
    """The [Manager] watchdog settings of system.conf and its drop-ins, in the order systemd reads
    them (a later assignment wins); a setting none of them sets keeps systemd's default."""
    settings = dict(SYSTEMD_DEFAULTS)
    for text in texts:
        section = None
        for raw in text.splitlines():
            line = raw.strip()
            if not line or line.startswith(("#", ";")):
                continue
            if line.startswith("[") and line.endswith("]"):
                section = line[1:-1].strip()
                continue
            key, sep, value = line.partition("=")
            if section == "Manager" and sep and key.strip() in settings:
                seconds = parse_time_span(value)
                if seconds is not None:
                    settings[key.strip()] = seconds
    return settings
