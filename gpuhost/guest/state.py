"""What the controller keeps per guest: its keys, the pinned host key, the provisioning log and the
reports, under `<state dir>/<host>/<vm>/` (default ~/.local/state/gpuhost/guests)."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuhost.inventory.spec import validate_name

STATE_ENV = "GPUHOST_GUEST_STATE_DIR"


def default_state_root() -> Path:
    configured = os.environ.get(STATE_ENV)
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_STATE_HOME") or str(Path("~/.local/state").expanduser())
    return Path(base) / "gpuhost" / "guests"


@dataclass(frozen=True)
class GuestDir:
    root: Path  # <state dir>/<host>/<vm>

    @classmethod
    def of(cls, state_root: Path, host: str, vm: str) -> GuestDir:
        return cls(state_root / validate_name(host, "host") / validate_name(vm, "VM"))

    @property
    def client_key(self) -> Path:
        return self.root / "client_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.root / "known_hosts"

    @property
    def ssh_wrapper(self) -> Path:
        return self.root / "ssh-wrapper"

    @property
    def provision_log(self) -> Path:
        return self.root / "provision.log"

    @property
    def info_file(self) -> Path:
        return self.root / "guest.json"

    def report_dir(self) -> Path:
        return self.root / "reports" / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())

    def make(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)

    def write_private(self, path: Path, text: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            handle.write(text)

    def read_info(self) -> dict[str, Any]:
        try:
            data = json.loads(self.info_file.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def update_info(self, **values: Any) -> None:
        info = self.read_info()
        info.update(values)
        self.make()
        self.info_file.write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
