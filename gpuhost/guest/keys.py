"""SSH key pairs gpuhost makes for a guest: its host key (pinned on the controller before the
guest boots) and the client key gpuhost provisions with. Generated in-process (cryptography,
which paramiko already needs), never by a shell."""

from __future__ import annotations

from dataclasses import dataclass

from gpuhost.errors import MissingDependencyError


@dataclass(frozen=True)
class KeyPair:
    private_openssh: str  # '-----BEGIN OPENSSH PRIVATE KEY-----...'
    public_openssh: str  # 'ssh-ed25519 AAAA... comment'

    @property
    def public_blob(self) -> str:
        """'ssh-ed25519 AAAA...' without the comment, as known_hosts holds it."""
        return " ".join(self.public_openssh.split()[:2])


def generate_ed25519(comment: str) -> KeyPair:
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    except ImportError as error:
        raise MissingDependencyError("cryptography", "controller", "Making a guest's SSH keys") from error
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    ).decode()
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    return KeyPair(private_openssh=private, public_openssh=f"{public} {comment}")
