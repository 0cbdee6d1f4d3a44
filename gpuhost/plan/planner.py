"""(HostFacts, settings) -> HostPlan. Pure: reads facts, writes nothing, prints nothing.

Selection of the GPUs is gpuhost.selection's and the functions to bind gpuhost.passthrough's, as
for the audit, render and the verification.
"""

from __future__ import annotations

import re
import shlex
from collections import Counter
from collections.abc import Callable
from functools import cache

from gpuhost.facts.model import (
    GIB_KIB,
    HOST_DRIVER_MODULES,
    VENDOR_NVIDIA,
    VFIO_INITRAMFS_MODULES,
    BootloaderKind,
    HostFacts,
    KernelCommandLine,
    LoaderEntry,
    LoaderEntryFile,
    VfioPci,
)
from gpuhost.facts.parsers import parse_modprobe_options
from gpuhost.inventory.plan_settings import BIND_AUTO, PlanSettings
from gpuhost.numa import declared_vm_pages, pages_by_node
from gpuhost.passthrough import GroupListing, analyse_groups
from gpuhost.plan import hugepages as hp
from gpuhost.plan.model import (
    KERNEL_CMDLINE_PATH,
    KERNEL_INSTALL_REFRESH,
    PROXMOX_BOOT_TOOL_REFRESH,
    TRIAL_ENTRY_ID,
    TRIAL_LOADER_ENTRY_ID,
    TRIAL_MARKER,
    TRIAL_SETTINGS_PATH,
    BindBy,
    BoundFunction,
    DriverRemoval,
    HostPlan,
    HugePagePlan,
    KernelCmdlineWriter,
    ModprobeConflict,
    SystemdBootPlan,
    TrialBoot,
)
from gpuhost.problems import Problem, Severity, Stage, register
from gpuhost.selection import (
    GpuSelection,
    NvSwitchModel,
    card_numa_node,
    nvswitch_functions_to_bind,
    nvswitch_group_intruders,
    select_gpus,
)

BLACKLIST = ("nouveau", "nvidia", "nvidiafb")
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


# Option names gpuhost sets and therefore removes from the earlier GRUB lines, whatever their value.
OWNED_KEYS = ("vfio-pci.ids", "iommu", "hugepages", "hugepagesz", "default_hugepagesz")
# Refusal codes: two words (gpuhost.inventory.plan_settings validates GPUHOST_TESTING_ONLY_FORCE_PAST_REFUSALS so).
REFUSE_BOOTLOADER_NOT_GRUB = register(
    "bootloader.not_grub",
    Stage.PLAN,
    Severity.ERROR,
    "the host boots with grubby/BLS or an unknown loader: apply supports GRUB and systemd-boot",
)
REFUSE_NO_KERNEL_INSTALL = register(
    "bootloader.no_kernel_install",
    Stage.PLAN,
    Severity.ERROR,
    "systemd-boot without kernel-install or proxmox-boot-tool to write its entries",
)
REFUSE_OS_UNSUPPORTED = register(
    "os.unsupported", Stage.PLAN, Severity.ERROR, "not Debian or Ubuntu (update-grub, initramfs-tools, apt)"
)
REFUSE_NO_UPDATE_GRUB = register("bootloader.no_update_grub", Stage.PLAN, Severity.ERROR, "GRUB without update-grub")
REFUSE_GRUB_SYNTAX = register(
    "grub.syntax", Stage.PLAN, Severity.ERROR, "/etc/default/grub (or a drop-in) is not valid shell"
)
REFUSE_GRUB_UNREADABLE = register(
    "grub.unreadable", Stage.PLAN, Severity.ERROR, "the GRUB command line could not be read (not root)"
)
REFUSE_IOMMU_ABSENT = register(
    "iommu.absent",
    Stage.PLAN,
    Severity.ERROR,
    "no DMAR/IVRS ACPI table and no IOMMU groups: the IOMMU is off in the firmware",
)
REFUSE_VFIO_ABSENT = register("vfio.absent", Stage.PLAN, Severity.ERROR, "the kernel has no vfio-pci")
REFUSE_SELECTION_EMPTY = register("selection.empty", Stage.PLAN, Severity.ERROR, "no GPU matches gpuhost_gpus")
REFUSE_GROUP_MISSING = register("group.missing", Stage.PLAN, Severity.ERROR, "a selected GPU is in no IOMMU group")
REFUSE_GROUP_UNKNOWN = register(
    "group.unknown",
    Stage.PLAN,
    Severity.ERROR,
    "a selected GPU's IOMMU group listing is empty, unreadable or names unknown devices",
)
REFUSE_GROUP_INTRUDER = register(
    "group.intruder",
    Stage.PLAN,
    Severity.ERROR,
    "a device in the GPU's IOMMU group is neither its function nor a bridge (audit: gpu.group.intruder)",
)
REFUSE_GROUP_KEPT_GPU = register(
    "group.kept_gpu", Stage.PLAN, Severity.ERROR, "the GPU's IOMMU group holds a GPU the host keeps"
)
REFUSE_VFIO_IDS_CAPTURES_KEPT = register(
    "vfio_ids.captures_kept",
    Stage.PLAN,
    Severity.ERROR,
    "gpuhost_bind_by: ids, but an ID also takes a GPU the host keeps",
)
REFUSE_HUGEPAGES_MEMORY_UNKNOWN = register(
    "hugepages.memory_unknown", Stage.PLAN, Severity.ERROR, "huge pages asked for, but /proc/meminfo is unreadable"
)
REFUSE_HUGEPAGES_UNSUPPORTED = register(
    "hugepages.unsupported", Stage.PLAN, Severity.ERROR, "1 GiB pages asked for, but the CPU has no pdpe1gb"
)
REFUSE_HUGEPAGES_TOO_MANY = register(
    "hugepages.too_many", Stage.PLAN, Severity.ERROR, "the huge pages would leave the host less than it needs to boot"
)
REFUSE_HUGEPAGES_NODE_TOO_SMALL = register(
    "hugepages.node_too_small",
    Stage.PLAN,
    Severity.ERROR,
    "a NUMA node's share of the pages would leave it too little memory",
)
REFUSE_HUGEPAGES_OLD_KERNEL = register(
    "hugepages.old_kernel",
    Stage.PLAN,
    Severity.ERROR,
    "the pages must go on chosen NUMA nodes, but the kernel is older than 5.16 (no hugepages=<node>:<count>)",
)
REFUSE_HUGEPAGES_VMS_EXCEED = register(
    "hugepages.vms_exceed",
    Stage.PLAN,
    Severity.ERROR,
    "the VMs declared for the host (gpuhost_vms) need more 1 GiB pages than gpuhost_hugepages gives",
)
REFUSE_NVSWITCH_SHARED = register(
    "nvswitch.shared",
    Stage.PLAN,
    Severity.ERROR,
    "an NVSwitch host with some NVIDIA GPUs selected and others kept (shared NVSwitch model: not supported)",
)
REFUSE_TRIAL_GRUBENV_UNWRITABLE = register(
    "trial.grubenv_unwritable",
    Stage.PLAN,
    Severity.ERROR,
    "/boot/grub is on btrfs/ZFS/md/LVM: no trial boot possible (use --no-trial)",
)
REFUSE_NO_KERNEL_CMDLINE = register(
    "bootloader.no_kernel_cmdline",
    Stage.PLAN,
    Severity.ERROR,
    "systemd-boot without /etc/kernel/cmdline (nothing of the host's own to change and restore)",
)
REFUSE_TRIAL_NO_LOADER_ENTRY = register(
    "trial.no_loader_entry",
    Stage.PLAN,
    Severity.ERROR,
    "systemd-boot: the entry that booted is not a loader entry file gpuhost can copy for the trial",
)
REFUSE_TRIAL_ENTRY_ORDER = register(
    "trial.entry_order",
    Stage.PLAN,
    Severity.ERROR,
    "systemd-boot: the default entry has no sort-key, so the trial entry could become the default",
)
REFUSE_TRIAL_PROXMOX = register(
    "trial.proxmox_boot_tool",
    Stage.PLAN,
    Severity.ERROR,
    "proxmox-boot-tool copies the entries to ESPs that are not mounted: no trial entry (use --no-trial)",
)
_SUPPORTED_OS = re.compile(r"\b(debian|ubuntu)\b", re.IGNORECASE)
_Refuse = Callable[[str, str, str, str], None]  # plan_host's `refuse(code, subject, message, fix)`
# Where GRUB cannot write its environment block (grubenv): save_env fails there, so the one-shot
# next_entry that grub-reboot sets is never cleared and every boot would be a trial boot.
_GRUBENV_FILESYSTEMS = {"btrfs": "btrfs", "zfs": "ZFS"}
_GRUBENV_DEVICES = (
    (re.compile(r"^/dev/md"), "md RAID"),
    (re.compile(r"^/dev/(mapper/|dm-)"), "LVM or another device-mapper volume"),
)


def plan_host(host: str, facts: HostFacts, settings: PlanSettings) -> HostPlan:
    refusals: list[Problem] = []
    notes: list[str] = []

    def refuse(code: str, subject: str, message: str, fix: str) -> None:
        refusals.append(Problem(code, Severity.ERROR, subject, f"{host}: {message}", fix))

    _check_platform(facts, refuse)
    selection = select_gpus(facts, settings.gpus)
    switches = {f.address for f in selection.nvswitches}
    if not selection.passthrough:
        found = ", ".join(f"{card.gpu.describe()}" for card in selection.kept) or "none"
        refuse(
            REFUSE_SELECTION_EMPTY,
            "GPUs",
            f"no GPU matches gpuhost_gpus ({settings.gpus.describe()}); GPUs on the host: {found}.",
            "Name the GPUs to pass through in gpuhost_gpus (PCI addresses or vendor:device IDs).",
        )
    functions = _functions(facts, selection, settings, refuse) + _nvswitches(facts, selection, refuse, notes)
    bind_by, vfio_ids, override = _binding(selection, functions, settings, refuse, notes)
    pages = _hugepages(facts, settings, selection, refuse)

    options: list[str] = []
    owned_keys = list(OWNED_KEYS)
    owned_tokens: list[str] = []
    if vfio_ids:
        options.append("vfio-pci.ids=" + ",".join(vfio_ids))
    blacklist = ",".join(
        blacklisted_modules(settings.remove_nvidia_driver)
        + (("snd_hda_intel",) if settings.blacklist_snd_hda_intel else ())
    )
    options.append(f"modprobe.blacklist={blacklist}")
    owned_tokens.append(f"modprobe.blacklist={blacklist}")
    options.append("iommu=pt")
    vendor_flag = _vendor_flag(facts, _previous_options(facts))
    if vendor_flag:
        options.append(vendor_flag)
        owned_keys.append(vendor_flag.split("=")[0])
    if pages.pages:
        options.extend(("default_hugepagesz=1G", "hugepagesz=1G", pages.kernel_option))
    for enabled, token in (
        (settings.pci_realloc, "pci=realloc"),
        (settings.pcie_aspm_off, "pcie_aspm=off"),
        (settings.nomodeset, "nomodeset"),
    ):
        if enabled:
            options.append(token)
            owned_tokens.append(token)

    current_grub = facts.grub.effective or KernelCommandLine(())
    # The line the files will give once this plan's drop-in replaces the last one: the host's own
    # options (the effective line without what gpuhost's drop-in appended), then this plan's.
    linux = _without_owned(facts.grub.cmdline_linux, owned_keys, owned_tokens)
    default = _without_owned(_without_gpuhost_dropin(facts), owned_keys, owned_tokens)
    desired = KernelCommandLine(linux + default + tuple(options))
    writer = KernelCmdlineWriter.UPDATE_GRUB
    kernel_cmdline_file = facts.firmware.kernel_cmdline_file
    if facts.bootloader.kind is BootloaderKind.SYSTEMD_BOOT:
        writer = _kernel_cmdline_writer(facts) or KernelCmdlineWriter.KERNEL_INSTALL  # refused above if None
        desired = KernelCommandLine(_without_owned(kernel_cmdline_file, owned_keys, owned_tokens) + tuple(options))
    described = [
        f"{'NVSwitch' if f.gpu in switches else f'GPU {f.gpu}'}: {f.address} [{f.vendor_device}]" for f in functions
    ] or ["no GPU selected"]
    if pages.pages:
        described.append(f"huge pages: {pages.rule}")
        if pages.node_form:
            described.append(f"huge pages by NUMA node: {pages.placement}")
    dropin = _render(
        "grub/gpuhost.cfg.j2", description=described, patterns=_patterns(owned_keys, owned_tokens), options=options
    )
    modules = _initramfs_modules(facts)
    # vfio-pci loaded before udev, whenever it is a module (or the functions are bound by address).
    initramfs_script = (
        _render("initramfs/gpuhost-vfio.j2", addresses=override)
        if override or facts.vfio_pci == VfioPci.MODULE
        else None
    )
    removal = _driver_removal(facts, settings, selection)
    conflicts = _modprobe_conflicts(facts) if vfio_ids else ()
    reasons = _reboot_reasons(facts, desired, tuple(options), owned_keys, owned_tokens, functions, removal)
    if conflicts:
        reasons += (
            "modprobe.d sets its own vfio-pci ids ("
            + ", ".join(f"{c.path}:{c.line_number}" for c in conflicts)
            + "): commented out, the kernel command line's vfio-pci.ids= is the one setting",
        )
    boot_filesystem, grubenv_problem = _grubenv(facts)
    trial = TrialBoot(
        enabled=settings.trial_boot,
        panic_seconds=settings.trial_panic_seconds,
        settings=_render(
            "grub/gpuhost-trial.cfg.j2",
            dropin=dropin,
            panic=settings.trial_panic_seconds,
            marker=TRIAL_MARKER,
            entry=TRIAL_ENTRY_ID,
            testing_options=settings.trial_testing_options,
        ),
        grub_script=_render("grub/42_gpuhost_trial.j2", settings_path=TRIAL_SETTINGS_PATH, entry=TRIAL_ENTRY_ID),
        boot_filesystem=boot_filesystem,
    )
    systemd_boot = None
    if facts.bootloader.kind is BootloaderKind.SYSTEMD_BOOT:
        systemd_boot = _systemd_boot_plan(
            facts, writer, desired, settings, trial_wanted=settings.trial_boot and bool(reasons), refuse=refuse
        )
    if settings.trial_boot and reasons and grubenv_problem and writer is KernelCmdlineWriter.UPDATE_GRUB:
        refuse(
            REFUSE_TRIAL_GRUBENV_UNWRITABLE,
            "/boot/grub/grubenv",
            f"/boot/grub is on {boot_filesystem}, {grubenv_problem}: GRUB cannot write its environment block there, "
            "so a one-shot trial boot (grub-reboot) would never be cleared and every boot would be the trial.",
            "Run gpuhost apply --no-trial (or set gpuhost_trial_boot: false for this host) to reboot straight into "
            "the new command line, with the console or BMC at hand in case it does not boot.",
        )
    if settings.trial_testing_options:
        notes.append("TESTING ONLY: the trial entry also carries " + " ".join(settings.trial_testing_options))
    for code in settings.forced_past_refusals:
        forced = [r for r in refusals if r.code == code]
        for refusal in forced:
            refusals.remove(refusal)
            notes.append(f"TESTING ONLY: forced past the refusal {refusal.code}: {refusal.message}")
    # /etc/kernel/cmdline is the host's own file that apply rewrites: rollback restores this copy.
    rewritten = [KERNEL_CMDLINE_PATH] if systemd_boot is not None else []
    backups = tuple(dict.fromkeys(list(removal.files) + [c.path for c in conflicts] + rewritten))
    if not refusals and facts.vfio_pci == VfioPci.MODULE and not modules:
        notes.append("vfio-pci is a module but no vfio module list was planned")
    return HostPlan(
        host=host,
        gpus=tuple(card.gpu.address for card in selection.passthrough),
        functions=functions,
        bind_by=bind_by,
        vfio_ids=vfio_ids,
        override_addresses=override,
        kernel_options=tuple(options),
        owned_keys=tuple(owned_keys),
        owned_tokens=tuple(owned_tokens),
        current_cmdline=str(facts.cmdline) if facts.cmdline else "",
        current_grub_line=str(current_grub),
        desired_grub_line=str(desired),
        grub_dropin=dropin,
        initramfs_modules=modules,
        initramfs_script=initramfs_script,
        hugepages=pages,
        driver_removal=removal,
        trial=trial,
        kernel_cmdline_writer=writer,
        systemd_boot=systemd_boot,
        modprobe_conflicts=conflicts,
        backup_files=backups,
        reboot_needed=bool(reasons),
        reboot_reasons=reasons,
        verify_command=_verify_command(tuple(options), functions, removal.pin),
        notes=tuple(notes),
        refusals=tuple(refusals),
    )


def _check_platform(facts: HostFacts, refuse: _Refuse) -> None:
    loader = facts.bootloader
    if loader.kind not in (BootloaderKind.GRUB, BootloaderKind.SYSTEMD_BOOT):
        refuse(
            REFUSE_BOOTLOADER_NOT_GRUB,
            "bootloader",
            f"the host boots with {loader.kind} ({loader.evidence}); gpuhost apply supports GRUB and systemd-boot "
            "on Debian and Ubuntu only so far.",
            f"Set the kernel command line by hand ({loader.update_command or 'the bootloader tool'}) with the options "
            "`gpuhost plan` prints, or convert the host to GRUB.",
        )
    elif not facts.os_pretty_name or not _SUPPORTED_OS.search(facts.os_pretty_name):
        refuse(
            REFUSE_OS_UNSUPPORTED,
            "operating system",
            f"the host runs {facts.os_pretty_name or 'an unknown OS'}; gpuhost apply supports Debian and Ubuntu "
            "(update-grub, initramfs-tools, apt).",
            "Configure this host by hand with the options `gpuhost plan` prints.",
        )
    elif loader.kind is BootloaderKind.SYSTEMD_BOOT:
        if facts.firmware.kernel_cmdline_file is None:
            refuse(
                REFUSE_NO_KERNEL_CMDLINE,
                KERNEL_CMDLINE_PATH,
                f"the host boots with systemd-boot but has no {KERNEL_CMDLINE_PATH} (kernel-install then copies the "
                "running /proc/cmdline into every entry): there is no file of the host's own to change and to "
                "restore on rollback.",
                f"Write the host's kernel command line to {KERNEL_CMDLINE_PATH} (e.g. /proc/cmdline without initrd= "
                "and BOOT_IMAGE=), then run gpuhost apply again.",
            )
        if _kernel_cmdline_writer(facts) is None:
            refuse(
                REFUSE_NO_KERNEL_INSTALL,
                "bootloader",
                f"the host boots with systemd-boot ({loader.evidence}) but has neither kernel-install nor "
                "proxmox-boot-tool to write its loader entries from /etc/kernel/cmdline.",
                "Install the systemd-boot package (it brings kernel-install's hooks), then run gpuhost apply again.",
            )
    elif loader.update_command != "update-grub":
        refuse(
            REFUSE_NO_UPDATE_GRUB,
            "bootloader",
            "GRUB is configured but update-grub is not installed.",
            "Install the grub-pc or grub-efi-amd64 package.",
        )
    if facts.grub.syntax_error and loader.kind is BootloaderKind.GRUB:
        refuse(
            REFUSE_GRUB_SYNTAX,
            "/etc/default/grub",
            f"/etc/default/grub (or a drop-in) is not valid shell: {facts.grub.syntax_error}.",
            "Fix the file (update-grub sources it with sh and would fail too), then run gpuhost apply again.",
        )
    elif facts.grub.present and facts.grub.effective is None and loader.kind == BootloaderKind.GRUB:
        refuse(
            REFUSE_GRUB_UNREADABLE,
            "/etc/default/grub",
            "the GRUB command line could not be read (is the audit running as root?).",
            "Connect as root (ansible_user: root, or become).",
        )
    iommu = facts.iommu
    if not iommu.active and iommu.firmware_present is not True:
        refuse(
            REFUSE_IOMMU_ABSENT,
            "IOMMU",
            "the firmware reports no IOMMU (no DMAR or IVRS ACPI table) and the kernel has no IOMMU groups.",
            "Enable VT-d (Intel) or AMD-Vi/IOMMU (AMD) in the BIOS/UEFI setup, then run gpuhost apply again.",
        )
    if facts.vfio_pci == VfioPci.ABSENT:
        refuse(
            REFUSE_VFIO_ABSENT,
            "kernel",
            f"the kernel {facts.kernel_release} has no vfio-pci (neither built in nor a module).",
            "Install a distribution kernel with VFIO (CONFIG_VFIO_PCI).",
        )


def _functions(
    facts: HostFacts, selection: GpuSelection, settings: PlanSettings, refuse: _Refuse
) -> tuple[BoundFunction, ...]:
    bound: list[BoundFunction] = []
    for isolation in analyse_groups(facts, selection.passthrough):
        card = isolation.card
        if isolation.listing is GroupListing.NO_GROUP and facts.iommu.active:
            refuse(
                REFUSE_GROUP_MISSING,
                card.gpu.address,
                f"GPU {card.gpu.describe()} is in no IOMMU group.",
                "Check that the IOMMU covers this PCIe root port (kernel log: DMAR/AMD-Vi lines).",
            )
        if isolation.listing is GroupListing.UNKNOWN:
            refuse(
                REFUSE_GROUP_UNKNOWN,
                card.gpu.address,
                f"GPU {card.gpu.describe()} is in IOMMU group {card.gpu.iommu_group}, but {isolation.unknown_reason}: "
                "what binding the group to vfio-pci would take from the host is unknown.",
                "Connect as root (ansible_user: root, or become) and check that the group's devices are on the bus "
                "(lspci), then run gpuhost plan again.",
            )
        if isolation.intruders and card.gpu.address not in settings.allow_shared_group:
            names = ", ".join(_describe(m) for m in isolation.intruders)
            refuse(
                REFUSE_GROUP_INTRUDER,
                card.gpu.address,
                f"GPU {card.gpu.describe()} shares IOMMU group {card.gpu.iommu_group} with {names}, which is not "
                "one of its functions or a bridge: binding the group to vfio-pci would take that device from the host.",
                "Never bind that device for this: the group is shared because a PCIe port above the GPU lacks ACS. "
                "Move the GPU to another slot with its own IOMMU group (behind a root port with ACS), or enable ACS "
                "in the firmware; if the device may go to the guest too, "
                f"name the GPU in gpuhost_allow_shared_group: [{card.gpu.address}].",
            )
        kept_in_group = [member for other in isolation.kept_cards for member in other.functions]
        if kept_in_group:
            refuse(
                REFUSE_GROUP_KEPT_GPU,
                card.gpu.address,
                f"GPU {card.gpu.describe()} shares IOMMU group {card.gpu.iommu_group} with the GPU(s) "
                f"{', '.join(_describe(m) for m in kept_in_group)} that the host keeps.",
                "Pass the whole group through (add those GPUs to gpuhost_gpus) or move the cards apart.",
            )
        # Without a listing (no group, or unknown: refused above) the card's own functions are what is bound.
        seen = {b.address for b in bound}
        bound.extend(
            BoundFunction(m.address, m.vendor_device, card.gpu.address, m.driver)
            for m in isolation.to_bind
            if m.address not in seen
        )
    return tuple(bound)


def _nvswitches(
    facts: HostFacts, selection: GpuSelection, refuse: _Refuse, notes: list[str]
) -> tuple[BoundFunction, ...]:
    """An HGX host's NVSwitches: to vfio-pci with every GPU (NVIDIA's full passthrough model), or refused."""
    model = selection.nvswitch_model
    count = len(selection.nvswitches)
    if model is NvSwitchModel.SHARED:
        kept = ", ".join(card.gpu.address for card in selection.kept_nvidia)
        refuse(
            REFUSE_NVSWITCH_SHARED,
            "NVSwitch",
            f"the host has {count} NVSwitch(es) joining its GPUs in one NVLink fabric; passing "
            f"{len(selection.passthrough_nvidia)} GPU(s) while the host keeps {kept} needs NVIDIA's shared NVSwitch "
            "model (a Fabric Manager outside the guests partitions the NVSwitches), which gpuhost does not support.",
            "Select every NVIDIA GPU (gpuhost_gpus: all): all GPUs and NVSwitches then go to one VM (full "
            "passthrough). Or select none and keep the host bare metal.",
        )
        return ()
    if model is NvSwitchModel.FULL_PASSTHROUGH:
        bound = nvswitch_functions_to_bind(facts, selection)
        for intruder in nvswitch_group_intruders(facts, selection):
            refuse(
                REFUSE_GROUP_INTRUDER,
                intruder.address,
                f"{_describe(intruder)} shares an IOMMU group (group {intruder.iommu_group}) with an NVSwitch, and "
                "is neither an NVSwitch nor a bridge: binding the group to vfio-pci would take it from the host.",
                "Move the device to another slot, or check the platform's ACS settings (the NVSwitches of an HGX "
                "baseboard each have a group of their own).",
            )
        notes.append(
            f"NVSwitch host: its {count} NVSwitch(es) go to vfio-pci with the GPUs (NVIDIA's full passthrough model): "
            "one VM takes every GPU and NVSwitch and runs nvidia-fabricmanager of its driver branch; a VM with "
            "only some of them is refused by render"
        )
        return tuple(BoundFunction(f.address, f.vendor_device, f.address, f.driver) for f in bound)
    return ()


def _describe(function: object) -> str:
    from gpuhost.checks.base import describe_function  # one wording of devices for audit and plan
    from gpuhost.facts.model import PciFunction

    assert isinstance(function, PciFunction)
    return describe_function(function)


def _binding(
    selection: GpuSelection,
    functions: tuple[BoundFunction, ...],
    settings: PlanSettings,
    refuse: _Refuse,
    notes: list[str],
) -> tuple[BindBy, tuple[str, ...], tuple[str, ...]]:
    """By ID (vfio-pci.ids) unless an ID would also take a function the host keeps: then by address."""
    kept: dict[str, list[str]] = {}
    for card in selection.kept:
        for function in card.functions:
            kept.setdefault(function.vendor_device, []).append(function.address)
    ids = tuple(dict.fromkeys(f.vendor_device for f in functions))
    clashing = [i for i in ids if i in kept]
    if settings.bind_by == BindBy.ADDRESS or (clashing and settings.bind_by == BIND_AUTO):
        if clashing:
            notes.append(
                f"vfio-pci.ids={','.join(ids)} would also take {', '.join(a for i in clashing for a in kept[i])} "
                "which the host keeps: the passthrough functions are bound by address (driver_override) instead"
            )
        return BindBy.ADDRESS, (), tuple(f.address for f in functions)
    if clashing:
        refuse(
            REFUSE_VFIO_IDS_CAPTURES_KEPT,
            ",".join(clashing),
            f"vfio-pci.ids={','.join(ids)} would also take {', '.join(a for i in clashing for a in kept[i])}, "
            "which the host keeps (not selected for passthrough, or its console).",
            "Set gpuhost_bind_by: address (or auto) to bind the passthrough functions by address with "
            "driver_override instead, or select those GPUs too.",
        )
    return BindBy.IDS, ids, ()


# The options that turn a vendor's IOMMU on, where the kernel does not by itself (Intel's VT-d is off
# by default in many distribution kernels; AMD-Vi is on wherever the firmware has an IVRS table:
# amd_iommu= documents no "on", only off and tuning values, so nothing is added for AMD).
IOMMU_ON_OPTIONS = ("intel_iommu=on",)


def _previous_options(facts: HostFacts) -> tuple[str, ...]:
    """What gpuhost's own files put on the command line at the last apply: the options of its GRUB
    drop-in, or (systemd-boot) /etc/kernel/cmdline, which apply rewrote."""
    if facts.bootloader.kind is BootloaderKind.SYSTEMD_BOOT:
        line = facts.firmware.kernel_cmdline_file
    else:
        line = facts.grub.gpuhost_options
    return line.tokens if line is not None else ()


def _vendor_flag(facts: HostFacts, previous: tuple[str, ...]) -> str | None:
    """intel_iommu=on where the kernel did not turn the IOMMU on by itself, and where an earlier apply
    added it: the IOMMU is on now because of it, and the next boot needs it as much (issue 27.1: a
    second apply dropped it and said no reboot; the next reboot came up without an IOMMU)."""
    kept = next((option for option in IOMMU_ON_OPTIONS if option in previous), None)
    if kept is not None:
        return kept
    if not facts.iommu.active and facts.iommu.dmar_table:
        return "intel_iommu=on"
    return None


def _without_gpuhost_dropin(facts: HostFacts) -> KernelCommandLine | None:
    """GRUB_CMDLINE_LINUX_DEFAULT as the host's own files set it: the effective value without the
    options gpuhost's drop-in appended (read back from the drop-in itself)."""
    default = facts.grub.cmdline_linux_default
    ours = facts.grub.gpuhost_options
    if default is None or ours is None:
        return default
    return KernelCommandLine(tuple(token for token in default.tokens if token not in ours.tokens))


def _hugepages(facts: HostFacts, settings: PlanSettings, selection: GpuSelection, refuse: _Refuse) -> HugePagePlan:
    total = facts.memory.total_kib if facts.memory and facts.memory.total_kib else None
    mount = settings.hugetlbfs_mount
    if total is None:
        if settings.hugepages not in ("0", "auto"):
            refuse(
                REFUSE_HUGEPAGES_MEMORY_UNKNOWN,
                "huge pages",
                "/proc/meminfo could not be read.",
                "Connect as a user that can read /proc/meminfo.",
            )
        return HugePagePlan(0, settings.hugepages, "memory unknown: no huge pages", (), 0, mount)
    pages, rule = hp.requested_pages(settings.hugepages, total)
    keeps = total - pages * GIB_KIB
    minimum = hp.host_minimum_kib(total)
    need = pages_by_node(declared_vm_pages(facts, settings.gpus, settings.vms))
    gpu_nodes = [card_numa_node(facts, card) for card in selection.passthrough]
    gpus_per_node = None if None in gpu_nodes else dict(Counter(node for node in gpu_nodes if node is not None))
    placement = hp.place_on_nodes(facts, pages, gpus_per_node, need, hp.node_capacity(facts, total, minimum))
    if pages and facts.cpu is not None and "pdpe1gb" not in facts.cpu.flags:
        refuse(
            REFUSE_HUGEPAGES_UNSUPPORTED,
            "huge pages",
            f"{pages} 1 GiB huge pages are asked for ({rule}) but the CPU has no pdpe1gb flag.",
            "Set gpuhost_hugepages: 0 (use 2 MiB pages for guest memory instead).",
        )
    if pages and sum(need.values()) > pages:
        wanted = ", ".join(f"{count} on NUMA node {node}" for node, count in need.items())
        refuse(
            REFUSE_HUGEPAGES_VMS_EXCEED,
            "huge pages",
            f"the VMs declared for the host (gpuhost_vms) need {sum(need.values())} 1 GiB pages ({wanted}), "
            f"more than the {pages} planned ({rule}).",
            f"Set gpuhost_hugepages to at least {sum(need.values())}, or give the VMs less memory (or hugepages: off).",
        )
    if pages and keeps < minimum:
        refuse(
            REFUSE_HUGEPAGES_TOO_MANY,
            "huge pages",
            f"{pages} 1 GiB huge pages ({rule}) would leave the host {max(keeps, 0) / GIB_KIB:.1f} GiB of its "
            f"{total / GIB_KIB:.1f} GiB; it needs at least {minimum / GIB_KIB:.1f} GiB, and with too many pages "
            "the machine does not boot.",
            f"Lower gpuhost_hugepages to at most {(total - minimum) // GIB_KIB}."
            if total - minimum >= GIB_KIB
            else "Set gpuhost_hugepages: 0: this host is too small to give up any 1 GiB page.",
        )
    elif pages:
        _check_nodes(facts, pages, placement, total, minimum, refuse)
    if pages and placement.node_form and not hp.node_form_supported(facts.kernel_release):
        refuse(
            REFUSE_HUGEPAGES_OLD_KERNEL,
            "kernel",
            f"the 1 GiB pages go on chosen NUMA nodes ({_describe_nodes(placement.per_node)}: {placement.how}), "
            f"which the command line says as hugepages=<node>:<count>, read by Linux 5.16 on; the host runs "
            f"{facts.kernel_release or 'an unknown kernel'}, which would take the first node number for the count.",
            "Install a kernel of 5.16 or later (Ubuntu 22.04: linux-generic-hwe-22.04) and reboot into it, "
            "then run gpuhost apply again.",
        )
    return HugePagePlan(
        pages,
        settings.hugepages,
        rule,
        placement.per_node,
        max(keeps, 0),
        mount if pages else None,
        node_form=placement.node_form and pages > 0,
        placement=placement.how,
        vms_per_node=tuple(need.items()),
    )


def _check_nodes(
    facts: HostFacts, pages: int, placement: hp.Placement, total: int, minimum: int, refuse: _Refuse
) -> None:
    """Each node keeps its share of the host's minimum (prorated by its memory) after its pages,
    and the gigabytes the kernel's boot allocations can break (hugepages.node_page_limit)."""
    nodes = {node.node_id: node for node in facts.numa_nodes}
    for node_id, node_pages in placement.per_node:
        node = nodes.get(node_id)
        if node is None or not node.mem_total_kib:
            continue
        most = hp.node_page_limit(node.mem_total_kib, total, minimum)
        if node_pages > most:
            why = (
                f"the plan puts {node_pages} of the {pages} pages on NUMA node {node_id} ({placement.how})"
                if placement.node_form
                else f"the kernel spreads hugepages={pages} evenly, {node_pages} on NUMA node {node_id}"
            )
            node_minimum = minimum * node.mem_total_kib // total
            refuse(
                REFUSE_HUGEPAGES_NODE_TOO_SMALL,
                f"NUMA node {node_id}",
                f"{why}, which has only {node.mem_total_kib / GIB_KIB:.1f} GiB: at most {most} fit, as the node keeps "
                f"{node_minimum / GIB_KIB:.1f} GiB (its share of host memory) and {hp.BOOT_TAKES_GIB} gigabytes that "
                "the kernel's own boot allocations can break (a 1 GiB page needs a whole aligned gigabyte).",
                f"Lower gpuhost_hugepages so that NUMA node {node_id} gets at most {most} pages, or give the node "
                "more memory.",
            )


def _describe_nodes(per_node: tuple[tuple[int, int], ...]) -> str:
    return ", ".join(f"{count} on node {node}" for node, count in per_node)


def _grubenv(facts: HostFacts) -> tuple[str, str | None]:
    """Where /boot/grub lives ("/dev/vda1 (ext4)"), and why GRUB cannot write grubenv there (None: it can)."""
    if facts.mounts is None:
        return "an unknown filesystem", "as /proc/mounts could not be read"
    candidates = [m for m in facts.mounts if "/boot/grub/".startswith(m.target.rstrip("/") + "/")]
    if not candidates:
        return "an unknown filesystem", "as no mount holds it"
    mount = max(candidates, key=lambda m: len(m.target))
    where = f"{mount.source} ({mount.fstype}, mounted on {mount.target})"
    if mount.fstype in _GRUBENV_FILESYSTEMS:
        return where, f"a {_GRUBENV_FILESYSTEMS[mount.fstype]} filesystem"
    for pattern, kind in _GRUBENV_DEVICES:
        if pattern.match(mount.source):
            return where, f"a device on {kind}"
    return where, None


def _modprobe_conflicts(facts: HostFacts) -> tuple[ModprobeConflict, ...]:
    """`options vfio-pci ids=` lines in /etc/modprobe.d: a second, competing list of IDs."""
    return tuple(
        ModprobeConflict(d.path, d.line_number)
        for d in facts.modprobe
        if d.command == "options"
        and d.module == "vfio_pci"
        and "ids" in parse_modprobe_options(d.arguments)
        and d.path.startswith("/etc/modprobe.d/")
    )


def _initramfs_modules(facts: HostFacts) -> tuple[str, ...]:
    if facts.vfio_pci != VfioPci.MODULE:
        return ()  # built in (nothing to load) or absent (refused)
    return VFIO_INITRAMFS_MODULES + (("vfio_virqfd",) if _has_vfio_virqfd(facts.kernel_release) else ())


def _has_vfio_virqfd(release: str | None) -> bool:
    """vfio_virqfd was merged into vfio in Linux 6.2."""
    match = re.match(r"(\d+)\.(\d+)", release or "")
    return match is not None and (int(match.group(1)), int(match.group(2))) < (6, 2)


def _driver_removal(facts: HostFacts, settings: PlanSettings, selection: GpuSelection) -> DriverRemoval:
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
    if not (packages or nvidia.runfile_installed or files or dkms_modules):
        note = "no host NVIDIA driver is installed: nothing to remove"
    else:
        parts = []
        if packages:
            parts.append(f"purge {', '.join(packages)}")
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


def _kernel_cmdline_writer(facts: HostFacts) -> KernelCmdlineWriter | None:
    """What rewrites a systemd-boot host's entries from /etc/kernel/cmdline (None: nothing can).

    proxmox-boot-tool where it manages the ESPs (/etc/kernel/proxmox-boot-uuids) and is installed: it
    copies kernels and entries to every ESP it lists, which kernel-install alone would not update.
    """
    if facts.firmware.proxmox_boot_tool and facts.bootloader.has_proxmox_boot_tool:
        return KernelCmdlineWriter.PROXMOX_BOOT_TOOL
    if facts.bootloader.has_kernel_install:
        return KernelCmdlineWriter.KERNEL_INSTALL
    return None


def _systemd_boot_plan(
    facts: HostFacts,
    writer: KernelCmdlineWriter,
    desired: KernelCommandLine,
    settings: PlanSettings,
    *,
    trial_wanted: bool,
    refuse: _Refuse,
) -> SystemdBootPlan:
    firmware = facts.firmware
    booted = next((f for f in firmware.loader_entries if f.id == firmware.loader_entry), None)
    if trial_wanted and writer is KernelCmdlineWriter.PROXMOX_BOOT_TOOL:
        refuse(
            REFUSE_TRIAL_PROXMOX,
            "systemd-boot",
            "proxmox-boot-tool keeps the kernels and loader entries on ESPs that are not mounted and copies them "
            "there at each refresh: a trial entry written beside the default would not be on the ESP that boots.",
            "Run gpuhost apply --no-trial (or set gpuhost_trial_boot: false for this host) to reboot straight into "
            "the new command line, with the console or BMC at hand in case it does not boot.",
        )
    elif trial_wanted and (booted is None or booted.entry.linux is None or not _printable(booted.entry)):
        refuse(
            REFUSE_TRIAL_NO_LOADER_ENTRY,
            "systemd-boot",
            f"the running kernel was booted from the entry {firmware.loader_entry or '(unknown)'}, which is not a "
            f"loader entry file with a kernel under {', '.join(_entry_directories(firmware.loader_entries))}: "
            "gpuhost copies that entry for the trial boot.",
            "Boot the host from its kernel-install entry (bootctl list), or run gpuhost apply --no-trial.",
        )
    elif trial_wanted and booted is not None and booted.entry.sort_key is None and not firmware.loader_entry_default:
        refuse(
            REFUSE_TRIAL_ENTRY_ORDER,
            "systemd-boot",
            f"the entry {booted.id} has no sort-key and no default entry is set (LoaderEntryDefault): systemd-boot "
            f"would then order entries by name alone, and {TRIAL_LOADER_ENTRY_ID} could become the default, so a "
            "panicking trial kernel would boot again and again.",
            f"Set the default entry (bootctl set-default {booted.id}), or run gpuhost apply --no-trial.",
        )
    entry = booted.entry if booted is not None else None
    directory = booted.path.rsplit("/", 1)[0] if booted is not None else f"{firmware.esp or '/boot/efi'}/loader/entries"
    trial_options = (*desired.tokens, f"panic={settings.trial_panic_seconds}", TRIAL_MARKER)
    return SystemdBootPlan(
        writer=writer,
        current_kernel_cmdline=None if firmware.kernel_cmdline_file is None else str(firmware.kernel_cmdline_file),
        kernel_cmdline=str(desired) + "\n",
        default_entry=booted.id if booted is not None else "",
        trial_entry_path=f"{directory}/{TRIAL_LOADER_ENTRY_ID}",
        refresh_command=PROXMOX_BOOT_TOOL_REFRESH
        if writer is KernelCmdlineWriter.PROXMOX_BOOT_TOOL
        else KERNEL_INSTALL_REFRESH,
        trial_entry=""
        if entry is None
        else _render(
            "systemd-boot/gpuhost-trial.conf.j2",
            default_entry=booted.id if booted is not None else "",
            entry_id=TRIAL_LOADER_ENTRY_ID,
            panic=settings.trial_panic_seconds,
            marker=TRIAL_MARKER,
            testing_options=settings.trial_testing_options,
            title=entry.title or entry.version or "Linux",
            version=entry.version,
            linux=entry.linux,
            initrds=entry.initrds,
            options=str(KernelCommandLine((*trial_options, *settings.trial_testing_options))),
        ),
    )


def _printable(entry: LoaderEntry) -> bool:
    """No control characters in what the trial entry copies (the host's text goes back into a file)."""
    values = [entry.title or "", entry.version or "", entry.linux or "", *entry.initrds, *entry.options.tokens]
    return all(char.isprintable() for value in values for char in value)


def _entry_directories(entries: tuple[LoaderEntryFile, ...]) -> list[str]:
    return sorted({f.path.rsplit("/", 1)[0] for f in entries}) or ["the ESP's loader/entries"]


def _without_owned(line: KernelCommandLine | None, keys: list[str], tokens: list[str]) -> tuple[str, ...]:
    if line is None:
        return ()
    return tuple(t for t in line.tokens if t.split("=", 1)[0] not in keys and t not in tokens)


def _patterns(keys: list[str], tokens: list[str]) -> list[str]:
    """Shell case patterns matching what _without_owned removes (values are validated: no quoting needed)."""
    return [f"{key}=*" for key in keys] + tokens


def _reboot_reasons(
    facts: HostFacts,
    desired: KernelCommandLine,
    options: tuple[str, ...],
    keys: list[str],
    tokens: list[str],
    functions: tuple[BoundFunction, ...],
    removal: DriverRemoval,
) -> tuple[str, ...]:
    running = facts.cmdline.tokens if facts.cmdline else ()
    reasons = []
    missing = [t for t in options if t not in running]
    stale = [t for t in running if (t.split("=", 1)[0] in keys or t in tokens) and t not in desired.tokens]
    if missing:
        reasons.append(f"/proc/cmdline lacks {' '.join(missing)}")
    if stale:
        reasons.append(f"/proc/cmdline still has {' '.join(stale)}")
    if facts.modules is not None:
        loaded = [m for m in HOST_DRIVER_MODULES if facts.modules.is_loaded(m)]
        if loaded and removal.pin:
            reasons.append(f"host GPU driver module(s) loaded: {', '.join(loaded)}")
    if not reasons:
        unbound = [f.address for f in functions if f.driver != "vfio-pci"]
        if unbound:
            reasons.append(f"{', '.join(unbound)} not on vfio-pci although the command line is in place")
    return tuple(reasons)


def _verify_command(options: tuple[str, ...], functions: tuple[BoundFunction, ...], removes_driver: bool) -> str:
    """A POSIX sh test for the reboot's test_command: new options in /proc/cmdline, functions on vfio-pci,
    and no host GPU driver loaded (nouveau only, where the host keeps its NVIDIA driver)."""
    checks = [f"grep -qwF -- {shlex.quote(option)} /proc/cmdline" for option in options]
    checks.extend(
        f'[ "$(basename "$(readlink /sys/bus/pci/devices/{f.address}/driver)")" = vfio-pci ]' for f in functions
    )
    checks.append(
        "! grep -qE '^(nvidia|nouveau) ' /proc/modules" if removes_driver else "! grep -q '^nouveau ' /proc/modules"
    )
    return " && ".join(checks) if checks else "true"


@cache
def _environment() -> object:
    import jinja2

    from gpuhost.datafiles import require_data_dir

    return jinja2.Environment(
        # templates/ of the checkout, or of a wheel install (<prefix>/share/gpuhost/templates).
        loader=jinja2.FileSystemLoader(str(require_data_dir("templates", "grub/gpuhost.cfg.j2"))),
        autoescape=False,  # noqa: S701 - shell and GRUB files, not HTML; every value is validated
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
    )


def _render(name: str, **values: object) -> str:
    import jinja2

    environment = _environment()
    assert isinstance(environment, jinja2.Environment)
    return environment.get_template(name).render(**values)
