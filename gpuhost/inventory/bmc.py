"""`gpuhost_bmc`: where a host's BMC answers, for the power cycle of a trial that never answers.

    gpuhost_bmc:
      protocol: redfish            # or ipmi (IPMI 2.0 over LAN)
      address: https://10.0.9.11   # Redfish: https://host[:port] or host[:port]; IPMI: host[:port]
      user: gpuhost-power
      password_env: GPU01_BMC_PASSWORD   # or a vaulted gpuhost_bmc_password, never both
      verify_tls: true             # Redfish; default true
      ca_bundle: /etc/gpuhost/bmc-ca.pem  # Redfish; a PEM file on the controller
      system: System.Embedded.1    # Redfish; only for a BMC that manages several systems
      chassis_control: power-cycle # IPMI; or hard-reset

Validated with the rest of the inventory, before anything connects. The password itself is read only
when the BMC is used (`bmc_password`): from the vaulted variable or the named environment variable,
never from a command line, and no message here quotes it.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpuhost.errors import InputError
from gpuhost.transport.bmc import IPMI_PORT, BmcEndpoint, BmcProtocol

BMC_VARIABLE = "gpuhost_bmc"
PASSWORD_VARIABLE = "gpuhost_bmc_password"  # noqa: S105 (the variable's name, not a password)
# What the controller keeps of a vaulted gpuhost_bmc_password when it reads the inventory: that it is
# set. The inventory is read without the vault's secret; the playbook decrypts it when it needs it.
PASSWORD_NOT_READ = "(set; read only when the BMC is used)"  # noqa: S105 (a placeholder)
# ... and of one written in clear (neither vaulted nor a template that names a vaulted one): refused.
PASSWORD_IN_CLEAR = "(set in clear; refused)"  # noqa: S105 (a placeholder)
_KEYS = frozenset(
    {"protocol", "address", "user", "password_env", "verify_tls", "ca_bundle", "system", "chassis_control"}
)
# IPMI's chassis control: power cycle (default; a hard reset where the BMC does not support it) or hard reset.
CHASSIS_CONTROLS = ("power-cycle", "hard-reset")
_HOSTNAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)
_HOST_PORT = re.compile(r"^(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[^:/\[\]]+))(?::(?P<port>[0-9]{1,5}))?$")
_USER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_SYSTEM = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")
_FIX = "See docs/bmc.md for gpuhost_bmc's keys."


def password_marker(value: object) -> str:
    """What the controller keeps of the inventory's gpuhost_bmc_password (never the value): vaulted, or a
    template (`{{ vault_bmc_password }}`) that the playbook resolves, or written in clear."""
    if isinstance(value, str) and "{{" not in value and not _decrypted_from_vault(value):
        return PASSWORD_IN_CLEAR
    return PASSWORD_NOT_READ


def _decrypted_from_vault(value: str) -> bool:
    try:
        from ansible.parsing.vault import VaultedValue
    except ImportError:  # an Ansible without data tags: a vaulted value is never a plain str there
        return False
    return bool(VaultedValue.is_tagged_on(value))


def parse_bmc(variables: Mapping[str, Any], where: str) -> BmcEndpoint | None:
    """The host's `gpuhost_bmc`, validated (InputError naming `where`, the key and the fix; a value that
    may hold a secret, its address, user or password, is shown redacted, never as it is);
    None when the host has none (a trial that never answers is then reported unreachable)."""
    if variables.get(PASSWORD_VARIABLE) == PASSWORD_IN_CLEAR:
        raise InputError(
            f"{where}: {PASSWORD_VARIABLE} is written in clear in the inventory (its value is not shown). "
            f"Encrypt it (ansible-vault encrypt_string --name {PASSWORD_VARIABLE}) or name an environment "
            f"variable in gpuhost_bmc.password_env instead, and change the BMC password if the file was shared."
        )
    value = variables.get(BMC_VARIABLE)
    if value is None:
        if variables.get(PASSWORD_VARIABLE) is not None:
            raise InputError(
                f"{where}: {PASSWORD_VARIABLE} is set but {BMC_VARIABLE} is not. Set {BMC_VARIABLE} too. {_FIX}"
            )
        return None
    where = f"{where}: {BMC_VARIABLE}"
    if not isinstance(value, Mapping):
        raise InputError(
            f"{where}: a mapping (protocol, address, user, ...) is required, not {_redacted(value)}. {_FIX}"
        )
    unknown = sorted(str(key) for key in value if key not in _KEYS)
    if unknown:
        raise InputError(
            f"{where}: unknown key(s) {', '.join(_quoted(key) for key in unknown)}; known: {', '.join(sorted(_KEYS))}. "
            "The password is never a key here: use a vaulted gpuhost_bmc_password or password_env."
        )
    protocol = _protocol(value.get("protocol"), f"{where}.protocol")
    host, port = _address(value.get("address"), protocol, f"{where}.address")
    user = value.get("user")
    if not isinstance(user, str) or not _USER.fullmatch(user):
        raise InputError(
            f"{where}.user: {_redacted(user)} is not a BMC user name (letters, digits, '_', '.', '@', '-'; "
            "at most 64). Fix gpuhost_bmc.user."
        )
    password_env = value.get("password_env")
    if password_env is not None and (not isinstance(password_env, str) or not _ENV_NAME.fullmatch(password_env)):
        raise InputError(
            f"{where}.password_env: {_redacted(password_env)} is not an environment variable name "
            "(letters, digits, '_'; not starting with a digit). Fix gpuhost_bmc.password_env."
        )
    vaulted = variables.get(PASSWORD_VARIABLE) is not None
    if vaulted and password_env is not None:
        raise InputError(
            f"{where}: both {PASSWORD_VARIABLE} and password_env are set; keep one "
            "(a vaulted gpuhost_bmc_password, or the name of an environment variable)."
        )
    if not vaulted and password_env is None:
        raise InputError(
            f"{where}: no password source. Set a vaulted {PASSWORD_VARIABLE} (ansible-vault encrypt_string) "
            "or gpuhost_bmc.password_env (the name of an environment variable on the controller)."
        )
    verify_tls = value.get("verify_tls", True)
    if not isinstance(verify_tls, bool):
        raise InputError(f"{where}.verify_tls: {_quoted(verify_tls)} is not true or false. Fix gpuhost_bmc.verify_tls.")
    ca_bundle = value.get("ca_bundle")
    system = value.get("system")
    chassis_control = value.get("chassis_control", CHASSIS_CONTROLS[0])
    if chassis_control not in CHASSIS_CONTROLS:
        raise InputError(
            f"{where}.chassis_control: {_quoted(chassis_control)} is not one of {', '.join(CHASSIS_CONTROLS)}. "
            "Fix gpuhost_bmc.chassis_control."
        )
    if protocol is BmcProtocol.REDFISH and "chassis_control" in value:
        raise InputError(f"{where}.chassis_control: applies to IPMI only; remove it for protocol redfish.")
    if protocol is BmcProtocol.IPMI:
        for key in ("ca_bundle", "system"):
            if value.get(key) is not None:
                raise InputError(f"{where}.{key}: applies to Redfish only; remove it for protocol ipmi.")
        if "verify_tls" in value:
            raise InputError(f"{where}.verify_tls: applies to Redfish only; remove it for protocol ipmi.")
    if ca_bundle is not None:
        ca_bundle = _ca_bundle(ca_bundle, f"{where}.ca_bundle")
        if not verify_tls:
            raise InputError(
                f"{where}: ca_bundle with verify_tls: false; keep one (verification with the bundle, or none)."
            )
    if system is not None and (not isinstance(system, str) or not _SYSTEM.fullmatch(system)):
        raise InputError(
            f"{where}.system: {_quoted(system)} is not a Redfish system id (the last part of its "
            "/redfish/v1/Systems/ path: letters, digits, '_', '.', ':', '-'). Fix gpuhost_bmc.system."
        )
    return BmcEndpoint(
        protocol=protocol,
        host=host,
        port=port,
        user=user,
        verify_tls=verify_tls,
        ca_bundle=ca_bundle,
        system=system,
        password_env=password_env,
        ipmi_hard_reset=chassis_control == "hard-reset",
    )


def bmc_password(endpoint: BmcEndpoint, vaulted: object, where: str, environ: Mapping[str, str] | None = None) -> str:
    """The BMC's password: the vaulted gpuhost_bmc_password (`vaulted`, already decrypted) or the
    environment variable gpuhost_bmc.password_env names. Its messages name the source, never the value."""
    if endpoint.password_env is not None:
        environ = os.environ if environ is None else environ
        password = environ.get(endpoint.password_env, "")
        if not password:
            raise InputError(
                f"{where}: gpuhost_bmc.password_env names {endpoint.password_env}, which is not set (or empty) "
                "in the controller's environment. Export it before the run (an AWX credential can inject it)."
            )
        return password
    if not isinstance(vaulted, str) or not vaulted or vaulted == PASSWORD_NOT_READ:
        raise InputError(
            f"{where}: {PASSWORD_VARIABLE} could not be read (is the vault's password given to the run, "
            "e.g. ANSIBLE_VAULT_PASSWORD_FILE?)."
        )
    return vaulted


def check_password_source(endpoint: BmcEndpoint, where: str, environ: Mapping[str, str] | None = None) -> None:
    """Before a rollout (and its --check), before anything connects: the environment variable
    gpuhost_bmc.password_env names is set, or, for a vaulted password, a vault password is given to the
    run. Ansible decrypts it only when the BMC must power-cycle the host, when no one can be asked."""
    if endpoint.password_env is not None:
        bmc_password(endpoint, None, where, environ)
    elif not _vault_password_given():
        raise InputError(
            f"{where}: {PASSWORD_VARIABLE} is vaulted, but no vault password is given to the run: Ansible "
            "would need it only when the BMC must power-cycle the host, and nothing may ask for it then. Give "
            "it as ANSIBLE_VAULT_PASSWORD_FILE (or vault_password_file / vault_identity_list in ansible.cfg)."
        )


def _vault_password_given() -> bool:
    """Whether Ansible's settings (the environment, then ansible.cfg, read now) name a vault password source."""
    try:
        from ansible.constants import config
    except ImportError:
        return False
    return any(config.get_config_value(name) for name in ("DEFAULT_VAULT_PASSWORD_FILE", "DEFAULT_VAULT_IDENTITY_LIST"))


def _protocol(value: object, where: str) -> BmcProtocol:
    for protocol in BmcProtocol:
        if value == protocol.value:
            return protocol
    choices = ", ".join(protocol.value for protocol in BmcProtocol)
    raise InputError(f"{where}: {_quoted(value)} is not one of {choices}. Fix gpuhost_bmc.protocol.")


def _address(value: object, protocol: BmcProtocol, where: str) -> tuple[str, int]:
    """(host, port): `https://host[:port]` or `host[:port]` for Redfish, `host[:port]` for IPMI."""
    fix = (
        "Write https://host[:port] or host[:port] (e.g. https://10.0.9.11 or bmc-gpu01.example:8443)."
        if protocol is BmcProtocol.REDFISH
        else "Write host[:port] (e.g. 10.0.9.11 or bmc-gpu01.example:623)."
    )
    if not isinstance(value, str) or not value:
        raise InputError(f"{where}: {_redacted(value)} is not a BMC address. {fix}")
    if "@" in value:  # https://user:password@host: userinfo, which may be the password itself
        raise InputError(
            f"{where}: {_redacted_address(value)} holds a user (and perhaps a password) before '@'; the address "
            f"is never the place for them: put the user in gpuhost_bmc.user and the password in a vaulted "
            f"{PASSWORD_VARIABLE} or gpuhost_bmc.password_env. {fix}"
        )
    text = value
    if protocol is BmcProtocol.REDFISH:
        if text.startswith("http://"):
            raise InputError(
                f"{where}: {_quoted(value)} is plain HTTP, which would send the BMC password in the clear. {fix}"
            )
        text = text.removeprefix("https://").removesuffix("/")
    if text.count(":") > 1 and not text.startswith("["):
        raise InputError(f"{where}: {_quoted(value)}: write an IPv6 address in brackets ([fd00::9]). {fix}")
    match = _HOST_PORT.fullmatch(text)
    if match is None:
        raise InputError(f"{where}: {_quoted(value)} is not a BMC address. {fix}")
    host = match.group("v6") or match.group("host")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        if match.group("v6") or not _HOSTNAME.fullmatch(host):
            raise InputError(f"{where}: {_quoted(value)} names no host (a DNS name or an IP address). {fix}") from None
    else:
        host = str(address)
    default = 443 if protocol is BmcProtocol.REDFISH else IPMI_PORT
    port = int(match.group("port") or default)
    if not 1 <= port <= 65535:
        raise InputError(f"{where}: port {port} of {_quoted(value)} is not from 1 to 65535. {fix}")
    return host, port


def _ca_bundle(value: object, where: str) -> str:
    if not isinstance(value, str) or not value.startswith("/") or any(ord(ch) < 32 for ch in value):
        raise InputError(
            f"{where}: {_quoted(value)} is not an absolute path on the controller. Fix gpuhost_bmc.ca_bundle."
        )
    if not Path(value).is_file():
        raise InputError(f"{where}: {value!r} is not a file on the controller. Fix gpuhost_bmc.ca_bundle.")
    return value


def _redacted(value: object) -> str:
    """A value that may be a secret (typed into the wrong key), in a message: its kind and length only."""
    if isinstance(value, str):
        return f"(a value of {len(value)} characters, not shown)"
    return f"(a {type(value).__name__}, not shown)"


def _redacted_address(value: str) -> str:
    """A BMC address with what precedes '@' (user and password) replaced."""
    scheme, _, rest = value.rpartition("://") if "://" in value else ("", "", value)
    host = rest.rpartition("@")[2]
    return _quoted(f"{scheme}{'://' if scheme else ''}<user:password hidden>@{host}")


def _quoted(value: object) -> str:
    """A bad value in a message: repr, cut short (a value's newlines and escapes stay visible)."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
