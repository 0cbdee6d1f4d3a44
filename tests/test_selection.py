"""Inventory values that select GPUs (gpuhost_gpus, gpuhost_allow_shared_group)."""

from __future__ import annotations

import pytest

from gpuhost.errors import InputError
from gpuhost.selection import allowed_shared_groups


def test_a_bad_allow_shared_group_entry_is_named_as_such() -> None:
    assert allowed_shared_groups({"gpuhost_allow_shared_group": "0000:41:00.0"}, "gpu01") == ("0000:41:00.0",)
    assert allowed_shared_groups({}, "gpu01") == ()
    with pytest.raises(InputError, match=r"gpu01: gpuhost_allow_shared_group entry '41:00;reboot'"):
        allowed_shared_groups({"gpuhost_allow_shared_group": ["41:00;reboot"]}, "gpu01")
    with pytest.raises(InputError, match=r"gpuhost_allow_shared_group must be a list"):
        allowed_shared_groups({"gpuhost_allow_shared_group": 7}, "gpu01")
