"""Documentation of the gpuhost.passthrough.lock action (the work is done by plugins/action/lock.py)."""

DOCUMENTATION = r"""
module: lock
short_description: Hold one gpuhost run's lock on the host, or release it
description:
  - One run at a time per host (gpuhost apply, gpuhost rollback, and their playbooks run without the
    CLI, from AWX for one). V(held) makes the lock file with O_EXCL, naming the controller, its
    ansible-playbook process, the command and the time, and the host's boot; where another run holds
    it, the host fails at once with a message naming that run, and a holder whose process is gone is
    called stale. A lock is never taken over unless O(break_lock) is set.
  - V(released) removes the lock only where this run holds it.
  - Nothing is done in check mode.
author: gpuhost contributors (!UNKNOWN)  # no public repository, so no GitHub handle yet
options:
  state:
    description: V(held) or V(released).
    type: str
    default: held
    choices: [held, released]
  command:
    description: The command written in the lock (default the ansible-playbook command line).
    type: str
  path:
    description: The lock file on the host.
    type: path
    default: /var/lib/gpuhost/lock
  break_lock:
    description: Remove any lock first (reported as a warning), for a run that died holding it.
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Hold this host for the run
  gpuhost.passthrough.lock:
    command: gpuhost apply
    break_lock: "{{ gpuhost_break_lock | default(false) }}"
"""

RETURN = r"""
msg:
  description: Who holds the host now, or why the host is refused.
  returned: always
  type: str
"""
