"""Documentation of the gpuhost.passthrough.verify action (the work is done by plugins/action/verify.py)."""

DOCUMENTATION = r"""
module: verify
short_description: Judge this host against its gpuhost plan with the audit's checks
description:
  - Reads the host again and checks that /proc/cmdline carries the planned options, every planned
    function is on vfio-pci, no nvidia or nouveau module is loaded, the 1 GiB huge pages allocated
    equal the plan, and the audit reports no error.
author: gpuhost contributors (!UNKNOWN)  # no public repository, so no GitHub handle yet
options:
  plan:
    description: The gpuhost_plan fact set by gpuhost.passthrough.plan.
    type: dict
    required: true
  enforce:
    description: Fail the host when it does not match (false in check mode, where nothing changed).
    type: bool
    default: true
"""

EXAMPLES = r"""
- name: Verify
  gpuhost.passthrough.verify:
    plan: "{{ gpuhost_plan }}"
"""

RETURN = r"""
verification:
  description: >-
    ok, status, summary, checks, the audit's errors, and problems
    (code, severity, subject, message, remedy) for each failed check.
  returned: always
  type: dict
"""
