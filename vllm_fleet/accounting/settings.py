"""What the planner is asked to plan with (every serving option vLLM's memory depends on, checked
where vLLM checks it) and the device it plans for.

Pure Python, no torch or vLLM import.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vllm_fleet import coerce, schema
from vllm_fleet.accounting import options
from vllm_fleet.accounting.base import ALL2ALL_BACKENDS, default_gpu_memory_utilization
from vllm_fleet.accounting.multimodal import parse_limits
from vllm_fleet.errors import PlanError
from vllm_fleet.model.spec import (
    ModelSpec,
)
from vllm_fleet.schema import DTYPES, KV_CACHE_DTYPES, LIMITS, MAX_GPU_MEMORY_GIB, ServingOptions

__all__ = ["LIMITS", "MAX_GPU_MEMORY_GIB", "Device", "Settings", "check_count", "env_flag"]


def env_flag(env: Mapping[str, str], name: str) -> bool | None:
    """A vLLM boolean variable as vllm/envs.py reads it (``bool(int(value))``), None where unset;
    a value int() refuses stops vLLM at start-up, so the plan refuses it."""
    if name not in env:
        return None
    value = str(env[name]).strip()
    try:
        return bool(int(value))
    except ValueError as exc:
        raise PlanError(
            f"--env {name}", f"{value!r} is not an integer (vLLM reads it with int())", "use 0 or 1"
        ) from exc


def check_count(value: Any, flag: str, maximum: int, required: bool = False) -> None:
    """A positive integer up to ``maximum`` (None passes unless ``required``); booleans and
    floats are refused (``true`` is not 1)."""
    if value is None and not required:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        fix = f"pass {flag} 1 or more" + ("" if required else ", or omit it")
        raise PlanError(flag, f"must be a positive integer, got {value!r}", fix)
    if value > maximum:
        raise PlanError(
            flag, f"{value:,} is above {maximum:,}, the largest the planner accepts", f"use {maximum:,} or less"
        )


@dataclass(frozen=True)
class Settings(ServingOptions):
    """One instance's ``vllm serve`` options as the memory model reads them: the declared
    options (vllm_fleet/schema.py) with the layout the planner chose filled in, and what only
    the accounting reads."""

    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    # None: vLLM's own default for the release planned for (:attr:`utilization`).
    gpu_memory_utilization: float | None = None
    enable_expert_parallel: bool = False
    layer_partition: list[int] | None = None
    # As vllm serve --kv-cache-memory-bytes: the KV pool's size (the plan renders it for the CPU
    # build, whose KV pool the planner sizes).
    kv_cache_memory_bytes: int | None = None
    engine: str | None = None
    # The draft model speculative_config names (EAGLE / draft_model); None: estimate loads it.
    draft_spec: ModelSpec | None = None
    # VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE (vllm/envs.py, "1" by default in 0.32):
    # with 0, VllmConfig.__post_init__ turns the hybrid KV cache manager off for models with
    # chunked local attention (Llama 4), and every layer then keeps the whole sequence.
    chunked_local_attn_hybrid_kv: bool = True
    # VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS as the operator's environment sets it; None: unset,
    # the fleet's default (off on unified memory, vLLM's own elsewhere: unified.graphs_in_budget).
    estimate_cudagraphs: bool | None = None

    @property
    def mm_limits(self) -> dict[str, int] | None:
        """The items per prompt by modality vLLM takes: ``--language-model-only`` makes every one 0
        (MultiModalConfig.get_limit_per_prompt), else ``--limit-mm-per-prompt``."""
        if self.language_model_only:
            return dict.fromkeys(("image", "video", "audio"), 0)
        return parse_limits(self.limit_mm_per_prompt)

    @property
    def mm_video_frames(self) -> int | None:
        """``--limit-mm-per-prompt``'s video num_frames: the frames of a dummy video, at most the model's."""
        video = (self.limit_mm_per_prompt or {}).get("video")
        return video.get("num_frames") if isinstance(video, dict) else None

    @property
    def utilization(self) -> float:
        """The GPU memory share vLLM uses: as asked, else its default in the release planned for."""
        if self.gpu_memory_utilization is not None:
            return self.gpu_memory_utilization
        return default_gpu_memory_utilization(self.vllm_version)

    def validate(self) -> None:
        for name in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"):
            check_count(getattr(self, name), "--" + name.replace("_", "-"), LIMITS[name], required=True)
        # Every declared number within its declaration (vllm_fleet/schema.py), named by its flag;
        # the choices below, with what each one means.
        coerce.check_typed(self, lambda name: schema.by_name()[name].cli or name, kinds=("int", "float"))
        if self.layer_partition is not None and (
            not isinstance(self.layer_partition, list)
            or not all(isinstance(n, int) and not isinstance(n, bool) for n in self.layer_partition)
        ):
            raise PlanError(
                "--layer-partition", f"must be a list of layer counts, got {self.layer_partition!r}", "e.g. 40,40"
            )
        if self.kv_cache_memory_bytes is not None:
            check_count(self.kv_cache_memory_bytes, "--kv-cache-memory-bytes", 1 << 50)
        # Checked as vLLM parses it, and kept as given: its dummy options (num_frames...) are rendered too.
        parse_limits(self.limit_mm_per_prompt)
        check_count(self.mm_max_pixels, "--mm-processor-kwargs max_pixels", 1 << 36)
        if self.mm_encoder_tp_mode not in ("weights", "data"):
            raise PlanError(
                "--mm-encoder-tp-mode", f"must be weights or data, got {self.mm_encoder_tp_mode!r}", "use weights"
            )
        if self.dtype not in DTYPES:
            raise PlanError("--dtype", f"unknown dtype '{self.dtype}'", "use auto, bfloat16, float16 or float32")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise PlanError(
                "--kv-cache-dtype",
                f"unknown KV cache dtype '{self.kv_cache_dtype}'",
                "use auto, fp8, fp8_e4m3 or fp8_e5m2",
            )
        redundant = self.num_redundant_experts
        if isinstance(redundant, bool) or not isinstance(redundant, int) or not 0 <= redundant <= 1 << 16:
            raise PlanError("--eplb-config", f"num_redundant_experts must be 0 or more, got {redundant!r}", "e.g. 32")
        if redundant and not self.enable_eplb:
            # FusedMoE (layer.py): "Redundant experts are only supported with EPLB."
            raise PlanError(
                "--eplb-config", "redundant experts are only supported with EPLB (vLLM asserts it)", "add --enable-eplb"
            )
        if self.all2all_backend not in ALL2ALL_BACKENDS:
            raise PlanError(
                "--all2all-backend",
                f"unknown all2all backend '{self.all2all_backend}'",
                "use one of " + ", ".join(sorted(ALL2ALL_BACKENDS)),
            )
        options.validate(self)


@dataclass(frozen=True)
class Device:
    """One GPU (or the CPU) as the planner sees it."""

    name: str
    total_gib: float
    kind: str = "cuda"  # cuda, rocm, cpu
    sm_major: int = 9
    free_gib: float | None = None
    # Compute capability x 10 (75 for a T4); None: sm_major x 10.
    capability: int | None = None
    # An integrated GPU sharing the host's memory (GB10): vLLM's free memory is the host's
    # MemAvailable, which vLLM's own processes and the OS draw on too.
    unified_memory: bool = False
    # Peer-to-peer access between its GPUs (vLLM's custom all-reduce needs it).
    p2p: bool = True

    @property
    def compute_capability(self) -> int:
        return self.capability if self.capability is not None else self.sm_major * 10
