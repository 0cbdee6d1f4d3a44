"""gpuhost.passthrough.lock: take or release this run's lock on the host (gpuhost.hostlock)."""

from __future__ import annotations

import os
from typing import Any

from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase
from ansible_collections.gpuhost.passthrough.plugins.plugin_utils.host import HostReadError, require_gpuhost


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result: dict[str, Any] = super().run(tmp, task_vars)
        try:
            require_gpuhost()
        except HostReadError as error:
            return {**result, "failed": True, "msg": str(error)}
        from gpuhost import hostlock as lock

        args = self._task.args
        state = str(args.get("state", "held"))
        path = str(args.get("path") or lock.LOCK_PATH)
        host = str((task_vars or {}).get("inventory_hostname", "host"))
        if state not in ("held", "released") or not path.startswith("/"):
            return {**result, "failed": True, "msg": f"state must be held or released and path absolute: {args}"}
        if self._task.check_mode:  # a check run changes nothing, so it holds nothing
            return {**result, "changed": False, "skipped": True, "msg": "check mode: no lock taken"}
        # The action runs in a worker forked by ansible-playbook: its parent is the run's process.
        holder = lock.this_run(str(args.get("command") or lock.default_command()), os.getppid())
        if state == "released":
            done = self._low_level_execute_command(lock.release_command(holder, path), sudoable=True)
            released = "released" in (done.get("stdout") or "")
            # Not a change to the host's configuration: a second apply that changes nothing reports none.
            return {**result, "changed": False, "msg": "released" if released else "this run held no lock"}
        # Ansible's reading of a boolean: the text "False" (a template rendered as text) is false.
        break_lock = boolean(args.get("break_lock", False), strict=False)
        done = self._low_level_execute_command(
            lock.acquire_command(path, break_lock=break_lock), in_data=holder.record() + "\n", sudoable=True
        )
        try:
            answer = lock.parse_answer(done.get("stdout") or "")
        except ValueError as error:
            return {**result, "failed": True, "msg": f"{host}: {error} (stderr: {(done.get('stderr') or '')[:300]})"}
        if not answer.taken:
            alive = None if answer.holder is None else lock.holder_alive(answer.holder)
            return {**result, "failed": True, "msg": lock.held_message(host, answer, alive, path)}
        result.update(changed=False, msg=f"{host} held by this run ({holder.describe()})")
        if answer.broken is not None or answer.broken_unreadable:
            broken = answer.broken.describe() if answer.broken else repr(answer.broken_unreadable[:200])
            result["warnings"] = [f"--break-lock: removed the lock of {broken} on {host}"]
            result["msg"] += f"; --break-lock removed the lock of {broken}"
        return result
