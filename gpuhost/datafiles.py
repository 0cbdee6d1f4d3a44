"""Where the files gpuhost ships beside its package are: a checkout, or a wheel install's share/.

The playbooks, templates and CUDA kernels live at the repository root (playbooks/, templates/,
kernels/). A wheel installs them as data files under <prefix>/share/gpuhost/ (pyproject's
[tool.setuptools.data-files]), where <prefix> is the environment's data scheme path (the venv,
/usr/local, ~/.local with --user). One lookup for all of them, checkout first.
"""

from __future__ import annotations

import importlib.metadata
import os
import sysconfig
from collections.abc import Iterator, Mapping
from pathlib import Path, PurePosixPath

CHECKOUT_ROOT = Path(__file__).resolve().parents[1]
SHARE = PurePosixPath("share", "gpuhost")


def candidate_dirs(name: str, marker: str) -> Iterator[tuple[Path, str]]:
    """Directories that may hold `name` (e.g. "playbooks"), with where each comes from, best first."""
    yield CHECKOUT_ROOT / name, "checkout"
    # The files the installed distribution recorded: right even when the data scheme path of this
    # interpreter is not where pip put them (a --prefix or --target install).
    try:
        distribution: importlib.metadata.Distribution | None = importlib.metadata.distribution("gpuhost")
    except importlib.metadata.PackageNotFoundError:
        distribution = None
    suffix = (SHARE / name / marker).parts
    if distribution is not None:
        for entry in distribution.files or ():
            if entry.parts[-len(suffix) :] == suffix:
                located = Path(str(distribution.locate_file(entry))).resolve()
                yield located.parents[len(PurePosixPath(marker).parts) - 1], "installed"
    for scheme in (sysconfig.get_path("data"), sysconfig.get_path("data", f"{os.name}_user")):
        if scheme:
            yield Path(scheme).joinpath(*SHARE.parts, name), "installed"


def find_data_dir(
    name: str, marker: str, *, env_var: str | None = None, environ: Mapping[str, str] | None = None
) -> tuple[Path, str] | None:
    """The first directory `name` holding the file `marker` (a relative path), and its origin.

    `env_var`, when set in the environment, names the directory and wins (origin "environment");
    it is returned only if it holds `marker`. None when no candidate holds it: the caller says
    which error that is.
    """
    env = os.environ if environ is None else environ
    override = env.get(env_var) if env_var else None
    if override:
        directory = Path(override)
        return (directory, "environment") if (directory / marker).is_file() else None
    for directory, origin in candidate_dirs(name, marker):
        if (directory / marker).is_file():
            return directory, origin
    return None


def require_data_dir(name: str, marker: str, *, env_var: str | None = None) -> Path:
    """find_data_dir's directory, or an InputError that says where it was looked for and the fix."""
    from gpuhost.errors import InputError

    found = find_data_dir(name, marker, env_var=env_var)
    if found is None:
        fix = f"reinstall gpuhost, or set {env_var} to a {name}/ directory" if env_var else "reinstall gpuhost"
        raise InputError(
            f"{name}/{marker} is neither in a gpuhost checkout nor in the installed data files "
            f"(<prefix>/{SHARE}/{name}): {fix}."
        )
    return found[0]
