"""`gpuhost render` through the CLI, and the validation of `gpuhost_vms` inventory values."""

from __future__ import annotations

import shutil
import xml.etree.ElementTree as ET

import pytest

from gpuhost.cli import render as render_cli
from gpuhost.cli.main import main
from gpuhost.cli.render import parse_taken, parse_taken_cpus
from gpuhost.errors import InputError
from gpuhost.inventory.spec import find_vm, host_policy, parse_vm, parse_vms
from gpuhost.selection import GpuSelector
from gpuhost.targets import ConnectionDefaults, inventory_targets
from tests.helpers import SNAPSHOTS
from tests.render.test_domain import eight_gpu_two_socket_host, pins_and_emulator, require_validator

LAB_FRESH = SNAPSHOTS / "lab-gpu-pair-fresh"

INVENTORY = """\
all:
  hosts:
    lab-1:
      ansible_host: 127.0.0.1
      ansible_port: 2201
      gpuhost_gpus: ["1234:1111"]
      gpuhost_reserved_cpus: "1"
      gpuhost_vms:
        - name: nested-proof
          vcpus: 1
          memory: 1G
          gpus: [gpu0]
          domain_type: qemu
          network: none
          kernel: /boot/vmlinuz
          initrd: /var/lib/gpuhost/busybox-initrd.gz
          cmdline: console=ttyS0
        - name: train-1
          vcpus: 2
          memory: 2G
          gpus: none  # the host's one GPU is nested-proof's: a GPU goes to one declared VM
          base_image: /var/lib/libvirt/images/base/debian-12.qcow2
          disk_size: 20G
          ssh_key: ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExampleKeyOnlyForTests ops@controller
          cuda_version: "12.6"
"""


@pytest.fixture
def inventory(tmp_path):
    path = tmp_path / "inventory.yml"
    path.write_text(INVENTORY)
    return path


@pytest.fixture
def applied_snapshot(tmp_path):
    """The recorded lab host with its stand-in GPU's functions bound to vfio-pci, as after apply."""
    copy = tmp_path / "lab-applied"
    shutil.copytree(LAB_FRESH, copy)
    for function in ("0000:01:00.0", "0000:01:00.1"):
        # A snapshot records a symlink as a file naming its target.
        (copy / f"sys/bus/pci/devices/{function}/driver").write_text("../../../../bus/pci/drivers/vfio-pci\n")
    return copy


def test_render_refuses_the_fresh_lab_host_naming_the_conflict(inventory, capsys):
    status = main(
        ["render", "-i", str(inventory), "--host", "lab-1", "--vm", "nested-proof", "--from-snapshot", str(LAB_FRESH)]
    )
    captured = capsys.readouterr()
    assert status == 2 and captured.out == ""
    assert "refusing to render VM 'nested-proof' for host lab-1" in captured.err
    assert "0000:01:00.0 [1234:1111] is bound to bochs-drm, not vfio-pci" in captured.err


@pytest.mark.libvirt
def test_render_from_an_applied_snapshot_writes_valid_xml(inventory, applied_snapshot, capsys):
    require_validator()
    args = ["render", "-i", str(inventory), "--host", "lab-1", "--vm", "nested-proof"]
    status = main([*args, "--from-snapshot", str(applied_snapshot)])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    domain = ET.fromstring(captured.out)
    assert domain.findtext("name") == "nested-proof"
    assert [p.get("cpuset") for p in domain.iter("vcpupin")] == ["0"]  # CPU 1 is reserved
    status = main([*args, "--from-snapshot", str(applied_snapshot), "--taken", "0000:01:00.0=other"])
    assert status == 2 and "already given to domain 'other'" in capsys.readouterr().err


def test_render_needs_an_inventory_and_a_known_vm(inventory, capsys):
    assert main(["render", "--host", "lab-1", "--vm", "x", "--from-snapshot", str(LAB_FRESH)]) == 2
    assert "-i inventory.yml" in capsys.readouterr().err
    assert main(["render", "-i", str(inventory), "--host", "lab-1", "--vm", "nope"]) == 2
    assert "no VM 'nope' in gpuhost_vms (defined: nested-proof, train-1)" in capsys.readouterr().err
    assert main(["render", "-i", str(inventory), "--host", "gpu9", "--vm", "train-1"]) == 2
    assert "no host 'gpu9'" in capsys.readouterr().err
    assert main(["render", "-i", str(inventory), "--host", "lab-*", "--vm", "train-1"]) == 2
    assert "not a valid name" in capsys.readouterr().err


def test_inventory_vms_and_policy_read_through_ansible(inventory):
    (target,) = inventory_targets(inventory, "lab-1", ConnectionDefaults())
    vm = find_vm(target.variables, "train-1", "lab-1")
    assert (vm.vcpus, vm.memory_mib, vm.gpus, vm.disk_size_gib, vm.cuda_version) == (2, 2048, (), 20, "12.6")
    assert vm.ssh_key is not None and vm.ssh_key.startswith("ssh-ed25519 ")
    policy = host_policy(target.variables, target.policy, "lab-1")
    assert policy.reserved_cpus == "1" and policy.gpus.vendor_devices == ("1234:1111",)
    assert policy.ovmf_code == "/usr/share/OVMF/OVMF_CODE_4M.fd"


def test_taken_option_is_validated():
    assert parse_taken(["41:00.0=train-2"]) == {"0000:41:00.0": "train-2"}
    for bad in ("0000:41:00.0", "nonsense=vm", "41:00.0=bad;name"):
        with pytest.raises(InputError):
            parse_taken([bad])
    assert parse_taken_cpus(["64-65,70=train-2"]) == {64: "train-2", 65: "train-2", 70: "train-2"}
    for bad in ("64-71", "71-64=vm", "0-99999=vm", "a-b=vm", "64=bad;name"):
        with pytest.raises(InputError, match="--taken-cpus"):
            parse_taken_cpus([bad])


# Two 8-vCPU VMs with one GPU each on node 1 of the 2-socket host of tests/render/test_domain.py, and a
# third that node 1 cannot hold once they have their CPUs.
TWO_SOCKET_INVENTORY = """\
all:
  hosts:
    hgx:
      ansible_host: 127.0.0.1
      gpuhost_reserved_cpus: "0-1,32-33"
      gpuhost_vms:
        - {name: train-a, vcpus: 8, memory: 64G, gpus: [gpu4]}
        - {name: train-b, vcpus: 8, memory: 64G, gpus: [gpu5]}
        - {name: train-c, vcpus: 48, memory: 64G, gpus: [gpu6]}
"""


@pytest.fixture
def two_socket_inventory(tmp_path, monkeypatch):
    """The inventory above, its host's facts those of the 2-socket host (built from recorded facts
    in tests/render/test_domain.py; no capture of a 2-socket host exists to read with --from-snapshot)."""
    monkeypatch.setattr(render_cli, "_facts", lambda target, snapshot: eight_gpu_two_socket_host())
    path = tmp_path / "inventory.yml"
    path.write_text(TWO_SOCKET_INVENTORY)
    return path


def test_render_shares_one_hosts_cpus_out_among_its_vms(two_socket_inventory, capsys):
    def render(vm: str, *extra: str) -> tuple[int, str, str]:
        args = ["render", "-i", str(two_socket_inventory), "--host", "hgx", "--vm", vm, "--no-validate", *extra]
        status = main(args)
        captured = capsys.readouterr()
        return status, captured.out, captured.err

    status_b, xml_b, err = render("train-b")  # rendered first: its pins still leave train-a's CPUs
    assert status_b == 0, err
    status_a, xml_a, err = render("train-a")
    assert status_a == 0, err
    pins_a, emulator_a = pins_and_emulator(xml_a)
    pins_b, emulator_b = pins_and_emulator(xml_b)
    assert pins_a == set(range(34, 42)) and pins_b == set(range(42, 50))
    assert not (emulator_a | emulator_b) & (pins_a | pins_b)
    assert render("train-b") == (0, xml_b, "")  # rendered again: the same XML
    status, out, err = render("train-c")
    assert status == 2 and out == ""
    assert "refusing to render VM 'train-c' for host hgx" in err
    assert "NUMA node 1, which has 62 usable CPUs: VM train-a (8), VM train-b (8) hold 16 of them" in err
    # A domain outside the inventory holds CPUs of node 1: every VM keeps off them.
    status, xml, err = render("train-b", "--taken-cpus", "34-41=legacy")
    assert status == 0, err
    assert pins_and_emulator(xml)[0] == set(range(50, 58))


# --- gpuhost_vms values -----------------------------------------------------------------------

GOOD = {"name": "train-1", "vcpus": 8, "memory": "64G", "gpus": ["gpu0", "41:00.0"]}


def bad(where_text: str, **overrides: object) -> None:
    entry = {**GOOD, **overrides}
    with pytest.raises(InputError) as caught:
        parse_vm(entry, "host gpu01: gpuhost_vms[0]")
    assert where_text in str(caught.value)


def test_a_good_vm_parses():
    vm = parse_vm(GOOD, "t")
    assert vm.gpus == ("gpu0", "0000:41:00.0") and vm.memory_mib == 65536 and vm.hugepages == "auto"
    assert parse_vm({**GOOD, "memory": "65536M", "hugepages": False}, "t").hugepages == "off"
    assert parse_vm({**GOOD, "memory": "1T"}, "t").memory_mib == 1024 * 1024


@pytest.mark.parametrize(
    "name", ["", "-x", "train 1", "a;b", "$(reboot)", "a..b", "x" * 65, "name'", "ä", "a/b", ".hidden"]
)
def test_names_are_refused(name):
    bad("name", name=name)


@pytest.mark.parametrize("memory", ["64", 64, "64 apples", "100K", "1K", "17T", "-1G", "128M"])
def test_sizes_need_a_unit_and_a_sane_range(memory):
    bad("memory", memory=memory)


@pytest.mark.parametrize("vcpus", [0, -1, "two", True, 4097, 1.5, "8;"])
def test_counts_are_whole_numbers_in_range(vcpus):
    bad("vcpus", vcpus=vcpus)


@pytest.mark.parametrize(
    "path",
    [
        "relative/disk.qcow2",
        "/var/lib/../../etc/shadow",
        "/tmp/a;rm -rf",
        "/tmp/$(id)",
        "/tmp/'q'",
        '/tmp/"q"',
        "/tmp/a\nb",
        "/tmp/`id`",
    ],
)
def test_paths_refuse_traversal_and_shell_metacharacters(path):
    bad("base_image", base_image=path)
    bad("kernel", kernel=path)


@pytest.mark.parametrize("cmdline", ["console=ttyS0; reboot", "a $(id)", "a\nb", "quote'd"])
def test_kernel_command_lines_refuse_metacharacters(cmdline):
    bad("cmdline", cmdline=cmdline)


@pytest.mark.parametrize(
    ("key", "value", "text"),
    [
        ("gpus", [], "empty"),
        ("gpus", ["gpu0", "gpu0"], "more than once"),
        ("gpus", ["10de:2330"], "names no GPU"),
        ("gpus", ["nvidia"], "names no GPU"),
        ("gpus", 3, "'all' or a list"),
        ("disk_size", "10M", "whole number of GiB"),
        ("ssh_key", "ssh-ed25519 AAAA; rm", "contains ';'"),
        ("ssh_key", "not a key at all", "not an OpenSSH public key"),
        ("cuda_version", "latest", "CUDA version"),
        ("hugepages", "maybe", "not one of auto, on, off"),
        ("domain_type", "xen", "not one of kvm, qemu"),
        ("firmware", "coreboot", "not one of uefi, bios"),
        ("network", "br0;x", "not a valid name"),
        ("colour", "blue", "unknown key(s) colour"),
    ],
)
def test_other_values_are_validated(key, value, text):
    bad(text, **{key: value})


def test_vm_lists_are_validated():
    with pytest.raises(InputError, match="names VM 'a' twice"):
        parse_vms([{**GOOD, "name": "a"}, {**GOOD, "name": "a"}], "h")
    with pytest.raises(InputError, match="must be a list"):
        parse_vms({"name": "a"}, "h")
    assert parse_vms(None, "h") == ()


def test_host_policy_values_are_validated():
    from gpuhost.inventory.policy import AuditPolicy

    policy = AuditPolicy(gpus=GpuSelector.parse("all", "t"))
    with pytest.raises(InputError, match="gpuhost_reserved_cpus"):
        host_policy({"gpuhost_reserved_cpus": "0-1; reboot"}, policy, "h")
    with pytest.raises(InputError, match="gpuhost_ovmf_code"):
        host_policy({"gpuhost_ovmf_code": "/usr/share/../../tmp/evil.fd"}, policy, "h")


def test_a_snapshot_of_another_host_is_refused_naming_both(tmp_path, capsys):
    """Issue 27 item 6: --from-snapshot of lab-1 with --host gpu02 said nothing and rendered gpu02's
    VM on lab-1's hardware."""
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(INVENTORY.replace("    lab-1:\n", "    gpu02:\n"))
    status = main(["render", "-i", str(inventory), "--host", "gpu02", "--vm", "nested-proof", "--no-validate",
                   "--from-snapshot", str(LAB_FRESH)])  # fmt: skip
    err = capsys.readouterr().err
    assert status == 2 and f"--from-snapshot {LAB_FRESH}: it is a snapshot of 'lab-1', not of --host gpu02" in err
    assert "--host lab-1" in err and "gpuhost snapshot -i INVENTORY gpu02 -o DIR" in err


def test_render_to_a_file_writes_the_nccl_topology_beside_it(inventory, applied_snapshot, tmp_path, capsys):
    out = tmp_path / "nested-proof.xml"
    args = ["render", "-i", str(inventory), "--host", "lab-1", "--vm", "nested-proof", "--no-validate"]
    status = main([*args, "--from-snapshot", str(applied_snapshot), "-o", str(out)])
    assert status == 0, capsys.readouterr().err
    assert ET.fromstring(out.read_text()).findtext("name") == "nested-proof"
    topology = ET.fromstring((tmp_path / "nested-proof.nccl-topo.xml").read_text())
    # The stand-in GPU's display function, behind the domain's first root port: guest bus 1.
    assert [(p.get("busid"), p.get("vendor")) for p in topology.iter("pci")] == [("0000:01:00.0", "0x1234")]
    assert [c.get("numaid") for c in topology.iter("cpu")] == ["0"]
