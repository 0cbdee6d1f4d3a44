"""Inventory values that select GPUs (gpuhost_gpus, gpuhost_allow_shared_group)."""

from __future__ import annotations

import pytest

from gpuhost.errors import InputError
from gpuhost.selection import GpuSelector, VmGpuMiss, allowed_shared_groups, vm_gpus
from tests.helpers import snapshot_facts


def test_a_bad_allow_shared_group_entry_is_named_as_such() -> None:
    assert allowed_shared_groups({"gpuhost_allow_shared_group": "0000:41:00.0"}, "gpu01") == ("0000:41:00.0",)
    assert allowed_shared_groups({}, "gpu01") == ()
    with pytest.raises(InputError, match=r"gpu01: gpuhost_allow_shared_group entry '41:00;reboot'"):
        allowed_shared_groups({"gpuhost_allow_shared_group": ["41:00;reboot"]}, "gpu01")
    with pytest.raises(InputError, match=r"gpuhost_allow_shared_group must be a list"):
        allowed_shared_groups({"gpuhost_allow_shared_group": 7}, "gpu01")


def test_a_vms_gpus_resolve_on_the_captured_numa_gpus_host() -> None:
    """gpu0 and gpu1 are the passthrough cards in address order; the BMC display is kept."""
    facts = snapshot_facts("lab-numa-gpus-vfio")
    selector = GpuSelector.parse(["1234:1111", "1af4:1050"], "test")
    picked = vm_gpus(facts, selector, ["gpu1", "0000:81:00.0", "0000:00:02.0", "gpu2", "0000:99:00.0"])
    assert [card.gpu.address for card in picked.available] == ["0000:81:00.0", "0000:82:00.0"]
    assert [card.gpu.address for card in picked.cards] == ["0000:82:00.0", "0000:81:00.0"]
    assert picked.misses == (
        ("0000:00:02.0", VmGpuMiss.KEPT),
        ("gpu2", VmGpuMiss.NO_SUCH_INDEX),
        ("0000:99:00.0", VmGpuMiss.NO_SUCH_ADDRESS),
    )
    assert vm_gpus(facts, selector, ["all"]).cards == picked.available
