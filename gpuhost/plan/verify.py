"""After the reboot: does the host match its plan? Judged with the audit's own checks. Pure.

Each comparison is a `VerifyCheck`; each one that fails is also a `Problem` of Stage.VERIFY, so a
verification reads like the audit's findings. The playbooks receive `to_json()` (plain data).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuhost.audit import AuditStatus
from gpuhost.checks import run_checks
from gpuhost.cmdline import BOOT_LOADER_KEYS, key_of
from gpuhost.facts.model import GIB_KIB, BootloaderKind, HostFacts
from gpuhost.inventory.plan_settings import PlanSettings
from gpuhost.inventory.policy import AuditPolicy, Role
from gpuhost.passthrough import analyse_groups
from gpuhost.plan.driver import forbidden_loaded_modules
from gpuhost.plan.model import GRUB_DROPIN_PATH, TRIAL_MARKER
from gpuhost.problems import Problem, Severity, Stage, errors, register
from gpuhost.selection import select_gpus

CMDLINE_MISSING = register(
    "verify.cmdline.missing", Stage.VERIFY, Severity.ERROR, "a planned kernel option is not in /proc/cmdline"
)
FUNCTION_NOT_VFIO = register(
    "verify.function.not_vfio", Stage.VERIFY, Severity.ERROR, "a planned function is not on vfio-pci"
)
HOST_DRIVER_LOADED = register(
    "verify.host_driver.loaded", Stage.VERIFY, Severity.ERROR, "a host GPU driver module is loaded"
)
HOST_DRIVER_MODULE_LEFT = register(
    "verify.host_driver.module_left",
    Stage.VERIFY,
    Severity.ERROR,
    "an NVIDIA driver module is left in a kernel's /lib/modules tree after the driver's removal",
)
HUGEPAGES_COUNT = register(
    "verify.hugepages.count", Stage.VERIFY, Severity.ERROR, "the 1 GiB pages allocated differ from the plan"
)
HUGEPAGES_NODE_COUNT = register(
    "verify.hugepages.node_count",
    Stage.VERIFY,
    Severity.ERROR,
    "the 1 GiB pages allocated on a NUMA node differ from the plan's count for it",
)
AUDIT_ERRORS = register(
    "verify.audit.errors", Stage.VERIFY, Severity.ERROR, "the audit finds errors on the rebooted host"
)
ROLLBACK_DROPIN_LEFT = register(
    "verify.rollback.dropin_left", Stage.VERIFY, Severity.ERROR, "after rollback: gpuhost's GRUB drop-in is still there"
)
ROLLBACK_TRIAL_ENTRY = register(
    "verify.rollback.trial_entry", Stage.VERIFY, Severity.ERROR, "after rollback: the host runs gpuhost's trial entry"
)
ROLLBACK_GRUB_UNKNOWN = register(
    "verify.rollback.grub_unknown",
    Stage.VERIFY,
    Severity.ERROR,
    "after rollback: the GRUB command line could not be read",
)
ROLLBACK_CMDLINE_DIFFERS = register(
    "verify.rollback.cmdline_differs",
    Stage.VERIFY,
    Severity.ERROR,
    "after rollback: /proc/cmdline does not end with the GRUB line",
)
ROLLBACK_EXTRA_OPTIONS = register(
    "verify.rollback.extra_options",
    Stage.VERIFY,
    Severity.ERROR,
    "after rollback: /proc/cmdline has options beyond the GRUB line",
)


@dataclass(frozen=True)
class VerifyCheck:
    """One comparison of the rebooted host with its plan; `problem` says what is wrong when it fails."""

    name: str
    detail: str
    problem: Problem | None

    @property
    def ok(self) -> bool:
        return self.problem is None


@dataclass(frozen=True)
class Verification:
    host: str
    checks: tuple[VerifyCheck, ...]
    audit_errors: tuple[Problem, ...]
    cmdline: str

    @property
    def problems(self) -> tuple[Problem, ...]:
        return tuple(check.problem for check in self.checks if check.problem is not None)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def summary(self) -> str:
        if self.ok:
            return f"{self.host}: ready for passthrough"
        failed = [f"{check.name} ({check.detail})" for check in self.checks if not check.ok]
        return f"{self.host}: not as planned: {'; '.join(failed)}"

    def to_json(self) -> dict[str, Any]:
        """{ok, status, summary, checks: [{name, ok, detail}], audit_errors, cmdline, problems}: plain data."""
        return {
            "ok": self.ok,
            "status": (AuditStatus.READY if self.ok else AuditStatus.NOT_READY).value,
            "summary": self.summary,
            "checks": [{"name": c.name, "ok": c.ok, "detail": c.detail} for c in self.checks],
            "audit_errors": [f"{p.code}: {p.message}" for p in self.audit_errors],
            "cmdline": self.cmdline,
            "problems": [problem.as_dict() for problem in self.problems],
        }


def verify_host(host: str, facts: HostFacts, settings: PlanSettings, plan: Mapping[str, Any]) -> Verification:
    checks: list[VerifyCheck] = []

    def check(name: str, detail: str, code: str, failed: bool, subject: str, remedy: str) -> None:
        problem = Problem(code, Severity.ERROR, subject, f"{host}: {name}: {detail}", remedy) if failed else None
        checks.append(VerifyCheck(name, detail, problem))

    running = facts.cmdline.tokens if facts.cmdline else ()
    missing = [option for option in plan["kernel_options"] if option not in running]
    check(
        "cmdline",
        f"missing {missing}" if missing else "all planned options in /proc/cmdline",
        CMDLINE_MISSING,
        bool(missing),
        "kernel command line",
        "Check that the host booted GRUB's default entry (update-grub ran), then apply again.",
    )
    # What the plan bound, and what the rebooted host's groups now say vfio-pci must own for the same GPUs
    # (gpuhost.passthrough, the audit's and the planner's answer): a GPU function that joined a selected
    # group since is checked too. An intruder is the audit's gpu.group.intruder, never a vfio-pci proposal.
    planned = [function["address"] for function in plan["functions"]]
    now = [
        function.address
        for isolation in analyse_groups(facts, select_gpus(facts, settings.gpus).passthrough)
        for function in isolation.to_bind
        if function.address not in planned
        and (function not in isolation.intruders or isolation.card.gpu.address in settings.allow_shared_group)
    ]
    for address in dict.fromkeys([*planned, *now]):
        function = {"address": address}
        found = facts.function(function["address"])
        driver = found.driver if found else None
        check(
            f"vfio-pci {function['address']}",
            f"driver {driver or 'none'}",
            FUNCTION_NOT_VFIO,
            driver != "vfio-pci",
            function["address"],
            "Check vfio-pci.ids (or the initramfs binding script) and that no host driver claims it first.",
        )
    # Where the host keeps its NVIDIA driver (driver_removal.pin false) only nouveau's modules are barred.
    barred = forbidden_loaded_modules(bool(plan["driver_removal"]["pin"]))
    loaded = [m for m in barred if facts.modules is not None and facts.modules.is_loaded(m)]
    check(
        "no host GPU driver",
        f"loaded: {', '.join(loaded)}" if loaded else "none loaded",
        HOST_DRIVER_LOADED,
        bool(loaded),
        "host NVIDIA driver",
        "Remove the host driver (gpuhost_remove_nvidia_driver) and check modprobe.blacklist.",
    )
    if plan["driver_removal"].get("module_globs"):
        # Every installed kernel's tree, not the running one's: a module left for another kernel
        # loads the day the host boots it. Unlisted (a gather that could not list them): not known gone.
        left = facts.nvidia.module_files
        check(
            "no NVIDIA driver module",
            "not listed" if left is None else f"left: {', '.join(m.path for m in left)}" if left else "none left",
            HOST_DRIVER_MODULE_LEFT,
            left is None or bool(left),
            "host NVIDIA driver",
            "Remove the package that installed each module (dpkg -S names it), or delete the file and run depmod "
            "for its kernel, then apply again.",
        )
    pool = facts.hugepage_pool(GIB_KIB)
    allocated = pool.total if pool and pool.total is not None else 0
    wanted = int(plan["hugepages"]["pages"])
    check(
        "hugepages 1G",
        f"{allocated} allocated, plan {wanted}",
        HUGEPAGES_COUNT,
        allocated != wanted,
        "huge pages",
        "Lower gpuhost_hugepages to what the host can allocate at boot.",
    )
    if plan["hugepages"].get("node_form"):
        # The plan named the nodes (hugepages=<node>:<count>): each node must have its count, no more
        # and no less (pages on another node are remote memory for the VMs bound to this one).
        for node_id, planned in plan["hugepages"]["per_node"]:
            node = next((n for n in facts.numa_nodes if n.node_id == node_id), None)
            node_pool = node.pool(GIB_KIB) if node is not None else None
            got = node_pool.total if node_pool is not None else None
            check(
                f"hugepages 1G node {node_id}",
                f"{got if got is not None else 'unknown'} allocated, plan {planned}",
                HUGEPAGES_NODE_COUNT,
                got != planned,
                f"NUMA node {node_id}",
                f"Lower gpuhost_hugepages or move the VMs: NUMA node {node_id} could not hold {planned} pages at boot.",
            )
    policy = AuditPolicy(
        gpus=settings.gpus, role=Role.HOST, allow_shared_group=settings.allow_shared_group, vms=settings.vms
    )
    _, _, findings = run_checks(host, facts, policy)
    audit_errors = errors(findings)
    check(
        "audit",
        ", ".join(f.code for f in audit_errors) if audit_errors else "no errors",
        AUDIT_ERRORS,
        bool(audit_errors),
        "audit",
        "Run gpuhost audit on the host: each error names its fix.",
    )
    return Verification(host, tuple(checks), audit_errors, " ".join(running))


@dataclass(frozen=True)
class RollbackVerification:
    host: str
    problems: tuple[Problem, ...]
    cmdline: str
    expected: str

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        """{ok, summary, cmdline, expected, problems}: plain data."""
        facts = "; ".join(problem.subject for problem in self.problems)
        return {
            "ok": self.ok,
            "summary": f"{self.host}: the old command line is back" if self.ok else f"{self.host}: {facts}",
            "cmdline": self.cmdline,
            "expected": self.expected,
            "problems": [problem.as_dict() for problem in self.problems],
        }


def check_rollback(host: str, facts: HostFacts) -> RollbackVerification:
    """After `gpuhost rollback`'s reboot: is the host on the command line GRUB computes without gpuhost?

    The expected line is the audit's own reading of /etc/default/grub and its drop-ins (gpuhost's
    gone), which update-grub appends after root= and ro.
    """
    running = facts.cmdline.tokens if facts.cmdline else ()
    expected = facts.grub.effective.tokens if facts.grub.effective is not None else None
    if facts.bootloader.kind is BootloaderKind.SYSTEMD_BOOT:
        # kernel-install wrote the entries' options from the restored /etc/kernel/cmdline.
        restored = facts.firmware.kernel_cmdline_file
        expected = restored.tokens if restored is not None else None
    problems: list[Problem] = []

    def problem(code: str, fact: str) -> None:
        # The fact is the subject too: `gpuhost rollback` prints the facts joined, as before.
        problems.append(Problem(code, Severity.ERROR, fact, f"{host}: {fact}", "Run gpuhost rollback again."))

    if GRUB_DROPIN_PATH in facts.grub.dropins:
        problem(ROLLBACK_DROPIN_LEFT, f"{GRUB_DROPIN_PATH} is still there")
    if TRIAL_MARKER in running:
        problem(ROLLBACK_TRIAL_ENTRY, "the host runs gpuhost's trial entry")
    if expected is None:
        problem(ROLLBACK_GRUB_UNKNOWN, "the GRUB command line could not be read")
    elif tuple(running[len(running) - len(expected) :]) != expected:
        problem(ROLLBACK_CMDLINE_DIFFERS, f"/proc/cmdline does not end with the GRUB line {' '.join(expected)!r}")
    else:
        leftovers = [t for t in running[: len(running) - len(expected)] if key_of(t) not in BOOT_LOADER_KEYS]
        if leftovers:
            problem(ROLLBACK_EXTRA_OPTIONS, f"/proc/cmdline has options beyond the GRUB line: {' '.join(leftovers)}")
    return RollbackVerification(host, tuple(problems), " ".join(running), " ".join(expected or ()))


def verify_rollback(host: str, facts: HostFacts) -> dict[str, Any]:
    """`check_rollback` as plain data ({ok, summary, cmdline, expected, problems}), what `gpuhost rollback` reads."""
    return check_rollback(host, facts).to_json()
