"""The files apply writes, edits and removes on a host, phase by phase.

One answer for the playbooks' one task per phase (the collection's `host_files` module carries a
phase out in one Python run on the host: a module call costs seconds under TCG and on slow hosts,
and an apply used to make a dozen of them), for `gpuhost plan --json` and for the tests.
"""

from __future__ import annotations

from gpuhost.plan.model import (
    APT_PIN_PATH,
    DEADLINE_SERVICE_PATH,
    DEADLINE_TIMER_PATH,
    FSTAB_MARKER,
    FSTAB_PATH,
    GRUB_DROPIN_PATH,
    INITRAMFS_MODULES_MARKER,
    INITRAMFS_MODULES_PATH,
    INITRAMFS_SCRIPT_PATH,
    KERNEL_CMDLINE_PATH,
    MODPROBE_COMMENT_PREFIX,
    TRIAL_GRUB_SCRIPT_PATH,
    TRIAL_LOADER_ENTRY_PATHS,
    TRIAL_SETTINGS_PATH,
    DriverRemoval,
    FileChange,
    FileState,
    HostFiles,
    ModprobeConflict,
    Regenerates,
    SystemdBootPlan,
    TrialBoot,
)

# Written where the plan removes the host's NVIDIA driver: apt would install it again with the
# next upgrade of a package that depends on it, and it would take the GPUs back from vfio-pci.
APT_PIN = (
    "# Managed by gpuhost: this host passes its GPUs through with vfio-pci; its own NVIDIA driver\n"
    "# would take them back. Remove this file (and set gpuhost_remove_nvidia_driver: false) to allow it.\n"
    # Ubuntu's precompiled modules too: their -generic metapackages follow every kernel upgrade.
    "Package: nvidia-* libnvidia-* cuda-drivers* xserver-xorg-video-nvidia*"
    " linux-modules-nvidia-* linux-objects-nvidia-* linux-signatures-nvidia-*\n"
    "Pin: release *\n"
    "Pin-Priority: -1\n"
)

__all__ = [
    "APT_PIN",
    "GPUHOST_FILES",
    "FileChange",
    "FileState",
    "HostFiles",
    "Regenerates",
    "plan_files",
    "recorded_paths",
]

# The files that are gpuhost's alone: no host has them before apply, and rollback removes each
# (whatever an earlier gpuhost left). Every other path a plan changes is the host's: apply copies it
# or notes it absent before its first change, and rollback puts it back as it was (recorded_paths).
GPUHOST_FILES = (
    GRUB_DROPIN_PATH,
    TRIAL_SETTINGS_PATH,
    TRIAL_GRUB_SCRIPT_PATH,
    INITRAMFS_SCRIPT_PATH,
    APT_PIN_PATH,
    *TRIAL_LOADER_ENTRY_PATHS,
    DEADLINE_TIMER_PATH,
    DEADLINE_SERVICE_PATH,
)


SCRIPT_MODE = "0755"
# The ESP is FAT: no permissions of its own, the mount's umask=0077 shows every file as 0700.
ESP_FILE_MODE = "0700"


def plan_files(
    *,
    trial_now: bool,
    trial: TrialBoot,
    systemd_boot: SystemdBootPlan | None,
    grub_dropin: str,
    driver_removal: DriverRemoval,
    initramfs_modules: tuple[str, ...],
    initramfs_script: str | None,
    hugetlbfs_mount_point: str | None,
    deadline_units: tuple[str, str],
    modprobe_conflicts: tuple[ModprobeConflict, ...] = (),
) -> HostFiles:
    """Every phase's file changes, in the order the host gets them.

    `trial_now`: this apply boots the new command line once as a trial entry before it becomes the
    default (a trial is wanted and a reboot is needed); the default entry then changes only at commit.
    """
    configure: list[FileChange] = [
        FileChange(path, FileState.ABSENT, regenerates=Regenerates.INITRAMFS) for path in driver_removal.files
    ]
    if driver_removal.pin:
        configure.append(FileChange(APT_PIN_PATH, FileState.PRESENT, APT_PIN))
    commit: list[FileChange] = []
    revert: list[FileChange] = []
    if systemd_boot is None:
        remove_trial_settings = FileChange(TRIAL_SETTINGS_PATH, FileState.ABSENT, regenerates=Regenerates.GRUB)
        default_entry = FileChange(GRUB_DROPIN_PATH, FileState.PRESENT, grub_dropin, regenerates=Regenerates.GRUB)
        if trial.enabled:
            # The script emits nothing outside a trial, so it stays installed between applies.
            configure.append(
                FileChange(TRIAL_GRUB_SCRIPT_PATH, FileState.PRESENT, trial.grub_script, SCRIPT_MODE, Regenerates.GRUB)
            )
        if trial_now:
            configure.append(
                FileChange(TRIAL_SETTINGS_PATH, FileState.PRESENT, trial.settings, regenerates=Regenerates.GRUB)
            )
        else:
            # Trial settings that an interrupted trial left behind go too.
            configure += [default_entry, remove_trial_settings]
        # The trial entry disappears with the update-grub that follows each of these.
        commit += [default_entry, remove_trial_settings]
        revert.append(remove_trial_settings)
    else:
        trial_entry = FileChange(
            systemd_boot.trial_entry_path, FileState.PRESENT, systemd_boot.trial_entry, ESP_FILE_MODE
        )
        remove_trial_entry = FileChange(systemd_boot.trial_entry_path, FileState.ABSENT)
        kernel_cmdline = FileChange(
            KERNEL_CMDLINE_PATH,
            FileState.PRESENT,
            systemd_boot.kernel_cmdline,
            regenerates=Regenerates.LOADER_ENTRIES,
        )
        # Booted once by bootctl set-oneshot; systemd-boot clears the one-shot as it boots it.
        configure += [trial_entry] if trial_now else [kernel_cmdline, remove_trial_entry]
        commit += [kernel_cmdline, remove_trial_entry]
        revert.append(remove_trial_entry)
    configure.append(
        FileChange(
            INITRAMFS_MODULES_PATH,
            FileState.BLOCK,
            "".join(f"{module}\n" for module in initramfs_modules),
            regenerates=Regenerates.INITRAMFS,
            marker=INITRAMFS_MODULES_MARKER,
        )
    )
    configure.append(
        FileChange(INITRAMFS_SCRIPT_PATH, FileState.ABSENT, regenerates=Regenerates.INITRAMFS)
        if initramfs_script is None
        else FileChange(INITRAMFS_SCRIPT_PATH, FileState.PRESENT, initramfs_script, SCRIPT_MODE, Regenerates.INITRAMFS)
    )
    # Each found by the plan's own parser (continuation lines included); vfio-pci.ids= on the kernel
    # command line is then the one list of IDs.
    configure += [
        FileChange(
            conflict.path,
            FileState.COMMENTED,
            conflict.source + "\n",
            regenerates=Regenerates.INITRAMFS,
            marker=MODPROBE_COMMENT_PREFIX,
            line=conflict.line_number,
        )
        for conflict in modprobe_conflicts
    ]
    if hugetlbfs_mount_point is not None:
        configure.append(FileChange(hugetlbfs_mount_point, FileState.DIRECTORY, mode=SCRIPT_MODE))
    # The mount's fstab line as gpuhost's block, with nofail (none: the block of an earlier apply goes).
    configure.append(
        FileChange(
            FSTAB_PATH,
            FileState.BLOCK,
            "" if hugetlbfs_mount_point is None else f"none {hugetlbfs_mount_point} hugetlbfs pagesize=1G,nofail 0 0\n",
            marker=FSTAB_MARKER,
        )
    )
    # Only the trial entry pulls the deadline in (systemd.wants=); the files go when the trial ends,
    # and an interrupted trial's with the next apply that has none.
    timer, service = deadline_units
    remove_deadline = [
        FileChange(DEADLINE_TIMER_PATH, FileState.ABSENT),
        FileChange(DEADLINE_SERVICE_PATH, FileState.ABSENT),
    ]
    configure += (
        [
            FileChange(DEADLINE_TIMER_PATH, FileState.PRESENT, timer),
            FileChange(DEADLINE_SERVICE_PATH, FileState.PRESENT, service),
        ]
        if trial_now
        else remove_deadline
    )
    commit += remove_deadline
    revert += remove_deadline
    return HostFiles(configure=tuple(configure), commit=tuple(commit), revert=tuple(revert))


def recorded_paths(files: HostFiles) -> tuple[str, ...]:
    """The host's own paths among every phase's changes, in order: what apply records before its
    first change (a copy, or a note that the path was absent) and rollback puts back."""
    every = (*files.configure, *files.commit, *files.revert)
    return tuple(dict.fromkeys(change.path for change in every if change.path not in GPUHOST_FILES))
