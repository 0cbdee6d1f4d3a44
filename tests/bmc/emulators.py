"""Real BMC endpoints on 127.0.0.1 for the tests: no mock of either protocol.

- Redfish: sushy-tools' emulator (`sushy-emulator --fake`: its fake driver keeps systems in a state
  file, no libvirt), over HTTPS with a throwaway certificate and HTTP basic auth (bcrypt htpasswd).
- IPMI over LAN: OpenIPMI's `ipmi_sim` (Debian's openipmi), with a VM peer standing in for QEMU's
  `ipmi-bmc-extern`: ipmi_sim carries out chassis control only for a connected VM (without one it
  answers 0xCC), and sends it OpenIPMI's VM commands (power off 0x03, reset 0x04), which the peer logs.
- IPMI over LAN as a lab host's power switch: ipmi_sim with a `startcmd` (its power on runs the
  command, which starts the host's QEMU from its disk) and no VM peer; its power state is whether
  the command's process runs, so a host whose QEMU is gone reads as off.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bcrypt
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

SYSTEM_ID = "27946b59-9e44-4fa7-8e91-f3527a1ef094"
SYSTEM_NAME = "gpu01-bmc"
REDFISH_USER = "bmcadmin"
IPMI_USER = "ipmiadmin"
# OpenIPMI's VM protocol (lanserv/serial_ipmi.c): a command starts and ends with 0xA1.
VM_CMD_CHAR = 0xA1
VM_CMD_VERSION, VM_CMD_CAPABILITIES = 0xFF, 0x08
VM_CAPABILITIES_POWER_RESET = 0x01 | 0x02
VM_COMMANDS = {0x03: "power off", 0x04: "reset", 0x09: "graceful shutdown"}


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    with socket.socket(socket.AF_INET, kind) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def self_signed_certificate(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key (PEM), which no CA bundle trusts."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpuhost test BMC")])
    now = datetime.datetime.now(datetime.timezone.utc)
    import ipaddress

    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "bmc.crt", directory / "bmc.key"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


@dataclass
class RedfishEmulator:
    port: int
    certificate: Path  # also the CA bundle that trusts it
    state_dir: Path
    log: Path
    password: str

    def power_state(self) -> str:
        """The system's PowerState as the emulator reports it (its own API, read with urllib)."""
        with self._request(f"/redfish/v1/Systems/{SYSTEM_ID}") as response:
            return str(json.load(response)["PowerState"])

    def power_off(self) -> None:
        """ForceOff through the emulator's own API, and wait until the system shows Off (the fake
        driver carries out a power change 1 to 11 s after it is asked)."""
        body = json.dumps({"ResetType": "ForceOff"}).encode()
        with self._request(f"/redfish/v1/Systems/{SYSTEM_ID}/Actions/ComputerSystem.Reset", body):
            pass
        deadline = time.monotonic() + 30
        while self.power_state() != "Off":
            assert time.monotonic() < deadline, "the emulated system did not power off within 30 s"
            time.sleep(0.5)

    def _request(self, path: str, body: bytes | None = None) -> Any:
        import base64
        import ssl

        request = urllib.request.Request(f"https://127.0.0.1:{self.port}{path}", data=body)
        token = base64.b64encode(f"{REDFISH_USER}:{self.password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
        if body is not None:
            request.add_header("Content-Type", "application/json")
        context = ssl.create_default_context(cafile=str(self.certificate))
        return urllib.request.urlopen(request, context=context, timeout=10)

    def resets(self) -> int:
        """How many resets the emulator accepted, from its own access log."""
        action = f'POST /redfish/v1/Systems/{SYSTEM_ID}/Actions/ComputerSystem.Reset HTTP/1.1" 204'
        return sum(action in line for line in self.log.read_text().splitlines())


@contextmanager
def redfish_emulator(directory: Path, password: str) -> Iterator[RedfishEmulator]:
    """sushy-tools' emulator on 127.0.0.1 over HTTPS with basic auth, one fake system powered on."""
    directory.mkdir(parents=True, exist_ok=True)
    certificate, key = self_signed_certificate(directory)
    auth_file = directory / "htpasswd"
    auth_file.write_text(f"{REDFISH_USER}:{bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()}\n")
    state_dir = directory / "state"
    port = free_port()
    config = directory / "emulator.conf"
    systems = [{"uuid": SYSTEM_ID, "name": SYSTEM_NAME, "power_state": "On", "nics": []}]
    config.write_text(
        f"SUSHY_EMULATOR_LISTEN_IP = '127.0.0.1'\n"
        f"SUSHY_EMULATOR_LISTEN_PORT = {port}\n"
        f"SUSHY_EMULATOR_SSL_CERT = {str(certificate)!r}\n"
        f"SUSHY_EMULATOR_SSL_KEY = {str(key)!r}\n"
        f"SUSHY_EMULATOR_AUTH_FILE = {str(auth_file)!r}\n"
        f"SUSHY_EMULATOR_STATE_DIR = {str(state_dir)!r}\n"
        f"SUSHY_EMULATOR_FAKE_DRIVER = True\n"
        f"SUSHY_EMULATOR_FAKE_SYSTEMS = {systems!r}\n"
    )
    log = directory / "emulator.log"
    emulator = shutil.which("sushy-emulator", path=str(Path(sys.executable).parent))
    assert emulator, "sushy-tools is not installed (pip install -e '.[test]')"
    with log.open("w") as output:
        process = subprocess.Popen(
            [emulator, "--config", str(config), "--fake"],
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        _wait_for_port(port, process, log)
        yield RedfishEmulator(port, certificate, state_dir, log, password)
    finally:
        _stop(process)


@dataclass
class IpmiSimulator:
    port: int
    password: str
    vm_commands: list[str] = field(default_factory=list)  # what the "host" (the VM peer) was told to do


@contextmanager
def ipmi_simulator(directory: Path, password: str) -> Iterator[IpmiSimulator]:
    """OpenIPMI's ipmi_sim on 127.0.0.1 (IPMI over LAN, RMCP+), with a VM peer that logs chassis control."""
    vm_port = free_port()
    process, simulator = _start_ipmi_sim(directory, password, vm_port, power_on=None)
    log = directory / "ipmi_sim.log"
    try:
        # The VM connection is the only one made to its port: ipmi_sim died of SIGPIPE writing to a
        # probe connection that had closed.
        vm = _connect(vm_port, process, log)
        vm.sendall(bytes([VM_CMD_CHAR, VM_CMD_VERSION, 1, VM_CMD_CHAR, VM_CMD_CHAR, VM_CMD_CAPABILITIES]))
        vm.sendall(bytes([VM_CAPABILITIES_POWER_RESET, VM_CMD_CHAR]))
        reader = threading.Thread(target=_read_vm_commands, args=(vm, simulator.vm_commands), daemon=True)
        reader.start()
        time.sleep(0.5)  # ipmi_sim reads the VM's capabilities before it accepts chassis control
        yield simulator
        vm.close()
    finally:
        _stop(process)


@contextmanager
def ipmi_power_switch(directory: Path, password: str, power_on: Path) -> Iterator[IpmiSimulator]:
    """ipmi_sim on 127.0.0.1 whose chassis power on runs the executable `power_on` (nothing runs it at
    the start: the host is off as far as this BMC knows until it powers it on)."""
    process, simulator = _start_ipmi_sim(directory, password, free_port(), power_on=power_on)
    try:
        _wait_for_udp_port(simulator.port, process, directory / "ipmi_sim.log")
        yield simulator
    finally:
        _stop(process)


def _start_ipmi_sim(
    directory: Path, password: str, vm_port: int, power_on: Path | None
) -> tuple[subprocess.Popen[bytes], IpmiSimulator]:
    ipmi_sim = shutil.which("ipmi_sim")
    assert ipmi_sim, "OpenIPMI's ipmi_sim is not installed (apt-get install openipmi; .ci/setup installs it)"
    directory.mkdir(parents=True, exist_ok=True)
    port = free_port(socket.SOCK_DGRAM)
    # ipmi_sim answers chassis control only where a VM serial interface is configured, even when the
    # power on is its startcmd and no VM ever connects.
    switch = f'  startcmd "{power_on}"\n  startnow false\n' if power_on is not None else ""
    (directory / "lan.conf").write_text(
        'name "gpuhosttest"\n'
        "set_working_mc 0x20\n"
        "  startlan 1\n"
        f"    addr 127.0.0.1 {port}\n"
        "    priv_limit admin\n"
        + "".join(f"    allowed_auths_{level} none md2 md5 straight\n" for level in ("callback", "user", "operator"))
        + "    allowed_auths_admin none md2 md5 straight\n"
        + "    guid a123456789abcdefa123456789abcdef\n"
        "  endlan\n"
        f"  serial kcs 127.0.0.1 {vm_port} codec VM\n"
        + switch
        + f'  user 2 true "{IPMI_USER}" "{password}" admin 10 none md2 md5 straight\n'
    )
    (directory / "sim.emu").write_text(
        "mc_setbmc 0x20\nmc_add 0x20 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02 persist_sdr\nmc_enable 0x20\n"
    )
    log = directory / "ipmi_sim.log"
    with log.open("w") as output:
        process = subprocess.Popen(
            [ipmi_sim, "-c", "lan.conf", "-f", "sim.emu", "-s", str(directory / "state"), "-n"],
            cwd=directory,
            stdout=output,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    return process, IpmiSimulator(port, password)


def _read_vm_commands(vm: socket.socket, commands: list[str]) -> None:
    vm.settimeout(None)
    buffered = b""
    with suppress(OSError):
        while chunk := vm.recv(256):
            buffered += chunk
            *frames, buffered = buffered.split(bytes([VM_CMD_CHAR]))
            commands.extend(VM_COMMANDS[frame[0]] for frame in frames if frame and frame[0] in VM_COMMANDS)


def _connect(port: int, process: subprocess.Popen[bytes], log: Path) -> socket.socket:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"ipmi_sim stopped: {log.read_text()[-2000:]}")
        with suppress(OSError):
            return socket.create_connection(("127.0.0.1", port), timeout=10)
        time.sleep(0.1)
    raise AssertionError(f"ipmi_sim did not listen on {port} within 30 s: {log.read_text()[-2000:]}")


def _wait_for_udp_port(port: int, process: subprocess.Popen[bytes], log: Path) -> None:
    """Wait until a UDP socket is bound to 127.0.0.1:`port` (the kernel's table: a UDP probe could
    not tell a closed port from a BMC that ignores it)."""
    bound = f"0100007F:{port:04X}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"ipmi_sim stopped: {log.read_text()[-2000:]}")
        if any(line.split()[1] == bound for line in Path("/proc/net/udp").read_text().splitlines()[1:]):
            return
        time.sleep(0.1)
    raise AssertionError(f"ipmi_sim did not listen on UDP {port} within 30 s: {log.read_text()[-2000:]}")


def _wait_for_port(port: int, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the emulator stopped: {log.read_text()[-2000:]}")
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise AssertionError(f"the emulator did not listen on {port} within 30 s: {log.read_text()[-2000:]}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
