"""Issue 13: the hostile and broken input corpus (tests/hostile/cases.yml), walked case by case.

Every case runs a verb through the CLI and checks what a user would see: the documented exit code,
no traceback, a message that names the bad thing, no raw control character on the terminal, and
nothing sent (a loopback listener that must see no connection) or written where it should not be.
"""

from __future__ import annotations

import json
import shutil
import socket
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuhost.cli.main import main
from gpuhost.errors import InputError
from gpuhost.output import write_output
from gpuhost.targets import validate_host
from gpuhost.transport import TransportError
from gpuhost.transport.ssh import MAX_STDOUT_BYTES, _drain
from tests.cli.test_render import INVENTORY as RENDER_INVENTORY
from tests.cli.test_render import LAB_FRESH
from tests.helpers import FIXTURES, SNAPSHOTS
from tests.test_audit_cases import derive_snapshot, load_case

pytestmark = pytest.mark.hostile  # issue 13's corpus: pytest -m hostile

CORPUS = yaml.safe_load((Path(__file__).parents[1] / "hostile/cases.yml").read_text(encoding="utf-8"))
H100 = SNAPSHOTS / "h100-guest"


def cases(section: str) -> list[Any]:
    return [pytest.param(case, id=case["name"]) for case in CORPUS[section]]


def run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    status = main(argv)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def assert_clean(out: str, err: str) -> None:
    """What reaches the terminal: no traceback, no escape sequence or other control character."""
    assert "Traceback" not in out + err
    raw_controls = [c for c in out + err if not c.isprintable() and c not in "\n\t"]
    assert not raw_controls, f"raw control characters reached the terminal: {raw_controls!r}"


class Listener:
    """A TCP port on loopback that counts connections (and may answer like a broken server)."""

    def __init__(self, reply: bytes = b"", then: str = "close") -> None:
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(16)
        self.server.settimeout(0.2)
        self.port = self.server.getsockname()[1]
        self.connections = 0
        self.reply, self.then = reply, then
        self._held: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                connection, _ = self.server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            if self.reply:
                connection.sendall(self.reply)
            if self.then == "hang":
                self._held.append(connection)
            else:
                connection.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        for connection in self._held:
            connection.close()
        self.server.close()


@pytest.fixture
def listener() -> Iterator[Listener]:
    server = Listener()
    yield server
    server.close()


# --- snapshots: odd sysfs text, terminal injection, markup and emoji -------------------------------------


def hostile_snapshot(case: dict[str, Any], tmp_path: Path) -> Path:
    copy = tmp_path / case["name"]
    shutil.copytree(SNAPSHOTS / case["base"], copy)
    for relative, text in case.get("write", {}).items():
        data = text.encode("latin-1") if case.get("binary") else text.encode("utf-8")
        (copy / relative).write_bytes(data)
    for source, destination in case.get("rename", {}).items():
        (copy / source).rename(copy / destination)
    if "meta_host" in case:
        meta = json.loads((copy / "snapshot.json").read_text())
        meta["host"] = case["meta_host"]
        (copy / "snapshot.json").write_text(json.dumps(meta))
    return copy


@pytest.mark.parametrize("case", cases("snapshots"))
def test_hostile_snapshot(case: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    snapshot = hostile_snapshot(case, tmp_path)
    status, out, err = run(capsys, ["audit", "-v", "--from-snapshot", str(snapshot)])
    assert_clean(out, err)
    assert status == case["exit"], out + err
    assert case["shows"] in out, out
    # As JSON, beside a healthy host: both objects, the exit status of the worst.
    status, out, err = run(capsys, ["audit", "--json", "--from-snapshot", str(snapshot), "--from-snapshot", str(H100)])
    assert "Traceback" not in err
    hosts = [json.loads(line) for line in out.splitlines()]
    assert len(hosts) == 2 and hosts[1]["ready"] is True
    if "meta_host" in case:
        assert hosts[0]["host"] == case["meta_host"]  # JSON keeps the value exact; escaping is the terminal's


@pytest.mark.parametrize("listing", ["empty", "missing"])
def test_a_gpu_whose_group_listing_is_unknown_is_never_ready(
    listing: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Class 2: the GPU's functions on the host nvidia driver and its IOMMU group's devices/ listing
    # empty (or missing): once READY, exit 0, with empty driver and function columns.
    case = load_case(FIXTURES / "audit-cases" / "lab-group-listing-empty-nvidia-bound")
    if listing == "missing":
        case["remove"] = ["sys/kernel/iommu_groups/6/devices"]
    snapshot = str(derive_snapshot(case, tmp_path))
    policy = ["--gpus", "1234:1111", "--role", "host"]
    status, out, err = run(capsys, ["audit", *policy, "--from-snapshot", snapshot])
    assert_clean(out, err)
    assert status == 1, out + err
    assert out.startswith("lab-1: NOT READY — passthrough host, 1 GPU [1234:1111] on no PCIe link, driver nvidia,")
    (row,) = [line for line in out.splitlines() if line.startswith("0000:01:00.0")]
    assert row.split()[:10] == ["0000:01:00.0", "1234:1111", "yes", "6", "00.0", "00.1", "nvidia", "no", "PCIe", "link"]
    assert row.rstrip().endswith("not ready")
    status, out, err = run(capsys, ["audit", "--json", *policy, "--from-snapshot", snapshot])
    (host,) = [json.loads(line) for line in out.splitlines()]
    assert status == 1 and host["ready"] is False
    (gpu,) = [g for g in host["gpus"] if g["selected"]]
    assert [(f["address"], f["driver"]) for f in gpu["functions"]] == [
        ("0000:01:00.0", "nvidia"),
        ("0000:01:00.1", "nvidia"),
    ]
    assert gpu["group_members"] == ["0000:01:00.0"]  # the group's other members are unknown


def test_a_bus_named_like_an_emoji_code_stays_an_address(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (case,) = [c for c in CORPUS["snapshots"] if c["name"] == "bus-ab-not-emoji"]
    status, out, _ = run(capsys, ["audit", "--from-snapshot", str(hostile_snapshot(case, tmp_path))])
    assert status == 0 and "0000:ab:00.0" in out and "\U0001f18e" not in out


# --- inventories: values refused before any connection -------------------------------------------------


def write_inventory(case: dict[str, Any], tmp_path: Path, port: int) -> Path:
    name = case.get("name_override", "gpu01")
    lines = [
        "all:",
        "  hosts:",
        f"    {json.dumps(name)}:",
        "      ansible_host: 127.0.0.1",
        f"      ansible_port: {port}",
    ]
    variables = {key: str(tmp_path) if value == "TMP" else value for key, value in case.get("vars", {}).items()}
    lines += [f"      {key}: {json.dumps(value)}" for key, value in variables.items()]
    if "vars_yaml" in case:
        lines.append(f"      {case['vars_yaml']}")
    text = "\n".join(lines) + "\n"
    # The later key wins in YAML (with a warning); drop a default line when the case sets its own.
    own = "".join(lines[5:])
    for default in ("      ansible_host: 127.0.0.1\n", f"      ansible_port: {port}\n"):
        if default.split(":")[0].strip() + ":" in own:
            text = text.replace(default, "", 1)
    path = tmp_path / "inventory.yml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("case", cases("inventories"))
def test_hostile_inventory_value(
    case: dict[str, Any], tmp_path: Path, listener: Listener, capsys: pytest.CaptureFixture[str]
) -> None:
    inventory = write_inventory(case, tmp_path, listener.port)
    status, out, err = run(capsys, ["audit", "--json", "--connect-timeout", "2", "-i", str(inventory)])
    assert_clean(out, err)
    assert status == 2, out + err
    assert case["says"] in err, err
    assert out == ""
    time.sleep(0.3)  # the listener's accept loop polls every 0.2 s
    assert listener.connections == 0, "a refused value must not reach the network"


# --- command lines --------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", cases("arguments"))
def test_hostile_arguments(
    case: dict[str, Any], tmp_path: Path, listener: Listener, capsys: pytest.CaptureFixture[str]
) -> None:
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(
        f"all:\n  hosts:\n    gpu01:\n      ansible_host: 127.0.0.1\n      ansible_port: {listener.port}\n"
    )
    substitutions = {"SNAP": str(H100), "TMP": str(tmp_path), "INV": str(inventory), "PORT": str(listener.port)}
    argv = [substitutions.get(arg, arg) for arg in case["argv"]]
    argv = [arg.replace("PORT", str(listener.port)).replace("TMP", str(tmp_path)) for arg in argv]
    before = sorted(p.name for p in tmp_path.iterdir())
    try:
        status, out, err = run(capsys, argv)
    except SystemExit as exit_:  # argparse refuses a type error with exit 2 and usage on stderr
        captured = capsys.readouterr()
        status, out, err = int(exit_.code or 0), captured.out, captured.err
    assert_clean(out, err)
    assert status == case["exit"], out + err
    assert case["says"] in err, err
    time.sleep(0.3)
    assert listener.connections == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == before, "nothing may be written"


# --- output paths: one writer, whole or not at all ------------------------------------------------------


@pytest.mark.parametrize("case", cases("outputs"))
def test_render_output_path(case: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "file").write_text("a file, not a directory\n")
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(RENDER_INVENTORY)
    applied = tmp_path / "applied"
    shutil.copytree(LAB_FRESH, applied)
    for function in ("0000:01:00.0", "0000:01:00.1"):
        (applied / f"sys/bus/pci/devices/{function}/driver").write_text("../../../../bus/pci/drivers/vfio-pci\n")
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    path = case["path"].replace("TMP", str(tmp_path))
    argv = ["render", "-i", str(inventory), "--host", "lab-1", "--vm", "nested-proof", "--no-validate"]
    status, out, err = run(capsys, [*argv, "--from-snapshot", str(applied), "-o", path])
    assert_clean(out, err)
    assert status == 2 and case["says"] in err and path in err, err
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before, "no temporary file may stay behind"


def test_render_output_is_written_whole(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "domain.xml"
    target.write_text("old")
    write_output(target, "<domain/>\n", "-o")
    assert target.read_text() == "<domain/>\n" and [p.name for p in tmp_path.iterdir()] == ["domain.xml"]
    with pytest.raises(InputError, match="is not a regular file"):
        write_output(Path("/dev/null"), "x", "-o")


# --- servers that are not well-behaved SSH servers ------------------------------------------------------


@pytest.mark.parametrize("case", cases("servers"))
def test_broken_server_is_that_hosts_error(
    case: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server = Listener(case["reply"].encode("latin-1"), case["then"])
    try:
        host = f"root@127.0.0.1:{server.port}"
        known_hosts = tmp_path / "known_hosts"
        argv = ["audit", "--json", "--connect-timeout", "1", "--known-hosts", str(known_hosts), host]
        status, out, err = run(capsys, [*argv, "--from-snapshot", str(H100)])
    finally:
        server.close()
    assert_clean(out, err)
    assert err == "", "paramiko's own logging must not print on stderr"
    assert status == 2
    broken, healthy = (json.loads(line) for line in out.splitlines())
    assert broken["host"] == host and broken["error_kind"] == case["kind"], broken
    assert f"127.0.0.1:{server.port}" in broken["error"]
    assert healthy["ready"] is True
    assert not known_hosts.exists(), "no key may be recorded from a broken server"


def test_malformed_known_hosts_line_is_that_hosts_error(
    tmp_path: Path, listener: Listener, capsys: pytest.CaptureFixture[str]
) -> None:
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text("127.0.0.1 ssh-ed25519 AAAA!!!not-base64!!!\n")
    host = f"root@127.0.0.1:{listener.port}"
    status, out, err = run(capsys, ["audit", "--json", "--known-hosts", str(known_hosts), host])
    assert_clean(out, err)
    (result,) = (json.loads(line) for line in out.splitlines())
    assert status == 2 and result["error_kind"] == "input"
    assert str(known_hosts) in result["error"] and "malformed line" in result["error"]
    assert listener.connections == 0


@pytest.mark.ssh
def test_a_server_dropping_the_connection_mid_command_is_that_hosts_error(
    tmp_path: Path,
    sshd_server: Any,
    sshd_known_hosts: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Class 3: the connection dropped mid-transfer (EOFError, a traceback and no JSON for anyone).
    # A real sshd; the script the gather sends kills its own sshd session process after 1 MB.
    monkeypatch.setattr("gpuhost.facts.gather.gather_script", lambda: b"head -c 1000000 /dev/zero; kill -9 $PPID\n")
    argv = ["audit", "--json", "--known-hosts", str(sshd_known_hosts), "--private-key", str(sshd_server.client_key)]
    status, out, err = run(capsys, [*argv, sshd_server.target, "--from-snapshot", str(H100)])
    assert_clean(out, err)
    broken, healthy = (json.loads(line) for line in out.splitlines())
    assert status == 2 and broken["reachable"] is False, broken
    assert broken["host"] == sshd_server.target, broken
    # Which side sees the drop first is a race: the stream ends without an exit status, or paramiko
    # raises EOFError (whose message is empty: the error once ended in a bare colon).
    assert (broken["error_kind"], broken["error"].split(": ", 1)[1]) in {
        (
            "command",
            "the read-only gather script failed (exit -1: it ended without an exit status, the connection "
            "closed or a signal killed it)",
        ),
        ("unreachable", "the connection broke while running sh: EOFError, the server closed it"),
    }, broken
    assert healthy["ready"] is True


def test_garbage_private_key_is_that_hosts_error(
    tmp_path: Path, sshd_server: Any, sshd_known_hosts: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key = tmp_path / "id_garbage"
    key.write_bytes(b"-----BEGIN OPENSSH PRIVATE KEY-----\n\xff\xfe\x00garbage\n-----END OPENSSH PRIVATE KEY-----\n")
    argv = ["audit", "--json", "--known-hosts", str(sshd_known_hosts), "--private-key", str(key), sshd_server.target]
    status, out, err = run(capsys, [*argv, "--from-snapshot", str(H100)])
    assert_clean(out, err)
    broken, healthy = (json.loads(line) for line in out.splitlines())
    assert status == 2 and broken["error_kind"] == "auth" and str(key) in broken["error"], broken
    assert healthy["ready"] is True


# --- a host that streams without end --------------------------------------------------------------------


class EndlessChannel:
    """A paramiko channel whose command never stops writing to stdout."""

    def __init__(self) -> None:
        self.sent = 0

    def settimeout(self, _: float) -> None:
        pass

    def recv(self, size: int) -> bytes:
        self.sent += size
        return b"\0" * size

    def recv_stderr(self, _: int) -> bytes:
        return b""


def test_output_is_bounded_while_reading() -> None:
    channel = EndlessChannel()
    with pytest.raises(TransportError, match="more than 64 MiB") as error:
        _drain(channel, 60.0, "ssh://root@gpu01:22")  # type: ignore[arg-type]
    assert error.value.kind == "command"
    assert channel.sent <= MAX_STDOUT_BYTES + (1 << 16), "reading stops at the cap, not at the end"


@pytest.mark.ssh
def test_a_real_host_streaming_a_gibibyte_costs_the_cap_not_the_stream(sshd_server: Any, tmp_path: Path) -> None:
    # Class 5 over real SSH (tests/sshd.py): 1 GiB on stdout took the controller to 1.09 GB before the
    # bound; now reading stops at the cap. Python's allocations are traced: the peak stays near the
    # 64 MiB kept (a bytearray doubles as it grows), far from the 1 GiB sent.
    from gpuhost.transport.ssh import MAX_STDERR_BYTES, SshOptions, SshTransport

    options = SshOptions(
        host="127.0.0.1",
        port=sshd_server.port,
        key_file=sshd_server.client_key,
        known_hosts_file=sshd_server.write_known_hosts(tmp_path / "known_hosts"),
    )
    transport = SshTransport(options)
    try:
        tracemalloc.start()
        with pytest.raises(TransportError, match="more than 64 MiB") as error:
            transport.run(["head", "-c", str(1 << 30), "/dev/zero"], timeout=120.0)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert error.value.kind == "command"
        assert peak < 3 * MAX_STDOUT_BYTES, f"peak {peak / 2**20:.0f} MiB"
        # stderr keeps its first MiB and is drained to the end, so the command still finishes.
        flood = transport.run(["sh", "-c", "head -c 16777216 /dev/zero >&2; echo done"], timeout=120.0)
        assert flood.stdout == b"done\n" and MAX_STDERR_BYTES <= len(flood.stderr) <= MAX_STDERR_BYTES + (1 << 16)
    finally:
        tracemalloc.stop()
        transport.close()


# --- recorded smoke-test files: NaN, nonsense and broken JSON (class 6) ------------------------------------

RECORDED_RUN = FIXTURES / "h100-smoke" / "issue14" / "run4-2026-11-25" / "runs" / "full-1.json"
GPU_TABLE = Path(__file__).resolve().parents[2] / "gpuhost" / "data" / "gpu_models.json"


def _set(document: Any, dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    for key in parents:
        document = document[int(key)] if isinstance(document, list) else document[key]
    if isinstance(document, list):
        document[int(last)] = value
    else:
        document[last] = value


def recorded_file(case: dict[str, Any], tmp_path: Path) -> Path:
    path = tmp_path / f"{case['name']}.json"
    if "raw" in case:
        path.write_bytes(case["raw"].encode("latin-1"))
        return path
    if "nest" in case:
        path.write_text("[" * case["nest"] + "]" * case["nest"])
        return path
    document = json.loads((GPU_TABLE if case["as"] == "gpu-table" else RECORDED_RUN).read_text())
    for result in document["suite"]["results"] if "each_result" in case else ():
        result.update(case["each_result"])
    for dotted, value in case.get("set", {}).items():
        _set(document, dotted, value)
    text = json.dumps(document)  # Python writes NaN and Infinity as such, like a careless tool
    if "replace" in case:
        old, new = case["replace"]
        text = text.replace(old, new, 1)
    path.write_text(text)
    return path


@pytest.mark.parametrize("case", cases("recorded"))
def test_hostile_recorded_file(case: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    edited = str(recorded_file(case, tmp_path))
    argv = {
        "replay": ["--replay", edited],
        "baseline": ["--replay", str(RECORDED_RUN), "--baseline", edited],
        "gpu-table": ["--replay", str(RECORDED_RUN), "--gpu-table", edited],
    }[case["as"]]
    status, out, err = run(capsys, ["smoke-test", *argv])
    assert_clean(out, err)
    assert status == case.get("exit", 2), out + err
    if "says" in case:
        assert case["says"] in err and out == "", err
    else:
        assert case["shows"] in out, out


# --- verbs outside the audit: one host, no fleet barrier, still no traceback ---------------------------


def test_guest_logs_of_an_unreachable_host_is_an_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    server = Listener(b"", "close")  # accepts and hangs up: the SSH handshake fails
    try:
        inventory = tmp_path / "inventory.yml"
        inventory.write_text(RENDER_INVENTORY.replace("ansible_port: 2201", f"ansible_port: {server.port}"))
        argv = ["guest", "logs", "-i", str(inventory), "--host", "lab-1", "--vm", "nested-proof", "--serial"]
        status, out, err = run(capsys, [*argv, "--known-hosts", str(tmp_path / "known_hosts")])
    finally:
        server.close()
    assert_clean(out, err)
    assert status == 2 and f"127.0.0.1:{server.port}" in err, err


@pytest.mark.parametrize(
    "content", [b"\xff\xfe\x00\x01binary", b"{not json", b'{"version": 1, "hosts": [{"name": 1}]}', b"[]"]
)
def test_damaged_lab_state_is_named(
    content: bytes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GPUHOST_LAB_DIR", str(tmp_path))
    (tmp_path / "state.json").write_bytes(content)
    status, out, err = run(capsys, ["lab", "status"])
    assert_clean(out, err)
    assert status == 2 and "lab state file" in err and "remove it" in err, err
    assert (tmp_path / "state.json").read_bytes() == content, "a damaged state file is left for the operator"


def test_a_huge_bad_value_is_shortened_in_the_message(
    tmp_path: Path, listener: Listener, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 13 class 13: a multi-megabyte value is named, not repeated whole; the fix still shows."""
    huge = "x" * 3_000_000
    inventory = write_inventory({"name": "huge", "vars": {"gpuhost_reserved_cpus": huge}}, tmp_path, listener.port)
    status, out, err = run(capsys, ["audit", "--json", "-i", str(inventory)])
    assert_clean(out, err)
    assert status == 2 and "gpuhost_reserved_cpus" in err and "characters left out" in err
    assert len(err) < 5000 and err.rstrip().endswith(("'.", "'"))


@pytest.mark.parametrize(
    "spelling", ["fe80::1%eth0", "FE80::1%eth0", "fe80:0000:0000:0000:0000:0000:0000:0001%eth0", "[fe80::1%enp65s0f1]"]
)
def test_a_link_local_address_may_name_its_zone(spelling: str) -> None:
    """ipaddress' `exploded` of a scoped address raised AddressValueError: a traceback for any
    inventory with `ansible_host: fe80::1%eth0`. Its zone is an interface name, as ssh takes it."""
    assert validate_host(spelling, "inventory host gpu01") == spelling.strip("[]")
