"""A lab host's disk image: its name, its lab keys and finding a built one (gpuhost.lab.builder builds it)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpuhost.lab import recipe
from gpuhost.lab.boot import DiskLayout
from gpuhost.lab.paths import LabPaths
from gpuhost.lab.tools import require

Progress = Callable[[str], None]


@dataclass(frozen=True)
class LabKeys:
    client_private: Path
    client_public: str
    host_public: str


@dataclass(frozen=True)
class Image:
    variant: str
    recipe_hash: str
    disk: Path
    kernel: str
    host_public_key: str
    client_public_key: str
    build_seconds: float
    reused: bool


def ensure_keys(paths: LabPaths) -> LabKeys:
    """The lab's client key and host key, generated once per image directory."""
    paths.keys.mkdir(parents=True, exist_ok=True)
    for key, comment in ((paths.client_key, "gpuhost-lab"), (paths.host_key, "gpuhost-lab-host")):
        if not key.exists():
            tool = require(["ssh-keygen"], "generating the lab's SSH keys")["ssh-keygen"]
            subprocess.run(
                [tool, "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(key)],
                check=True,
                capture_output=True,
            )
    return LabKeys(
        client_private=paths.client_key,
        client_public=paths.client_key.with_suffix(".pub").read_text().strip(),
        host_public=paths.host_key.with_suffix(".pub").read_text().strip(),
    )


def _read_manifest(directory: Path) -> dict[str, object] | None:
    try:
        data = json.loads((directory / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def image_name(variant: str, layout: DiskLayout) -> str:
    """The name of an image's directory (before its hash): BIOS images keep their old names."""
    return variant if layout is DiskLayout.BIOS_GRUB else f"{variant}-{layout.value}"


def find_image(paths: LabPaths, variant: str, layout: DiskLayout = DiskLayout.BIOS_GRUB) -> Image | None:
    """The cached image for the current recipe of `variant`, if built with the current keys."""
    wanted = recipe.recipe_hash(recipe.recipe_for(variant, layout))
    directory = paths.image_dir(image_name(variant, layout), wanted)
    manifest = _read_manifest(directory)
    disk = directory / "disk.qcow2"
    if manifest is None or not disk.exists() or manifest.get("recipe_hash") != wanted:
        return None
    try:
        client = paths.client_key.with_suffix(".pub").read_text().strip()
        host = paths.host_key.with_suffix(".pub").read_text().strip()
    except OSError:
        return None
    if manifest.get("client_public_key") != client or manifest.get("host_public_key") != host:
        return None
    return Image(
        variant=variant,
        recipe_hash=wanted,
        disk=disk,
        kernel=str(manifest.get("kernel", "")),
        host_public_key=host,
        client_public_key=client,
        build_seconds=float(str(manifest.get("build_seconds", 0.0))),
        reused=True,
    )
