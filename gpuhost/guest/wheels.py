"""The wheels a guest installs without reaching PyPI: gpuhost's own (with kernels/ as data
files) built from this checkout, and nvidia-ml-py fetched once on the controller.

The guest runs `pip install --no-index` on exactly these files. Only pure-Python wheels
(`py3-none-any`) qualify: the guest's Python version and architecture are not the controller's.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from gpuhost import __version__
from gpuhost.errors import GpuhostError, InputError

GUEST_PROJECTS = ("gpuhost", "nvidia-ml-py")
PIP_TIMEOUT_S = 300.0
# name-version(-build)?-python-abi-platform.whl, names normalised with '_' (PEP 427)
_WHEEL = re.compile(
    r"^(?P<name>[A-Za-z0-9_.]+)-(?P<version>[A-Za-z0-9_.+!]+)(?:-(?P<build>[0-9][A-Za-z0-9_.]*))?"
    r"-(?P<python>[A-Za-z0-9_.]+)-(?P<abi>[A-Za-z0-9_.]+)-(?P<platform>[A-Za-z0-9_.]+)\.whl$"
)


@dataclass(frozen=True)
class Wheel:
    path: Path
    project: str  # normalised: lower case, '-' between words
    version: str
    pure: bool  # runs on any Python 3 and platform

    @property
    def filename(self) -> str:
        return self.path.name


def normalise(project: str) -> str:
    return re.sub(r"[-_.]+", "-", project).lower()


def parse_wheel_name(path: Path) -> Wheel | None:
    match = _WHEEL.fullmatch(path.name)
    if match is None:
        return None
    pythons = set(match["python"].split("."))
    pure = "py3" in pythons and match["abi"] == "none" and match["platform"] == "any"
    return Wheel(path, normalise(match["name"]), match["version"], pure)


def _version_key(version: str) -> tuple[tuple[int, str], ...]:
    """Release numbers compare as numbers; a pre-release suffix sorts before its release."""
    parts: list[tuple[int, str]] = []
    for piece in re.split(r"[.+!]", version):
        digits = re.match(r"^([0-9]+)(.*)$", piece)
        if digits:
            parts.append((int(digits[1]), digits[2] or "~"))
        else:
            parts.append((-1, piece))
    return tuple(parts)


def select_wheels(
    paths: Iterable[Path], projects: Iterable[str], *, pinned: dict[str, str] | None = None
) -> tuple[Wheel, ...]:
    """For each project, the newest pure wheel among `paths` (or the `pinned` version of it).

    Refuses, naming the file, a project that only has platform wheels there, and names a missing one.
    """
    wheels = [wheel for wheel in (parse_wheel_name(path) for path in paths) if wheel is not None]
    chosen: list[Wheel] = []
    for project in projects:
        wanted = normalise(project)
        candidates = [wheel for wheel in wheels if wheel.project == wanted]
        if pinned and wanted in pinned:
            candidates = [wheel for wheel in candidates if wheel.version == pinned[wanted]]
        pure = [wheel for wheel in candidates if wheel.pure]
        if not pure:
            if candidates:
                names = ", ".join(sorted(wheel.filename for wheel in candidates))
                raise InputError(
                    f"only platform-specific wheels of {wanted} found ({names}); the guest needs a pure "
                    "py3-none-any wheel, since its Python and architecture may differ from this machine's."
                )
            version = f" {pinned[wanted]}" if pinned and wanted in pinned else ""
            raise InputError(f"no wheel of {wanted}{version} found; the guest installs without PyPI, so it is needed.")
        chosen.append(max(pure, key=lambda wheel: _version_key(wheel.version)))
    return tuple(chosen)


def source_checkout() -> Path | None:
    """The checkout gpuhost runs from (pyproject.toml and kernels/ next to the package), if any."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").is_file() and (root / "kernels").is_dir() else None


def _pip(args: list[str], what: str) -> None:
    try:
        result = subprocess.run(
            [sys.executable, "-m", "pip", *args], capture_output=True, text=True, timeout=PIP_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired as error:
        raise GpuhostError(f"{what}: pip did not finish within {PIP_TIMEOUT_S:.0f} s") from error
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-10:])
        raise GpuhostError(f"{what} failed (pip exit {result.returncode}):\n{tail}")


def prepare_wheels(directory: Path, *, build: bool = True) -> tuple[Wheel, ...]:
    """The guest's wheels in `directory`, selected: with build=True gpuhost's wheel is built anew
    from this checkout (the version number does not change with every edit, so a cached one could
    be stale), and nvidia-ml-py is downloaded unless a pure wheel of it is already there."""
    directory.mkdir(parents=True, exist_ok=True)
    if build:
        checkout = source_checkout()
        if checkout is None:
            raise InputError(
                f"gpuhost runs from an installed package, not a checkout, so its wheel cannot be built here; "
                f"put gpuhost-{__version__}-py3-none-any.whl and an nvidia-ml-py wheel in a directory and "
                "pass it as --wheel-dir."
            )
        for old in directory.glob("gpuhost-*.whl"):
            old.unlink()
        # With pip's build isolation: the build backend pyproject.toml names comes from the index,
        # whatever setuptools (and wheel) this environment has.
        _pip(
            ["wheel", "--no-deps", "-q", "-w", str(directory), str(checkout)],
            "building gpuhost's wheel",
        )
        have = [parse_wheel_name(path) for path in directory.glob("*.whl")]
        if not any(w is not None and w.project == "nvidia-ml-py" and w.pure for w in have):
            _pip(
                ["download", "--no-deps", "--only-binary=:all:", "-q", "-d", str(directory), "nvidia-ml-py>=12"],
                "downloading nvidia-ml-py's wheel for the guest",
            )
    return select_wheels(directory.glob("*.whl"), GUEST_PROJECTS, pinned={"gpuhost": __version__})
