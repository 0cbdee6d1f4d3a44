"""`guest up` maps the guest's smoke-test back to the host slots the domain passed.

The reports are real guests' `smoke-test --json`: the two-H200 guest's --all (tests/fixtures/
h200x2-node, GPUs at guest 0000:00:06.0 and 07.0), a one-H200 guest's one-GPU run
(tests/fixtures/h200-identity), and the four-H100 guest's --all with a GPU that could not run.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

from gpuhost.guest.slots import PassedGpu, match_report, passed_gpus
from gpuhost.inventory.spec import parse_vm
from gpuhost.render.domain import plan_domain
from gpuhost.render.xml import METADATA_NS, render_plan
from tests.helpers import FIXTURES
from tests.render.test_domain import CASES

TWO = (PassedGpu("0000:41:00.0", "0000:00:06.0"), PassedGpu("0000:c1:00.0", "0000:00:07.0"))


def _report(path: str) -> bytes:
    return (FIXTURES / path).read_bytes()


def test_each_passed_gpu_is_found_in_the_guest_at_its_address_with_its_verdict() -> None:
    rows = match_report(TWO, _report("h200x2-node/all-1.json"))
    assert rows is not None
    assert [(r.host_address, r.seen, r.index, r.verdict) for r in rows] == [
        ("0000:41:00.0", True, 0, "PASS"),
        ("0000:c1:00.0", True, 1, "PASS"),
    ]


def test_a_gpu_the_guest_does_not_show_is_named_by_its_host_slot() -> None:
    three = (*TWO, PassedGpu("0000:d1:00.0", "0000:00:08.0"))
    rows = match_report(three, _report("h200x2-node/all-1.json"))
    assert rows is not None
    missing = [r for r in rows if not r.seen]
    assert [r.describe() for r in missing] == ["host slot 0000:d1:00.0 (guest 0000:00:08.0)"]
    assert missing[0].verdict is None and missing[0].index is None


def test_a_one_gpu_run_names_its_gpu_its_uuid_and_its_verdict() -> None:
    (row,) = match_report((PassedGpu("0000:41:00.0", "0000:00:06.0"),), _report("h200-identity/unset-one.json")) or ()
    assert (row.seen, row.index, row.uuid, row.verdict) == (True, 0, "GPU-d4e3a02e-e949-ae50-e3df-9ad944749bce", "PASS")


def test_a_gpu_seen_but_stopped_is_seen_with_its_fail() -> None:
    document = json.loads(_report("h100x4/quick-1.json"))
    document["verdicts"][1] = {"gpu": 1, "status": "FAIL", "outcome": "CANNOT RUN", "reason": "stand-in"}
    passed = tuple(PassedGpu(f"0000:{0x41 + i:02x}:00.0", f"0000:00:0{6 + i}.0") for i in range(4))
    rows = match_report(passed, json.dumps(document).encode()) or ()
    assert [(r.seen, r.verdict) for r in rows] == [(True, "PASS"), (True, "CANNOT RUN"), (True, "PASS"), (True, "PASS")]


def test_a_report_that_lists_no_gpu_says_nothing_of_the_slots() -> None:
    failure = {"schema": "gpuhost-smoke-test/1", "outcome": "CANNOT RUN", "environment": None, "reason": "no driver"}
    assert match_report(TWO, json.dumps(failure).encode()) is None
    assert match_report(TWO, None) is None
    assert match_report(TWO, b"not json") is None


def test_the_rendered_metadata_and_the_plan_agree_on_every_gpus_guest_address() -> None:
    build, policy, entry = CASES["lab-two-gpus"]
    plan = plan_domain(build(), parse_vm(entry, "test"), policy, host="lab")
    xml = render_plan(plan)
    metadata = ET.fromstring(xml[xml.index("<domain") :]).iter(f"{{{METADATA_NS}}}gpu")
    assert {(g.get("address"), g.get("guest-address")) for g in metadata} == {
        (gpu.host_address, gpu.guest_address) for gpu in passed_gpus(plan)
    }
    assert [gpu.guest_address for gpu in passed_gpus(plan)] == ["0000:01:00.0", "0000:02:00.0"]
