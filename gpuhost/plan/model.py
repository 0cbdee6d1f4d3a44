"""What `gpuhost apply` will make true on one host: typed, frozen, computed once by the planner.

The CLI prints it, the Ansible playbooks apply it (through the gpuhost.passthrough.plan action),
and the verification compares the host with it after the reboot.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

from gpuhost.errors import GpuhostError
from gpuhost.facts.model import GPUHOST_GRUB_DROPIN, TextEnum
from gpuhost.problems import Problem

if TYPE_CHECKING:
    from gpuhost.plan.rescue import TrialRescue

GRUB_DROPIN_PATH = GPUHOST_GRUB_DROPIN
INITRAMFS_MODULES_PATH = "/etc/initramfs-tools/modules"
# gpuhost's block in the host's own INITRAMFS_MODULES_PATH ({mark}: BEGIN, END). The rollback role
# removes the block by the same marker (its defaults; tests/rollout/test_rollback.py keeps them equal): a
# change here must keep finding the blocks of earlier applies.
INITRAMFS_MODULES_MARKER = "# {mark} gpuhost: vfio-pci must own the passthrough GPUs before any host driver"
INITRAMFS_SCRIPT_PATH = "/etc/initramfs-tools/scripts/init-top/gpuhost-vfio"
APT_PIN_PATH = "/etc/apt/preferences.d/gpuhost-no-nvidia-driver"
# The trial boot: the new command line as a GRUB entry of its own, booted once with grub-reboot.
# The trial settings live outside /etc/default/grub.d/ so that the normal entries never see them;
# the /etc/grub.d/ script runs after 10_linux (the trial entry is never entry 0, the default).
TRIAL_SETTINGS_PATH = "/etc/default/gpuhost-trial.cfg"
TRIAL_GRUB_SCRIPT_PATH = "/etc/grub.d/42_gpuhost_trial"
TRIAL_ENTRY_ID = "gpuhost-trial"
TRIAL_MARKER = "gpuhost.trial=1"  # on the trial entry's command line only: /proc/cmdline tells which entry booted
# systemd-boot: kernel-install (or proxmox-boot-tool refresh) writes every loader entry's options
# from this file. The trial is a loader entry of its own on the ESP, booted once by
# `bootctl set-oneshot`; systemd-boot clears the one-shot when it boots it.
KERNEL_CMDLINE_PATH = "/etc/kernel/cmdline"
TRIAL_LOADER_ENTRY_ID = "gpuhost-trial.conf"
# Every installed kernel's entry written again from /etc/kernel/cmdline: what Debian's
# /etc/kernel/postinst.d/zz-systemd-boot does for one kernel. Fixed text: nothing of a host's in it.
KERNEL_INSTALL_REFRESH = (
    "set -e; for image in /boot/vmlinuz-*; do version=${image#/boot/vmlinuz-}; "
    '[ -d "/lib/modules/$version" ] || continue; '
    'if [ -e "/boot/initrd.img-$version" ]; then kernel-install add "$version" "$image" "/boot/initrd.img-$version"; '
    'else kernel-install add "$version" "$image"; fi; done'
)
PROXMOX_BOOT_TOOL_REFRESH = "proxmox-boot-tool refresh"
# Where gpuhost may have left a trial entry: beside kernel-install's ($BOOT/loader/entries).
TRIAL_LOADER_ENTRY_PATHS = tuple(
    f"{directory}/{TRIAL_LOADER_ENTRY_ID}"
    for directory in ("/boot/efi/loader/entries", "/efi/loader/entries", "/boot/loader/entries")
)
# The trial's userspace deadline (gpuhost.plan.rescue): a timer only the trial entry pulls in, and its service.
DEADLINE_TIMER = "gpuhost-trial-deadline.timer"
DEADLINE_SERVICE = "gpuhost-trial-deadline.service"
DEADLINE_TIMER_PATH = f"/etc/systemd/system/{DEADLINE_TIMER}"
DEADLINE_SERVICE_PATH = f"/etc/systemd/system/{DEADLINE_SERVICE}"
BACKUP_DIR = "/var/lib/gpuhost/backup"  # what apply overwrites or deletes, kept for `gpuhost rollback`
# The paths of the host's that apply found absent before its first change (a JSON list): rollback
# removes what apply made there. Beside BACKUP_DIR, not in it: everything in it is a copy of a file.
ABSENT_SUFFIX = "-absent.json"  # the collection's host_files module names the record so, from its backup_dir
ABSENT_RECORD_PATH = BACKUP_DIR + ABSENT_SUFFIX
# The hugetlbfs mount (gpuhost_hugetlbfs_mount): gpuhost's block in the host's fstab. nofail: a mount
# that fails never stops the boot at local-fs.target.
FSTAB_PATH = "/etc/fstab"
FSTAB_MARKER = "# {mark} gpuhost: hugetlbfs with 1 GiB pages for the VMs (gpuhost_hugetlbfs_mount)"
# Put before each line of an `options vfio-pci ids=` directive of modprobe.d that apply comments out.
MODPROBE_COMMENT_PREFIX = "# gpuhost: vfio-pci.ids= is on the kernel command line: "
# One run at a time per host (apply, rollback): who holds the host, written when the run's first
# change begins and removed at its end; it survives the trial reboot (not under /run).
LOCK_PATH = "/var/lib/gpuhost/lock"
# How apply and rollback reboot a host (as gpuhost_verify's default; docs/apply.md says why --no-block).
REBOOT_COMMAND = "systemctl --no-block reboot"


class BindBy(TextEnum):
    """How the plan hands a GPU's functions to vfio-pci at boot."""

    IDS = "ids"  # vfio-pci.ids= on the kernel command line
    ADDRESS = "address"  # driver_override per PCI address, from the initramfs script


class KernelCmdlineWriter(TextEnum):
    """What makes the next boot's kernel command line from gpuhost's settings."""

    UPDATE_GRUB = "update-grub"  # GRUB: gpuhost's drop-in in /etc/default/grub.d, then update-grub
    KERNEL_INSTALL = "kernel-install"  # systemd-boot: /etc/kernel/cmdline, then kernel-install add per kernel
    PROXMOX_BOOT_TOOL = "proxmox-boot-tool"  # systemd-boot on Proxmox: /etc/kernel/cmdline, proxmox-boot-tool refresh


@dataclass(frozen=True)
class SystemdBootPlan:
    """The kernel command line of a systemd-boot host, and its trial entry."""

    writer: KernelCmdlineWriter
    current_kernel_cmdline: str | None  # KERNEL_CMDLINE_PATH now (None: absent, kernel-install copies /proc/cmdline)
    kernel_cmdline: str  # KERNEL_CMDLINE_PATH after apply: the old options without gpuhost's, then gpuhost's
    default_entry: str  # the loader entry the trial copies (the one that booted the running kernel)
    trial_entry_path: str  # where the trial entry is written: beside the default entry
    trial_entry: str  # its content: the default entry with the new options, panic=N and the trial marker
    refresh_command: str  # shell: writes every kernel's entry again (KERNEL_INSTALL_REFRESH or proxmox-boot-tool)


class PlanRefused(GpuhostError):
    """Raised by callers that need a plan they can apply (`HostPlan.require_applicable`)."""

    def __init__(self, refusals: tuple[Problem, ...]) -> None:
        super().__init__("; ".join(str(refusal) for refusal in refusals))
        self.refusals = refusals


@dataclass(frozen=True)
class BoundFunction:
    address: str
    vendor_device: str
    gpu: str  # the address of the GPU whose card or group it belongs to (an NVSwitch: its own)
    driver: str | None  # bound now (None: none)


@dataclass(frozen=True)
class HugePagePlan:
    pages: int  # 1 GiB pages to reserve at boot (0: none, and gpuhost's hugepage options removed)
    requested: str  # the inventory value: auto, 0, N or a size
    rule: str  # how the number was reached, for the plan's text
    per_node: tuple[tuple[int, int], ...]  # (NUMA node, pages) allocated at boot, every memory node
    host_keeps_kib: int  # memory left to the host
    mount_point: str | None  # hugetlbfs mount with pagesize=1G, with an fstab entry (None: none)
    node_form: bool = False  # hugepages=<node>:<count>,...: per_node is the command line's (verified per node)
    placement: str = ""  # why the pages go on those nodes
    vms_per_node: tuple[tuple[int, int], ...] = ()  # (NUMA node, pages) the declared VMs (gpuhost_vms) need

    @property
    def kernel_option(self) -> str:
        """hugepages=N, or the node form hugepages=0:440,1:440 (only the nodes that get pages)."""
        if not self.node_form:
            return f"hugepages={self.pages}"
        return "hugepages=" + ",".join(f"{node}:{count}" for node, count in self.per_node if count)


@dataclass(frozen=True)
class DriverRemoval:
    packages: tuple[str, ...]  # installed packages to purge
    runfile: bool  # nvidia-uninstall -s
    files: tuple[str, ...]  # configuration files to delete
    pin: bool  # write the apt pin that keeps the driver out
    note: str  # what is done and why, or why nothing is
    # The NVIDIA modules DKMS built for the running kernel (/lib/modules/<kver>/updates/dkms), as found.
    dkms_modules: tuple[str, ...] = ()
    # After the purge and the uninstaller: `dkms remove --all` for every NVIDIA module DKMS still has
    # (every kernel), then no nvidia*.ko may be left in any /lib/modules/*/updates/dkms.
    dkms_cleanup: bool = False
    # Every NVIDIA driver module file found for any installed kernel (DKMS, precompiled packages, .run),
    # each removed by the purge, the uninstaller or DKMS, or else deleted by apply.
    module_files: tuple[str, ...] = ()
    # The file names (globs) of NVIDIA's driver modules (less the excluded ones): apply deletes what the
    # purge left of them in every /lib/modules/*/ (unless a package still owns it) and stops where one
    # is left. Empty: the driver is kept.
    module_globs: tuple[str, ...] = ()
    module_excluded_globs: tuple[str, ...] = ()  # the kernel's own modules the globs would match

    @property
    def needed(self) -> bool:
        return bool(self.packages or self.runfile or self.files or self.dkms_modules or self.module_files)


@dataclass(frozen=True)
class TrialBoot:
    """How the new command line is tried before it becomes GRUB's default."""

    enabled: bool  # trial boot, then commit (False: --no-trial / gpuhost_trial_boot: false)
    panic_seconds: int  # panic=N on the trial entry
    settings: str  # content of TRIAL_SETTINGS_PATH: the drop-in plus panic=N and TRIAL_MARKER
    grub_script: str  # content of TRIAL_GRUB_SCRIPT_PATH (the same on every host)
    boot_filesystem: str  # where /boot/grub lives, e.g. "/dev/vda1 (ext4)", for the messages


@dataclass(frozen=True)
class ModprobeConflict:
    """An `options vfio-pci ids=` line in modprobe.d that would compete with vfio-pci.ids= on the command line."""

    path: str
    line_number: int
    source: str = ""  # its lines as the file has them (a continued directive: all of them)


class FileState(TextEnum):
    """What a FileChange leaves at its path."""

    PRESENT = "present"  # a file with exactly the content
    ABSENT = "absent"
    DIRECTORY = "directory"
    BLOCK = "block"  # gpuhost's marked block in a file of the host's, the rest kept (empty content: no block)
    # The lines of `content` from line `line` on, each put behind the `marker` text: a directive of
    # the host's commented out, found where the plan's parser found it (else the change fails).
    COMMENTED = "commented"
    RESTORED = "restored"  # rollback: the copy apply made under BACKUP_DIR put back (content, mode, owner)
    # rollback: an empty directory apply made, removed (unmounted first where mounted); one with files fails.
    NO_DIRECTORY = "no-directory"


class Regenerates(TextEnum):
    """What the host builds again from a changed file before its next boot (the playbooks' handlers)."""

    INITRAMFS = "initramfs"  # update-initramfs -u -k all
    GRUB = "grub"  # update-grub
    LOADER_ENTRIES = "loader-entries"  # systemd-boot: SystemdBootPlan.refresh_command


@dataclass(frozen=True)
class FileChange:
    path: str
    state: FileState
    content: str = ""  # PRESENT: the whole file; BLOCK: the block's lines
    mode: str = "0644"  # PRESENT, BLOCK (a file it creates) and DIRECTORY; owner and group are root
    regenerates: Regenerates | None = None
    marker: str = ""  # BLOCK: the marker line ({mark}: BEGIN, END); COMMENTED: the text put before each line
    line: int = 0  # COMMENTED: the number of the first line of `content` in the file


@dataclass(frozen=True)
class HostFiles:
    """gpuhost's file changes on one host, by phase of apply (gpuhost.plan.files says which and why)."""

    configure: tuple[FileChange, ...]  # before the reboot (the trial entry's files, on a trial)
    commit: tuple[FileChange, ...]  # once the trial booted and verified: the default entry's
    revert: tuple[FileChange, ...]  # when the trial did not verify: the trial entry's files removed


@dataclass(frozen=True)
class HostPlan:
    host: str
    gpus: tuple[str, ...]  # addresses of the GPUs passed through
    functions: tuple[BoundFunction, ...]  # every function vfio-pci must own
    bind_by: BindBy
    vfio_ids: tuple[str, ...]  # vendor:device for vfio-pci.ids (empty when binding by address only)
    override_addresses: tuple[str, ...]  # functions bound through driver_override in the initramfs script
    kernel_options: tuple[str, ...]  # what gpuhost adds, in order
    owned_keys: tuple[str, ...]  # option names gpuhost removes from the earlier GRUB lines
    owned_tokens: tuple[str, ...]  # exact tokens gpuhost removes (its own blacklist, optional flags)
    current_cmdline: str  # /proc/cmdline
    current_grub_line: str  # GRUB_CMDLINE_LINUX + GRUB_CMDLINE_LINUX_DEFAULT as update-grub sees them now
    desired_grub_line: str  # the same after gpuhost's drop-in
    grub_dropin: str  # content of GRUB_DROPIN_PATH
    initramfs_modules: tuple[str, ...]  # lines of INITRAMFS_MODULES_PATH
    initramfs_script: str | None  # content of INITRAMFS_SCRIPT_PATH (None: the file must not exist)
    hugepages: HugePagePlan
    driver_removal: DriverRemoval
    trial: TrialBoot
    kernel_cmdline_writer: KernelCmdlineWriter
    systemd_boot: SystemdBootPlan | None  # None on GRUB hosts
    modprobe_conflicts: tuple[ModprobeConflict, ...]  # commented out by apply (the file backed up first)
    # The host's own paths among `files` (gpuhost.plan.files.recorded_paths): each copied to BACKUP_DIR,
    # or noted in ABSENT_RECORD_PATH, before apply's first change (once: the first record is the original).
    backup_files: tuple[str, ...]
    files: HostFiles
    rescue: TrialRescue  # what brings a hung trial boot back (gpuhost.plan.rescue), armed only on a trial
    reboot_needed: bool
    reboot_reasons: tuple[str, ...]
    verify_command: str  # shell: exit 0 when the host booted into the planned state (reboot test_command)
    notes: tuple[str, ...]
    refusals: tuple[Problem, ...]  # Stage.PLAN problems; nothing is written to a host with one

    @property
    def trial_now(self) -> bool:
        """This apply boots the new command line once, as a trial entry, before it becomes the default."""
        return self.trial.enabled and self.reboot_needed

    @property
    def applicable(self) -> bool:
        return not self.refusals

    def require_applicable(self) -> HostPlan:
        if self.refusals:
            raise PlanRefused(self.refusals)
        return self

    def to_json(self) -> dict[str, Any]:
        """Plain data (schema gpuhost.plan/1): the CLI's --json output and the playbooks' input."""
        data = asdict(self)
        data["schema"] = "gpuhost.plan/1"
        data["applicable"] = self.applicable
        data["driver_removal"]["needed"] = self.driver_removal.needed
        data["paths"] = {
            "grub_dropin": GRUB_DROPIN_PATH,
            "initramfs_modules": INITRAMFS_MODULES_PATH,
            "initramfs_script": INITRAMFS_SCRIPT_PATH,
            "apt_pin": APT_PIN_PATH,
            "trial_settings": TRIAL_SETTINGS_PATH,
            "trial_grub_script": TRIAL_GRUB_SCRIPT_PATH,
            "backup_dir": BACKUP_DIR,
            "absent_record": ABSENT_RECORD_PATH,
            "lock": LOCK_PATH,
            "kernel_cmdline": KERNEL_CMDLINE_PATH,
            "deadline_timer": DEADLINE_TIMER_PATH,
            "deadline_service": DEADLINE_SERVICE_PATH,
        }
        data["trial"]["entry_id"] = TRIAL_ENTRY_ID
        data["trial"]["marker"] = TRIAL_MARKER
        data["trial"]["loader_entry_id"] = TRIAL_LOADER_ENTRY_ID
        data["trial"]["now"] = self.trial_now
        data["rescue"]["has_watchdog"] = self.rescue.has_watchdog
        data["rescue"]["uncaught"] = [str(hang) for hang in self.rescue.uncaught]
        # A refusal's JSON keeps the keys it had before it was a Problem (host, fix) next to the Problem's own.
        data["refusals"] = [{**r.as_dict(), "host": self.host, "fix": r.remedy} for r in self.refusals]
        plain: dict[str, Any] = _plain(data)
        return plain


def _plain(value: Any) -> Any:
    """Tuples as lists, recursively: what JSON and Ansible variables hold."""
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, Enum):
        return value.value
    return value
