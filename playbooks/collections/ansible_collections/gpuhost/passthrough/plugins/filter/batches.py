"""gpuhost.passthrough.batches: gpuhost_serial as Ansible's serial, from a list or from a survey's text.

`gpuhost apply` passes a list ([1, '20%']); an AWX/AAP survey can only pass text ('1,20%'), which
Ansible's serial would not read as batches.
"""

from __future__ import annotations

import re
from typing import Any

_BATCH = re.compile(r"^\d{1,4}%?$")


def batches(value: Any) -> list[int | str]:
    items = [item.strip() for item in value.split(",")] if isinstance(value, str) else value
    if isinstance(items, int) and not isinstance(items, bool):
        items = [items]
    if not isinstance(items, (list, tuple)) or not items:
        items = [value]
    result: list[int | str] = []
    for item in items:
        text = str(item).strip()
        if isinstance(item, bool) or not _BATCH.match(text) or text in ("0", "0%"):
            from ansible.errors import AnsibleFilterError

            raise AnsibleFilterError(
                f"gpuhost_serial {value!r}: give batch sizes as N or N%, comma-separated (e.g. 1,20%)."
            )
        result.append(text if text.endswith("%") else int(text))
    return result


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"batches": batches}
