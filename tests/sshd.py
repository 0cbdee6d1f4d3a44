"""A real OpenSSH server on 127.0.0.1 for tests and benchmarks: throwaway keys, nothing global.

`start_sshd(directory)` runs `/usr/sbin/sshd -D -e -f <generated config>` as root on a free
loopback port (or on `listen`, the host's address on a veth a test made for a network namespace),
with its own ed25519 host key and a client key in its own authorized_keys, and returns once the
port accepts connections. Everything it writes (keys, config, PID file, log,
known_hosts files) lives under `directory`; `Sshd.stop()` ends the server by its PID.

The log runs at LogLevel VERBOSE so callers can count what reached the server: one
"Connection from" line per TCP connection, one "Starting session:" line per exec/subsystem
channel. Tests use that to prove that no connection was made.

Used by tests/conftest.py and by benchmarks/fleet_audit.py (which imports it by path), so it
depends on nothing but the standard library.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

SSHD = Path("/usr/sbin/sshd")
SSH_KEYGEN = "ssh-keygen"
LOOPBACK = "127.0.0.1"
# sshd refuses to start without its privilege separation directory; a container that never ran
# the sshd service has none.
PRIVSEP_DIR = Path("/run/sshd")
START_TIMEOUT_S = 10.0


class SshdError(RuntimeError):
    """The server could not be started; the message carries its log."""


def generate_key(path: Path, comment: str = "gpuhost-test") -> Path:
    """A new passphrase-less ed25519 key pair at `path` and `path`.pub."""
    path.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        stdin=subprocess.DEVNULL,
        capture_output=True,
    )
    return path


def public_key(path: Path) -> str:
    """'ssh-ed25519 AAAA...' of a key pair (the comment dropped)."""
    algorithm, blob = Path(f"{path}.pub").read_text().split()[:2]
    return f"{algorithm} {blob}"


def free_port(address: str = LOOPBACK) -> int:
    """A port nobody listens on right now at `address` (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((address, 0))
        return int(probe.getsockname()[1])


def known_hosts_line(port: int, key: str, host: str = LOOPBACK) -> str:
    name = host if port == 22 else f"[{host}]:{port}"
    return f"{name} {key}\n"


def is_listening(port: int, address: str = LOOPBACK) -> bool:
    """Whether something listens on ADDRESS:PORT, read from /proc/net/tcp.

    Connecting to find out would show up in the server's log as a connection, and tests count
    those to prove that gpuhost made none.
    """
    # /proc/net/tcp writes the address as the host-order hex of its 32-bit value.
    wanted = f"{int.from_bytes(socket.inet_aton(address), 'little'):08X}:{port:04X}"
    with Path("/proc/net/tcp").open() as table:
        next(table)
        for line in table:
            fields = line.split()
            if fields[1] == wanted and fields[3] == "0A":  # 0A: TCP_LISTEN
                return True
    return False


@dataclass
class Sshd:
    directory: Path
    port: int
    process: subprocess.Popen[bytes]
    host_key: Path
    client_key: Path
    log_path: Path
    address: str = LOOPBACK
    _stopped: bool = field(default=False, repr=False)

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def host_public_key(self) -> str:
        return public_key(self.host_key)

    @property
    def target(self) -> str:
        """The ad-hoc host spec gpuhost takes: root@ADDRESS:PORT (127.0.0.1 unless started on another)."""
        return f"root@{self.address}:{self.port}"

    def write_known_hosts(self, path: Path, port: int | None = None) -> Path:
        """A known_hosts file with this server's real host key for [ADDRESS]:PORT.

        `port` names another port (a proxy in front of this server) to write the key for.
        """
        path.write_text(known_hosts_line(port or self.port, self.host_public_key, self.address))
        return path

    def ansible_host(self, known_hosts: Path) -> dict[str, object]:
        """An Ansible inventory host for this server as root, its key checked against `known_hosts`."""
        return {
            "ansible_host": self.address,
            "ansible_port": self.port,
            "ansible_user": "root",
            "ansible_ssh_private_key_file": str(self.client_key),
            "ansible_python_interpreter": "/usr/bin/python3",
            "gpuhost_known_hosts_file": str(known_hosts),
        }

    def write_wrong_known_hosts(self, path: Path, port: int | None = None) -> Path:
        """A known_hosts file that claims a different (freshly generated) key for this server."""
        other = generate_key(self.directory / f"impostor-{path.name}", comment="not-this-server")
        path.write_text(known_hosts_line(port or self.port, public_key(other), self.address))
        return path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def connections(self) -> int:
        """TCP connections the server has accepted so far (from its log)."""
        return self.log().count("Connection from ")

    def sessions(self) -> int:
        """Exec/subsystem/shell channels started so far (from its log)."""
        return self.log().count("Starting session:")

    def stop(self) -> None:
        """End the listener by its PID; its per-connection children exit with their connections."""
        if self._stopped:
            return
        self._stopped = True
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=5)


def sshd_config(
    directory: Path,
    port: int,
    host_key: Path,
    authorized_keys: Path,
    pid_file: Path,
    *,
    listen: str = LOOPBACK,
    local_forwarding: bool = False,
) -> str:
    return "\n".join(
        [
            f"Port {port}",
            f"ListenAddress {listen}",
            f"HostKey {host_key}",
            f"PidFile {pid_file}",
            f"AuthorizedKeysFile {authorized_keys}",
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            # The throwaway files live in a temporary directory whose modes StrictModes would reject.
            "StrictModes no",
            "UsePAM no",
            "AllowAgentForwarding no",
            # `local`: the SSH jump to a guest behind the host (a direct-tcpip channel), nothing else.
            f"AllowTcpForwarding {'local' if local_forwarding else 'no'}",
            "X11Forwarding no",
            "PrintMotd no",
            "UseDNS no",
            "LogLevel VERBOSE",
            # bash sources ~/.bashrc for commands run by sshd when SHLVL is unset; on a developer
            # machine that can cost half a second per command (pyenv init), which would measure
            # the operator's shell start-up instead of gpuhost or Ansible. SHLVL=1 skips it.
            "SetEnv SHLVL=1",
            # Ansible's fact gathering copies its module over SFTP.
            "Subsystem sftp internal-sftp",
            # A benchmark opens many connections at once; the default (10:30:100) drops some.
            "MaxStartups 200",
            "MaxSessions 64",
            "",
        ]
    )


def start_sshd(
    directory: Path,
    *,
    client_key: Path | None = None,
    port: int | None = None,
    name: str = "sshd",
    timeout: float = START_TIMEOUT_S,
    listen: str = LOOPBACK,
    local_forwarding: bool = False,
) -> Sshd:
    """Start an sshd under `directory`/`name` and wait until its port accepts connections.

    `client_key` (a private key whose .pub exists) is authorised; without one a new key is made.
    The caller must call `stop()` (the fixtures and the benchmark do, in finally blocks).
    """
    if os.geteuid() != 0:
        raise SshdError("the test sshd logs in as root and must be started by root")
    if not SSHD.is_file():
        raise SshdError(f"{SSHD} is missing: install openssh-server")
    PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)
    home = directory / name
    home.mkdir(parents=True, exist_ok=False)
    host_key = generate_key(home / "ssh_host_ed25519_key", comment=f"{name}-host")
    if client_key is None:
        client_key = generate_key(home / "client_ed25519", comment=f"{name}-client")
    authorized_keys = home / "authorized_keys"
    authorized_keys.write_text(public_key(client_key) + "\n")
    pid_file = home / "sshd.pid"
    log_path = home / "sshd.log"
    config = home / "sshd_config"
    for attempt in range(5):
        chosen = port or free_port(listen)
        config.write_text(
            sshd_config(
                home, chosen, host_key, authorized_keys, pid_file, listen=listen, local_forwarding=local_forwarding
            )
        )
        # Fail fast on a bad configuration instead of waiting for a port that never opens.
        check = subprocess.run([str(SSHD), "-t", "-f", str(config)], capture_output=True, text=True, check=False)
        if check.returncode != 0:
            raise SshdError(f"sshd -t rejected {config}: {check.stderr.strip()}")
        log = log_path.open("ab")
        try:
            process = subprocess.Popen(
                [str(SSHD), "-D", "-e", "-f", str(config)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,  # a Ctrl-C in the test run must not reach it first
            )
        finally:
            log.close()
        server = Sshd(home, chosen, process, host_key, client_key, log_path, listen)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and process.poll() is None:
            if is_listening(chosen, listen):
                return server
            time.sleep(0.01)
        server.stop()
        # Another process took the port between free_port() and bind(): pick another one.
        if port is None and "Address already in use" in server.log() and attempt < 4:
            continue
        raise SshdError(f"sshd on {listen}:{chosen} did not start within {timeout:g} s:\n{server.log()}")
    raise SshdError("sshd could not find a free port")
