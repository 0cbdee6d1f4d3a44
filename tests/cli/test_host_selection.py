"""Issue 13.1: a host selection that selects nothing is an error before any connection, in every verb.

Ansible reads an empty --limit ('', ',', ':') or an empty regex ('~[' splits into '~') as no
limit at all, i.e. every host: `gpuhost rollback -l ''` would have rebooted the whole inventory.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import yaml

from gpuhost.cli.main import main
from gpuhost.errors import NoHostsSelected
from gpuhost.targets import ConnectionDefaults, inventory_targets, load_inventory
from tests.inventory import test_hostile_values as hostile

pytestmark = pytest.mark.hostile  # issue 13's corpus: pytest -m hostile

listener = hostile.listener  # the fixture: a loopback port that counts connections
EXAMPLE = Path(__file__).resolve().parents[2] / "inventory.example.yml"
EMPTY_SELECTIONS = ["", ",", ":", " , ", "~[", "~", "!", "gpu99", "gpu01,gpu99", "@limit-file"]


def _verbs(inventory: Path, limit: str, tmp_path: Path) -> dict[str, list[str]]:
    """Every verb that selects hosts of an inventory, with `limit` as its selection."""
    base = ["-i", str(inventory), "--limit", limit]
    return {
        "audit": ["audit", *base],
        "snapshot": ["snapshot", *base, "-o", str(tmp_path / "snap")],
        "plan": ["plan", *base],
        "apply --yes": ["apply", *base, "--yes", "--report", str(tmp_path / "report.json")],
        "apply --check": ["apply", *base, "--check", "--report", str(tmp_path / "report.json")],
        "rollback": ["rollback", *base, "--yes"],
    }


@pytest.fixture
def inventory(tmp_path: Path, listener: socket.socket) -> Path:
    port = listener.getsockname()[1]
    host = {"ansible_host": "127.0.0.1", "ansible_port": port, "ansible_user": "root"}
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump({"all": {"hosts": {"gpu01": host, "gpu02": host}}}))
    return path


@pytest.mark.parametrize("verb", list(_verbs(Path("x"), "", Path("x"))))
@pytest.mark.parametrize("limit", EMPTY_SELECTIONS)
def test_an_empty_or_unmatched_limit_is_refused_by_every_verb(
    verb: str,
    limit: str,
    inventory: Path,
    listener: socket.socket,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (tmp_path / "limit-file").write_text("")
    argv = _verbs(inventory, limit, tmp_path)[verb]
    code = main(argv)
    error = capsys.readouterr().err
    assert code == 2, (argv, error)
    assert f"--limit {limit!r}" in error or f"no hosts matching --limit {limit!r}" in error, error
    assert hostile.connections_made(listener) == 0
    assert not (tmp_path / "report.json").exists()


@pytest.mark.parametrize("verb", ["render", "guest"])
def test_render_and_guest_refuse_a_host_the_inventory_lacks(
    verb: str, inventory: Path, listener: socket.socket, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [verb, *(["status"] if verb == "guest" else []), "-i", str(inventory), "--host", "gpu99", "--vm", "vm1"]
    assert main(argv) == 2
    assert "no host 'gpu99'" in capsys.readouterr().err
    assert hostile.connections_made(listener) == 0


def test_an_empty_limit_without_an_inventory_is_not_this_machine(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", "--limit", ""]) == 2
    assert "--limit needs an inventory" in capsys.readouterr().err


def test_the_error_carries_the_selection_as_fields() -> None:
    with pytest.raises(NoHostsSelected) as refused:
        inventory_targets(EXAMPLE, ",", ConnectionDefaults())
    assert refused.value.pattern == "," and refused.value.inventory == EXAMPLE


@pytest.mark.parametrize(
    ("limit", "selected"),
    [
        ("gpu02", ["gpu02"]),
        ("gpu01,gpu03", ["gpu01", "gpu03"]),
        ("gpu0*", ["gpu01", "gpu02", "gpu03"]),
        ("~gpu0[12]", ["gpu01", "gpu02"]),
        ("all:!gpu01", ["gpu02", "gpu03"]),
        (None, ["gpu01", "gpu02", "gpu03"]),  # no --limit: the whole inventory, on purpose
    ],
)
def test_patterns_that_name_hosts_still_select_them(limit: str | None, selected: list[str]) -> None:
    assert [name for name, _ in load_inventory(EXAMPLE, limit)] == selected
