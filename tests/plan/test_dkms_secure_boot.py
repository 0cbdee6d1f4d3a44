"""What plan and apply do with a DKMS-built NVIDIA driver on a Secure Boot host (issue 16).

tests/fixtures/snapshots/lab-uefi-secureboot-unsigned-module is a real capture: the Secure Boot lab
host (enforcing) after an unsigned copy of an in-tree module was put in
/lib/modules/6.1.0-50-amd64/updates/dkms as nvidia-stand-in.ko, where DKMS installs its modules.
The signed case is that capture with two lines changed, both as a real host has them:
`modinfo -F signer` of the module prints "DKMS module signing key" (the subject of the MOK key
DKMS 3 generates, /var/lib/dkms/mok.pub; DKMS's README shows the same modinfo line), and dpkg lists
Debian 12's nvidia-kernel-dkms 535.183.01-1~deb12u1. Nothing else of the capture is touched.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from gpuhost.cli.views import describe_plan
from gpuhost.facts.build import build_facts
from gpuhost.facts.snapshot import SnapshotTree
from gpuhost.plan import PlanSettings, plan_host
from gpuhost.plan.model import HostPlan
from tests.helpers import COLLECTION, SNAPSHOTS

CAPTURE = SNAPSHOTS / "lab-uefi-secureboot-unsigned-module"
MODULE = "/lib/modules/6.1.0-50-amd64/updates/dkms/nvidia-stand-in.ko"
SIGNER = "DKMS module signing key"
PLAYBOOK = COLLECTION / "roles/gpuhost_driver_removal/tasks/main.yml"


def plan(root: Path, **variables: object) -> HostPlan:
    settings = PlanSettings.from_variables({"gpuhost_gpus": ["1234:1111"], **variables}, "lab-1")
    return plan_host("lab-1", build_facts(SnapshotTree(root)), settings)


def _signed_dkms_driver(tmp_path: Path) -> Path:
    root = tmp_path / "snapshot"
    shutil.copytree(CAPTURE, root)
    listing = root / "commands/out-of-tree-modules.txt"
    assert listing.read_text() == f"{MODULE}\t\n"  # the capture: one module, no signer
    listing.write_text(f"{MODULE}\t{SIGNER}\n")
    with (root / "commands/dpkg.txt").open("a") as dpkg:
        dpkg.write("ii  nvidia-kernel-dkms 535.183.01-1~deb12u1\n")
    return root


def test_an_unsigned_dkms_module_under_secure_boot_is_removed_and_no_mok_key_is_involved() -> None:
    removal = plan(CAPTURE).driver_removal
    assert removal.dkms_modules == (MODULE,) and removal.dkms_cleanup and removal.needed
    assert removal.packages == () and not removal.runfile
    assert "DKMS: nvidia-stand-in.ko are removed for every installed kernel" in removal.note
    assert "no nvidia*.ko is left in /lib/modules/*/updates/dkms" in removal.note
    assert "they are unsigned (the kernel already refuses them), so no MOK key is involved" in removal.note


def test_a_mok_signed_dkms_driver_is_purged_its_modules_removed_and_the_key_stays_enrolled(tmp_path: Path) -> None:
    result = plan(_signed_dkms_driver(tmp_path))
    assert result.applicable, result.refusals
    removal = result.driver_removal
    assert removal.packages == ("nvidia-kernel-dkms",) and removal.dkms_modules == (MODULE,)
    assert removal.dkms_cleanup
    text = "\n".join(describe_plan(result, show_files=False))
    # /etc/X11/xorg.conf is not on this capture, so it is not listed for deletion (issue 27.6).
    assert "host driver: purge nvidia-kernel-dkms; DKMS: nvidia-stand-in.ko are " in text
    assert f"signed with '{SIGNER}'" in text and "/var/lib/dkms/mok.pub), which stays enrolled" in text
    assert "mokutil --delete" in text and "MokManager" in text


def test_a_dkms_package_without_a_module_for_the_running_kernel_still_gets_the_cleanup(tmp_path: Path) -> None:
    root = _signed_dkms_driver(tmp_path)
    (root / "commands/out-of-tree-modules.txt").write_text("")  # DKMS built it for another kernel only
    removal = plan(root).driver_removal
    assert removal.dkms_modules == () and removal.dkms_cleanup
    assert "DKMS: the NVIDIA modules are removed for every installed kernel" in removal.note
    assert "MOK" not in removal.note  # nothing found to say who signed them


def test_a_host_keeping_its_driver_keeps_its_dkms_modules(tmp_path: Path) -> None:
    removal = plan(_signed_dkms_driver(tmp_path), gpuhost_remove_nvidia_driver=False).driver_removal
    assert not removal.dkms_cleanup and not removal.needed and removal.dkms_modules == ()


def test_the_playbook_runs_the_dkms_cleanup_only_where_the_plan_says_so() -> None:
    tasks = yaml.safe_load(PLAYBOOK.read_text())
    (cleanup,) = [t for t in tasks if "dkms remove" in str(t.get("ansible.builtin.shell", ""))]
    assert cleanup["when"] == "gpuhost_plan.driver_removal.dkms_cleanup"
    names = [t["name"] for t in tasks]
    # After the purge and the uninstaller, which normally ran `dkms remove` themselves.
    assert names.index(cleanup["name"]) > names.index("Run the uninstaller that NVIDIA's .run installer left")
