"""Fault 7 of issue 7: hostile inventory values are rejected before any connection is made.

Every variable that reaches a host (in a file, on the kernel command line, in a command, or as
the SSH destination) gets `4;reboot`, `$(id)`, quotes, a newline and `..` paths. The inventory
points at a TCP listener of this test: `gpuhost apply`, `plan` and `rollback` must refuse with a
message naming the host and the variable, and the listener must never see a connection.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from gpuhost.cli.main import main

pytestmark = pytest.mark.hostile  # issue 13's corpus: pytest -m hostile

HOSTILE = ("4;reboot", "$(id)", "`id`", "'quoted'", '"quoted"', "1\nreboot", "../../etc/passwd")
# variable -> hostile values that apply to it (paths get `..`; every one gets the shell ones).
VARIABLES = {
    "gpuhost_gpus": [[value] for value in HOSTILE],
    "gpuhost_allow_shared_group": [[value] for value in HOSTILE],
    "gpuhost_hugepages": list(HOSTILE),
    "gpuhost_hugetlbfs_mount": [*HOSTILE, "/mnt/../etc", "/mnt/$(id)"],
    "gpuhost_pci_realloc": list(HOSTILE),
    "gpuhost_pcie_aspm_off": list(HOSTILE),
    "gpuhost_nomodeset": list(HOSTILE),
    "gpuhost_blacklist_snd_hda_intel": list(HOSTILE),
    "gpuhost_bind_by": list(HOSTILE),
    "gpuhost_remove_nvidia_driver": list(HOSTILE),
    "gpuhost_trial_boot": list(HOSTILE),
    "gpuhost_trial_panic_seconds": list(HOSTILE),
    "gpuhost_verify_reboot_timeout": list(HOSTILE),
    "gpuhost_verify_reboot_command": [f"systemctl reboot {value}" for value in HOSTILE],
    "gpuhost_rollback_reboot_timeout": list(HOSTILE),
    "gpuhost_rollback_reboot_command": [f"systemctl reboot {value}" for value in HOSTILE],
    "gpuhost_bmc": [
        *({"protocol": "redfish", "address": value, "user": "power", "password_env": "P"} for value in HOSTILE),
        *({"protocol": "ipmi", "address": "10.0.9.11", "user": value, "password_env": "P"} for value in HOSTILE),
        *({"protocol": "ipmi", "address": "10.0.9.11", "user": "power", "password_env": value} for value in HOSTILE),
    ],
    "ansible_host": list(HOSTILE),
    "ansible_port": list(HOSTILE),
    "ansible_user": list(HOSTILE),
}
CASES = [(name, value) for name, values in VARIABLES.items() for value in values]


@pytest.fixture(scope="module")
def listener() -> Iterator[socket.socket]:
    """A TCP port on loopback that counts connections: nothing may connect to it."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    server.setblocking(False)
    yield server
    server.close()


def connections_made(server: socket.socket) -> int:
    """Connections to `listener` since the last call (tests/cli/test_host_selection.py counts with it too)."""
    count = 0
    while True:
        try:
            connection, _ = server.accept()
        except BlockingIOError:
            return count
        connection.close()
        count += 1


@pytest.mark.parametrize(("name", "value"), CASES, ids=[f"{n}={v!r}" for n, v in CASES])
def test_hostile_value_is_rejected_before_any_connection(
    name: str, value: object, listener: socket.socket, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port = listener.getsockname()[1]
    host = {"ansible_host": "127.0.0.1", "ansible_port": port, "ansible_user": "root", name: value}
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"gpu01": host}}}))
    for argv in (
        ["apply", "-i", str(inventory), "--yes", "--report", str(tmp_path / "report.json")],
        ["apply", "-i", str(inventory), "--check"],
        ["plan", "-i", str(inventory)],
        ["audit", "-i", str(inventory)],  # the host's configuration is read whole, once, by every verb
        ["rollback", "-i", str(inventory), "--limit", "gpu01", "--yes"],
    ):
        code = main(argv)
        error = capsys.readouterr().err
        assert code != 0, argv
        assert "gpu01" in error and ("port" if name == "ansible_port" else name.removeprefix("ansible_")) in error, (
            argv,
            error,
        )
    assert connections_made(listener) == 0
    assert not (tmp_path / "report.json").exists()
