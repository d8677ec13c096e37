"""What the operator asks the planner for."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from vllm_fleet.model.spec import ModelSpec
from vllm_fleet.planning.render import DEFAULT_PORT
from vllm_fleet.schema import PlannerOptions

ALL_STRATEGIES = ("replicas", "tp", "pp", "dp_ep", "instances")


@dataclass(frozen=True)
class Wishes(PlannerOptions):
    """What the operator asks for: the declared options (vllm_fleet/schema.py; None means "the
    planner decides") and what the deployment hands the planner."""

    strategies: tuple[str, ...] | None = None
    model_ref: str | None = None
    served_model_name: str | None = None
    port: int = DEFAULT_PORT
    # Whether the serving environment has Ray (an image built with it, or a venv that
    # gets it); None: unknown, auto then never picks Ray unless native cannot work.
    ray_available: bool | None = None
    # The environment vLLM runs with (vllm_fleet_extra_env): what vLLM's own start-up
    # checks read, e.g. VLLM_ALLOW_LONG_MAX_MODEL_LEN.
    extra_env: Mapping[str, str] = field(default_factory=dict)
    # The vllm serve arguments the deployment adds (vllm_fleet_extra_args): read by the
    # checks of vLLM's own opt-ins (--allow-deprecated-quantization); not rendered here.
    extra_args: tuple[str, ...] = ()
    # The draft model speculative_config names (EAGLE / draft_model), loaded once by plan_cluster.
    draft_spec: ModelSpec | None = None

    def allows(self, strategy: str) -> bool:
        allowed = self.strategies or ALL_STRATEGIES
        if strategy in ("replicas", "instances"):
            return "replicas" in allowed or "instances" in allowed or "tp" in allowed
        if strategy in ("pp", "pp_mixed"):
            return "pp" in allowed
        if strategy == "tp_cross_node":
            return "tp" in allowed
        return strategy in allowed
