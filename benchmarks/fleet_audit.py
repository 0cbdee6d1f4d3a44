"""Fleet audit over high-latency links: `gpuhost audit` against Ansible's fact gathering.

Not a unit test. Starts N (default 32) real sshd endpoints on 127.0.0.1 (tests/sshd.py), puts a
delaying TCP proxy in front of each one (default 50 ms each way; this kernel has no tc netem),
then, alternating, runs

    gpuhost audit --json -i INVENTORY                                    (forks 64)
    ansible all -i INVENTORY -m ansible.builtin.setup --forks 32         (host keys verified)

against the same proxied endpoints, and prints the median wall times, the ratio, gpuhost's SSH
round trips per host (its JSON `round_trips`), and what each tool cost per host on the wire: TCP
connections seen by the proxy, and sessions (exec/SFTP channels) from the sshd logs.

Usage, as root from the repository root (loopback only; everything it starts it stops):

    python3 benchmarks/fleet_audit.py [--hosts 32] [--delay-ms 50] [--runs 3]

Target (issue 2): the whole audit <= 3 s and >= 5x faster than Ansible's fact gathering.

Caveat printed with the results: all N "hosts" are this one machine, so the N gather scripts
(and N Ansible setup modules) share its CPUs, where a real fleet runs each on its own host.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from sshd import Sshd, generate_key, known_hosts_line, start_sshd  # noqa: E402

GPUHOST_TIMEOUT_S = 120
ANSIBLE_TIMEOUT_S = 300
TARGET_SECONDS = 3.0
TARGET_RATIO = 5.0


# --- the delaying proxy ---------------------------------------------------------------------------


@dataclass
class EndpointCounters:
    connections: int = 0
    bytes_up: int = 0  # client -> server
    bytes_down: int = 0


@dataclass
class DelayProxy:
    """Forwards 127.0.0.1:listen_port to 127.0.0.1:upstream_port with `delay` seconds each way.

    Every chunk is held `delay` seconds after it was read, in order, without blocking the chunks
    behind it (a pipe with latency, not a slow pipe). A new connection reaches the server only
    3 * delay after it was accepted, as on a real link: the client's SYN needs one delay, its
    first data (sent after SYN-ACK, another delay) one more, so the server's greeting reaches
    the client 4 * delay after connect() started, as here (3 * delay + the downstream delay).
    """

    upstream_port: int
    delay: float
    listen_port: int = 0
    counters: EndpointCounters = field(default_factory=EndpointCounters)
    server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0, backlog=256)
        self.listen_port = self.server.sockets[0].getsockname()[1]

    async def _handle(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        self.counters.connections += 1
        loop = asyncio.get_running_loop()
        accepted = loop.time()
        writers = [client_writer]

        async def read_into(reader: asyncio.StreamReader, queue: asyncio.Queue[tuple[float, bytes]], up: bool) -> None:
            """Read until EOF or error, timestamping each chunk; b"" marks the end."""
            try:
                while data := await reader.read(1 << 16):
                    if up:
                        self.counters.bytes_up += len(data)
                    else:
                        self.counters.bytes_down += len(data)
                    queue.put_nowait((loop.time() + self.delay, data))
            except OSError:
                pass
            queue.put_nowait((loop.time() + self.delay, b""))

        async def deliver(queue: asyncio.Queue[tuple[float, bytes]], writer: asyncio.StreamWriter) -> None:
            """Write each chunk when it is due; pass the end on as a half-close (SSH relies on it)."""
            while True:
                due, data = await queue.get()
                await asyncio.sleep(max(0.0, due - loop.time()))
                if not data:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                writer.write(data)
                await writer.drain()

        up_queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        tasks = [asyncio.create_task(read_into(client_reader, up_queue, True))]
        try:
            await asyncio.sleep(max(0.0, accepted + 3 * self.delay - loop.time()))
            server_reader, server_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
            writers.append(server_writer)
            down_queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
            tasks += [
                asyncio.create_task(deliver(up_queue, server_writer)),
                asyncio.create_task(read_into(server_reader, down_queue, False)),
                asyncio.create_task(deliver(down_queue, client_writer)),
            ]
            # Both ways end with EOF delivered; a write to a peer that is gone ends it at once.
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            if any(not task.cancelled() and task.exception() is not None for task in done):
                raise ConnectionError("a peer went away")
        except (OSError, asyncio.CancelledError):
            pass  # upstream refused, a peer vanished, or the benchmark is shutting down
        finally:
            for task in tasks:
                task.cancel()
            for writer in writers:
                writer.close()


class ProxyFleet:
    """One asyncio loop in a thread running a DelayProxy per endpoint."""

    def __init__(self, upstream_ports: list[int], delay: float) -> None:
        self.loop = asyncio.new_event_loop()
        self.proxies = [DelayProxy(port, delay) for port in upstream_ports]
        self.thread = threading.Thread(target=self.loop.run_forever, name="delay-proxy", daemon=True)

    def start(self) -> None:
        self.thread.start()
        for proxy in self.proxies:
            asyncio.run_coroutine_threadsafe(proxy.start(), self.loop).result(timeout=10)

    def reset(self) -> None:
        for proxy in self.proxies:
            proxy.counters = EndpointCounters()

    def stop(self) -> None:
        async def close() -> None:
            for proxy in self.proxies:
                if proxy.server is not None:
                    proxy.server.close()
            # A cancelled connection handler can leave a task it started behind: sweep until none.
            for _ in range(10):
                others = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
                if not others:
                    return
                for task in others:
                    task.cancel()
                await asyncio.wait(others, timeout=1)

        if self.thread.is_alive():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(close(), self.loop).result(timeout=5)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=5)


# --- the fleet ------------------------------------------------------------------------------------


@dataclass
class Fleet:
    servers: list[Sshd]
    proxies: ProxyFleet
    inventory: Path
    known_hosts: Path
    client_key: Path

    def server_cpu(self) -> float:
        """CPU seconds of every finished connection on the servers: each sshd listener reaps its
        per-connection children, which reaped the commands they ran (gather script, setup module)."""
        ticks = os.sysconf("SC_CLK_TCK")
        total = 0
        for server in self.servers:
            with contextlib.suppress(OSError):
                fields = Path(f"/proc/{server.pid}/stat").read_text().rsplit(")", 1)[1].split()
                total += int(fields[13]) + int(fields[14])  # cutime, cstime (fields 16 and 17 of stat)
        return total / ticks

    def log_marks(self) -> list[tuple[int, int]]:
        return [(server.connections(), server.sessions()) for server in self.servers]

    def log_deltas(self, marks: list[tuple[int, int]]) -> tuple[list[int], list[int]]:
        now = self.log_marks()
        return [n[0] - m[0] for n, m in zip(now, marks, strict=True)], [
            n[1] - m[1] for n, m in zip(now, marks, strict=True)
        ]


@contextlib.contextmanager
def fleet(directory: Path, hosts: int, delay: float) -> Iterator[Fleet]:
    servers: list[Sshd] = []
    proxies: ProxyFleet | None = None
    try:
        client_key = generate_key(directory / "client_ed25519", comment="fleet-benchmark")
        for index in range(hosts):
            servers.append(start_sshd(directory, client_key=client_key, name=f"gpu{index:02d}"))
        proxies = ProxyFleet([server.port for server in servers], delay)
        proxies.start()
        known_hosts = directory / "known_hosts"
        known_hosts.write_text(
            "".join(
                known_hosts_line(proxy.listen_port, server.host_public_key)
                for server, proxy in zip(servers, proxies.proxies, strict=True)
            )
        )
        inventory = directory / "inventory.yml"
        entries = {
            f"gpu{index:02d}": {
                "ansible_host": "127.0.0.1",
                "ansible_port": proxy.listen_port,
                "ansible_user": "root",
                "ansible_ssh_private_key_file": str(client_key),
                "gpuhost_known_hosts_file": str(known_hosts),
            }
            for index, proxy in enumerate(proxies.proxies)
        }
        inventory.write_text(json.dumps({"all": {"children": {"gpu_hosts": {"hosts": entries}}}}, indent=2))
        yield Fleet(servers, proxies, inventory, known_hosts, client_key)
    finally:
        if proxies is not None:
            proxies.stop()
        for server in servers:
            server.stop()


# --- the two tools --------------------------------------------------------------------------------


@dataclass
class Run:
    tool: str
    seconds: float
    ok_hosts: int
    connections: list[int]  # per endpoint, from the proxy
    sessions: list[int]  # per endpoint, from the sshd logs
    round_trips: list[int] = field(default_factory=list)  # gpuhost's own count
    cpu_seconds: float = 0.0  # user+sys of the tool and its children on the controller
    server_cpu_seconds: float = 0.0  # user+sys of the sshd sessions and what they ran
    detail: str = ""


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(
    fleet_: Fleet,
    tool: str,
    argv: list[str],
    env: dict[str, str],
    timeout: float,
    after: Callable[[], None] | None = None,
) -> tuple[Run, str]:
    """Run one tool against the fleet; `after` runs once it is timed, before the counters are read."""
    fleet_.proxies.reset()
    marks = fleet_.log_marks()
    cpu_before = children_cpu()
    server_before = fleet_.server_cpu()
    started = time.monotonic()
    try:
        completed = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout, check=False)
    finally:
        seconds = time.monotonic() - started
        if after is not None:
            after()
    # Let the servers write their last log lines (the session close follows the client's exit).
    time.sleep(0.3)
    connections_log, sessions = fleet_.log_deltas(marks)
    connections = [proxy.counters.connections for proxy in fleet_.proxies.proxies]
    if connections != connections_log:
        print(f"  note: proxy saw {sum(connections)} connections, sshd logs {sum(connections_log)}", file=sys.stderr)
    run = Run(
        tool,
        seconds,
        0,
        connections,
        sessions,
        cpu_seconds=children_cpu() - cpu_before,
        server_cpu_seconds=fleet_.server_cpu() - server_before,
    )
    if completed.returncode not in (0, 1):
        run.detail = f"exit {completed.returncode}: {(completed.stderr or completed.stdout)[-800:]}"
    return run, completed.stdout


def run_gpuhost(fleet_: Fleet) -> Run:
    argv = [sys.executable, "-m", "gpuhost", "audit", "--json", "-i", str(fleet_.inventory), "--forks", "64"]
    run, out = measure(fleet_, "gpuhost", argv, dict(os.environ), GPUHOST_TIMEOUT_S)
    hosts = [json.loads(line) for line in out.splitlines() if line.strip()]
    run.ok_hosts = sum(1 for host in hosts if host["reachable"])
    run.round_trips = [host["round_trips"] for host in hosts]
    failed = [f"{host['host']}: {host['error']}" for host in hosts if not host["reachable"]]
    if failed:
        run.detail = "; ".join(failed[:3])
    return run


def run_ansible(fleet_: Fleet, directory: Path, forks: int) -> Run:
    control = Path(tempfile.mkdtemp(prefix="cp-", dir=directory))  # a cold ControlPersist each run
    empty_config = directory / "ansible.cfg"
    empty_config.write_text("[defaults]\n")
    env = dict(os.environ)
    env.update(
        {
            "ANSIBLE_HOST_KEY_CHECKING": "True",
            "ANSIBLE_SSH_CONTROL_PATH_DIR": str(control),
            "ANSIBLE_LOCAL_TEMP": str(directory / "ansible-local"),
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_CONFIG": str(empty_config),  # defaults only, whatever ansible.cfg lies around
        }
    )
    common = (
        f"-o UserKnownHostsFile={fleet_.known_hosts} -o StrictHostKeyChecking=yes -o GlobalKnownHostsFile=/dev/null"
    )
    argv = [
        "ansible",
        "all",
        "-i",
        str(fleet_.inventory),
        "-m",
        "ansible.builtin.setup",
        "--forks",
        str(forks),
        "-o",
        "-e",
        json.dumps({"ansible_ssh_common_args": common}),
    ]
    # The ControlPersist masters outlive the command: end them before reading the servers'
    # counters, so their sessions are closed and reaped (counted) like gpuhost's.
    run, out = measure(fleet_, "ansible", argv, env, ANSIBLE_TIMEOUT_S, after=lambda: close_control_masters(control))
    run.ok_hosts = sum(1 for line in out.splitlines() if " | SUCCESS" in line)
    failed = [line[:300] for line in out.splitlines() if " | UNREACHABLE" in line or " | FAILED" in line]
    if failed:
        run.detail = "; ".join(failed[:3])
    return run


def close_control_masters(control: Path) -> None:
    """Ansible leaves ControlPersist masters running for 60 s: end them now."""
    for socket_path in control.iterdir():
        with contextlib.suppress(subprocess.TimeoutExpired):
            subprocess.run(
                ["ssh", "-o", f"ControlPath={socket_path}", "-O", "exit", "dummy"],
                capture_output=True,
                timeout=10,
                check=False,
            )


# --- report ---------------------------------------------------------------------------------------


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def per_host(values: list[int]) -> str:
    if not values:
        return "-"
    low, high = min(values), max(values)
    return f"{low}" if low == high else f"{low}-{high} (median {statistics.median(values):g})"


def report(runs: list[Run], hosts: int, delay_ms: float) -> int:
    gpuhost = [run for run in runs if run.tool == "gpuhost"]
    ansible = [run for run in runs if run.tool == "ansible"]
    print()
    print(f"{hosts} sshd endpoints on 127.0.0.1, {delay_ms:g} ms each way ({2 * delay_ms:g} ms RTT), ", end="")
    print(f"{os.cpu_count()} CPUs")
    for run in runs:
        trips = f"  round trips/host {per_host(run.round_trips)}" if run.round_trips else ""
        print(
            f"  {run.tool:8} {run.seconds:6.2f} s  hosts ok {run.ok_hosts}/{hosts}  "
            f"CPU: tool {run.cpu_seconds:5.1f} s, servers {run.server_cpu_seconds:5.1f} s  "
            f"connections/host {per_host(run.connections)}  sessions/host {per_host(run.sessions)}{trips}"
        )
        if run.detail:
            print(f"           {run.detail}")
    g, a = median([r.seconds for r in gpuhost]), median([r.seconds for r in ansible])
    ratio = a / g if g and ansible else float("nan")
    print()
    for name, tool_runs, value in (("gpuhost audit", gpuhost, g), ("ansible setup", ansible, a)):
        if tool_runs:
            samples = sorted(round(r.seconds, 2) for r in tool_runs)
            print(f"{name:15} median {value:6.2f} s over {len(tool_runs)} runs {samples}")
    if ansible:
        print(f"ratio           {ratio:6.1f}x")
    last = gpuhost[-1]
    print(
        f"gpuhost: SSH round trips (commands) per host {per_host(last.round_trips)}; "
        f"TCP connections per host {per_host(last.connections)}; sessions per host {per_host(last.sessions)}"
    )
    if ansible:
        print(
            f"ansible: TCP connections per host {per_host(ansible[-1].connections)} (ControlPersist); "
            f"sessions per host {per_host(ansible[-1].sessions)} (exec + SFTP)"
        )
    print(
        f"note: every endpoint is this machine (load average now {os.getloadavg()[0]:.1f}): all gather scripts "
        "and setup modules share its CPUs, where a real fleet runs each on its own host"
    )
    complete = all(run.ok_hosts == hosts for run in runs)
    met = g <= TARGET_SECONDS and ratio >= TARGET_RATIO
    verdict = "MET" if met else "MISSED"
    failed = "" if complete else " (hosts failed: see above)"
    print(f"target (<= {TARGET_SECONDS:g} s and >= {TARGET_RATIO:g}x): {verdict}{failed}")
    return 0 if met and complete else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=32)
    parser.add_argument("--delay-ms", type=float, default=50.0, help="one-way delay added by the proxy")
    parser.add_argument("--runs", type=int, default=3, help="runs of each tool (median reported)")
    parser.add_argument("--ansible-forks", type=int, default=32)
    parser.add_argument("--skip-ansible", action="store_true", help="time gpuhost only")
    args = parser.parse_args()
    if os.geteuid() != 0:
        parser.error("run as root: the sshd endpoints log in as root")
    if not 1 <= args.hosts <= 200 or not 1 <= args.runs <= 20:
        parser.error("--hosts 1..200 and --runs 1..20")

    # SIGTERM (a timeout around the benchmark) must still stop every server and proxy.
    def terminate(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, terminate)
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="gpuhost-fleet-bench-") as scratch:
        directory = Path(scratch)
        print(f"starting {args.hosts} sshd endpoints behind {args.delay_ms:g} ms proxies ...", flush=True)
        with fleet(directory, args.hosts, args.delay_ms / 1000) as fleet_:
            for index in range(args.runs):
                run = run_gpuhost(fleet_)
                runs.append(run)
                print(f"run {index + 1}: gpuhost {run.seconds:.2f} s ({run.ok_hosts}/{args.hosts} ok)", flush=True)
                if not args.skip_ansible:
                    run = run_ansible(fleet_, directory, args.ansible_forks)
                    runs.append(run)
                    print(f"run {index + 1}: ansible {run.seconds:.2f} s ({run.ok_hosts}/{args.hosts} ok)", flush=True)
    return report(runs, args.hosts, args.delay_ms)


if __name__ == "__main__":
    sys.exit(main())
