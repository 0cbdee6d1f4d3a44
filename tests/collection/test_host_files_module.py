"""The collection's host_files module, run as Ansible runs a module (its file and a JSON args file), on
real files under a temporary directory; and the plan's phases it carries out (gpuhost.plan.files).

Where the module stands in for a builtin (blockinfile for the initramfs module list), the builtin is
run on the same input and the two files must be equal byte for byte: a host's blocks from earlier
applies must be found. One difference is wanted: with no block to add or remove, a file whose last
line has no newline is left as it is (blockinfile adds one), so that rollback's copy is the file.
"""

from __future__ import annotations

import json
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuhost.plan import PlanSettings, plan_host
from gpuhost.plan.files import APT_PIN, plan_files
from gpuhost.plan.model import (
    DEADLINE_SERVICE_PATH,
    DEADLINE_TIMER_PATH,
    FSTAB_MARKER,
    FSTAB_PATH,
    GRUB_DROPIN_PATH,
    INITRAMFS_MODULES_MARKER,
    INITRAMFS_MODULES_PATH,
    INITRAMFS_SCRIPT_PATH,
    KERNEL_CMDLINE_PATH,
    MODPROBE_COMMENT_PREFIX,
    TRIAL_GRUB_SCRIPT_PATH,
    TRIAL_SETTINGS_PATH,
    DriverRemoval,
    FileState,
    KernelCmdlineWriter,
    Regenerates,
    SystemdBootPlan,
    TrialBoot,
)
from gpuhost.plan.rescue import deadline_units
from tests.helpers import COLLECTION, SNAPSHOTS, snapshot_facts

MODULE = COLLECTION / "plugins" / "modules" / "host_files.py"
BLOCKINFILE = "ansible.modules.blockinfile"
MODULES_FILE = "# /etc/initramfs-tools/modules: modules to include in the initramfs\nloop\n"


def run_module(
    module: Path | str, tmp_path: Path, args: dict[str, Any], check: bool = False, diff: bool = False
) -> dict[str, Any]:
    """`module`: a module's file, or the name of a builtin (run with -m: beside its file, ansible's own
    tempfile module would shadow the standard library's)."""
    arguments = tmp_path / "args.json"
    payload = {**args, "_ansible_check_mode": check, "_ansible_diff": diff, "_ansible_tmpdir": str(tmp_path)}
    arguments.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": payload}))
    program = [str(module)] if isinstance(module, Path) else ["-m", module]
    done = subprocess.run([sys.executable, *program, str(arguments)], capture_output=True, text=True, timeout=60)
    result: dict[str, Any] = json.loads(done.stdout)
    assert not result.get("failed"), result
    return result


def change(path: Path, state: str, content: str = "", **extra: str) -> dict[str, str]:
    return {"path": str(path), "state": state, "content": content, **extra}


def test_a_file_is_written_once_with_its_mode_and_a_diff(tmp_path: Path) -> None:
    target = tmp_path / "etc" / "default" / "grub.d" / "gpuhost.cfg"
    files = [change(target, "present", "GRUB_CMDLINE_LINUX_DEFAULT=x\n", mode="0755", regenerates="grub")]
    first = run_module(MODULE, tmp_path, {"files": files}, diff=True)
    assert first["changed"] and first["changed_paths"] == [str(target)] and first["regenerate"] == ["grub"]
    assert first["diff"] == [
        {"before_header": str(target), "after_header": str(target), "before": "", "after": files[0]["content"]}
    ]
    assert target.read_text() == "GRUB_CMDLINE_LINUX_DEFAULT=x\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o755 and target.stat().st_uid == 0
    again = run_module(MODULE, tmp_path, {"files": files})
    assert not again["changed"] and again["regenerate"] == []
    target.chmod(0o600)
    mode_only = run_module(MODULE, tmp_path, {"files": files})
    assert mode_only["changed"] and stat.S_IMODE(target.stat().st_mode) == 0o755


def test_check_mode_reports_every_change_and_writes_nothing(tmp_path: Path) -> None:
    kept = tmp_path / "kept.conf"
    kept.write_text("old\n")
    files = [
        change(tmp_path / "new.cfg", "present", "new\n", regenerates="initramfs"),
        change(kept, "absent", regenerates="grub"),
        change(tmp_path / "hugepages1G", "directory", mode="0755"),
        change(tmp_path / "modules", "block", "vfio\n", marker=INITRAMFS_MODULES_MARKER),
    ]
    result = run_module(MODULE, tmp_path, {"files": files}, check=True, diff=True)
    assert result["changed_paths"] == [f["path"] for f in files]
    assert result["regenerate"] == ["initramfs", "grub"]
    assert len(result["diff"]) == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["args.json", "kept.conf"]


def test_absent_removes_a_file_and_then_finds_nothing_to_do(tmp_path: Path) -> None:
    target = tmp_path / "nvidia.conf"
    target.write_text("options nvidia NVreg_PreserveVideoMemoryAllocations=1\n")
    files = [change(target, "absent", regenerates="initramfs")]
    assert run_module(MODULE, tmp_path, {"files": files})["regenerate"] == ["initramfs"]
    assert not target.exists()
    assert not run_module(MODULE, tmp_path, {"files": files})["changed"]


@pytest.mark.parametrize(
    ("start", "block"),
    [
        (None, "vfio\nvfio_iommu_type1\nvfio_pci\n"),  # no file yet: blockinfile's create
        (MODULES_FILE, "vfio\nvfio_iommu_type1\nvfio_pci\n"),  # the host's file, no block
        (MODULES_FILE.rstrip("\n"), "vfio\n"),  # no newline at the end
        (
            "loop\n# BEGIN gpuhost: vfio-pci must own the passthrough GPUs before any host driver\nvfio\n"
            "# END gpuhost: vfio-pci must own the passthrough GPUs before any host driver\nafter\n",
            "vfio\nvfio_pci\n",
        ),  # an earlier apply's block, with a line of the host's after it
        (
            "loop\n# BEGIN gpuhost: vfio-pci must own the passthrough GPUs before any host driver\nvfio\n"
            "# END gpuhost: vfio-pci must own the passthrough GPUs before any host driver\n",
            "",
        ),  # removed
    ],
)
def test_a_block_is_what_blockinfile_leaves(tmp_path: Path, start: str | None, block: str) -> None:
    ours, builtin = tmp_path / "ours" / "modules", tmp_path / "builtin" / "modules"
    for path in (ours, builtin):
        path.parent.mkdir()
        if start is not None:
            path.write_text(start)
    run_module(MODULE, tmp_path, {"files": [change(ours, "block", block, marker=INITRAMFS_MODULES_MARKER)]})
    run_module(
        BLOCKINFILE,
        tmp_path,
        {
            "path": str(builtin),
            "marker": INITRAMFS_MODULES_MARKER,
            "block": block.rstrip("\n"),
            "state": "present" if block else "absent",
            "create": True,
        },
    )
    assert ours.exists() == builtin.exists()
    if builtin.exists():
        assert ours.read_bytes() == builtin.read_bytes()
    again = run_module(MODULE, tmp_path, {"files": [change(ours, "block", block, marker=INITRAMFS_MODULES_MARKER)]})
    assert not again["changed"]


def test_no_block_leaves_a_file_without_a_newline_at_its_end_as_it_is(tmp_path: Path) -> None:
    """blockinfile (state absent) adds the newline; apply must not, or rollback's copy would differ."""
    fstab = tmp_path / "fstab"
    fstab.write_text("/dev/vda1 / ext4 errors=remount-ro 0 1")
    result = run_module(MODULE, tmp_path, {"files": [change(fstab, "block", "", marker=FSTAB_MARKER)]})
    assert not result["changed"] and fstab.read_text() == "/dev/vda1 / ext4 errors=remount-ro 0 1"


def test_backups_keep_the_first_record_a_copy_or_a_note_that_the_path_was_absent(tmp_path: Path) -> None:
    source = tmp_path / "etc" / "modprobe.d" / "nvidia.conf"
    source.parent.mkdir(parents=True)
    source.write_text("original\n")
    source.chmod(0o640)
    missing = tmp_path / "missing.conf"
    backup_dir = tmp_path / "backup"
    args = {"backup": [str(source), str(missing), str(tmp_path / "etc")], "backup_dir": str(backup_dir)}
    first = run_module(MODULE, tmp_path, args)
    copy = Path(f"{backup_dir}{source}")
    assert first["backed_up"] == [str(source), str(missing)] and copy.read_text() == "original\n"
    assert stat.S_IMODE(copy.stat().st_mode) == 0o640 and stat.S_IMODE(backup_dir.stat().st_mode) == 0o700
    assert json.loads(Path(f"{backup_dir}-absent.json").read_text()) == [str(missing)]
    assert not Path(f"{backup_dir}{tmp_path}/etc/modprobe.d/nvidia.conf").is_dir()  # a directory is not copied
    source.write_text("changed by apply\n")
    missing.write_text("made by apply\n")
    assert not run_module(MODULE, tmp_path, args)["changed"]
    assert copy.read_text() == "original\n"
    assert json.loads(Path(f"{backup_dir}-absent.json").read_text()) == [str(missing)]


def test_a_directory_where_a_file_should_be_fails_with_the_path(tmp_path: Path) -> None:
    arguments = tmp_path / "args.json"
    target = tmp_path / "gpuhost.cfg"
    target.mkdir()
    payload = {"files": [change(target, "present", "x\n")], "_ansible_tmpdir": str(tmp_path)}
    arguments.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": payload}))
    done = subprocess.run([sys.executable, str(MODULE), str(arguments)], capture_output=True, text=True, timeout=60)
    result = json.loads(done.stdout)
    assert result["failed"] and str(target) in result["msg"] and "move it away" in result["msg"]


TRIAL = TrialBoot(True, 10, "trial settings\n", "grub script\n", "/dev/vda1 (ext4)")
NO_REMOVAL = DriverRemoval((), False, (), False, "")
SYSTEMD_BOOT = SystemdBootPlan(
    KernelCmdlineWriter.KERNEL_INSTALL,
    "root=/dev/vda2 ro\n",
    "root=/dev/vda2 ro intel_iommu=on\n",
    "/boot/efi/loader/entries/debian.conf",
    "/boot/efi/loader/entries/gpuhost-trial.conf",
    "title trial\n",
    "kernel-install add ...",
)


def phases(trial_now: bool, systemd_boot: SystemdBootPlan | None = None, **kwargs: Any) -> Any:
    arguments: dict[str, Any] = {
        "trial_now": trial_now,
        "trial": TRIAL,
        "systemd_boot": systemd_boot,
        "grub_dropin": "dropin\n",
        "driver_removal": NO_REMOVAL,
        "initramfs_modules": ("vfio", "vfio_pci"),
        "initramfs_script": None,
        "hugetlbfs_mount_point": None,
        "deadline_units": deadline_units(1500),
        **kwargs,
    }
    return plan_files(**arguments)


REMOVED_DEADLINE = [(DEADLINE_TIMER_PATH, FileState.ABSENT), (DEADLINE_SERVICE_PATH, FileState.ABSENT)]


def paths(changes: Any) -> list[tuple[str, FileState]]:
    return [(c.path, c.state) for c in changes]


def test_a_grub_trial_writes_the_trial_settings_and_leaves_the_default_entry_to_commit() -> None:
    files = phases(trial_now=True)
    assert paths(files.configure) == [
        (TRIAL_GRUB_SCRIPT_PATH, FileState.PRESENT),
        (TRIAL_SETTINGS_PATH, FileState.PRESENT),
        (INITRAMFS_MODULES_PATH, FileState.BLOCK),
        (INITRAMFS_SCRIPT_PATH, FileState.ABSENT),
        (FSTAB_PATH, FileState.BLOCK),  # no mount: an earlier apply's block goes
        (DEADLINE_TIMER_PATH, FileState.PRESENT),
        (DEADLINE_SERVICE_PATH, FileState.PRESENT),
    ]
    assert files.configure[2].content == "vfio\nvfio_pci\n"
    assert paths(files.commit) == [
        (GRUB_DROPIN_PATH, FileState.PRESENT),
        (TRIAL_SETTINGS_PATH, FileState.ABSENT),
        *REMOVED_DEADLINE,
    ]
    assert paths(files.revert) == [(TRIAL_SETTINGS_PATH, FileState.ABSENT), *REMOVED_DEADLINE]
    assert {c.regenerates for c in files.commit} == {Regenerates.GRUB, None}


def test_without_a_trial_the_default_entry_is_written_and_a_left_trial_removed() -> None:
    files = phases(trial_now=False, trial=TrialBoot(False, 10, "s\n", "g\n", ""))
    assert paths(files.configure)[:2] == [
        (GRUB_DROPIN_PATH, FileState.PRESENT),
        (TRIAL_SETTINGS_PATH, FileState.ABSENT),
    ]
    assert TRIAL_GRUB_SCRIPT_PATH not in [c.path for c in files.configure]
    # A deadline an interrupted trial left goes too: nothing of the trial stays without one.
    assert paths(files.configure)[-2:] == REMOVED_DEADLINE


def test_systemd_boot_phases_write_the_trial_entry_then_kernel_cmdline() -> None:
    trial = phases(trial_now=True, systemd_boot=SYSTEMD_BOOT)
    assert paths(trial.configure)[0] == (SYSTEMD_BOOT.trial_entry_path, FileState.PRESENT)
    assert trial.configure[0].mode == "0700" and trial.configure[0].regenerates is None
    assert paths(trial.commit) == [
        (KERNEL_CMDLINE_PATH, FileState.PRESENT),
        (SYSTEMD_BOOT.trial_entry_path, FileState.ABSENT),
        *REMOVED_DEADLINE,
    ]
    assert trial.commit[0].regenerates is Regenerates.LOADER_ENTRIES
    plain = phases(trial_now=False, systemd_boot=SYSTEMD_BOOT)
    assert paths(plain.configure)[:2] == [
        (KERNEL_CMDLINE_PATH, FileState.PRESENT),
        (SYSTEMD_BOOT.trial_entry_path, FileState.ABSENT),
    ]


def test_driver_files_pin_script_and_mount_point_are_in_the_configure_phase() -> None:
    removal = DriverRemoval(("nvidia-driver",), False, ("/etc/modprobe.d/nvidia.conf",), True, "")
    files = phases(
        trial_now=True, driver_removal=removal, initramfs_script="#!/bin/sh\n", hugetlbfs_mount_point="/dev/hugepages1G"
    )
    by_path = {c.path: c for c in files.configure}
    assert by_path["/etc/modprobe.d/nvidia.conf"].state is FileState.ABSENT
    assert by_path["/etc/modprobe.d/nvidia.conf"].regenerates is Regenerates.INITRAMFS
    assert by_path["/etc/apt/preferences.d/gpuhost-no-nvidia-driver"].content == APT_PIN
    assert by_path[INITRAMFS_SCRIPT_PATH].mode == "0755"
    assert by_path["/dev/hugepages1G"].state is FileState.DIRECTORY
    assert by_path[FSTAB_PATH].state is FileState.BLOCK and by_path[FSTAB_PATH].marker == FSTAB_MARKER
    assert by_path[FSTAB_PATH].content == "none /dev/hugepages1G hugetlbfs pagesize=1G,nofail 0 0\n"


@pytest.mark.parametrize("snapshot", ["lab-gpu-pair-fresh", "lab-uefi-systemd-boot"])
@pytest.mark.parametrize("trial", [True, False])
def test_every_phase_of_a_real_plan_runs_as_the_playbook_passes_it(tmp_path: Path, snapshot: str, trial: bool) -> None:
    """The plan's JSON as the playbooks hand it over, every field of every change (None included: a
    choices list in the argument spec refused it in the lab), under a stand-in root in tmp_path."""
    variables = {"gpuhost_gpus": ["1234:1111"], "gpuhost_hugepages": 0, "gpuhost_trial_boot": trial}
    plan = plan_host("lab-1", snapshot_facts(snapshot), PlanSettings.from_variables(variables, "test"))
    assert plan.applicable and plan.reboot_needed, plan.refusals
    phases = plan.to_json()["files"]
    root = tmp_path / "root"
    for phase in ("configure", "commit", "revert"):
        files = [{**change, "path": f"{root}{change['path']}"} for change in phases[phase]]
        fields = {"path", "state", "content", "mode", "regenerates", "marker", "line"}
        assert all(set(change) == fields for change in files)
        result = run_module(MODULE, tmp_path, {"files": files})
        assert set(result["regenerate"]) <= {"initramfs", "grub", "loader-entries"}
        assert not run_module(MODULE, tmp_path, {"files": files})["changed"], phase
    dropin = root / GRUB_DROPIN_PATH.lstrip("/")
    if plan.systemd_boot is None:
        assert dropin.read_text() == plan.grub_dropin and not (root / TRIAL_SETTINGS_PATH.lstrip("/")).exists()
    else:
        assert (root / KERNEL_CMDLINE_PATH.lstrip("/")).read_text() == plan.systemd_boot.kernel_cmdline


# An operator's own `options vfio-pci ids=` over two lines (modprobe's continuation), between lines
# of its own: the plan's parser finds it at line 2, and apply comments out both of its lines.
OPERATOR_VFIO_CONF = (
    "# passthrough set up by hand\noptions vfio-pci \\\n  ids=10de:1b80 disable_vga=1\nblacklist nouveau\n"
)


def test_commented_comments_out_the_lines_the_plan_found_and_nothing_else(tmp_path: Path) -> None:
    conf = tmp_path / "vfio.conf"
    conf.write_text(OPERATOR_VFIO_CONF)
    conf.chmod(0o600)
    wanted = "options vfio-pci \\\n  ids=10de:1b80 disable_vga=1\n"
    files = [change(conf, "commented", wanted, marker=MODPROBE_COMMENT_PREFIX, line="2", regenerates="initramfs")]
    first = run_module(MODULE, tmp_path, {"files": files})
    assert first["regenerate"] == ["initramfs"]
    assert conf.read_text() == (
        "# passthrough set up by hand\n"
        f"{MODPROBE_COMMENT_PREFIX}options vfio-pci \\\n"
        f"{MODPROBE_COMMENT_PREFIX}  ids=10de:1b80 disable_vga=1\n"
        "blacklist nouveau\n"
    )
    assert stat.S_IMODE(conf.stat().st_mode) == 0o600  # the host's file keeps its mode
    assert not run_module(MODULE, tmp_path, {"files": files})["changed"]
    # The file changed since the plan read it: nothing is edited, and the message says so.
    conf.write_text("options vfio-pci ids=10de:2330\n" + OPERATOR_VFIO_CONF)
    arguments = tmp_path / "args.json"
    arguments.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {"files": files, "_ansible_tmpdir": str(tmp_path)}}))
    done = subprocess.run([sys.executable, str(MODULE), str(arguments)], capture_output=True, text=True, timeout=60)
    result = json.loads(done.stdout)
    assert result["failed"] and f"{conf}:2" in result["msg"] and "changed since" in result["msg"]
    assert conf.read_text() == "options vfio-pci ids=10de:2330\n" + OPERATOR_VFIO_CONF


def test_a_restored_block_file_keeps_the_hosts_later_edits(tmp_path: Path) -> None:
    fstab = tmp_path / "fstab"
    fstab.write_text("/dev/vda1 / ext4 errors=remount-ro 0 1")  # no newline at its end
    backup_dir = tmp_path / "backup"
    block = change(fstab, "block", "none /mnt/h hugetlbfs pagesize=1G,nofail 0 0\n", marker=FSTAB_MARKER)
    run_module(MODULE, tmp_path, {"backup": [str(fstab)], "backup_dir": str(backup_dir), "files": [block]})
    restore = {"backup_dir": str(backup_dir), "files": [change(fstab, "restored", marker=FSTAB_MARKER)]}
    assert run_module(MODULE, tmp_path, restore)["kept_edits"] == []
    assert fstab.read_text() == "/dev/vda1 / ext4 errors=remount-ro 0 1"  # byte for byte, as it was
    run_module(MODULE, tmp_path, {"files": [block]})
    with fstab.open("a") as edit:
        edit.write("/dev/vdb1 /srv ext4 defaults 0 2\n")  # the operator's, after apply
    result = run_module(MODULE, tmp_path, restore)
    assert result["kept_edits"] == [str(fstab)]
    assert fstab.read_text() == "/dev/vda1 / ext4 errors=remount-ro 0 1\n/dev/vdb1 /srv ext4 defaults 0 2\n"


def test_an_absent_directory_goes_only_when_empty(tmp_path: Path) -> None:
    mount = tmp_path / "hugepages-1G"
    mount.mkdir()
    (mount / "a-vm's-file").write_text("")
    arguments = tmp_path / "args.json"
    payload = {"files": [change(mount, "absent")], "_ansible_tmpdir": str(tmp_path)}
    arguments.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": payload}))
    done = subprocess.run([sys.executable, str(MODULE), str(arguments)], capture_output=True, text=True, timeout=60)
    assert json.loads(done.stdout)["failed"] and (mount / "a-vm's-file").exists()
    (mount / "a-vm's-file").unlink()
    assert run_module(MODULE, tmp_path, {"files": [change(mount, "absent")]})["changed"] and not mount.exists()


DEBIAN_DIRECTORIES = (
    "etc/apt/preferences.d",
    "etc/grub.d",
    "etc/systemd/system",
    "etc/initramfs-tools/scripts/init-top",
    "mnt",
)


def _manifest(root: Path, skip: Path) -> dict[str, tuple[str, int, int, str]]:
    """path -> (mode, uid, gid, sha256 or link target) of everything under root (`skip` aside)."""
    import hashlib

    found = {}
    for path in sorted(root.rglob("*")):
        if path == skip or skip in path.parents:
            continue
        info = path.lstat()
        if path.is_symlink():
            what = "-> " + str(path.readlink())
        elif path.is_file():
            what = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            what = "directory"
        found[str(path.relative_to(root))] = (oct(info.st_mode), info.st_uid, info.st_gid, what)
    return found


@pytest.mark.parametrize("snapshot", ["lab-gpu-pair-fresh", "lab-uefi-systemd-boot"])
@pytest.mark.parametrize("trial", [True, False])
def test_apply_then_rollback_leaves_every_file_as_it_was(tmp_path: Path, snapshot: str, trial: bool) -> None:
    """A real host's capture as a stand-in root, with an operator's own modprobe.d ids and a hugetlbfs
    mount: apply's record, every phase of its real plan (twice), then the rollback plan computed from
    the records; the manifest of the root (path, mode, owner, sha256) is the one before apply."""
    from gpuhost.facts.build import build_facts
    from gpuhost.facts.snapshot import SnapshotTree
    from gpuhost.plan.rollback import parse_backups, plan_rollback, read_backups_command

    root = tmp_path / "root"
    shutil.copytree(SNAPSHOTS / snapshot, root, symlinks=True)
    # The capture holds only the files gpuhost reads; a Debian host has these directories of its
    # packages' (apt, grub-common, systemd, initramfs-tools, base-files), which apply writes into.
    for directory in DEBIAN_DIRECTORIES:
        (root / directory).mkdir(parents=True, exist_ok=True)
    (root / "etc/modprobe.d").mkdir(exist_ok=True)
    (root / "etc/modprobe.d/vfio.conf").write_text(OPERATOR_VFIO_CONF)
    records = root / "var/lib/gpuhost"
    records.mkdir(parents=True)
    variables = {
        "gpuhost_gpus": ["1234:1111"],
        "gpuhost_hugepages": 1 if snapshot == "lab-gpu-pair-fresh" else "auto",  # the capture's RAM allows
        "gpuhost_trial_boot": trial,
        "gpuhost_hugetlbfs_mount": "/mnt/hugepages-1G",
    }
    plan = plan_host("lab-1", build_facts(SnapshotTree(root)), PlanSettings.from_variables(variables, "test"))
    assert plan.applicable and [c.path for c in plan.modprobe_conflicts] == ["/etc/modprobe.d/vfio.conf"]
    before = _manifest(root, records)
    backup_dir = f"{records}/backup"

    def rooted(changes: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{**c, "path": f"{root}{c['path']}"} for c in changes]

    data = plan.to_json()
    for _ in range(2):  # a second apply (its backups kept: the first record is the original)
        backup = [f"{root}{path}" for path in data["backup_files"]]
        run_module(MODULE, tmp_path, {"backup": backup, "backup_dir": backup_dir})
        for phase in ("configure", "commit"):
            run_module(MODULE, tmp_path, {"files": rooted(data["files"][phase])})
    conf = (root / "etc/modprobe.d/vfio.conf").read_text()
    assert conf.count(MODPROBE_COMMENT_PREFIX) == 2 and "blacklist nouveau" in conf
    mounted = plan.hugepages.mount_point is not None  # the systemd-boot capture's RAM gives no 1 GiB page
    assert mounted == (snapshot == "lab-gpu-pair-fresh")
    assert ("hugetlbfs pagesize=1G,nofail" in (root / "etc/fstab").read_text()) == mounted
    assert _manifest(root, records) != before

    listing = subprocess.run(["sh", "-c", read_backups_command(backup_dir)], capture_output=True, check=True)
    recorded = parse_backups(listing.stdout, backup_dir)
    backups = type(recorded)(
        copied=tuple(p.removeprefix(str(root)) for p in recorded.copied),
        absent=tuple(p.removeprefix(str(root)) for p in recorded.absent),
    )
    assert ("/mnt/hugepages-1G" in backups.absent) == mounted and "/etc/fstab" in backups.copied
    rollback = plan_rollback("lab-1", build_facts(SnapshotTree(root)), backups, 900).to_json()
    result = run_module(MODULE, tmp_path, {"files": rooted(rollback["files"]), "backup_dir": backup_dir})
    assert "initramfs" in result["regenerate"] and result["kept_edits"] == []
    run_module(MODULE, tmp_path, {"backup_dir": backup_dir, "forget_backups": True})
    after = _manifest(root, records)
    differ = sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p))
    assert not differ, [(p, before.get(p), after.get(p)) for p in differ]
    assert list(records.iterdir()) == []
