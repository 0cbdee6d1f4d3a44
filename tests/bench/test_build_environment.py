"""Building the suite (nvcc, no GPU needed) and reading NVML (through a stand-in module)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpuhost.bench.build import (
    BINARY_NAME,
    KERNELS_ENV,
    KernelBuildError,
    Toolchain,
    arch_flags,
    build_suite,
    cache_key,
    compile_commands,
    detect_toolchain,
    find_kernel_sources,
    find_nvcc,
    parse_nvcc_version,
)
from gpuhost.bench.environment import GpuUnavailable, NvmlSampler, open_nvml, read_environment

REPO = Path(__file__).resolve().parents[2]


def test_sources_are_found_in_the_checkout_and_through_the_environment(tmp_path: Path) -> None:
    sources = find_kernel_sources({})
    assert sources.origin == "checkout" and sources.directory == REPO / "kernels"
    assert all(path.is_file() for path in sources.files)
    copy = tmp_path / "kernels"
    shutil.copytree(REPO / "kernels", copy)
    assert find_kernel_sources({KERNELS_ENV: str(copy)}).directory == copy
    (copy / "gemm.cu").unlink()
    with pytest.raises(KernelBuildError, match="does not hold the kernel sources"):
        find_kernel_sources({KERNELS_ENV: str(copy)})


def test_cache_key_follows_sources_arch_and_compiler(tmp_path: Path) -> None:
    copy = tmp_path / "kernels"
    shutil.copytree(REPO / "kernels", copy)
    sources = find_kernel_sources({KERNELS_ENV: str(copy)})
    toolchain = Toolchain(Path("/usr/local/cuda/bin/nvcc"), "Cuda compilation tools, release 13.0, V13.0.88", None)
    key = cache_key(sources, (9, 0), toolchain)
    assert key == cache_key(sources, (9, 0), toolchain)
    assert key != cache_key(sources, (8, 0), toolchain)
    newer = Toolchain(toolchain.nvcc, "Cuda compilation tools, release 13.1, V13.1.1", None)
    assert key != cache_key(sources, (9, 0), newer)
    (copy / "memory.cu").write_text((copy / "memory.cu").read_text() + "\n// changed\n")
    assert key != cache_key(sources, (9, 0), toolchain)


def test_compile_commands_target_the_gpu_and_link_cublas_when_found(tmp_path: Path) -> None:
    sources = find_kernel_sources({})
    without = Toolchain(Path("/cuda/bin/nvcc"), "release 13.0", None)
    compiles, link = compile_commands(sources, (9, 0), without, tmp_path, tmp_path / BINARY_NAME)
    assert len(compiles) == 7  # node.cu since issue 30
    assert all("-gencode=arch=compute_90,code=[sm_90,compute_90]" in c for c in compiles)
    assert all("-DGPUHOST_NO_CUBLAS" in c for c in compiles)
    assert not any("cublas" in part.lower() for part in link)
    assert "-ldl" in link  # node.cu loads NCCL with dlopen
    assert arch_flags((8, 6)) == ["-gencode=arch=compute_86,code=[sm_86,compute_86]"]


def test_nvcc_lookup_and_version_parsing(tmp_path: Path) -> None:
    with pytest.raises(KernelBuildError, match=r"nvcc .* was not found"):
        find_nvcc({"PATH": str(tmp_path)}, fallbacks=())
    fake = tmp_path / "cuda" / "bin" / "nvcc"
    fake.parent.mkdir(parents=True)
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    assert find_nvcc({"CUDA_HOME": str(tmp_path / "cuda"), "PATH": ""}, fallbacks=()) == fake
    text = "nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 13.0, V13.0.88\n"
    assert parse_nvcc_version(text) == "Cuda compilation tools, release 13.0, V13.0.88"
    with pytest.raises(KernelBuildError):
        parse_nvcc_version("garbage")


@pytest.mark.nvcc
def test_nvcc_builds_the_suite_once_and_caches_it(tmp_path: Path) -> None:
    toolchain = detect_toolchain()
    built = build_suite((9, 0), cache_dir=tmp_path, toolchain=toolchain)
    assert not built.cached and built.binary.is_file() and built.arch == "sm_90"
    # cuBLASLt must be linked in: CI installs it (toolkit or `pip install nvidia-cublas`).
    assert built.with_cublas, "cuBLAS headers/libraries not found: install nvidia-cublas"
    listing = subprocess.run([str(built.binary), "--list"], capture_output=True, text=True, check=True)
    entries = json.loads(listing.stdout)
    names = {entry["name"] for entry in entries}
    assert names == {
        "memory",
        "roofline",
        "reduction",
        "sgemm",
        "cublas",
        "softmax",
        "transfer",
        "launch",
        "p2p",
        "p2p_matrix",
        "host_all",
        "nccl",
    }
    # The node measurements run only when named (smoke-test --all), never in a one-GPU run.
    assert {entry["name"] for entry in entries if entry["node"]} == {"p2p_matrix", "host_all", "nccl"}
    bad = subprocess.run([str(built.binary), "--bench", "nope"], capture_output=True, text=True, check=False)
    assert bad.returncode == 2 and "unknown benchmark 'nope'" in bad.stderr
    alone = subprocess.run([str(built.binary), "--then", "transfer"], capture_output=True, text=True, check=False)
    assert alone.returncode == 2 and "--then needs --bench" in alone.stderr
    unknown = subprocess.run(
        [str(built.binary), "--bench", "memory", "--then", "nope"], capture_output=True, text=True, check=False
    )
    assert unknown.returncode == 2 and "unknown benchmark 'nope'" in unknown.stderr
    again = build_suite((9, 0), cache_dir=tmp_path, toolchain=toolchain)
    assert again.cached and again.binary == built.binary


@pytest.mark.nvcc
def test_nvcc_reports_a_compile_error(tmp_path: Path) -> None:
    copy = tmp_path / "kernels"
    shutil.copytree(REPO / "kernels", copy)
    (copy / "softmax.cu").write_text("this is not CUDA\n")
    # The broken unit is named; the other units' nvcc are stopped, not waited for (the GEMM unit alone
    # takes about 40 s here).
    with pytest.raises(KernelBuildError, match=r"nvcc failed \(\S*/softmax\.cu -o "):
        build_suite((9, 0), cache_dir=tmp_path / "cache", sources=find_kernel_sources({KERNELS_ENV: str(copy)}))
    assert not list((tmp_path / "cache").glob("*/build-*")), "the failed build left its work directory"


# ---------------------------------------------------------------- NVML through a stand-in


class FakeNvmlError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


def fake_nvml(init_error: int | None = None, count: int = 1, link_gen: int = 5) -> Any:
    """Answers like pynvml with the figures read on the H100 guest (guest-report.txt)."""
    handle = object()

    def init() -> None:
        if init_error is not None:
            raise FakeNvmlError(init_error)

    def unsupported(*_: Any) -> Any:
        raise FakeNvmlError(3)

    return SimpleNamespace(
        NVMLError=FakeNvmlError,
        NVML_ERROR_LIBRARY_NOT_FOUND=12,
        NVML_ERROR_DRIVER_NOT_LOADED=9,
        NVML_ERROR_NO_PERMISSION=4,
        NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR=1,
        NVML_CLOCK_SM=1,
        NVML_CLOCK_MEM=2,
        NVML_TEMPERATURE_GPU=0,
        nvmlInit=init,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: count,
        nvmlSystemGetDriverVersion=lambda: "580.159.04",
        nvmlSystemGetCudaDriverVersion=lambda: 13000,
        nvmlSystemGetNVMLVersion=lambda: b"13.580.159.04",
        nvmlDeviceGetHandleByIndex=lambda index: handle,
        nvmlDeviceGetPciInfo=lambda h: SimpleNamespace(busId=b"00000000:00:06.0", pciDeviceId=0x233010DE),
        nvmlDeviceGetEccMode=lambda h: (1, 1),
        nvmlDeviceGetRemappedRows=lambda h: (0, 0, 0, 0),
        nvmlDeviceGetRetiredPagesPendingStatus=unsupported,
        nvmlDeviceGetRetiredPages=unsupported,
        nvmlDeviceGetBAR1MemoryInfo=lambda h: SimpleNamespace(bar1Total=137438953472),
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(total=85520809984),
        nvmlDeviceGetPersistenceMode=lambda h: 1,
        nvmlDeviceGetEnforcedPowerLimit=lambda h: 700000,
        nvmlDeviceGetCudaComputeCapability=lambda h: (9, 0),
        nvmlDeviceGetName=lambda h: "NVIDIA H100 80GB HBM3",
        # tests/fixtures/h100x2/nvidia-smi-q.txt: GPU 00000000:00:06.0's UUID
        nvmlDeviceGetUUID=lambda h: "GPU-5930f09b-3326-f105-f670-1da97dfe39ee",
        nvmlDeviceGetCurrPcieLinkGeneration=lambda h: link_gen,
        nvmlDeviceGetCurrPcieLinkWidth=lambda h: 16,
        nvmlDeviceGetMaxPcieLinkGeneration=lambda h: 5,
        nvmlDeviceGetMaxPcieLinkWidth=lambda h: 16,
        nvmlDeviceGetGpuMaxPcieLinkGeneration=lambda h: 5,
        nvmlDeviceGetVirtualizationMode=lambda h: 1,
        nvmlDeviceGetMaxClockInfo=lambda h, clock: 1980 if clock == 1 else 2619,
        nvmlDeviceGetClockInfo=lambda h, clock: 1980,
        nvmlDeviceGetCurrentClocksEventReasons=lambda h: 0x1 | 0x4,
        nvmlDeviceGetTemperature=lambda h, sensor: 43,
        nvmlDeviceGetPowerUsage=lambda h: 650000,
        nvmlDeviceGetComputeRunningProcesses=lambda h: [],
        nvmlDeviceGetGraphicsRunningProcesses=lambda h: [],
    )


@pytest.mark.parametrize(
    ("error", "count", "message"),
    [
        (12, 1, "no NVIDIA driver in this machine: NVML (libnvidia-ml.so.1) was not found"),
        (9, 1, "the NVIDIA kernel driver is not loaded"),
        (4, 1, "no permission"),
        (None, 0, "the NVIDIA driver is loaded but sees no GPU"),
    ],
)
def test_open_nvml_names_why_no_gpu_can_be_measured(error: int | None, count: int, message: str) -> None:
    with pytest.raises(GpuUnavailable, match=re.escape(message)) as caught:
        open_nvml(fake_nvml(init_error=error, count=count))
    assert caught.value.exit_code == 2
    if error in (12, 9) or count == 0:
        assert "vfio-pci" in str(caught.value) and "domain XML" in str(caught.value)


def test_read_environment_parses_the_h100_guest_readings() -> None:
    nvml = fake_nvml()
    environment = read_environment(nvml, open_nvml(nvml))
    assert environment.driver_version == "580.159.04" and environment.cuda_driver_version == 13000
    gpu = environment.gpus[0]
    assert gpu.pci_device_id == 0x2330 and gpu.pci_bus_id == "00000000:00:06.0"
    assert gpu.compute_capability == (9, 0)
    assert (gpu.link.current_gen, gpu.link.current_width, gpu.link.max_gen, gpu.link.gpu_max_gen) == (5, 16, 5, 5)
    assert gpu.virtualization_mode == 1 and gpu.ecc_current is True and gpu.bar1_bytes == 128 << 30
    # Unsupported readings (retired pages on an H100) are absent, not errors.
    assert gpu.retired_pages_pending is None and gpu.retired_pages_double_bit is None
    assert gpu.remapped_rows_failure is False and gpu.power_limit_w == 700.0


def test_sampler_keeps_the_best_link_and_the_union_of_reasons_without_idle() -> None:
    nvml = fake_nvml(link_gen=1)
    sampler = NvmlSampler(nvml, (0,), interval_s=0.01)
    with sampler:
        nvml.nvmlDeviceGetCurrPcieLinkGeneration = lambda h: 5  # the link trains up under load
        import time

        time.sleep(0.1)
    (samples,) = sampler.results()
    assert samples.count >= 2 and samples.max_link_gen == 5
    assert samples.throttle_reasons == 0x4 and samples.throttle_names == ("sw_power_cap",)
    assert samples.max_power_w == 650.0 and samples.min_sm_clock_mhz == 1980
    assert sampler.processes() == ((), True)  # nothing else on the GPU, and NVML could say so


def test_cublas_and_nccl_are_found_in_the_toolkit_the_shortest_name_first(tmp_path: Path) -> None:
    """One search for the toolkit's libraries (bench/build.py): cuBLASLt with its header, NCCL
    beside it; libX.so before libX.so.13; $GPUHOST_NCCL names one, or none where it is not a file."""
    from gpuhost.bench.build import find_cublas, find_nccl

    root = tmp_path / "cuda"
    for name in ("bin/nvcc", "include/cuda_runtime.h", "include/cublasLt.h"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("")
    for name in ("libcublasLt.so.13", "libcublasLt.so", "libnccl.so.2"):
        (root / "lib64" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "lib64" / name).write_text("")
    cublas = find_cublas(root / "bin" / "nvcc")
    assert cublas is not None and cublas.libraries == (root / "lib64" / "libcublasLt.so",)
    assert find_nccl(root / "bin" / "nvcc", {}) == root / "lib64" / "libnccl.so.2"
    named = root / "lib64" / "libnccl.so.2"
    assert find_nccl(None, {"GPUHOST_NCCL": str(named)}) == named
    assert find_nccl(None, {"GPUHOST_NCCL": str(tmp_path / "absent.so")}) is None
