"""The shipped example inventory is read through Ansible and every value in it validates."""

from __future__ import annotations

from pathlib import Path

from gpuhost.targets import ConnectionDefaults, inventory_targets

EXAMPLE = Path(__file__).resolve().parents[2] / "inventory.example.yml"


def test_example_inventory_validates(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh/id_ed25519").write_text("placeholder: only its existence is checked before connecting\n")
    targets = {t.name: t for t in inventory_targets(EXAMPLE, None, ConnectionDefaults())}
    assert set(targets) == {"gpu01", "gpu02", "gpu03"}
    assert targets["gpu02"].ssh.port == 2222 and targets["gpu02"].policy.allow_shared_group == ("0000:41:00.0",)
    assert targets["gpu03"].ssh.user == "ops"
    assert targets["gpu03"].policy.gpus.addresses == ("0000:41:00.0", "0000:c1:00.0")
    assert targets["gpu01"].policy.gpus.select_all_nvidia
    assert targets["gpu01"].ssh.known_hosts_file == tmp_path / ".ssh/known_hosts"
    limited = inventory_targets(EXAMPLE, "gpu02", ConnectionDefaults())
    assert [t.name for t in limited] == ["gpu02"]


def test_each_host_configuration_is_read_once_into_one_typed_value(monkeypatch, tmp_path):
    """What audit, plan/apply, render and guest read of a host, parsed when the inventory is."""
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh/id_ed25519").write_text("placeholder: only its existence is checked before connecting\n")
    targets = {t.name: t for t in inventory_targets(EXAMPLE, None, ConnectionDefaults(gpus="10de:2330"))}
    gpu01 = targets["gpu01"].require_config()
    assert gpu01.audit is targets["gpu01"].policy
    assert gpu01.plan.gpus.vendor_devices == ("10de:2330",)  # --gpus overrides gpuhost_gpus, for plan too
    assert gpu01.plan.trial_panic_seconds == 10 and gpu01.plan.bind_by == "auto"
    assert gpu01.render.reserved_cpus == "0-1,64-65"
    assert gpu01.vm("train-1", "gpu01").vcpus == 16
    assert targets["gpu02"].require_config().render.allow_shared_group == ("0000:41:00.0",)


def test_example_vms_validate():
    from gpuhost.inventory.spec import parse_vms
    from gpuhost.targets import load_inventory

    variables = dict(load_inventory(EXAMPLE, "gpu01"))["gpu01"]
    (vm,) = parse_vms(variables["gpuhost_vms"], "inventory host gpu01")
    assert vm.name == "train-1" and vm.vcpus == 16
