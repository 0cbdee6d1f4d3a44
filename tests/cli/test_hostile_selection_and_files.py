"""Issue 28, hostile and broken input round two: the sections of tests/hostile/cases.yml it added,
and its classes whose inputs are real files, FIFOs and devices rather than one line of YAML."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

import tests.cli.test_hostile_corpus as corpus
from gpuhost.facts.snapshot import MemoryTree
from tests.cli.test_hostile_corpus import Listener, assert_clean, cases, listener, run

__all__ = ["listener"]  # the loopback listener fixture, shared with the corpus

pytestmark = pytest.mark.hostile

LIMIT_INVENTORIES = {
    "plain": "[rack1]\ngpu01\ngpu02\n[other]\ngpu03\n",
    "listed": "localhost ansible_connection=local\n[rack1]\ngpu01\ngpu02\n[other]\ngpu03\n",
}


def _ansible_reads_limit(inventory: Path, limit: str) -> dict[str, list[str]]:
    """The hosts of site.yml's plays (`all`; the report play's `localhost`) under `limit`, as
    ansible-playbook reads them: Ansible's own InventoryManager, the limit as given to --limit."""
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader

    manager = InventoryManager(loader=DataLoader(), sources=[str(inventory)])
    manager.subset(limit)
    return {pattern: sorted(h.name for h in manager.get_hosts(pattern=pattern)) for pattern in ("all", "localhost")}


@pytest.mark.parametrize("verb", ["apply", "rollback"])
@pytest.mark.parametrize("case", cases("limits"))
def test_ansible_acts_on_the_selected_hosts_alone(
    case: dict[str, Any], verb: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 28.1: `--limit <yours>,localhost` planned an inventory's own localhost and changed the
    meaning of `a:b`, `a:` and `!a`. The limit handed to ansible-runner is read back by Ansible."""
    inventory = tmp_path / "hosts.ini"
    inventory.write_text(LIMIT_INVENTORIES[case["inventory"]])
    seen: list[dict[str, list[str]]] = []

    def ansible_run(**kwargs: Any) -> SimpleNamespace:
        seen.append(_ansible_reads_limit(inventory, kwargs["limit"]))
        return SimpleNamespace(stats={}, rc=0, status="successful")

    monkeypatch.setattr("ansible_runner.run", ansible_run)
    monkeypatch.setattr("gpuhost.cli.rollback._check_hosts", lambda *args: 0)  # no read-back of real hosts
    extra = ["--report", str(tmp_path / "report.json")] if verb == "apply" else []
    status, out, err = run(capsys, [verb, "-i", str(inventory), "--limit", case["limit"], "--yes", *extra])
    assert_clean(out, err)
    if verb == "apply" and "apply_refused" in case:
        assert status == 2 and case["apply_refused"] in err and seen == [], err
        return
    (hosts,) = seen
    assert hosts["all"] == sorted(case["hosts"]), hosts
    # The report play runs on the controller: apply names localhost for it, rollback has no such play.
    if "localhost" in case["hosts"]:
        assert hosts["localhost"] == ["localhost"]
    else:
        assert hosts["localhost"] == (["localhost"] if verb == "apply" else []), hosts


def test_render_refuses_a_limit_beside_its_host(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 28.1: `render --host X --limit Y` rendered X and dropped --limit without a word."""
    from tests.cli.test_render import INVENTORY, LAB_FRESH

    inventory = tmp_path / "inventory.yml"
    inventory.write_text(INVENTORY)
    argv = ["render", "-i", str(inventory), "--host", "lab-1", "--vm", "nested-proof", "--no-validate"]
    status, out, err = run(capsys, [*argv, "--limit", "gpu99", "--from-snapshot", str(LAB_FRESH)])
    assert_clean(out, err)
    assert status == 2 and "--limit gpu99" in err and out == "", err


def test_a_host_named_like_a_group_cannot_be_named_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A host whose name is also a group's: any pattern naming it selects the group's hosts too."""
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(
        yaml.safe_dump({"all": {"children": {"gpu01": {"hosts": {"gpu02": {}}}}, "hosts": {"gpu01": {}}}})
    )
    status, out, err = run(capsys, ["rollback", "-i", str(inventory), "--limit", "gpu01", "--yes"])
    assert_clean(out, err)
    assert status == 2 and "also name a group" in err, err


@pytest.mark.parametrize("case", cases("arguments_round2"))
def test_hostile_arguments_round_two(
    case: dict[str, Any], tmp_path: Path, listener: Listener, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 28.2 (rollout options) and 28.5/28.6 (output paths): refused before any connection."""
    corpus.test_hostile_arguments(case, tmp_path, listener, capsys)


@pytest.mark.parametrize("output", ["same path", "hard link", "symlink", "json and metrics"])
def test_smoke_test_outputs_never_overwrite_an_input_or_each_other(
    output: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 28.6: `--replay X --json X` overwrote the recording; two outputs on one path lost one."""
    recording = tmp_path / "run.json"
    shutil.copyfile(corpus.RECORDED_RUN, recording)
    if output == "hard link":
        (tmp_path / "hard.json").hardlink_to(recording)
    if output == "symlink":
        (tmp_path / "soft.json").symlink_to(recording)
    extra = {
        "same path": ["--json", str(recording)],
        "hard link": ["--json", str(tmp_path / "hard.json")],
        "symlink": ["--json", str(tmp_path / "soft.json")],
        "json and metrics": ["--json", str(tmp_path / "o.prom"), "--prometheus", str(tmp_path / "o.prom")],
    }[output]
    before = sorted(p.name for p in tmp_path.iterdir())
    status, out, err = run(capsys, ["smoke-test", "--replay", str(recording), *extra])
    assert_clean(out, err)
    assert status == 2 and out == "" and ("--replay" in err or "is also --json" in err), err
    assert recording.read_bytes() == corpus.RECORDED_RUN.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.parametrize("case", [*cases("inventories_round2"), *cases("inventories_round2_gpus")])
def test_hostile_inventory_value_round_two(
    case: dict[str, Any], tmp_path: Path, listener: Listener, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 28.8 (full match) and 28.7 (`vcpus: '²'`): refused by name before any connection."""
    corpus.test_hostile_inventory_value(case, tmp_path, listener, capsys)


# --- 28.7: tracebacks, and output lost without a failing exit ----------------------------------------


def _gpuhost_in_shell(redirections: str, *argv: str) -> subprocess.CompletedProcess[str]:
    """gpuhost as a user runs it, its descriptors set up by a real shell (`> /dev/full`, `>&-`)."""
    command = " ".join(shlex.quote(arg) for arg in [sys.executable, "-m", "gpuhost", *argv])
    return subprocess.run(
        ["sh", "-c", f"exec {command} {redirections}"], capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.parametrize(
    ("redirections", "json_lines", "says"),
    [
        ("> /dev/full", True, "could not write to standard output: No space left on device"),
        ("> /dev/full", False, "could not write to standard output: No space left on device"),
        (">&-", True, "standard output is closed"),
        (">&- 2>&-", False, ""),
    ],
    ids=["json-to-full-disk", "table-to-full-disk", "json-stdout-closed", "both-closed"],
)
def test_output_lost_is_a_failure_not_a_traceback(redirections: str, json_lines: bool, says: str) -> None:
    """`audit --json > /dev/full` ended in an OSError traceback, `audit >&-` in an AttributeError,
    and output lost when Python flushed at exit could still leave exit 0."""
    argv = ["audit", *(["--json"] if json_lines else []), "--from-snapshot", str(corpus.H100)]
    result = _gpuhost_in_shell(redirections, *argv)
    assert "Traceback" not in result.stderr and "Exception ignored" not in result.stderr, result.stderr
    assert result.returncode == 2, result.stderr
    assert says in result.stderr


def test_a_deeply_nested_snapshot_json_is_no_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """snapshot.json only names the host: nested 100000 deep (RecursionError, a traceback) it names
    none, and the capture is named by its path and audited like any other."""
    snapshot = tmp_path / "deep"
    shutil.copytree(corpus.H100, snapshot)
    (snapshot / "snapshot.json").write_text("[" * 100_000 + "]" * 100_000)
    for extra in ([], ["--json"]):
        status, out, err = run(capsys, ["audit", *extra, "--from-snapshot", str(snapshot)])
        assert_clean(out, err)
        assert status == 0 and str(snapshot) in out, out + err


def test_a_recording_that_is_no_regular_file_is_refused_unread(tmp_path: Path) -> None:
    """`smoke-test --replay /dev/zero` read until memory ran out; a FIFO blocked at open for ever."""
    fifo = tmp_path / "recording.fifo"
    os.mkfifo(fifo)
    for path in ("/dev/zero", str(fifo)):
        result = subprocess.run(
            [sys.executable, "-m", "gpuhost", "smoke-test", "--replay", path],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 2 and "is not a regular file" in result.stderr, result.stderr
        assert "Traceback" not in result.stderr


def test_a_recording_larger_than_any_run_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    huge = tmp_path / "huge.json"
    with huge.open("wb") as stream:  # sparse: 65 MiB of NUL bytes that take no disk
        stream.truncate(65 << 20)
    status, out, err = run(capsys, ["smoke-test", "--replay", str(huge)])
    assert_clean(out, err)
    assert status == 2 and "larger than 64 MiB" in err, err


# --- 28.9: one escape on every path to the terminal ----------------------------------------------------


@pytest.mark.parametrize("case", cases("recorded_round2"))
def test_names_from_a_recording_are_escaped(
    case: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus.test_hostile_recorded_file(case, tmp_path, capsys)


def test_argparse_echoes_a_bad_argument_escaped(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        corpus.main(["audit", "--from-snapshot", str(corpus.H100), "--no-such-option=\x1b]0;pwned\x07\x1b[2J"])
    captured = capsys.readouterr()
    assert_clean(captured.out, captured.err)
    assert exit_.value.code == 2 and "\\x1b]0;pwned\\x07" in captured.err, captured.err


def test_apply_verbose_prints_ansibles_output_escaped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`apply -v` handed Ansible's output to the terminal raw: it quotes inventory values and host
    output. A real ansible-playbook run on the controller's local connection, its site.yml a stand-in."""
    playbooks = tmp_path / "playbooks"
    # apply runs gpuhost.passthrough.site by name, from the collections/ beside GPUHOST_PLAYBOOKS.
    stand_in = playbooks / "collections/ansible_collections/gpuhost/passthrough/playbooks"
    stand_in.mkdir(parents=True)
    (playbooks / "site.yml").write_text("- ansible.builtin.import_playbook: gpuhost.passthrough.site\n")
    (stand_in / "site.yml").write_text(
        "- hosts: all\n  gather_facts: false\n  tasks:\n"
        "    - name: Echo the note\n      ansible.builtin.debug:\n        msg: noted\n"
        # A loop item's label is printed as it is, unlike a message (JSON-escaped).
        "      loop: ['{{ gpuhost_note }}']\n"
    )
    monkeypatch.setenv("GPUHOST_PLAYBOOKS", str(playbooks))
    inventory = tmp_path / "inventory.yml"
    note = "rack 7\x1b]0;pwned\x07\x1b[2J\rREADY"
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable, "gpuhost_note": note}
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"localhost": local}}}))
    argv = ["apply", "-i", str(inventory), "--limit", "localhost", "--yes", "-v", "--report", str(tmp_path / "r.json")]
    _, out, err = run(capsys, argv)
    assert_clean(out, err)
    assert "\\x1b]0;pwned\\x07\\x1b[2J\\rREADY" in out, out


@pytest.mark.parametrize("case", cases("recorded_round2_refused"))
def test_a_recording_must_list_the_gpu_it_measured(
    case: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 28.11: refused by name (exit 2), never a PASS without the datasheet comparison."""
    corpus.test_hostile_recorded_file(case, tmp_path, capsys)


# --- 28.10: errors blamed on the right thing (a real sshd, tests/sshd.py) -------------------------------


@pytest.mark.ssh
@pytest.mark.parametrize("hashed", ["|1|not*base64|AAAA", "|1|AAAA|AAAA"], ids=["not-base64", "short-salt"])
def test_a_hashed_known_hosts_name_with_a_bad_salt_blames_known_hosts(
    hashed: str, tmp_path: Path, sshd_server: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """The salt is decoded when the host's key is looked up, mid-handshake: not base64, its ValueError
    read as an unusable private key; 3 bytes, paramiko's assert was a traceback."""
    known_hosts = tmp_path / "known_hosts"
    real = sshd_server.write_known_hosts(tmp_path / "real").read_text()
    known_hosts.write_text(f"{hashed} {' '.join(real.split()[1:])}\n")
    argv = ["audit", "--json", "--known-hosts", str(known_hosts), "--private-key", str(sshd_server.client_key)]
    status, out, err = run(capsys, [*argv, sshd_server.target])
    assert_clean(out, err)
    (result,) = (json.loads(line) for line in out.splitlines())
    assert status == 2 and result["error_kind"] == "input", result
    assert str(known_hosts) in result["error"] and hashed in result["error"], result
    assert "private key" not in result["error"]


@pytest.mark.ssh
def test_a_known_hosts_file_that_cannot_be_written_is_not_the_hosts_fault(
    tmp_path: Path, sshd_server: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """--accept-new-host-keys with a known_hosts under a regular file: 'unreachable: File exists'."""
    (tmp_path / "a-file").write_text("")
    known_hosts = tmp_path / "a-file" / "known_hosts"
    argv = ["audit", "--json", "--accept-new-host-keys", "--known-hosts", str(known_hosts)]
    status, out, err = run(capsys, [*argv, "--private-key", str(sshd_server.client_key), sshd_server.target])
    assert_clean(out, err)
    (result,) = (json.loads(line) for line in out.splitlines())
    assert status == 2 and result["error_kind"] == "input", result
    assert f"cannot record its new host key in {known_hosts}" in result["error"], result


# Issue 28 item 4: a selected GPU's binding is never an unknown that leaves a host READY. The real
# capture of the numa-gpus lab host with its cards on vfio-pci (READY with the stand-in GPU selected);
# its GPU's recorded driver link replaced by what a damaged or hand-edited snapshot can hold.
VFIO_BOUND = corpus.SNAPSHOTS / "lab-numa-gpus-vfio"
VFIO_BOUND_GPU = "0000:81:00.0"


def _damage_driver_link(link: Path, how: str) -> None:
    link.unlink()
    if how == "empty":
        link.write_text("")
    elif how == "directory":
        link.mkdir()
    elif how == "fifo":
        os.mkfifo(link)
    elif how == "escape":
        link.write_text("../../../../bus/pci/drivers/\x1b]0;vfio-pci\x07\n")
    else:
        raise AssertionError(how)


def _audit_selected_gpu(snapshot: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any], str]:
    status, out, err = run(capsys, ["audit", "--json", "--gpus", "1234:1111", "--from-snapshot", str(snapshot)])
    assert_clean(out, err)
    return status, json.loads(out.splitlines()[0]), err


def test_the_real_capture_is_ready_with_its_gpu_on_vfio_pci(capsys: pytest.CaptureFixture[str]) -> None:
    status, report, _ = _audit_selected_gpu(VFIO_BOUND, capsys)
    assert status == 0 and report["ready"] is True, report["findings"]


@pytest.mark.parametrize("how", ["empty", "directory", "fifo", "escape"])
def test_an_unreadable_driver_link_of_a_selected_gpu_is_never_ready(
    how: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    snapshot = tmp_path / "snapshot"
    shutil.copytree(VFIO_BOUND, snapshot, symlinks=True)
    _damage_driver_link(snapshot / f"sys/bus/pci/devices/{VFIO_BOUND_GPU}/driver", how)
    status, report, _ = _audit_selected_gpu(snapshot, capsys)
    assert report["ready"] is False and status != 0, report
    unknown = [f for f in report["findings"] if f["code"] == "gpu.driver.unknown"]
    assert [(f["severity"], f["subject"]) for f in unknown] == [("error", VFIO_BOUND_GPU)], report["findings"]
    assert "driver unknown" in unknown[0]["message"] and "Audit the host again" in unknown[0]["remedy"]
    # Never read as "no driver bound" (a warning) beside it.
    assert not [f for f in report["findings"] if f["code"] == "gpu.driver" and f["subject"] == VFIO_BOUND_GPU]


def test_a_live_hosts_tree_tells_an_absent_link_from_an_empty_record() -> None:
    """The live audit reads the gather's archive in memory: the same distinction as a snapshot on disk."""
    base = f"/sys/bus/pci/devices/{VFIO_BOUND_GPU}"
    tree = MemoryTree({f"{base}/driver": b"", f"{base}/vendor": b"0x1234\n"}, {f"{base}/iommu_group"})
    assert tree.has_entry(f"{base}/driver") and tree.has_entry(f"{base}/iommu_group")
    assert tree.link(f"{base}/driver") is None  # an empty record: present, naming nothing
    assert not tree.has_entry(f"{base}/reset_method") and not tree.has_entry("/sys/bus/pci/devices/0000:99:00.0")


@pytest.mark.parametrize(
    ("name", "text", "cause"),
    [
        ("hosts.yml", 'all:\n  hosts:\n    "gpu\x1b[31m":\n      ansible_host: 127.0.0.1\n', "unacceptable character"),
        ("hosts.yml", 'all:\n  hosts:\n    "gpu[a]":\n      ansible_host: 127.0.0.1\n', "host range must be"),
        ("hosts.ini", "[gpus]\ngpu\x1b[31m ansible_host=127.0.0.1\n", "Ansible cannot read it as INI"),
    ],
    ids=["yaml-escape", "yaml-bad-range", "ini-escape"],
)
def test_a_host_name_ansible_rejects_names_the_cause_not_no_inventory_parsed(
    name: str, text: str, cause: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inventory = tmp_path / name
    inventory.write_text(text)
    status, out, err = run(capsys, ["audit", "-i", str(inventory)])
    assert_clean(out, err)
    assert status == 2 and f"inventory {inventory}: Ansible cannot read it as" in err and cause in err, err
    assert "No inventory was parsed" not in err and "[WARNING]" not in err, err
