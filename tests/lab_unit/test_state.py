"""The lab's state file, process identity, memory and port checks, and lab directories."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuhost.lab import fleet
from gpuhost.lab.errors import LabError, ToolMissingError
from gpuhost.lab.paths import LabPaths, default_lab_dir
from gpuhost.lab.ssh import ssh_argv
from gpuhost.lab.state import (
    LabState,
    VmRecord,
    is_our_process,
    load_state,
    process_start_ticks,
    save_state,
    state_from_json,
    state_to_json,
)
from gpuhost.lab.tools import require


def record(**changes: object) -> VmRecord:
    values: dict[str, object] = {
        "name": "lab-1",
        "topology": "gpu-pair",
        "pid": 4242,
        "start_ticks": 99,
        "ssh_port": 40001,
        "overlay": "/lab/overlays/lab-1.qcow2",
        "serial_log": "/lab/logs/lab-1-serial.log",
        "pidfile": "/lab/lab-1.pid",
        "memory_mib": 4096,
        "cpus": 2,
        "image": "/img/disk.qcow2",
        "argv": ("qemu-system-x86_64", "-pidfile", "/lab/lab-1.pid"),
    }
    values.update(changes)
    return VmRecord(**values)  # type: ignore[arg-type]


def test_state_round_trips(tmp_path: Path) -> None:
    state = LabState(hosts=(record(), record(name="lab-2", pid=4243)), inventory="/lab/inventory.yml")
    assert state_from_json(state_to_json(state)) == state
    path = tmp_path / "sub" / "state.json"
    save_state(path, state)
    assert load_state(path) == state
    assert list(path.parent.iterdir()) == [path]  # no temporary file left behind


def test_missing_state_is_an_empty_lab(tmp_path: Path) -> None:
    assert load_state(tmp_path / "state.json") == LabState()


@pytest.mark.parametrize("text", ["{", '{"version": 99}', '{"version": 1, "hosts": [{"name": "x"}]}'])
def test_damaged_state_is_a_clear_error(text: str) -> None:
    with pytest.raises(LabError):
        state_from_json(text)


def test_a_live_process_is_ours_only_with_matching_start_time_and_pidfile(tmp_path: Path) -> None:
    pidfile = str(tmp_path / "lab-1.pid")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", pidfile])
    try:
        # Until the child has exec'd, /proc shows the parent's command line (seen on busy cores).
        deadline = time.monotonic() + 30
        while pidfile.encode() not in Path(f"/proc/{child.pid}/cmdline").read_bytes() and time.monotonic() < deadline:
            time.sleep(0.05)
        ticks = process_start_ticks(child.pid)
        assert ticks is not None
        assert is_our_process(record(pid=child.pid, start_ticks=ticks, pidfile=pidfile))
        # Same PID, other start time: a reused PID is not ours, so it is never signalled.
        assert not is_our_process(record(pid=child.pid, start_ticks=ticks + 1, pidfile=pidfile))
        assert not is_our_process(record(pid=child.pid, start_ticks=ticks, pidfile="/other.pid"))
    finally:
        child.kill()
        child.wait()
    assert process_start_ticks(child.pid) is None
    assert not is_our_process(record(pid=child.pid, start_ticks=ticks, pidfile=pidfile))


def test_memory_check() -> None:
    fleet.check_memory(2, 4096, 2 * (4096 + fleet.MEMORY_OVERHEAD_MIB))
    with pytest.raises(LabError, match="not enough memory"):
        fleet.check_memory(3, 4096, 12000)
    assert fleet.mem_available_mib("MemTotal: 100 kB\nMemAvailable:   2097152 kB\n") == 2048


def test_host_names() -> None:
    assert fleet.host_names(3) == ["lab-1", "lab-2", "lab-3"]
    with pytest.raises(Exception, match="--hosts"):
        fleet.host_names(0)


def test_free_port_is_on_loopback_and_bindable() -> None:
    import socket

    port = fleet.free_port()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", port))


def test_lab_dir_defaults_and_overrides() -> None:
    assert default_lab_dir({"HOME": "/home/u"}) == Path("/home/u/.cache/gpuhost/lab")
    assert default_lab_dir({"HOME": "/home/u", "XDG_CACHE_HOME": "/c"}) == Path("/c/gpuhost/lab")
    assert default_lab_dir({"GPUHOST_LAB_DIR": "/x", "HOME": "/home/u"}) == Path("/x")
    paths = LabPaths.resolve(Path("/lab"), environ={})
    assert paths.images == Path("/lab/images") and paths.state_file == Path("/lab/state.json")
    shared = LabPaths.resolve(Path("/lab"), environ={"GPUHOST_LAB_IMAGE_DIR": "/img"})
    assert shared.images == Path("/img") and shared.client_key == Path("/img/keys/lab_ed25519")


def test_ssh_argv_checks_host_keys_and_quotes_remote_words() -> None:
    argv = ssh_argv(port=40001, key=Path("/k"), known_hosts=Path("/kh"), command=["echo", "a b", "$HOME;rm"])
    assert "StrictHostKeyChecking=yes" in argv and "UserKnownHostsFile=/kh" in argv
    assert "BatchMode=yes" in argv
    assert argv[argv.index("-p") + 1] == "40001"
    assert argv[-2:] == ["root@127.0.0.1", "echo 'a b' '$HOME;rm'"]


def test_missing_tool_names_the_debian_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr("shutil.which", lambda *a, **k: None)
    with pytest.raises(ToolMissingError, match="apt-get install qemu-system-x86"):
        require(["qemu-system-x86_64"], "running lab hosts")
    with pytest.raises(ToolMissingError, match="apt-get install debootstrap"):
        require(["debootstrap"], "building the lab image")


def test_image_build_refuses_without_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuhost.lab.builder import ensure_image

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(LabError, match="needs root"):
        ensure_image(LabPaths.resolve(tmp_path, environ={}), "base", mirror="http://m/debian")


def test_up_without_an_image_says_how_to_build_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(fleet, "require", lambda programs, purpose: {p: p for p in programs})
    with pytest.raises(LabError, match="sudo gpuhost lab image"):
        fleet.up(LabPaths.resolve(tmp_path, environ={}), hosts=1)


def test_status_reports_a_crashed_host_with_its_serial_log(tmp_path: Path) -> None:
    paths = LabPaths.resolve(tmp_path, environ={})
    log = tmp_path / "lab-1-serial.log"
    log.write_text("booting\nKernel panic - not syncing: VFS\n")
    save_state(paths.state_file, LabState(hosts=(record(pid=2**22 + 1, serial_log=str(log)),)))
    _, hosts = fleet.status(paths)
    assert [h.running for h in hosts] == [False]
    assert hosts[0].serial_tail[-1] == "Kernel panic - not syncing: VFS"


def test_down_of_a_crashed_host_signals_nothing_and_cleans_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    paths = LabPaths.resolve(tmp_path, environ={})
    overlay = tmp_path / "lab-1.qcow2"
    overlay.write_text("x")
    save_state(paths.state_file, LabState(hosts=(record(pid=os.getpid(), start_ticks=1, overlay=str(overlay)),)))
    killed: list[int] = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: killed.append(pid))
    result = fleet.down(paths)
    assert killed == [] and result.not_running == ("lab-1",) and result.stopped == ()
    assert not overlay.exists() and load_state(paths.state_file) == LabState()


def test_commands_on_a_lab_dir_find_the_keys_of_the_images_it_was_started_from(tmp_path: Path) -> None:
    started = LabPaths(root=tmp_path / "lab", images=tmp_path / "shared-images")
    save_state(started.state_file, LabState(hosts=(record(),), extra={"image_dir": str(started.images)}))
    later = LabPaths.resolve(tmp_path / "lab", environ={})
    assert later.client_key != started.client_key
    assert fleet.with_recorded_images(later).client_key == started.client_key
