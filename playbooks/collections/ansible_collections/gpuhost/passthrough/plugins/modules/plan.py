"""Documentation of the gpuhost.passthrough.plan action (the work is done by plugins/action/plan.py)."""

DOCUMENTATION = r"""
module: plan
short_description: Compute this host's VFIO passthrough plan with gpuhost's planner
description:
  - Runs gpuhost's read-only gather script on the host (one command), builds typed facts and runs
    gpuhost.plan.plan_host on the controller with the host's gpuhost_* inventory variables.
  - Fails the host, before anything is written, when the plan has refusals.
  - Sets the fact gpuhost_plan (schema gpuhost.plan/1).
author: gpuhost contributors (!UNKNOWN)  # no public repository, so no GitHub handle yet
options: {}
"""

EXAMPLES = r"""
- name: Plan
  gpuhost.passthrough.plan:
"""

RETURN = r"""
plan:
  description: The plan (schema gpuhost.plan/1).
  returned: always
  type: dict
"""
