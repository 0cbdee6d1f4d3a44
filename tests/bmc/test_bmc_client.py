"""gpuhost.transport.bmc against real BMC endpoints on 127.0.0.1 (tests/bmc/emulators.py): sushy-tools'
Redfish emulator over HTTPS with basic auth, and OpenIPMI's ipmi_sim over RMCP+. No protocol is mocked:
each power cycle is read back from the endpoint (its power state, its log, the VM commands it sent)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuhost.transport.bmc import (
    BmcCredentialsRejected,
    BmcEndpoint,
    BmcError,
    BmcProtocol,
    BmcTlsError,
    BmcUnreachable,
    BmcUnsupported,
    PowerState,
    power_cycle,
    power_state,
)
from tests.bmc.emulators import (
    IPMI_USER,
    REDFISH_USER,
    SYSTEM_ID,
    IpmiSimulator,
    RedfishEmulator,
    free_port,
    ipmi_simulator,
    redfish_emulator,
)

REDFISH_PASSWORD = "Rf-Secret-7319"
IPMI_PASSWORD = "Ipmi-Sec-4471"


@pytest.fixture
def redfish(tmp_path: Path) -> Iterator[RedfishEmulator]:
    with redfish_emulator(tmp_path / "redfish", REDFISH_PASSWORD) as emulator:
        yield emulator


@pytest.fixture
def ipmi(tmp_path: Path) -> Iterator[IpmiSimulator]:
    with ipmi_simulator(tmp_path / "ipmi", IPMI_PASSWORD) as simulator:
        yield simulator


def redfish_endpoint(emulator: RedfishEmulator, **changes: object) -> BmcEndpoint:
    fields: dict[str, object] = {
        "protocol": BmcProtocol.REDFISH,
        "host": "127.0.0.1",
        "port": emulator.port,
        "user": REDFISH_USER,
        "ca_bundle": str(emulator.certificate),
        **changes,
    }
    return BmcEndpoint(**fields)  # type: ignore[arg-type]


def ipmi_endpoint(simulator: IpmiSimulator, **changes: object) -> BmcEndpoint:
    fields: dict[str, object] = {
        "protocol": BmcProtocol.IPMI,
        "host": "127.0.0.1",
        "port": simulator.port,
        "user": IPMI_USER,
        **changes,
    }
    return BmcEndpoint(**fields)  # type: ignore[arg-type]


def assert_no_password(error: BmcError, password: str) -> None:
    assert password not in str(error) and password not in repr(error.args)


def test_redfish_power_cycle_is_a_force_restart_the_emulator_carries_out(redfish: RedfishEmulator) -> None:
    endpoint = redfish_endpoint(redfish)
    assert power_state(endpoint, REDFISH_PASSWORD, "gpu01") is PowerState.ON
    cycle = power_cycle(endpoint, REDFISH_PASSWORD, "gpu01")
    assert (cycle.action, cycle.state_before) == ("ForceRestart", PowerState.ON)
    # The emulator accepted one reset of the system (its access log); its fake driver powers the
    # system off at once and on again 1 to 11 s later (seen Off only when read in between).
    assert redfish.resets() == 1
    seen = [redfish.power_state()]
    deadline = time.monotonic() + 30
    while seen[-1] != "On":
        assert time.monotonic() < deadline, f"the emulated system did not power on again within 30 s: {seen}"
        time.sleep(0.5)
        seen.append(redfish.power_state())
    assert REDFISH_PASSWORD not in redfish.log.read_text()


def test_redfish_system_that_is_off_is_powered_on(redfish: RedfishEmulator) -> None:
    endpoint = redfish_endpoint(redfish)
    redfish.power_off()
    assert power_state(endpoint, REDFISH_PASSWORD, "gpu01") is PowerState.OFF
    cycle = power_cycle(endpoint, REDFISH_PASSWORD, "gpu01")
    assert (cycle.action, cycle.state_before) == ("On", PowerState.OFF)
    assert redfish.resets() == 2  # the test's ForceOff, and gpuhost's On


def test_redfish_without_tls_verification_still_works_when_asked(redfish: RedfishEmulator) -> None:
    endpoint = redfish_endpoint(redfish, ca_bundle=None, verify_tls=False)
    assert power_state(endpoint, REDFISH_PASSWORD, "gpu01") is PowerState.ON


def test_redfish_wrong_password_is_a_credentials_error_and_nothing_is_reset(redfish: RedfishEmulator) -> None:
    wrong = "Wrong-Pw-5520"
    with pytest.raises(BmcCredentialsRejected) as raised:
        power_cycle(redfish_endpoint(redfish), wrong, "gpu01")
    message = str(raised.value)
    assert "host gpu01" in message and f"https://127.0.0.1:{redfish.port}" in message and "gpuhost_bmc.user" in message
    assert_no_password(raised.value, wrong)
    assert redfish.resets() == 0 and redfish.power_state() == "On"


def test_redfish_certificate_no_ca_trusts_is_a_tls_error(redfish: RedfishEmulator) -> None:
    with pytest.raises(BmcTlsError) as raised:
        power_cycle(redfish_endpoint(redfish, ca_bundle=None), REDFISH_PASSWORD, "gpu01")
    assert "CERTIFICATE_VERIFY_FAILED" in str(raised.value) and "gpuhost_bmc.ca_bundle" in str(raised.value)
    assert_no_password(raised.value, REDFISH_PASSWORD)
    assert redfish.resets() == 0


def test_redfish_unknown_system_is_named(redfish: RedfishEmulator) -> None:
    with pytest.raises(BmcUnsupported, match="no system 'not-there'"):
        power_state(redfish_endpoint(redfish, system="not-there"), REDFISH_PASSWORD, "gpu01")
    assert power_state(redfish_endpoint(redfish, system=SYSTEM_ID), REDFISH_PASSWORD, "gpu01") is PowerState.ON


def test_redfish_port_nothing_listens_on_is_unreachable_at_once() -> None:
    endpoint = BmcEndpoint(BmcProtocol.REDFISH, "127.0.0.1", free_port(), REDFISH_USER)
    started = time.monotonic()
    with pytest.raises(BmcUnreachable, match=r"host gpu01: BMC https://127\.0\.0\.1:"):
        power_cycle(endpoint, REDFISH_PASSWORD, "gpu01", timeout=5)
    assert time.monotonic() - started < 10


def test_ipmi_power_cycle_reaches_the_host_as_ipmi_sims_power_off(ipmi: IpmiSimulator) -> None:
    endpoint = ipmi_endpoint(ipmi)
    assert power_state(endpoint, IPMI_PASSWORD, "gpu01") is PowerState.ON
    cycle = power_cycle(endpoint, IPMI_PASSWORD, "gpu01")
    assert (cycle.action, cycle.state_before) == ("chassis power cycle", PowerState.ON)
    deadline = time.monotonic() + 10
    while not ipmi.vm_commands:
        assert time.monotonic() < deadline, "ipmi_sim sent the host nothing within 10 s"
        time.sleep(0.2)
    # ipmi_sim carries out a power cycle as power off to the VM, and the power on through its
    # startcmd (QEMU started again), which this peer has none of.
    assert ipmi.vm_commands == ["power off"]


def test_ipmi_hard_reset_when_asked_reaches_the_host_as_ipmi_sims_reset(ipmi: IpmiSimulator) -> None:
    cycle = power_cycle(ipmi_endpoint(ipmi, ipmi_hard_reset=True), IPMI_PASSWORD, "gpu01")
    assert (cycle.action, cycle.state_before) == ("chassis hard reset", PowerState.ON)
    deadline = time.monotonic() + 10
    while not ipmi.vm_commands:
        assert time.monotonic() < deadline, "ipmi_sim sent the host nothing within 10 s"
        time.sleep(0.2)
    assert ipmi.vm_commands == ["reset"]


def test_ipmi_wrong_password_is_a_credentials_error(ipmi: IpmiSimulator) -> None:
    wrong = "Wrong-Ipmi-9043"
    with pytest.raises(BmcCredentialsRejected) as raised:
        power_cycle(ipmi_endpoint(ipmi), wrong, "gpu01")
    assert f"ipmi://127.0.0.1:{ipmi.port}" in str(raised.value) and "host gpu01" in str(raised.value)
    assert_no_password(raised.value, wrong)
    assert ipmi.vm_commands == []


def test_ipmi_wrong_user_is_a_credentials_error(ipmi: IpmiSimulator) -> None:
    with pytest.raises(BmcCredentialsRejected, match="refused the user 'nobody'"):
        power_state(ipmi_endpoint(ipmi, user="nobody"), IPMI_PASSWORD, "gpu01")


def test_ipmi_port_nothing_answers_on_is_unreachable_within_the_timeout() -> None:
    endpoint = BmcEndpoint(BmcProtocol.IPMI, "127.0.0.1", free_port(), IPMI_USER)
    started = time.monotonic()
    with pytest.raises(BmcUnreachable, match=r"host gpu01: BMC ipmi://127\.0\.0\.1:"):
        power_cycle(endpoint, IPMI_PASSWORD, "gpu01", timeout=3)
    assert time.monotonic() - started < 6
