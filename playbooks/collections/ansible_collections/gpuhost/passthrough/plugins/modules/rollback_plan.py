"""Documentation of the gpuhost.passthrough.rollback_plan action (its work: plugins/action/rollback_plan.py)."""

DOCUMENTATION = r"""
module: rollback_plan
short_description: Compute what undoes gpuhost apply on this host, with gpuhost's planner
description:
  - Reads the host with gpuhost's gather script and lists what apply recorded under
    /var/lib/gpuhost (its copies of the host's files, and the paths it found absent); runs
    gpuhost.plan.rollback.plan_rollback on the controller.
  - Sets the fact gpuhost_rollback_plan (schema gpuhost.rollback/1) - the files for
    M(gpuhost.passthrough.host_files), in order, and what rebuilds the boot from them (update-grub,
    or systemd-boot's loader entries, as the host's boot loader calls for).
author: gpuhost contributors (!UNKNOWN)  # no public repository, so no GitHub handle yet
options: {}
"""

EXAMPLES = r"""
- name: Plan the rollback
  gpuhost.passthrough.rollback_plan:
"""

RETURN = r"""
plan:
  description: The rollback plan (schema gpuhost.rollback/1).
  returned: always
  type: dict
"""
