"""Errors the planner raises for bad input or impossible requests.

Every error names the offending field and says how to fix it, so the CLI can
print it as one line and the Ansible filter can fail with the same text.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from vllm_fleet import schema


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


class DoesNotFitError(NothingFitsError):
    """A valid request that needs more memory than these GPUs give (the CLI's exit 3), as
    opposed to a forced layout these nodes cannot have (a bad input: exit 2)."""


# One input, two names: the ``vllm-fleet`` flag and the inventory variable. Refusals are
# raised with the flag (or the bare wish name); the edges rename them: the CLI prints
# flags (:func:`for_cli`), the Ansible filters print inventory variables (:func:`for_inventory`).
# (bare wish name, CLI flag, inventory variable) of every declared option (vllm_fleet/schema.py)
# and of the few other inputs refusals name.
_NAMES = schema.names()
_TO_INVENTORY = {flag: var for _, flag, var in _NAMES} | {bare: var for bare, _, var in _NAMES}
_TO_CLI = {var: flag for _, flag, var in _NAMES} | {bare: flag for bare, flag, _ in _NAMES}
_FLAG_RE = re.compile(r"(?<![\w-])(--[a-z][a-z-]*[a-z])(?![\w-])")


def _renamed(err: PlanError, field: str, text: Callable[[str], str]) -> PlanError:
    out = type(err)(field, text(err.problem), text(err.fix))
    out.__cause__ = err.__cause__
    return out


def for_inventory(err: PlanError) -> PlanError:
    """``err`` as an Ansible run shows it: the field and every flag named in its text are
    the inventory variables (``--max-model-len`` -> ``vllm_fleet_max_model_len``)."""
    field = _TO_INVENTORY.get(err.field, err.field)
    return _renamed(err, field, lambda s: _FLAG_RE.sub(lambda m: _TO_INVENTORY.get(m.group(1), m.group(1)), s))


def for_cli(err: PlanError) -> PlanError:
    """``err`` as ``vllm-fleet`` shows it: the field is the flag (``max_model_len`` and
    ``vllm_fleet_multinode_backend`` -> ``--max-model-len``, ``--multinode-backend``)."""
    field = _TO_CLI.get(err.field, err.field)
    return _renamed(err, field, lambda s: s)
