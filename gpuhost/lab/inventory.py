"""The Ansible inventory and known_hosts that `lab up` writes (pure functions).

The inventory is YAML that `ansible-playbook -i`, `gpuhost audit -i` and `gpuhost apply -i`
accept: every host under `all.hosts`, each with all of its variables, so that a reader need not
resolve group variables.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

Yaml = str | int | bool | Sequence["Yaml"] | Mapping[str, "Yaml"]


@dataclass(frozen=True)
class InventoryHost:
    name: str
    ssh_port: int
    topology: str
    gpus: tuple[str, ...]


def known_hosts_text(hosts: Sequence[InventoryHost], host_public_key: str) -> str:
    """One line per host: the lab's host key for [127.0.0.1]:PORT (no trust on first use)."""
    key = " ".join(host_public_key.split()[:2])  # drop the comment
    return "".join(f"[127.0.0.1]:{host.ssh_port} {key}\n" for host in hosts)


def inventory_data(hosts: Sequence[InventoryHost], client_key: Path, known_hosts: Path) -> dict[str, Yaml]:
    entries: dict[str, Yaml] = {}
    for host in hosts:
        entries[host.name] = {
            "ansible_host": "127.0.0.1",
            "ansible_port": host.ssh_port,
            "ansible_user": "root",
            "ansible_ssh_private_key_file": str(client_key),
            "ansible_python_interpreter": "/usr/bin/python3",
            # Ansible splits this with shlex: quote the path in case it holds spaces.
            "ansible_ssh_common_args": (
                f"-o UserKnownHostsFile={shlex.quote(str(known_hosts))} -o StrictHostKeyChecking=yes"
            ),
            "gpuhost_known_hosts_file": str(known_hosts),
            # The stand-in GPU has QEMU's IDs, not NVIDIA's: name it, since gpuhost selects
            # NVIDIA GPUs by default.
            "gpuhost_gpus": list(host.gpus),
            "gpuhost_lab_topology": host.topology,
        }
    return {"all": {"hosts": entries}}


def _scalar(value: str | int | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    # A JSON string is a valid YAML double-quoted scalar: no quoting rule to get wrong.
    return json.dumps(value)


def to_yaml(value: Yaml, indent: int = 0) -> str:
    """Block-style YAML of nested dicts, lists and scalars (enough for an inventory)."""
    pad = "  " * indent
    lines: list[str] = []
    if isinstance(value, Mapping):
        for key, item in value.items():
            if isinstance(item, Mapping) and item:
                lines.append(f"{pad}{_yaml_key(key)}:")
                lines.append(to_yaml(item, indent + 1))
            elif isinstance(item, Sequence) and not isinstance(item, str):
                flow = ", ".join(_scalar(x) for x in item if isinstance(x, (str, int, bool)))
                lines.append(f"{pad}{_yaml_key(key)}: [{flow}]")
            elif isinstance(item, Mapping):
                lines.append(f"{pad}{_yaml_key(key)}: {{}}")
            else:
                lines.append(f"{pad}{_yaml_key(key)}: {_scalar(item)}")
        return "\n".join(lines)
    raise TypeError("to_yaml renders a mapping at the top")


def _yaml_key(key: str) -> str:
    return key if key.replace("-", "_").isidentifier() else json.dumps(key)


def render_inventory(hosts: Sequence[InventoryHost], client_key: Path, known_hosts: Path) -> str:
    header = "# Written by `gpuhost lab up`; rewritten at every `lab up`.\n"
    return header + to_yaml(inventory_data(hosts, client_key, known_hosts)) + "\n"
