"""Errors the planner raises for bad input or impossible requests.

Every error names the offending field and says how to fix it, so the CLI can
print it as one line and the Ansible filter can fail with the same text.
"""

from __future__ import annotations


class PlanError(ValueError):
    """A request the planner cannot honour.

    ``field`` is the input that caused it (``--tensor-parallel-size``,
    ``nodes[1].gpu``, ``config.json:num_attention_heads``...), ``fix`` a short
    instruction. ``str(err)`` is the one-line message shown to people.
    """

    def __init__(self, field: str, problem: str, fix: str = "") -> None:
        self.field = field
        self.problem = problem
        self.fix = fix
        text = f"{field}: {problem}"
        if fix:
            text += f"; fix: {fix}"
        super().__init__(text)


class NothingFitsError(PlanError):
    """Raised when no layout of the model fits the cluster."""
