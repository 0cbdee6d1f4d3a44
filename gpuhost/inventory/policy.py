"""What the audit is asked to judge: the operator's GPU selection and the machine's role."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuhost.facts.model import TextEnum
from gpuhost.selection import GpuSelector

if TYPE_CHECKING:
    from gpuhost.inventory.spec import VmSpec


class Role(TextEnum):
    """What the audit judges a machine as (gpuhost_role / --role)."""

    AUTO = "auto"  # detect: a VM without an IOMMU whose NVIDIA GPU runs nvidia is a guest, else a host
    HOST = "host"  # a VM host that passes GPUs through
    GUEST = "guest"  # a passthrough guest, seen from inside


ROLES = tuple(Role)  # the accepted values, for validation messages


@dataclass(frozen=True)
class AuditPolicy:
    """What the operator asked for: which GPUs, and whether the host is a VM host or a guest."""

    gpus: GpuSelector
    role: Role = Role.AUTO
    allow_shared_group: tuple[str, ...] = ()  # addresses whose group may hold other devices
    vms: tuple[VmSpec, ...] = ()  # gpuhost_vms: the VMs whose memory the host's NUMA nodes must hold
