"""How one planned instance runs: vLLM's own processes, DP ranks, native multi-node or Ray."""

from __future__ import annotations

from vllm_fleet.errors import PlanError
from vllm_fleet.planning.wishes import Wishes

BACKENDS = ("auto", "ray", "native")


def choose_executor(name: str, gpus_per_node: dict[str, int], dp: int, wishes: Wishes) -> tuple[str, str]:
    """How one instance runs, and why: ``mp`` (one node, vLLM's own processes),
    ``dp`` (DP ranks on every node, the others headless), ``native`` (``--nnodes``,
    no Ray) or ``ray`` (``--distributed-executor-backend ray`` on the head)."""
    backend = wishes.multinode_backend
    if backend not in BACKENDS:
        raise PlanError(
            "vllm_fleet_multinode_backend",
            f"must be one of {list(BACKENDS)}, got {backend!r}",
            "use auto, ray (vLLM on a Ray cluster) or native (vllm serve --nnodes on every node)",
        )
    if len(gpus_per_node) == 1:
        return "mp", "one node: vLLM's own worker processes, no Ray"
    if dp > 1:
        return "dp", "DP across nodes: each node runs its local DP ranks, the head answers HTTP, no Ray"
    even = len(set(gpus_per_node.values())) == 1
    if backend == "native":
        if not even:
            raise PlanError(
                "vllm_fleet_multinode_backend",
                f"native needs the same GPU count on every node of {name} (vLLM: world_size % nnodes == 0), "
                f"the plan has {gpus_per_node}",
                "set vllm_fleet_multinode_backend: ray (or auto), or give the instance nodes of one size",
            )
        return "native", "vllm_fleet_multinode_backend: native (vllm serve --nnodes on every node, no Ray)"
    if backend == "ray":
        return "ray", "vllm_fleet_multinode_backend: ray (vLLM places its ranks on the Ray cluster)"
    if not even:
        return "ray", (
            f"native multi-node needs the same GPU count on every node, the stages hold {gpus_per_node}: "
            "Ray places the ranks"
        )
    if wishes.ray_available:
        return "ray", "the serving environment has Ray (a derived image with Ray pinned): Ray places the ranks"
    return "native", "no Ray in the serving environment: vLLM's own multi-node mode (--nnodes/--node-rank), no Ray"
