"""Issue 42 class 2: the BAR window a VM needs is computed from its BARs, the guest's width is the
host's where it is passed through, and a refusal comes only where the BARs cannot fit."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from gpuhost.bar_window import bars_window_bytes, bits_for_window, window_of_bits
from gpuhost.facts.model import HostFacts
from gpuhost.facts.pci import Bar
from gpuhost.inventory.spec import HostPolicy, parse_vm
from gpuhost.render.domain import RenderRefused, plan_domain
from gpuhost.selection import GpuSelector
from tests.hosts_as_they_come import shape_facts
from tests.render.test_domain import _with_1g_pages

CARD = GpuSelector.parse(["10de:1e84"], "test")
VM = parse_vm({"name": "desk", "vcpus": 2, "memory": "1G", "gpus": ["gpu0"]}, "test")
GIB = 1 << 30


def desktop_applied(tmp_path: Path) -> HostFacts:
    """The 39-bit desktop with its card's four functions on vfio-pci and a 1 GiB page, as apply leaves it."""
    facts = shape_facts("desktop-39-bit-rtx-2070-super", tmp_path)
    pci = tuple(
        dataclasses.replace(f, driver="vfio-pci") if f.address.startswith("0000:01:00.") else f for f in facts.pci
    )
    return _with_1g_pages(dataclasses.replace(facts, pci=pci), 1)


def test_a_consumer_card_renders_on_a_39_bit_desktop(tmp_path: Path):
    # Before: refused, "the VM needs a 32 GiB 64-bit PCI window ... 39 physical address bits, which
    # leave the guest's firmware a window of 64 GiB", for BARs of 256 MiB + 32 MiB + 320 KiB.
    facts = desktop_applied(tmp_path)
    plan = plan_domain(facts, VM, HostPolicy(gpus=CARD), host="desk")
    assert plan.maxphysaddr is not None and plan.maxphysaddr.mode == "passthrough"
    assert [f.host.address for port in plan.ports for f in port.functions] == [
        "0000:01:00.0",
        "0000:01:00.1",
        "0000:01:00.2",
        "0000:01:00.3",
    ]


def test_bars_that_cannot_fit_are_refused_with_a_message_that_agrees_with_itself(tmp_path: Path):
    facts = desktop_applied(tmp_path)
    big = [
        dataclasses.replace(
            f, bars=tuple(dataclasses.replace(b, end=b.start + 128 * GIB - 1) if b.index == 1 else b for b in f.bars)
        )
        if f.address == "0000:01:00.0"
        else f
        for f in facts.pci
    ]
    with pytest.raises(RenderRefused) as refused:
        plan_domain(dataclasses.replace(facts, pci=tuple(big)), VM, HostPolicy(gpus=CARD), host="desk")
    (conflict,) = refused.value.conflicts
    assert conflict.code == "render.bars.address_width"
    # 128 GiB + 32 MiB behind one port, aligned to the 128 GiB BAR: 256 GiB; 39 bits leave 64 GiB.
    assert "needs a 256 GiB 64-bit PCI window" in conflict.message and "a window of 64 GiB" in conflict.message
    assert "at least 41 physical address bits" in conflict.remedy


@pytest.mark.parametrize("bits", range(36, 53))
def test_the_window_rule_refuses_exactly_what_does_not_fit(bits: int):
    for exponent in range(20, 53):
        window = 1 << exponent
        assert (bits < bits_for_window(window)) == (window > window_of_bits(bits)), (bits, exponent)


def test_the_window_is_the_bars_with_their_alignment_and_nothing_more(tmp_path: Path):
    facts = shape_facts("desktop-39-bit-rtx-2070-super", tmp_path)
    card = [f for f in facts.pci if f.address.startswith("0000:01:00.")]
    # One port: 256 MiB + 32 MiB + 256 KiB + 64 KiB, aligned to the 256 MiB BAR: 512 MiB.
    assert bars_window_bytes([card]) == 512 << 20
    # Two ports of it: 1 GiB; no 64-bit prefetchable BAR: nothing.
    assert bars_window_bytes([card, card]) == GIB
    assert bars_window_bytes([[f for f in card if f.address.endswith(".1")]]) == 0
    lone = Bar(index=0, start=0, end=(3 << 30) - 1, flags=0x14220C)
    assert bars_window_bytes([[dataclasses.replace(card[0], bars=(lone,))]]) == 4 * GIB
