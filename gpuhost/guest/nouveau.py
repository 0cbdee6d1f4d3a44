"""The nouveau step of `gpuhost guest up`: a guest image whose kernel bound nouveau (the in-tree
driver) to the passed-through GPU cannot load NVIDIA's driver until nouveau lets go of it
(`modprobe nvidia` fails with "No such device"). NVIDIA's installation guide has the cure: blacklist
nouveau, rebuild the initramfs (which may load it early), and reboot when it cannot be unloaded
(it usually cannot: the console's framebuffer holds it).

`release_nouveau` does the first part and says whether a reboot is needed; `reboot_guest` reboots
and waits for the same guest (its pinned host key) to answer from a new boot.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable

from gpuhost.guest.provision import Log, run_checked, wait_for_ssh
from gpuhost.transport import Transport, TransportError

# gpuhost's own file: NVIDIA's packages may ship a blacklist of their own, which this one repeats
# harmlessly; `modeset=0` keeps a nouveau loaded before the blacklist (by hand, or another module)
# from binding the display.
BLACKLIST_FILE = "/etc/modprobe.d/gpuhost-blacklist-nouveau.conf"
BLACKLIST = (
    "# Written by gpuhost guest up: the NVIDIA driver needs the GPU, nouveau must not take it.\n"
    "blacklist nouveau\n"
    "options nouveau modeset=0\n"
)
BOOT_ID = "/proc/sys/kernel/random/boot_id"
REBOOT_POLL_S = 3.0


class Nouveau(enum.Enum):
    """What the step found and did."""

    NOT_LOADED = "not loaded"
    UNLOADED = "was loaded, unused: blacklisted and unloaded"
    NEEDS_REBOOT = "in use: blacklisted, the guest reboots without it"


def release_nouveau(transport: Transport, *, log: Log, timeout: float) -> Nouveau:
    deadline = time.monotonic() + timeout

    def left() -> float:
        return max(1.0, deadline - time.monotonic())

    loaded = run_checked(transport, ["test", "-d", "/sys/module/nouveau"], log=log, timeout=left(), ok=(0, 1))
    if loaded.exit_status != 0:
        return Nouveau.NOT_LOADED
    write = ["dd", f"of={BLACKLIST_FILE}", "status=none"]
    run_checked(transport, write, stdin=BLACKLIST.encode(), log=log, timeout=left())
    # Where the initramfs loads nouveau, only a new one carries the blacklist (Debian's and Ubuntu's
    # initramfs-tools copy modprobe.d in). An image without update-initramfs (dracut) is left to its
    # own tools: the reboot below still runs, and the driver's load says whether it was enough.
    run_checked(
        transport,
        ["sh", "-c", "if command -v update-initramfs >/dev/null; then update-initramfs -u; fi"],
        log=log,
        timeout=left(),
    )
    unload = run_checked(transport, ["modprobe", "-r", "nouveau"], log=log, timeout=left(), ok=(0, 1))
    return Nouveau.UNLOADED if unload.exit_status == 0 else Nouveau.NEEDS_REBOOT


def reboot_guest(transport: Transport, connect: Callable[[], Transport], *, log: Log, timeout: float) -> Transport:
    """Reboot the guest and return a transport to it once it answers from a new boot (a guest
    still shutting down answers with the old boot_id and is waited for)."""
    deadline = time.monotonic() + timeout
    before = run_checked(transport, ["cat", BOOT_ID], log=log, timeout=60).stdout.strip()
    try:
        # systemd's reboot returns before the connection drops, or the drop ends the session first.
        transport.run(["systemctl", "reboot"], timeout=60)
    except TransportError:
        pass
    finally:
        transport.close()
    while True:
        guest = wait_for_ssh(connect, max(1.0, deadline - time.monotonic()))
        now = guest.run(["cat", BOOT_ID], timeout=60)
        log(["cat", BOOT_ID], now)
        if now.exit_status == 0 and now.stdout.strip() not in (b"", before):
            return guest
        guest.close()
        if time.monotonic() + REBOOT_POLL_S > deadline:
            raise TimeoutError(f"the guest did not come back from its reboot within {timeout:g} s")
        time.sleep(REBOOT_POLL_S)
