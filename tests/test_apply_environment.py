"""The environment `gpuhost apply` gives ansible-playbook (through ansible-runner)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from gpuhost.rollout.environment import ansible_environment


def test_host_keys_stay_verified() -> None:
    # ansible-runner sets ANSIBLE_HOST_KEY_CHECKING=False itself unless the environment names it.
    assert ansible_environment()["ANSIBLE_HOST_KEY_CHECKING"] == "True"


def test_ansible_playbook_is_found_beside_this_interpreter() -> None:
    # `.venv/bin/gpuhost apply` without an activated venv: ansible-playbook is in .venv/bin.
    first = ansible_environment()["PATH"].split(os.pathsep)[0]
    assert Path(first) == Path(sys.executable).parent
    assert (Path(first) / "ansible-playbook").exists()
