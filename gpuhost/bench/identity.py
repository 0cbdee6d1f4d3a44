"""Which GPU is which: NVML's index, the GPU's UUID and PCI address, and CUDA's ordinal, as one identity.

Three numbering schemes meet in a GPU guest. NVML numbers every GPU of the machine in PCI order
(nvidia-smi's index, and gpuhost's name for a GPU: "GPU 2"). CUDA numbers only the GPUs that
CUDA_VISIBLE_DEVICES leaves, in the variable's order. The host knows the GPU by its slot. A figure is
only worth its verdict if it is filed under the GPU that made it, so this module resolves the three
once, from NVML's listing and the environment, and every other module asks it:

- `resolve_visibility`: which GPUs the caller's CUDA_VISIBLE_DEVICES leaves, in CUDA's order, read
  as CUDA reads it (indices, UUIDs or their unique prefixes; CUDA stops at the first entry that names
  no GPU); a setting that names nothing, a GPU twice, or a MIG instance is an InputError (exit 2).
- `suite_environment`: the environment of one suite process: CUDA_VISIBLE_DEVICES set to the UUIDs
  of the GPUs it may use, so that its CUDA device k is exactly the k-th of them.
- `in_machine_numbering`: a suite document in NVML's numbering: its device, P2P pairs and per-GPU
  shares renamed from the process's ordinals to NVML indices, after checking that the PCI address the
  suite reports is NVML's for that GPU (a mismatch is a GpuMismatch naming both, never a verdict).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuhost.bench.environment import Environment
from gpuhost.errors import GpuhostError, InputError

VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
DEVICE_ORDER = "CUDA_DEVICE_ORDER"

_BUS_ID = re.compile(r"([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])")
_INDEX = re.compile(r"[+-]?[0-9]+")


def pci_address(bus_id: str) -> str:
    """NVML's '00000000:00:06.0' and CUDA's '0000:00:06.0' as one address: the 4-digit domain,
    lower case, that lspci and the audit use. Anything else is kept as it is."""
    match = _BUS_ID.fullmatch(bus_id.strip())
    return f"{int(match[1], 16):04x}:{match[2].lower()}" if match else bus_id


def _uuid_key(text: str) -> str:
    """A UUID or its prefix as CUDA compares them: case-insensitive, with or without 'GPU-'."""
    lowered = text.strip().lower()
    return lowered[4:] if lowered.startswith("gpu-") else lowered


def _by_uuid_prefix(gpus: Sequence[GpuIdentity], text: str) -> list[GpuIdentity]:
    """The GPUs whose UUID starts with `text` (CUDA's rule: a prefix names a GPU when it names one)."""
    key = _uuid_key(text)
    return [g for g in gpus if key and g.uuid and _uuid_key(g.uuid).startswith(key)]


class GpuMismatch(GpuhostError):
    """A suite process measured another GPU than the one it was started for (exit 2: no verdict)."""


@dataclass(frozen=True)
class GpuIdentity:
    index: int  # NVML's index: PCI order over every GPU of the machine, as nvidia-smi shows
    uuid: str  # 'GPU-8932f937-d72c-4106-c12f-20bd9faed9f6'; '' where a recording predates UUIDs
    pci_bus_id: str  # normalised: '0000:00:06.0'
    cuda_ordinal: int | None = None  # CUDA's device number under the caller's CUDA_VISIBLE_DEVICES; None: hidden

    def describe(self) -> str:
        return f"GPU {self.index} ({self.pci_bus_id})"

    def same_gpu(self, other: GpuIdentity) -> bool:
        """The same physical GPU: by UUID where both have one (it travels from host to guest), else
        by PCI address (the same machine's recordings)."""
        if self.uuid and other.uuid:
            return _uuid_key(self.uuid) == _uuid_key(other.uuid)
        return self.pci_bus_id == other.pci_bus_id


@dataclass(frozen=True)
class Visibility:
    """Every GPU NVML lists, each with its CUDA ordinal under `setting` (None where CUDA cannot see it)."""

    gpus: tuple[GpuIdentity, ...]
    setting: str | None  # CUDA_VISIBLE_DEVICES as the caller set it; None: unset (every GPU visible)
    stopped_at: str | None = None  # the entry where CUDA stopped reading the setting (it names no GPU)

    @property
    def visible(self) -> tuple[GpuIdentity, ...]:
        """The GPUs CUDA can use, in CUDA's order."""
        return tuple(sorted((g for g in self.gpus if g.cuda_ordinal is not None), key=lambda g: g.cuda_ordinal or 0))

    @property
    def hidden(self) -> tuple[GpuIdentity, ...]:
        return tuple(g for g in self.gpus if g.cuda_ordinal is None)

    def left_out(self) -> str | None:
        """Which GPUs the setting leaves out and why, for the report; None when none is."""
        if not self.hidden:
            return None
        named = ", ".join(g.describe() for g in self.hidden)
        why = (
            f"; CUDA stops reading it at {self.stopped_at!r}, which names no GPU of this machine"
            if self.stopped_at is not None
            else ""
        )
        verb = "are" if len(self.hidden) > 1 else "is"
        return f"{VISIBLE_DEVICES}={self.setting}{why}: {named} {verb} not visible, not judged"

    def select(self, selector: str | None) -> GpuIdentity:
        """The GPU `--device` names: NVML's index, a UUID (or its unique prefix) or a PCI address;
        None: CUDA's device 0. It must be one CUDA can see (InputError naming it otherwise)."""
        if not self.visible:
            raise InputError(f"{VISIBLE_DEVICES}={self.setting} leaves no GPU visible: nothing to measure")
        if selector is None:
            return self.visible[0]
        text = selector.strip()
        if _INDEX.fullmatch(text):
            found = [g for g in self.gpus if g.index == int(text)]
        elif _BUS_ID.fullmatch(text):
            found = [g for g in self.gpus if g.pci_bus_id == pci_address(text)]
        else:
            found = _by_uuid_prefix(self.gpus, text)
        listed = ", ".join(f"{g.describe()} {g.uuid}".rstrip() for g in self.gpus) or "none"
        if len(found) != 1:
            what = "names several GPUs" if found else "names no GPU of this guest"
            raise InputError(
                f"--device {selector!r} {what}: give NVML's index, a UUID or a PCI address of one of: {listed}"
            )
        gpu = found[0]
        if gpu.cuda_ordinal is None:
            visible = ", ".join(g.describe() for g in self.visible)
            raise InputError(
                f"--device {selector!r}: {gpu.describe()} is not visible to CUDA under "
                f"{VISIBLE_DEVICES}={self.setting} (visible: {visible}); name a visible GPU, "
                f"or change {VISIBLE_DEVICES}"
            )
        return gpu


def visibility_of(environment: Environment, environ: Mapping[str, str]) -> Visibility:
    """resolve_visibility for the GPUs NVML listed in `environment`."""
    listed = [GpuIdentity(g.index, g.uuid, pci_address(g.pci_bus_id)) for g in environment.gpus]
    return resolve_visibility(listed, environ, one_model=len({g.pci_device_id for g in environment.gpus}) <= 1)


def resolve_visibility(listed: Sequence[GpuIdentity], environ: Mapping[str, str], *, one_model: bool) -> Visibility:
    """Which of NVML's GPUs (`listed`, by index) CUDA sees under `environ`, read as CUDA reads
        CUDA_VISIBLE_DEVICES: a comma-separated list of indices, UUIDs or unique UUID prefixes, enumerated
        in its order, ending at the first entry that names no GPU. An index counts in CUDA_DEVICE_ORDER's
        order: PCI order (NVML's) under PCI_BUS_ID, and on a machine of one GPU model also under CUDA's
        default (which then ranks equal GPUs in PCI order); on a mixed machine without PCI_BUS_ID CUDA's
        order is its own heuristic's, so an index there is refused (`one_model`: every GPU of `listed` is
    of one model). Unset: every GPU, in NVML's order."""
    gpus = tuple(sorted(listed, key=lambda g: g.index))
    setting = environ.get(VISIBLE_DEVICES)
    if setting is None:
        return Visibility(tuple(_with_ordinal(g, i) for i, g in enumerate(gpus)), None)
    chosen: list[GpuIdentity] = []
    stopped_at: str | None = None
    for raw in setting.split(","):
        entry = raw.strip()
        if entry.upper().startswith("MIG-"):
            raise InputError(
                f"{VISIBLE_DEVICES}={setting} names the MIG instance {entry!r}: smoke-test measures whole GPUs, "
                f"and a MIG slice is not one; name whole GPUs (index or UUID) or unset {VISIBLE_DEVICES}"
            )
        gpu = _named(entry, gpus, environ, one_model)
        if gpu is None:
            stopped_at = entry
            break
        if any(g.index == gpu.index for g in chosen):
            raise InputError(
                f"{VISIBLE_DEVICES}={setting} names {gpu.describe()} twice ({entry!r}): name each GPU once"
            )
        chosen.append(gpu)
    if not chosen:
        listing = ", ".join(f"{g.describe()} {g.uuid}".rstrip() for g in gpus) or "none"
        first = f" ({stopped_at!r} names no GPU of this machine)" if stopped_at is not None else ""
        raise InputError(
            f"{VISIBLE_DEVICES}={setting!r} leaves no GPU visible{first}: nothing can be measured; "
            f"this machine's GPUs: {listing}"
        )
    ordinals = {g.index: i for i, g in enumerate(chosen)}
    return Visibility(
        tuple(_with_ordinal(g, ordinals.get(g.index)) for g in gpus),
        setting,
        stopped_at if len(chosen) < len(gpus) else None,
    )


def _with_ordinal(gpu: GpuIdentity, ordinal: int | None) -> GpuIdentity:
    return GpuIdentity(gpu.index, gpu.uuid, gpu.pci_bus_id, ordinal)


def _named(
    entry: str, gpus: tuple[GpuIdentity, ...], environ: Mapping[str, str], one_model: bool
) -> GpuIdentity | None:
    """The GPU one entry of CUDA_VISIBLE_DEVICES names, or None where it names none (CUDA stops there)."""
    if _INDEX.fullmatch(entry):
        number = int(entry)
        if not 0 <= number < len(gpus):
            return None
        pci_order = environ.get(DEVICE_ORDER, "FASTEST_FIRST").strip().upper() == "PCI_BUS_ID"
        if not pci_order and not one_model:
            raise InputError(
                f"{VISIBLE_DEVICES} names GPU {number} by index, and this machine's GPUs are of several models: "
                f"CUDA then numbers them fastest first, which NVML cannot tell; set {DEVICE_ORDER}=PCI_BUS_ID "
                "(the order nvidia-smi shows) or name the GPUs by UUID (nvidia-smi -L)"
            )
        return gpus[number]
    found = _by_uuid_prefix(gpus, entry)
    return found[0] if len(found) == 1 else None


def suite_environment(devices: Sequence[GpuIdentity], environ: Mapping[str, str]) -> dict[str, str]:
    """The environment of a suite process that may use `devices`, in that order: CUDA's device k
    is devices[k], whatever the caller's CUDA_VISIBLE_DEVICES said (UUIDs leave CUDA no choice)."""
    missing = [g.describe() for g in devices if not g.uuid]
    if missing:  # only a recording lacks UUIDs, and a recording starts no suite
        raise GpuMismatch(f"NVML gave no UUID for {', '.join(missing)}: the suite cannot be pinned to it")
    return {**environ, DEVICE_ORDER: "PCI_BUS_ID", VISIBLE_DEVICES: ",".join(g.uuid for g in devices)}


_PAIR_NAMES = (
    re.compile(r"(?P<prefix>p2p_pair_)(?P<a>[0-9]+)(?P<mid>_to_)(?P<b>[0-9]+)"),
    re.compile(r"(?P<prefix>p2p_bidir_)(?P<a>[0-9]+)(?P<mid>_)(?P<b>[0-9]+)"),
    re.compile(r"(?P<prefix>p2p_)(?P<a>[0-9]+)(?P<mid>_to_)(?P<b>[0-9]+)"),
)


def in_machine_numbering(document: dict[str, Any], devices: Sequence[GpuIdentity]) -> dict[str, Any]:
    """A suite document, written by a process whose CUDA devices were `devices` (suite_environment),
    with every GPU number in it NVML's: the measured device, P2P pairs (names and src/dst) and per-GPU
    shares. First the check that makes the rest true: the device the suite measured has the PCI
    address NVML gives that GPU (GpuMismatch, naming both, otherwise). `devices` ascend in NVML's
    order, so a pair written lower GPU first stays so."""
    device = document.get("device")
    if not isinstance(device, dict):
        return document  # no device block: the suite printed no results worth a verdict (caught later)
    ordinal = device.get("index")
    if not isinstance(ordinal, int) or not 0 <= ordinal < len(devices):
        raise GpuMismatch(
            f"the kernel suite measured CUDA device {ordinal!r}, but it was started with {len(devices)} GPU(s): "
            f"{', '.join(g.describe() for g in devices)}"
        )
    expected = devices[ordinal]
    reported = pci_address(str(device.get("pci_bus_id", "")))
    if reported != expected.pci_bus_id:
        raise GpuMismatch(
            f"the kernel suite started for {expected.describe()} {expected.uuid} measured the GPU at PCI "
            f"{reported or '(none reported)'}: no verdict can name the GPU it measured; check that no wrapper "
            f"rewrites {VISIBLE_DEVICES} (and `nvidia-smi -L` against the suite's device)"
        )
    renamed = renumbered(document, {i: g.index for i, g in enumerate(devices)})
    return {**renamed, "device": {**device, "index": expected.index}}


def renumbered(document: dict[str, Any], number: Mapping[int, int]) -> dict[str, Any]:
    """A suite document with every GPU number in its results (P2P pairs' names and src/dst, per-GPU
        shares) mapped through `number`; a number it does not map stays. The mapping must keep the order
        of the numbers it maps for the one-direction pairs' src/dst to stay as measured; a both-ways pair's
    name is written lower GPU first whatever the mapping."""

    def number_of(value: Any) -> Any:
        return number.get(value, value) if isinstance(value, int) and not isinstance(value, bool) else value

    def renamed(name: Any) -> Any:
        if not isinstance(name, str):
            return name
        for pattern in _PAIR_NAMES:
            match = pattern.fullmatch(name)
            if match:
                a, b = number_of(int(match["a"])), number_of(int(match["b"]))
                if match["prefix"] == "p2p_bidir_":  # both directions: written lower GPU first
                    a, b = min(a, b), max(a, b)
                return f"{match['prefix']}{a}{match['mid']}{b}"
        return name

    def pairs(value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        return {**value, **{key: number_of(value[key]) for key in ("src", "dst", "gpu") if key in value}}

    def result(raw: Any) -> Any:
        if not isinstance(raw, dict):
            return raw
        extra = raw.get("extra")
        if isinstance(extra, dict):
            extra = {
                **extra,
                **{
                    key: [pairs(item) for item in extra[key]]
                    for key in ("pairs", "per_gpu")
                    if isinstance(extra.get(key), list)
                },
            }
        return {
            **raw,
            "name": renamed(raw.get("name")),
            **({"params": pairs(raw["params"])} if isinstance(raw.get("params"), dict) else {}),
            **({"extra": extra} if extra is not None else {}),
        }

    return {**document, "results": [result(r) for r in document.get("results", [])]}
