"""Host NVIDIA drivers, modprobe configuration and the initramfs."""

from __future__ import annotations

from collections.abc import Iterator

from gpuhost.checks.base import CheckContext
from gpuhost.facts.model import (
    HOST_DRIVER_MODULES,
    VFIO_INITRAMFS_MODULES,
    NvidiaInstall,
    NvidiaModuleFile,
    VfioPci,
)
from gpuhost.problems import Problem, Severity, Stage, listed, register

ERROR, WARNING, INFO = Severity.ERROR, Severity.WARNING, Severity.INFO

NVIDIA_LOADED = register("nvidia.loaded", Stage.AUDIT, Severity.ERROR, "a host GPU driver module is loaded")
NVIDIA_LOADED_UNKNOWN = register(
    "nvidia.loaded.unknown", Stage.AUDIT, Severity.WARNING, "/proc/modules unreadable: loaded drivers unknown"
)
NVIDIA_INSTALLED = register(
    "nvidia.installed", Stage.AUDIT, Severity.WARNING, "host NVIDIA driver packages are installed"
)
NVIDIA_INSTALLED_RUNFILE = register(
    "nvidia.installed.runfile", Stage.AUDIT, Severity.WARNING, "a runfile NVIDIA driver install is present"
)
NVIDIA_INSTALLED_MODULES = register(
    "nvidia.installed.modules",
    Stage.AUDIT,
    Severity.WARNING,
    "NVIDIA driver modules are installed for a kernel (DKMS, precompiled packages, .run)",
)
NVIDIA_INSTALLED_UNKNOWN = register(
    "nvidia.installed.unknown", Stage.AUDIT, Severity.INFO, "no package database readable: installed drivers unknown"
)
MODPROBE_VFIO_IDS_CONFLICT = register(
    "modprobe.vfio_ids_conflict",
    Stage.AUDIT,
    Severity.WARNING,
    "modprobe.d's vfio-pci ids disagree with the command line's",
)
MODPROBE_NVIDIA_CONFIG = register(
    "modprobe.nvidia_config", Stage.AUDIT, Severity.INFO, "leftover NVIDIA modprobe.d configuration"
)
INITRAMFS_VFIO_UNKNOWN = register(
    "initramfs.vfio.unknown", Stage.AUDIT, Severity.INFO, "the initramfs could not be listed"
)
INITRAMFS_VFIO = register(
    "initramfs.vfio", Stage.AUDIT, Severity.WARNING, "vfio-pci is a module and the initramfs lacks vfio modules"
)


def check_nvidia_driver(ctx: CheckContext) -> Iterator[Problem]:
    facts = ctx.facts
    modules = facts.modules
    loaded = [name for name in HOST_DRIVER_MODULES if modules is not None and modules.is_loaded(name)]
    if loaded:
        yield ctx.finding(
            NVIDIA_LOADED,
            ERROR,
            "host NVIDIA driver",
            f"host GPU driver modules are loaded: {', '.join(loaded)}" + _loaded_driver(facts.nvidia),
            "Remove the host NVIDIA driver and blacklist nouveau (gpuhost apply), then reboot.",
        )
    elif modules is None:
        yield ctx.unreadable(
            NVIDIA_LOADED_UNKNOWN,
            "host NVIDIA driver",
            "/proc/modules",
            "loaded drivers are unknown (or the kernel has no module support)",
        )
    nvidia = facts.nvidia
    if nvidia.packages:
        names = listed((f"{p.name} {p.version}" for p in nvidia.packages), limit=6)
        yield ctx.finding(
            NVIDIA_INSTALLED,
            WARNING,
            "host NVIDIA driver",
            f"host NVIDIA driver packages are installed: {names}",
            "Purge them (gpuhost apply does, and pins them out of apt: the precompiled linux-modules-nvidia-* "
            "packages too) so nothing loads a host driver on the passthrough GPUs.",
        )
    if nvidia.module_files:
        yield ctx.finding(
            NVIDIA_INSTALLED_MODULES,
            WARNING,
            "host NVIDIA driver",
            f"NVIDIA driver modules are installed: {describe_module_files(nvidia.module_files)}",
            "Remove them for every kernel (gpuhost apply does, and checks that none is left in /lib/modules/*/).",
        )
    if nvidia.runfile_installed:
        yield ctx.finding(
            NVIDIA_INSTALLED_RUNFILE,
            WARNING,
            "host NVIDIA driver",
            "a runfile NVIDIA driver install is present (/usr/bin/nvidia-uninstall exists)",
            "Remove it with 'nvidia-uninstall -s' (gpuhost apply does it).",
        )
    if nvidia.packages is None and not nvidia.runfile_installed:
        yield ctx.finding(
            NVIDIA_INSTALLED_UNKNOWN,
            INFO,
            "host NVIDIA driver",
            "no package database could be read (neither dpkg nor rpm), so installed drivers are unknown",
        )


def _loaded_driver(nvidia: NvidiaInstall) -> str:
    """' (driver 550.120, open kernel modules)' for the message; '' where /proc/driver/nvidia/version said nothing."""
    if nvidia.loaded_version is None:
        return ""
    flavour = f", {nvidia.loaded_flavour} kernel modules" if nvidia.loaded_flavour is not None else ""
    return f" (driver {nvidia.loaded_version}{flavour})"


def describe_module_files(modules: tuple[NvidiaModuleFile, ...]) -> str:
    """'for 5.15.0-113-generic: nvidia, nvidia_drm (precompiled, 535.183.01, proprietary); for ...': per kernel."""
    parts = []
    for kernel in sorted({m.kernel for m in modules}):
        own = [m for m in modules if m.kernel == kernel]
        kinds = sorted({f"{m.origin}, {m.version or 'version unknown'}, {m.flavour or 'flavour unknown'}" for m in own})
        parts.append(f"for {kernel}: {', '.join(sorted({m.name for m in own}))} ({'; '.join(kinds)})")
    return "; ".join(parts)


def check_modprobe(ctx: CheckContext) -> Iterator[Problem]:
    facts = ctx.facts
    cmdline_ids = set(facts.cmdline.list_value("vfio-pci.ids")) if facts.cmdline else set()
    for directive in facts.modprobe:
        if directive.command == "options" and directive.module == "vfio_pci" and "ids=" in directive.arguments:
            ids = {
                item
                for word in directive.arguments.split()
                if word.startswith("ids=")
                for item in word[4:].split(",")
                if item
            }
            if cmdline_ids and ids != cmdline_ids:
                yield ctx.finding(
                    MODPROBE_VFIO_IDS_CONFLICT,
                    WARNING,
                    directive.path,
                    f"{directive.path}:{directive.line_number} sets vfio-pci ids={','.join(sorted(ids))} but the "
                    f"kernel command line has vfio-pci.ids={','.join(sorted(cmdline_ids))}: two sources disagree",
                    "Keep one: the kernel command line (gpuhost apply removes the modprobe.d option).",
                )
        if directive.module.startswith("nvidia") and directive.command in ("options", "alias", "install", "softdep"):
            yield ctx.finding(
                MODPROBE_NVIDIA_CONFIG,
                INFO,
                directive.path,
                f"{directive.path}:{directive.line_number} configures {directive.module} ({directive.command}): "
                "a leftover of a host NVIDIA driver",
                "Remove host NVIDIA modprobe configuration (gpuhost apply does).",
            )


def check_initramfs(ctx: CheckContext) -> Iterator[Problem]:
    facts = ctx.facts
    if facts.vfio_pci != VfioPci.MODULE or not ctx.selection.passthrough:
        return
    initramfs = facts.initramfs
    if initramfs.entries is None:
        yield ctx.finding(
            INITRAMFS_VFIO_UNKNOWN,
            INFO,
            "initramfs",
            "the initramfs of the running kernel could not be listed (lsinitramfs missing or not root)",
        )
        return
    missing = [name for name in VFIO_INITRAMFS_MODULES if initramfs.has_module(name) is False]
    if missing:
        yield ctx.finding(
            INITRAMFS_VFIO,
            WARNING,
            "initramfs",
            f"vfio-pci is a module and the initramfs lacks {', '.join(missing)}: a host driver in the initramfs "
            "can claim the GPU before vfio-pci loads",
            "Add vfio, vfio_iommu_type1 and vfio_pci to /etc/initramfs-tools/modules and run "
            "update-initramfs -u -k all (gpuhost apply).",
        )
