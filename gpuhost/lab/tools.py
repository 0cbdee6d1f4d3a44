"""Host programs the lab runs, and the Debian package that provides each."""

from __future__ import annotations

import shutil
from collections.abc import Iterable

from gpuhost.lab.errors import ToolMissingError

# program -> Debian package (bookworm)
PACKAGE_OF: dict[str, str] = {
    "qemu-system-x86_64": "qemu-system-x86",
    "qemu-img": "qemu-utils",
    "debootstrap": "debootstrap",
    "mkfs.ext4": "e2fsprogs",
    "losetup": "mount",
    "mount": "mount",
    "umount": "mount",
    "chroot": "coreutils",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
}

BUILD_TOOLS = ("debootstrap", "qemu-img", "mkfs.ext4", "losetup", "mount", "umount", "chroot", "ssh-keygen")
RUN_TOOLS = ("qemu-system-x86_64", "qemu-img", "ssh")


def require(programs: Iterable[str], purpose: str) -> dict[str, str]:
    """Absolute path of each program; raises naming the package of the first one missing."""
    found: dict[str, str] = {}
    for program in programs:
        path = shutil.which(program)
        if path is None:
            # /usr/sbin is not on a normal user's PATH on Debian, but its tools still exist.
            path = shutil.which(program, path="/usr/local/sbin:/usr/sbin:/sbin")
        if path is None:
            raise ToolMissingError(program, PACKAGE_OF.get(program, program), purpose)
        found[program] = path
    return found
