"""Documentation of the gpuhost.passthrough.audit action (the work is done by plugins/action/audit.py)."""

DOCUMENTATION = r"""
module: audit
short_description: Audit this host for VFIO passthrough with gpuhost's checks (read-only)
description:
  - Runs gpuhost's read-only gather script on the host (one command through the play's connection),
    builds typed facts and runs the checks of C(gpuhost audit) on the controller, with the host's
    gpuhost_* inventory variables.
  - Sets the fact gpuhost_audit to the JSON object that C(gpuhost audit --json) prints for the host
    (schema gpuhost.audit/1).
  - Changes nothing on the host. A host that cannot be audited (unreachable, invalid gpuhost_*
    variables) is not failed by this task; its object carries the error (status unreachable).
  - Needs the gpuhost Python package where Ansible runs (the controller or the execution environment).
author: gpuhost contributors (!UNKNOWN)  # no public repository, so no GitHub handle yet
options: {}
notes:
  - Supports check mode; the host is read in check mode too (nothing is written either way).
"""

EXAMPLES = r"""
- name: Audit
  gpuhost.passthrough.audit:
"""

RETURN = r"""
audit:
  description: The host's audit (schema gpuhost.audit/1), as C(gpuhost audit --json) prints it.
  returned: always
  type: dict
"""
