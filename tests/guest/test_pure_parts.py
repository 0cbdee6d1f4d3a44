"""`gpuhost guest`'s pure parts on real inputs: the cloud-init seed (read back from the ISO
pycdlib wrote), hostile inventory and option values, wheel selection, the CUDA install plan, the
libvirt URI and ssh wrapper, hostdev parsing of rendered XML, and the SSH jump through a real
sshd. The lifecycle itself runs against a real libvirtd in tests/lab/test_guest_lifecycle.py."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml
from sshd import Sshd, start_sshd

from gpuhost.errors import InputError
from gpuhost.facts.parsers import parse_os_release
from gpuhost.guest import libvirt_host, provision
from gpuhost.guest.keys import generate_ed25519
from gpuhost.guest.seed import GUEST_USER, SeedConfig, build_seed_iso, read_seed_iso, user_data, validate_packages
from gpuhost.guest.wheels import parse_wheel_name, select_wheels
from gpuhost.inventory.spec import HostPolicy, parse_vm
from gpuhost.render.domain import plan_domain
from gpuhost.render.validate import validate_domain_xml, validator_available
from gpuhost.render.xml import render_plan
from gpuhost.selection import GpuSelector
from gpuhost.targets import LOCAL, SSH, Target
from gpuhost.transport import TransportError
from gpuhost.transport.ssh import SshOptions, SshTransport
from tests.helpers import FIXTURES, snapshot_facts

ANY = GpuSelector.parse("all", "test")


def seed_config(**overrides: object) -> SeedConfig:
    values: dict[str, object] = {
        "hostname": "train-1",
        "instance_id": "train-1-0001",
        "authorized_keys": (generate_ed25519("controller").public_openssh,),
        "host_key": generate_ed25519("guest-host"),
        "packages": ("python3-venv",),
    }
    values.update(overrides)
    return SeedConfig(**values)  # type: ignore[arg-type]


# --- the seed ---------------------------------------------------------------------------------


def test_seed_iso_holds_the_user_the_pinned_host_key_and_packages() -> None:
    config = seed_config()
    files = read_seed_iso(build_seed_iso(config))
    assert files[":label"] == "cidata"  # what cloud-init's NoCloud looks for
    assert files["meta-data"] == "instance-id: train-1-0001\nlocal-hostname: train-1\n"
    assert files["user-data"].startswith("#cloud-config\n")
    document = yaml.safe_load(files["user-data"])
    (user,) = document["users"]
    assert user["name"] == GUEST_USER and user["sudo"] == "ALL=(ALL) NOPASSWD:ALL" and user["lock_passwd"] is True
    assert user["ssh_authorized_keys"] == list(config.authorized_keys)
    assert document["ssh_pwauth"] is False and document["disable_root"] is True
    assert document["ssh_deletekeys"] is True
    assert document["ssh_keys"]["ed25519_private"] == config.host_key.private_openssh
    assert document["ssh_keys"]["ed25519_public"] == config.host_key.public_openssh
    assert document["packages"] == ["python3-venv"]


def test_seed_without_packages_has_no_package_step() -> None:
    # A packages entry makes cloud-init run apt-get update, minutes under TCG.
    assert "packages" not in yaml.safe_load(user_data(seed_config(packages=())))


def test_generated_keys_are_openssh_ed25519() -> None:
    pair = generate_ed25519("a comment")
    assert pair.private_openssh.startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
    assert pair.public_openssh.startswith("ssh-ed25519 ") and pair.public_openssh.endswith(" a comment")
    assert pair.public_blob == " ".join(pair.public_openssh.split()[:2])
    assert generate_ed25519("x").public_blob != pair.public_blob


@pytest.mark.parametrize(
    "overrides",
    [
        {"hostname": "vm;reboot"},
        {"hostname": "../etc"},
        {"authorized_keys": ("ssh-ed25519 AAAA x\nruncmd: [reboot]",)},
        {"authorized_keys": ("not a key",)},
    ],
)
def test_seed_refuses_hostile_values(overrides: dict[str, object]) -> None:
    with pytest.raises(InputError):
        user_data(seed_config(**overrides))


@pytest.mark.parametrize("package", ["vim;reboot", "Vim", "-o", "a b", "$(id)", ""])
def test_package_names_are_validated(package: str) -> None:
    with pytest.raises(InputError, match="package"):
        validate_packages([package], "VM train-1: packages")
    assert validate_packages(["python3-venv", "g++", "libc6.1"], "x") == ("python3-venv", "g++", "libc6.1")


# --- inventory: a VM without a GPU, and the seed in the domain --------------------------------


def test_vm_packages_reach_the_seed_and_hostile_names_are_refused() -> None:
    vm = parse_vm({"name": "t", "vcpus": 1, "memory": "1G", "gpus": "none", "packages": ["python3-venv"]}, "x")
    assert vm.packages == ("python3-venv",)
    assert parse_vm({"name": "t", "vcpus": 1, "memory": "1G", "gpus": "none"}, "x").packages == ()
    for hostile in (["vim; reboot"], ["$(id)"], "python3-venv", [["nested"]]):
        with pytest.raises(InputError, match="packages"):
            parse_vm({"name": "t", "vcpus": 1, "memory": "1G", "gpus": "none", "packages": hostile}, "x")


def test_gpus_none_is_explicit_and_an_empty_list_is_refused() -> None:
    vm = parse_vm({"name": "ci", "vcpus": 2, "memory": "1G", "gpus": "none"}, "test")
    assert vm.gpus == ()
    with pytest.raises(InputError, match="gpus: none"):
        parse_vm({"name": "ci", "vcpus": 2, "memory": "1G", "gpus": []}, "test")


def test_a_gpu_less_guest_with_a_seed_renders_valid_xml() -> None:
    facts = snapshot_facts("dev-vm")
    vm = parse_vm(
        {
            "name": "ci-guest",
            "vcpus": 2,
            "memory": "1536M",
            "gpus": "none",
            "base_image": "/var/lib/libvirt/images/base.qcow2",
            "domain_type": "qemu",
            "firmware": "bios",
            "hugepages": "off",
        },
        "test",
    )
    plan = plan_domain(facts, vm, HostPolicy(gpus=ANY), host="dev-vm")
    plain = render_plan(plan)
    assert "<hostdev" not in plain and "device='cdrom'" not in plain  # `gpuhost render` never adds a seed
    xml = render_plan(dataclasses.replace(plan, seed_path="/var/lib/libvirt/images/ci-guest-seed.iso"))
    assert "<source file='/var/lib/libvirt/images/ci-guest-seed.iso'/>" in xml
    assert "<target dev='sda' bus='sata'/>" in xml and "<readonly/>" in xml
    if validator_available():
        validate_domain_xml(xml)


def test_hostdev_addresses_of_a_rendered_domain() -> None:
    xml = (FIXTURES / "render" / "lab-gpu-pair.xml").read_text()
    assert libvirt_host.hostdev_addresses(xml) == ("0000:01:00.0", "0000:01:00.1")
    assert len(libvirt_host.hostdev_addresses((FIXTURES / "render" / "hgx-8gpu-all.xml").read_text())) >= 8


class _DefinedDomain:
    """What `cpus_taken` asks of a libvirt domain: its name and its XML."""

    def __init__(self, name: str, xml: str) -> None:
        self._name, self._xml = name, xml

    def name(self) -> str:
        return self._name

    def XMLDesc(self, flags: int) -> str:
        return self._xml


class _Connection:
    def __init__(self, *domains: _DefinedDomain) -> None:
        self.domains = domains

    def listAllDomains(self, flags: int) -> tuple[_DefinedDomain, ...]:
        return self.domains


def test_cpus_defined_domains_pin_vcpus_to() -> None:
    four = (FIXTURES / "render" / "hgx-4gpu-node1.xml").read_text()  # 48 vCPUs: 34-63,96-113
    assert libvirt_host.vcpu_pinned_cpus(four, "train-4") == (*range(34, 64), *range(96, 114))
    nested = (FIXTURES / "render" / "lab-gpu-pair.xml").read_text()
    taken = libvirt_host.cpus_taken(_Connection(_DefinedDomain("train-4", four), _DefinedDomain("nested", nested)))
    assert taken[34] == taken[113] == "train-4" and taken[0] == "nested" and 114 not in taken
    # libvirt's exclusion syntax; a domain without vcpupin holds no CPU for itself.
    excluded = "<domain><cputune><vcpupin vcpu='0' cpuset='1-4,^3'/></cputune></domain>"
    assert libvirt_host.vcpu_pinned_cpus(excluded, "x") == (1, 2, 4)
    assert libvirt_host.vcpu_pinned_cpus("<domain><vcpu>4</vcpu></domain>", "x") == ()
    with pytest.raises(InputError, match="domain odd: vcpupin cpuset 'all'"):
        libvirt_host.vcpu_pinned_cpus("<domain><cputune><vcpupin vcpu='0' cpuset='all'/></cputune></domain>", "odd")


# --- wheels -----------------------------------------------------------------------------------


def test_wheel_names_are_parsed() -> None:
    wheel = parse_wheel_name(Path("nvidia_ml_py-13.615.71-py3-none-any.whl"))
    assert wheel is not None and wheel.project == "nvidia-ml-py" and wheel.version == "13.615.71" and wheel.pure
    platform = parse_wheel_name(Path("PyYAML-6.0.2-cp311-cp311-manylinux_2_17_x86_64.whl"))
    assert platform is not None and platform.project == "pyyaml" and not platform.pure
    assert parse_wheel_name(Path("gpuhost-0.1.0.tar.gz")) is None


def test_the_newest_pure_wheel_of_each_project_is_chosen() -> None:
    files = [
        Path("nvidia_ml_py-12.535.133-py3-none-any.whl"),
        Path("nvidia_ml_py-13.615.71-py3-none-any.whl"),
        Path("nvidia_ml_py-13.9.1-py3-none-any.whl"),  # 9 < 615 as numbers, not as text
        Path("gpuhost-0.1.0-py3-none-any.whl"),
        Path("gpuhost-0.2.0-py3-none-any.whl"),
        Path("README.txt"),
    ]
    chosen = select_wheels(files, ["gpuhost", "nvidia-ml-py"], pinned={"gpuhost": "0.1.0"})
    assert [wheel.filename for wheel in chosen] == [
        "gpuhost-0.1.0-py3-none-any.whl",
        "nvidia_ml_py-13.615.71-py3-none-any.whl",
    ]


def test_platform_only_and_missing_wheels_are_refused() -> None:
    with pytest.raises(InputError, match="platform-specific"):
        select_wheels([Path("numpy-2.0.0-cp311-cp311-manylinux_2_17_x86_64.whl")], ["numpy"])
    with pytest.raises(InputError, match="no wheel of nvidia-ml-py"):
        select_wheels([Path("gpuhost-0.1.0-py3-none-any.whl")], ["gpuhost", "nvidia-ml-py"])
    with pytest.raises(InputError, match=r"gpuhost 0\.3\.0"):
        select_wheels([Path("gpuhost-0.1.0-py3-none-any.whl")], ["gpuhost"], pinned={"gpuhost": "0.3.0"})


# --- CUDA -------------------------------------------------------------------------------------


def test_os_release_of_this_machine_picks_nvidias_repository() -> None:
    release = parse_os_release(Path("/etc/os-release").read_text())
    if (release.get("ID"), release.get("VERSION_ID")) not in provision.CUDA_REPOS:
        pytest.skip(f"this machine runs {release.get('ID')} {release.get('VERSION_ID')}")
    assert provision.cuda_repo(release) in provision.CUDA_REPOS.values()


def test_cuda_install_plan_for_ubuntu() -> None:
    # /etc/os-release of Ubuntu 22.04's cloud image, verbatim.
    text = (
        'PRETTY_NAME="Ubuntu 22.04.4 LTS"\nNAME="Ubuntu"\nVERSION_ID="22.04"\n'
        'VERSION="22.04.4 LTS (Jammy Jellyfish)"\nVERSION_CODENAME=jammy\nID=ubuntu\nID_LIKE=debian\n'
        'HOME_URL="https://www.ubuntu.com/"\nUBUNTU_CODENAME=jammy\n'
    )
    repo = provision.cuda_repo(parse_os_release(text))
    assert repo == "ubuntu2204"
    assert provision.keyring_download(repo) == [
        "curl",
        "-fsSL",
        "--retry",
        "3",
        "-o",
        "/tmp/cuda-keyring_1.1-1_all.deb",
        "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2204/x86_64/cuda-keyring_1.1-1_all.deb",
    ]
    with pytest.raises(InputError, match="CUDA repository"):
        provision.cuda_repo(parse_os_release('ID=fedora\nVERSION_ID="40"\n'))


# --- libvirt URIs and the ssh wrapper ---------------------------------------------------------


def ssh_target(**options: object) -> Target:
    values: dict[str, object] = {"host": "10.0.0.5", "port": 2222, "user": "admin"}
    values.update(options)
    return Target(name="gpu01", kind=SSH, policy=None, ssh=SshOptions(**values))  # type: ignore[arg-type]


def test_uris_for_local_and_ssh_hosts() -> None:
    assert libvirt_host.host_uri(Target(name="here", kind=LOCAL, policy=None), wrapper=None) == "qemu:///system"  # type: ignore[arg-type]
    uri = libvirt_host.host_uri(ssh_target(key_file=Path("/home/op/.ssh/id_ed25519")), wrapper=Path("/s/ssh-wrapper"))
    assert uri == (
        "qemu+ssh://admin@10.0.0.5:2222/system?no_tty=1&keyfile=/home/op/.ssh/id_ed25519&command=/s/ssh-wrapper"
    )
    assert libvirt_host.host_uri(ssh_target(host="fd00::5"), wrapper=None).startswith(
        "qemu+ssh://admin@[fd00::5]:2222/"
    )


@pytest.mark.parametrize("uri", ["qemu:///system;reboot", "qemu+ssh://h/system?command=$(id)", "xen:///", "qemu:// x"])
def test_hostile_libvirt_uris_are_refused(uri: str) -> None:
    with pytest.raises(InputError, match="libvirt-uri"):
        libvirt_host.validate_uri(uri)


def test_ssh_wrapper_verifies_host_keys_and_forwards_nothing() -> None:
    script = libvirt_host.ssh_wrapper_script(SshOptions(host="gpu01"), Path("/home/op/.ssh/known_hosts"))
    assert "StrictHostKeyChecking=yes" in script and "'UserKnownHostsFile=/home/op/.ssh/known_hosts'" in script
    assert "ForwardAgent=no" in script and "BatchMode=yes" in script and script.rstrip().endswith('"$@"')
    accept = libvirt_host.ssh_wrapper_script(SshOptions(host="gpu01", accept_new_host_keys=True), Path("/k"))
    assert "StrictHostKeyChecking=accept-new" in accept
    with pytest.raises(InputError):
        libvirt_host.ssh_wrapper_script(SshOptions(host="gpu01"), Path("/tmp/it's"))


def test_disk_volume_is_copy_on_write_on_the_base_image() -> None:
    xml = libvirt_host.disk_volume_xml("train-1.qcow2", 20 << 30, "/var/lib/libvirt/images/jammy.qcow2")
    assert "<backingStore><path>/var/lib/libvirt/images/jammy.qcow2</path><format type='qcow2'/>" in xml
    assert "<capacity unit='bytes'>21474836480</capacity>" in xml and "<format type='qcow2'/>" in xml


class RecordingPool:
    """What libvirt_host asks of a storage pool: the volume XML it creates, the volumes it deletes."""

    def __init__(self) -> None:
        self.created: list[str] = []
        self.deleted: list[str] = []

    def createXML(self, xml: str, _flags: int) -> RecordingVolume:  # libvirt's method name
        self.created.append(xml)
        return RecordingVolume(self, "train-1-seed.iso")

    def storageVolLookupByName(self, name: str) -> RecordingVolume:  # libvirt's method name
        return RecordingVolume(self, name)


class RecordingVolume:
    def __init__(self, pool: RecordingPool, name: str) -> None:
        self.pool, self.name = pool, name

    def upload(self, *_: object) -> None:
        pass

    def path(self) -> str:
        return f"/var/lib/libvirt/images/{self.name}"

    def delete(self, _flags: int) -> None:
        self.pool.deleted.append(self.name)


class RecordingStream:
    def __init__(self) -> None:
        self.sent = b""

    def send(self, data: bytes) -> None:
        self.sent += data

    def finish(self) -> None:
        pass


class RecordingConnection:
    def __init__(self) -> None:
        self.stream = RecordingStream()

    def newStream(self, _flags: int) -> RecordingStream:  # libvirt's method name
        return self.stream


class RecordingDomain:
    def __init__(self) -> None:
        self.updates: list[tuple[str, int]] = []

    def updateDeviceFlags(self, xml: str, flags: int) -> None:  # libvirt's method name
        self.updates.append((xml, flags))


@pytest.mark.hostile
def test_the_seed_is_private_to_its_owner_and_removed_once_the_key_is_confirmed() -> None:
    """Issue 13 class 14: the seed carries the guest's SSH host private key."""
    import libvirt

    pool, conn = RecordingPool(), RecordingConnection()
    iso = build_seed_iso(seed_config())
    path = libvirt_host.upload_volume(conn, pool, "train-1-seed.iso", iso)
    assert "<mode>0600</mode>" in pool.created[0] and "0644" not in pool.created[0]
    assert conn.stream.sent == iso and path.endswith("train-1-seed.iso")
    domain = RecordingDomain()
    assert libvirt_host.remove_seed(domain, pool, "train-1-seed.iso") is True
    ((xml, flags),) = domain.updates
    # The drive the template attached (sda on SATA), now without a source: ejected live and in the definition.
    assert "<target dev='sda' bus='sata'/>" in xml and "<source" not in xml
    assert flags == libvirt.VIR_DOMAIN_AFFECT_LIVE | libvirt.VIR_DOMAIN_AFFECT_CONFIG
    assert pool.deleted == ["train-1-seed.iso"]
    template = (FIXTURES.parent.parent / "templates/domain.xml.j2").read_text()
    assert "<target dev='sda' bus='sata'/>" in template, "remove_seed must name the drive the template attaches"


# --- the SSH jump, through a real sshd --------------------------------------------------------


@pytest.mark.ssh
def test_jump_reaches_the_next_hop_and_still_verifies_its_key(tmp_path: Path) -> None:
    server = start_sshd(tmp_path, name="jump", local_forwarding=True)
    port, known = server.port, server.write_known_hosts(tmp_path / "known_hosts")
    try:
        options = SshOptions(host="127.0.0.1", port=port, key_file=server.client_key, known_hosts_file=known)
        with_jump = SshTransport(options)
        try:
            # The next hop is the same server, reached through the jump's direct-tcpip channel.
            channel = with_jump.open_tunnel("127.0.0.1", port)
            hop = SshTransport(dataclasses.replace(options, sock=channel))
            assert hop.run(["echo", "through the jump"]).stdout == b"through the jump\n"
            hop.close()
            wrong = tmp_path / "wrong_known_hosts"
            wrong.write_text(f"[127.0.0.1]:{port} {generate_ed25519('other').public_blob}\n")
            channel = with_jump.open_tunnel("127.0.0.1", port)
            with pytest.raises(TransportError) as refused:
                SshTransport(dataclasses.replace(options, known_hosts_file=wrong, sock=channel))
            assert refused.value.kind == "host-key-changed"
        finally:
            with_jump.close()
    finally:
        server.stop()


@pytest.mark.ssh
def test_a_host_that_forbids_forwarding_is_named(sshd_server: Sshd, sshd_known_hosts: Path) -> None:
    options = SshOptions(host="127.0.0.1", port=sshd_server.port, key_file=sshd_server.client_key)
    transport = SshTransport(dataclasses.replace(options, known_hosts_file=sshd_known_hosts))
    try:
        with pytest.raises(TransportError, match=r"cannot reach 192\.168\.122\.9:22 through this host") as refused:
            transport.open_tunnel("192.168.122.9", 22)
        assert refused.value.kind == "unreachable"
    finally:
        transport.close()


# --- the lab's guest image variant ------------------------------------------------------------


def test_guest_image_variant_adds_cloud_init_and_leaves_the_others_alone() -> None:
    from gpuhost.lab.recipe import BASE_PACKAGES, GUEST_PACKAGES, VARIANTS, recipe_for, recipe_hash

    guest, base, nested = recipe_for("guest"), recipe_for("base"), recipe_for("nested")
    assert "guest" in VARIANTS and guest.packages == BASE_PACKAGES and guest.apt_packages == GUEST_PACKAGES
    assert {"cloud-init", "python3-venv", "sudo"} <= set(GUEST_PACKAGES)
    files = {path: content for path, _, content in guest.files}
    conf = yaml.safe_load(files["/etc/cloud/cloud.cfg.d/90-gpuhost.cfg"])
    assert conf["datasource_list"] == ["NoCloud", "None"] and conf["network"] == {"config": "disabled"}
    assert {"users_groups", "ssh", "update_etc_hosts"} <= set(conf["cloud_init_modules"])
    assert "package_update_upgrade_install" in conf["cloud_final_modules"]
    # The other variants' recipes (and so their cached images) do not see the guest's additions.
    assert not {path for path, _, _ in (*base.files, *nested.files)} & {"/etc/cloud/cloud.cfg.d/90-gpuhost.cfg"}
    assert len({recipe_hash(guest), recipe_hash(base), recipe_hash(nested)}) == 3


# --- the guest's address: the lease, else the agent, else ARP --------------------------------


class AddressedDomain:
    """Answers interfaceAddresses per source as libvirt-python does ({} where a source knows
    nothing; libvirtError where it cannot answer, as for an agent that is not running)."""

    def __init__(self, answers: dict[int, dict[str, object] | None]) -> None:
        self.answers = answers
        self.asked: list[int] = []

    def interfaceAddresses(self, source: int, flags: int) -> dict[str, object]:  # libvirt's method name
        import libvirt

        self.asked.append(source)
        answer = self.answers.get(source)
        if answer is None:
            raise libvirt.libvirtError("Guest agent is not responding: QEMU guest agent is not connected")
        return answer


def _interface(*addresses: tuple[int, str]) -> dict[str, object]:
    return {"addrs": [{"type": kind, "addr": addr, "prefix": 24} for kind, addr in addresses], "hwaddr": None}


def test_a_bridged_guest_is_found_through_its_agent_and_only_routable_addresses_count() -> None:
    import libvirt

    v4, v6 = libvirt.VIR_IP_ADDR_TYPE_IPV4, libvirt.VIR_IP_ADDR_TYPE_IPV6
    agent_answer = {
        "lo": _interface((v4, "127.0.0.1"), (v6, "::1")),
        "enp1s0": _interface((v4, "10.20.0.7"), (v6, "fe80::5054:ff:fe12:3456")),
        "enp2s0": _interface((v4, "169.254.3.4"), (v4, "not an address")),
    }
    domain = AddressedDomain(
        {
            libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_LEASE: {},
            libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_AGENT: agent_answer,
        }
    )
    found = libvirt_host.guest_addresses(domain)
    assert found == libvirt_host.GuestAddresses(libvirt_host.AddressSource.AGENT, ("10.20.0.7",))
    assert domain.asked == [
        libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_LEASE,
        libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_AGENT,
    ]


def test_without_lease_or_agent_the_arp_table_is_asked_and_nothing_is_a_timeout() -> None:
    import libvirt

    arp = {"vnet3": _interface((libvirt.VIR_IP_ADDR_TYPE_IPV4, "10.20.0.9"))}
    domain = AddressedDomain(
        {libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_LEASE: {}, libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_ARP: arp}
    )
    found = libvirt_host.guest_addresses(domain)
    assert found is not None and found.source is libvirt_host.AddressSource.ARP and found.addresses == ("10.20.0.9",)
    silent = AddressedDomain(
        {libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_LEASE: {}, libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_ARP: {}}
    )
    with pytest.raises(TimeoutError, match="no DHCP lease, no answer from a guest agent, nothing in the host's ARP"):
        libvirt_host.wait_for_address(silent, 0.01, still_running=lambda: True)
