"""Build (or reuse) the base disk image of lab hosts: needs root, runs on the controller.

Debian bookworm by debootstrap onto an ext4 partition of a raw disk, GRUB in the MBR, the lab's
keys baked in, then converted to qcow2. The image lives in `<image dir>/<variant>-<recipe hash>/`
with a manifest; it is reused as long as the recipe and the lab's keys are unchanged.

UEFI disks (gpuhost/lab/boot.py) are GPT with an EFI system partition mounted at /boot/efi:
shim + signed GRUB installed at the removable path \\EFI\\BOOT\\BOOTX64.EFI (found by OVMF with no
boot entry in its variables), or systemd-boot with kernel-install's loader entries. They live in
`<image dir>/<variant>-<layout>-<recipe hash>/`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

from gpuhost.facts.model import LoaderEntry
from gpuhost.facts.parsers import parse_loader_entry
from gpuhost.lab import diskimage, recipe
from gpuhost.lab.boot import DiskLayout
from gpuhost.lab.errors import LabError
from gpuhost.lab.image import Image, LabKeys, Progress, ensure_keys, find_image, image_name
from gpuhost.lab.paths import LabPaths
from gpuhost.lab.tools import BUILD_TOOLS, require

CHROOT_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
    "DEBIAN_FRONTEND": "noninteractive",
    "HOME": "/root",
}


def _no_progress(_: str) -> None:
    return None


def default_mirror() -> str:
    texts: list[str] = []
    candidates = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for candidate in candidates:
        with contextlib.suppress(OSError):
            texts.append(candidate.read_text())
    return recipe.mirror_from_sources(texts) or recipe.DEFAULT_MIRROR


def ensure_image(
    paths: LabPaths,
    variant: str = "base",
    layout: DiskLayout = DiskLayout.BIOS_GRUB,
    *,
    mirror: str | None = None,
    force: bool = False,
    progress: Progress = _no_progress,
) -> Image:
    """The image for `variant`: the cached one when its recipe is unchanged, else a new build."""
    if not force:
        cached = find_image(paths, variant, layout)
        if cached is not None:
            return cached
    if os.geteuid() != 0:
        raise LabError(
            "building the lab image needs root (debootstrap, loop devices, mount, chroot). "
            "Run it as: sudo gpuhost lab image (add --image-dir or GPUHOST_LAB_IMAGE_DIR to "
            "build into your own cache directory)"
        )
    paths.images.mkdir(parents=True, exist_ok=True)
    name = image_name(variant, layout)
    # One build per variant at a time; whoever waited reuses what the other one built.
    with _held_exclusively(
        paths.images / f".build-{name}.lock", progress, f"another process is building the {name} image; waiting for it"
    ):
        if not force:
            cached = find_image(paths, variant, layout)
            if cached is not None:
                return cached
        return _Builder(paths, variant, layout, mirror or default_mirror(), progress).build()


@contextlib.contextmanager
def _held_exclusively(lock_path: Path, progress: Progress, waiting: str) -> Iterator[None]:
    """An exclusive flock on `lock_path` for the block; says `waiting` once when another process holds it."""
    with lock_path.open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress(waiting)
            fcntl.flock(lock, fcntl.LOCK_EX)  # a signal (Ctrl-C) still interrupts the wait
        yield


class _Builder:
    def __init__(self, paths: LabPaths, variant: str, layout: DiskLayout, mirror: str, progress: Progress) -> None:
        self.paths = paths
        self.layout = layout
        self.name = image_name(variant, layout)
        self.recipe = recipe.recipe_for(variant, layout)
        self.hash = recipe.recipe_hash(self.recipe)
        self.mirror = mirror
        self.progress = progress
        self.work = paths.images / f".build-{self.name}-{self.hash}-{os.getpid()}"
        self.log = self.work / "build.log"
        self.tools: dict[str, str] = {}

    def _run(self, argv: Sequence[str], *, stdin: str | None = None, env: dict[str, str] | None = None) -> str:
        with self.log.open("a") as log:
            log.write(f"$ {' '.join(argv)}\n")
        result = subprocess.run(list(argv), input=stdin, capture_output=True, text=True, env=env, check=False)
        with self.log.open("a") as log:
            log.write(result.stdout + result.stderr)
        if result.returncode != 0:
            tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
            raise LabError(
                f"image build step failed (exit {result.returncode}): {' '.join(argv)}\n{tail}\nfull log: {self.log}"
            )
        return result.stdout

    def _chroot(self, root: Path, *argv: str, stdin: str | None = None) -> str:
        return self._run([self.tools["chroot"], str(root), *argv], stdin=stdin, env=CHROOT_ENV)

    def build(self) -> Image:
        if os.geteuid() != 0:
            raise LabError(
                "building the lab image needs root (debootstrap, loop devices, mount, chroot). "
                "Run it as: sudo gpuhost lab image (add --image-dir or GPUHOST_LAB_IMAGE_DIR to "
                "build into your own cache directory)"
            )
        self.tools = require(BUILD_TOOLS, "building the lab image")
        started = time.monotonic()
        keys = ensure_keys(self.paths)
        if self.work.exists():
            shutil.rmtree(self.work)
        self.work.mkdir(parents=True)
        self.paths.package_cache.mkdir(parents=True, exist_ok=True)
        try:
            kernel = self._build_disk(keys)
            self.progress("converting to qcow2")
            self._run(
                [
                    self.tools["qemu-img"],
                    "convert",
                    "-O",
                    "qcow2",
                    str(self.work / "disk.raw"),
                    str(self.work / "disk.qcow2"),
                ]
            )
            (self.work / "disk.raw").unlink()
            seconds = round(time.monotonic() - started, 1)
            manifest = {
                "variant": self.recipe.variant,
                "layout": self.layout.value,
                "recipe_hash": self.hash,
                "kernel": kernel,
                "host_public_key": keys.host_public,
                "client_public_key": keys.client_public,
                "mirror": self.mirror,
                "build_seconds": seconds,
                "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
            (self.work / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
            final = self.paths.image_dir(self.name, self.hash)
            if final.exists():
                # Move the old one aside first: the new image appears in one rename.
                old = final.with_name(f".old-{final.name}-{os.getpid()}")
                final.rename(old)
                shutil.rmtree(old)
            self.work.rename(final)
        except BaseException:
            # Keep the log of a failed build next to where the image would have been.
            with contextlib.suppress(OSError):
                failed_log = self.paths.images / f"build-{self.name}-failed.log"
                shutil.copyfile(self.log, failed_log)
                with failed_log.open("a") as out:
                    out.write((self.work / "debootstrap.log").read_text(errors="replace"))
            shutil.rmtree(self.work, ignore_errors=True)
            raise
        _give_to_sudo_user(self.paths.images)
        return Image(
            variant=self.recipe.variant,
            recipe_hash=self.hash,
            disk=final / "disk.qcow2",
            kernel=kernel,
            host_public_key=keys.host_public,
            client_public_key=keys.client_public,
            build_seconds=seconds,
            reused=False,
        )

    def _loop(self, raw: Path, offset: int, size: int, stack: contextlib.ExitStack) -> str:
        device = self._run(
            [self.tools["losetup"], "-f", "--show", "-o", str(offset), "--sizelimit", str(size), str(raw)]
        ).strip()
        stack.callback(self._quiet, [self.tools["losetup"], "-d", device])
        return device

    def _build_disk(self, keys: LabKeys) -> str:
        raw = self.work / "disk.raw"
        size = self.recipe.disk_size_gib * 1024**3
        gpt: diskimage.GptDisk | None = None
        with raw.open("wb") as handle:
            handle.truncate(size)
            if self.layout is DiskLayout.BIOS_GRUB:
                handle.write(diskimage.mbr_with_one_partition(size))
            else:
                gpt = diskimage.gpt_with_esp_and_root(
                    size,
                    recipe.ESP_SIZE_MIB * 1024**2,
                    disk_guid=uuid.uuid4(),
                    esp_guid=uuid.uuid4(),
                    root_guid=uuid.uuid4(),
                )
                handle.write(gpt.head)
                handle.seek(size - len(gpt.tail))
                handle.write(gpt.tail)
        root = self.work / "root"
        root.mkdir()
        root_uuid = str(uuid.uuid4())
        # A FAT volume ID, written as fstab and blkid show it (XXXX-XXXX).
        esp_serial = uuid.uuid4().hex[:8].upper()
        esp_uuid = f"{esp_serial[:4]}-{esp_serial[4:]}"
        with contextlib.ExitStack() as stack:
            loop_disk = self._run([self.tools["losetup"], "-f", "--show", str(raw)]).strip()
            stack.callback(self._quiet, [self.tools["losetup"], "-d", loop_disk])
            if gpt is None:
                loop_part = self._loop(raw, diskimage.PARTITION_OFFSET, size - diskimage.PARTITION_OFFSET, stack)
            else:
                loop_part = self._loop(raw, gpt.root.offset, gpt.root.size, stack)
            # Initialise inode tables now: lazy init would run in every VM, under TCG.
            self._run(
                [
                    self.tools["mkfs.ext4"],
                    "-q",
                    "-F",
                    "-U",
                    root_uuid,
                    "-L",
                    "gpuhost-lab",
                    "-E",
                    "lazy_itable_init=0,lazy_journal_init=0",
                    loop_part,
                ]
            )
            self._run([self.tools["mount"], loop_part, str(root)])
            stack.callback(self._umount, root)
            self.progress(f"debootstrap {self.recipe.suite} from {self.mirror}")
            self._debootstrap(root)
            self.progress("configuring the image")
            self._write_files(root, root_uuid, esp_uuid, keys)
            for source, target, kind in (("proc", "proc", "proc"), ("sysfs", "sys", "sysfs"), ("/dev", "dev", None)):
                argv = (
                    [self.tools["mount"], "--bind", source, str(root / target)]
                    if kind is None
                    else [self.tools["mount"], "-t", kind, source, str(root / target)]
                )
                self._run(argv)
                stack.callback(self._umount, root / target)
            if self.recipe.apt_packages:
                self._apt_install(root)
            if gpt is not None:
                # The ESP's files are put together in /boot/efi of the image first, then copied
                # onto the FAT file system by mtools: the build machine may not mount vfat (a
                # container without the module), and mtools needs no mount.
                (root / recipe.ESP_MOUNT.lstrip("/")).mkdir(parents=True, exist_ok=True)
            kernel = self._configure(root, loop_disk, root_uuid)
            if gpt is not None:
                self._fill_esp(root, self._loop(raw, gpt.esp.offset, gpt.esp.size, stack), esp_serial)
            with contextlib.suppress(LabError, OSError):
                self._run(["fstrim", str(root)])  # lets qemu-img skip freed blocks
        root.rmdir()  # the mount point, empty once unmounted
        return kernel

    @contextlib.contextmanager
    def _package_cache_held(self) -> Iterator[None]:
        """The package cache to itself. Builds of different variants run at once (the two lab
        workers each need one on a fresh machine), and debootstrap and apt both download into the
        shared cache's partial files and move them into place: two at once broke each other's
        downloads ("cannot open .../libmd0_1.0.4-2_amd64.deb: No such file"), and both builds failed."""
        with _held_exclusively(
            self.paths.package_cache / ".lock",
            self.progress,
            "another image build is using the package cache; waiting for it",
        ):
            yield

    def _debootstrap(self, root: Path) -> None:
        try:
            with self._package_cache_held():
                self._run(
                    [
                        self.tools["debootstrap"],
                        "--variant=minbase",
                        "--components=main",
                        f"--include={','.join(self.recipe.packages)}",
                        f"--cache-dir={self.paths.package_cache}",
                        self.recipe.suite,
                        str(root),
                        self.mirror,
                    ]
                )
        except LabError:
            # debootstrap's own log names the package that failed; keep it for the failed log.
            with contextlib.suppress(OSError):
                shutil.copyfile(root / "debootstrap/debootstrap.log", self.work / "debootstrap.log")
            raise

    @contextlib.contextmanager
    def _apt_in_chroot(self, root: Path) -> Iterator[None]:
        """apt-get in the chroot, with the build's package cache and no service started."""
        # Reuse the build's package cache, and keep services from starting in the chroot.
        archives = root / "var/cache/apt/archives"
        (self.paths.package_cache / "partial").mkdir(parents=True, exist_ok=True)
        self._run([self.tools["mount"], "--bind", str(self.paths.package_cache), str(archives)])
        policy = root / "usr/sbin/policy-rc.d"
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
        try:
            with self._package_cache_held():
                yield
        finally:
            policy.unlink()
            # Unmounted right away, so that the later `apt-get clean` empties the image's own
            # cache, not the build's.
            self._umount(archives)

    def _apt_install(self, root: Path) -> None:
        self.progress(f"apt-get install {' '.join(self.recipe.apt_packages)}")
        with self._apt_in_chroot(root):
            self._chroot(root, "apt-get", "update", "-q")
            self._chroot(root, "apt-get", "install", "-y", "-q", "--no-install-recommends", *self.recipe.apt_packages)

    def _build_stall_module(self, root: Path, kernel: str) -> None:
        """The lab's kernel stall module, compiled in the image against its own kernel's headers
        (the same mirror, the same day: their versions match), installed in the kernel's module
        tree, and the compiler and headers purged again."""
        self.progress(f"building {recipe.STALL_MODULE_NAME}.ko for {kernel}")
        packages = (f"linux-headers-{kernel}", *recipe.STALL_BUILD_PACKAGES)
        work = root / "tmp/gpuhost-stall"
        work.mkdir(parents=True, exist_ok=True)
        (work / f"{recipe.STALL_MODULE_NAME}.c").write_text(self.recipe.stall_module_source)
        (work / "Kbuild").write_text(f"obj-m := {recipe.STALL_MODULE_NAME}.o\n")
        module = f"/tmp/gpuhost-stall/{recipe.STALL_MODULE_NAME}.ko"
        with self._apt_in_chroot(root):
            self._chroot(root, "apt-get", "update", "-q")
            self._chroot(root, "apt-get", "install", "-y", "-q", "--no-install-recommends", *packages)
            headers = f"/usr/src/linux-headers-{kernel}"
            self._chroot(root, "make", "-s", "-C", headers, "M=/tmp/gpuhost-stall", "modules")
            self._chroot(root, "strip", "--strip-debug", module)
            extra = root / f"lib/modules/{kernel}/extra"
            extra.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(root / module.lstrip("/"), extra / f"{recipe.STALL_MODULE_NAME}.ko")
            self._chroot(root, "apt-get", "purge", "-y", "-q", "--autoremove", *packages)
        shutil.rmtree(work)
        self._chroot(root, "depmod", kernel)

    def _quiet(self, argv: list[str]) -> None:
        subprocess.run(argv, capture_output=True, check=False)

    def _umount(self, target: Path) -> None:
        if subprocess.run([self.tools["umount"], str(target)], capture_output=True, check=False).returncode:
            # A process the chroot left behind can hold the mount; detach it lazily.
            subprocess.run([self.tools["umount"], "-l", str(target)], capture_output=True, check=False)

    def _write_files(self, root: Path, root_uuid: str, esp_uuid: str, keys: LabKeys) -> None:
        for path, mode, content in self.recipe.files:
            target = root / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content.replace("{root_uuid}", root_uuid).replace("{esp_uuid}", esp_uuid))
            target.chmod(mode)
        ssh_dir = root / "etc/ssh"
        for old in ssh_dir.glob("ssh_host_*"):
            old.unlink()
        host_key = ssh_dir / "ssh_host_ed25519_key"
        shutil.copyfile(self.paths.host_key, host_key)
        host_key.chmod(0o600)
        (ssh_dir / "ssh_host_ed25519_key.pub").write_text(keys.host_public + "\n")
        dot_ssh = root / "root/.ssh"
        dot_ssh.mkdir(mode=0o700, exist_ok=True)
        (dot_ssh / "authorized_keys").write_text(keys.client_public + "\n")
        (dot_ssh / "authorized_keys").chmod(0o600)
        (root / "etc/hostname").write_text("lab\n")
        # Empty machine-id: each host makes its own at first boot instead of sharing the image's.
        (root / "etc/machine-id").write_text("")
        with contextlib.suppress(FileNotFoundError):
            (root / "var/lib/dbus/machine-id").unlink()

    def _configure(self, root: Path, loop_disk: str, root_uuid: str) -> str:
        kernels = sorted(p.name.removeprefix("vmlinuz-") for p in (root / "boot").glob("vmlinuz-*"))
        if not kernels:
            raise LabError(f"debootstrap installed no kernel in {root}/boot; see {self.log}")
        kernel = kernels[-1]
        self._chroot(root, "systemctl", "enable", "systemd-networkd.service", "gpuhost-lab-hostname.service")
        self._chroot(root, "systemctl", "mask", *self.recipe.masked_units)
        if self.recipe.stall_module_source:
            self._build_stall_module(root, kernel)
        self.progress("first initramfs")
        self._first_initramfs(root, kernel)
        if self.layout is DiskLayout.BIOS_GRUB:
            # Lets later grub-pc upgrades inside a host install GRUB without asking.
            self._chroot(root, "debconf-set-selections", stdin="grub-pc grub-pc/install_devices multiselect /dev/vda\n")
            self.progress("installing GRUB")
            self._chroot(
                root,
                "grub-install",
                "--target=i386-pc",
                "--modules=part_msdos ext2",
                "--boot-directory=/boot",
                loop_disk,
            )
            (root / "boot/grub/grub.cfg").write_text(self._grub_cfg(kernel, root_uuid))
        elif self.layout is DiskLayout.EFI_SHIM_GRUB:
            self._install_shim_grub(root, kernel, root_uuid)
        else:
            self._install_systemd_boot(root, kernel)
        if self.recipe.variant == "nested":
            self._nested_guest(root, kernel)
        self._chroot(root, "apt-get", "clean")
        return kernel

    def _fill_esp(self, root: Path, loop_esp: str, esp_serial: str) -> None:
        self.progress("writing the EFI system partition")
        staged = root / "tmp/gpuhost-esp"
        # Moved out of /boot/efi, which is the ESP's mount point once the host boots.
        (root / recipe.ESP_MOUNT.lstrip("/")).rename(staged)
        (root / recipe.ESP_MOUNT.lstrip("/")).mkdir()
        # The image's own mkfs.vfat and mcopy (dosfstools and mtools are in its packages).
        self._chroot(root, "mkfs.vfat", "-F", "32", "-n", "ESP", "-i", esp_serial, loop_esp)
        self._chroot(root, "sh", "-c", f"mcopy -s -p -Q -i {loop_esp} /tmp/gpuhost-esp/* ::/")
        listing = self._chroot(root, "mdir", "-/", "-b", "-i", loop_esp, "::/")
        with self.log.open("a") as log:
            log.write(listing)
        shutil.rmtree(staged)

    def _install_shim_grub(self, root: Path, kernel: str, root_uuid: str) -> None:
        self.progress("installing shim and signed GRUB at the removable path")
        # Later grub-install runs inside the host (package upgrades) keep the removable path too.
        self._chroot(
            root,
            "debconf-set-selections",
            stdin="grub-efi-amd64 grub2/force_efi_extra_removable boolean true\n"
            "grub-efi-amd64 grub2/update_nvram boolean false\n",
        )
        # What `grub-install --uefi-secure-boot --removable --no-nvram` puts on the ESP, copied
        # by hand: grub-install refuses an --efi-directory that is not a mounted FAT file system
        # (see _fill_esp). \\EFI\\BOOT\\BOOTX64.EFI is shim, which OVMF boots with no boot entry
        # in a fresh variable store; shim starts grubx64.efi beside it.
        esp = root / recipe.ESP_MOUNT.lstrip("/")
        boot_dir = esp / "EFI/BOOT"
        boot_dir.mkdir(parents=True, exist_ok=True)
        for source, target in recipe.EFI_REMOVABLE_FILES:
            shutil.copyfile(root / source.lstrip("/"), boot_dir / target)
        # The signed GRUB image looks for its configuration in \\EFI\\debian (its built-in
        # prefix), a removable install's in \\EFI\\BOOT: both point at /boot/grub/grub.cfg.
        stub = f"search.fs_uuid {root_uuid} root\nset prefix=($root)'/boot/grub'\nconfigfile $prefix/grub.cfg\n"
        for directory in ("EFI/debian", "EFI/BOOT"):
            (esp / directory).mkdir(parents=True, exist_ok=True)
            (esp / directory / "grub.cfg").write_text(stub)
        (root / "boot/grub/grub.cfg").write_text(self._grub_cfg(kernel, root_uuid))

    def _install_systemd_boot(self, root: Path, kernel: str) -> None:
        self.progress("installing systemd-boot and the kernel's loader entry")
        # What `bootctl install --no-variables --make-entry-directory=yes` lays out, by hand:
        # bootctl refuses an ESP that is not the root of a mounted file system (see _fill_esp).
        #
        # kernel-install (systemd 252) writes each entry's `linux`/`initrd` paths relative to the
        # mount point holding the ESP, found by `stat -c %m`, which walks up until the device
        # number changes. A bind mount of /boot/efi onto itself keeps the device number, so the
        # paths came out as /boot/efi/debian/<kver>/linux, systemd-boot dropped the entry as
        # having no kernel on the ESP, and OVMF fell back to its setup menu. A tmpfs at
        # /boot/efi is a file system of its own, as the vfat ESP is on the booted host.
        esp = root / recipe.ESP_MOUNT.lstrip("/")
        self._run([self.tools["mount"], "-t", "tmpfs", "-o", "mode=0700", "gpuhost-esp", str(esp)])
        try:
            for directory in ("EFI/systemd", "EFI/BOOT", "loader/entries", recipe.KERNEL_ENTRY_NAME.strip()):
                (esp / directory).mkdir(parents=True, exist_ok=True)
            loader = root / "usr/lib/systemd/boot/efi/systemd-bootx64.efi"
            shutil.copyfile(loader, esp / "EFI/systemd/systemd-bootx64.efi")
            shutil.copyfile(loader, esp / "EFI/BOOT/BOOTX64.EFI")
            (esp / "loader/loader.conf").write_text(recipe.LOADER_CONF)
            # Says the ESP holds Boot Loader Specification type 1 entries (bootctl install writes it).
            (esp / "loader/entries.srel").write_text("type1\n")
            # kernel-install finds the ESP by its entry directory (<ESP>/debian) and writes the
            # kernel, the initramfs and loader/entries/debian-<version>.conf from /etc/kernel/cmdline.
            self._chroot(root, "kernel-install", "add", kernel, f"/boot/vmlinuz-{kernel}", f"/boot/initrd.img-{kernel}")
            token = recipe.KERNEL_ENTRY_NAME.strip()
            entry_text = (esp / f"loader/entries/{token}-{kernel}.conf").read_text()
            missing = loader_entry_files_missing(parse_loader_entry(entry_text), esp)
            if missing:
                raise LabError(
                    f"kernel-install wrote a loader entry whose files are not on the ESP ({', '.join(missing)}):\n"
                    f"{entry_text}"
                )
            # Out of the tmpfs into the image's /boot/efi, where _fill_esp takes it from.
            staged = root / "tmp/gpuhost-esp-tmpfs"
            shutil.copytree(esp, staged)
        finally:
            self._umount(esp)
        esp.rmdir()
        staged.rename(esp)

    def _first_initramfs(self, root: Path, kernel: str) -> None:
        # The image's own configuration (MODULES=list with the disk's modules): the same
        # initramfs the host's update-initramfs builds, nothing detected on the build machine.
        self._chroot(root, "mkinitramfs", "-o", f"/boot/initrd.img-{kernel}", kernel)

    def _grub_cfg(self, kernel: str, root_uuid: str) -> str:
        # Written by hand: grub-mkconfig skips a root on a loop device. Once a host has booted
        # from /dev/vda1, update-grub inside it regenerates this file from /etc/default/grub
        # (on the UEFI disk with the same gfxpayload: see recipe.EFI_GRUB_GFXPAYLOAD).
        return (
            "serial --unit=0 --speed=115200\n"
            "terminal_input serial console\n"
            "terminal_output serial console\n"
            "set timeout=0\n"
            f"insmod {'part_msdos' if self.layout is DiskLayout.BIOS_GRUB else 'part_gpt'}\n"
            "insmod ext2\n"
            f"search --no-floppy --fs-uuid --set=root {root_uuid}\n"
            "menuentry 'Debian GNU/Linux (gpuhost lab)' {\n"
            + (f"  set gfxpayload={recipe.EFI_GRUB_GFXPAYLOAD}\n" if self.layout is DiskLayout.EFI_SHIM_GRUB else "")
            + f"  linux /boot/vmlinuz-{kernel} root=UUID={root_uuid} ro {self.recipe.kernel_cmdline}\n"
            f"  initrd /boot/initrd.img-{kernel}\n"
            "}\n"
        )

    def _nested_guest(self, root: Path, kernel: str) -> None:
        guest = root / recipe.NESTED_GUEST_DIR.lstrip("/")
        guest.mkdir(parents=True, exist_ok=True)
        # The uncompressed kernel: QEMU boots it through PVH, skipping the XZ decompressor that
        # costs minutes at two levels of TCG (see diskimage.uncompressed_kernel).
        bzimage = (root / f"boot/vmlinuz-{kernel}").read_bytes()
        (guest / "vmlinux").write_bytes(diskimage.uncompressed_kernel(bzimage))
        busybox = (root / "usr/bin/busybox").read_bytes()
        init = (guest / "init").read_text()
        (guest / "initrd.gz").write_bytes(diskimage.busybox_initramfs(busybox, init))


def loader_entry_files_missing(entry: LoaderEntry, esp: Path) -> tuple[str, ...]:
    """The entry's kernel and initramfs paths that systemd-boot would not find on this ESP.

    systemd-boot opens them relative to the ESP's root and skips an entry whose kernel is missing.
    """
    if entry.linux is None:
        return ("(no linux line)",)
    return tuple(path for path in (entry.linux, *entry.initrds) if not (esp / path.lstrip("/")).is_file())


def _give_to_sudo_user(directory: Path) -> None:
    """Under sudo, hand the image directory to the invoking user, whose later `lab up` reads it."""
    uid, gid = os.environ.get("SUDO_UID"), os.environ.get("SUDO_GID")
    if not (uid and gid and uid.isdigit() and gid.isdigit()):
        return
    for dirpath, dirnames, filenames in os.walk(directory):
        if Path(dirpath) == directory / "debs":
            dirnames.clear()
            continue
        for name in [*dirnames, *filenames]:
            with contextlib.suppress(OSError):
                os.chown(Path(dirpath) / name, int(uid), int(gid), follow_symlinks=False)
    with contextlib.suppress(OSError):
        os.chown(directory, int(uid), int(gid))
