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
  - Copies the files listed in O(backup) under O(backup_dir) first (C(cp -a --parents)), once; an
    earlier backup is kept, so the backup is the host's original file.
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
            V(directory) a directory; V(block) gpuhost's block between the marker lines in a file
            of the host's, the rest of the file kept (created if missing; an empty O(files[].content)
            removes the block).
        type: str
        required: true
        choices: [present, absent, directory, block]
      content:
        description: The file's content (V(present)) or the block's lines (V(block)).
        type: str
        default: ""
      mode:
        description: Octal permissions of the file or directory.
        type: str
        default: "0644"
      marker:
        description: For V(block), the marker line; C({mark}) is replaced by BEGIN and END.
        type: str
        default: ""
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
  description: The files copied under O(backup_dir) by this run.
  returned: always
  type: list
  elements: str
"""

import os
import shutil
import stat
import tempfile
from pathlib import Path

from ansible.module_utils.basic import AnsibleModule

REGENERATES = ("initramfs", "grub", "loader-entries")
FILE_CHANGE = {
    "path": {"type": "path", "required": True},
    "state": {"type": "str", "required": True, "choices": ["present", "absent", "directory", "block"]},
    "content": {"type": "str", "default": ""},
    "mode": {"type": "str", "default": "0644"},
    "marker": {"type": "str", "default": ""},
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
        if lines and not lines[-1].endswith("\n"):
            lines[-1] += "\n"
        at = len(lines)
    if block:
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


def _remove(path):
    if Path(path).is_dir() and not Path(path).is_symlink():
        shutil.rmtree(path)
    else:
        Path(path).unlink()


def _set_attributes(module, path, mode):
    """Owner, group and mode as the plan says; True when one of them changed."""
    arguments = {"path": path, "owner": "root", "group": "root", "mode": mode}
    return module.set_fs_attributes_if_different(module.load_file_common_arguments(arguments), False)


def _apply(module, change, diffs):
    """Make one change (only find it, in check mode); True when the host differs, or did."""
    path, state, mode = change["path"], change["state"], change["mode"]
    exists = os.path.lexists(path)
    if state == "absent":
        if exists:
            before = _read(path) if Path(path).is_file() else ""
            diffs.append({"before_header": path, "after_header": path, "before": before, "after": ""})
            if not module.check_mode:
                _remove(path)
        return exists
    if state == "directory":
        if exists and not Path(path).is_dir():
            module.fail_json(msg=f"{path} is not a directory: move it away so that gpuhost can make one there")
        if exists:
            return _set_attributes(module, path, mode)
        diffs.append({"before": {"path": path, "state": "absent"}, "after": {"path": path, "state": "directory"}})
        if not module.check_mode:
            Path(path).mkdir(int(mode, 8), parents=True)
            _set_attributes(module, path, mode)
        return True
    if exists and not stat.S_ISREG(Path(path).stat().st_mode):
        module.fail_json(msg=f"{path} is not a regular file: move it away so that gpuhost can write one there")
    if state == "block" and not exists and not change["content"]:
        return False  # no block wanted, and no file to take one out of
    before = _read(path) if exists else None
    after = change["content"] if state == "present" else _with_block(before, change["content"], change["marker"])
    if before == after:
        return _set_attributes(module, path, mode)
    diffs.append({"before_header": path, "after_header": path, "before": before or "", "after": after})
    if not module.check_mode:
        _write(module, path, after)
        _set_attributes(module, path, mode)
    return True


def _back_up(module, paths, backup_dir):
    copied = []
    for path in paths:
        if not os.path.lexists(path) or os.path.lexists(backup_dir + path):
            continue
        copied.append(path)
        if module.check_mode:
            continue
        Path(backup_dir).mkdir(0o700, parents=True, exist_ok=True)
        # From /: cp --parents sets the copied directories' attributes by their relative names.
        module.run_command(["cp", "-a", "--parents", path, backup_dir + "/"], cwd="/", check_rc=True)
    return copied


def main():
    module = AnsibleModule(
        argument_spec={
            "files": {"type": "list", "elements": "dict", "default": [], "options": FILE_CHANGE},
            "backup": {"type": "list", "elements": "path", "default": []},
            "backup_dir": {"type": "path", "default": "/var/lib/gpuhost/backup"},
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
    backed_up = _back_up(module, module.params["backup"], module.params["backup_dir"])
    diffs, changed_paths, regenerate = [], [], []
    for change in module.params["files"]:
        if _apply(module, change, diffs):
            changed_paths.append(change["path"])
            if change["regenerates"] and change["regenerates"] not in regenerate:
                regenerate.append(change["regenerates"])
    result = {
        "changed": bool(changed_paths or backed_up),
        "changed_paths": changed_paths,
        "regenerate": regenerate,
        "backed_up": backed_up,
    }
    if module._diff:
        result["diff"] = diffs
    module.exit_json(**result)


if __name__ == "__main__":
    main()
