"""The environment `gpuhost apply` gives ansible-playbook (through ansible-runner)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from gpuhost.rollout import engine
from gpuhost.rollout.environment import AUDIT_PLAYBOOK, ROLLBACK_PLAYBOOK, SITE_PLAYBOOK, ansible_environment


def test_host_keys_stay_verified() -> None:
    # ansible-runner sets ANSIBLE_HOST_KEY_CHECKING=False itself unless the environment names it.
    assert ansible_environment()["ANSIBLE_HOST_KEY_CHECKING"] == "True"


def test_ansible_playbook_is_found_beside_this_interpreter() -> None:
    # `.venv/bin/gpuhost apply` without an activated venv: ansible-playbook is in .venv/bin.
    first = ansible_environment()["PATH"].split(os.pathsep)[0]
    assert Path(first) == Path(sys.executable).parent
    assert (Path(first) / "ansible-playbook").exists()


@pytest.mark.parametrize("playbook", [SITE_PLAYBOOK, ROLLBACK_PLAYBOOK, AUDIT_PLAYBOOK])
def test_the_collections_playbooks_resolve_by_name_in_the_rollouts_environment(playbook: str, tmp_path: Path) -> None:
    """apply and rollback hand ansible-runner the playbook's name (gpuhost.passthrough.site), as AWX
    and `ansible-playbook gpuhost.passthrough.site` do: it resolves, with every role and action in
    it, from the collections path the rollout's environment names."""
    inventory = tmp_path / "inventory.yml"
    inventory.write_text("all:\n  hosts:\n    gpu01:\n      ansible_host: 127.0.0.1\n")
    tracker = engine.EventTracker(lambda line: None)
    _, rc, status = engine.run_playbook(playbook, inventory, ["gpu01"], {}, "--syntax-check", [], tracker)
    assert (rc, status) == (0, "successful"), f"{playbook}: ansible-playbook --syntax-check rc {rc} ({status})"
