"""One GPU, one name: NVML's index, the UUID, the PCI address and CUDA's ordinal under CUDA_VISIBLE_DEVICES.

The GPUs are the four-H200 guest's as recorded (tests/fixtures/h200x4-wall: `nvidia-smi -L` for the
UUIDs, the --all run's NVML environment for the PCI addresses and models); the suite documents are
real node runs of the two-H200 guest (tests/fixtures/h200x2-node) and the four-H200 one.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from gpuhost.bench.identity import (
    GpuIdentity,
    GpuMismatch,
    in_machine_numbering,
    pci_address,
    renumbered,
    resolve_visibility,
    suite_environment,
    visibility_of,
)
from gpuhost.bench.jsonout import read_recorded
from gpuhost.cli.main import main
from gpuhost.errors import EXIT_UNUSABLE, InputError
from tests.helpers import FIXTURES

WALL = FIXTURES / "h200x4-wall"
_SMI_LINE = re.compile(r"GPU (\d+): .+ \(UUID: (GPU-[0-9a-f-]+)\)")


def _four_h200() -> list[GpuIdentity]:
    """The four-H200 guest's GPUs as NVML lists them: index, UUID (nvidia-smi -L), PCI address (NVML)."""
    uuids = {
        int(m[1]): m[2] for m in map(_SMI_LINE.fullmatch, (WALL / "nvidia-smi-L.txt").read_text().splitlines()) if m
    }
    environment = read_recorded(json.loads((WALL / "all-1.json").read_text())["gpus"][0]).environment
    return [GpuIdentity(g.index, uuids[g.index], pci_address(g.pci_bus_id)) for g in environment.gpus]


GPUS = _four_h200()
UUID = {g.index: g.uuid for g in GPUS}


def _visible(setting: str | None, **environ: str) -> list[tuple[int, int | None]]:
    env = dict(environ) if setting is None else {"CUDA_VISIBLE_DEVICES": setting, **environ}
    return [(g.index, g.cuda_ordinal) for g in resolve_visibility(GPUS, env, one_model=True).visible]


def test_the_recorded_guest_is_four_h200s_at_their_own_addresses() -> None:
    assert [(g.index, g.pci_bus_id) for g in GPUS] == [(i, f"0000:00:0{6 + i}.0") for i in range(4)]
    assert UUID[2] == "GPU-5452adaa-064a-d5c2-4196-6e08c384edd8"


@pytest.mark.parametrize(
    ("setting", "visible"),
    [
        (None, [(0, 0), (1, 1), (2, 2), (3, 3)]),
        ("0,2", [(0, 0), (2, 1)]),
        ("3", [(3, 0)]),
        ("3,2,1,0", [(3, 0), (2, 1), (1, 2), (0, 3)]),
        (f"{UUID[3]},{UUID[1]}", [(3, 0), (1, 1)]),
        ("GPU-513ecd63, gpu-D8D3BF23", [(3, 0), (1, 1)]),  # unique prefixes, any case, spaces: as CUDA reads them
        ("513ecd63-4b07", [(3, 0)]),  # a UUID without its GPU- prefix
        # CUDA stops at the first entry that names no GPU: the GPUs before it stay visible.
        ("0,2,-1,1", [(0, 0), (2, 1)]),
        ("1,GPU-ffffffff,0", [(1, 0)]),
        ("2,7", [(2, 0)]),
    ],
)
def test_cuda_visible_devices_is_read_as_cuda_reads_it(setting: str | None, visible: list[tuple[int, int]]) -> None:
    assert _visible(setting) == visible


def test_the_gpus_left_out_are_named_with_why() -> None:
    visibility = resolve_visibility(GPUS, {"CUDA_VISIBLE_DEVICES": "0,2"}, one_model=True)
    assert visibility.left_out() == (
        "CUDA_VISIBLE_DEVICES=0,2: GPU 1 (0000:00:07.0), GPU 3 (0000:00:09.0) are not visible, not judged"
    )
    stopped = resolve_visibility(GPUS, {"CUDA_VISIBLE_DEVICES": "0,2,-1,1"}, one_model=True)
    assert "CUDA stops reading it at '-1', which names no GPU of this machine" in (stopped.left_out() or "")
    assert resolve_visibility(GPUS, {}, one_model=True).left_out() is None


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("", "leaves no GPU visible ('' names no GPU of this machine): nothing can be measured"),
        ("-1", "leaves no GPU visible ('-1' names no GPU of this machine)"),
        ("GPU-00000000-dead", "leaves no GPU visible ('GPU-00000000-dead' names no GPU of this machine)"),
        (
            "GPU-5",
            "leaves no GPU visible ('GPU-5' names no GPU of this machine)",
        ),  # GPU-5452..., GPU-513e...: ambiguous
        ("0,2,0", "names GPU 0 (0000:00:06.0) twice ('0'): name each GPU once"),
        (f"1,{UUID[1]}", "names GPU 1 (0000:00:07.0) twice"),
        ("MIG-5452adaa-064a-d5c2-4196-6e08c384edd8", "names the MIG instance"),
        (f"0,MIG-{UUID[2]}/1/0", "smoke-test measures whole GPUs"),
    ],
)
def test_a_setting_that_names_nothing_a_gpu_twice_or_a_mig_instance_is_an_input_error(
    setting: str, message: str
) -> None:
    with pytest.raises(InputError) as refused:
        resolve_visibility(GPUS, {"CUDA_VISIBLE_DEVICES": setting}, one_model=True)
    assert message in str(refused.value) and refused.value.exit_code == EXIT_UNUSABLE
    if "names no GPU" in message:  # the listing tells the operator what there is to name
        assert UUID[3] in str(refused.value)


def test_an_index_on_a_machine_of_several_models_needs_the_pci_order() -> None:
    with pytest.raises(InputError, match=r"set CUDA_DEVICE_ORDER=PCI_BUS_ID .* or name the GPUs by UUID"):
        resolve_visibility(GPUS, {"CUDA_VISIBLE_DEVICES": "1"}, one_model=False)
    pci_order = {"CUDA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert [g.index for g in resolve_visibility(GPUS, pci_order, one_model=False).visible] == [1]
    by_uuid = {"CUDA_VISIBLE_DEVICES": UUID[1]}
    assert [g.index for g in resolve_visibility(GPUS, by_uuid, one_model=False).visible] == [1]


def test_visibility_of_a_recorded_environment_knows_its_models() -> None:
    environment = read_recorded(json.loads((WALL / "all-1.json").read_text())["gpus"][0]).environment
    assert [g.index for g in visibility_of(environment, {"CUDA_VISIBLE_DEVICES": "3,1"}).visible] == [3, 1]


@pytest.mark.parametrize("selector", ["2", UUID[2], "GPU-5452adaa", "0000:00:08.0", "00000000:00:08.0"])
def test_device_takes_nvml_s_index_a_uuid_or_a_pci_address(selector: str) -> None:
    visibility = resolve_visibility(GPUS, {"CUDA_VISIBLE_DEVICES": "0,2"}, one_model=True)
    chosen = visibility.select(selector)
    assert (chosen.index, chosen.cuda_ordinal) == (2, 1)


def test_no_device_is_cuda_s_device_0_and_a_hidden_or_unknown_one_is_refused() -> None:
    visibility = resolve_visibility(GPUS, {"CUDA_VISIBLE_DEVICES": "3,1"}, one_model=True)
    assert visibility.select(None).index == 3
    with pytest.raises(InputError, match=r"--device '2': GPU 2 \(0000:00:08.0\) is not visible to CUDA under "):
        visibility.select("2")
    with pytest.raises(InputError, match="--device '7' names no GPU of this guest"):
        visibility.select("7")
    with pytest.raises(InputError, match="--device 'GPU-5' names several GPUs"):
        visibility.select("GPU-5")


def test_each_suite_process_is_pinned_to_its_gpus_by_uuid() -> None:
    env = suite_environment((GPUS[2], GPUS[0]), {"CUDA_VISIBLE_DEVICES": "0,2", "PATH": "/usr/bin"})
    assert env["CUDA_VISIBLE_DEVICES"] == f"{UUID[2]},{UUID[0]}"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" and env["PATH"] == "/usr/bin"
    with pytest.raises(GpuMismatch, match="NVML gave no UUID for GPU 1"):
        suite_environment((GpuIdentity(1, "", "0000:00:07.0"),), {})


def _node_suite() -> dict[str, Any]:
    """The two-H200 guest's node suite document (P2P matrix and host copies), CUDA devices 0 and 1."""
    document = json.loads((FIXTURES / "h200x2-node" / "all-1.json").read_text())
    return document["node"]["record"]["suite"]  # type: ignore[no-any-return]


def test_a_node_document_of_the_gpus_0_and_2_is_in_nvml_s_numbering() -> None:
    suite = _node_suite()
    assert suite["device"]["pci_bus_id"] == "0000:00:06.0"  # CUDA device 0 of that run: GPU 0
    again = in_machine_numbering(suite, (GPUS[0], GPUS[2]))
    names = [r["name"] for r in again["results"]]
    assert "p2p_pair_0_to_2" in names and "p2p_pair_2_to_0" in names and "p2p_bidir_0_2" in names
    assert not any(re.search(r"(^|_)1(_|$)", name) for name in names if name.startswith("p2p_"))
    pair = next(r for r in again["results"] if r["name"] == "p2p_pair_2_to_0")
    assert (pair["params"]["src"], pair["params"]["dst"]) == (2, 0)
    shares = [r for r in again["results"] if r.get("extra", {}).get("per_gpu")]
    assert shares and all([p["gpu"] for p in r["extra"]["per_gpu"]] == [0, 2] for r in shares)
    assert again["device"]["index"] == 0
    # The values are the measurements as they were: only the names moved.
    assert [r["value"] for r in again["results"]] == [r["value"] for r in suite["results"]]


def test_a_suite_that_measured_another_gpu_is_an_error_naming_both_never_a_verdict() -> None:
    with pytest.raises(GpuMismatch) as mismatch:
        in_machine_numbering(_node_suite(), (GPUS[2], GPUS[3]))
    assert str(mismatch.value).startswith(
        f"the kernel suite started for GPU 2 (0000:00:08.0) {UUID[2]} measured the GPU at PCI 0000:00:06.0"
    )
    assert mismatch.value.exit_code == EXIT_UNUSABLE
    with pytest.raises(GpuMismatch, match="measured CUDA device 0, but it was started with 0 GPU"):
        in_machine_numbering(_node_suite(), ())


def test_renumbering_writes_a_both_ways_pair_lower_gpu_first() -> None:
    again = renumbered(_node_suite(), {0: 3, 1: 1})
    names = {r["name"] for r in again["results"]}
    assert {"p2p_pair_3_to_1", "p2p_pair_1_to_3", "p2p_bidir_1_3"} <= names


def test_all_with_device_is_an_input_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["smoke-test", "--all", "--device", "1"]) == EXIT_UNUSABLE
    err = capsys.readouterr().err
    assert "--all judges every visible GPU and --device 1 one: give one of them" in err
    assert "Traceback" not in err
