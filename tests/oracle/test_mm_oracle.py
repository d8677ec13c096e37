"""The multimodal model (vllm_fleet/accounting/multimodal.py) against vLLM 0.32's own code on CPU.

One oracle call for the module: vLLM's Qwen2.5-VL / Qwen3-VL ProcessingInfo (the max tokens
per image and video, from stand-in hf configs and processors built without files), the
encoder budget (``compute_mm_encoder_budget``, ``MultiModalBudget._get_max_items``), the
Pixtral patch grid, and the parameter counts of the towers as transformers builds them
(the checkpoint's tensors, which vLLM loads) on shrunk configs.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.oracle.conftest import OracleRun
from vllm_fleet.accounting.multimodal import (
    encoder_profile,
    max_tokens_per_item,
    pixtral_tokens,
    vision_weight_elements,
)
from vllm_fleet.model.spec import spec_from_config

TEXT = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
        "intermediate_size": 128, "vocab_size": 1000, "max_position_embeddings": 4096}  # fmt: skip
QWEN25_VISION = {"depth": 3, "hidden_size": 48, "intermediate_size": 88, "num_heads": 4, "out_hidden_size": 64,
                 "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2, "window_size": 112,
                 "fullatt_block_indexes": [1], "in_chans": 3}  # fmt: skip
QWEN3_VISION = {"depth": 3, "hidden_size": 48, "intermediate_size": 88, "num_heads": 4, "out_hidden_size": 64,
                "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2, "num_position_embeddings": 64,
                "deepstack_visual_indexes": [0, 2], "in_channels": 3}  # fmt: skip
# Qwen3.5 / 3.6: Qwen3-VL's tower without deepstack mergers (Qwen3_5VisionConfig has no indexes).
QWEN35_VISION = {k: v for k, v in QWEN3_VISION.items() if k != "deepstack_visual_indexes"}
SIGLIP = {"model_type": "siglip_vision_model", "hidden_size": 48, "intermediate_size": 88, "num_hidden_layers": 3,
          "num_attention_heads": 4, "image_size": 112, "patch_size": 14, "vision_use_head": False}  # fmt: skip
PIXTRAL = {"model_type": "pixtral", "hidden_size": 48, "intermediate_size": 88, "num_hidden_layers": 3,
           "num_attention_heads": 4, "image_size": 224, "patch_size": 14, "head_dim": 12}  # fmt: skip
# (image min/max pixels, video min/max pixels (Qwen3), max_model_len) cases.
QWEN_CASES = [
    (3136, 12845056, 4096, 25165824, 128000),
    (3136, 12845056, 4096, 25165824, 32768),
    (3136, 1003520, 4096, 786432, 8192),
    (3136, 200704, 65536, 1572864, 2000),
]

ORACLE_CODE = r"""
import sys, types, importlib.machinery
import transformers  # decides torchvision is unavailable before the stub below exists
def _stub_attr(attr):
    if attr.startswith("__"):
        raise AttributeError(attr)
    return type(attr, (), {})
# The oracle venv has no torchvision; transformers' Qwen2-VL image module imports it at the top
# for its torchvision backend only (smart_resize and the PIL backend do not use it).
for name in ("torchvision", "torchvision.transforms", "torchvision.transforms.v2",
             "torchvision.transforms.v2.functional", "torchvision.transforms.functional"):
    if name not in sys.modules:
        stub = types.ModuleType(name)
        stub.__spec__ = importlib.machinery.ModuleSpec(name, None)
        stub.__getattr__ = _stub_attr
        sys.modules[name] = stub
import math, torch
from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLConfig
from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLConfig
from vllm.model_executor.models.qwen2_5_vl import Qwen2_5_VLProcessingInfo
from vllm.model_executor.models.qwen3_vl import Qwen3VLProcessingInfo
from vllm.model_executor.models.pixtral import _get_pixtral_hf_num_image_tokens
from vllm.v1.core.encoder_cache_manager import compute_mm_encoder_budget
from vllm.multimodal.encoder_budget import MultiModalBudget
from types import SimpleNamespace

def info_for(base, cfg, image_proc, video_proc=None):
    class Info(base):
        def __init__(self):
            pass
        def get_hf_config(self):
            return cfg
        def get_image_processor(self, **kw):
            return image_proc
        def get_video_processor(self, **kw):
            return video_proc
        def _merge_and_resolve_mm_processor_kwargs(self, mm_kwargs):
            return dict(mm_kwargs)
    return Info()

out = {"qwen25": [], "qwen3": [], "budget": [], "pixtral": [], "params": {}}
text = DATA["text"]
for lo, hi, vlo, vhi, seq in DATA["qwen_cases"]:
    cfg = Qwen2_5_VLConfig(vision_config=DATA["qwen25_vision"], text_config=text)
    # What vLLM reads of the processors: their size (and the video's temporal patch).
    ip = SimpleNamespace(size={"shortest_edge": lo, "longest_edge": hi})
    info = info_for(Qwen2_5_VLProcessingInfo, cfg, ip)
    out["qwen25"].append(dict(info.get_mm_max_tokens_per_item(seq, {"image": 1, "video": 1})))
    cfg3 = Qwen3VLConfig(vision_config=DATA["qwen3_vision"], text_config=text)
    ip3 = ip
    vp3 = SimpleNamespace(size={"shortest_edge": vlo, "longest_edge": vhi}, temporal_patch_size=2)
    info3 = info_for(Qwen3VLProcessingInfo, cfg3, ip3, vp3)
    out["qwen3"].append(dict(info3.get_mm_max_tokens_per_item(seq, {"image": 1, "video": 1})))

for case in DATA["budget_cases"]:
    sched = SimpleNamespace(max_num_encoder_input_tokens=case["mbt"], encoder_cache_size=case["mbt"],
                            max_num_batched_tokens=case["mbt"], disable_chunked_mm_input=False,
                            enable_chunked_prefill=True)
    compute, cache = compute_mm_encoder_budget(sched, case["per_item"])
    b = object.__new__(MultiModalBudget)
    b.encoder_compute_budget, b.encoder_cache_size = compute, cache
    b.mm_limits = case["limits"]
    b.max_model_len = case["mml"]
    b.max_num_reqs = case["seqs"]
    b.scheduler_config = sched
    b.mm_max_toks_per_item = case["per_item"]
    modality = b.get_modality_with_max_tokens()
    out["budget"].append([modality, b.get_encoder_budget(), b._get_max_items(modality, case["per_item"][modality])[1]])

for size, patch in DATA["pixtral_cases"]:
    rows, cols = _get_pixtral_hf_num_image_tokens((size, size), (patch, patch))
    out["pixtral"].append(rows * cols)

def count(module):
    return sum(p.numel() for p in module.parameters())

with torch.device("meta"):
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionModel
    from transformers.models.siglip.modeling_siglip import SiglipVisionModel
    from transformers.models.siglip.configuration_siglip import SiglipVisionConfig
    from transformers.models.gemma3.configuration_gemma3 import Gemma3Config
    from transformers.models.gemma3.modeling_gemma3 import Gemma3MultiModalProjector
    from transformers.models.pixtral.modeling_pixtral import PixtralVisionModel
    from transformers.models.pixtral.configuration_pixtral import PixtralVisionConfig
    from transformers.models.mistral3.configuration_mistral3 import Mistral3Config
    from transformers.models.mistral3.modeling_mistral3 import Mistral3MultiModalProjector
    cfg = Qwen2_5_VLConfig(vision_config=DATA["qwen25_vision"], text_config=text)
    out["params"]["qwen2_5_vl"] = count(Qwen2_5_VisionTransformerPretrainedModel._from_config(cfg.vision_config))
    cfg3 = Qwen3VLConfig(vision_config=DATA["qwen3_vision"], text_config=text)
    out["params"]["qwen3_vl"] = count(Qwen3VLVisionModel._from_config(cfg3.vision_config))
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5Config
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5VisionModel
    cfg35 = Qwen3_5Config(vision_config=DATA["qwen35_vision"], text_config=text)
    out["params"]["qwen3_5"] = count(Qwen3_5VisionModel._from_config(cfg35.vision_config))
    g = Gemma3Config(vision_config=DATA["siglip"], text_config={**text, "head_dim": 16},
                     mm_tokens_per_image=16)
    tower = SiglipVisionModel._from_config(g.vision_config)
    out["params"]["gemma3"] = count(tower) + count(Gemma3MultiModalProjector(g))
    m = Mistral3Config(vision_config=DATA["pixtral"], text_config=text)
    out["params"]["mistral3"] = count(PixtralVisionModel._from_config(m.vision_config)) + count(
        Mistral3MultiModalProjector(m))
RESULT = out
"""

BUDGET_CASES: list[dict[str, Any]] = [
    {"per_item": {"image": 16384, "video": 114688}, "mbt": 8192, "limits": {"image": 999, "video": 999},
     "mml": 128000, "seqs": 1024},
    {"per_item": {"image": 256}, "mbt": 8192, "limits": {"image": 999}, "mml": 131072, "seqs": 256},
    {"per_item": {"image": 256}, "mbt": 8192, "limits": {"image": 2}, "mml": 4096, "seqs": 3},
    {"per_item": {"image": 576}, "mbt": 2048, "limits": {"image": 999}, "mml": 4096, "seqs": 256},
    {"per_item": {"image": 3025}, "mbt": 16384, "limits": {"image": 1}, "mml": 2000, "seqs": 4},
]  # fmt: skip
PIXTRAL_CASES = [(1540, 28), (1024, 16), (224, 28), (1000, 28)]


@pytest.fixture(scope="module")
def truth(oracle: OracleRun) -> dict[str, Any]:
    data = {
        "text": TEXT,
        "qwen25_vision": QWEN25_VISION,
        "qwen3_vision": QWEN3_VISION,
        "qwen35_vision": QWEN35_VISION,
        "siglip": SIGLIP,
        "pixtral": PIXTRAL,
        "qwen_cases": QWEN_CASES,
        "budget_cases": BUDGET_CASES,
        "pixtral_cases": PIXTRAL_CASES,
    }
    result: dict[str, Any] = oracle(ORACLE_CODE, data)
    return result


def _qwen(model_type: str, vision: dict[str, Any], case: tuple[int, int, int, int, int]) -> Any:
    lo, hi, vlo, vhi, _ = case
    cfg = {"model_type": model_type, "text_config": {**TEXT, "model_type": model_type}, "vision_config": vision}
    image = {"min_pixels": lo, "max_pixels": hi}
    video = {"size": {"shortest_edge": vlo, "longest_edge": vhi}}
    spec = spec_from_config(cfg, model_type, processors=(image, video))
    assert spec.vision is not None
    return spec.vision


@pytest.mark.parametrize("index", range(len(QWEN_CASES)))
def test_qwen_max_tokens_per_item(truth: dict[str, Any], index: int) -> None:
    case = QWEN_CASES[index]
    for model_type, vision, key in (("qwen2_5_vl", QWEN25_VISION, "qwen25"), ("qwen3_vl", QWEN3_VISION, "qwen3")):
        got = {m: t for m, (t, _) in max_tokens_per_item(_qwen(model_type, vision, case), case[4]).items()}
        assert got == truth[key][index], (model_type, case)


@pytest.mark.parametrize("index", range(len(BUDGET_CASES)))
def test_encoder_budget_items(truth: dict[str, Any], index: int) -> None:
    """The planner's dummy batch (modality, budget, items) is MultiModalBudget's."""
    case = BUDGET_CASES[index]
    modality, budget, items = truth["budget"][index]
    per_item = case["per_item"]
    if "video" in per_item:
        vision = _qwen("qwen2_5_vl", QWEN25_VISION, (3136, 12845056, 0, 0, case["mml"]))
        # A tower whose largest items are the ones of this case (14 x 14 px patches, merge 2).
        got_tokens = {m: t for m, (t, _) in max_tokens_per_item(vision, case["mml"]).items()}
        assert got_tokens == per_item
    else:
        tokens = per_item["image"]
        side = int(tokens**0.5)
        vision_cfg = {**SIGLIP, "image_size": 14 * side}
        cfg = {"model_type": "gemma3", "text_config": TEXT, "vision_config": vision_cfg, "mm_tokens_per_image": tokens}
        vision = spec_from_config(cfg, "g").vision
        assert vision is not None
    profile = encoder_profile(
        vision,
        limits=case["limits"],
        max_model_len=case["mml"],
        max_num_batched_tokens=case["mbt"],
        max_num_seqs=case["seqs"],
        tp=1,
        data_mode=False,
        db=2,
    )
    assert profile is not None
    assert (profile.modality, profile.budget, profile.items) == (modality, budget, items)


def test_pixtral_patch_grid(truth: dict[str, Any]) -> None:
    assert [pixtral_tokens(size, patch) for size, patch in PIXTRAL_CASES] == truth["pixtral"]


@pytest.mark.parametrize(
    ("model_type", "vision"),
    [("qwen2_5_vl", QWEN25_VISION), ("qwen3_vl", QWEN3_VISION), ("qwen3_5", QWEN35_VISION), ("gemma3", SIGLIP),
     ("mistral3", PIXTRAL)],
)  # fmt: skip
def test_tower_parameters(truth: dict[str, Any], model_type: str, vision: dict[str, Any]) -> None:
    """Tower + projector elements (sharded + replicated) are the checkpoint's."""
    cfg = {"model_type": model_type, "text_config": TEXT, "vision_config": vision, "mm_tokens_per_image": 16}
    spec = spec_from_config(cfg, model_type)
    assert spec.vision is not None
    shard, repl = vision_weight_elements(spec.vision)
    assert shard + repl == truth["params"][model_type]
