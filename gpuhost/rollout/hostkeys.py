"""ssh's host-key refusals, as Ansible reports them, said in one sentence with the fix."""

from __future__ import annotations

import re

_CHANGED = "REMOTE HOST IDENTIFICATION HAS CHANGED"
_FAILED = "Host key verification failed"
_SENT = re.compile(r"(SHA256:[A-Za-z0-9+/=]+)")
_OFFENDING = re.compile(r"Offending \S+ key in (\S+:\d+)")
_REMOVE = re.compile(r"(ssh-keygen -f .+ -R .+?)\s*$", re.MULTILINE)


def host_key_message(message: str) -> str | None:
    """The sentence for ssh's refusal in `message` (None: not a host-key refusal).

    Only ssh's 30-line warning says the key changed; a bare "Host key verification failed" is
    also what a key missing from known_hosts gives (ssh's own line about it does not reach
    Ansible's message), so that one does not speak of interception."""
    if _CHANGED not in message:
        if _FAILED not in message:
            return None
        return (
            "ssh could not verify its SSH host key, so it refused to connect: known_hosts "
            "(gpuhost_known_hosts_file, else ~/.ssh/known_hosts) holds no key for it, or another one. "
            "Check the host's key out of band (ssh-keyscan -p PORT HOST, compared with its console) "
            "and add it to that file."
        )
    sent = _SENT.search(message)
    offending = _OFFENDING.search(message)
    remove = _REMOVE.search(message)
    facts = [f"the host sent {sent.group(1)}"] if sent else []
    facts += [f"known_hosts has another key at {offending.group(1)}"] if offending else []
    return (
        "its SSH host key is not the one in known_hosts, so ssh refused to connect"
        + (f" ({'; '.join(facts)})" if facts else "")
        + ". If the host was reinstalled, check its new key out of band and replace the entry ("
        + (remove.group(1) if remove else "ssh-keygen -R HOST")
        + "); if it was not, someone may be intercepting the connection."
    )
