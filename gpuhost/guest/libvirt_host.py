"""The host side of a guest, through libvirt only (libvirt-python, imported lazily: controller-only).

Connection URIs: `qemu:///system` for a host the controller is (ansible_connection: local), else
`qemu+ssh://user@host:port/system`. libvirt's ssh transport runs OpenSSH's `ssh`; it is given a
small wrapper (the URI's `command=`) that adds the options gpuhost insists on: host keys verified
against the host's known_hosts (never auto-accepted unless --accept-new-host-keys), batch mode,
no agent or X11 forwarding. Every value in the URI and the wrapper is validated first.

Disks and seeds are libvirt storage volumes in the pool whose directory is the host's
`gpuhost_images_dir`: the disk a qcow2 volume backed by the VM's base image (copy-on-write), the
seed an ISO uploaded through a libvirt stream. So nothing here needs a shell on the host.
"""

from __future__ import annotations

import enum
import hashlib
import ipaddress
import re
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote
from xml.sax.saxutils import escape

from gpuhost.errors import InputError, MissingDependencyError
from gpuhost.inventory.spec import validate_path
from gpuhost.targets import LOCAL, Target
from gpuhost.transport.ssh import SshOptions

LOCAL_URI = "qemu:///system"
_URI = re.compile(r"^qemu(?:\+(?:ssh|libssh|libssh2|tls|tcp|unix))?://[A-Za-z0-9@._:\[\]/?=&%,-]*$")
POLL_S = 1.0
# libvirt's cpuset syntax; CPU numbers below 8192 (Linux's CONFIG_NR_CPUS limit) keep a range bounded.
_CPUSET = re.compile(r"^\^?[0-9]{1,4}(?:-[0-9]{1,4})?(?:,\^?[0-9]{1,4}(?:-[0-9]{1,4})?)*$")


@dataclass(frozen=True)
class DomainState:
    name: str
    defined: bool
    state: str  # running, shut off, paused, ... or 'not defined'
    addresses: tuple[str, ...]


def import_libvirt() -> Any:
    try:
        import libvirt
    except ImportError as error:
        raise MissingDependencyError("libvirt-python", "libvirt", "Managing guests") from error
    # libvirt's default handler prints every error to stderr, even ones we expect and handle
    # (a lookup of a domain that does not exist yet); errors still raise libvirtError.
    libvirt.registerErrorHandler(_ignore_error, None)
    return libvirt


def _ignore_error(_context: object, _error: object) -> None:
    return None


def validate_uri(uri: str) -> str:
    if not _URI.fullmatch(uri):
        raise InputError(
            f"--libvirt-uri {uri!r}: not a libvirt QEMU URI like qemu:///system or qemu+ssh://root@gpu01/system "
            "(letters, digits and URI punctuation only)."
        )
    return uri


def ssh_wrapper_script(options: SshOptions, known_hosts: Path) -> str:
    """The `ssh` libvirt runs for a qemu+ssh URI: OpenSSH with gpuhost's host-key policy."""
    path = validate_path(str(known_hosts), "known_hosts file")
    checking = "accept-new" if options.accept_new_host_keys else "yes"
    return (
        "#!/bin/sh\n"
        "# gpuhost guest: libvirt's qemu+ssh transport runs this instead of plain ssh.\n"
        f"exec ssh -o StrictHostKeyChecking={checking} -o 'UserKnownHostsFile={path}' -o BatchMode=yes "
        f'-o ForwardAgent=no -o ForwardX11=no -o ConnectTimeout={int(options.connect_timeout)} "$@"\n'
    )


def host_uri(target: Target, *, wrapper: Path | None) -> str:
    """The libvirt URI of an inventory host (validated values only; see the module docstring)."""
    if target.kind == LOCAL:
        return LOCAL_URI
    assert target.ssh is not None
    options = target.ssh
    host = f"[{options.host}]" if ":" in options.host else options.host
    params = ["no_tty=1"]
    if options.key_file is not None:
        params.append("keyfile=" + quote(validate_path(str(options.key_file), "SSH private key"), safe="/"))
    if wrapper is not None:
        params.append("command=" + quote(validate_path(str(wrapper), "ssh wrapper"), safe="/"))
    return f"qemu+ssh://{quote(options.user, safe='')}@{host}:{options.port}/system?{'&'.join(params)}"


def connect(uri: str, *, known_hosts: Path | None = None) -> Any:
    libvirt = import_libvirt()
    try:
        return libvirt.open(uri)
    except libvirt.libvirtError as error:
        ssh = (
            f" Over SSH the host key is checked against {known_hosts}: an unknown or changed key ends here too "
            f"(check with: ssh -o UserKnownHostsFile={known_hosts} USER@HOST true)."
            if known_hosts is not None
            else ""
        )
        raise InputError(
            f"cannot connect to libvirt at {uri}: {error.get_error_message()}. Is libvirtd (and virtlogd) running "
            f"on the host, and may this user manage it?{ssh}"
        ) from error


def _pool_path(pool: Any) -> str | None:
    # XML from the libvirt daemon we are connected to, which we trust with the whole host anyway.
    target = ET.fromstring(pool.XMLDesc(0)).find("target/path")  # noqa: S314
    return None if target is None or target.text is None else target.text.rstrip("/") or "/"


def find_pool(conn: Any, directory: str, *, create: bool) -> Any | None:
    """The storage pool whose directory is `directory` (started if it was not). With create, a
    transient dir pool for it when none exists: it leaves nothing defined behind."""
    wanted = directory.rstrip("/") or "/"
    for pool in conn.listAllStoragePools(0):
        if _pool_path(pool) == wanted:
            if not pool.isActive():
                pool.create(0)
            pool.refresh(0)
            return pool
    if not create:
        return None
    name = "gpuhost-" + hashlib.sha256(wanted.encode()).hexdigest()[:12]
    xml = f"<pool type='dir'><name>{name}</name><target><path>{_xml(wanted)}</path></target></pool>"
    return conn.storagePoolCreateXML(xml, 0)


def _xml(text: str) -> str:
    # For values inside single-quoted attributes and element text alike.
    return escape(text, {"'": "&apos;"})


def volume(pool: Any, name: str) -> Any | None:
    libvirt = import_libvirt()
    try:
        return pool.storageVolLookupByName(name)
    except libvirt.libvirtError:
        return None


def base_capacity(conn: Any, base_image: str) -> int | None:
    """The virtual size in bytes of the base image, when a pool knows it."""
    libvirt = import_libvirt()
    try:
        return int(conn.storageVolLookupByPath(base_image).info()[1])
    except libvirt.libvirtError:
        return None


def disk_volume_xml(name: str, capacity_bytes: int, base_image: str, base_format: str = "qcow2") -> str:
    return (
        "<volume type='file'>"
        f"<name>{_xml(name)}</name>"
        f"<capacity unit='bytes'>{capacity_bytes}</capacity>"
        "<target><format type='qcow2'/><permissions><mode>0600</mode></permissions></target>"
        f"<backingStore><path>{_xml(base_image)}</path><format type='{base_format}'/></backingStore>"
        "</volume>"
    )


def create_disk(pool: Any, name: str, capacity_bytes: int, base_image: str) -> str:
    """A qcow2 volume backed by the base image (copy-on-write); its path."""
    vol = pool.createXML(disk_volume_xml(name, capacity_bytes, base_image), 0)
    return str(vol.path())


def upload_volume(conn: Any, pool: Any, name: str, data: bytes) -> str:
    """A raw volume holding `data`, sent through a libvirt stream (works over qemu+ssh too).

    Mode 0600: a seed carries the guest's SSH host private key, which no other user of the host
    may read (libvirt gives QEMU access when it attaches the volume, as for the disk)."""
    xml = (
        f"<volume type='file'><name>{_xml(name)}</name><capacity unit='bytes'>{len(data)}</capacity>"
        "<target><format type='raw'/><permissions><mode>0600</mode></permissions></target></volume>"
    )
    vol = pool.createXML(xml, 0)
    stream = conn.newStream(0)
    vol.upload(stream, 0, len(data), 0)
    stream.send(data)
    stream.finish()
    return str(vol.path())


# The seed's CD-ROM as templates/domain.xml.j2 attaches it; without <source> it is an empty drive.
EMPTY_SEED_DRIVE = "<disk type='file' device='cdrom'><target dev='sda' bus='sata'/><readonly/></disk>"


def remove_seed(domain: Any, pool: Any, name: str) -> bool:
    """Eject the seed from the running guest and its definition, then delete the volume: once the
    guest's pinned key is confirmed and cloud-init is done, the private key it carries has no use
    on the host. True when a volume was deleted."""
    libvirt = import_libvirt()
    domain.updateDeviceFlags(EMPTY_SEED_DRIVE, libvirt.VIR_DOMAIN_AFFECT_LIVE | libvirt.VIR_DOMAIN_AFFECT_CONFIG)
    return delete_volume(pool, name)


def delete_volume(pool: Any, name: str) -> bool:
    vol = volume(pool, name)
    if vol is None:
        return False
    vol.delete(0)
    return True


def lookup(conn: Any, name: str) -> Any | None:
    libvirt = import_libvirt()
    try:
        return conn.lookupByName(name)
    except libvirt.libvirtError:
        return None


def hostdevs_taken(conn: Any) -> dict[str, str]:
    """Host PCI addresses given to defined domains: {'0000:41:00.0': 'train-2'}."""
    taken: dict[str, str] = {}
    for domain in conn.listAllDomains(0):
        taken.update(dict.fromkeys(hostdev_addresses(domain.XMLDesc(0)), domain.name()))
    return taken


def hostdev_addresses(domain_xml: str) -> tuple[str, ...]:
    """The host PCI addresses of a domain's PCI hostdevs, as 0000:41:00.0."""
    addresses: list[str] = []
    root = ET.fromstring(domain_xml)  # noqa: S314 - from the libvirt daemon, as above
    for source in root.iterfind("devices/hostdev[@type='pci']/source/address"):
        parts = [source.get(key, "0") for key in ("domain", "bus", "slot", "function")]
        domain, bus, slot, function = (int(part, 16) for part in parts)
        addresses.append(f"{domain:04x}:{bus:02x}:{slot:02x}.{function:x}")
    return tuple(addresses)


def cpus_taken(conn: Any) -> dict[int, str]:
    """Host CPUs that defined domains' vCPUs are pinned to: {64: 'train-2', 65: 'train-2'}."""
    taken: dict[int, str] = {}
    for domain in conn.listAllDomains(0):
        taken.update(dict.fromkeys(vcpu_pinned_cpus(domain.XMLDesc(0), domain.name()), domain.name()))
    return taken


def vcpu_pinned_cpus(domain_xml: str, name: str) -> tuple[int, ...]:
    """The host CPUs a domain's vCPUs are pinned to (cputune/vcpupin cpusets, libvirt's syntax:
    '64-71', '1-4,^3'); a domain without vcpupin holds none exclusively."""
    cpus: set[int] = set()
    root = ET.fromstring(domain_xml)  # noqa: S314 - from the libvirt daemon, as above
    for pin in root.iterfind("cputune/vcpupin"):
        cpuset = pin.get("cpuset", "")
        if not _CPUSET.fullmatch(cpuset):
            raise InputError(f"domain {name}: vcpupin cpuset {cpuset!r} is not a CPU list libvirt writes.")
        pinned: set[int] = set()
        for part in cpuset.split(","):
            low, _, high = part.lstrip("^").partition("-")
            span = range(int(low), int(high or low) + 1)
            (pinned.difference_update if part.startswith("^") else pinned.update)(span)
        cpus |= pinned
    return tuple(sorted(cpus))


STATE_NAMES = {
    0: "no state",
    1: "running",
    2: "blocked",
    3: "paused",
    4: "shutting down",
    5: "shut off",
    6: "crashed",
    7: "suspended (pm)",
}


def domain_state(conn: Any, name: str) -> DomainState:
    domain = lookup(conn, name)
    if domain is None:
        return DomainState(name, False, "not defined", ())
    state = STATE_NAMES.get(int(domain.state(0)[0]), "unknown")
    found = guest_addresses(domain) if state == "running" else None
    return DomainState(name, True, state, found.addresses if found else ())


class AddressSource(enum.Enum):
    """Where libvirt learns a guest's address, in the order gpuhost asks (virsh domifaddr --source)."""

    LEASE = "the DHCP lease"  # libvirt's own network (NAT, routed): its dnsmasq hands out the address
    AGENT = "the guest agent"  # any network, bridged included: qemu-guest-agent in the guest answers
    ARP = "the host's ARP table"  # a bridged guest without the agent, once it has talked to the host


@dataclass(frozen=True)
class GuestAddresses:
    source: AddressSource
    addresses: tuple[str, ...]


def _libvirt_source(libvirt: Any, source: AddressSource) -> int:
    return int(
        {
            AddressSource.LEASE: libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_LEASE,
            AddressSource.AGENT: libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_AGENT,
            AddressSource.ARP: libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_ARP,
        }[source]
    )


def addresses_from(domain: Any, source: AddressSource) -> tuple[str, ...]:
    """The guest's IPv4 addresses as one source reports them: none where it cannot answer (no
    lease on a bridged network, no agent running). The agent also reports the loopback and
    link-local addresses, which the controller cannot reach the guest at: left out."""
    libvirt = import_libvirt()
    try:
        interfaces = domain.interfaceAddresses(_libvirt_source(libvirt, source), 0)
    except libvirt.libvirtError:
        return ()
    found: set[str] = set()
    for interface in (interfaces or {}).values():
        for address in interface.get("addrs") or []:
            if address.get("type") != libvirt.VIR_IP_ADDR_TYPE_IPV4 or not address.get("addr"):
                continue
            try:
                parsed = ipaddress.IPv4Address(str(address["addr"]))
            except ValueError:  # text from the guest (its agent): data, never trusted
                continue
            if not (parsed.is_loopback or parsed.is_link_local or parsed.is_unspecified or parsed.is_multicast):
                found.add(str(parsed))
    return tuple(sorted(found, key=ipaddress.IPv4Address))


def guest_addresses(domain: Any) -> GuestAddresses | None:
    """The first source that knows an address of the guest; None while none does."""
    for source in AddressSource:
        addresses = addresses_from(domain, source)
        if addresses:
            return GuestAddresses(source, addresses)
    return None


def wait_for_address(domain: Any, timeout: float, *, still_running: Callable[[], bool]) -> GuestAddresses:
    """The guest's addresses once a source knows one (the DHCP lease, else the guest agent, else
    the host's ARP table); TimeoutError otherwise."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = guest_addresses(domain)
        if found is not None:
            return found
        if not still_running():
            raise RuntimeError("the domain stopped before it got an address")
        time.sleep(POLL_S)
    raise TimeoutError(
        f"no address within {timeout:g} s: no DHCP lease, no answer from a guest agent, nothing in the host's ARP "
        "table (on a bridged network the base image needs qemu-guest-agent)"
    )
