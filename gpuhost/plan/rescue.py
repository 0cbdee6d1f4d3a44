"""Which rescue each trial boot gets, and for how long (issue 31, item 2). Pure: facts in, a plan out.

A trial that panics comes back by itself (panic=N and the boot loader's one-shot entry). One that
hangs needs something to act, strongest first:

1. The BMC's watchdog (IPMI "OS Load" timer): armed with ipmitool just before the trial reboot, it
   runs on the BMC, so it catches every hang: firmware, boot loader, kernel, initramfs, userspace.
   It is stopped only once the trial is verified (or reverted). Whether a BMC keeps the timer
   across the host's reset is the BMC's own: the IPMI specification leaves it open, and FreeIPMI's
   bmc-watchdog(8) says the timer stops at a reboot on the BMCs it knows. The lab measures it
   (issue 31, item 4); the rescues below act whether it does or not.
2. A hardware watchdog (/dev/watchdogN) is reported, not armed. systemd could drive it on the
   trial boot only (systemd.watchdog_device= and systemd.watchdog_sec= on the trial entry), but
   nothing could stop it once the trial is verified: PID 1's RuntimeWatchdogUSec is set over D-Bus,
   and busctl cannot reach PID 1's private socket (on the lab's Debian 12, systemd 252, with no
   D-Bus daemon: "Invalid request descriptor", 2026-11-28), so a committed trial would keep a 120 s
   reboot watchdog until its next reboot. Until a stop is proven, a kernel that stops without a
   panic is left to the BMC's watchdog.
3. Kernel options on the trial entry only that turn stalls into panics, which panic=N turns into
   a reboot onto the old default: softlockup_panic=1 and RCU's stall panic (a CPU stuck in the
   kernel), the hung-task panic (a task blocked in D state), and Debian's initramfs-tools, whose
   panic() reboots after panic=N when it gives up waiting for the root device (scripts/functions:
   "Rebooting automatically due to panic= boot argument"; it waits rootdelay=, 180 s by default).
4. A deadline for userspace (a unit that never finishes, which no watchdog sees): a systemd timer
   pulled in by systemd.wants= on the trial entry only, that force-reboots the trial once the
   deadline passes unless the verify role stopped it. Its unit files are plan files (configure
   writes them, commit and revert remove them, rollback removes them too).

The deadline is derived from the controller's wait, never shorter: a trial that comes back within
gpuhost_verify_reboot_timeout is verified (verification_allowance) and its rescues stopped
before any of them acts; one that does not is reset by the deadline, and the controller, waiting
the deadline plus one more boot, sees the old entry come back and reverts.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from gpuhost.facts.model import TextEnum
from gpuhost.facts.rescue import RCU_STALL_TIMEOUT_PATH, KernelPanics, RescueFacts, Watchdog
from gpuhost.plan.model import DEADLINE_SERVICE, DEADLINE_TIMER, TRIAL_MARKER
from gpuhost.problems import Severity, Stage, register

REFUSE_RESCUE_NONE = register(
    "plan.rescue.none",
    Stage.PLAN,
    Severity.ERROR,
    "--require-rescue: the trial boot would have no watchdog (BMC or hardware) to reset a kernel that stops",
)

# How long verification may take once the host answers again, after which the deadline and the
# BMC's timer act: half the reboot timeout, and at least MIN_VERIFICATION_S. Verification is a
# fraction of a boot: from the reboot's return to the verdict, 8 s on a lab TCG host with two lab
# VMs and a build sharing its machine's two cores (2026-11-28), so 60 s leaves seven times that.
# It only matters below a 120 s reboot timeout (the default, 900 s, gives 450 s). Too short is safe:
# the rescues are stopped before commit, so one that acts during a slow verification reverts the
# trial, it never interrupts a commit.
MIN_VERIFICATION_S = 60
# The BMC's timer is armed a few tasks before the reboot command starts the controller's wait.
BMC_ARMING_SLACK_S = 60
# The IPMI timer counts 100 ms ticks in 16 bits (Set Watchdog Timer, initial countdown).
BMC_MAX_TIMEOUT_S = 0xFFFF // 10
# Soft lockups are reported after 2 x watchdog_thresh: 60 makes it 120 s (10 s by default), as
# TCG stalls a healthy vCPU for 20 s and more ("soft lockup - CPU#0 stuck for 22s!").
SOFTLOCKUP_THRESHOLD_S = 60
# A task blocked this long panics the trial. The kernel's default of 120 s is hit by healthy boots
# under QEMU TCG (the lab's D-state waits for the disk reach 120 s), so the trial allows five
# times that. sysctl.*= on the command line works from kernel 5.8 on and applies just before init
# runs, so the panic and its timeout start together (never the panic with the 120 s default).
HUNG_TASK_TIMEOUT_S = 600
# A CPU that spins in the kernel is reported by RCU too, and RCU's stall reports touch the soft-lockup
# timer: with RCU's 21 s default they come every 63 s, so the 120 s soft lockup is never reported and
# softlockup_panic never acts (the lab's one-vCPU host, 725 s of RCU reports and no panic, 2026-11-28).
# RCU's stall panic catches that CPU; its timeout is raised from 21 s to what a soft lockup allows,
# for the same TCG stalls of a healthy vCPU (RCU's limit is 300 s).
RCU_STALL_TIMEOUT_S = 2 * SOFTLOCKUP_THRESHOLD_S
# CONFIG_RCU_CPU_STALL_TIMEOUT's default (Debian's kernels keep it), put back where it was not read.
DEFAULT_RCU_STALL_TIMEOUT_S = 21


@dataclass(frozen=True)
class StallSetting:
    """One kernel setting that turns a stall into a panic: set on the trial entry, and put back to the
    host's own value once the trial is verified (the committed trial boot runs on)."""

    option: str  # its name on the kernel command line
    trial: int  # its value on the trial entry
    path: str  # where the running kernel has it
    fact: str  # the KernelPanics field with the host's own value, as read before the trial
    default: int  # the kernel's default, put back where the host's own value was not read

    def trial_option(self) -> str:
        return f"{self.option}={self.trial}"

    def host_value(self, kernel: KernelPanics | None) -> int:
        value = getattr(kernel, self.fact) if kernel is not None else None
        return self.default if value is None else int(value)


# In the order they go on the trial entry and are put back: each panic before its timeout, so that a
# timeout shortened back to the host's own never meets the trial's panic. A new one is one line here.
STALL_SETTINGS = (
    StallSetting("softlockup_panic", 1, "/proc/sys/kernel/softlockup_panic", "softlockup_panic", 0),
    StallSetting(
        "watchdog_thresh", SOFTLOCKUP_THRESHOLD_S, "/proc/sys/kernel/watchdog_thresh", "watchdog_thresh_s", 10
    ),
    StallSetting("sysctl.kernel.panic_on_rcu_stall", 1, "/proc/sys/kernel/panic_on_rcu_stall", "rcu_stall_panic", 0),
    StallSetting(
        "rcupdate.rcu_cpu_stall_timeout",
        RCU_STALL_TIMEOUT_S,
        RCU_STALL_TIMEOUT_PATH,
        "rcu_stall_timeout_s",
        DEFAULT_RCU_STALL_TIMEOUT_S,
    ),
    StallSetting("sysctl.kernel.hung_task_panic", 1, "/proc/sys/kernel/hung_task_panic", "hung_task_panic", 0),
    StallSetting(
        "sysctl.kernel.hung_task_timeout_secs",
        HUNG_TASK_TIMEOUT_S,
        "/proc/sys/kernel/hung_task_timeout_secs",
        "hung_task_timeout_s",
        120,
    ),
)
KERNEL_STALL_OPTIONS = tuple(setting.trial_option() for setting in STALL_SETTINGS)


class RescueKind(TextEnum):
    """What can bring back a trial boot that hangs, strongest first."""

    BMC_WATCHDOG = "bmc-watchdog"
    HARDWARE_WATCHDOG = "hardware-watchdog"
    KERNEL_PANICS = "kernel-panics"
    TRIAL_DEADLINE = "trial-deadline"


class Hang(TextEnum):
    """The ways a trial boot stops without panicking."""

    FIRMWARE = "firmware"  # the firmware or the boot loader stops after the reset
    ROOT_DEVICE = "root-device"  # the initramfs never finds the root device
    KERNEL_STALL = "kernel-stall"  # the kernel stops without a panic
    USERSPACE_STALL = "userspace-stall"  # a unit never finishes, SSH never starts


@dataclass(frozen=True)
class Rescue:
    kind: RescueKind
    armed: bool  # False: this host lacks it (`how` says why)
    # The latest it acts (None: not armed): the BMC's timer from its arming just before the trial
    # reboot, the deadline from the trial kernel's start, the others from the moment the boot stalls.
    seconds: int | None
    catches: tuple[Hang, ...]
    how: str  # what it is and how it is armed, or why it is not
    counts_from: str = ""  # what `seconds` counts from, in words

    def describe(self) -> str:
        if not self.armed:
            return f"{self.kind}: not armed, {self.how}"
        catches = ", ".join(str(hang) for hang in self.catches)
        return f"{self.kind}: {self.how}; acts within {self.seconds} s of {self.counts_from}; catches {catches}"


@dataclass(frozen=True)
class TrialRescue:
    """The rescues of one host's trial boot, and what arms and stops them."""

    rescues: tuple[Rescue, ...]  # every kind, strongest first, armed or not
    kernel_options: tuple[str, ...]  # on the trial entry only, never on the default entry
    deadline_s: int  # the userspace deadline, from the trial kernel's start
    controller_wait_s: int  # how long the controller waits for the trial reboot: deadline or BMC timer, plus one boot
    bmc_watchdog_timeout_s: int  # the BMC timer's countdown (armed only where the BMC rescue is)
    bmc_arm_command: str  # shell: arm the BMC's watchdog ("" where it is not armed)
    # shell, once the trial is verified (or found reverted): the stall panics back to the host's settings,
    # the deadline timer and gpuhost's BMC timer stopped, each only where needed ("stopped" per stop)
    stop_command: str
    # shell, when the host came back without the trial entry: the rescues that left a trace of acting
    # (the BMC's OS Load expiration flag, the deadline's journal), one a line
    acted_command: str
    warning: str  # why no watchdog resets a kernel that stops ("" where one does)

    def armed(self, kind: RescueKind) -> bool:
        return any(rescue.kind is kind and rescue.armed for rescue in self.rescues)

    @property
    def has_watchdog(self) -> bool:
        """A watchdog outside the trial kernel resets the host however the kernel stops."""
        return self.armed(RescueKind.BMC_WATCHDOG) or self.armed(RescueKind.HARDWARE_WATCHDOG)

    @property
    def uncaught(self) -> tuple[Hang, ...]:
        caught = {hang for rescue in self.rescues if rescue.armed for hang in rescue.catches}
        return tuple(hang for hang in Hang if hang not in caught)


def plan_rescue(
    rescue: RescueFacts | None, *, reboot_timeout_s: int, panic_seconds: int, kernel_release: str | None
) -> TrialRescue:
    """The rescues for this host's trial boot. `reboot_timeout_s`: gpuhost_verify_reboot_timeout."""
    allowance = verification_allowance(reboot_timeout_s)
    deadline = reboot_timeout_s + allowance
    bmc_timeout = deadline + BMC_ARMING_SLACK_S
    bmc = _bmc_rescue(rescue, bmc_timeout)
    hardware = _hardware_watchdog(rescue)
    kernel_note = _kernel_note(kernel_release)
    kernel = Rescue(
        RescueKind.KERNEL_PANICS,
        True,
        # The slowest: khungtaskd looks every hung_task_timeout_secs, so a blocked task is found within
        # twice it (a soft lockup within 120 s, initramfs-tools gives up after rootdelay's 180 s); then panic=N.
        2 * HUNG_TASK_TIMEOUT_S + panic_seconds,
        (Hang.ROOT_DEVICE, Hang.KERNEL_STALL),
        f"{' '.join(KERNEL_STALL_OPTIONS)} on the trial entry, and initramfs-tools' panic() when the root "
        f"device never comes (panic={panic_seconds} reboots){kernel_note}",
        "the stall",
    )
    deadline_rescue = Rescue(
        RescueKind.TRIAL_DEADLINE,
        True,
        deadline,
        (Hang.USERSPACE_STALL,),
        f"{DEADLINE_TIMER} (systemd.wants= on the trial entry) force-reboots the trial {deadline} s after the "
        f"kernel started (gpuhost_verify_reboot_timeout {reboot_timeout_s} s + {allowance} s "
        "to verify) unless verification stopped it",
        "the trial kernel's start",
    )
    options = list(KERNEL_STALL_OPTIONS)
    options.append(f"systemd.wants={DEADLINE_TIMER}")
    rescues = (bmc, hardware, kernel, deadline_rescue)
    # The rescues whose time counts from the reboot; a stall panic counts from the stall, which may
    # come late in a slow boot: the controller does not wait for it (the host then comes back later).
    latest = max(deadline, bmc_timeout if bmc.armed else 0)
    has_watchdog = bmc.armed or hardware.armed
    return TrialRescue(
        rescues=rescues,
        kernel_options=tuple(options),
        deadline_s=deadline,
        controller_wait_s=latest + reboot_timeout_s,
        bmc_watchdog_timeout_s=bmc_timeout,
        bmc_arm_command=_bmc_arm_command(bmc_timeout) if bmc.armed else "",
        stop_command=" && ".join(
            f"( {command} )"
            for command in (
                _kernel_restore_command(rescue),
                _DEADLINE_STOP,
                _BMC_STOP if bmc.armed else "",
            )
            if command
        ),
        acted_command=_acted_command(bmc.armed),
        warning=""
        if has_watchdog
        else "no watchdog is armed for the trial boot: a kernel that stops without a panic (no soft lockup, "
        "RCU stall or hung task) or firmware that stops after the reset stays down until someone power-cycles "
        "the host",
    )


def verification_allowance(reboot_timeout_s: int) -> int:
    return max(MIN_VERIFICATION_S, reboot_timeout_s // 2)


def deadline_units(deadline_s: int) -> tuple[str, str]:
    """The timer and the service of the userspace deadline (DEADLINE_TIMER_PATH, DEADLINE_SERVICE_PATH).

    Nothing enables them: only the trial entry's systemd.wants= pulls the timer into the boot, and
    its condition holds only where the trial marker is on the command line. DefaultDependencies=no:
    the timer starts with the first transaction, before the units a stalled boot waits for.
    reboot-force kills every process and unmounts without waiting for the units that hang.
    """
    condition = f"ConditionKernelCommandLine={TRIAL_MARKER}"
    timer = (
        "# Managed by gpuhost: reboots a trial boot that verification did not stop in time (gpuhost apply).\n"
        "[Unit]\n"
        "Description=gpuhost: deadline of the trial boot\n"
        "DefaultDependencies=no\n"
        f"{condition}\n"
        "\n"
        "[Timer]\n"
        f"OnBootSec={deadline_s}s\n"
        "AccuracySec=1s\n"
        f"Unit={DEADLINE_SERVICE}\n"
    )
    service = (
        "# Managed by gpuhost: reboots a trial boot that verification did not stop in time (gpuhost apply).\n"
        "[Unit]\n"
        "Description=gpuhost: reboot the trial boot onto the default entry\n"
        "DefaultDependencies=no\n"
        f"{condition}\n"
        "SuccessAction=reboot-force\n"
        "\n"
        "[Service]\n"
        "Type=oneshot\n"
        f"ExecStart=/bin/echo gpuhost: the trial boot was not verified within {deadline_s} s, rebooting onto the "
        "default entry\n"
    )
    return timer, service


def _bmc_rescue(rescue: RescueFacts | None, timeout: int) -> Rescue:
    def missing(why: str) -> Rescue:
        return Rescue(RescueKind.BMC_WATCHDOG, False, None, (), why)

    if rescue is None:
        return missing("the snapshot did not gather the rescue facts (an older gpuhost)")
    if rescue.ipmi_device is None:
        return missing("no BMC interface (/dev/ipmi0: load ipmi_si and ipmi_devintf)")
    if rescue.ipmitool is None:
        return missing(f"the BMC interface {rescue.ipmi_device} is there but ipmitool is not installed")
    busy = next((w for w in rescue.watchdogs if _is_ipmi(w) and w.active), None)
    if busy is not None:
        return missing(f"the BMC's timer is in use: {busy.describe()} is running (ipmi_watchdog)")
    if timeout > BMC_MAX_TIMEOUT_S:
        return missing(
            f"its timer counts at most {BMC_MAX_TIMEOUT_S} s, less than the {timeout} s the trial needs "
            "(lower gpuhost_verify_reboot_timeout)"
        )
    return Rescue(
        RescueKind.BMC_WATCHDOG,
        True,
        timeout,
        tuple(Hang),
        f"the BMC's OS Load timer through {rescue.ipmi_device} (ipmitool), hard reset after {timeout} s, armed "
        "just before the trial reboot",
        "its arming",
    )


def _hardware_watchdog(rescue: RescueFacts | None) -> Rescue:
    """The host's own systemd petting a watchdog on every boot (the trial's included: nothing to arm
    or stop), or why no hardware watchdog rescues the trial."""

    def missing(why: str) -> Rescue:
        return Rescue(RescueKind.HARDWARE_WATCHDOG, False, None, (), why)

    if rescue is None:
        return missing("the snapshot did not gather the rescue facts (an older gpuhost)")
    if rescue.systemd_runtime_watchdog_s:
        seconds = rescue.systemd_runtime_watchdog_s
        return Rescue(
            RescueKind.HARDWARE_WATCHDOG,
            True,
            math.ceil(seconds),
            (Hang.KERNEL_STALL,),
            f"the host's own systemd pets the watchdog on every boot (RuntimeWatchdogSec {seconds:g} s)",
            "the stall",
        )
    free = [w for w in rescue.watchdogs if not w.active and not _is_ipmi(w)]
    if not free:
        named = ", ".join(w.describe() for w in rescue.watchdogs)
        return missing(f"every watchdog is in use ({named})" if named else "no watchdog device (/sys/class/watchdog)")
    # See the module's docstring: systemd could drive it on the trial entry, but no stop is proven.
    return missing(
        f"{free[0].describe()} is there, but gpuhost cannot stop a watchdog systemd opened for the trial once the "
        "trial is verified (busctl cannot reach PID 1 without a D-Bus daemon); set RuntimeWatchdogSec in "
        "/etc/systemd/system.conf to have systemd pet it on every boot"
    )


def _is_ipmi(watchdog: Watchdog) -> bool:
    return "ipmi" in (watchdog.identity or "").lower()


def _kernel_note(release: str | None) -> str:
    numbers = re.match(r"([0-9]+)\.([0-9]+)", release or "")
    if numbers is not None and (int(numbers.group(1)), int(numbers.group(2))) < (5, 8):
        return f"; kernel {release} ignores sysctl.*= (5.8 and later): no hung-task panic"
    return ""


def _bmc_arm_command(timeout: int) -> str:
    """Set Watchdog Timer (NetFn App 0x06, command 0x24), then Reset Watchdog Timer to start it.

    Bytes: timer use 0x03 (OS Load; logged on expiry, stopped by this Set); action 0x01 (hard
    reset, no pre-timeout interrupt); pre-timeout interval 0; clear the OS Load expiration flag
    (0x08); the countdown in 100 ms ticks, least significant byte first.
    """
    ticks = timeout * 10
    data = ["0x03", "0x01", "0x00", "0x08", f"0x{ticks & 0xFF:02x}", f"0x{ticks >> 8:02x}"]
    return f"ipmitool raw 0x06 0x24 {' '.join(data)} > /dev/null && ipmitool mc watchdog reset"


def _kernel_restore_command(rescue: RescueFacts | None) -> str:
    """The trial boot runs on after its commit: its stall panics go back to the host's settings
    (as read before the trial; the kernel's defaults where they were not read), so that a task
    blocked on a slow disk does not panic the committed host. Only on the trial boot; a setting the
    kernel does not have is skipped."""
    kernel = rescue.kernel if rescue is not None else None
    settings = tuple((setting.path, setting.host_value(kernel)) for setting in STALL_SETTINGS)
    writes = " ".join(f"{path}={value}" for path, value in settings)
    return (
        f"grep -qwF -- {TRIAL_MARKER} /proc/cmdline || exit 0; changed=; "
        f"for setting in {writes}; do file=${{setting%%=*}}; value=${{setting#*=}}; "
        # A kernel without the setting ignored the trial's option too.
        '[ -e "$file" ] || continue; '
        '[ "$(cat "$file")" = "$value" ] || { echo "$value" > "$file" && changed=1; } || exit 1; done; '
        '[ -z "$changed" ] || echo stopped'
    )


def _acted_command(bmc: bool) -> str:
    """Which rescue reset the trial: arming cleared the BMC's OS Load expiration flag (bit 3, 0x08),
    so a set flag is gpuhost's timer expiring; the deadline's service writes its line to the journal
    (where the journal persists). A panic leaves neither."""
    checks = []
    if bmc:
        checks.append(
            "flags=$(ipmitool mc watchdog get 2> /dev/null | "
            "sed -n 's/^Timer Expiration Flags:.*0x\\([0-9a-fA-F][0-9a-fA-F]\\).*/\\1/p'); "
            '[ -n "$flags" ] && [ $((0x$flags & 8)) -ne 0 ] && echo bmc-watchdog'
        )
    checks.append(
        f"journalctl -b -1 -q -o cat -u {DEADLINE_SERVICE} 2> /dev/null | grep -q 'not verified within' "
        "&& echo trial-deadline"
    )
    return "; ".join(f"{{ {check}; }}" for check in checks) + "; true"


_DEADLINE_STOP = (
    f"if systemctl is-active --quiet {DEADLINE_TIMER}; then systemctl stop {DEADLINE_TIMER} && echo stopped; fi"
)

# Only gpuhost's timer: an OS Load timer that is running. A timer the host's own software uses
# (SMS/OS, ipmi_watchdog or bmc-watchdog) is left alone.
_BMC_STOP = (
    "state=$(ipmitool mc watchdog get) || exit 1; "
    "case $state in *'OS Load'*) ;; *) exit 0;; esac; "
    "case $state in *Started/Running*) ipmitool mc watchdog off > /dev/null && echo stopped;; esac"
)
