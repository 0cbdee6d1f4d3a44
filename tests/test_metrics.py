"""`--prometheus FILE` of audit, apply and smoke-test: the files parsed back with prometheus_client's
own parser, from real inputs (snapshots, the engine's report of real Ansible text, recorded H100
and H200 runs), and scraped through a real node_exporter's textfile collector.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuhost.cli.main import main
from gpuhost.metrics import SMOKE_UNITS
from gpuhost.rollout.report import HostStatus
from tests.cli.test_smoke_test import FIXTURES as SMOKE
from tests.cli.test_smoke_test import REPO, h100_bandwidth_doubled, run_cli
from tests.helpers import SNAPSHOTS
from tests.rollout.test_engine import CONFIGURE_PLAY, _recorder, _unreachable
from tests.rollout.test_engine import inventory as inventory  # a fixture, used by name
from tests.sshd import free_port, is_listening

H100 = SNAPSHOTS / "h100-guest"
DEV_VM = SNAPSHOTS / "dev-vm"
NODE_EXPORTER = Path("/usr/bin/prometheus-node-exporter")  # Debian's prometheus-node-exporter (.ci/setup)
# The reboot task of the collection's roles/gpuhost_verify/tasks/main.yml, as its events name it.
REBOOT_TASK = "Reboot into the new kernel command line (only when /proc/cmdline differs from the plan)"

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(text: str) -> Samples:
    """Every sample of an exposition, by name and sorted labels (a series appearing twice fails)."""
    found: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            assert key not in found, f"series {key} twice"
            found[key] = sample.value
    return found


def value(found: Samples, name: str, **labels: str) -> float:
    return found[(name, tuple(sorted(labels.items())))]


def series(found: Samples, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {labels: number for (metric, labels), number in found.items() if metric == name}


# --- audit ---------------------------------------------------------------------------------------------


def test_audit_of_real_snapshots_and_an_unreachable_host(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    closed = free_port()
    assert not is_listening(closed)
    dead = f"root@127.0.0.1:{closed}"
    metrics = tmp_path / "audit.prom"
    before = time.time()
    status = main(
        [
            "audit",
            "--json",
            "--from-snapshot",
            str(H100),
            "--from-snapshot",
            str(DEV_VM),
            dead,
            "--prometheus",
            str(metrics),
        ]
    )
    after = time.time()
    hosts = {line["host"]: line for line in map(json.loads, capsys.readouterr().out.splitlines())}
    assert status == 2  # the unreachable host, as without --prometheus
    found = samples(metrics.read_text())

    assert series(found, "gpuhost_audit_up") == {
        (("host", "h100-passthrough-guest"),): 1,
        (("host", "vm"),): 1,
        (("host", dead),): 0,
    }
    assert series(found, "gpuhost_audit_ready") == {
        (("host", "h100-passthrough-guest"),): 1,
        (("host", "vm"),): 0,  # the dev VM has no IOMMU and no GPU
        (("host", dead),): 0,
    }
    assert value(found, "gpuhost_audit_problems", host="vm", code="gpu.none", severity="error") == 1
    # Every finding of the JSON report is counted under its code and severity, and nothing else is.
    for name, host in hosts.items():
        counts: dict[tuple[tuple[str, str], ...], float] = {}
        for finding in host["findings"]:
            key = (("code", finding["code"]), ("host", name), ("severity", finding["severity"]))
            counts[key] = counts.get(key, 0) + 1
        mine = {k: v for k, v in series(found, "gpuhost_audit_problems").items() if ("host", name) in k}
        assert mine == counts, name
    assert not [k for k in series(found, "gpuhost_audit_problems") if ("host", dead) in k]
    for name in hosts:
        assert before <= value(found, "gpuhost_audit_timestamp_seconds", host=name) <= after
        assert 0 < value(found, "gpuhost_audit_duration_seconds", host=name) < after - before
    assert series(found, "gpuhost_info") == {(("verb", "audit"), ("version", "0.1.0")): 1}


def test_a_hostile_host_name_stays_one_label_value(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The snapshot's host name is the host's own text: quotes, backslashes and a newline in it must
    neither break the file nor forge a series (here: a ready=1 line for another host)."""
    snapshot = tmp_path / "snapshot"
    shutil.copytree(H100, snapshot)
    hostile = 'evil"} 1\ngpuhost_audit_ready{host="forged\\'
    meta = json.loads((snapshot / "snapshot.json").read_text())
    (snapshot / "snapshot.json").write_text(json.dumps({**meta, "host": hostile}))
    metrics = tmp_path / "audit.prom"
    assert main(["audit", "--json", "--from-snapshot", str(snapshot), "--prometheus", str(metrics)]) == 0
    capsys.readouterr()
    found = samples(metrics.read_text())
    assert series(found, "gpuhost_audit_ready") == {(("host", hostile),): 1}
    assert value(found, "gpuhost_audit_problems", host=hostile, code="guest", severity="info") == 1
    assert all(dict(labels).get("host") != "forged\\" for (_, labels) in found)


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("TMP/audit.txt", "reads only files named *.prom; name it e.g. TMP/gpuhost.prom"),
        ("TMP/missing/audit.prom", "the directory TMP/missing does not exist"),
        ("TMP", "reads only files named *.prom"),
        ("TMP/dir.prom", "is a directory"),
    ],
)
def test_a_bad_path_is_refused_before_the_audit(
    path: str, says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "dir.prom").mkdir()
    path, says = path.replace("TMP", str(tmp_path)), says.replace("TMP", str(tmp_path))
    assert main(["audit", "--json", "--from-snapshot", str(H100), "--prometheus", path]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # refused before any host was audited
    assert captured.err.startswith(f"gpuhost audit: error: --prometheus {path}: ") and says in captured.err


# --- apply ---------------------------------------------------------------------------------------------


def test_apply_metrics_from_the_engines_report(
    inventory: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    rebooted = {
        "event": "runner_on_ok",
        "event_data": {"host": "gpu02", "task": REBOOT_TASK, "play": CONFIGURE_PLAY, "res": {"rebooted": True}},
    }
    stats = {"dark": {"gpu01": 1}, "ok": {"gpu02": 3}}
    run, _ = _recorder([_unreachable("gpu01"), rebooted], stats, rc=4)
    monkeypatch.setattr("ansible_runner.run", run)
    report, metrics = tmp_path / "report.json", tmp_path / "apply.prom"
    before = time.time()
    code = main(["apply", "-i", str(inventory), "--yes", "--report", str(report), "--prometheus", str(metrics)])
    after = time.time()
    capsys.readouterr()
    assert code == 2
    hosts = json.loads(report.read_text())["hosts"]
    found = samples(metrics.read_text())
    for host in ("gpu01", "gpu02"):
        states = {dict(k)["status"]: v for k, v in series(found, "gpuhost_apply_status").items() if ("host", host) in k}
        assert states == {status.value: float(status.value == hosts[host]["status"]) for status in HostStatus}
    assert value(found, "gpuhost_apply_status", host="gpu01", status="unreachable") == 1
    assert value(found, "gpuhost_apply_status", host="gpu02", status="not-reported") == 1
    assert series(found, "gpuhost_apply_rebooted") == {(("host", "gpu01"),): 0, (("host", "gpu02"),): 1}
    assert value(found, "gpuhost_apply_check_mode") == 0
    assert 0 <= value(found, "gpuhost_apply_duration_seconds") <= after - before
    assert before <= value(found, "gpuhost_apply_timestamp_seconds") <= after
    assert series(found, "gpuhost_info") == {(("verb", "apply"), ("version", "0.1.0")): 1}


def test_a_canceled_apply_keeps_the_previous_metrics_and_a_bad_path_runs_nothing(
    inventory: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    calls: list[dict[str, Any]] = []

    def canceled(**kwargs: Any) -> Any:
        calls.append(kwargs)
        return type("Runner", (), {"stats": {}, "rc": -1, "status": "canceled"})()

    monkeypatch.setattr("ansible_runner.run", canceled)
    metrics = tmp_path / "apply.prom"
    metrics.write_text("# the last run's metrics\n")
    argv = ["apply", "-i", str(inventory), "--yes", "--report", str(tmp_path / "r.json")]
    assert main([*argv, "--prometheus", str(metrics)]) == 130
    assert metrics.read_text() == "# the last run's metrics\n" and len(calls) == 1
    assert main([*argv, "--prometheus", str(tmp_path / "apply.metrics")]) == 2
    assert "reads only files named *.prom" in capsys.readouterr().err
    assert len(calls) == 1, "a bad --prometheus path must stop apply before Ansible runs"


# --- smoke-test ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("recorded", "code", "verdict", "representative"),
    [
        ("smoke-quick.json", 0, "PASS", 1),
        ("h200x2-smoke-full.json", 0, "PASS", 1),
        ("issue14/run2/busy-quick.json", 2, "WARN", 0),  # another process used the GPU
    ],
)
def test_smoke_test_metrics_are_the_verdict(
    recorded: str,
    code: int,
    verdict: str,
    representative: int,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    document, metrics = tmp_path / "out.json", tmp_path / "smoke.prom"
    before = time.time()
    argv = ["smoke-test", "--replay", str(SMOKE / recorded), "--json", str(document), "--prometheus", str(metrics)]
    assert main(argv) == code
    after = time.time()
    assert f"metrics written to {metrics}" in capsys.readouterr().out
    judged = json.loads(document.read_text())
    found = samples(metrics.read_text())
    gpu = {"gpu": "0000:00:06.0", "index": "0", "model": judged["suite"]["device"]["name"]}
    assert gpu["model"] in ("NVIDIA H100 80GB HBM3", "NVIDIA H200")
    for entry in judged["metrics"]:
        labels = {**gpu, "metric": entry["metric"]}
        family = SMOKE_UNITS[entry["unit"]]
        if entry["judged_value"] is not None:
            assert value(found, family.name, **labels) == pytest.approx(entry["judged_value"] * family.scale)
        ratio = entry["percent_of_reference"]
        assert found.get(("gpuhost_smoke_datasheet_ratio", tuple(sorted(labels.items())))) == (
            None if ratio is None else pytest.approx(ratio / 100)
        )
        for status in ("PASS", "INFO", "WARN", "FAIL"):
            expected = float(entry["status"] == status)
            assert value(found, "gpuhost_smoke_status", **labels, status=status) == expected
    assert value(found, "gpuhost_smoke_verdict", **gpu, status=verdict) == 1
    assert sum(series(found, "gpuhost_smoke_verdict").values()) == 1
    assert value(found, "gpuhost_smoke_representative", **gpu) == representative
    assert value(found, "gpuhost_smoke_up", **gpu) == 1
    assert before <= value(found, "gpuhost_smoke_timestamp_seconds", **gpu) <= after
    problems = {(c["code"], c["severity"]) for c in judged["checks"] if c["code"] is not None}
    assert {(dict(k)["code"], dict(k)["severity"]) for k in series(found, "gpuhost_smoke_problems")} == problems
    # The copy bandwidth of an H100/H200 in bytes per second: 2.9 to 4.8 TB/s.
    assert 2.5e12 < value(found, "gpuhost_smoke_bandwidth_bytes_per_second", **gpu, metric="copy") < 5e12


def test_a_copy_bandwidth_below_its_thresholds_shows_as_fail(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The README's alert: with the datasheet bandwidth doubled, the H100's copy is at 44% of it."""
    wrong = h100_bandwidth_doubled(tmp_path)
    metrics = tmp_path / "smoke.prom"
    argv = ["smoke-test", "--replay", str(SMOKE / "smoke-quick.json"), "--gpu-table", str(wrong)]
    assert main([*argv, "--prometheus", str(metrics)]) == 1
    capsys.readouterr()
    found = samples(metrics.read_text())
    gpu = {"gpu": "0000:00:06.0", "index": "0", "model": "NVIDIA H100 80GB HBM3", "metric": "copy"}
    assert value(found, "gpuhost_smoke_status", **gpu, status="FAIL") == 1
    assert value(found, "gpuhost_smoke_datasheet_ratio", **gpu) == pytest.approx(0.441, abs=0.001)


def test_a_smoke_test_that_cannot_run_writes_up_0(tmp_path: Path) -> None:
    """This machine (like CI) has no NVIDIA driver: the run stops before any GPU is seen."""
    metrics = tmp_path / "smoke.prom"
    metrics.write_text("# the last run's PASS\n")
    result = run_cli("--quick", "--prometheus", str(metrics))
    assert result.returncode == 2 and "no NVIDIA driver" in result.stderr
    found = samples(metrics.read_text())
    assert series(found, "gpuhost_smoke_up") == {(("gpu", ""), ("index", ""), ("model", "")): 0}
    assert not series(found, "gpuhost_smoke_verdict")


def test_the_guest_needs_prometheus_client_only_for_the_flag(tmp_path: Path) -> None:
    probe = "import sys\nfor name in ('rich', 'paramiko', 'ansible', 'yaml', 'jinja2'): sys.modules[name] = None\n"
    metrics = tmp_path / "smoke.prom"
    result = run_cli("--replay", str(SMOKE / "smoke-quick.json"), "--prometheus", str(metrics), python_prelude=probe)
    assert result.returncode == 0, result.stderr
    up = value(
        samples(metrics.read_text()), "gpuhost_smoke_up", gpu="0000:00:06.0", index="0", model="NVIDIA H100 80GB HBM3"
    )
    assert up == 1
    hide = "import sys; sys.modules['prometheus_client'] = None\n"  # as in a guest without gpuhost[metrics]
    result = run_cli("--replay", str(SMOKE / "smoke-quick.json"), "--prometheus", str(metrics), python_prelude=hide)
    assert result.returncode == 2
    assert result.stderr == (
        "gpuhost smoke-test: error: --prometheus needs the Python package 'prometheus-client', which is not "
        "installed. Install it with: pip install 'gpuhost[metrics]'\n"
    )


def test_every_unit_of_the_kernel_suite_has_a_metric() -> None:
    units = set()
    for source in (REPO / "kernels").glob("*.cu"):
        units |= set(re.findall(r'unit = "([^"]+)"', source.read_text()))
    assert units and units == set(SMOKE_UNITS)


# --- a real node_exporter ------------------------------------------------------------------------------


@pytest.fixture
def node_exporter(tmp_path: Path) -> Iterator[tuple[str, Path, Path]]:
    """node_exporter on a free loopback port with only the textfile collector: (URL, directory, its log)."""
    assert NODE_EXPORTER.is_file(), f"{NODE_EXPORTER} is missing: install Debian's prometheus-node-exporter"
    directory, log = tmp_path / "textfile", tmp_path / "node_exporter.log"
    directory.mkdir()
    port = free_port()
    command = [
        str(NODE_EXPORTER),
        f"--web.listen-address=127.0.0.1:{port}",
        "--collector.disable-defaults",
        "--collector.textfile",
        f"--collector.textfile.directory={directory}",
    ]
    with log.open("wb") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 10
        while not is_listening(port):
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, f"node_exporter did not listen on {port}: {log.read_text()}"
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/metrics", directory, log
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_node_exporter_serves_the_metrics_of_all_three_verbs(
    node_exporter: tuple[str, Path, Path],
    inventory: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url, directory, log = node_exporter
    assert main(["audit", "--json", "--from-snapshot", str(H100), "--prometheus", str(directory / "audit.prom")]) == 0
    replay = ["smoke-test", "--replay", str(SMOKE / "h200x2-smoke-full.json")]
    assert main([*replay, "--prometheus", str(directory / "smoke.prom")]) == 0
    run, _ = _recorder([_unreachable("gpu01")], {"dark": {"gpu01": 1}}, rc=4)
    monkeypatch.setattr("ansible_runner.run", run)
    apply = ["apply", "-i", str(inventory), "--limit", "gpu01", "--yes", "--report", str(directory / "r.json")]
    assert main([*apply, "--prometheus", str(directory / "apply.prom")]) == 2
    capsys.readouterr()

    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        scraped = samples(response.read().decode())

    assert value(scraped, "node_textfile_scrape_error") == 0
    assert {dict(k)["file"].rsplit("/", 1)[-1] for k in series(scraped, "node_textfile_mtime_seconds")} == {
        "audit.prom",
        "apply.prom",
        "smoke.prom",
    }
    assert value(scraped, "gpuhost_audit_ready", host="h100-passthrough-guest") == 1
    assert value(scraped, "gpuhost_apply_status", host="gpu01", status="unreachable") == 1
    copy = {"gpu": "0000:00:06.0", "index": "0", "model": "NVIDIA H200", "metric": "copy"}
    assert value(scraped, "gpuhost_smoke_status", **copy, status="PASS") == 1
    assert {dict(k)["verb"] for k in series(scraped, "gpuhost_info")} == {"audit", "apply", "smoke-test"}
    # A series two files both define is dropped with an error on every scrape: none here.
    assert "collected before" not in log.read_text(), log.read_text()
