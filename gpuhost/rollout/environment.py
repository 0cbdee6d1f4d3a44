"""What the ansible-playbook runs of apply and rollback see: playbooks, environment, known_hosts."""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gpuhost.datafiles import require_data_dir
from gpuhost.errors import InputError
from gpuhost.targets import ConnectionDefaults, InventorySelection, Target, inventory_selection

# A playbooks/ directory to run instead of the checkout's or the installed one.
PLAYBOOKS_ENV = "GPUHOST_PLAYBOOKS"
# The collection that holds the roles and playbooks; apply and rollback run its playbooks by name,
# as AWX/AAP and `ansible-playbook gpuhost.passthrough.site` do.
COLLECTION = "gpuhost.passthrough"
SITE_PLAYBOOK = f"{COLLECTION}.site"
ROLLBACK_PLAYBOOK = f"{COLLECTION}.rollback"
AUDIT_PLAYBOOK = f"{COLLECTION}.audit"


def playbook_path() -> Path:
    """site.yml of the checkout's playbooks/, or of a wheel install's <prefix>/share/gpuhost/playbooks:
    the file that imports gpuhost.passthrough.site, beside the collections/ that holds it."""
    return require_data_dir("playbooks", "site.yml", env_var=PLAYBOOKS_ENV) / "site.yml"


def collections_path() -> Path:
    """The collections/ directory (ansible_collections/gpuhost/passthrough) beside the playbooks
    this gpuhost ships: its collection is the one apply and rollback run, whatever other
    gpuhost.passthrough Ansible could find."""
    return playbook_path().parent / "collections"


def ansible_environment() -> dict[str, str]:
    """Environment of the ansible-playbook runs of apply and rollback."""
    return {
        "ANSIBLE_PIPELINING": "True",
        # ansible-runner turns host key checking off unless told otherwise: gpuhost never does.
        "ANSIBLE_HOST_KEY_CHECKING": "True",
        "ANSIBLE_FORCE_COLOR": "False",
        "ANSIBLE_NOCOLOR": "True",  # -v prints Ansible's output escaped: colour codes would show as \x1b[...
        "PYTHONPATH": _pythonpath(),
        "ANSIBLE_COLLECTIONS_PATH": str(collections_path()),
        # ansible-playbook is installed beside this interpreter (a venv run as .venv/bin/gpuhost
        # without activating it has no ansible-playbook on PATH).
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", os.defpath)]),
        # ControlPersist: every task of a host goes over one SSH connection. With 5 s, a host whose tasks
        # take longer than that apart (a slow host: a lab host under TCG, measured at 5.9-6.3 s for a
        # new connection against 0.8-0.9 s multiplexed) paid a handshake for each of its tasks. The
        # master does not hold the run open past ansible-playbook's exit (measured: a run ends as soon
        # with 60 s as with 5 s), and the reboot action stops it before it waits for the host.
        # ServerAlive: a session to a host that rebooted under it ends instead of hanging.
        "ANSIBLE_SSH_ARGS": "-C -o ControlMaster=auto -o ControlPersist=60s -o ServerAliveInterval=5 "
        "-o ServerAliveCountMax=6",
    }


def rollout_targets(inventory: Path, limit: str | None, defaults: ConnectionDefaults) -> InventorySelection:
    """The hosts apply and rollback run Ansible on: the inventory's targets, validated as every verb
    validates them, less what only gpuhost's own SSH handles. Ansible's paramiko connection reads
    ~/.ssh/known_hosts alone (not gpuhost_known_hosts_file, which the audit honours) and, for a key
    it does not know, waits at a yes/no prompt that an unattended run never answers: refused, before
    anything is asked or run."""
    selection = inventory_selection(inventory, limit, defaults)
    for target in selection.targets:
        if str(target.variables.get("ansible_connection", "ssh")) == "paramiko":
            raise InputError(
                f"inventory host {target.name}: ansible_connection paramiko: apply and rollback run Ansible, whose "
                "paramiko connection reads only ~/.ssh/known_hosts (not gpuhost_known_hosts_file) and waits at a "
                "prompt for a host key it does not know. Use ansible_connection: ssh (Ansible's default); "
                "the audit is not affected."
            )
    return selection


def ansible_limit(selection: InventorySelection, *, controller_play: bool) -> tuple[str, ...]:
    """The one limit apply and rollback give Ansible, as lines of a limit file (`--limit @FILE`):
    each selected host by its exact name, never the user's pattern again (appending to it changed
    its meaning: `a:b,localhost`, `!a,localhost`). `controller_play`: the playbook ends with a play
    on `localhost` (apply's report), which a limit must name; Ansible's implicit localhost is in no
    other play, but a `localhost` the inventory lists is in every play, so it is named only when selected."""
    limit = selection.limit
    if not controller_play or any(target.name == "localhost" for target in selection.targets):
        return limit
    if selection.lists_localhost:
        raise InputError(
            "the inventory lists a host called localhost that the selection leaves out: apply writes its report "
            "in a play on localhost, and naming localhost to Ansible would plan, configure and reboot that host "
            "too. Select it as well (--limit), or give apply an inventory without localhost."
        )
    return (*limit, "localhost")


def known_hosts_inventory(targets: Sequence[Target]) -> dict[str, Any] | None:
    """An inventory source that gives each host with `gpuhost_known_hosts_file` that file for ssh,
    as the audit reads it (None: no host sets it). Without it, Ansible's ssh reads
    ~/.ssh/known_hosts, finds no key and reports what reads as a possible interception.
    The option goes into ansible_ssh_common_args, after the host's own, so that sftp and scp get
    it too and a UserKnownHostsFile the inventory names itself comes first (ssh's first value wins)."""
    hosts: dict[str, Any] = {}
    for target in targets:
        if target.ssh is None or "gpuhost_known_hosts_file" not in target.variables:
            continue
        assert target.ssh.known_hosts_file is not None  # validated by targets.py
        common = str(target.variables.get("ansible_ssh_common_args") or "").strip()
        option = f"-o UserKnownHostsFile={shlex.quote(str(target.ssh.known_hosts_file))}"
        hosts[target.name] = {"ansible_ssh_common_args": f"{common} {option}".strip()}
    return {"all": {"hosts": hosts}} if hosts else None


def inventory_sources(inventory: Path, extra: Mapping[str, Any] | None, directory: Path) -> str | list[str]:
    """ansible-runner's inventory: the user's, then (later sources win) `extra` written under `directory`."""
    if extra is None:
        return str(inventory)
    import json

    path = directory / "gpuhost-known-hosts.yml"
    path.write_text(json.dumps(extra))  # JSON is YAML: no quoting rule to get wrong
    return [str(inventory), str(path)]


def _pythonpath() -> str:
    """The action plugins import gpuhost on the controller: make this gpuhost importable there."""
    root = str(Path(__file__).resolve().parents[2])
    existing = os.environ.get("PYTHONPATH")
    return f"{root}{os.pathsep}{existing}" if existing else root
