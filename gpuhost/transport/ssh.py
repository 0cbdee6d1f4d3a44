"""SSH through paramiko: the only module that imports it.

Host keys are verified against known_hosts and unknown keys are refused unless the operator
opts in to accept-new (like OpenSSH's StrictHostKeyChecking=accept-new); a changed key always
aborts. Agent forwarding is never requested. Each command is one exec channel, with its input
sent on stdin, so an audit costs one round trip after the connection is up.
"""

from __future__ import annotations

import base64
import binascii
import logging
import shlex
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuhost.errors import MissingDependencyError
from gpuhost.transport import CommandResult, TransportError

if TYPE_CHECKING:
    import paramiko

DEFAULT_KNOWN_HOSTS = Path("~/.ssh/known_hosts")
SYSTEM_KNOWN_HOSTS = Path("/etc/ssh/ssh_known_hosts")
_known_hosts_lock = threading.Lock()
# What one command may send back. A gather archive is a few MiB compressed; a host streaming
# without end must cost a clear per-host error, not the controller's memory.
MAX_STDOUT_BYTES = 64 * 1024 * 1024
MAX_STDERR_BYTES = 1024 * 1024

# paramiko logs a traceback at ERROR for every failed handshake (a non-SSH listener, a dropped
# connection); with no handler, logging's last resort prints it on stderr. The failure reaches the
# user once, as that host's TransportError.
logging.getLogger("paramiko").addHandler(logging.NullHandler())
logging.getLogger("paramiko").propagate = False


@dataclass(frozen=True)
class SshOptions:
    host: str
    port: int = 22
    user: str = "root"
    key_file: Path | None = None
    known_hosts_file: Path | None = None
    accept_new_host_keys: bool = False
    connect_timeout: float = 15.0
    become: bool = True  # use sudo -n when the user is not root
    # An already open stream to the server instead of a TCP connection, e.g. a jump host's
    # direct-tcpip channel (`SshTransport.open_tunnel`). The host key is still verified, under
    # `host` (and `port`) as named in known_hosts.
    sock: Any = field(default=None, compare=False, repr=False)

    @property
    def url(self) -> str:
        return f"ssh://{self.user}@{self.host}:{self.port}"


def _import_paramiko() -> Any:
    try:
        import paramiko
    except ImportError as error:
        raise MissingDependencyError("paramiko", "controller", "Auditing hosts over SSH") from error
    return paramiko


def _known_hosts_name(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


class SshTransport:
    def __init__(self, options: SshOptions) -> None:
        self.options = options
        self._round_trips = 0
        self._client = self._connect()

    @property
    def description(self) -> str:
        return self.options.url

    @property
    def round_trips(self) -> int:
        return self._round_trips

    def _known_hosts_path(self) -> Path:
        return (self.options.known_hosts_file or DEFAULT_KNOWN_HOSTS).expanduser()

    def _connect(self) -> paramiko.SSHClient:
        ssh_lib = _import_paramiko()
        options = self.options
        client: paramiko.SSHClient = ssh_lib.SSHClient()
        known_hosts = self._known_hosts_path()
        target = f"{options.user}@{options.host}:{options.port}"
        for path in ([SYSTEM_KNOWN_HOSTS] if options.known_hosts_file is None else []) + [known_hosts]:
            if not path.is_file():
                continue
            try:
                load = client.load_host_keys if path == known_hosts else client.load_system_host_keys
                load(str(path))
            except (ssh_lib.hostkeys.InvalidHostKey, ssh_lib.SSHException, ValueError, OSError) as error:
                # InvalidHostKey carries (line, cause): name the line, not a tuple's repr.
                if isinstance(error, ssh_lib.hostkeys.InvalidHostKey):
                    detail = f"malformed line {error.line[:200]!r}"
                else:
                    detail = f"{type(error).__name__}: {error}"
                raise TransportError(
                    "input",
                    f"{target}: cannot read the known_hosts file {path}: {detail}. "
                    "Fix or remove that line (ssh-keygen -R HOST -f FILE rewrites the file).",
                ) from error
            # A hashed name's salt is decoded only when a host's key is looked up, mid-handshake,
            # where its ValueError read as an unusable private key: checked here, by the file's name.
            bad = _bad_hashed_name(path)
            if bad is not None:
                raise TransportError(
                    "input",
                    f"{target}: cannot read the known_hosts file {path}: the hashed host name {bad[:200]!r} is not "
                    "a valid salt and hash (base64 of 20 bytes each). Fix or remove that line "
                    "(ssh-keygen -R HOST -f FILE rewrites the file).",
                )
        if options.accept_new_host_keys:
            client.set_missing_host_key_policy(_accept_new_policy(ssh_lib, known_hosts))
        else:
            client.set_missing_host_key_policy(ssh_lib.RejectPolicy())
        try:
            client.connect(
                hostname=options.host,
                port=options.port,
                username=options.user,
                key_filename=str(options.key_file) if options.key_file else None,
                allow_agent=options.key_file is None,
                look_for_keys=options.key_file is None,
                timeout=options.connect_timeout,
                banner_timeout=options.connect_timeout,
                auth_timeout=options.connect_timeout,
                sock=options.sock,
            )
        except ssh_lib.BadHostKeyException as error:
            client.close()
            raise TransportError(
                "host-key-changed",
                f"{target}: the host key CHANGED (it is not the one in {known_hosts}); the host was not audited. "
                "If the host was reinstalled, remove its old line from known_hosts (ssh-keygen -R) and verify the "
                "new key; otherwise treat this as a possible attack.",
            ) from error
        except ssh_lib.AuthenticationException as error:
            client.close()
            raise TransportError(
                "auth",
                f"{target}: authentication failed ({error}). Check the user and the key "
                "(ansible_user / ansible_ssh_private_key_file, or --user / --private-key).",
            ) from error
        except ssh_lib.SSHException as error:
            client.close()
            if options.key_file is not None and _is_key_error(error):
                raise TransportError(
                    "auth", f"{target}: the private key {options.key_file} cannot be used: {error}. {_KEY_FIX}"
                ) from error
            # The server accepted TCP, then said nothing in time: no banner (paramiko keeps the
            # socket timeout as the context), or no session after it.
            if isinstance(error.__context__, TimeoutError) or "No existing session" in str(error):
                raise TransportError(
                    "timeout",
                    f"{target}: the SSH server did not complete the handshake within {options.connect_timeout:g} s",
                ) from error
            if "not found in known_hosts" in str(error):
                raise TransportError(
                    "host-key-unknown",
                    f"{target}: the host key is not in {known_hosts}, so the host was not audited. Verify the key "
                    "and add it (ssh-keyscan -p PORT HOST, checked against the host's console), or rerun with "
                    "--accept-new-host-keys to trust keys seen for the first time.",
                ) from error
            raise TransportError("unreachable", f"{target}: SSH failed: {error}") from error
        except TimeoutError as error:
            client.close()
            raise TransportError(
                "timeout", f"{target}: no answer within {options.connect_timeout:g} s (host down or filtered?)"
            ) from error
        except EOFError as error:
            client.close()
            raise TransportError(
                "unreachable", f"{target}: the server closed the connection during the SSH handshake (not SSH?)"
            ) from error
        except (ValueError, UnicodeDecodeError) as error:  # a garbage key file, read before any network I/O
            client.close()
            raise TransportError(
                "auth",
                f"{target}: the private key {options.key_file} cannot be read ({type(error).__name__}). {_KEY_FIX}",
            ) from error
        except OSError as error:
            client.close()
            reason = error.strerror or str(error)
            raise TransportError("unreachable", f"{target}: cannot connect: {reason}") from error
        return client

    def run(self, argv: list[str], stdin: bytes = b"", timeout: float = 120.0) -> CommandResult:
        command = shlex.join(argv)
        if self.options.become and self.options.user != "root":
            command = f"sudo -n -- {command}"
        transport = self._client.get_transport()
        if transport is None or not transport.is_active():
            raise TransportError("unreachable", f"{self.options.url}: the SSH connection closed")
        self._round_trips += 1
        ssh_lib = _import_paramiko()
        try:
            channel = transport.open_session(timeout=self.options.connect_timeout)
            try:
                channel.exec_command(command)
                if stdin:
                    channel.sendall(stdin)
                channel.shutdown_write()
                stdout, stderr = _drain(channel, timeout, self.options.url)
                status = channel.recv_exit_status()
            finally:
                channel.close()
        except (EOFError, OSError, ssh_lib.SSHException) as error:  # the server dropped us mid-command
            raise TransportError(
                "unreachable",
                f"{self.options.url}: the connection broke while running {argv[0]}: "
                + (str(error) or f"{type(error).__name__}, the server closed it"),
            ) from error
        if status != 0 and b"sudo:" in stderr and b"password" in stderr:
            raise TransportError(
                "auth",
                f"{self.options.url}: sudo asks {self.options.user} for a password. Connect as root, or allow "
                f"{self.options.user} passwordless sudo.",
            )
        return CommandResult(status, stdout, stderr)

    def open_tunnel(self, host: str, port: int) -> paramiko.Channel:
        """A direct-tcpip channel from this server to host:port (OpenSSH's ProxyJump), to pass as
        `SshOptions.sock` of the next hop. The server must allow TCP forwarding."""
        transport = self._client.get_transport()
        if transport is None or not transport.is_active():
            raise TransportError("unreachable", f"{self.options.url}: the SSH connection closed")
        ssh_lib = _import_paramiko()
        try:
            channel: paramiko.Channel = transport.open_channel(
                "direct-tcpip", (host, port), ("127.0.0.1", 0), timeout=self.options.connect_timeout
            )
        except ssh_lib.ChannelException as error:
            raise TransportError(
                "unreachable", f"{self.options.url}: cannot reach {host}:{port} through this host: {error.text}"
            ) from error
        except ssh_lib.SSHException as error:
            raise TransportError("unreachable", f"{self.options.url}: no tunnel to {host}:{port}: {error}") from error
        return channel

    def close(self) -> None:
        self._client.close()


_KEY_FIX = "Point --private-key / ansible_ssh_private_key_file at an OpenSSH private key file."


def _is_key_error(error: Exception) -> bool:
    text = str(error).lower()
    return "private key" in text or "not a valid" in text or "key cannot be used" in text or "encrypted" in text


def _drain(channel: paramiko.Channel, timeout: float, url: str) -> tuple[bytes, bytes]:
    """Read stdout and stderr until the command ends, so that neither fills its window.

    stderr is read on a thread of its own and stdout with blocking receives, so the wait costs
    no CPU: polling paramiko's channel pipe spins once a stream reached its end.
    """
    stderr_chunks: list[bytes] = []

    def read_stderr() -> None:
        while True:
            try:
                chunk = channel.recv_stderr(1 << 16)
            except TimeoutError:  # the channel's timeout applies here too; the main loop keeps time
                continue
            if not chunk:
                return
            if sum(map(len, stderr_chunks)) < MAX_STDERR_BYTES:  # keep draining, keep only the start
                stderr_chunks.append(chunk)

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    stdout = bytearray()
    deadline = time.monotonic() + timeout
    channel.settimeout(1.0)
    while True:
        try:
            chunk = channel.recv(1 << 16)
        except TimeoutError:
            if time.monotonic() > deadline:
                raise TransportError("timeout", f"{url}: the command did not finish within {timeout:g} s") from None
            continue
        if not chunk:
            break
        stdout += chunk
        if len(stdout) > MAX_STDOUT_BYTES:
            raise TransportError(
                "command",
                f"{url}: the host sent more than {MAX_STDOUT_BYTES // (1024 * 1024)} MiB of output; "
                "stopped reading (what runs there instead of the gather script?)",
            )
    reader.join(max(0.0, deadline - time.monotonic()))
    return bytes(stdout), b"".join(stderr_chunks)


def _bad_hashed_name(known_hosts: Path) -> str | None:
    """The first hashed host name ('|1|SALT|HASH') of a known_hosts file (already read by paramiko,
    so readable) whose salt or hash is not the base64 of a SHA-1 HMAC's 20 bytes."""
    for line in known_hosts.read_text(errors="replace").splitlines():
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        names = fields[1 if fields[0].startswith("@") else 0].split(",") if len(fields) > 1 else []
        for name in names:
            if not name.startswith("|1|"):
                continue
            parts = name.split("|")
            try:
                if len(parts) != 4:
                    raise ValueError(name)
                salt, digest = (base64.b64decode(part, validate=True) for part in parts[2:])
                if len(salt) != 20 or len(digest) != 20:  # SHA-1's: paramiko asserts the salt's length
                    raise ValueError(name)
            except (ValueError, binascii.Error):
                return name
    return None


def _accept_new_policy(ssh_lib: Any, known_hosts: Path) -> paramiko.MissingHostKeyPolicy:
    """Trust a key seen for the first time and record it, as OpenSSH's accept-new does.

    Only a missing key reaches a policy: paramiko raises BadHostKeyException for a changed one.
    """

    class AcceptNewPolicy(ssh_lib.MissingHostKeyPolicy):  # type: ignore[misc]
        def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
            client.get_host_keys().add(hostname, key.get_name(), key)
            try:
                with _known_hosts_lock:
                    known_hosts.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                    with known_hosts.open("a") as handle:
                        handle.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
            except OSError as error:  # not the host's fault: "unreachable: File exists" blamed it
                raise TransportError(
                    "input",
                    f"{hostname}: cannot record its new host key in {known_hosts}: {error.strerror or error}. "
                    "Fix --known-hosts / gpuhost_known_hosts_file (a file in a writable directory).",
                ) from error

    policy: paramiko.MissingHostKeyPolicy = AcceptNewPolicy()
    return policy
