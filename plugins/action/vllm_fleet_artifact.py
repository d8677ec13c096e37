"""Ansible action vllm_fleet_artifact: write a file on the controller, in the worker's own process.

The artifacts (verify.json, verify.md, preview.json, the doctor's bundle) are files on the
controller. Written with ``ansible.builtin.copy`` on localhost, each cost two module processes
(``stat``, then ``copy``): about 0.29 s of the controller's CPU apiece on the 2-core machine,
1.15 s of a three-host no-change re-run's 8.2 s for verify's two files. This writes the file
where the task runs on the controller, through the plan phase's own writer (a temporary file
renamed into place; nothing is written when the file already holds the content with the mode).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

# A checkout's plugin uses the checkout's own package, before any installed copy.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from vllm_fleet.inventory import plan_phase

DOCUMENTATION = r"""
name: vllm_fleet_artifact
short_description: Write a file on the controller without a module process
description:
  - Writes C(content) to C(dest) on the controller (a temporary file renamed into place), creating
    its folder; changed only when the file did not hold it with C(mode). Honours check mode and --diff.
options:
  dest: {description: The file on the controller., type: path, required: true}
  content: {description: What it holds., type: str, required: true}
  mode: {description: Its permissions (octal string)., type: str, default: "0644"}
"""


class ActionModule(ActionBase):  # type: ignore[misc]
    TRANSFERS_FILES = False
    _requires_connection = False
    _VALID_ARGS = frozenset(("dest", "content", "mode"))

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result: dict[str, Any] = super().run(tmp, task_vars)
        args = self._task.args
        dest, content = args.get("dest"), args.get("content")
        if not dest or content is None:
            raise AnsibleActionFail("vllm_fleet_artifact: dest and content are required")
        try:
            mode = int(str(args.get("mode", "0644")), 8)
        except ValueError:
            raise AnsibleActionFail(f"vllm_fleet_artifact: mode is octal like 0644, not {args.get('mode')!r}") from None
        path = Path(str(dest)).expanduser()
        text = str(content)
        changed = not plan_phase.unchanged(path, text, mode)
        result.update(changed=changed, dest=str(path))
        if changed and self._play_context.diff:
            try:
                before = path.read_text()
            except (OSError, UnicodeDecodeError):
                before = ""
            result["diff"] = {"before": before, "after": text, "before_header": str(path), "after_header": str(path)}
        # The play context holds the task's own check_mode (check_mode: false writes in check mode).
        if changed and not self._play_context.check_mode:
            path.parent.mkdir(parents=True, exist_ok=True)
            plan_phase.write(path, text, mode)
        return result
