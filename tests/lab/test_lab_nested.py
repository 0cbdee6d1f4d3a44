"""A nested guest inside a lab host receives the stand-in GPU through VFIO (nested image variant).

Opt-in on top of `-m lab` (GPUHOST_LAB_NESTED=1): the nested image takes several minutes to build
and the guest about two minutes to boot at two levels of emulation.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuhost.lab import fleet
from gpuhost.lab import image as lab_image
from gpuhost.lab.paths import LabPaths
from gpuhost.lab.state import VmRecord

pytestmark = [
    pytest.mark.lab,
    pytest.mark.skipif(
        os.environ.get("GPUHOST_LAB_NESTED") != "1",
        reason="set GPUHOST_LAB_NESTED=1 to build the nested image and boot a nested guest",
    ),
]

# Runtime binding (driver_override) is enough to prove the guest path; binding at boot is
# what gpuhost apply does and the audit checks.
BIND_SCRIPT = r"""
set -e
modprobe vfio-pci
for d in 0000:01:00.0 0000:01:00.1; do
  echo vfio-pci > /sys/bus/pci/devices/$d/driver_override
  if [ -e /sys/bus/pci/devices/$d/driver ]; then echo $d > /sys/bus/pci/devices/$d/driver/unbind; fi
  echo $d > /sys/bus/pci/drivers_probe
  basename "$(readlink /sys/bus/pci/devices/$d/driver)"
done
"""


@pytest.fixture(scope="module")
def nested_host(image_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LabPaths, VmRecord]]:
    paths = LabPaths(root=tmp_path_factory.mktemp("nested"), images=image_dir)
    if lab_image.find_image(paths, "nested") is None and os.geteuid() != 0:
        pytest.skip("no cached nested image and building one needs root")
    started = time.monotonic()
    built = lab_image.ensure_image(paths, "nested")
    print(f"[lab timing] nested image {'reused' if built.reused else 'built'} in {time.monotonic() - started:.0f} s")
    try:
        result = fleet.up(paths, hosts=1, topology="gpu-pair", variant="nested", memory_mib=3072, timeout=400)
        yield paths, result.hosts[0]
    finally:
        fleet.down(paths)


def test_nested_guest_sees_the_gpu_through_vfio(nested_host: tuple[LabPaths, VmRecord]) -> None:
    paths, record = nested_host
    bound = fleet.run_on(paths, record, ["sh", "-c", BIND_SCRIPT], timeout=120)
    assert bound.returncode == 0 and bound.stdout.split() == ["vfio-pci", "vfio-pci"], bound.stderr
    started = time.monotonic()
    guest = fleet.run_on(
        paths,
        record,
        [
            "timeout",
            "900",
            "gpuhost-nested-guest",
            "-device",
            "vfio-pci,host=0000:01:00.0",
            "-device",
            "vfio-pci,host=0000:01:00.1",
        ],
        timeout=960,
    )
    print(
        f"[lab timing] nested guest with two VFIO functions booted and listed PCI in {time.monotonic() - started:.0f} s"
    )
    out = guest.stdout
    assert "GPUHOST-GUEST-PCI-BEGIN" in out and "GPUHOST-GUEST-PCI-END" in out, guest.stderr + out[-2000:]
    listing = out.split("GPUHOST-GUEST-PCI-BEGIN", 1)[1].split("GPUHOST-GUEST-PCI-END", 1)[0]
    assert "1234:1111 class 0x030000" in listing
    assert "8086:293e class 0x040300" in listing
