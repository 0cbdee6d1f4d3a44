"""The playbooks without the CLI: Molecule's scenario (playbooks/molecule/default) on lab hosts.

`molecule test` runs destroy, syntax, create (a lab host), prepare (check mode changes nothing),
converge (site.yml with its trial reboot), idempotence, verify and destroy; see the scenario's
files for what each step asserts. It runs here, as one lab module
so that the README's one test command runs it (on the lab-rest worker, beside the fault suite).
Run alone: `pytest tests/lab/test_molecule.py -n 0 -s`, or from playbooks/:
`PATH=$PWD/../.venv/bin:$PATH ../.venv/bin/molecule test`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuhost.lab.image import Image
from gpuhost.lab.paths import IMAGE_DIR_ENV

pytestmark = [pytest.mark.lab, pytest.mark.timeout(3600), pytest.mark.xdist_group("lab-rest")]

PLAYBOOKS = Path(__file__).resolve().parents[2] / "playbooks"


def test_molecule_scenario_passes_every_step(base_image: Image, image_dir: Path, tmp_path: Path) -> None:
    # The venv's bin first: Molecule runs ansible-playbook and the scenario runs gpuhost from PATH.
    venv_bin = Path(sys.executable).parent
    environment = {
        **os.environ,
        "PATH": f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}",
        IMAGE_DIR_ENV: str(image_dir),  # the image the base_image fixture made sure of
        "PY_COLORS": "0",
        "ANSIBLE_FORCE_COLOR": "0",
    }
    log = tmp_path / "molecule.log"
    started = time.monotonic()
    with log.open("w") as output:
        result = subprocess.run(
            [str(venv_bin / "molecule"), "test"],
            cwd=PLAYBOOKS,
            env=environment,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            timeout=3500,
            check=False,
        )
    text = log.read_text(errors="replace")
    timings = [line.strip() for line in text.splitlines() if "[molecule timing]" in line or "] Executed" in line]
    print(f"[lab timing] molecule test: {time.monotonic() - started:.0f} s", *timings[-40:], sep="\n", flush=True)
    assert result.returncode == 0, f"molecule test failed (rc {result.returncode}); its log ends:\n{text[-12000:]}"
    # Every step of the scenario's test_sequence ran and succeeded (none skipped or disabled).
    for step in ("syntax", "create", "prepare", "converge", "idempotence", "verify", "destroy"):
        assert f"[default > {step}] Executed: Successful" in text, f"molecule's {step} did not succeed:\n{text[-4000:]}"
