"""Who to audit: this machine, ad-hoc `user@host:port` names, inventory hosts, or snapshots.

Every value that will reach a connection or a host is validated here, before anything connects.
"""

from __future__ import annotations

import contextlib
import io
import ipaddress
import math
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuhost.errors import InputError, MissingDependencyError, NoHostsSelected
from gpuhost.facts.snapshot import SnapshotTree
from gpuhost.inventory.bmc import PASSWORD_VARIABLE, parse_bmc, password_marker
from gpuhost.inventory.plan_settings import PlanSettings, gpus_variable
from gpuhost.inventory.policy import ROLES, AuditPolicy, Role
from gpuhost.inventory.spec import HostPolicy, VmSpec, host_policy, parse_vms, pick_vm, vm_defaults
from gpuhost.selection import GpuSelector, allowed_shared_groups
from gpuhost.transport.bmc import BmcEndpoint
from gpuhost.transport.ssh import SshOptions

_HOSTNAME = re.compile(r"^(?=.{1,253}$)(?!-)[A-Za-z0-9-]{1,63}(?<!-)(\.(?!-)[A-Za-z0-9-]{1,63}(?<!-))*\.?$")
_USER = re.compile(r"^[a-z_][a-z0-9_.-]{0,31}$")
_INVENTORY_NAME = re.compile(r"^[A-Za-z0-9_.:\[\]-]{1,255}$")
# A last label that inet_aton would read as a number (decimal, octal, 0x hex): '2130706433', '127.1',
# '0x7f000001' are addresses in disguise, and no top-level domain is numeric (RFC 3696).
_ZONE = re.compile(r"^[A-Za-z0-9_.-]{1,15}$")  # an interface name (IFNAMSIZ - 1)
_NUMERIC_LABEL = re.compile(r"^(0x[0-9a-f]*|[0-9]+)$", re.IGNORECASE)
_ADHOC = re.compile(r"^(?:(?P<user>[^@]+)@)?(?P<host>\[[^\]]+\]|[^:@]+)(?::(?P<port>[^:]+))?$")

LOCAL = "local"
SSH = "ssh"
SNAPSHOT = "snapshot"


@dataclass(frozen=True)
class HostConfig:
    """A host's `gpuhost_*` inventory variables, parsed and validated once, when the inventory is
    read: what audit (`audit`), plan and apply (`plan`), render and guest (`render`, `vms`) read."""

    audit: AuditPolicy
    plan: PlanSettings
    render: HostPolicy
    vms: tuple[VmSpec, ...]
    bmc: BmcEndpoint | None = None  # gpuhost_bmc: the power cycle of a trial that never answers

    def vm(self, name: str, where: str) -> VmSpec:
        """The VM called `name` in the host's `gpuhost_vms`."""
        return pick_vm(self.vms, name, where)


@dataclass(frozen=True)
class Target:
    name: str
    kind: str  # LOCAL, SSH or SNAPSHOT
    policy: AuditPolicy
    ssh: SshOptions | None = None
    snapshot: Path | None = None
    variables: Mapping[str, Any] = field(default_factory=dict)  # inventory variables (ansible_* and gpuhost_*)
    # None only for targets built by hand (tests); every constructor below sets it.
    config: HostConfig | None = None

    def require_config(self) -> HostConfig:
        if self.config is None:
            raise InputError(f"host {self.name}: its gpuhost_* configuration was not read.")
        return self.config


@dataclass(frozen=True)
class ConnectionDefaults:
    """Command-line options that apply to hosts whose inventory does not say otherwise."""

    user: str | None = None
    key_file: Path | None = None
    known_hosts_file: Path | None = None
    accept_new_host_keys: bool = False
    connect_timeout: float = 15.0
    gpus: object = None
    role: Role = Role.AUTO


def validate_host(value: object, where: str, fix: str = "ansible_host") -> str:
    """A host name, or an IP address in its canonical form ('10.0.0.5', 'fe80::1'). Numbers that
    resolvers read as addresses ('2130706433', YAML's 0x7f000001, '127.1') are refused: they reach
    an address nobody wrote."""
    text = str(value).strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        address = None
    if address is not None and text.lower() in _canonical_spellings(address, where, fix):
        return text
    if isinstance(value, bool | int | float) or address is not None or not _HOSTNAME.fullmatch(text):
        reason = "is not in canonical form" if address is not None else "is not a valid host name or IP address"
        raise InputError(
            f"{where}: {value!r} {reason}. Write a host name or a dotted address like 10.0.0.5 "
            f"(quoted in YAML). Fix {fix}."
        )
    if _NUMERIC_LABEL.fullmatch(text.rstrip(".").rsplit(".", 1)[-1]):
        raise InputError(
            f"{where}: {value!r} is a number that resolvers read as an IP address, not a host name. "
            f"Write the address as four dotted decimals, e.g. 10.0.0.5 (quoted in YAML). Fix {fix}."
        )
    return text


def _canonical_spellings(
    address: ipaddress.IPv4Address | ipaddress.IPv6Address, where: str, fix: str
) -> tuple[str, ...]:
    """An address's compressed and exploded forms. A link-local IPv6 address may name its zone
    ('fe80::1%eth0', as ssh takes it): an interface name, nothing else. (ipaddress' `exploded` of
    a scoped address raises AddressValueError, which reached the user as a traceback.)"""
    scope = address.scope_id if isinstance(address, ipaddress.IPv6Address) else None
    if scope is None:
        return (str(address), address.exploded)
    if not _ZONE.fullmatch(scope):
        raise InputError(f"{where}: the zone {scope!r} of {str(address)!r} is not an interface name. Fix {fix}.")
    bare = ipaddress.IPv6Address(str(address).split("%", 1)[0])
    return (str(address).lower(), f"{bare.exploded}%{scope}".lower())


def validate_user(value: object, where: str, fix: str = "ansible_user") -> str:
    text = str(value)
    # A YAML number (ansible_user: 0) is no login name; str() of it would be '0', and 0 is falsy.
    if not isinstance(value, str) or not _USER.fullmatch(text):
        raise InputError(
            f"{where}: user {value!r} is not a valid login name (letters, digits, '_', '.', '-'; starting with "
            f"a letter or '_'). Fix {fix}."
        )
    return text


def validate_port(value: object, where: str, fix: str = "ansible_port") -> int:
    try:
        port = int(str(value))
    except ValueError:
        port = -1
    if not 1 <= port <= 65535 or str(value).strip() != str(port):
        raise InputError(f"{where}: port {value!r} is not a number from 1 to 65535. Fix {fix}.")
    return port


def validate_connect_timeout(value: float) -> float:
    if not (math.isfinite(value) and 0 < value <= 3600):
        raise InputError(f"--connect-timeout {value!r}: give seconds, more than 0 and at most 3600 (e.g. 15).")
    return value


def _local_path(value: object, where: str, what: str) -> Path:
    text = str(value)
    if "\n" in text or "\0" in text:
        raise InputError(f"{where}: the {what} path {value!r} contains a newline or NUL character.")
    return Path(text).expanduser()


def validate_key_file(value: object, where: str) -> Path:
    path = _local_path(value, where, "private key")
    if not path.is_file():
        what = "is a directory" if path.is_dir() else "is not a regular file" if path.exists() else "does not exist"
        raise InputError(f"{where}: private key file {path} {what}. Fix ansible_ssh_private_key_file.")
    return path


def validate_known_hosts(value: object, where: str, fix: str = "gpuhost_known_hosts_file") -> Path:
    """A known_hosts path that is missing (nothing is known yet) or a regular file. A FIFO would block
    the first reader or writer for ever (the audit, or ssh under apply); a directory or a device is
    no known_hosts file either."""
    path = _local_path(value, where, "known_hosts")
    if path.exists() and not path.is_file():
        what = "is a directory" if path.is_dir() else "is not a regular file (a FIFO, socket or device)"
        raise InputError(
            f"{where}: known_hosts file {path} {what}. Fix {fix}: name a regular file (or a path that does "
            "not exist yet)."
        )
    return path


def host_config(variables: Mapping[str, Any], defaults: ConnectionDefaults, where: str) -> HostConfig:
    """Every `gpuhost_*` value of a host, validated (InputError naming `where`, the variable and the fix)."""
    from_command_line = defaults.gpus is not None
    gpus_value = defaults.gpus if from_command_line else gpus_variable(variables, where)
    role_text = str(variables.get("gpuhost_role", defaults.role))
    if role_text not in ROLES:
        raise InputError(f"{where}: gpuhost_role {role_text!r} is not one of {', '.join(ROLES)}.")
    role = Role(role_text)
    allowed = allowed_shared_groups(variables, where)
    gpus = (
        GpuSelector.parse(gpus_value, "command line", variable="--gpus")
        if from_command_line
        else GpuSelector.parse(gpus_value, where)
    )
    vms = parse_vms(variables.get("gpuhost_vms"), where, vm_defaults(variables))
    audit = AuditPolicy(gpus=gpus, role=role, allow_shared_group=allowed, vms=vms)
    return HostConfig(
        audit=audit,
        plan=PlanSettings.from_variables(variables, where, gpus=defaults.gpus),
        render=host_policy(variables, audit, where),
        vms=vms,
        bmc=parse_bmc(variables, where),
    )


def local_target(defaults: ConnectionDefaults) -> Target:
    name = os.uname().nodename
    config = host_config({}, defaults, f"host {name}")
    return Target(name=name, kind=LOCAL, policy=config.audit, config=config)


def snapshot_target(directory: Path, defaults: ConnectionDefaults) -> Target:
    """A snapshot is named after the host it was taken from (snapshot.json), else its path."""
    meta = SnapshotTree(directory).meta() if directory.is_dir() else None
    name = meta.host if meta is not None else str(directory)
    config = host_config({}, defaults, f"snapshot {directory}")
    return Target(name=name, kind=SNAPSHOT, policy=config.audit, snapshot=directory, config=config)


def adhoc_target(spec: str, defaults: ConnectionDefaults) -> Target:
    """'root@10.0.0.5', 'admin@gpu02:2222', 'gpu03', '[::1]:2222'."""
    match = _ADHOC.fullmatch(spec.strip())
    where = f"host {spec!r}"
    if not match:
        raise InputError(f"{where}: write hosts as [user@]host[:port], e.g. root@10.0.0.5 or admin@gpu02:2222.")
    fix = "the host argument"
    # A user from -u is blamed on -u, not on the host argument that did not name one.
    user = validate_user(
        match.group("user") or defaults.user or "root", where, fix if match.group("user") else "--user"
    )
    host = validate_host(match.group("host"), where, fix)
    port = validate_port(match.group("port") or 22, where, fix)
    options = SshOptions(
        host=host,
        port=port,
        user=user,
        key_file=defaults.key_file,
        known_hosts_file=defaults.known_hosts_file,
        accept_new_host_keys=defaults.accept_new_host_keys,
        connect_timeout=defaults.connect_timeout,
    )
    config = host_config({}, defaults, where)
    return Target(name=spec, kind=SSH, policy=config.audit, ssh=options, config=config)


@dataclass(frozen=True)
class InventorySelection:
    """The hosts a command selected from an inventory, and what Ansible must be told to act on them
    alone: `limit` holds one exact-name pattern per host (exact_host_pattern), checked with Ansible's
    own pattern matching against this inventory to select these hosts and no other."""

    targets: tuple[Target, ...]
    limit: tuple[str, ...]
    # The inventory names a host `localhost` itself (not Ansible's implicit one): a play on
    # `localhost` runs on that host, and naming it in a limit selects it for every play.
    lists_localhost: bool


def exact_host_pattern(name: str) -> str:
    """An Ansible host pattern that matches the host called `name` and nothing else: a name as a
    pattern is a glob (`gpu[1]`), a subscript or an exclusion, so it is an anchored regex instead."""
    return f"~^{re.escape(name)}\\Z"


def inventory_targets(path: Path, limit: str | None, defaults: ConnectionDefaults) -> list[Target]:
    """Hosts of an Ansible inventory, read through Ansible itself (groups, group_vars, patterns), each
    with its configuration validated. The one place a command reads the inventory: read it once."""
    return list(inventory_selection(path, limit, defaults).targets)


def inventory_selection(path: Path, limit: str | None, defaults: ConnectionDefaults) -> InventorySelection:
    """inventory_targets, with the exact Ansible limit of the hosts it selected."""
    host_variables, lists_localhost = _read_inventory(path, limit)
    targets = tuple(_inventory_target(name, variables, defaults) for name, variables in host_variables)
    return InventorySelection(
        targets=targets,
        limit=tuple(exact_host_pattern(target.name) for target in targets),
        lists_localhost=lists_localhost,
    )


def _inventory_target(name: str, variables: Mapping[str, Any], defaults: ConnectionDefaults) -> Target:
    where = f"inventory host {name}"
    if not _INVENTORY_NAME.fullmatch(name):
        raise InputError(f"{where}: the host name contains characters gpuhost does not accept.")
    connection = str(variables.get("ansible_connection", "ssh"))
    config = host_config(variables, defaults, where)
    if connection == "local":
        return Target(name=name, kind=LOCAL, policy=config.audit, variables=variables, config=config)
    if connection not in ("ssh", "paramiko", "smart"):
        raise InputError(f"{where}: ansible_connection {connection!r} is not supported (use ssh or local).")
    key = variables.get("ansible_ssh_private_key_file") or variables.get("ansible_private_key_file")
    known_hosts = variables.get("gpuhost_known_hosts_file")
    options = SshOptions(
        host=validate_host(variables.get("ansible_host", name), where),
        port=validate_port(variables.get("ansible_port", 22), where),
        user=validate_user(_first_set(variables.get("ansible_user"), defaults.user, "root"), where),
        key_file=validate_key_file(key, where) if key else defaults.key_file,
        known_hosts_file=validate_known_hosts(known_hosts, where) if known_hosts else defaults.known_hosts_file,
        accept_new_host_keys=defaults.accept_new_host_keys,
        connect_timeout=defaults.connect_timeout,
    )
    return Target(name=name, kind=SSH, policy=config.audit, ssh=options, variables=variables, config=config)


def _first_set(*values: object) -> object:
    """The first value that is set: unlike `or`, a YAML 0 or '' stays (and is refused), never 'root'."""
    return next(value for value in values if value is not None)


def load_inventory(path: Path, limit: str | None) -> list[tuple[str, dict[str, Any]]]:
    return _read_inventory(path, limit)[0]


def ansible_inventory_settings() -> None:
    """Ansible's settings for reading an inventory in this process. Ansible reads its settings once,
    when ansible.constants is first imported: this must run before anything imports Ansible."""
    # An inventory Ansible cannot parse must be an error, not an empty fleet.
    os.environ.setdefault("ANSIBLE_INVENTORY_UNPARSED_FAILED", "True")
    os.environ.setdefault("ANSIBLE_HOST_PATTERN_MISMATCH", "ignore")


def ansible_settings_error(error: Exception) -> InputError:
    """Ansible could not start in this process (it reads its settings, and makes its local temporary
    directory, when first imported): the cause and the fix, not Ansible's traceback."""
    message = " ".join(str(getattr(error, "message", None) or error).split())
    if "Unable to create local directories" in message:
        if os.environ.get("ANSIBLE_LOCAL_TEMP"):
            where = f"ANSIBLE_LOCAL_TEMP={os.environ['ANSIBLE_LOCAL_TEMP']} names a directory it cannot create"
            fix = "Point ANSIBLE_LOCAL_TEMP at a writable directory, or unset it"
        else:
            where = f"HOME={os.environ.get('HOME', '')} is not writable (Ansible keeps its files in ~/.ansible)"
            fix = "Set HOME to a writable directory, or ANSIBLE_LOCAL_TEMP to one"
        return InputError(f"Ansible cannot start: {where}: {message}. {fix}.")
    return InputError(f"Ansible cannot start: {message}. Check the ANSIBLE_* variables and ansible.cfg it reads.")


def _read_inventory(path: Path, limit: str | None) -> tuple[list[tuple[str, dict[str, Any]]], bool]:
    """Each selected host's ansible_* and gpuhost_* variables; whether the inventory lists `localhost`."""
    if not path.exists():
        raise InputError(f"inventory {path} does not exist. See inventory.example.yml for the format.")
    ansible_inventory_settings()
    try:
        from ansible.errors import AnsibleError
        from ansible.inventory.manager import InventoryManager
        from ansible.parsing.dataloader import DataLoader
        from ansible.template import Templar
        from ansible.vars.manager import VariableManager
    except ImportError as error:
        raise MissingDependencyError("ansible-core", "controller", "Reading an Ansible inventory") from error
    except Exception as error:  # Ansible reads its settings on import: an AnsibleError, said with the cause
        raise ansible_settings_error(error) from error
    try:
        loader = DataLoader()
        inventory = _parse_inventory(InventoryManager, loader, path)
        variable_manager = VariableManager(loader=loader, inventory=inventory)
        hosts = select_hosts(inventory, path, limit)
        result = []
        for host in hosts:
            variables = variable_manager.get_vars(host=host, include_hostvars=False)
            templar = Templar(loader=loader, variables=variables)
            resolved = {
                key: templar.template(value)
                for key, value in variables.items()
                if key.startswith(("ansible_", "gpuhost_")) and key not in ("ansible_play_hosts_all", PASSWORD_VARIABLE)
            }
            # Vaulted, and decrypted only by the playbook that uses it: the controller keeps that it is set.
            if variables.get(PASSWORD_VARIABLE) is not None:
                resolved[PASSWORD_VARIABLE] = password_marker(variables[PASSWORD_VARIABLE])
            result.append((host.name, resolved))
        _check_exact_limit(inventory, path, [host.name for host in hosts])
        return result, "localhost" in inventory.hosts
    except AnsibleError as error:
        raise InputError(f"inventory {path}: {error.message}") from error


def _parse_inventory(manager: Any, loader: Any, path: Path) -> Any:
    """Ansible's InventoryManager for `path`. Ansible reports why each of its plugins could not read
    a file only as warnings (once per message and process), then raises "No inventory was parsed":
    those warnings are kept off the terminal while it parses, and an unparsed file's error names the
    cause, asked again of the one plugin for the file's kind (yaml for .yml/.yaml/.json, ini otherwise)."""
    from ansible.errors import AnsibleError

    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said), contextlib.redirect_stdout(said):
            inventory = manager(loader=loader, sources=[str(path)])
    except AnsibleError as error:
        kind = "yaml" if path.suffix.lower() in (".yml", ".yaml", ".json") else "ini"
        cause = _plugin_failure(kind, loader, path)
        if cause is None:
            raise
        raise InputError(
            f"inventory {path}: Ansible cannot read it as {kind.upper()}: {cause}. Fix its host names: "
            "no control characters; [a:b] is Ansible's range syntax."
        ) from error
    # A parsed inventory: Ansible's own warnings (deprecations, say) are still the operator's to see.
    sys.stderr.write(said.getvalue())
    return inventory


def _plugin_failure(kind: str, loader: Any, path: Path) -> str | None:
    """The first line of why Ansible's `kind` inventory plugin cannot parse `path`; None if it can."""
    from ansible.errors import AnsibleError
    from ansible.inventory.data import InventoryData
    from ansible.plugins.loader import inventory_loader

    plugin = inventory_loader.get(kind)
    if plugin is None:
        return None
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said), contextlib.redirect_stdout(said):
            plugin.parse(InventoryData(), loader, str(path.resolve()), cache=False)
    except Exception as error:  # as Ansible's own parse_source: any plugin failure is the file's
        text = str(error.message) if isinstance(error, AnsibleError) else f"Failed to parse inventory: {error}"
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        return lines[0] if lines else type(error).__name__
    return None


def _check_exact_limit(inventory: Any, path: Path, names: list[str]) -> None:
    """The exact-name limit of `names`, read by Ansible as ansible-playbook reads a limit file
    (`--limit @FILE`), plus the implicit `localhost` that apply's report play needs, must select
    `names` and no other host. A host whose name is also a group's is refused here: any pattern
    naming it would select the group's hosts too."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="gpuhost-limit-") as directory:
        limit_file = Path(directory) / "limit"
        lines = [exact_host_pattern(name) for name in names]
        # No trailing newline: Ansible reads every line of the file, an empty last one too.
        limit_file.write_text("\n".join([*lines, *(() if "localhost" in inventory.hosts else ("localhost",))]))
        inventory.subset(f"@{limit_file}")
        selected = [host.name for host in inventory.get_hosts(pattern="all")]
    inventory.subset(None)
    extra = sorted(set(selected) - set(names))
    if extra or len(selected) != len(names):
        groups = sorted(set(names) & set(inventory.groups))
        reason = f"{', '.join(groups)} also name a group" if groups else "Ansible reads them as patterns"
        raise InputError(
            f"inventory {path}: the hosts {', '.join(names)} cannot be named to Ansible alone ({reason}; "
            f"naming them would also select {', '.join(extra) or 'other hosts'}). Rename the host or the group."
        )


def select_hosts(inventory: Any, path: Path, limit: str | None) -> list[Any]:
    """The hosts of an Ansible InventoryManager that `limit` (an Ansible pattern) selects: every verb
    selects through here. Ansible reads an empty pattern ('', ',', ':') or an empty regex ('~', what
    '~[' splits into) as no limit, which is every host; here each is an error, and so is a term
    that matches no host of the inventory, `localhost` included (a typo in a list of hosts to reboot
    must not go unnoticed)."""
    from ansible.inventory.manager import split_host_pattern

    if limit is not None:
        terms = [term for term in split_host_pattern(limit) if term]
        if not terms:
            raise NoHostsSelected(
                path, limit, f"--limit {limit!r} names no host. Name the hosts (e.g. --limit gpu01,gpu02)."
            )
        for term in terms:
            bare = term.lstrip("!&")
            if bare in ("", "~") or bare.startswith("@"):
                raise NoHostsSelected(
                    path,
                    limit,
                    f"--limit {limit!r}: {term!r} is not a host pattern gpuhost accepts "
                    "(a host or group name, a glob, or ~REGEX). Name the hosts.",
                )
            # Ansible's implicit localhost (`localhost`, `127.0.0.1` on an inventory that does not list
            # it) is no host of the inventory: a limit naming it names a host that is not there.
            if not [host for host in inventory.get_hosts(pattern=bare) if not getattr(host, "implicit", False)]:
                raise NoHostsSelected(
                    path,
                    limit,
                    f"--limit {limit!r}: no hosts match {term!r}. Check the name (gpuhost never reads a miss as all).",
                )
        inventory.subset(limit)
    hosts: list[Any] = inventory.get_hosts(pattern="all")
    if not hosts:
        where = f" matching --limit {limit!r}" if limit is not None else ""
        raise NoHostsSelected(path, limit, f"no hosts{where}.")
    return hosts
