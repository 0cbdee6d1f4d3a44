"""Out-of-band power through a host's BMC: Redfish (sushy) or IPMI over LAN (pyghmi).

The last resort of a trial boot: a host that has not answered by its reboot's deadline is
power-cycled once, and its one-shot boot entry brings back the old kernel. One small interface
(`power_cycle`, `power_state`) over both protocols, with typed errors that each say which host,
which BMC and what to fix. The password is an argument, never part of an endpoint, a message or a
result: every message that leaves this module goes through `_scrubbed` as a second guard.
"""

from __future__ import annotations

import enum
import json
import ssl
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from gpuhost.errors import GpuhostError, MissingDependencyError

IPMI_PORT = 623
# Seconds one BMC request may take (connect and answer), and how long a Redfish ForceOff may take to
# show as Off before the On is sent. A BMC that answers slower than this is reported unreachable.
DEFAULT_TIMEOUT_S = 20.0
POWER_OFF_WAIT_S = 60.0
_POLL_S = 1.0


class BmcProtocol(str, enum.Enum):
    REDFISH = "redfish"
    IPMI = "ipmi"


class PowerState(str, enum.Enum):
    ON = "on"
    OFF = "off"
    UNKNOWN = "unknown"  # a state the BMC reports that is neither (Redfish's PoweringOn, ...)


@dataclass(frozen=True)
class BmcEndpoint:
    """Where a host's BMC answers and as whom; validated by gpuhost.inventory.bmc."""

    protocol: BmcProtocol
    host: str  # name or IP address (an IPv6 address without brackets)
    port: int  # 443 (Redfish) or 623 (IPMI) unless the inventory says otherwise
    user: str
    verify_tls: bool = True  # Redfish only
    ca_bundle: str | None = None  # Redfish only: a PEM file on the controller; None: the system's CAs
    system: str | None = None  # Redfish only: the system's id when the BMC manages several
    password_env: str | None = None  # the environment variable holding the password; None: Ansible Vault
    # IPMI only: chassis hard reset instead of power cycle (a BMC whose power cycle leaves the host off,
    # as OpenIPMI's ipmi_sim does for a QEMU it did not start).
    ipmi_hard_reset: bool = False

    @property
    def url(self) -> str:
        """The BMC as a person reads it in a message (no user, no password)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        if self.protocol is BmcProtocol.REDFISH:
            return f"https://{host}" + ("" if self.port == 443 else f":{self.port}")
        return f"ipmi://{host}" + ("" if self.port == IPMI_PORT else f":{self.port}")


class BmcErrorKind(str, enum.Enum):
    UNREACHABLE = "unreachable"
    CREDENTIALS = "wrong credentials"
    TLS = "TLS error"
    UNSUPPORTED = "unsupported action"


class BmcError(GpuhostError):
    """A BMC that could not power-cycle (or report on) a host: which host, which BMC, why, the fix."""

    kind: BmcErrorKind

    def __init__(self, host: str, endpoint: BmcEndpoint, detail: str, fix: str) -> None:
        super().__init__(
            f"host {host}: BMC {endpoint.url} ({endpoint.protocol.value}): {self.kind.value}: {detail} {fix}"
        )
        self.host = host


class BmcUnreachable(BmcError):
    kind = BmcErrorKind.UNREACHABLE


class BmcCredentialsRejected(BmcError):
    kind = BmcErrorKind.CREDENTIALS


class BmcTlsError(BmcError):
    kind = BmcErrorKind.TLS


class BmcUnsupported(BmcError):
    kind = BmcErrorKind.UNSUPPORTED


@dataclass(frozen=True)
class PowerCycle:
    """A power cycle the BMC accepted: what was sent, and when (UTC)."""

    action: str  # 'ForceRestart', 'ForceOff+On', 'On' (Redfish); 'chassis power cycle', 'chassis power on' (IPMI)
    state_before: PowerState
    sent_at: datetime


def power_cycle(endpoint: BmcEndpoint, password: str, host: str, timeout: float = DEFAULT_TIMEOUT_S) -> PowerCycle:
    """Power-cycle `host` once through its BMC: a host that is off is powered on. Raises BmcError."""
    cycle: PowerCycle = _guarded(endpoint, password, host, timeout, _redfish_cycle, _ipmi_cycle)
    return cycle


def power_state(endpoint: BmcEndpoint, password: str, host: str, timeout: float = DEFAULT_TIMEOUT_S) -> PowerState:
    """The host's power state as its BMC reports it. Raises BmcError."""
    state: PowerState = _guarded(endpoint, password, host, timeout, _redfish_state, _ipmi_state)
    return state


def _guarded(
    endpoint: BmcEndpoint,
    password: str,
    host: str,
    timeout: float,
    redfish: Callable[[Any, BmcEndpoint, str], Any],
    ipmi: Callable[[Any, BmcEndpoint, str], Any],
) -> Any:
    """Run the protocol's operation; every error, the library's included, becomes a BmcError whose
    message cannot carry the password."""
    try:
        if endpoint.protocol is BmcProtocol.REDFISH:
            return redfish(_redfish_system(endpoint, password, host, timeout), endpoint, host)
        return _ipmi_isolated(ipmi, endpoint, password, host, timeout)
    except BmcError as error:
        raise _rescrubbed(error, password) from None
    except MissingDependencyError:
        raise
    except Exception as error:  # a library's own error type or a bug: still one host's error, never the run's
        raise _classified(endpoint, host, error, password) from None


def _rescrubbed(error: BmcError, password: str) -> BmcError:
    error.args = (_scrubbed(str(error), password),)
    return error


def _scrubbed(text: str, password: str) -> str:
    return text.replace(password, "********") if password else text


def _classified(endpoint: BmcEndpoint, host: str, error: Exception, password: str) -> BmcError:
    """A library's exception as the BmcError a person can act on, by the exceptions it chains."""
    detail = _scrubbed(f"{type(error).__name__}: {error}", password)
    chain = _chain(error)
    names = " ".join(type(link).__name__ for link in chain)
    if any(isinstance(link, ssl.SSLError) for link in chain) or "SSLError" in names:
        return BmcTlsError(
            host,
            endpoint,
            detail,
            "Fix: give the BMC's CA certificate as gpuhost_bmc.ca_bundle, or set gpuhost_bmc.verify_tls: false "
            "for a BMC with a self-signed certificate on a trusted network.",
        )
    if "AccessError" in names or any(code in str(error) for code in ("401", "403")):
        return BmcCredentialsRejected(
            host,
            endpoint,
            detail,
            "Fix gpuhost_bmc.user and the password (gpuhost_bmc_password or gpuhost_bmc.password_env).",
        )
    if any(isinstance(link, OSError) for link in chain) or "ConnectionError" in names or "Timeout" in names:
        return BmcUnreachable(
            host,
            endpoint,
            detail,
            "Fix gpuhost_bmc.address (and port), or check that the controller can reach the BMC's network.",
        )
    return BmcUnsupported(
        host, endpoint, f"the BMC's answer could not be used ({detail}).", "Power-cycle the host by hand."
    )


def _chain(error: BaseException) -> list[BaseException]:
    """`error` and the exceptions it was raised from or while handling, each once."""
    chain: list[BaseException] = []
    link: BaseException | None = error
    while link is not None and link not in chain:
        chain.append(link)
        link = link.__cause__ or link.__context__
    return chain


# -- Redfish (sushy) -----------------------------------------------------------------------------


def _redfish_system(endpoint: BmcEndpoint, password: str, host: str, timeout: float) -> Any:
    try:
        import sushy
        from sushy import exceptions as sushy_errors
    except ImportError as error:
        raise MissingDependencyError("sushy", "controller", "Power-cycling a host through Redfish") from error
    verify: bool | str = endpoint.ca_bundle if endpoint.ca_bundle and endpoint.verify_tls else endpoint.verify_tls
    try:
        root = sushy.Sushy(
            endpoint.url,
            verify=verify,
            auth=sushy.auth.BasicAuth(endpoint.user, password),
            # A BMC's 5xx is retried a little; one that does not answer fails within `timeout`.
            server_side_retries=1,
            server_side_retries_delay=1,
            read_timeout=timeout,
            connect_timeout=timeout,
        )
        if endpoint.system:
            return root.get_system(f"{root.get_system_collection().path.rstrip('/')}/{endpoint.system}")
        members = root.get_system_collection().members_identities
        if len(members) != 1:
            raise BmcUnsupported(
                host,
                endpoint,
                f"the BMC manages {len(members)} systems ({', '.join(sorted(members)) or 'none'}).",
                "Fix: name the host's one as gpuhost_bmc.system (the last part of its /redfish/v1/Systems/ path).",
            )
        return root.get_system(next(iter(members)))
    except sushy_errors.AccessError as error:
        raise BmcCredentialsRejected(
            host,
            endpoint,
            f"the BMC refused the user {endpoint.user!r} (HTTP {error.status_code}).",
            "Fix gpuhost_bmc.user and the password (gpuhost_bmc_password or gpuhost_bmc.password_env).",
        ) from None
    except sushy_errors.ResourceNotFoundError:
        raise BmcUnsupported(
            host,
            endpoint,
            f"the BMC has no system {endpoint.system!r}.",
            "Fix gpuhost_bmc.system (the last part of the host's /redfish/v1/Systems/ path).",
        ) from None


_REDFISH_STATES = {"on": PowerState.ON, "off": PowerState.OFF}


def _redfish_word(value: object) -> str:
    """Redfish's own word for one of sushy's enum members ('ForceRestart', 'On'), or the text itself."""
    return str(getattr(value, "value", value) or "")


def _redfish_state(system: Any, endpoint: BmcEndpoint, host: str) -> PowerState:
    system.refresh(force=True)
    return _REDFISH_STATES.get(_redfish_word(system.power_state).lower(), PowerState.UNKNOWN)


def _redfish_cycle(system: Any, endpoint: BmcEndpoint, host: str) -> PowerCycle:
    import sushy

    before = _redfish_state(system, endpoint, host)
    allowed = {_redfish_word(value) for value in system.get_allowed_reset_system_values()}
    on = next((value for value in ("On", "ForceOn") if value in allowed), None)
    if before is PowerState.OFF and on:
        sent_at = _now()
        system.reset_system(sushy.ResetType(on))
        return PowerCycle(on, before, sent_at)
    if "ForceRestart" in allowed:
        sent_at = _now()
        system.reset_system(sushy.ResetType.FORCE_RESTART)
        return PowerCycle("ForceRestart", before, sent_at)
    if "ForceOff" in allowed and on:
        sent_at = _now()
        system.reset_system(sushy.ResetType.FORCE_OFF)
        deadline = time.monotonic() + POWER_OFF_WAIT_S
        while _redfish_state(system, endpoint, host) is not PowerState.OFF:
            if time.monotonic() > deadline:
                raise BmcUnsupported(
                    host,
                    endpoint,
                    f"the system did not show as Off within {POWER_OFF_WAIT_S:.0f} s of ForceOff; On was not sent.",
                    "Power the host on by hand, and check the BMC's event log.",
                )
            time.sleep(_POLL_S)
        system.reset_system(sushy.ResetType(on))
        return PowerCycle(f"ForceOff+{on}", before, sent_at)
    raise BmcUnsupported(
        host,
        endpoint,
        f"the system allows the resets {', '.join(sorted(allowed)) or 'none'}: "
        "neither ForceRestart nor ForceOff with On.",
        "Power-cycle the host by hand; gpuhost cannot through this BMC.",
    )


# -- IPMI over LAN (pyghmi) ----------------------------------------------------------------------

_CHASSIS_CONTROL = (0x00, 0x02)  # netfn chassis, Chassis Control
_POWER_ON, _POWER_CYCLE, _HARD_RESET = 0x01, 0x02, 0x03
_INVALID_DATA_FIELD = 0xCC


def _ipmi_session(endpoint: BmcEndpoint, password: str, host: str) -> Any:
    try:
        from pyghmi import exceptions as ipmi_errors
        from pyghmi.ipmi import command
    except ImportError as error:
        raise MissingDependencyError("pyghmi", "controller", "Power-cycling a host through IPMI") from error
    try:
        session = command.Command(
            bmc=endpoint.host, userid=endpoint.user, password=password, port=endpoint.port, keepalive=False
        )
    except ipmi_errors.IpmiException as error:
        text = str(error).lower()
        if "password" in text or "unauthorized" in text or "user" in text or "privilege" in text:
            raise BmcCredentialsRejected(
                host,
                endpoint,
                f"the BMC refused the user {endpoint.user!r} ({error}).",
                "Fix gpuhost_bmc.user and the password (gpuhost_bmc_password or gpuhost_bmc.password_env).",
            ) from None
        raise BmcUnreachable(
            host,
            endpoint,
            f"no IPMI session ({error if str(error) not in ('', 'None') else 'no answer'}).",
            "Fix gpuhost_bmc.address (and port), or check that the controller can reach the BMC's network "
            "and that IPMI over LAN is enabled on the BMC.",
        ) from None
    return session


def _ipmi_isolated(
    operation: Callable[[Any, BmcEndpoint, str], Any], endpoint: BmcEndpoint, password: str, host: str, timeout: float
) -> Any:
    """Run one IPMI operation in a child Python (`python -m gpuhost.transport.bmc`, the request and
    password on its standard input, never its command line), killed at `timeout`.

    pyghmi keeps its sessions in class-level caches shared by the whole process: a second Command to
    the same BMC waited forever (measured against OpenIPMI's ipmi_sim), and its waits have no bound of
    their own. A process per operation is bounded, and leaves nothing behind."""
    request = {
        "operation": operation.__name__,
        "endpoint": {**endpoint.__dict__, "protocol": endpoint.protocol.value},
        "host": host,
        "password": password,
    }
    try:
        done = subprocess.run(
            [sys.executable, "-m", "gpuhost.transport.bmc"],
            input=json.dumps(request),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise BmcUnreachable(
            host,
            endpoint,
            f"no answer within {timeout:.0f} s.",
            "Fix gpuhost_bmc.address (and port), or check that the controller can reach the BMC's network "
            "and that IPMI over LAN is enabled on the BMC.",
        ) from None
    try:
        answer = json.loads(done.stdout)
    except ValueError:
        answer = {
            "error": BmcErrorKind.UNREACHABLE.value,
            "message": f"the IPMI client stopped (exit code {done.returncode}).",
        }
    if "error" in answer:
        raise _rebuilt(BmcErrorKind(answer["error"]), host, str(answer["message"]))
    if "cycle" in answer:
        cycle = answer["cycle"]
        return PowerCycle(
            str(cycle["action"]), PowerState(cycle["state_before"]), datetime.fromisoformat(cycle["sent_at"])
        )
    return PowerState(answer["state"])


def _rebuilt(kind: BmcErrorKind, host: str, message: str) -> BmcError:
    """The child's BmcError, with its message as the child wrote it."""
    error_type = next(
        cls for cls in (BmcUnreachable, BmcCredentialsRejected, BmcTlsError, BmcUnsupported) if cls.kind is kind
    )
    error = error_type.__new__(error_type)
    GpuhostError.__init__(error, message)
    error.host = host
    return error


def _ipmi_child() -> None:
    """The child of _ipmi_isolated: one request on standard input, one answer on standard output."""
    request = json.load(sys.stdin)
    fields = dict(request["endpoint"])
    endpoint = BmcEndpoint(**{**fields, "protocol": BmcProtocol(fields["protocol"])})
    password, host = str(request["password"]), str(request["host"])
    operation = {"_ipmi_state": _ipmi_state, "_ipmi_cycle": _ipmi_cycle}[request["operation"]]
    try:
        result: object = operation(_ipmi_session(endpoint, password, host), endpoint, host)
    except BmcError as error:
        answer: dict[str, Any] = {"error": error.kind.value, "message": _scrubbed(str(error), password)}
    except Exception as error:  # pyghmi's own errors after the session opened
        classified = _classified(endpoint, host, error, password)
        answer = {"error": classified.kind.value, "message": str(classified)}
    else:
        if isinstance(result, PowerCycle):
            answer = {
                "cycle": {
                    "action": result.action,
                    "state_before": result.state_before.value,
                    "sent_at": result.sent_at.isoformat(),
                }
            }
        elif isinstance(result, PowerState):
            answer = {"state": result.value}
    json.dump(answer, sys.stdout)


def _ipmi_state(session: Any, endpoint: BmcEndpoint, host: str) -> PowerState:
    state = str(session.get_power().get("powerstate", ""))
    return _REDFISH_STATES.get(state, PowerState.UNKNOWN)


def _ipmi_cycle(session: Any, endpoint: BmcEndpoint, host: str) -> PowerCycle:
    before = _ipmi_state(session, endpoint, host)
    # Chassis power cycle is a no-op on a chassis that is off (IPMI 2.0, 28.3): power it on instead.
    # Power cycle is optional in IPMI: a BMC that answers 0xCC to it gets a hard reset.
    if before is PowerState.OFF:
        attempts = [(_POWER_ON, "chassis power on")]
    elif endpoint.ipmi_hard_reset:
        attempts = [(_HARD_RESET, "chassis hard reset")]
    else:
        attempts = [(_POWER_CYCLE, "chassis power cycle"), (_HARD_RESET, "chassis hard reset")]
    for directive, action in attempts:
        sent_at = _now()
        response = session.raw_command(netfn=_CHASSIS_CONTROL[0], command=_CHASSIS_CONTROL[1], data=[directive])
        code = response.get("code") or 0
        if code == 0:
            return PowerCycle(action, before, sent_at)
        if code != _INVALID_DATA_FIELD:
            break
    raise BmcUnsupported(
        host,
        endpoint,
        f"the BMC answered {action} with completion code {code:#04x} ({response.get('error', '')}).",
        "Power-cycle the host by hand; check the BMC user's privilege (it needs OPERATOR or ADMINISTRATOR).",
    )


def _now() -> datetime:
    return datetime.now(timezone.utc)


if __name__ == "__main__":
    _ipmi_child()
