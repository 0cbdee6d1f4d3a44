"""libvirt's own schema check of a rendered domain: `virt-xml-validate FILE domain`.

virt-xml-validate (Debian: libvirt-clients, with xmllint from libxml2-utils) checks the XML
against the RNG schema of the libvirt installed on this machine (/usr/share/libvirt/schemas).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from gpuhost.errors import GpuhostError

VALIDATOR = "virt-xml-validate"
TIMEOUT_S = 60.0


class ValidatorMissingError(GpuhostError):
    """virt-xml-validate is not installed on this machine."""


class InvalidDomainError(GpuhostError):
    """The rendered XML does not pass libvirt's schema: a gpuhost bug, reported as such."""


@dataclass(frozen=True)
class Validation:
    ok: bool
    output: str  # what virt-xml-validate said


def validator_available() -> bool:
    return shutil.which(VALIDATOR) is not None


def validate_domain_xml(xml: str, *, check: bool = True) -> Validation:
    """Run virt-xml-validate on `xml`; with check=True raise InvalidDomainError when it fails."""
    tool = shutil.which(VALIDATOR)
    if tool is None:
        raise ValidatorMissingError(
            f"{VALIDATOR} is not installed; on Debian/Ubuntu: apt-get install libvirt-clients libxml2-utils"
        )
    with tempfile.TemporaryDirectory(prefix="gpuhost-render-") as scratch:
        path = Path(scratch) / "domain.xml"
        path.write_text(xml, encoding="utf-8")
        try:
            result = subprocess.run(
                [tool, str(path), "domain"], capture_output=True, text=True, timeout=TIMEOUT_S, check=False
            )
        except subprocess.TimeoutExpired as error:
            raise GpuhostError(f"{VALIDATOR} did not finish within {TIMEOUT_S:.0f} s") from error
    output = (result.stdout + result.stderr).replace(str(path), "domain.xml").strip()
    validation = Validation(ok=result.returncode == 0, output=output)
    if check and not validation.ok:
        raise InvalidDomainError(f"the rendered domain does not pass libvirt's schema ({VALIDATOR}):\n{output}")
    return validation
