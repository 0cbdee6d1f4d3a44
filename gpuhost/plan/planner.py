"""(HostFacts, settings) -> HostPlan. Pure: reads facts, writes nothing, prints nothing.

Selection of the GPUs is gpuhost.selection's and the functions to bind gpuhost.passthrough's, as
for the audit, render and the verification.
"""

from __future__ import annotations

import shlex

from gpuhost.cmdline import (
    DEFAULT_HUGEPAGE_SIZE,
    HUGEPAGE_SIZE,
    IOMMU,
    MODPROBE_BLACKLIST,
    NOMODESET,
    PCI,
    PCIE_ASPM,
    VFIO_PCI_IDS,
    Claim,
    claim,
)
from gpuhost.facts.model import HOST_DRIVER_MODULES, BootloaderKind, HostFacts, KernelCommandLine, VfioPci
from gpuhost.inventory.plan_settings import PlanSettings
from gpuhost.plan.binding import passthrough_functions, passthrough_nvswitches, plan_binding
from gpuhost.plan.boot import (
    grubenv_location,
    iommu_vendor_flag,
    line_without_gpuhost_dropin,
    plan_systemd_boot,
    previous_gpuhost_options,
)
from gpuhost.plan.driver import (
    blacklisted_modules,
    find_modprobe_conflicts,
    plan_driver_removal,
    vfio_initramfs_modules,
)
from gpuhost.plan.files import plan_files, recorded_paths
from gpuhost.plan.hugepages import plan_hugepages
from gpuhost.plan.model import (
    TRIAL_ENTRY_ID,
    TRIAL_MARKER,
    TRIAL_SETTINGS_PATH,
    BoundFunction,
    DriverRemoval,
    HostPlan,
    KernelCmdlineWriter,
    TrialBoot,
)
from gpuhost.plan.platform import Refuse, check_platform, choose_kernel_cmdline_writer
from gpuhost.plan.rescue import REFUSE_RESCUE_NONE, TrialRescue, deadline_units, plan_rescue
from gpuhost.problems import Problem, Severity, Stage, register
from gpuhost.selection import gpus_declared_twice, select_gpus
from gpuhost.templates import render_template

REFUSE_SELECTION_EMPTY = register("plan.selection.empty", Stage.PLAN, Severity.ERROR, "no GPU matches gpuhost_gpus")

REFUSE_VMS_GPU_TWICE = register(
    "plan.vms.gpu_twice",
    Stage.PLAN,
    Severity.ERROR,
    "two VMs of gpuhost_vms declare the same GPU (they run at once: render refuses both too)",
)
REFUSE_TRIAL_GRUBENV_UNWRITABLE = register(
    "plan.trial.grubenv_unwritable",
    Stage.PLAN,
    Severity.ERROR,
    "/boot/grub is on btrfs/ZFS/md/LVM: no trial boot possible (use --no-trial)",
)


def plan_host(host: str, facts: HostFacts, settings: PlanSettings) -> HostPlan:
    refusals: list[Problem] = []
    notes: list[str] = []

    def refuse(code: str, subject: str, message: str, fix: str) -> None:
        refusals.append(Problem(code, Severity.ERROR, subject, f"{host}: {message}", fix))

    check_platform(facts, refuse)
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
    functions = passthrough_functions(facts, selection, settings, refuse) + passthrough_nvswitches(
        facts, selection, refuse, notes
    )
    bind_by, vfio_ids, override = plan_binding(selection, functions, settings, refuse, notes)
    for twice in gpus_declared_twice(facts, settings.gpus, [(vm.name, vm.gpus) for vm in settings.vms]):
        refuse(
            REFUSE_VMS_GPU_TWICE,
            twice.address,
            f"GPU {twice.address} is declared for VM {twice.first!r} and VM {twice.second!r} (gpuhost_vms), which "
            "run at once: the host's CPUs and 1 GiB pages would be sized for both.",
            "Give each GPU to one VM in gpuhost_vms (render refuses both VMs too).",
        )
    pages = plan_hugepages(facts, settings, selection, refuse)

    # The options, in order; what they claim of the host's own lines is the table's (gpuhost.cmdline).
    options: list[str] = []
    if vfio_ids:
        options.append(VFIO_PCI_IDS.token(",".join(vfio_ids)))
    blacklist = ",".join(
        blacklisted_modules(settings.remove_nvidia_driver)
        + (("snd_hda_intel",) if settings.blacklist_snd_hda_intel else ())
    )
    options.append(MODPROBE_BLACKLIST.token(blacklist))
    options.append(IOMMU.token())
    vendor_flag = iommu_vendor_flag(facts, previous_gpuhost_options(facts))
    if vendor_flag:
        options.append(vendor_flag)
    if pages.pages:
        options.extend((DEFAULT_HUGEPAGE_SIZE.token(), HUGEPAGE_SIZE.token(), pages.kernel_option))
    for enabled, option in (
        (settings.pci_realloc, PCI),
        (settings.pcie_aspm_off, PCIE_ASPM),
        (settings.nomodeset, NOMODESET),
    ):
        if enabled:
            options.append(option.token())
    claimed = claim(options)

    current_grub = facts.grub.effective or KernelCommandLine(())
    # The line the files will give once this plan's drop-in replaces the last one: the host's own
    # options (the effective line without what gpuhost's drop-in appended), then this plan's.
    linux = claimed.remove_from(facts.grub.cmdline_linux)
    default = claimed.remove_from(line_without_gpuhost_dropin(facts))
    desired = KernelCommandLine(linux + default + tuple(options))
    writer = KernelCmdlineWriter.UPDATE_GRUB
    kernel_cmdline_file = facts.firmware.kernel_cmdline_file
    if facts.bootloader.kind is BootloaderKind.SYSTEMD_BOOT:
        writer = choose_kernel_cmdline_writer(facts) or KernelCmdlineWriter.KERNEL_INSTALL  # refused above if None
        desired = KernelCommandLine(claimed.remove_from(kernel_cmdline_file) + tuple(options))
    described = [
        f"{'NVSwitch' if f.gpu in switches else f'GPU {f.gpu}'}: {f.address} [{f.vendor_device}]" for f in functions
    ] or ["no GPU selected"]
    if pages.pages:
        described.append(f"huge pages: {pages.rule}")
        if pages.node_form:
            described.append(f"huge pages by NUMA node: {pages.placement}")
    dropin = render_template(
        "grub/gpuhost.cfg.j2", description=described, patterns=claimed.shell_patterns(), options=options
    )
    modules = vfio_initramfs_modules(facts)
    # vfio-pci loaded before udev, whenever it is a module (or the functions are bound by address).
    initramfs_script = (
        render_template("initramfs/gpuhost-vfio.j2", addresses=override)
        if override or facts.vfio_pci == VfioPci.MODULE
        else None
    )
    removal = plan_driver_removal(facts, settings, selection)
    conflicts = find_modprobe_conflicts(facts) if vfio_ids else ()
    reasons = _reboot_reasons(facts, desired, tuple(options), claimed, functions, removal)
    if conflicts:
        reasons += (
            "modprobe.d sets its own vfio-pci ids ("
            + ", ".join(f"{c.path}:{c.line_number}" for c in conflicts)
            + "): commented out, the kernel command line's vfio-pci.ids= is the one setting",
        )
    boot_filesystem, grubenv_problem = grubenv_location(facts)
    rescue = plan_rescue(
        facts.rescue,
        reboot_timeout_s=settings.verify_reboot_timeout,
        panic_seconds=settings.trial_panic_seconds,
        kernel_release=facts.kernel_release,
    )
    trial = TrialBoot(
        enabled=settings.trial_boot,
        panic_seconds=settings.trial_panic_seconds,
        settings=render_template(
            "grub/gpuhost-trial.cfg.j2",
            dropin=dropin,
            panic=settings.trial_panic_seconds,
            marker=TRIAL_MARKER,
            entry=TRIAL_ENTRY_ID,
            rescue_options=rescue.kernel_options,
            testing_options=settings.trial_testing_options,
        ),
        grub_script=render_template(
            "grub/42_gpuhost_trial.j2", settings_path=TRIAL_SETTINGS_PATH, entry=TRIAL_ENTRY_ID
        ),
        boot_filesystem=boot_filesystem,
    )
    # HostPlan.trial_now: the same answer, for the playbooks.
    trial_now = trial.enabled and bool(reasons)
    systemd_boot = None
    if facts.bootloader.kind is BootloaderKind.SYSTEMD_BOOT:
        systemd_boot = plan_systemd_boot(
            facts, writer, desired, settings, rescue.kernel_options, trial_wanted=trial_now, refuse=refuse
        )
    if settings.require_rescue and reasons:
        _check_rescue(rescue, trial_now, refuse)
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
    files = plan_files(
        trial_now=trial_now,
        trial=trial,
        systemd_boot=systemd_boot,
        grub_dropin=dropin,
        driver_removal=removal,
        initramfs_modules=modules,
        initramfs_script=initramfs_script,
        hugetlbfs_mount_point=pages.mount_point,
        deadline_units=deadline_units(rescue.deadline_s),
        modprobe_conflicts=conflicts,
    )
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
        owned_keys=claimed.keys,
        owned_tokens=claimed.tokens,
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
        # Every file of the host's that apply changes (the driver's files, modprobe.d's, /etc/kernel/cmdline,
        # the initramfs module list, fstab, the mount point), recorded before the first change.
        backup_files=recorded_paths(files),
        files=files,
        rescue=rescue,
        reboot_needed=bool(reasons),
        reboot_reasons=reasons,
        verify_command=_verify_command(tuple(options), functions, removal.pin),
        notes=tuple(notes),
        refusals=tuple(refusals),
    )


def _check_rescue(rescue: TrialRescue, trial_now: bool, refuse: Refuse) -> None:
    """--require-rescue (gpuhost_require_rescue): no reboot without a watchdog to reset a kernel that stops."""
    if not trial_now:
        refuse(
            REFUSE_RESCUE_NONE,
            "rescue",
            "the host reboots straight into the new command line (no trial boot): no rescue is armed for that boot.",
            "Apply with the trial boot (without --no-trial, gpuhost_trial_boot: true), or without --require-rescue.",
        )
    elif not rescue.has_watchdog:
        why = "; ".join(r.describe() for r in rescue.rescues[:2])
        refuse(
            REFUSE_RESCUE_NONE,
            "rescue",
            f"{rescue.warning} ({why}).",
            "Install ipmitool where the host has a BMC (/dev/ipmi0), or load the board's watchdog driver "
            "(iTCO_wdt, sp5100_tco); or apply without --require-rescue, with the console or BMC at hand.",
        )


def _reboot_reasons(
    facts: HostFacts,
    desired: KernelCommandLine,
    options: tuple[str, ...],
    claimed: Claim,
    functions: tuple[BoundFunction, ...],
    removal: DriverRemoval,
) -> tuple[str, ...]:
    running = facts.cmdline.tokens if facts.cmdline else ()
    reasons = []
    missing = [t for t in options if t not in running]
    stale = [t for t in running if claimed.covers(t) and t not in desired.tokens]
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
