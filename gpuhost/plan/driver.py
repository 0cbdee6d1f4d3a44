"""The host's own NVIDIA driver: which modules are blacklisted, kept or removed, and what the initramfs loads."""

from __future__ import annotations

import re

from gpuhost.facts.model import (
    HOST_DRIVER_MODULES,
    NVIDIA_IN_TREE_NAMESAKES,
    VFIO_INITRAMFS_MODULES,
    HostFacts,
    VfioPci,
)
from gpuhost.facts.parsers import parse_modprobe_options
from gpuhost.facts.pci import VENDOR_NVIDIA
from gpuhost.inventory.plan_settings import PlanSettings
from gpuhost.plan.model import DriverRemoval, ModprobeConflict
from gpuhost.selection import GpuSelection, NvSwitchModel

BLACKLIST = ("nouveau", "nvidia", "nvidiafb")

# NVIDIA's driver module files, compressed or not, as the gather finds them in every /lib/modules/*/
# (the kernel's own namesakes aside): what apply looks for after the driver's removal.
NVIDIA_MODULE_GLOBS = ("nvidia.ko*", "nvidia-*.ko*")
NVIDIA_MODULE_EXCLUDED_GLOBS = tuple(f"{name.replace('_', '-')}.ko*" for name in sorted(NVIDIA_IN_TREE_NAMESAKES))

# Left loadable where the host keeps its NVIDIA driver (gpuhost_remove_nvidia_driver: false): it keeps
# an NVIDIA GPU or tool whose driver must load; the passthrough functions are bound to vfio-pci
# before it can claim them (vfio-pci.ids, or driver_override from the initramfs).
KEPT_DRIVER_MODULES = ("nvidia",)


def blacklisted_modules(removes_nvidia_driver: bool) -> tuple[str, ...]:
    """modprobe.blacklist's host GPU drivers: all of BLACKLIST, or nouveau's where the host keeps nvidia."""
    return BLACKLIST if removes_nvidia_driver else tuple(m for m in BLACKLIST if m not in KEPT_DRIVER_MODULES)


def forbidden_loaded_modules(removes_nvidia_driver: bool) -> tuple[str, ...]:
    """The HOST_DRIVER_MODULES that must not be loaded after apply (the verification's check)."""
    if removes_nvidia_driver:
        return HOST_DRIVER_MODULES
    return tuple(m for m in HOST_DRIVER_MODULES if m in blacklisted_modules(False))


def find_modprobe_conflicts(facts: HostFacts) -> tuple[ModprobeConflict, ...]:
    """`options vfio-pci ids=` lines in /etc/modprobe.d: a second, competing list of IDs."""
    return tuple(
        ModprobeConflict(d.path, d.line_number, d.source)
        for d in facts.modprobe
        if d.command == "options"
        and d.module == "vfio_pci"
        and "ids" in parse_modprobe_options(d.arguments)
        and d.path.startswith("/etc/modprobe.d/")
    )


def vfio_initramfs_modules(facts: HostFacts) -> tuple[str, ...]:
    if facts.vfio_pci != VfioPci.MODULE:
        return ()  # built in (nothing to load) or absent (refused)
    return VFIO_INITRAMFS_MODULES + (("vfio_virqfd",) if _has_vfio_virqfd(facts.kernel_release) else ())


def _has_vfio_virqfd(release: str | None) -> bool:
    """vfio_virqfd was merged into vfio in Linux 6.2."""
    match = re.match(r"(\d+)\.(\d+)", release or "")
    return match is not None and (int(match.group(1)), int(match.group(2))) < (6, 2)


def plan_driver_removal(facts: HostFacts, settings: PlanSettings, selection: GpuSelection) -> DriverRemoval:
    nvidia = facts.nvidia
    if not settings.remove_nvidia_driver:
        return DriverRemoval((), False, (), False, "gpuhost_remove_nvidia_driver is false: the host driver is kept")
    fabric = {p.name for p in nvidia.fabric_packages}
    # Fabric Manager goes with the driver only where the NVSwitches go to the guest (full passthrough):
    # the guest runs its own. Where they stay on the host it is what trains their NVLinks: never purged.
    keep_fabric = bool(fabric) and selection.nvswitch_model is not NvSwitchModel.FULL_PASSTHROUGH
    packages = tuple(sorted(p.name for p in nvidia.packages or () if not (keep_fabric and p.name in fabric)))
    files = sorted(
        {d.path for d in facts.modprobe if d.path.rsplit("/", 1)[-1].startswith("nvidia") and d.path.endswith(".conf")}
    )
    if nvidia.installed and facts.xorg_conf is not False:  # never "delete" (and back up) a file that is not there
        files.insert(0, "/etc/X11/xorg.conf")
    kept_nvidia = [card.gpu.address for card in selection.kept if card.gpu.vendor == VENDOR_NVIDIA]
    dkms_modules = _nvidia_dkms_modules(facts)
    module_files = tuple(sorted(m.path for m in nvidia.module_files or ()))
    if not (packages or nvidia.runfile_installed or files or dkms_modules or module_files):
        note = "no host NVIDIA driver is installed: nothing to remove"
    else:
        parts = []
        if packages:
            parts.append(f"purge {', '.join(packages)}")
        if module_files:
            parts.append(
                f"remove the NVIDIA kernel modules {', '.join(module_files)} (with their packages, DKMS or the "
                "uninstaller; apply deletes any left that no package owns, and checks that no NVIDIA driver module "
                "is left in any /lib/modules/*/)"
            )
        if nvidia.runfile_installed:
            parts.append("run nvidia-uninstall -s (a .run install)")
        if files:
            parts.append(f"delete {', '.join(files)}")
        note = "; ".join(parts)
    # DKMS builds NVIDIA's kernel modules for every installed kernel; the purge (the package's prerm)
    # or nvidia-uninstall runs `dkms remove`, and apply removes whatever DKMS still has after them.
    dkms_packaged = any("dkms" in name for name in packages)
    dkms_cleanup = bool(dkms_modules) or dkms_packaged or nvidia.runfile_installed
    if dkms_modules or dkms_packaged:
        note += "; " + _dkms_note(facts, dkms_modules)
    if kept_nvidia:
        note += f" (note: the host keeps NVIDIA GPU(s) {', '.join(kept_nvidia)}, which lose their driver)"
    if fabric and not keep_fabric:
        note += f"; {', '.join(sorted(fabric))} go(es) too: the NVSwitches go to the guest, which runs its own"
    elif keep_fabric:
        note += f"; {', '.join(sorted(fabric))} kept: the host's NVSwitches need it"
    return DriverRemoval(
        packages,
        nvidia.runfile_installed,
        tuple(files),
        True,
        note,
        dkms_modules=dkms_modules,
        dkms_cleanup=dkms_cleanup,
        module_files=module_files,
        module_globs=NVIDIA_MODULE_GLOBS,
        module_excluded_globs=NVIDIA_MODULE_EXCLUDED_GLOBS,
    )


def _nvidia_dkms_modules(facts: HostFacts) -> tuple[str, ...]:
    """The NVIDIA modules DKMS installed for the running kernel (its updates/dkms directory)."""
    return tuple(
        m.path
        for m in facts.firmware.out_of_tree_modules or ()
        if "/updates/dkms/" in m.path and m.name.startswith("nvidia")
    )


def _dkms_note(facts: HostFacts, modules: tuple[str, ...]) -> str:
    """What apply does with the DKMS-built NVIDIA modules, and with the MOK key that signed them."""
    found = facts.firmware.out_of_tree_modules or ()
    names = ", ".join(m.rsplit("/", 1)[-1] for m in modules) or "the NVIDIA modules"
    text = (
        f"DKMS: {names} are removed for every installed kernel (`dkms remove --all` for each NVIDIA module DKMS "
        "has, after the purge), and apply checks that no nvidia*.ko is left in /lib/modules/*/updates/dkms"
    )
    signers = sorted({m.signer for m in found if m.path in modules and m.signer})
    if signers:
        text += (
            f"; they are signed with {', '.join(repr(s) for s in signers)} (the MOK key DKMS signs with, "
            "/var/lib/dkms/mok.pub), which stays enrolled: removing a MOK takes `mokutil --delete` and a person at "
            "the console who confirms it in shim's MokManager at the next boot, which an unattended rollout cannot "
            "do; the key may sign other DKMS modules of the host, and with no module signed by it, it loads nothing. "
            "Delete it by hand if nothing needs it"
        )
    elif facts.firmware.secure_boot is True and modules:
        text += "; Secure Boot: they are unsigned (the kernel already refuses them), so no MOK key is involved"
    return text
