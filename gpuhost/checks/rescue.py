"""What can bring the host back when a boot hangs instead of panicking (gpuhost.facts.rescue).

apply's trial boot survives a kernel that panics (panic=N, the boot loader's one-shot entry). A
trial that hangs needs something to reset the machine: these findings say what the host has, so
that an operator knows before the first apply whether a hang is an outage. None is an error: a
host without a watchdog can still be ready for passthrough.
"""

from __future__ import annotations

from collections.abc import Iterator

from gpuhost.checks.base import CheckContext
from gpuhost.problems import Problem, Severity, Stage, register

RESCUE_WATCHDOG = register(
    "rescue.watchdog", Stage.AUDIT, Severity.INFO, "the hardware watchdogs and the BMC that can reset a hung boot"
)
RESCUE_NONE = register(
    "rescue.none",
    Stage.AUDIT,
    Severity.WARNING,
    "no hardware watchdog and no BMC interface: a boot that hangs stays down until a power cycle",
)
RESCUE_STALLS = register(
    "rescue.stalls",
    Stage.AUDIT,
    Severity.INFO,
    "which stalls the kernel turns into a panic (and panic=N into a reboot), and which it does not",
)
RESCUE_UNKNOWN = register(
    "rescue.unknown", Stage.AUDIT, Severity.INFO, "the snapshot's gather did not read the watchdogs (an older gpuhost)"
)

SUBJECT = "rescue"


def check_rescue(ctx: CheckContext) -> Iterator[Problem]:
    rescue = ctx.facts.rescue
    if rescue is None:
        yield ctx.finding(
            RESCUE_UNKNOWN,
            Severity.INFO,
            SUBJECT,
            "the watchdogs and the BMC interface were not gathered (a snapshot from an older gpuhost), so what "
            "could reset a hung boot is unknown",
            "Take the snapshot again with this gpuhost.",
        )
        return
    if rescue.watchdogs or rescue.ipmi_device:
        parts = [w.describe() for w in rescue.watchdogs]
        if rescue.ipmi_device:
            parts.append(f"the BMC's interface {rescue.ipmi_device} (its watchdog survives a host reset)")
        systemd = rescue.systemd_runtime_watchdog_s
        petted = (
            f"; systemd pets the watchdog every {systemd:g} s (RuntimeWatchdogSec), so a hung userspace is reset"
            if systemd
            else "; systemd does not use it (RuntimeWatchdogSec off)"
            if systemd == 0 and rescue.watchdogs
            else ""
        )
        yield ctx.finding(RESCUE_WATCHDOG, Severity.INFO, SUBJECT, f"can be reset by {', '.join(parts)}{petted}")
    else:
        yield ctx.finding(
            RESCUE_NONE,
            Severity.WARNING,
            SUBJECT,
            "has no hardware watchdog (/sys/class/watchdog is empty) and no BMC interface (/dev/ipmi0): a boot "
            "that hangs without panicking stays down until someone power-cycles it",
            "Load the board's watchdog driver (iTCO_wdt on Intel chipsets, sp5100_tco on AMD) or the BMC's "
            "(ipmi_si with ipmi_devintf and ipmi_watchdog), and keep the BMC reachable for a power cycle.",
        )
    kernel = rescue.kernel
    panicking = kernel.stalls_that_panic()
    quiet = kernel.stalls_that_do_not_panic()
    after = (
        "the host stays halted after a panic (kernel.panic is 0)"
        if kernel.panic_s == 0
        else f"a panic reboots after {kernel.panic_s} s"
        if kernel.panic_s
        else "kernel.panic is unknown"
    )
    yield ctx.finding(
        RESCUE_STALLS,
        Severity.INFO,
        SUBJECT,
        f"{after}; stalls that panic: {', '.join(panicking) or 'none'}"
        + (f"; stalls that do not: {', '.join(quiet)}" if quiet else ""),
    )
