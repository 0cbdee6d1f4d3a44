"""After the reboot: does the host match its plan? Judged with the audit's own checks. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuhost.checks import AuditPolicy, Severity, run_checks
from gpuhost.checks.base import ROLE_HOST
from gpuhost.facts.model import HostFacts
from gpuhost.plan.model import GRUB_DROPIN_PATH, TRIAL_MARKER
from gpuhost.plan.planner import NVIDIA_MODULES
from gpuhost.plan.settings import PlanSettings

HUGEPAGE_1G_KIB = 1048576


def verify_host(host: str, facts: HostFacts, settings: PlanSettings, plan: Mapping[str, Any]) -> dict[str, Any]:
    """{ok, summary, checks: [{name, ok, detail}], audit_errors: [...], status} as plain data."""
    checks: list[dict[str, Any]] = []

    def check(name: str, ok: bool, detail: str) -> None:
        checks.append({"name": name, "ok": ok, "detail": detail})

    running = facts.cmdline.tokens if facts.cmdline else ()
    missing = [option for option in plan["kernel_options"] if option not in running]
    check("cmdline", not missing, "all planned options in /proc/cmdline" if not missing else f"missing {missing}")
    for function in plan["functions"]:
        found = facts.function(function["address"])
        driver = found.driver if found else None
        check(f"vfio-pci {function['address']}", driver == "vfio-pci", f"driver {driver or 'none'}")
    loaded = [m for m in NVIDIA_MODULES if facts.modules is not None and facts.modules.is_loaded(m)]
    check("no host GPU driver", not loaded, "none loaded" if not loaded else f"loaded: {', '.join(loaded)}")
    pool = facts.hugepage_pool(HUGEPAGE_1G_KIB)
    allocated = pool.total if pool and pool.total is not None else 0
    wanted = int(plan["hugepages"]["pages"])
    check("hugepages 1G", allocated == wanted, f"{allocated} allocated, plan {wanted}")
    policy = AuditPolicy(gpus=settings.gpus, role=ROLE_HOST, allow_shared_group=settings.allow_shared_group)
    _, _, findings = run_checks(host, facts, policy)
    error_findings = [f for f in findings if f.severity == Severity.ERROR]
    errors = [f"{f.code}: {f.message}" for f in error_findings]
    check("audit", not errors, "no errors" if not errors else ", ".join(f.code for f in error_findings))
    failed = [f"{c['name']} ({c['detail']})" for c in checks if not c["ok"]]
    return {
        "ok": not failed,
        "status": "ready" if not failed else "not-ready",
        "summary": f"{host}: ready for passthrough" if not failed else f"{host}: not as planned: {'; '.join(failed)}",
        "checks": checks,
        "audit_errors": errors,
        "cmdline": " ".join(running),
    }


def verify_rollback(host: str, facts: HostFacts) -> dict[str, Any]:
    """After `gpuhost rollback`'s reboot: is the host on the command line GRUB computes without gpuhost?

    {ok, summary, cmdline, expected} as plain data. The expected line is the audit's own reading of
    /etc/default/grub and its drop-ins (gpuhost's gone), which update-grub appends after root= and ro.
    """
    running = facts.cmdline.tokens if facts.cmdline else ()
    expected = facts.grub.effective.tokens if facts.grub.effective is not None else None
    problems = []
    if GRUB_DROPIN_PATH in facts.grub.dropins:
        problems.append(f"{GRUB_DROPIN_PATH} is still there")
    if TRIAL_MARKER in running:
        problems.append("the host runs gpuhost's trial entry")
    if expected is None:
        problems.append("the GRUB command line could not be read")
    elif tuple(running[len(running) - len(expected) :]) != expected:
        problems.append(f"/proc/cmdline does not end with the GRUB line {' '.join(expected)!r}")
    else:
        leftovers = [t for t in running[: len(running) - len(expected)] if t.split("=", 1)[0] not in _BOOT_KEYS]
        if leftovers:
            problems.append(f"/proc/cmdline has options beyond the GRUB line: {' '.join(leftovers)}")
    return {
        "ok": not problems,
        "summary": f"{host}: the old command line is back" if not problems else f"{host}: " + "; ".join(problems),
        "cmdline": " ".join(running),
        "expected": " ".join(expected or ()),
    }


# What update-grub's entry puts before GRUB_CMDLINE_LINUX: the kernel image, root= and ro.
_BOOT_KEYS = ("BOOT_IMAGE", "root", "ro", "rootflags")
