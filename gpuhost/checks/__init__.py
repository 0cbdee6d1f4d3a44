"""Checks: (facts, policy) -> findings (`Problem`s of Stage.AUDIT). None of them prints."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from gpuhost.checks.address_space import check_address_space
from gpuhost.checks.base import CheckContext
from gpuhost.checks.firmware import check_firmware
from gpuhost.checks.gpus import check_gpu_cards, check_gpu_presence, check_nvswitches
from gpuhost.checks.guest import check_guest
from gpuhost.checks.host_software import check_initramfs, check_modprobe, check_nvidia_driver
from gpuhost.checks.memory import check_hugepages, check_hugepages_per_node
from gpuhost.checks.platform import (
    check_bootloader,
    check_command_line,
    check_cpu,
    check_iommu,
    check_supported,
)
from gpuhost.checks.rescue import check_rescue
from gpuhost.facts.model import HostFacts
from gpuhost.facts.pci import VENDOR_NVIDIA
from gpuhost.inventory.policy import AuditPolicy, Role
from gpuhost.passthrough import gpu_cards
from gpuhost.problems import Problem, Severity
from gpuhost.selection import GpuSelection, select_gpus

Check = Callable[[CheckContext], Iterable[Problem]]

HOST_CHECKS: tuple[Check, ...] = (
    check_cpu,
    check_iommu,
    check_command_line,
    check_gpu_presence,
    check_gpu_cards,
    check_nvswitches,
    check_address_space,
    check_nvidia_driver,
    check_modprobe,
    check_initramfs,
    check_hugepages,
    check_hugepages_per_node,
    check_bootloader,
    check_firmware,
    check_rescue,
)
GUEST_CHECKS: tuple[Check, ...] = (check_guest,)

__all__ = ["AuditPolicy", "Problem", "Role", "Severity", "detect_role", "run_checks"]


def detect_role(facts: HostFacts, requested: Role) -> Role:
    """A VM with no IOMMU whose NVIDIA GPU is driven by nvidia is a passthrough guest; else a host."""
    if requested is not Role.AUTO:
        return requested
    in_vm = facts.cpu is not None and facts.cpu.is_virtual_machine
    driven_gpu = any(card.gpu.vendor == VENDOR_NVIDIA and card.gpu.driver == "nvidia" for card in gpu_cards(facts))
    return Role.GUEST if in_vm and not facts.iommu.active and driven_gpu else Role.HOST


def run_checks(host: str, facts: HostFacts, policy: AuditPolicy) -> tuple[Role, GpuSelection, list[Problem]]:
    """The role, the GPU selection and every finding, most severe first."""
    role = detect_role(facts, policy.role)
    selection = select_gpus(facts, policy.gpus)
    ctx = CheckContext(host=host, facts=facts, policy=policy, selection=selection, role=role)
    checks = GUEST_CHECKS if role is Role.GUEST else HOST_CHECKS
    # A host gpuhost does not support gets that one error, not the other checks' advice for x86 hosts.
    unsupported = list(check_supported(ctx)) if role is Role.HOST else []
    findings = unsupported or [finding for check in checks for finding in check(ctx)]
    findings.sort(key=lambda f: f.severity.rank)
    return role, selection, findings
