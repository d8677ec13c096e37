"""The planner's MoE / EP rules against vLLM 0.32's own functions (one oracle call)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from tests.oracle.conftest import OracleRun
from vllm_fleet.accounting.activation import _moe_activation
from vllm_fleet.accounting.base import DEEPEP_BUFFER_MIB, DEFAULT_ALL2ALL_BACKEND, EPLB_WINDOW, GIB, Accounting
from vllm_fleet.accounting.memory import moe_parallel
from vllm_fleet.accounting.settings import Settings
from vllm_fleet.model.spec import load_model

# (global experts, EP size): even, uneven (remainder to the first ranks), EPLB-padded.
EXPERT_MAPS = [(128, 8), (128, 3), (10, 4), (160, 8), (256, 6)]
# (tokens, intermediate per rank, hidden, topk): shrunk MoE layers.
WORKSPACES = [(16, 192, 256, 8), (48, 64, 512, 2), (7, 1024, 128, 4)]

CODE = """
from vllm.config import EPLBConfig, ParallelConfig
from vllm.model_executor.layers.fused_moe.activation import MoEActivation
from vllm.model_executor.layers.fused_moe.expert_map_manager import determine_expert_map
from vllm.model_executor.layers.fused_moe.experts.triton_moe import TritonExperts
import vllm.envs as envs

maps = []
for experts, ep in DATA["maps"]:
    maps.append([determine_expert_map(ep, rank, experts)[0] for rank in range(ep)])
triton = object.__new__(TritonExperts)
shapes = []
for m, inter, hidden, topk in DATA["workspaces"]:
    shapes.append(
        TritonExperts.workspace_shapes(triton, m, 2 * inter, hidden, topk, 128, 128, None, MoEActivation.SILU)
    )
RESULT = {
    "maps": maps,
    "shapes": shapes,
    "default_backend": ParallelConfig().all2all_backend,
    "naive_backend": ParallelConfig(all2all_backend="naive").all2all_backend,
    "eplb_window": EPLBConfig().window_size,
    "deepep_mb": envs.VLLM_DEEPEP_BUFFER_SIZE_MB,
}
"""


@pytest.fixture(scope="module")
def vllm(oracle: OracleRun) -> dict[str, Any]:
    result: dict[str, Any] = oracle(CODE, {"maps": EXPERT_MAPS, "workspaces": WORKSPACES})
    return result


def test_busiest_rank_matches_determine_expert_map(vllm: dict[str, Any]) -> None:
    spec = load_model("Qwen/Qwen3-30B-A3B")
    for (experts, ep), counts in zip(EXPERT_MAPS, vllm["maps"], strict=True):
        assert sum(counts) == experts
        # The same global count two ways: a model with that many experts, and 128 + EPLB
        # redundant experts where it has more (determine_expert_counts adds them).
        plain = replace(spec, num_experts=experts)
        settings = Settings(data_parallel_size=ep, enable_expert_parallel=True)
        assert moe_parallel(plain, settings).local_experts == max(counts), (experts, ep)
        if experts > spec.num_experts:
            eplb = Settings(
                data_parallel_size=ep,
                enable_expert_parallel=True,
                enable_eplb=True,
                num_redundant_experts=experts - spec.num_experts,
            )
            assert moe_parallel(spec, eplb).local_experts == max(counts), (experts, ep)


def test_workspace_bytes_match_triton_experts_shapes(vllm: dict[str, Any]) -> None:
    spec = load_model("Qwen/Qwen3-30B-A3B")
    acct = Accounting.for_version("0.32.0")
    assert acct.moe_unchunked
    for (m, inter, hidden, topk), (ws13, ws2, out) in zip(WORKSPACES, vllm["shapes"], strict=True):
        shrunk = replace(spec, hidden_size=hidden, moe_intermediate_size=inter, num_experts_per_tok=topk)
        planner = _moe_activation(shrunk, 1, 1, m, 2, acct).workspace
        # FusedMoEKernel._allocate_buffers: one buffer for workspace13 and the output, one for workspace2.
        common = max(ws13[0] * ws13[1] * ws13[2], out[0] * out[1])
        assert planner == (common + ws2[0] * ws2[1] * ws2[2]) * 2, (m, inter, hidden, topk)


def test_defaults_match_parallel_config_and_envs(vllm: dict[str, Any]) -> None:
    assert vllm["default_backend"] == DEFAULT_ALL2ALL_BACKEND
    assert vllm["naive_backend"] == DEFAULT_ALL2ALL_BACKEND
    spec = load_model("Qwen/Qwen3-30B-A3B")
    assert (
        moe_parallel(spec, Settings(data_parallel_size=2, enable_expert_parallel=True, all2all_backend="naive")).all2all
        == (vllm["naive_backend"])
    )
    assert vllm["eplb_window"] == EPLB_WINDOW
    assert vllm["deepep_mb"] == DEEPEP_BUFFER_MIB
    assert GIB == 1 << 30
