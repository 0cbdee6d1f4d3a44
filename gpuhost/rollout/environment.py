"""What the ansible-playbook runs of apply and rollback see: playbooks, environment, known_hosts."""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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


# What gpuhost's promises rest on, stated for every ansible-playbook run whatever the shell exports
# (each value of a setting under every environment name Ansible reads it from: one alias left as the
# shell had it could win). A shell value that differs is replaced, and the CLI says so in one line.
# (names, value, the promise): tests/rollout/test_environment.py checks the names against Ansible's.
OVERRIDDEN: tuple[tuple[tuple[str, ...], str, str], ...] = (
    (("ANSIBLE_HOST_KEY_CHECKING", "ANSIBLE_SSH_HOST_KEY_CHECKING"), "True", "host keys are always verified"),
    (("ANSIBLE_ASK_PASS",), "False", "nothing waits at a prompt (keys, not passwords)"),
    (("ANSIBLE_BECOME_ASK_PASS",), "False", "nothing waits at a prompt (become without a password)"),
    (("ANSIBLE_ASK_VAULT_PASS",), "False", "nothing waits at a prompt (give ANSIBLE_VAULT_PASSWORD_FILE instead)"),
    (("ANSIBLE_ENABLE_TASK_DEBUGGER",), "False", "nothing waits at the task debugger's prompt"),
    (("ANSIBLE_STRATEGY",), "linear", "the rolling batches run as planned (the debug strategy prompts)"),
    (("ANSIBLE_TRANSPORT",), "ssh", "Ansible's ssh connection, which reads gpuhost_known_hosts_file"),
    (("ANSIBLE_INVENTORY",), "", "the inventory is -i alone"),
    (("ANSIBLE_PIPELINING", "ANSIBLE_SSH_PIPELINING"), "True", "one SSH session per task"),
    (("ANSIBLE_FORCE_COLOR",), "False", "-v prints Ansible's output escaped"),
    (("ANSIBLE_NOCOLOR",), "True", "-v prints Ansible's output escaped"),
    (("ANSIBLE_SSH_ARGS",), "", "ssh's options are gpuhost's"),  # the value: SSH_ARGS below
    (("ANSIBLE_COLLECTIONS_PATH",), "", "the collection run is this gpuhost's"),  # the value: collections_path()
    (("LC_ALL", "LANG"), "C.UTF-8", "Ansible runs only under a UTF-8 locale"),
)
# ssh takes the first value of each option and Ansible puts these first: host keys are checked
# (never asked about: `ask` would wait for a person) whatever -o comes later, from the inventory's
# ansible_ssh_common_args or from ANSIBLE_SSH_EXTRA_ARGS.
# ControlPersist: every task of a host goes over one SSH connection. With 5 s, a host whose tasks
# take longer than that apart (a slow host: a lab host under TCG, measured at 5.9-6.3 s for a
# new connection against 0.8-0.9 s multiplexed) paid a handshake for each of its tasks. The
# master does not hold the run open past ansible-playbook's exit (measured: a run ends as soon
# with 60 s as with 5 s), and the reboot action stops it before it waits for the host.
# ServerAlive: a session to a host that rebooted under it ends instead of hanging.
SSH_ARGS = (
    "-o StrictHostKeyChecking=yes -C -o ControlMaster=auto -o ControlPersist=60s "
    "-o ServerAliveInterval=5 -o ServerAliveCountMax=6"
)
# ssh options that decide whether a host key is checked, and against what: from the shell's
# environment they are refused (the inventory's gpuhost_known_hosts_file names the file).
HOST_KEY_OPTIONS = frozenset(
    {"stricthostkeychecking", "userknownhostsfile", "globalknownhostsfile", "knownhostscommand", "hostkeyalias"}
)
SSH_ARG_VARIABLES = (
    "ANSIBLE_SSH_COMMON_ARGS",
    "ANSIBLE_SSH_EXTRA_ARGS",
    "ANSIBLE_SCP_EXTRA_ARGS",
    "ANSIBLE_SFTP_EXTRA_ARGS",
    "ANSIBLE_SSH_EXECUTABLE",
)


@dataclass(frozen=True)
class AnsibleEnvironment:
    """The environment of an ansible-playbook run, and one line for each shell variable it overrides."""

    variables: Mapping[str, str]
    notes: tuple[str, ...]


def rollout_environment(environ: Mapping[str, str] | None = None) -> AnsibleEnvironment:
    """Environment of the ansible-playbook runs of apply and rollback, over the shell's `environ`
    (ansible-runner passes the shell's on; these replace its values). InputError for a shell variable
    that would switch host key checking off, which gpuhost will not quietly undo."""
    environ = os.environ if environ is None else environ
    for name in SSH_ARG_VARIABLES:
        value = environ.get(name, "")
        if name == "ANSIBLE_SSH_EXECUTABLE" and value:
            raise InputError(
                f"{name} is set in the environment: gpuhost verifies host keys with ssh itself, and another "
                f"ssh program could skip that. Unset {name} for gpuhost apply and rollback."
            )
        option = _host_key_option(value)
        if option is not None:
            raise InputError(
                f"{name} sets ssh's {option} in the environment: gpuhost verifies every host key against "
                f"known_hosts (gpuhost_known_hosts_file, else ~/.ssh/known_hosts) and will not run with it "
                f"weakened. Unset {name} (or drop {option} from it)."
            )
    values = {
        "ANSIBLE_SSH_ARGS": SSH_ARGS,
        "ANSIBLE_COLLECTIONS_PATH": str(collections_path()),
    }
    variables: dict[str, str] = {}
    notes: list[str] = []
    for names, default, promise in OVERRIDDEN:
        value = values.get(names[0], default)
        for name in names:
            variables[name] = value
            if name in environ and environ[name] != value and name not in ("ANSIBLE_SSH_ARGS", "LANG", "LC_ALL"):
                notes.append(f"note: {name} from the environment is not used: {promise}.")
    variables.update(
        {
            "PYTHONPATH": _pythonpath(),
            # ansible-playbook is installed beside this interpreter (a venv run as .venv/bin/gpuhost
            # without activating it has no ansible-playbook on PATH).
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), environ.get("PATH", os.defpath)]),
        }
    )
    return AnsibleEnvironment(variables, tuple(notes))


def ansible_environment() -> dict[str, str]:
    """Environment of the ansible-playbook runs of apply and rollback (rollout_environment's variables)."""
    return dict(rollout_environment().variables)


def _host_key_option(arguments: str) -> str | None:
    """The first ssh option in `arguments` (-o Name=value, -oName value, ...) that decides host key checking."""
    try:
        words = shlex.split(arguments)
    except ValueError:
        words = arguments.split()
    for index, word in enumerate(words):
        if word == "-o" and index + 1 < len(words):
            text = words[index + 1]
        elif word.startswith("-o"):
            text = word[2:]
        else:
            continue
        name = text.replace("=", " ").split()[0] if text.strip() else ""
        if name.lower() in HOST_KEY_OPTIONS:
            return name
    return None


def rollout_targets(inventory: Path, limit: str | None, defaults: ConnectionDefaults) -> InventorySelection:
    """The hosts apply and rollback run Ansible on: the inventory's targets, validated as every verb
    validates them, less what only gpuhost's own SSH handles. Ansible's paramiko connection reads
    ~/.ssh/known_hosts alone (not gpuhost_known_hosts_file, which the audit honours) and, for a key
    it does not know, waits at a yes/no prompt that an unattended run never answers: refused, before
    anything is asked or run."""
    selection = inventory_selection(inventory, limit, defaults)
    check_control_path_dir()
    for target in selection.targets:
        if str(target.variables.get("ansible_connection", "ssh")) == "paramiko":
            raise InputError(
                f"inventory host {target.name}: ansible_connection paramiko: apply and rollback run Ansible, whose "
                "paramiko connection reads only ~/.ssh/known_hosts (not gpuhost_known_hosts_file) and waits at a "
                "prompt for a host key it does not know. Use ansible_connection: ssh (Ansible's default); "
                "the audit is not affected."
            )
    return selection


def check_control_path_dir(environ: Mapping[str, str] | None = None) -> None:
    """Ansible's ssh keeps its connection sockets in its control_path_dir (~/.ansible/cp): one it
    cannot create failed every host mid-run, each as if the host were at fault. Said before anything
    connects, with the cause. (The inventory was read: Ansible is imported, its settings read.)"""
    environ = os.environ if environ is None else environ
    try:
        from ansible.constants import config
        from ansible.plugins.loader import connection_loader
    except ImportError:  # no Ansible: the run itself says so
        return
    connection_loader.get("ssh", class_only=True)  # loads the ssh plugin's settings
    value = config.get_config_value("control_path_dir", plugin_type="connection", plugin_name="ssh")
    directory = Path(str(value)).expanduser()
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as error:
        if environ.get("ANSIBLE_SSH_CONTROL_PATH_DIR"):
            cause, fix = "ANSIBLE_SSH_CONTROL_PATH_DIR names", "Point it at a writable directory, or unset it"
        else:
            cause = f"HOME={environ.get('HOME', '')} is not writable: Ansible's control_path_dir"
            fix = "Set HOME to a writable directory, or ANSIBLE_SSH_CONTROL_PATH_DIR to one"
        raise InputError(
            f"Ansible cannot start: {cause} {directory}, where its ssh keeps each host's connection, "
            f"cannot be created ({error.strerror}). {fix}."
        ) from error


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
