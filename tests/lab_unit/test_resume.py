"""Saved boots of lab hosts (gpuhost.lab.resume) as data: which hosts share one, and how QEMU is told.

The save and the resume themselves run on real QEMU in every lab module (tests/lab/): a host of a
shape not saved yet is saved when it first answers SSH; test_lab_vms.py checks what a resumed host
looks like.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from gpuhost.lab import boot, resume
from gpuhost.lab.topology import LabVmSpec, qemu_argv

IMAGE = "base-70eec2d50fc1df50/disk.qcow2:1073741824:1764072000000000000"
QEMU = "QEMU emulator version 7.2.22 (Debian 1:7.2+dfsg-7+deb12u18+b3)"


def spec(lab: str = "/lab", port: int = 40022, **changes: object) -> LabVmSpec:
    values: dict[str, object] = {
        "name": "lab-1",
        "topology": "gpu-pair",
        "memory_mib": 2048,
        "cpus": 1,
        "ssh_port": port,
        "disk": Path(f"{lab}/overlays/lab-1.qcow2"),
        "serial_log": Path(f"{lab}/logs/lab-1-serial.log"),
        "pidfile": Path(f"{lab}/lab-1.pid"),
        "qmp_socket": Path(f"{lab}/lab-1.qmp"),
        "boot": boot.BIOS_GRUB,
    }
    values.update(changes)
    return LabVmSpec(**values)  # type: ignore[arg-type]


def test_hosts_that_differ_only_in_paths_and_ports_share_a_saved_boot() -> None:
    one = resume.shape_key(spec("/tmp/pytest/faults-lab0/a-1", 40022), IMAGE, QEMU)
    other = resume.shape_key(spec("/tmp/pytest/grub-files-lab0/a-1", 41234), IMAGE, QEMU)
    assert one == other


def test_anything_else_in_the_command_line_the_image_or_qemu_makes_another_shape() -> None:
    key = resume.shape_key(spec(), IMAGE, QEMU)
    others = {
        "memory": resume.shape_key(spec(memory_mib=4096), IMAGE, QEMU),
        "topology": resume.shape_key(spec(topology="shared-group"), IMAGE, QEMU),
        "cpus": resume.shape_key(spec(cpus=2), IMAGE, QEMU),
        "image rebuilt": resume.shape_key(spec(), IMAGE.replace(":1764072000", ":1764075600"), QEMU),
        "qemu": resume.shape_key(spec(), IMAGE, QEMU.replace("7.2.22", "8.2.2")),
        "name": resume.shape_key(spec(name="lab-2"), IMAGE, QEMU),  # its SMBIOS serial names the guest
    }
    assert key not in others.values() and len(set(others.values())) == len(others)


def test_uefi_shapes_depend_on_the_firmware_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code = tmp_path / "OVMF_CODE_4M.fd"
    code.write_bytes(b"build one")
    monkeypatch.setattr(boot, "OVMF", boot.OvmfFiles(code, tmp_path / "VARS.fd", needs_smm=False))
    uefi = spec(boot=boot.boot_mode("uefi"), efi_vars=tmp_path / "lab-1-efivars.fd")
    before = resume.shape_key(uefi, IMAGE, QEMU)
    code.write_bytes(b"build two")
    assert resume.shape_key(uefi, IMAGE, QEMU) != before


def test_the_qmp_socket_is_on_the_command_line_and_left_out_where_its_path_is_too_long() -> None:
    argv = qemu_argv(spec("/a,b"))
    assert argv[argv.index("-qmp") + 1] == "unix:/a,,b/lab-1.qmp,server=on,wait=off"
    assert "-qmp" not in qemu_argv(spec(qmp_socket=None))
    assert resume.qmp_socket_for(Path("/lab/lab-1.pid")) == Path("/lab/lab-1.qmp")
    assert resume.qmp_socket_for(Path("/" + "d" * 120 + "/lab-1.pid")) is None


def test_a_saved_boot_is_found_only_when_complete_and_resumed_through_incoming(tmp_path: Path) -> None:
    key = resume.shape_key(spec(), IMAGE, QEMU)
    assert resume.find_saved(tmp_path, key) is None
    directory = tmp_path / resume.BOOTED_DIR / key
    directory.mkdir(parents=True)
    (directory / resume.STATE_FILE).write_bytes(b"QEVM")
    assert resume.find_saved(tmp_path, key) is None  # no disk beside the state: not a saved boot
    (directory / resume.OVERLAY_FILE).write_bytes(b"QFI\xfb")
    saved = resume.find_saved(tmp_path, key)
    assert saved is not None and saved.state == directory / resume.STATE_FILE
    incoming = resume.incoming_argv(saved)
    assert incoming[0] == "-incoming" and shlex.split(incoming[1].removeprefix("exec:")) == ["cat", str(saved.state)]
