"""gpuhost_bmc in the inventory: validated with every other gpuhost_* value, before anything connects,
with errors naming the host, the key, the value and the fix; the password is read only when used."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuhost.cli.main import main
from gpuhost.errors import InputError
from gpuhost.inventory.bmc import PASSWORD_NOT_READ, bmc_password, check_password_source, parse_bmc
from gpuhost.targets import ConnectionDefaults, inventory_targets
from gpuhost.transport.bmc import BmcEndpoint, BmcProtocol

WHERE = "inventory host gpu01"


def bmc(**values: object) -> dict[str, Any]:
    return {"gpuhost_bmc": {"protocol": "redfish", "address": "https://10.0.9.11", "user": "power", **values}}


@pytest.mark.parametrize(
    ("variables", "expected"),
    [
        (
            bmc(password_env="GPU01_BMC"),
            BmcEndpoint(BmcProtocol.REDFISH, "10.0.9.11", 443, "power", password_env="GPU01_BMC"),
        ),
        (
            bmc(address="bmc-gpu01.example:8443", verify_tls=False, system="System.Embedded.1", password_env="P"),
            BmcEndpoint(BmcProtocol.REDFISH, "bmc-gpu01.example", 8443, "power", False, None, "System.Embedded.1", "P"),
        ),
        (
            {**bmc(protocol="ipmi", address="[fd00::9]"), "gpuhost_bmc_password": PASSWORD_NOT_READ},
            BmcEndpoint(BmcProtocol.IPMI, "fd00::9", 623, "power"),
        ),
        (
            {**bmc(protocol="ipmi", address="10.0.9.12:1623"), "gpuhost_bmc_password": "x"},
            BmcEndpoint(BmcProtocol.IPMI, "10.0.9.12", 1623, "power"),
        ),
        (
            bmc(protocol="ipmi", address="10.0.9.12", chassis_control="hard-reset", password_env="P"),
            BmcEndpoint(BmcProtocol.IPMI, "10.0.9.12", 623, "power", password_env="P", ipmi_hard_reset=True),
        ),
        ({}, None),
    ],
)
def test_valid_gpuhost_bmc_is_parsed(variables: dict[str, Any], expected: BmcEndpoint | None) -> None:
    assert parse_bmc(variables, WHERE) == expected


@pytest.mark.parametrize(
    ("variables", "words"),
    [
        (bmc(password_env="P", protocol="snmp"), ["gpuhost_bmc.protocol", "'snmp'", "redfish, ipmi"]),
        (bmc(password_env="P", address="http://10.0.9.11"), ["gpuhost_bmc.address", "plain HTTP", "https://"]),
        (bmc(password_env="P", address="10.0.9.11;reboot"), ["gpuhost_bmc.address", "names no host"]),
        (bmc(password_env="P", address="$(id)"), ["gpuhost_bmc.address", "'$(id)'"]),
        (bmc(password_env="P", address="10.0.9.11:70000"), ["gpuhost_bmc.address", "port 70000"]),
        (bmc(password_env="P", protocol="ipmi", address="fd00::9"), ["brackets"]),
        (bmc(password_env="P", user="root\nhunter2"), ["gpuhost_bmc.user", "(a value of 12 characters, not shown)"]),
        (bmc(password_env="P", user=""), ["gpuhost_bmc.user"]),
        (bmc(password_env="hunter2!"), ["gpuhost_bmc.password_env", "not shown"]),
        # Issue 46.6: a user and password in the address are never echoed, nor called an IPv6 address.
        (bmc(password_env="P", address="https://admin:hunter2@bmc"), ["<user:password hidden>@bmc", "put the user"]),
        (bmc(password_env="P", address="admin:hunter2@[fd00::9]:443"), ["<user:password hidden>@[fd00::9]:443"]),
        (bmc(password_env="P", address="http://root:hunter2@10.0.9.11"), ["'http://<user:password hidden>@10.0.9.11'"]),
        (bmc(password_env="P", protocol="ipmi", address="hunter2@10.0.9.12"), ["'<user:password hidden>@10.0.9.12'"]),
        ({"gpuhost_bmc": "https://admin:hunter2@bmc"}, ["a mapping", "(a value of 25 characters, not shown)"]),
        (bmc(), ["no password source", "gpuhost_bmc_password", "password_env"]),
        ({**bmc(password_env="P"), "gpuhost_bmc_password": "x"}, ["both"]),
        (bmc(password_env="P", password="hunter2"), ["unknown key(s) 'password'", "never a key here"]),
        (bmc(password_env="P", verify_tls="no"), ["gpuhost_bmc.verify_tls", "true or false"]),
        (bmc(password_env="P", ca_bundle="relative.pem"), ["gpuhost_bmc.ca_bundle", "absolute path"]),
        (bmc(password_env="P", ca_bundle="/nonexistent/ca.pem"), ["gpuhost_bmc.ca_bundle", "not a file"]),
        (bmc(password_env="P", system="../../x"), ["gpuhost_bmc.system"]),
        (bmc(password_env="P", protocol="ipmi", address="10.0.9.11", system="S1"), ["Redfish only"]),
        (bmc(password_env="P", protocol="ipmi", address="h", chassis_control="off"), ["power-cycle, hard-reset"]),
        (bmc(password_env="P", chassis_control="hard-reset"), ["gpuhost_bmc.chassis_control", "IPMI only"]),
        ({"gpuhost_bmc": "https://10.0.9.11"}, ["a mapping"]),
        ({"gpuhost_bmc_password": "x"}, ["gpuhost_bmc_password is set but gpuhost_bmc is not"]),
    ],
)
def test_invalid_gpuhost_bmc_names_the_host_the_key_and_the_fix(variables: dict[str, Any], words: list[str]) -> None:
    with pytest.raises(InputError) as raised:
        parse_bmc(variables, WHERE)
    message = str(raised.value)
    assert message.startswith(f"{WHERE}: gpuhost_bmc"), message
    for word in words:
        assert word in message, (word, message)
    assert "hunter2" not in message
    assert "IPv6" not in message or "hunter2" not in repr(variables), message


def test_the_password_comes_from_the_named_environment_variable_or_the_vault() -> None:
    from_env = BmcEndpoint(BmcProtocol.IPMI, "10.0.9.12", 623, "power", password_env="GPU01_BMC")
    assert bmc_password(from_env, None, WHERE, {"GPU01_BMC": "s3cret-env"}) == "s3cret-env"
    with pytest.raises(InputError, match="names GPU01_BMC, which is not set") as raised:
        check_password_source(from_env, WHERE, {})
    vaulted = BmcEndpoint(BmcProtocol.IPMI, "10.0.9.12", 623, "power")
    assert bmc_password(vaulted, "s3cret-vault", WHERE, {}) == "s3cret-vault"
    with pytest.raises(InputError, match="ANSIBLE_VAULT_PASSWORD_FILE"):
        bmc_password(vaulted, PASSWORD_NOT_READ, WHERE, {})
    assert "s3cret" not in str(raised.value)


def _vaulted(secret: str, vault_password: str) -> str:
    from ansible.parsing.vault import VaultLib, VaultSecret

    return VaultLib([("default", VaultSecret(vault_password.encode()))]).encrypt(secret).decode()


def test_a_vaulted_password_is_not_decrypted_when_the_controller_reads_the_inventory(tmp_path: Path) -> None:
    """No vault secret is given: the inventory still reads, and the password stays encrypted."""
    secret = "Vaulted-Bmc-8812"
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(
        "all:\n  hosts:\n    gpu01:\n      ansible_connection: local\n"
        "      gpuhost_bmc: {protocol: ipmi, address: 10.0.9.12, user: power}\n"
        "      gpuhost_bmc_password: !vault |\n"
        + "".join(f"        {line}\n" for line in _vaulted(secret, "vault-pass-1").splitlines())
    )
    (target,) = inventory_targets(inventory, "gpu01", ConnectionDefaults())
    assert target.require_config().bmc == BmcEndpoint(BmcProtocol.IPMI, "10.0.9.12", 623, "power")
    assert target.variables["gpuhost_bmc_password"] == PASSWORD_NOT_READ
    assert secret not in repr(target)


def test_apply_refuses_a_password_env_that_is_not_set_before_any_connection(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GPUHOST_TEST_UNSET_BMC", raising=False)
    host = {
        "ansible_host": "192.0.2.1",  # TEST-NET-1: nothing answers, and nothing may be tried
        **bmc(protocol="ipmi", address="192.0.2.2", password_env="GPUHOST_TEST_UNSET_BMC"),
    }
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"gpu01": host}}}))
    code = main(["apply", "-i", str(inventory), "--yes", "--report", str(tmp_path / "report.json")])
    error = capsys.readouterr().err
    assert code == 2 and "gpu01" in error and "GPUHOST_TEST_UNSET_BMC" in error and "not set" in error
    assert not (tmp_path / "report.json").exists()


def test_a_vaulted_password_needs_a_vault_password_given_before_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 46.6: Ansible decrypts the password only when the BMC must power-cycle a host (nothing
    may ask for the vault's password then): apply and apply --check refuse a run that gives none."""
    for name in ("ANSIBLE_VAULT_PASSWORD_FILE", "ANSIBLE_VAULT_IDENTITY_LIST"):
        monkeypatch.delenv(name, raising=False)
    vaulted = BmcEndpoint(BmcProtocol.REDFISH, "10.0.9.11", 443, "power")
    with pytest.raises(InputError, match="no vault password is given to the run"):
        check_password_source(vaulted, WHERE, {})
    password_file = tmp_path / "vault-pass"
    password_file.write_text("vault-pass-1\n")
    monkeypatch.setenv("ANSIBLE_VAULT_PASSWORD_FILE", str(password_file))
    check_password_source(vaulted, WHERE, {})
