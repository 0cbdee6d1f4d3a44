"""Parsers on real text: the H100 passthrough guest capture, this machine's snapshot, the guide."""

from __future__ import annotations

import pytest

from gpuhost.facts import parsers as p
from tests.helpers import FIXTURES, SNAPSHOTS

# The H100 guest's capture (../shared/fixtures/h100-passthrough-guest), byte for byte, as the
# snapshot in the repository holds it: CI's clone need not sit beside ../shared.
H100_PROC = SNAPSHOTS / "h100-guest/proc"

H100_SYSFS = SNAPSHOTS / "h100-guest/sys/bus/pci/devices/0000:00:06.0"
GUIDE_CMDLINE = (
    "BOOT_IMAGE=/boot/vmlinuz-6.8.0-71-generic root=/dev/mapper/vgroot-lvroot ro "
    "systemd.unified_cgroup_hierarchy=false default_hugepagesz=1G hugepages=576 hugepagesz=1G nomodeset "
    "video=efifb:off iommu=pt pci=realloc pcie_aspm=off amd_iommu=on "
    "vfio-pci.ids=10de:0000,10de:204b,10de:22e8,10de:2bb1 modprobe.blacklist=nouveau,nvidia,nvidiafb,snd_hda_intel"
)


def read(path):
    return path.read_bytes().rstrip(b"\0").decode()


def test_cpuinfo_of_the_h100_guest():
    cpu = p.parse_cpuinfo((H100_PROC / "cpuinfo").read_text())
    assert cpu.vendor == "GenuineIntel"
    assert cpu.logical_cpus == 16
    assert "pdpe1gb" in cpu.flags and "hypervisor" in cpu.flags
    assert not cpu.has_virtualization  # the microVM exposes no vmx


def test_meminfo_of_the_h100_guest():
    memory = p.parse_meminfo((H100_PROC / "meminfo").read_text())
    assert memory.total_kib == 131981020
    assert memory.hugepages_total == 0
    assert memory.hugepage_size_kib == 2048


def test_firecracker_cmdline_stops_at_double_dash():
    text = (SNAPSHOTS / "h100-guest/proc/cmdline").read_text()
    cmdline = p.parse_cmdline(text)
    assert cmdline.value("pci") == "realloc=off"
    assert cmdline.value("panic") == "1"
    assert "--firecracker-init" not in cmdline.tokens  # after '--': arguments for init


def test_cmdline_of_the_guide_host():
    cmdline = p.parse_cmdline(GUIDE_CMDLINE)
    assert cmdline.list_value("vfio-pci.ids") == ("10de:0000", "10de:204b", "10de:22e8", "10de:2bb1")
    assert cmdline.list_value("modprobe.blacklist") == ("nouveau", "nvidia", "nvidiafb", "snd_hda_intel")
    assert cmdline.has("nomodeset") and cmdline.values("nomodeset") == [""]


def test_cmdline_quotes_group_a_value():
    assert p.parse_cmdline('a="b c" d').tokens == ("a=b c", "d")


def test_hugepages_request_follows_the_kernels_order():
    # The guide's line gives hugepages=576 before hugepagesz=1G: default_hugepagesz=1G makes it 1 GiB pages.
    assert p.parse_hugepages_request(p.parse_cmdline(GUIDE_CMDLINE).tokens) == {1048576: 576}
    tokens = p.parse_cmdline("hugepages=16 hugepagesz=1G hugepages=4").tokens
    assert p.parse_hugepages_request(tokens) == {2048: 16, 1048576: 4}


def test_hugepages_node_form_as_the_kernel_documents_it():
    # Documentation/admin-guide/kernel-parameters.txt (hugepages=, Linux 5.16 on): "hugepagesz=1G
    # hugepages=0:1,1:3 ... will allocate 1 hugepage in node0 and 3 hugepages in node1".
    tokens = p.parse_cmdline("hugepagesz=1G hugepages=0:1,1:3").tokens
    assert p.parse_hugepages_by_node(tokens) == {1048576: ((0, 1), (1, 3))}
    assert p.parse_hugepages_request(tokens) == {1048576: 4}
    # The plain form names no node: the kernel spreads it.
    assert p.parse_hugepages_by_node(p.parse_cmdline(GUIDE_CMDLINE).tokens) == {1048576: ((None, 576),)}


@pytest.mark.parametrize(
    ("attribute", "parse", "expected"),
    [
        ("vendor", p.parse_hex, 0x10DE),
        ("device", p.parse_hex, 0x2330),
        ("class", p.parse_hex, 0x030200),
        ("current_link_speed", p.parse_link_speed, 32.0),
        ("max_link_width", p.parse_int, 16),
        ("numa_node", p.parse_int, -1),
        ("reset_method", p.parse_reset_methods, ("flr",)),
        ("driver_override", p.parse_optional_text, None),
    ],
)
def test_h100_sysfs_attributes(attribute, parse, expected):
    assert parse(read(H100_SYSFS / attribute)) == expected


def test_h100_bars_from_resource():
    bars = p.parse_pci_resource(read(H100_SYSFS / "resource"))
    # 64-bit BARs take two slots: NVIDIA's BAR1 is resource line 2.
    assert [bar.index for bar in bars] == [0, 2, 4]
    bar1 = bars[1]
    assert bar1.size == 128 * 1024**3  # BAR1 128 GiB, as NVML reported in that guest
    assert bar1.is_64bit and bar1.is_prefetchable
    assert bars[0].size == 16 * 1024**2 and bars[2].size == 32 * 1024**2


def test_mounts_and_packages_of_this_machine():
    mounts = p.parse_mounts((SNAPSHOTS / "dev-vm/proc/mounts").read_text())
    assert any(m.target == "/" for m in mounts)
    packages = p.parse_dpkg_status((SNAPSHOTS / "dev-vm/commands/dpkg.txt").read_text())
    names = {package.name for package in packages}
    assert {"openssh-server", "pciutils", "qemu-system-x86"} <= names
    assert not any(name.startswith("nvidia-") for name in names)


def test_pci_device_paths_give_no_parents_on_a_flat_bus():
    paths = p.parse_pci_device_paths((SNAPSHOTS / "dev-vm/commands/pci-device-paths.txt").read_text())
    assert paths and all(parents == () for parents in paths.values())


def test_lspci_nn_of_the_guide_and_of_this_machine():
    guide = p.parse_lspci_nn((FIXTURES / "guide/five-gpu-host.txt").read_text())
    assert len(guide) == 10
    assert guide[0].address == "0000:c1:00.0" and guide[0].class_code == 0x0300
    assert (guide[0].vendor, guide[0].device) == (0x10DE, 0x2BB1)
    local = p.parse_lspci_nn((SNAPSHOTS / "dev-vm/commands/lspci-nn.txt").read_text())
    assert {entry.vendor for entry in local} >= {0x1AF4}  # virtio devices of this microVM


def test_debians_stock_modprobe_files_concern_no_gpu_driver():
    # Debian's /lib/modprobe.d files blacklist framebuffers and set bonding/dummy options: nothing for the audit.
    for path in ("/lib/modprobe.d/fbdev-blacklist.conf", "/lib/modprobe.d/systemd.conf"):
        text = (SNAPSHOTS / "dev-vm" / path.lstrip("/")).read_text()
        assert "blacklist" in text or "options" in text
        assert p.parse_modprobe_conf(path, text) == ()


def test_modprobe_names_with_dashes_are_module_names():
    # modprobe treats '-' and '_' alike, so 'options vfio-pci' configures the module vfio_pci.
    (directive,) = p.parse_modprobe_conf("/etc/modprobe.d/vfio.conf", "options vfio-pci ids=10de:2330\n")
    assert (directive.command, directive.module, directive.arguments) == ("options", "vfio_pci", "ids=10de:2330")


def test_memory_sizes():
    assert p.parse_memory_size_kib("1G") == 1048576
    assert p.parse_memory_size_kib("2M") == 2048
    assert p.parse_memory_size_kib("bogus") is None
