"""The inventory and known_hosts that `lab up` writes."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpuhost.lab.inventory import InventoryHost, known_hosts_text, render_inventory

KEY = Path("/cache/lab/images/keys/lab_ed25519")
KNOWN = Path("/cache/lab dir/known_hosts")
HOSTS = [
    InventoryHost("lab-1", 40001, "gpu-pair", ("1234:1111",)),
    InventoryHost("lab-2", 40002, "shared-group", ("1234:1111",)),
]


def test_inventory_is_yaml_with_every_variable_per_host() -> None:
    data = yaml.safe_load(render_inventory(HOSTS, KEY, KNOWN))
    assert set(data) == {"all"}
    assert data["all"]["hosts"]["lab-1"] == {
        "ansible_host": "127.0.0.1",
        "ansible_port": 40001,
        "ansible_user": "root",
        "ansible_ssh_private_key_file": str(KEY),
        "ansible_python_interpreter": "/usr/bin/python3",
        # The path holds a space: quoted, since Ansible splits these arguments with shlex.
        "ansible_ssh_common_args": "-o UserKnownHostsFile='/cache/lab dir/known_hosts' -o StrictHostKeyChecking=yes",
        "gpuhost_known_hosts_file": str(KNOWN),
        "gpuhost_gpus": ["1234:1111"],
        "gpuhost_lab_topology": "gpu-pair",
    }
    assert data["all"]["hosts"]["lab-2"]["ansible_port"] == 40002
    assert data["all"]["hosts"]["lab-2"]["gpuhost_lab_topology"] == "shared-group"


def test_inventory_quotes_awkward_paths() -> None:
    odd = Path("/home/o'neil/#lab: x/known_hosts")
    data = yaml.safe_load(render_inventory(HOSTS[:1], KEY, odd))
    assert data["all"]["hosts"]["lab-1"]["gpuhost_known_hosts_file"] == str(odd)


def test_inventory_is_read_by_gpuhost_as_ssh_targets(tmp_path: Path) -> None:
    # gpuhost reads inventories through Ansible itself: this is what `gpuhost audit -i` gets.
    targets = pytest.importorskip("gpuhost.targets")
    pytest.importorskip("ansible")
    key = tmp_path / "lab_ed25519"
    key.write_text("not a real key\n")
    known = tmp_path / "known_hosts"
    path = tmp_path / "inventory.yml"
    path.write_text(render_inventory(HOSTS, key, known))
    found = {t.name: t for t in targets.inventory_targets(path, None, targets.ConnectionDefaults())}
    assert set(found) == {"lab-1", "lab-2"}
    ssh = found["lab-2"].ssh
    assert (ssh.host, ssh.port, ssh.user) == ("127.0.0.1", 40002, "root")
    assert ssh.key_file == key and ssh.known_hosts_file == known
    assert not ssh.accept_new_host_keys
    assert found["lab-1"].variables["gpuhost_gpus"] == ["1234:1111"]


def test_known_hosts_lines_pin_the_lab_host_key_per_port() -> None:
    text = known_hosts_text(HOSTS, "ssh-ed25519 AAAAC3Nza gpuhost-lab-host")
    assert text == ("[127.0.0.1]:40001 ssh-ed25519 AAAAC3Nza\n[127.0.0.1]:40002 ssh-ed25519 AAAAC3Nza\n")
