"""What NVML says about the guest's GPUs, read before the suite and sampled while it runs.

pynvml (the nvidia-ml-py package) is imported lazily: the module imports without it, and
`open_nvml` turns its absence, a missing driver or an empty bus into a GpuUnavailable
error (exit 2) that names what to check on the host.
"""

from __future__ import annotations

import ctypes
import enum
import importlib
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, TypeVar

from gpuhost.bench.contention import GpuProcess, Phase, merge, read_processes
from gpuhost.errors import GpuhostError, MissingDependencyError

T = TypeVar("T")

# NVML's virtualization modes (nvmlGpuVirtualizationMode_t).
VIRTUALIZATION_MODES = {0: "none", 1: "passthrough", 2: "vgpu", 3: "host-vgpu", 4: "host-vsga"}

# NVML clock event (throttle) reason bits.
THROTTLE_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}

HOST_HINT = (
    "On the host, check that the GPU (and its audio function) is bound to vfio-pci "
    "(`gpuhost audit`), that the VM's domain XML has a <hostdev> for its PCI address, "
    "and, in the guest, that the NVIDIA driver is installed and loaded (`lsmod | grep nvidia`)."
)


class GpuUnavailable(GpuhostError):
    """No GPU can be measured here: no driver, no device, or NVML unusable (exit 2)."""


@dataclass(frozen=True)
class PcieLinkReading:
    current_gen: int | None
    current_width: int | None
    max_gen: int | None  # the most this GPU and its slot can train to together (NVML "max")
    max_width: int | None
    gpu_max_gen: int | None  # the GPU's own maximum, whatever the slot


class FabricState(str, enum.Enum):
    """Where a GPU stands in joining its NVSwitch (NVLink) fabric: nvmlGpuFabricState_t of NVIDIA's
    nvml.h (NVML_GPU_FABRIC_STATE_NOT_SUPPORTED 0, _NOT_STARTED 1, _IN_PROGRESS 2, _COMPLETED 3);
    UNKNOWN for a value a newer NVML may add."""

    NOT_SUPPORTED = "not-supported"  # no fabric: a PCIe GPU, or an SXM GPU given alone (seen on an H100)
    NOT_STARTED = "not-started"  # Fabric Manager has not (yet) trained the fabric
    IN_PROGRESS = "in-progress"
    COMPLETED = "completed"  # registered: then `status` says whether it succeeded
    UNKNOWN = "unknown"


_FABRIC_STATES = {
    0: FabricState.NOT_SUPPORTED,
    1: FabricState.NOT_STARTED,
    2: FabricState.IN_PROGRESS,
    3: FabricState.COMPLETED,
}


@dataclass(frozen=True)
class FabricReading:
    """nvmlDeviceGetGpuFabricInfoV (or nvmlDeviceGetGpuFabricInfo on an NVML without it)."""

    state: FabricState
    status: int  # nvmlReturn_t of the registration, 0 success; nvml.h: "checked only if state returns complete"
    clique_id: int  # the GPUs of one clique reach each other over NVLink
    health_mask: int | None  # the V call's health bits; None from the older call


def parse_fabric(state: int, status: int, clique_id: int, health_mask: int | None) -> FabricReading:
    """NVML's fabric info fields -> a FabricReading (the C struct's numbers, from NVML or a capture)."""
    return FabricReading(_FABRIC_STATES.get(state, FabricState.UNKNOWN), status, clique_id, health_mask)


@dataclass(frozen=True)
class GpuEnvironment:
    index: int
    name: str
    pci_bus_id: str
    pci_device_id: int  # e.g. 0x2330 (the upper half of NVML's 0x233010de)
    compute_capability: tuple[int, int]
    memory_bytes: int | None
    link: PcieLinkReading
    virtualization_mode: int | None
    ecc_current: bool | None
    ecc_pending: bool | None
    retired_pages_pending: bool | None
    retired_pages_double_bit: int | None
    remapped_rows_correctable: int | None
    remapped_rows_uncorrectable: int | None
    remapped_rows_pending: bool | None
    remapped_rows_failure: bool | None
    bar1_bytes: int | None
    persistence_mode: bool | None
    max_sm_clock_mhz: int | None
    max_memory_clock_mhz: int | None
    power_limit_w: float | None
    # None: NVML cannot say (a GPU before Hopper, a driver or pynvml without the call, a run
    # recorded before the fabric was read).
    fabric: FabricReading | None = None
    # NVML's UUID ('GPU-...'): the name CUDA_VISIBLE_DEVICES takes; '' in a run recorded before it was read.
    uuid: str = ""


@dataclass(frozen=True)
class Environment:
    driver_version: str
    cuda_driver_version: int | None  # e.g. 13000
    nvml_version: str | None
    gpus: tuple[GpuEnvironment, ...]


@dataclass(frozen=True)
class RunSamples:
    """NVML readings taken while the suite ran, for one GPU."""

    index: int
    count: int
    max_link_gen: int | None
    max_link_width: int | None
    min_sm_clock_mhz: int | None
    max_sm_clock_mhz: int | None
    throttle_reasons: int  # union of the reason bits seen in any sample
    max_temperature_c: int | None
    max_power_w: float | None

    @property
    def throttle_names(self) -> tuple[str, ...]:
        return tuple(name for bit, name in THROTTLE_REASONS.items() if self.throttle_reasons & bit)


def load_pynvml() -> ModuleType:
    try:
        return importlib.import_module("pynvml")
    except ImportError as error:
        raise MissingDependencyError("nvidia-ml-py", "guest", "gpuhost smoke-test (GPU checks through NVML)") from error


def _error_name(nvml: Any, error: Exception) -> str:
    value = getattr(error, "value", None)
    for name in ("NVML_ERROR_LIBRARY_NOT_FOUND", "NVML_ERROR_DRIVER_NOT_LOADED", "NVML_ERROR_NO_PERMISSION"):
        if value is not None and value == getattr(nvml, name, object()):
            return name
    return type(error).__name__


def open_nvml(nvml: Any) -> int:
    """nvmlInit, turning each way it can fail into the reason a user can act on; returns the GPU count."""
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as error:
        name = _error_name(nvml, error)
        if name == "NVML_ERROR_LIBRARY_NOT_FOUND":
            raise GpuUnavailable(
                "no NVIDIA driver in this machine: NVML (libnvidia-ml.so.1) was not found, so no GPU is visible. "
                + HOST_HINT
            ) from error
        if name == "NVML_ERROR_DRIVER_NOT_LOADED":
            raise GpuUnavailable(
                "the NVIDIA kernel driver is not loaded (NVML: driver not loaded): no GPU is visible. " + HOST_HINT
            ) from error
        if name == "NVML_ERROR_NO_PERMISSION":
            raise GpuUnavailable("NVML refused access to the GPU (no permission on /dev/nvidia*)") from error
        raise GpuUnavailable(f"NVML could not start: {error}. " + HOST_HINT) from error
    count = int(nvml.nvmlDeviceGetCount())
    if count == 0:
        nvml.nvmlShutdown()
        raise GpuUnavailable("the NVIDIA driver is loaded but sees no GPU. " + HOST_HINT)
    return count


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _maybe(nvml: Any, read: Callable[[], T]) -> T | None:
    """A reading this GPU or driver does not support is absent, not a failure."""
    try:
        return read()
    except nvml.NVMLError:
        return None


def read_fabric(nvml: Any, handle: Any) -> FabricReading | None:
    """The GPU's fabric info: the versioned call (with the health bits) where the driver has it,
    else the first one (drivers before it); None where neither answers."""
    versioned = getattr(nvml, "nvmlDeviceGetGpuFabricInfoV", None)
    versioned_struct = getattr(nvml, "c_nvmlGpuFabricInfoV_t", None)
    if versioned is not None and versioned_struct is not None:
        info = versioned_struct()  # its constructor sets the struct version NVML checks
        try:
            versioned(handle, ctypes.byref(info))
        except nvml.NVMLError:
            pass
        else:
            return parse_fabric(int(info.state), int(info.status), int(info.cliqueId), int(info.healthMask))
    first = getattr(nvml, "nvmlDeviceGetGpuFabricInfo", None)
    first_struct = getattr(nvml, "c_nvmlGpuFabricInfo_t", None)
    if first is None or first_struct is None:
        return None
    info = first_struct()
    try:
        first(handle, ctypes.byref(info))
    except nvml.NVMLError:
        return None
    return parse_fabric(int(info.state), int(info.status), int(info.cliqueId), None)


def read_gpu(nvml: Any, index: int) -> GpuEnvironment:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    pci = nvml.nvmlDeviceGetPciInfo(handle)
    ecc = _maybe(nvml, lambda: nvml.nvmlDeviceGetEccMode(handle))
    remapped = _maybe(nvml, lambda: nvml.nvmlDeviceGetRemappedRows(handle))
    retired_pending = _maybe(nvml, lambda: nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle))
    retired_double = _maybe(
        nvml,
        lambda: len(nvml.nvmlDeviceGetRetiredPages(handle, nvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)),
    )
    bar1 = _maybe(nvml, lambda: nvml.nvmlDeviceGetBAR1MemoryInfo(handle))
    memory = _maybe(nvml, lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
    persistence = _maybe(nvml, lambda: nvml.nvmlDeviceGetPersistenceMode(handle))
    power = _maybe(nvml, lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle))
    major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
    return GpuEnvironment(
        index=index,
        name=_text(nvml.nvmlDeviceGetName(handle)),
        pci_bus_id=_text(pci.busId),
        pci_device_id=(int(pci.pciDeviceId) >> 16) & 0xFFFF,
        compute_capability=(int(major), int(minor)),
        memory_bytes=int(memory.total) if memory is not None else None,
        link=PcieLinkReading(
            current_gen=_maybe(nvml, lambda: int(nvml.nvmlDeviceGetCurrPcieLinkGeneration(handle))),
            current_width=_maybe(nvml, lambda: int(nvml.nvmlDeviceGetCurrPcieLinkWidth(handle))),
            max_gen=_maybe(nvml, lambda: int(nvml.nvmlDeviceGetMaxPcieLinkGeneration(handle))),
            max_width=_maybe(nvml, lambda: int(nvml.nvmlDeviceGetMaxPcieLinkWidth(handle))),
            gpu_max_gen=_maybe(nvml, lambda: int(nvml.nvmlDeviceGetGpuMaxPcieLinkGeneration(handle))),
        ),
        virtualization_mode=_maybe(nvml, lambda: int(nvml.nvmlDeviceGetVirtualizationMode(handle))),
        ecc_current=bool(ecc[0]) if ecc is not None else None,
        ecc_pending=bool(ecc[1]) if ecc is not None else None,
        retired_pages_pending=bool(retired_pending) if retired_pending is not None else None,
        retired_pages_double_bit=retired_double,
        remapped_rows_correctable=int(remapped[0]) if remapped is not None else None,
        remapped_rows_uncorrectable=int(remapped[1]) if remapped is not None else None,
        remapped_rows_pending=bool(remapped[2]) if remapped is not None else None,
        remapped_rows_failure=bool(remapped[3]) if remapped is not None else None,
        bar1_bytes=int(bar1.bar1Total) if bar1 is not None else None,
        persistence_mode=bool(persistence) if persistence is not None else None,
        max_sm_clock_mhz=_maybe(nvml, lambda: int(nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_SM))),
        max_memory_clock_mhz=_maybe(nvml, lambda: int(nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_MEM))),
        power_limit_w=power / 1000.0 if power is not None else None,
        fabric=read_fabric(nvml, handle),
        uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
    )


def read_environment(nvml: Any, count: int) -> Environment:
    return Environment(
        driver_version=_text(nvml.nvmlSystemGetDriverVersion()),
        cuda_driver_version=_maybe(nvml, lambda: int(nvml.nvmlSystemGetCudaDriverVersion())),
        nvml_version=_maybe(nvml, lambda: _text(nvml.nvmlSystemGetNVMLVersion())),
        gpus=tuple(read_gpu(nvml, index) for index in range(count)),
    )


@dataclass
class _Accumulator:
    count: int = 0
    link_gen: int | None = None
    link_width: int | None = None
    min_clock: int | None = None
    max_clock: int | None = None
    reasons: int = 0
    temperature: int | None = None
    power: float | None = None
    errors: list[str] = field(default_factory=list)


def _larger(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


class NvmlSampler:
    """Samples link, clocks, throttle reasons, temperature and power on a thread while the
    suite runs: GPUs drop their link speed and clocks when idle, so only readings under load
    say whether the link trained down or the clocks were held back."""

    PROCESS_EVERY = 5  # samples between two reads of the GPU's process list (about 0.5 s)

    def __init__(self, nvml: Any, indices: tuple[int, ...], interval_s: float = 0.1) -> None:
        self._nvml = nvml
        self._processes: list[GpuProcess] = []
        self._processes_readable = True
        self._handles = {index: nvml.nvmlDeviceGetHandleByIndex(index) for index in indices}
        self._interval = interval_s
        self._data = {index: _Accumulator() for index in indices}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="nvml-sampler", daemon=True)

    def __enter__(self) -> NvmlSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _reason_bits(self, handle: Any) -> int:
        nvml = self._nvml
        reader = (
            getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
            or nvml.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        return int(reader(handle))

    def _sample(self, index: int) -> None:
        nvml, handle, acc = self._nvml, self._handles[index], self._data[index]
        acc.count += 1
        acc.link_gen = _larger(
            acc.link_gen, _maybe(nvml, lambda: int(nvml.nvmlDeviceGetCurrPcieLinkGeneration(handle)))
        )
        acc.link_width = _larger(acc.link_width, _maybe(nvml, lambda: int(nvml.nvmlDeviceGetCurrPcieLinkWidth(handle))))
        clock = _maybe(nvml, lambda: int(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)))
        if clock is not None:
            acc.min_clock = clock if acc.min_clock is None else min(acc.min_clock, clock)
            acc.max_clock = _larger(acc.max_clock, clock)
        reasons = _maybe(nvml, lambda: self._reason_bits(handle))
        # GPU idle is set between kernels and says nothing about the GPU's health.
        acc.reasons |= (reasons or 0) & ~0x1
        temperature = _maybe(nvml, lambda: int(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)))
        acc.temperature = _larger(acc.temperature, temperature)
        power = _maybe(nvml, lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0)
        if power is not None:
            acc.power = power if acc.power is None else max(acc.power, power)

    def _read_processes(self, index: int) -> None:
        try:
            self._processes.extend(read_processes(self._nvml, self._handles[index], index, "during"))
        except (self._nvml.NVMLError, AttributeError):  # AttributeError: a pynvml without process queries
            self._processes_readable = False

    def _loop(self) -> None:
        rounds = 0
        while True:
            for index in self._data:
                self._sample(index)
                if rounds % self.PROCESS_EVERY == 0:
                    self._read_processes(index)
            rounds += 1
            if self._stop.wait(self._interval):
                break

    def processes(self) -> tuple[tuple[GpuProcess, ...], bool]:
        """Other processes seen on the GPUs while sampling, and whether NVML could list them."""
        return merge(self._processes), self._processes_readable

    def results(self) -> tuple[RunSamples, ...]:
        return tuple(
            RunSamples(
                index=index,
                count=acc.count,
                max_link_gen=acc.link_gen,
                max_link_width=acc.link_width,
                min_sm_clock_mhz=acc.min_clock,
                max_sm_clock_mhz=acc.max_clock,
                throttle_reasons=acc.reasons,
                max_temperature_c=acc.temperature,
                max_power_w=acc.power,
            )
            for index, acc in self._data.items()
        )


# ---------------------------------------------------------------------------------- more reads
NVLINK_MAX_LINKS = 18  # NVML_NVLINK_MAX_LINKS on Hopper and Blackwell


@dataclass(frozen=True)
class NvlinkReading:
    gpu: int
    active: int | None  # None: NVML could not say
    queried: int  # links NVML answered for


def read_nvlinks(nvml: Any, gpus: Iterable[int]) -> tuple[NvlinkReading, ...]:
    readings = []
    for gpu in gpus:
        active, queried = 0, 0
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(gpu)
        except nvml.NVMLError:
            readings.append(NvlinkReading(gpu, None, 0))
            continue
        for link in range(NVLINK_MAX_LINKS):
            try:
                state = nvml.nvmlDeviceGetNvLinkState(handle, link)
            except nvml.NVMLError:  # a link the GPU does not have, or no NVLink at all
                continue
            queried += 1
            active += int(state == 1)
        readings.append(NvlinkReading(gpu, active if queried else 0, queried))
    return tuple(readings)


def processes_on(nvml: Any, gpus: Iterable[int], phase: Phase) -> tuple[tuple[GpuProcess, ...], bool]:
    """The processes NVML lists on `gpus` (NVML indices), and whether it could list them all."""
    found: list[GpuProcess] = []
    try:
        for index in gpus:
            found.extend(read_processes(nvml, nvml.nvmlDeviceGetHandleByIndex(index), index, phase))
    except nvml.NVMLError:
        return tuple(found), False
    return tuple(found), True


def read_replay_counters(nvml: Any, count: int) -> tuple[int | None, ...]:
    counters: list[int | None] = []
    for index in range(count):
        try:
            counters.append(int(nvml.nvmlDeviceGetPcieReplayCounter(nvml.nvmlDeviceGetHandleByIndex(index))))
        except nvml.NVMLError:
            counters.append(None)
    return tuple(counters)


def read_utilization(nvml: Any, count: int) -> tuple[int | None, ...]:
    readings: list[int | None] = []
    for index in range(count):
        try:
            readings.append(int(nvml.nvmlDeviceGetUtilizationRates(nvml.nvmlDeviceGetHandleByIndex(index)).gpu))
        except nvml.NVMLError:
            readings.append(None)
    return tuple(readings)
