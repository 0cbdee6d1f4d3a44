"""Find the CUDA kernel sources and nvcc, and build the suite binary once per cache key.

The binary is cached under a directory named by a hash of the sources, the target
architecture, the nvcc version, the flags and the cuBLAS location, so a changed source,
toolkit or GPU rebuilds and an unchanged one costs nothing.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from gpuhost.datafiles import candidate_dirs
from gpuhost.errors import GpuhostError

BINARY_NAME = "gpuhost-kernels"
# The translation units of the suite; kernels/ holds them with common.cuh.
SOURCE_NAMES = ("main.cu", "common.cu", "memory.cu", "gemm.cu", "softmax.cu", "transfer.cu", "node.cu")
HEADER_NAMES = ("common.cuh",)
KERNELS_ENV = "GPUHOST_KERNELS_DIR"
CACHE_ENV = "GPUHOST_CACHE_DIR"
# -O3 for the host side too: the host checks walk hundreds of MiB.
BASE_FLAGS = ("-std=c++17", "-O3", "-lineinfo")


class KernelBuildError(GpuhostError):
    """The suite cannot be built: sources, nvcc or a compile step is missing or failed."""


@dataclass(frozen=True)
class KernelSources:
    directory: Path
    origin: str  # where they were found: "environment", "checkout" or "installed"

    @property
    def files(self) -> tuple[Path, ...]:
        return tuple(self.directory / name for name in (*SOURCE_NAMES, *HEADER_NAMES))


@dataclass(frozen=True)
class Cublas:
    include_dir: Path
    library_dir: Path
    libraries: tuple[Path, ...]  # libcublasLt.so[.N]: the suite calls cuBLASLt only


@dataclass(frozen=True)
class Toolchain:
    nvcc: Path
    version: str  # the "release X.Y, VX.Y.Z" line of nvcc --version
    cublas: Cublas | None


@dataclass(frozen=True)
class BuiltSuite:
    binary: Path
    cache_key: str
    arch: str
    cached: bool
    seconds: float
    with_cublas: bool


def _complete(directory: Path) -> bool:
    return all((directory / name).is_file() for name in (*SOURCE_NAMES, *HEADER_NAMES))


def find_kernel_sources(environ: dict[str, str] | None = None) -> KernelSources:
    env = os.environ if environ is None else environ
    override = env.get(KERNELS_ENV)
    if override:
        directory = Path(override)
        if not _complete(directory):
            raise KernelBuildError(f"{KERNELS_ENV}={override} does not hold the kernel sources {SOURCE_NAMES}")
        return KernelSources(directory, "environment")
    for directory, origin in candidate_dirs("kernels", "main.cu"):
        if _complete(directory):
            return KernelSources(directory, origin)
    raise KernelBuildError(
        "the CUDA kernel sources (kernels/*.cu) were not found next to the package nor in the installed "
        f"data files; reinstall gpuhost, or point {KERNELS_ENV} at a kernels/ directory"
    )


DEFAULT_NVCC = (Path("/usr/local/cuda/bin/nvcc"),)


def find_nvcc(environ: dict[str, str] | None = None, fallbacks: tuple[Path, ...] = DEFAULT_NVCC) -> Path:
    env = os.environ if environ is None else environ
    candidates: list[Path] = []
    for variable in ("CUDA_HOME", "CUDA_PATH"):
        if env.get(variable):
            candidates.append(Path(env[variable]) / "bin" / "nvcc")
    on_path = shutil.which("nvcc", path=env.get("PATH"))
    if on_path:
        candidates.append(Path(on_path))
    candidates.extend(fallbacks)
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise KernelBuildError(
        "nvcc (the CUDA compiler) was not found in $CUDA_HOME/bin, on PATH or in /usr/local/cuda/bin: "
        "install the CUDA toolkit matching the driver (its nvcc builds the kernels for this GPU)"
    )


def parse_nvcc_version(text: str) -> str:
    for line in text.splitlines():
        if "release" in line:
            return line.strip()
    raise KernelBuildError(f"could not read the nvcc version from: {text.strip()[:200]!r}")


def toolkit_root(nvcc: Path) -> Path:
    # /usr/local/bin/nvcc may be a wrapper script: prefer the real toolkit if it is there.
    resolved = nvcc.resolve()
    root = resolved.parent.parent
    if (root / "include" / "cuda_runtime.h").is_file():
        return root
    return Path("/usr/local/cuda")


def _wheel_roots(flavours: Sequence[str]) -> Iterable[Path]:
    """The NVIDIA wheels' roots in this Python (nvidia/cu13, nvidia/nccl, ...: pip's nvidia-* packages,
    PyTorch's among them), in the order of `flavours`."""
    spec = importlib.util.find_spec("nvidia")
    if spec is None or spec.submodule_search_locations is None:
        return
    for base in spec.submodule_search_locations:
        for flavour in flavours:
            yield Path(base) / flavour


def _shortest(directory: Path, pattern: str) -> Path | None:
    """The library in `directory` with the shortest name that matches: libX.so where there is one,
    else libX.so.13."""
    found = sorted(directory.glob(pattern), key=lambda p: len(p.name)) if directory.is_dir() else []
    return found[0] if found else None


def _toolkit_dirs(nvcc: Path) -> list[tuple[Path, Path]]:
    """The toolkit's (include, lib) directory pairs, x86-64 and Arm server layouts."""
    root = toolkit_root(nvcc)
    return [
        (root / "include", root / "lib64"),
        (root / "targets" / "x86_64-linux" / "include", root / "targets" / "x86_64-linux" / "lib"),
        (root / "targets" / "sbsa-linux" / "include", root / "targets" / "sbsa-linux" / "lib"),
    ]


def find_cublas(nvcc: Path) -> Cublas | None:
    """cuBLASLt's headers and library: the toolkit, the system's, then the pip wheels."""
    pairs: list[tuple[Path, Path]] = [
        *_toolkit_dirs(nvcc),
        (Path("/usr/include"), Path("/usr/lib/x86_64-linux-gnu")),
        *((root / "include", root / "lib") for root in _wheel_roots(("cu13", "cu12", "cublas"))),
    ]
    for include_dir, library_dir in pairs:
        if not (include_dir / "cublasLt.h").is_file():
            continue
        found = _shortest(library_dir, "libcublasLt.so*")
        if found is not None:
            return Cublas(include_dir, library_dir, (found,))
    return None


def find_nccl(nvcc: Path | None, environ: dict[str, str] | None = None) -> Path | None:
    """The guest's libnccl.so, looked for as cuBLAS is: $GPUHOST_NCCL, the toolkit, the system's
    library directories, then the pip wheels. None when there is none."""
    env = os.environ if environ is None else environ
    if env.get("GPUHOST_NCCL"):
        named = Path(env["GPUHOST_NCCL"])
        return named if named.is_file() else None
    directories = [library for _, library in _toolkit_dirs(nvcc)] if nvcc is not None else []
    directories += [Path("/usr/lib/x86_64-linux-gnu"), Path("/usr/lib64"), Path("/usr/local/lib")]
    directories += [root / "lib" for root in _wheel_roots(("nccl", "cu13", "cu12"))]
    for directory in directories:
        found = _shortest(directory, "libnccl.so*")
        if found is not None:
            return found
    return None


def detect_toolchain(environ: dict[str, str] | None = None) -> Toolchain:
    nvcc = find_nvcc(environ)
    completed = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, timeout=60, check=False)
    if completed.returncode != 0:
        raise KernelBuildError(f"{nvcc} --version failed: {completed.stderr.strip()[:300]}")
    return Toolchain(nvcc, parse_nvcc_version(completed.stdout), find_cublas(nvcc))


def arch_name(compute_capability: tuple[int, int]) -> str:
    major, minor = compute_capability
    return f"sm_{major}{minor}"


def arch_flags(compute_capability: tuple[int, int]) -> list[str]:
    """Machine code for this GPU, plus its PTX so a newer driver can still JIT it."""
    major, minor = compute_capability
    number = f"{major}{minor}"
    return [f"-gencode=arch=compute_{number},code=[sm_{number},compute_{number}]"]


def cache_key(sources: KernelSources, compute_capability: tuple[int, int], toolchain: Toolchain) -> str:
    digest = hashlib.sha256()
    for path in sources.files:
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    digest.update(arch_name(compute_capability).encode())
    digest.update(toolchain.version.encode())
    digest.update(" ".join(BASE_FLAGS).encode())
    digest.update(str(toolchain.cublas).encode())
    return digest.hexdigest()[:20]


def default_cache_dir(environ: dict[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    if env.get(CACHE_ENV):
        return Path(env[CACHE_ENV])
    base = Path(env["XDG_CACHE_HOME"]) if env.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return base / "gpuhost" / "kernels"


def compile_commands(
    sources: KernelSources,
    compute_capability: tuple[int, int],
    toolchain: Toolchain,
    work_dir: Path,
    output: Path,
) -> tuple[list[list[str]], list[str]]:
    """The per-file compile commands (run in parallel) and the link command."""
    flags = [*BASE_FLAGS, *arch_flags(compute_capability)]
    if toolchain.cublas is None:
        flags.append("-DGPUHOST_NO_CUBLAS")
    else:
        flags.append(f"-I{toolchain.cublas.include_dir}")
    compiles = [
        [str(toolchain.nvcc), *flags, "-c", str(sources.directory / name), "-o", str(work_dir / f"{name}.o")]
        for name in SOURCE_NAMES
    ]
    link = [
        str(toolchain.nvcc),
        *arch_flags(compute_capability),
        *(str(work_dir / f"{name}.o") for name in SOURCE_NAMES),
        "-o",
        str(output),
        # node.cu loads NCCL with dlopen (in libc from glibc 2.34, in libdl before).
        "-ldl",
    ]
    if toolchain.cublas is not None:
        # Full library paths (the pip wheel has no unversioned .so) and an rpath so the
        # binary finds them at run time without LD_LIBRARY_PATH.
        link += [f"-Xlinker={library}" for library in toolchain.cublas.libraries]
        link.append(f"-Xlinker=-rpath,{toolchain.cublas.library_dir}")
    return compiles, link


# One nvcc step's limit: the GEMM unit, the slowest, takes about 40 s on two cores.
STEP_TIMEOUT_S = 600


def _start(command: Sequence[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(list(command), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(command: Sequence[str], process: subprocess.Popen[str]) -> None:
    try:
        stdout, stderr = process.communicate(timeout=STEP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise KernelBuildError(f"nvcc took more than {STEP_TIMEOUT_S} s ({' '.join(command[-3:])})") from None
    if process.returncode != 0:
        tail = (stderr or stdout).strip()[-2000:]
        raise KernelBuildError(f"nvcc failed ({' '.join(command[-3:])}):\n{tail}")


def _compile_all(commands: Sequence[Sequence[str]]) -> None:
    """One nvcc per translation unit, all at once. The first that fails stops the others: a broken
    unit is reported as soon as nvcc finds it, not once the slowest (the GEMM unit) is built."""
    processes: list[subprocess.Popen[str]] = []
    try:
        processes.extend(_start(command) for command in commands)
        with ThreadPoolExecutor(max_workers=len(processes)) as pool:
            futures = [
                pool.submit(_finish, command, process) for command, process in zip(commands, processes, strict=True)
            ]
            for future in as_completed(futures):
                if future.exception() is not None:
                    for process in processes:
                        process.kill()  # their objects no longer matter: the build has failed
                    future.result()
    finally:
        for process in processes:  # also on Ctrl-C: no nvcc outlives the build
            if process.poll() is None:
                process.kill()
            process.wait()


def build_suite(
    compute_capability: tuple[int, int],
    *,
    cache_dir: Path | None = None,
    sources: KernelSources | None = None,
    toolchain: Toolchain | None = None,
    force: bool = False,
) -> BuiltSuite:
    sources = sources or find_kernel_sources()
    toolchain = toolchain or detect_toolchain()
    key = cache_key(sources, compute_capability, toolchain)
    target_dir = (cache_dir or default_cache_dir()) / f"{arch_name(compute_capability)}-{key}"
    binary = target_dir / BINARY_NAME
    if binary.is_file() and not force:
        return BuiltSuite(binary, key, arch_name(compute_capability), True, 0.0, toolchain.cublas is not None)
    target_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="build-", dir=target_dir) as work:
        work_dir = Path(work)
        staged = work_dir / BINARY_NAME
        compiles, link = compile_commands(sources, compute_capability, toolchain, work_dir, staged)
        _compile_all(compiles)
        _finish(link, _start(link))
        # Rename into place so a concurrent or interrupted build never leaves half a binary.
        staged.replace(binary)
    return BuiltSuite(
        binary, key, arch_name(compute_capability), False, time.monotonic() - started, toolchain.cublas is not None
    )
