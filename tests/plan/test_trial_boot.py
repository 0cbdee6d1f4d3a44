"""Trial boot, grubenv refusal, modprobe conflicts, forced refusals and the GRUB shell variants, as data.

Real text throughout: the lab host's capture, a real /proc/mounts with /boot on btrfs
(tests/fixtures/mounts/boot-on-btrfs.txt, captured with `unshare -m` and a loop-mounted btrfs on
/boot), the lab image's /etc/default/grub and variants of it put through the gather script's own
GRUB block and through the drop-in with sh.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from gpuhost.errors import InputError
from gpuhost.facts.build import build_facts
from gpuhost.facts.snapshot import SnapshotTree
from gpuhost.inventory.plan_settings import FORCE_PAST_REFUSALS_ENV, TRIAL_TESTING_OPTIONS_ENV
from gpuhost.plan import PlanSettings, plan_host
from gpuhost.plan.model import TRIAL_MARKER
from gpuhost.plan.rescue import KERNEL_STALL_OPTIONS
from tests.helpers import FIXTURES, SNAPSHOTS

LAB_VARS = {"gpuhost_gpus": ["1234:1111"], "gpuhost_hugepages": 1}
GATHER = Path(__file__).resolve().parents[2] / "gpuhost/facts/gather.sh"
LAB_GRUB = (SNAPSHOTS / "lab-gpu-pair-fresh/etc/default/grub").read_text()


def lab_copy(tmp_path: Path) -> Path:
    root = tmp_path / "snapshot"
    shutil.copytree(SNAPSHOTS / "lab-gpu-pair-fresh", root)
    return root


def plan_of(root: Path, **variables: object):
    facts = build_facts(SnapshotTree(root))
    return plan_host("lab-1", facts, PlanSettings.from_variables({**LAB_VARS, **variables}, "inventory host lab-1"))


def source(*files: str, after: str = "") -> str:
    script = "".join(f". {f}\n" for f in files) + after
    script += 'printf "%s %s" "$GRUB_CMDLINE_LINUX" "$GRUB_CMDLINE_LINUX_DEFAULT"'
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True).stdout


def test_trial_settings_are_the_dropin_plus_panic_and_the_marker(tmp_path: Path) -> None:
    result = plan_of(lab_copy(tmp_path))
    assert result.trial.enabled and result.trial.panic_seconds == 10 and result.reboot_needed
    grub = tmp_path / "grub"
    grub.write_text(LAB_GRUB)
    (tmp_path / "dropin.cfg").write_text(result.grub_dropin)
    (tmp_path / "trial.cfg").write_text(result.trial.settings)
    default_line = source(str(grub), str(tmp_path / "dropin.cfg"))
    trial_line = source(str(grub), str(tmp_path / "trial.cfg"))
    assert " ".join(default_line.split()) == result.desired_grub_line
    assert trial_line.split() == [
        *result.desired_grub_line.split(),
        "panic=10",
        TRIAL_MARKER,
        *KERNEL_STALL_OPTIONS,
        "systemd.wants=gpuhost-trial-deadline.timer",
    ]
    assert "panic=" not in default_line and TRIAL_MARKER not in default_line
    # The rescues are the trial entry's alone: the default entry never gets them.
    assert not set(result.rescue.kernel_options) & set(default_line.split())
    # The GRUB script that builds the entry reads exactly that file, and names the entry grub-reboot boots.
    assert "[ -r /etc/default/gpuhost-trial.cfg ] || exit 0" in result.trial.grub_script
    assert "'gpuhost-trial'" in result.trial.grub_script and "/etc/grub.d/10_linux" in result.trial.grub_script
    assert result.to_json()["paths"]["trial_grub_script"] == "/etc/grub.d/42_gpuhost_trial"


def test_ext4_boot_allows_the_trial_and_btrfs_boot_is_refused_unless_no_trial(tmp_path: Path) -> None:
    root = lab_copy(tmp_path)
    assert plan_of(root).applicable and "/dev/vda1 (ext4" in plan_of(root).trial.boot_filesystem
    (root / "proc/mounts").write_text((FIXTURES / "mounts/boot-on-btrfs.txt").read_text())
    refused = plan_of(root)
    assert [r.code for r in refused.refusals] == ["plan.trial.grubenv_unwritable"]
    assert "/dev/loop0 (btrfs, mounted on /boot)" in refused.refusals[0].message
    assert "--no-trial" in refused.refusals[0].remedy
    without = plan_of(root, gpuhost_trial_boot=False)
    assert without.applicable and without.trial.enabled is False
    # gpuhost plan says how the host will boot.
    from gpuhost.cli.views import describe_plan

    assert any("boot: straight into the new command line" in line for line in describe_plan(without))
    (root / "proc/mounts").write_text((SNAPSHOTS / "lab-gpu-pair-fresh/proc/mounts").read_text())
    assert any(
        line.startswith("  boot: trial first, the one-shot GRUB entry 'gpuhost-trial' with panic=10")
        for line in describe_plan(plan_of(root))
    )


def test_modprobe_vfio_ids_conflict_is_planned_out_and_backed_up(tmp_path: Path) -> None:
    root = lab_copy(tmp_path)
    modprobe = root / "etc/modprobe.d"
    modprobe.mkdir(parents=True, exist_ok=True)
    (modprobe / "vfio.conf").write_text("# an older passthrough setup\noptions vfio-pci ids=10de:1b80 disable_vga=1\n")
    result = plan_of(root)
    assert [(c.path, c.line_number) for c in result.modprobe_conflicts] == [("/etc/modprobe.d/vfio.conf", 2)]
    assert "/etc/modprobe.d/vfio.conf" in result.backup_files
    assert any("modprobe.d sets its own vfio-pci ids" in reason for reason in result.reboot_reasons)


def test_forcing_past_a_refusal_needs_the_testing_only_environment_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = lab_copy(tmp_path)
    assert [r.code for r in plan_of(root, gpuhost_hugepages=64).refusals] == ["plan.hugepages.too_many"]
    monkeypatch.setenv(FORCE_PAST_REFUSALS_ENV, "plan.hugepages.too_many")
    forced = plan_of(root, gpuhost_hugepages=64)
    assert forced.applicable and "hugepages=64" in forced.kernel_options
    forced_note = "TESTING ONLY: forced past the refusal plan.hugepages.too_many"
    assert any(note.startswith(forced_note) for note in forced.notes)
    monkeypatch.setenv(FORCE_PAST_REFUSALS_ENV, "plan.hugepages.too_many;reboot")
    with pytest.raises(InputError, match=FORCE_PAST_REFUSALS_ENV):
        plan_of(root)
    monkeypatch.setenv(FORCE_PAST_REFUSALS_ENV, "hugepages.too_many")  # its name before issue 29
    with pytest.raises(InputError, match="is not a refusal code"):
        plan_of(root)


def test_testing_only_trial_options_go_on_the_trial_entry_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = lab_copy(tmp_path)
    monkeypatch.setenv(TRIAL_TESTING_OPTIONS_ENV, "rdinit=/gpuhost-fault-injection")
    result = plan_of(root)
    grub = tmp_path / "grub"
    grub.write_text(LAB_GRUB)
    (tmp_path / "trial.cfg").write_text(result.trial.settings)
    (tmp_path / "dropin.cfg").write_text(result.grub_dropin)
    assert source(str(grub), str(tmp_path / "trial.cfg")).split()[-1] == "rdinit=/gpuhost-fault-injection"
    assert "rdinit" not in source(str(grub), str(tmp_path / "dropin.cfg")) and "rdinit" not in result.kernel_options
    assert any(note.startswith("TESTING ONLY: the trial entry also carries rdinit=") for note in result.notes)
    for hostile in ("rdinit=/x;reboot", "init=$(id)", "rdinit=/../x", "quiet"):
        monkeypatch.setenv(TRIAL_TESTING_OPTIONS_ENV, hostile)
        with pytest.raises(InputError, match=TRIAL_TESTING_OPTIONS_ENV):
            plan_of(root)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("gpuhost_trial_panic_seconds", "10;reboot"),
        ("gpuhost_trial_panic_seconds", 0),
        ("gpuhost_trial_panic_seconds", "$(id)"),
        ("gpuhost_trial_boot", "yes please"),
        ("gpuhost_verify_reboot_timeout", "60\nreboot"),
        ("gpuhost_verify_reboot_timeout", 5),
        ("gpuhost_verify_reboot_command", "reboot; rm -rf /"),
        ("gpuhost_verify_reboot_command", "systemctl reboot $(id)"),
        ("gpuhost_verify_reboot_command", "shutdown -r 'now'"),
    ],
)
def test_new_inventory_values_that_reach_a_host_are_validated(name: str, value: object) -> None:
    with pytest.raises(InputError, match=f"inventory host lab-1: {name}"):
        PlanSettings.from_variables({**LAB_VARS, name: value}, "inventory host lab-1")


def _gather_grub_block(etc: Path, out: Path) -> None:
    """Run the gather script's own GRUB block with /etc/default moved under `etc`, in place of the
    snapshot's own GRUB results."""
    for name in ("grub-effective.txt", "grub-syntax.txt"):
        (out / "commands" / name).unlink(missing_ok=True)
    status = out / "commands/status.txt"
    status.write_text("".join(line for line in status.read_text().splitlines(True) if "grub-effective" not in line))
    text = GATHER.read_text()
    block = text[text.index("if [ -r /etc/default/grub ]; then") : text.index("printf '%s\\n' \"$(id -u)\"")]
    block = block.replace("/etc/default/", f"{etc}/")
    (out / "commands").mkdir(parents=True, exist_ok=True)
    subprocess.run(["sh", "-c", f"T={out}\n{block}"], check=True)


CLOUD_DROPIN = 'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT net.ifnames=0"\n'
VARIANTS = {
    # Single quotes, a backslash continuation inside double quotes, and a trailing comment.
    "quotes-and-continuation": LAB_GRUB.replace(
        'GRUB_CMDLINE_LINUX="console=tty0 console=ttyS0,115200n8"',
        "GRUB_CMDLINE_LINUX='console=tty0 console=ttyS0,115200n8'\n"
        'GRUB_CMDLINE_LINUX_DEFAULT="quiet \\\n    vfio-pci.ids=10de:1111"  # an older passthrough try',
    ),
    "crlf": LAB_GRUB.replace("\n", "\r\n"),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_unusual_but_valid_grub_files_give_one_correct_command_line(tmp_path: Path, variant: str) -> None:
    root = lab_copy(tmp_path)
    etc = tmp_path / "etc-default"
    (etc / "grub.d").mkdir(parents=True)
    (etc / "grub").write_text(VARIANTS[variant], newline="")
    # A cloud image's drop-in that overrides the variable (as cloud-init's 50-cloudimg-settings.cfg does).
    (etc / "grub.d/50-cloudimg-settings.cfg").write_text(
        'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT net.ifnames=0"\n'
    )
    _gather_grub_block(etc, root)
    result = plan_of(root)
    assert result.applicable, result.refusals
    # grub-mkconfig sources the files, then gpuhost's drop-in (last in grub.d by name order here).
    dropin = etc / "grub.d/zz-gpuhost.cfg"
    dropin.write_text(result.grub_dropin)
    line = source(str(etc / "grub"), str(etc / "grub.d/50-cloudimg-settings.cfg"), str(dropin))
    tokens = line.split()
    assert " ".join(tokens) == result.desired_grub_line
    assert not any("\r" in token for token in tokens)
    assert [t for t in tokens if t.startswith("vfio-pci.ids=")] == ["vfio-pci.ids=1234:1111,8086:293e"]
    assert tokens[:2] == ["console=tty0", "console=ttyS0,115200n8"] and "net.ifnames=0" in tokens


def test_grub_file_that_is_not_valid_shell_is_refused_through_the_gather_block(tmp_path: Path) -> None:
    root = lab_copy(tmp_path)
    etc = tmp_path / "etc-default"
    (etc / "grub.d").mkdir(parents=True)
    (etc / "grub").write_text(LAB_GRUB.replace('GRUB_DISTRIBUTOR="Debian"', 'GRUB_DISTRIBUTOR="Debian'))
    _gather_grub_block(etc, root)
    result = plan_of(root)
    assert [r.code for r in result.refusals] == ["plan.grub.syntax"]
    assert re.search(r"not valid shell", result.refusals[0].message)


def test_a_changed_host_key_is_said_in_one_sentence_with_the_fix() -> None:
    # Ansible's message for the lab host whose known_hosts entry the fault suite replaced (real text).
    from gpuhost.rollout.engine import stop_outcome

    message = (FIXTURES / "ansible/unreachable-host-key-changed.txt").read_text()
    outcome = stop_outcome(
        "runner_on_unreachable", "Compute the desired state with gpuhost's planner", {"msg": message}
    )
    said = outcome.message
    assert outcome.status.value == "unreachable"
    assert said.startswith("its SSH host key is not the one in known_hosts, so ssh refused to connect (the host sent ")
    assert "SHA256:0U1zKobcqmbliZmHrCvmeAyQd4cmDerHW3bfzV9P4QI" in said and "a-1/known_hosts:1" in said
    assert 'ssh-keygen -f "/tmp/pytest-of-root/pytest-72/faults-lab0/a-1/known_hosts" -R "[127.0.0.1]:39165"' in said
    assert "@@@" not in said and "\n" not in said


@pytest.mark.parametrize(
    ("kind", "task", "message", "outcome"),
    [
        (
            "runner_on_failed",
            "Stop this host's rollout",
            "trial reverted: the trial entry booted but ...",
            "trial reverted",
        ),
        (
            "runner_on_unreachable",
            "Compute the desired state with gpuhost's planner",
            "Failed to connect to the host via ssh: Host key verification failed.",
            "unreachable",
        ),
        (
            "runner_on_failed",
            "Reboot into the new kernel command line (only when /proc/cmdline differs from the plan)",
            "Timed out waiting for last boot time check (timeout=240)",
            "unreachable",
        ),
        (
            "runner_on_failed",
            "Compute the desired state with gpuhost's planner",
            "gpuhost refuses to configure this host; nothing was written:\n- ...",
            "refused",
        ),
        ("runner_on_failed", "Compute the desired state with gpuhost's planner", "gather failed", "failed"),
    ],
)
def test_what_stopped_a_host_is_named_in_the_report(kind: str, task: str, message: str, outcome: str) -> None:
    from gpuhost.rollout.engine import stop_outcome

    assert stop_outcome(kind, task, {"msg": message}).status.value == outcome
