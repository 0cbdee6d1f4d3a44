"""Where the lab keeps its state, and where it caches images and keys.

The lab directory holds what belongs to running hosts (state file, overlays, serial logs,
inventory, known_hosts). The image directory holds what outlives them (base images, the lab's
SSH keys, the package cache); it defaults to `<lab dir>/images` and can live elsewhere so that
several lab directories (a user's and a test run's) share one built image.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

LAB_DIR_ENV = "GPUHOST_LAB_DIR"
IMAGE_DIR_ENV = "GPUHOST_LAB_IMAGE_DIR"


def default_lab_dir(environ: Mapping[str, str] | None = None) -> Path:
    """$GPUHOST_LAB_DIR, else $XDG_CACHE_HOME/gpuhost/lab, else ~/.cache/gpuhost/lab."""
    env = os.environ if environ is None else environ
    if env.get(LAB_DIR_ENV):
        return Path(env[LAB_DIR_ENV]).expanduser()
    cache = env.get("XDG_CACHE_HOME")
    base = Path(cache).expanduser() if cache else Path(env.get("HOME", str(Path.home()))) / ".cache"
    return base / "gpuhost" / "lab"


@dataclass(frozen=True)
class LabPaths:
    root: Path
    images: Path

    @classmethod
    def resolve(
        cls,
        lab_dir: Path | None = None,
        image_dir: Path | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> LabPaths:
        env = os.environ if environ is None else environ
        root = (lab_dir or default_lab_dir(env)).expanduser().absolute()
        if image_dir is None and env.get(IMAGE_DIR_ENV):
            image_dir = Path(env[IMAGE_DIR_ENV])
        images = (image_dir.expanduser() if image_dir else root / "images").absolute()
        return cls(root=root, images=images)

    @property
    def state_file(self) -> Path:
        return self.root / "state.json"

    @property
    def lock_file(self) -> Path:
        return self.root / "lock"

    @property
    def overlays(self) -> Path:
        return self.root / "overlays"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def inventory(self) -> Path:
        return self.root / "inventory.yml"

    @property
    def known_hosts(self) -> Path:
        return self.root / "known_hosts"

    # Keys are bound to images (the host key and the authorized key are baked into them),
    # so they live beside the images.
    @property
    def keys(self) -> Path:
        return self.images / "keys"

    @property
    def client_key(self) -> Path:
        return self.keys / "lab_ed25519"

    @property
    def host_key(self) -> Path:
        return self.keys / "ssh_host_ed25519_key"

    @property
    def package_cache(self) -> Path:
        return self.images / "debs"

    def image_dir(self, variant: str, recipe_hash: str) -> Path:
        return self.images / f"{variant}-{recipe_hash}"
