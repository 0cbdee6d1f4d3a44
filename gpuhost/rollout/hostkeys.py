"""ssh's 30-line warning about a host key, said in one sentence with the fix."""

from __future__ import annotations

import re

_SENT = re.compile(r"(SHA256:[A-Za-z0-9+/=]+)")
_OFFENDING = re.compile(r"Offending \S+ key in (\S+:\d+)")
_REMOVE = re.compile(r"(ssh-keygen -f .+ -R .+?)\s*$", re.MULTILINE)


def host_key_message(message: str) -> str | None:
    """The sentence for ssh's changed-host-key warning or refusal in `message` (None: not that)."""
    if "REMOTE HOST IDENTIFICATION HAS CHANGED" not in message and "Host key verification failed" not in message:
        return None
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
