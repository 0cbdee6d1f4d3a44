"""The NVML environment judged: each GPU's link, ECC, clocks, BAR1, persistence, fabric; GPU and driver counts."""

from __future__ import annotations

from collections.abc import Collection

from gpuhost.bench.environment import (
    VIRTUALIZATION_MODES,
    Environment,
    FabricReading,
    FabricState,
    GpuEnvironment,
    RunSamples,
)
from gpuhost.bench.models import GpuModel
from gpuhost.bench.rules import CheckOutcome, Status, found, passed
from gpuhost.problems import Problem, Severity, Stage, register

# The smoke-test's problem codes: one per check (its severity varies with the case where None).
MODEL_UNKNOWN = register("smoke.model.unknown", Stage.SMOKE_TEST, Severity.WARNING, "GPU not in the model table")

PCIE_LINK = register(
    "smoke.pcie-link", Stage.SMOKE_TEST, None, "PCIe link down-trained (error), capped or unreadable (warning)"
)

VIRTUALIZATION = register(
    "smoke.virtualization", Stage.SMOKE_TEST, None, "not a passthrough guest: bare metal (info) or vGPU/other (warning)"
)

ECC = register("smoke.ecc", Stage.SMOKE_TEST, None, "ECC unreadable (info) or disabled (warning on datacenter GPUs)")

MEMORY_HEALTH = register(
    "smoke.memory-health",
    Stage.SMOKE_TEST,
    None,
    "row remapping failed (error), remaps/retirements pending or uncorrectable (warning), unreadable (info)",
)

CLOCKS = register(
    "smoke.clocks", Stage.SMOKE_TEST, None, "hardware slowdown (error), thermal slowdown (warning), not sampled (info)"
)

BAR1 = register("smoke.bar1", Stage.SMOKE_TEST, None, "BAR1 smaller than GPU memory (warning) or unreadable (info)")

PERSISTENCE = register("smoke.persistence", Stage.SMOKE_TEST, Severity.INFO, "persistence mode off or unreadable")

FABRIC = register(
    "smoke.fabric",
    Stage.SMOKE_TEST,
    None,
    "a GPU on an NVSwitch fabric has not joined it: Fabric Manager, CUDA error 802 (error); an unknown state (warning)",
)

GPUS = register("smoke.gpus", Stage.SMOKE_TEST, Severity.INFO, "the GPUs the run saw")

DRIVER = register("smoke.driver", Stage.SMOKE_TEST, Severity.INFO, "the driver and CUDA versions")

# ---------------------------------------------------------------- environment
HARDWARE_SLOWDOWN = 0x8 | 0x40 | 0x80  # hw slowdown, hw thermal, hw power brake

SOFTWARE_THERMAL = 0x20


def _link_text(gen: int | None, width: int | None) -> str:
    return f"Gen{gen if gen is not None else '?'} x{width if width is not None else '?'}"


# Each per-GPU check's code and what to check when it is not a pass.
_GPU_CHECKS: dict[str, tuple[str, str]] = {
    "model": (MODEL_UNKNOWN, "add its datasheet figures to gpuhost/data/gpu_models.json (or pass --gpu-table)"),
    "pcie link": (PCIE_LINK, "reseat the GPU or riser; check the slot's BIOS link speed and the VM's root port"),
    "virtualization": (VIRTUALIZATION, "none on bare metal; in a guest, pass the GPU through with vfio-pci"),
    "ecc": (ECC, "enable ECC (nvidia-smi -e 1) and reset the GPU"),
    "memory health": (MEMORY_HEALTH, "reset the GPU from the host; if remapping failed, have it serviced"),
    "clocks": (CLOCKS, "check the GPU's cooling and power delivery (not sampled: check NVML in the guest)"),
    "bar1": (BAR1, "enlarge the VM's 64-bit MMIO window (or enable resizable BAR)"),
    "persistence": (PERSISTENCE, "run nvidia-persistenced in the guest"),
    "fabric": (
        FABRIC,
        "run Fabric Manager of exactly the driver's version in the guest (`systemctl enable --now "
        "nvidia-fabricmanager`; `gpuhost guest up` installs and starts it for a VM given the NVSwitches); its "
        "journal names a version mismatch",
    ),
}

# What CUDA does on a GPU whose fabric has not been trained: cuInit fails with
# CUDA_ERROR_SYSTEM_NOT_READY (802), "system not yet initialized".
FABRIC_NOT_READY = "CUDA fails on it with error 802 (system not yet initialized) until Fabric Manager trains the fabric"


def judge_fabric(fabric: FabricReading | None) -> tuple[Status, str] | None:
    """A GPU's NVSwitch fabric state (nvmlDeviceGetGpuFabricInfo): None, no row, for a GPU without
    a fabric (NOT_SUPPORTED: a PCIe GPU, or an SXM one given alone) or where NVML cannot say."""
    if fabric is None or fabric.state is FabricState.NOT_SUPPORTED:
        return None
    if fabric.state is FabricState.COMPLETED:
        if fabric.status == 0:
            return Status.PASS, f"joined its NVSwitch fabric (clique {fabric.clique_id})"
        return (
            Status.FAIL,
            f"its NVSwitch fabric registration completed with NVML error {fabric.status}: {FABRIC_NOT_READY}",
        )
    if fabric.state is FabricState.NOT_STARTED:
        return Status.FAIL, f"attached to an NVSwitch fabric that no Fabric Manager has trained: {FABRIC_NOT_READY}"
    if fabric.state is FabricState.IN_PROGRESS:
        return Status.FAIL, f"attached to an NVSwitch fabric still being trained: {FABRIC_NOT_READY}"
    return Status.WARN, "NVML reports a fabric state this gpuhost does not know: check `nvidia-smi -q` (Fabric)"


def fabric_problems(environment: Environment) -> tuple[Problem, ...]:
    """The GPUs whose fabric is not ready, as the verdict's rows would name them: said with a
    suite that could not run at all (CUDA error 802 stops it before any result)."""
    code, remedy = _GPU_CHECKS["fabric"]
    problems = []
    for gpu in environment.gpus:
        judged = judge_fabric(gpu.fabric)
        if judged is not None and judged[0] is not Status.PASS:
            outcome = found(code, judged[0], "fabric", judged[1], gpu.index, remedy)
            assert outcome.problem is not None
            problems.append(outcome.problem)
    return tuple(problems)


def judge_gpu(gpu: GpuEnvironment, samples: RunSamples | None, model: GpuModel | None) -> list[CheckOutcome]:
    outcomes: list[CheckOutcome] = []

    def add(check: str, status: Status, detail: str) -> None:
        if status is Status.PASS:
            outcomes.append(passed(check, detail, gpu.index))
        else:
            code, remedy = _GPU_CHECKS[check]
            outcomes.append(found(code, status, check, detail, gpu.index, remedy))

    pci_id = f"10de:{gpu.pci_device_id:04x}"
    if model is None:
        add(
            "model",
            Status.WARN,
            f"{gpu.name} ({pci_id}) is not in the GPU model table: measured and reported without percentages",
        )
    else:
        add("model", Status.PASS, f"{gpu.name} ({pci_id}) = {model.name} in the model table")

    # PCIe link: judged on the widest/fastest state seen while the suite ran, because GPUs
    # drop to Gen1 when idle.
    link = gpu.link
    gen = samples.max_link_gen if samples is not None and samples.max_link_gen is not None else link.current_gen
    width = samples.max_link_width if samples is not None and samples.max_link_width is not None else link.current_width
    under = "under load" if samples is not None and samples.count > 0 else "at rest"
    if gen is None or width is None or link.max_gen is None or link.max_width is None:
        add("pcie link", Status.WARN, "NVML could not read the PCIe link")
    elif gen < link.max_gen or width < link.max_width:
        add(
            "pcie link",
            Status.FAIL,
            f"trained at {_link_text(gen, width)} {under}, below the {_link_text(link.max_gen, link.max_width)} "
            "that GPU and slot support: down-trained link (reseat the GPU or riser, check the slot's BIOS "
            "link-speed setting and the host's `lspci -vv` LnkSta)",
        )
    else:
        detail = f"{_link_text(gen, width)} {under} (max {_link_text(link.max_gen, link.max_width)})"
        if link.gpu_max_gen is not None and link.max_gen < link.gpu_max_gen:
            add(
                "pcie link",
                Status.WARN,
                f"{detail}, but the GPU supports Gen{link.gpu_max_gen}: the slot or the VM's emulated root port "
                "caps the link",
            )
        elif model is not None and (link.max_gen < model.pcie_gen or link.max_width < model.pcie_width):
            add("pcie link", Status.WARN, f"{detail}, below the model's {_link_text(model.pcie_gen, model.pcie_width)}")
        else:
            add("pcie link", Status.PASS, detail)

    mode = gpu.virtualization_mode
    mode_name = VIRTUALIZATION_MODES.get(mode, f"mode {mode}") if mode is not None else "unknown"
    if mode == 1:
        add("virtualization", Status.PASS, "passthrough (NVML virtualization mode 1)")
    elif mode == 0:
        add("virtualization", Status.INFO, "none: not a passthrough guest (bare metal, fine for a baseline run)")
    else:
        add("virtualization", Status.WARN, f"{mode_name}: expected passthrough")

    if gpu.ecc_current is None:
        add("ecc", Status.INFO, "ECC not supported or not readable on this GPU")
    elif gpu.ecc_current:
        pending = "" if gpu.ecc_pending in (None, True) else " (disabled at next reset)"
        add("ecc", Status.PASS, "enabled" + pending)
    else:
        datacenter = model is None or model.datacenter
        add(
            "ecc",
            Status.WARN if datacenter else Status.INFO,
            "disabled: memory errors go undetected (datacenter GPUs ship with ECC on)",
        )

    if gpu.remapped_rows_failure:
        add("memory health", Status.FAIL, "row remapping failed: the GPU needs service (RMA)")
    elif gpu.remapped_rows_pending:
        add("memory health", Status.WARN, "row remapping pending: reset the GPU (from the host) to apply it")
    elif gpu.remapped_rows_uncorrectable:
        add("memory health", Status.WARN, f"{gpu.remapped_rows_uncorrectable} rows remapped for uncorrectable errors")
    elif gpu.retired_pages_pending:
        add("memory health", Status.WARN, "page retirement pending: reset the GPU to apply it")
    elif gpu.retired_pages_double_bit:
        add("memory health", Status.WARN, f"{gpu.retired_pages_double_bit} pages retired for double-bit errors")
    elif gpu.remapped_rows_correctable is None and gpu.retired_pages_pending is None:
        add("memory health", Status.INFO, "neither remapped rows nor retired pages readable")
    else:
        rows = gpu.remapped_rows_correctable or 0
        add("memory health", Status.PASS, f"no pending remaps or retirements ({rows} rows remapped, correctable)")

    if samples is None or samples.count == 0:
        add("clocks", Status.INFO, "not sampled during the run")
    else:
        clock = (
            f"SM clock {samples.min_sm_clock_mhz}-{samples.max_sm_clock_mhz} MHz "
            f"(max {gpu.max_sm_clock_mhz}), {samples.count} samples"
        )
        names = ", ".join(samples.throttle_names) or "none"
        if samples.throttle_reasons & HARDWARE_SLOWDOWN:
            add(
                "clocks",
                Status.FAIL,
                f"{clock}; hardware slowdown during the run ({names}): cooling or power delivery is failing, "
                "the figures are not the GPU's",
            )
        elif samples.throttle_reasons & SOFTWARE_THERMAL:
            add("clocks", Status.WARN, f"{clock}; thermal slowdown during the run ({names})")
        else:
            add("clocks", Status.PASS, f"{clock}; clock limits seen: {names} (power cap under GEMM is normal)")

    if gpu.bar1_bytes is None:
        add("bar1", Status.INFO, "BAR1 size not readable")
    elif gpu.memory_bytes is not None and gpu.bar1_bytes < gpu.memory_bytes:
        add(
            "bar1",
            Status.WARN,
            f"BAR1 {gpu.bar1_bytes / 2**30:.3g} GiB is smaller than the {gpu.memory_bytes / 2**30:.0f} GiB of GPU "
            "memory: the VM's 64-bit MMIO window (or resizable BAR) is small; GPUDirect and large mappings suffer",
        )
    else:
        add("bar1", Status.PASS, f"{gpu.bar1_bytes / 2**30:.0f} GiB")

    fabric = judge_fabric(gpu.fabric)
    if fabric is not None:
        add("fabric", *fabric)

    if gpu.persistence_mode is None:
        add("persistence", Status.INFO, "persistence mode not readable")
    elif gpu.persistence_mode:
        add("persistence", Status.PASS, "enabled")
    else:
        add(
            "persistence",
            Status.INFO,
            "disabled: the driver re-initialises the GPU for each first CUDA process (slower start); "
            "run nvidia-persistenced in the guest",
        )
    return outcomes


def judge_environment(
    environment: Environment,
    samples: tuple[RunSamples, ...],
    models: dict[int, GpuModel | None],
    only: Collection[int] | None = None,
) -> list[CheckOutcome]:
    """The environment's checks: the driver, then each GPU's (`only` these NVML indices, where given:
    the GPUs a run used, not those CUDA_VISIBLE_DEVICES gave to someone else)."""
    cuda = environment.cuda_driver_version
    cuda_text = f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else "unknown"
    names = ", ".join(f"{g.index}: {g.name} (10de:{g.pci_device_id:04x}) at {g.pci_bus_id}" for g in environment.gpus)
    outcomes = [
        found(GPUS, Status.INFO, "gpus", f"{len(environment.gpus)} visible: {names}"),
        found(DRIVER, Status.INFO, "driver", f"driver {environment.driver_version}, CUDA {cuda_text}"),
    ]
    by_index = {s.index: s for s in samples}
    for gpu in environment.gpus:
        if only is None or gpu.index in only:
            outcomes.extend(judge_gpu(gpu, by_index.get(gpu.index), models.get(gpu.index)))
    return outcomes
