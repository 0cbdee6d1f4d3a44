"""The cloud-init NoCloud seed of a guest: user-data and meta-data, as an ISO 9660 image.

The ISO is written in memory by pycdlib (pure Python): the controller needs no genisoimage or
xorriso, and the bytes go to the host as a libvirt storage volume upload, not as a file copied
over SSH. Volume label `cidata`, Rock Ridge and Joliet names `user-data` and `meta-data`, which
is what cloud-init's NoCloud datasource looks for.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass

from gpuhost.errors import InputError, MissingDependencyError
from gpuhost.guest.keys import KeyPair
from gpuhost.inventory.spec import SSH_KEY, validate_name

SEED_LABEL = "cidata"
GUEST_USER = "gpuhost"
# Debian/Ubuntu package names: lower case letters, digits, '+', '-', '.'.
_PACKAGE_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789+-.")


@dataclass(frozen=True)
class SeedConfig:
    hostname: str
    instance_id: str
    authorized_keys: tuple[str, ...]  # OpenSSH public key lines for GUEST_USER
    host_key: KeyPair  # the guest's ed25519 host key, pinned on the controller
    packages: tuple[str, ...] = ()  # installed by cloud-init (which then runs apt-get update)


def validate_packages(values: Sequence[object], where: str) -> tuple[str, ...]:
    packages: list[str] = []
    for value in values:
        text = str(value)
        if not text or not set(text) <= _PACKAGE_CHARS or not text[0].isalnum() or len(text) > 100:
            raise InputError(f"{where}: {value!r} is not a Debian package name (lower case, digits, '+', '-', '.').")
        packages.append(text)
    return tuple(packages)


def user_data(config: SeedConfig) -> str:
    """The #cloud-config document: one passwordless-sudo user reachable by key only, the pinned
    host key instead of generated ones, and the packages."""
    import yaml

    validate_name(config.hostname, "seed hostname")
    for key in (*config.authorized_keys, config.host_key.public_openssh):
        if not SSH_KEY.fullmatch(key) or "\n" in key:
            raise InputError(f"seed of {config.hostname}: {key[:40]!r}... is not an OpenSSH public key line.")
    # str(): inventory values are Ansible's str subclasses, which yaml.safe_dump refuses.
    document: dict[str, object] = {
        "hostname": str(config.hostname),
        "users": [
            {
                "name": GUEST_USER,
                "gecos": "gpuhost provisioning",
                "shell": "/bin/bash",
                "sudo": "ALL=(ALL) NOPASSWD:ALL",
                "lock_passwd": True,
                "ssh_authorized_keys": [str(key) for key in config.authorized_keys],
            }
        ],
        "manage_etc_hosts": True,  # sudo resolves the host name
        "disable_root": True,
        "ssh_pwauth": False,
        # Replace whatever host keys the image carries with the one the controller pinned.
        "ssh_deletekeys": True,
        # Generate only the type given below, which is then present: so nothing is generated.
        "ssh_genkeytypes": ["ed25519"],
        "ssh_keys": {
            "ed25519_private": config.host_key.private_openssh,
            "ed25519_public": config.host_key.public_openssh,
        },
    }
    if config.packages:
        document["packages"] = [str(package) for package in config.packages]
    return "#cloud-config\n" + yaml.safe_dump(document, sort_keys=False, default_flow_style=False)


def meta_data(config: SeedConfig) -> str:
    return f"instance-id: {config.instance_id}\nlocal-hostname: {config.hostname}\n"


def build_seed_iso(config: SeedConfig) -> bytes:
    """The seed as ISO 9660 bytes (Rock Ridge + Joliet), label `cidata`."""
    try:
        import pycdlib
    except ImportError as error:
        raise MissingDependencyError("pycdlib", "libvirt", "Building a guest's cloud-init seed") from error
    iso = pycdlib.PyCdlib()
    iso.new(interchange_level=3, joliet=3, rock_ridge="1.09", vol_ident=SEED_LABEL)
    for iso_name, name, text in (
        ("/USERDATA.;1", "user-data", user_data(config)),
        ("/METADATA.;1", "meta-data", meta_data(config)),
    ):
        data = text.encode()
        iso.add_fp(io.BytesIO(data), len(data), iso_name, rr_name=name, joliet_path=f"/{name}")
    out = io.BytesIO()
    iso.write_fp(out)
    iso.close()
    return out.getvalue()


def read_seed_iso(data: bytes) -> dict[str, str]:
    """The files of a seed ISO by their Rock Ridge names (what the guest's kernel shows)."""
    import pycdlib

    iso = pycdlib.PyCdlib()
    iso.open_fp(io.BytesIO(data))
    files: dict[str, str] = {}
    try:
        for child in iso.list_children(rr_path="/"):
            if child.is_dir():
                continue
            name = child.rock_ridge.name().decode()
            out = io.BytesIO()
            iso.get_file_from_iso_fp(out, rr_path=f"/{name}")
            files[name] = out.getvalue().decode()
        files[":label"] = iso.pvd.volume_identifier.decode().strip()
    finally:
        iso.close()
    return files
