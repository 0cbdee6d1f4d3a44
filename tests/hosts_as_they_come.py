"""Host shapes gpuhost met in the field (issue 42): Ubuntu's precompiled NVIDIA modules, the open
kernel modules, a 39-bit desktop, an aarch64 Grace host. Each is a case of the audit-case form
(tests/test_audit_cases.py) under tests/fixtures/hosts-as-they-come/<shape>/case.json: a real lab
capture with the files such a host has different; the README there cites what each file is modelled on."""

from __future__ import annotations

from pathlib import Path

from gpuhost.facts.build import build_facts
from gpuhost.facts.model import HostFacts
from gpuhost.facts.snapshot import SnapshotTree
from tests.helpers import FIXTURES
from tests.test_audit_cases import derive_snapshot, load_case

SHAPES = FIXTURES / "hosts-as-they-come"


def shape_directories() -> list[Path]:
    return sorted(p for p in SHAPES.iterdir() if p.is_dir())


def shape_snapshot(name: str, tmp_path: Path) -> Path:
    return derive_snapshot(load_case(SHAPES / name), tmp_path / name)


def shape_facts(name: str, tmp_path: Path) -> HostFacts:
    return build_facts(SnapshotTree(shape_snapshot(name, tmp_path)))
