"""Documentation of the gpuhost.passthrough.bmc_power_cycle action (plugins/action/bmc_power_cycle.py does the work)."""

DOCUMENTATION = r"""
module: bmc_power_cycle
short_description: Power-cycle this host once through its BMC (Redfish or IPMI over LAN)
description:
  - Runs on the controller, never on the host, which is down when this is needed. Reads the
    host's C(gpuhost_bmc) (protocol, address, user, TLS settings) and its password, from a vaulted
    C(gpuhost_bmc_password) or from the controller's environment variable that C(gpuhost_bmc.password_env)
    names. The password is never an argument of this task and never in its result or messages.
  - Redfish (sushy) sends ForceRestart, or ForceOff and then On where the system allows no
    ForceRestart; IPMI (pyghmi) sends chassis power cycle, or a hard reset where the BMC does not
    support power cycle. A host that is off is powered on instead.
  - Fails the host with a message naming the host, the BMC and the fix when the BMC is
    unreachable, refuses the credentials, fails TLS verification or does not offer a power cycle
    (RV(bmc_error) says which).
author: gpuhost contributors (!UNKNOWN)  # no public repository, so no GitHub handle yet
attributes:
  check_mode:
    description: Says what it would send, and sends nothing.
    support: full
options:
  timeout:
    description: Seconds each request to the BMC may take.
    type: float
    default: 20
"""

EXAMPLES = r"""
- name: Power-cycle the host through its BMC
  gpuhost.passthrough.bmc_power_cycle:
    timeout: 20
"""

RETURN = r"""
action:
  description: >-
    What the BMC was told (ForceRestart, ForceOff+On, On; chassis power cycle, chassis hard reset,
    chassis power on).
  returned: success
  type: str
sent_at:
  description: When it was sent (UTC, ISO 8601).
  returned: success
  type: str
state_before:
  description: The power state the BMC reported before (on, off, unknown).
  returned: success
  type: str
bmc:
  description: The BMC's address (no user, no password).
  returned: success
  type: str
bmc_error:
  description: Why it failed (unreachable, wrong credentials, TLS error, unsupported action, invalid gpuhost_bmc).
  returned: failure
  type: str
"""
