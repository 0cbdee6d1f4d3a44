"""gpuhost.output: the one writer of the files a user names (-o, --json, --report, --prometheus)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuhost.errors import InputError
from gpuhost.output import write_output


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o027, 0o640)])
def test_a_new_file_gets_the_mode_open_gives_and_a_replaced_one_keeps_its_own(
    umask: int, mode: int, tmp_path: Path
) -> None:
    """mkstemp creates 0600: a file another user reads (node_exporter runs as 'prometheus') was unreadable."""
    target = tmp_path / "gpuhost.prom"
    previous = os.umask(umask)
    try:
        write_output(target, "a 1\n", "--prometheus")
        assert target.stat().st_mode & 0o777 == mode
        target.chmod(0o604)
        write_output(target, "a 2\n", "--prometheus")
        assert target.stat().st_mode & 0o777 == 0o604 and target.read_text() == "a 2\n"
    finally:
        os.umask(previous)
    assert [p.name for p in tmp_path.iterdir()] == ["gpuhost.prom"], "no temporary file may stay behind"
    with pytest.raises(InputError, match="is not a regular file"):
        write_output(Path("/dev/null"), "x", "--prometheus")
