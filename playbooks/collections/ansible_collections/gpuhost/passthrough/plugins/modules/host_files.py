#!/usr/bin/python
"""gpuhost.passthrough.host_files: one phase of a gpuhost plan's file changes, in one run on the host."""

from __future__ import annotations

DOCUMENTATION = r"""
module: host_files
short_description: Carry out one phase of a gpuhost plan's file changes on the host, in one run
description:
  - Writes, edits and removes the files that gpuhost's planner lists for one phase of apply
    (C(gpuhost_plan.files.configure), C(commit) or C(revert)), in order, as one Python run on the
    host. Each change is what M(ansible.builtin.copy), M(ansible.builtin.file) and
    M(ansible.builtin.blockinfile) would do, with owner and group root.
  - Records each path listed in O(backup) first, once. A file is copied under O(backup_dir)
    with C(cp -a --parents); a path with nothing there is noted in the JSON list beside it, named
    O(backup_dir) with C(-absent.json) appended; a directory that exists is left as it is. An
    earlier record is kept, so the record is the host as it was before apply.
  - For gpuhost rollback, V(restored) puts a recorded copy back, and O(forget_backups) drops the
    records once the rollback is done.
  - Returns which rebuilds the changed files call for (RV(regenerate)), so that the playbook notifies
    only those handlers.
  - Runs on the host with nothing but Python's standard library and Ansible's module_utils.
author: gpuhost contributors (!UNKNOWN)  # no public repository, so no GitHub handle yet
attributes:
  check_mode:
    description: Computes every change and writes nothing.
    support: full
  diff_mode:
    description: Returns a before/after diff for each changed file.
    support: full
  platform:
    description: Debian-family Linux hosts.
    support: full
    platforms: posix
options:
  files:
    description: The changes, in the order they are made.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: Absolute path on the host.
        type: path
        required: true
      state:
        description:
          - V(present) a file with exactly O(files[].content); V(absent) nothing at the path;
            V(directory) a directory (one that exists is left as it is); V(block) gpuhost's block
            between the marker lines in a file of the host's, the rest of the file kept (created if
            missing; an empty O(files[].content) removes the block).
          - V(absent) on a directory removes it only when empty, unmounting it first where it is a
            mount point; one with files in it fails.
          - V(commented) puts O(files[].marker) before each line of O(files[].content), found at line
            O(files[].line) of the file (or already commented so); lines that differ fail the change.
          - V(restored) copies the file's copy under O(backup_dir) back (content, mode, owner). For
            a block file (with O(files[].marker)) the copy goes back only where the file without that
            block is still the copy; otherwise only the block is removed and the host's edits stay.
        type: str
        required: true
        choices: [present, absent, directory, block, commented, restored]
      content:
        description: The file's content (V(present)) or the block's lines (V(block)).
        type: str
        default: ""
      mode:
        description: Octal permissions of the file or directory.
        type: str
        default: "0644"
      marker:
        description:
          - For V(block) (and V(restored)), the marker line; C({mark}) is replaced by BEGIN and END.
          - For V(commented), the text put before each line.
        type: str
        default: ""
      line:
        description: For V(commented), the number of the first line of O(files[].content) in the file.
        type: int
        default: 0
      regenerates:
        description:
          - What the host must build again when this path changes, V(initramfs), V(grub) or
            V(loader-entries); null for nothing. Checked by the module, not by a choices list,
            which would refuse the plan's null.
        type: str
  backup:
    description: Files to copy under O(backup_dir) before anything changes (a missing file is skipped).
    type: list
    elements: path
    default: []
  backup_dir:
    description: Where the backups go (mode 0700, root).
    type: path
    default: /var/lib/gpuhost/backup
  forget_backups:
    description: After the changes, remove O(backup_dir) and its record of absent paths (rollback's end).
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Write the files of the plan's configure phase
  gpuhost.passthrough.host_files:
    files: "{{ gpuhost_plan.files.configure }}"
  register: gpuhost_files
"""

RETURN = r"""
changed_paths:
  description: The paths that changed (or would change, in check mode), in order.
  returned: always
  type: list
  elements: str
regenerate:
  description: What the host must build again before its next boot, from O(files[].regenerates).
  returned: always
  type: list
  elements: str
backed_up:
  description: The paths recorded by this run (copied under O(backup_dir), or noted absent).
  returned: always
  type: list
  elements: str
kept_edits:
  description: Block files whose copy was not put back because the host changed them since; only gpuhost's block went.
  returned: always
  type: list
  elements: str
"""

import json
import os
import shutil
import stat
import tempfile
from pathlib import Path

from ansible.module_utils.basic import AnsibleModule

REGENERATES = ("initramfs", "grub", "loader-entries")
FILE_CHANGE = {
    "path": {"type": "path", "required": True},
    "state": {
        "type": "str",
        "required": True,
        "choices": ["present", "absent", "directory", "block", "commented", "restored"],
    },
    "content": {"type": "str", "default": ""},
    "mode": {"type": "str", "default": "0644"},
    "marker": {"type": "str", "default": ""},
    "line": {"type": "int", "default": 0},
    # Checked in main(): Ansible's choices refuse None, the plan's "nothing to rebuild".
    "regenerates": {"type": "str"},
}


def _read(path):
    """The file's text (None: no file). Undecodable bytes survive a rewrite of the rest."""
    try:
        return Path(path).read_bytes().decode("utf-8", "surrogateescape")
    except FileNotFoundError:
        return None


def _with_block(text, block, marker):
    """What blockinfile (insert at the end, last markers win) leaves: the text with the block replaced."""
    begin, end = marker.replace("{mark}", "BEGIN"), marker.replace("{mark}", "END")
    lines = (text or "").splitlines(True)
    found_begin = found_end = None
    for number, line in enumerate(lines):
        if line.rstrip("\r\n") == begin:
            found_begin = number
        elif line.rstrip("\r\n") == end:
            found_end = number
    if found_begin is not None and found_end is not None:
        first, last = min(found_begin, found_end), max(found_begin, found_end)
        del lines[first : last + 1]
        at = first
    else:
        at = len(lines)
    if block:
        if at and not lines[at - 1].endswith("\n"):  # only a block to add ends the host's last line
            lines[at - 1] += "\n"
        lines[at:at] = [begin + "\n", block if block.endswith("\n") else block + "\n", end + "\n"]
    return "".join(lines)


def _write(module, path, text):
    directory = Path(path).parent
    directory.mkdir(0o755, parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=directory, prefix=".gpuhost-")
    with os.fdopen(handle, "wb") as out:
        out.write(text.encode("utf-8", "surrogateescape"))
        out.flush()
        os.fsync(out.fileno())
    module.atomic_move(temporary, path)


def _remove(module, path):
    """A file, or an empty directory (unmounted first where mounted): never a directory's contents."""
    if Path(path).is_dir() and not Path(path).is_symlink():
        if os.path.ismount(path):
            module.run_command(["umount", path], check_rc=True)
        try:
            Path(path).rmdir()
        except OSError as error:
            module.fail_json(msg=f"{path}: gpuhost made this directory, but it holds files now ({error}): move them")
    else:
        Path(path).unlink()


def _absent_record(backup_dir):
    return backup_dir.rstrip("/") + "-absent.json"


def _read_absent(module, backup_dir):
    text = _read(_absent_record(backup_dir))
    if text is None:
        return []
    try:
        paths = json.loads(text)
    except ValueError:
        paths = None
    if not isinstance(paths, list):
        module.fail_json(msg=f"{_absent_record(backup_dir)} is not a JSON list of paths: restore it or remove it")
    return paths


def _commented(module, change, before):
    """The file with the change's lines commented out where the plan found them (already: unchanged)."""
    path, line, prefix = change["path"], change["line"], change["marker"]
    wanted = change["content"].splitlines()
    lines = (before or "").splitlines(True)
    found = [text.rstrip("\r\n") for text in lines[line - 1 : line - 1 + len(wanted)]] if line >= 1 else []
    if found == [prefix + text for text in wanted]:
        return before
    if found != wanted:
        module.fail_json(
            msg=f"{path}:{line}: the lines gpuhost's plan comments out are not there as the plan read them "
            f"({wanted!r}; the file has {found!r}): the file changed since; run gpuhost apply again"
        )
    for offset in range(len(wanted)):
        lines[line - 1 + offset] = prefix + lines[line - 1 + offset]
    return "".join(lines)


def _restore(module, change, kept_edits):
    """Put the recorded copy back; True when the host differs, or did."""
    path, backup_dir = change["path"], module.params["backup_dir"]
    copy = backup_dir + path
    if not os.path.lexists(copy):
        module.fail_json(msg=f"{path}: no copy under {backup_dir} to restore (the rollback plan read one there)")
    before = _read(path) if os.path.lexists(path) else None
    original = _read(copy)
    if change["marker"] and before is not None:
        without = _with_block(before, "", change["marker"])
        # Apply ended a last line without a newline before its block: the same file otherwise.
        if without not in (original, (original or "") + "\n"):
            if without == before:
                return False
            kept_edits.append(path)
            if not module.check_mode:
                _write(module, path, without)
            return True
    same = before == original and os.path.lexists(path)
    if same:
        wanted, now = os.lstat(copy), os.lstat(path)
        same = (wanted.st_mode, wanted.st_uid, wanted.st_gid) == (now.st_mode, now.st_uid, now.st_gid)
    if same:
        return False
    if not module.check_mode:
        Path(path).parent.mkdir(0o755, parents=True, exist_ok=True)
        module.run_command(["cp", "-a", "--", copy, path], check_rc=True)
    return True


def _set_attributes(module, path, mode):
    """Owner, group and mode as the plan says; True when one of them changed."""
    arguments = {"path": path, "owner": "root", "group": "root", "mode": mode}
    return module.set_fs_attributes_if_different(module.load_file_common_arguments(arguments), False)


def _apply(module, change, diffs, kept_edits):
    """Make one change (only find it, in check mode); True when the host differs, or did."""
    path, state, mode = change["path"], change["state"], change["mode"]
    exists = os.path.lexists(path)
    if state == "absent":
        if exists:
            before = _read(path) if Path(path).is_file() else ""
            diffs.append({"before_header": path, "after_header": path, "before": before, "after": ""})
            if not module.check_mode:
                _remove(module, path)
        return exists
    if state == "restored":
        return _restore(module, change, kept_edits)
    if state == "directory":
        if exists and not Path(path).is_dir():
            module.fail_json(msg=f"{path} is not a directory: move it away so that gpuhost can make one there")
        if exists:
            return False  # the host's own directory, as it is (rollback leaves it so)
        diffs.append({"before": {"path": path, "state": "absent"}, "after": {"path": path, "state": "directory"}})
        if not module.check_mode:
            Path(path).mkdir(int(mode, 8), parents=True)
            _set_attributes(module, path, mode)
        return True
    if exists and not stat.S_ISREG(Path(path).stat().st_mode):
        module.fail_json(msg=f"{path} is not a regular file: move it away so that gpuhost can write one there")
    if state in ("block", "commented") and not exists and not change["content"]:
        return False  # no block wanted, and no file to take one out of
    if state == "commented" and not exists:
        module.fail_json(msg=f"{path}: the file whose lines gpuhost's plan comments out is gone: run apply again")
    before = _read(path) if exists else None
    if state == "present":
        after = change["content"]
    elif state == "commented":
        after = _commented(module, change, before)
    else:
        after = _with_block(before, change["content"], change["marker"])
    # A file of the host's that gpuhost edits keeps its owner and mode (atomic_move keeps them):
    # rollback's copy of it is then the same file.
    hosts_file = state in ("block", "commented") and exists
    if before == after:
        return False if hosts_file else _set_attributes(module, path, mode)
    diffs.append({"before_header": path, "after_header": path, "before": before or "", "after": after})
    if not module.check_mode:
        _write(module, path, after)
        if not hosts_file:
            _set_attributes(module, path, mode)
    return True


def _back_up(module, paths, backup_dir):
    recorded = []
    absent = _read_absent(module, backup_dir)
    noted = list(absent)
    for path in paths:
        if os.path.lexists(backup_dir + path) or path in noted:
            continue
        if not os.path.lexists(path):
            noted.append(path)
            recorded.append(path)
            continue
        if Path(path).is_dir() and not Path(path).is_symlink():
            continue  # a directory of the host's: apply leaves it as it is
        recorded.append(path)
        if module.check_mode:
            continue
        Path(backup_dir).mkdir(0o700, parents=True, exist_ok=True)
        # From /: cp --parents sets the copied directories' attributes by their relative names.
        module.run_command(["cp", "-a", "--parents", path, backup_dir + "/"], cwd="/", check_rc=True)
    if noted != absent and not module.check_mode:
        Path(backup_dir).parent.mkdir(0o755, parents=True, exist_ok=True)
        _write(module, _absent_record(backup_dir), json.dumps(noted, indent=1) + "\n")
        Path(_absent_record(backup_dir)).chmod(0o600)
    return recorded


def _forget_backups(module, backup_dir):
    """Rollback's end: the records go (a later apply records the host afresh); True when there were some."""
    found = [p for p in (backup_dir, _absent_record(backup_dir)) if os.path.lexists(p)]
    if not module.check_mode:
        for path in found:
            shutil.rmtree(path) if Path(path).is_dir() else Path(path).unlink()
    return bool(found)


def main():
    module = AnsibleModule(
        argument_spec={
            "files": {"type": "list", "elements": "dict", "default": [], "options": FILE_CHANGE},
            "backup": {"type": "list", "elements": "path", "default": []},
            "backup_dir": {"type": "path", "default": "/var/lib/gpuhost/backup"},
            "forget_backups": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    for change in module.params["files"]:
        if not Path(change["path"]).is_absolute():
            module.fail_json(msg=f"{change['path']}: gpuhost's plan names files by absolute paths only")
        if change["regenerates"] not in (None, *REGENERATES):
            module.fail_json(
                msg=f"{change['path']}: regenerates is {change['regenerates']!r}, not one of {', '.join(REGENERATES)}"
            )
        if change["state"] == "block" and "{mark}" not in change["marker"]:
            module.fail_json(msg=f"{change['path']}: a block needs a marker with {{mark}} in it")
        if change["state"] == "commented" and not (change["marker"].startswith("#") and change["line"] >= 1):
            module.fail_json(msg=f"{change['path']}: commented needs a marker that begins with # and a line from 1")
    backed_up = _back_up(module, module.params["backup"], module.params["backup_dir"])
    diffs, changed_paths, regenerate, kept_edits = [], [], [], []
    for change in module.params["files"]:
        if _apply(module, change, diffs, kept_edits):
            changed_paths.append(change["path"])
            if change["regenerates"] and change["regenerates"] not in regenerate:
                regenerate.append(change["regenerates"])
    forgotten = module.params["forget_backups"] and _forget_backups(module, module.params["backup_dir"])
    result = {
        "changed": bool(changed_paths or backed_up or forgotten),
        "changed_paths": changed_paths,
        "regenerate": regenerate,
        "backed_up": backed_up,
        "kept_edits": kept_edits,
    }
    if module._diff:
        result["diff"] = diffs
    module.exit_json(**result)


if __name__ == "__main__":
    main()
