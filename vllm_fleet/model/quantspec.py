"""How a checkpoint's linear weights are stored, per layer where the checkpoint says so: the
bytes of one format (:class:`QuantSpec`), ModelOpt's excluded modules (left in the model
dtype) and its MIXED_PRECISION table (one algorithm per module, unlisted modules unquantized),
read the way vLLM 0.32's ``modelopt.py`` reads them.

The planner counts weights per part of a decoder layer (attention, mixer, MLP, routed and
shared experts, the DeepSeek indexer) and the LM head; a checkpoint names modules
(``model.layers.3.self_attn.q_proj``). :func:`module_part` maps a module name to its part, so
a per-module table becomes a per-part one; :func:`part_excluded` asks ModelOpt's exclusion
rules about the usual module names of a part.

Pure Python, no torch or vLLM import.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from fnmatch import fnmatch
from functools import lru_cache
from typing import Any

from vllm_fleet.errors import PlanError
from vllm_fleet.model.values import _as_int, _kind, _show

PARTS = ("attn", "mixer", "mlp", "experts", "shared", "indexer", "head")

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.(.+)$")
# The module names a part has in the architectures vLLM serves (HF names; vLLM's fused
# qkv_proj / gate_up_proj too), tried against the exclusion patterns.
_PART_NAMES = {
    "attn": (
        "self_attn.q_proj",
        "self_attn.qkv_proj",
        "self_attn.o_proj",
        "attention.wqkv",
        "self_attn",
        "self_attn.q_a_proj",
        "self_attn.kv_a_proj_with_mqa",
        "self_attn.kv_b_proj",  # MLA
        "mixer.qkv_proj",
        "mixer.q_proj",
        "mixer.o_proj",  # Nemotron-H's attention blocks
    ),
    "mixer": ("mixer.in_proj", "linear_attn.in_proj_qkvz", "mamba.in_proj", "mixer", "linear_attn"),
    "mlp": (
        "mlp.gate_proj",
        "mlp.gate_up_proj",
        "mlp.down_proj",
        "mlp.up_proj",
        "feed_forward.w1",
        "mlp",
        "mixer.up_proj",
        "mixer.down_proj",  # Nemotron-H's MLP blocks
    ),
    "experts": ("mlp.experts", "block_sparse_moe.experts", "mlp.experts.0.gate_proj", "mlp.experts.0.down_proj"),
    "shared": ("mlp.shared_experts.gate_proj", "mlp.shared_expert.gate_proj", "mlp.shared_experts"),
    "indexer": ("self_attn.indexer.wq_b",),
    "latent": ("mixer.fc1_latent_proj", "mixer.fc2_latent_proj"),  # Nemotron-H's latent MoE
}
_ATTN_LEAVES = frozenset(
    {"q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj",
     "wqkv", "wo"}
)  # fmt: skip
_MLP_LEAVES = frozenset({"gate_proj", "up_proj", "down_proj", "gate_up_proj", "w1", "w2", "w3", "fc1", "fc2"})
_ROOTS = ("model.", "model.language_model.", "language_model.model.", "backbone.", "")


def module_part(name: str) -> tuple[int | None, str]:
    """(layer index, part) of a checkpoint module name; (None, "head") for the LM head,
    (None, "other") for what the planner does not count per layer (embeddings, vision)."""
    found = _LAYER.search(name)
    if found is None:
        return None, "head" if name.rsplit(".", maxsplit=1)[-1] == "lm_head" else "other"
    index, rest = int(found.group(1)), found.group(2)
    leaf = rest.rsplit(".", maxsplit=1)[-1]
    if "shared_expert" in rest:
        return index, "shared"
    if "latent_proj" in rest:
        return index, "latent"
    if "experts" in rest:
        return index, "experts"
    if "indexer" in rest:
        return index, "indexer"
    # By the projection first: Nemotron-H names attention, MLP and Mamba blocks all "mixer".
    if leaf in _ATTN_LEAVES and "linear_attn" not in rest:
        return index, "attn"
    if leaf in _MLP_LEAVES:
        return index, "mlp"
    if any(t in rest for t in ("linear_attn", "mixer", "mamba")):
        return index, "mixer"
    if "attn" in rest or "attention" in rest:
        return index, "attn"
    if any(t in rest for t in ("mlp", "feed_forward", "ffn", "moe")):
        return index, "mlp"
    return index, "other"


def _excluded(name: str, patterns: tuple[str, ...]) -> bool:
    """``ModelOptQuantConfigBase.is_layer_excluded``: an exact name, a pattern contained in the
    name (older ModelOpt checkpoints), or a wildcard match; ``apply_vllm_mapper`` also reads
    ``a.b*`` as ``a.b`` and ``a.b.*``."""
    for pattern in patterns:
        if pattern == name or (pattern and pattern in name) or fnmatch(name, pattern):
            return True
        if len(pattern) >= 2 and pattern[-1] == "*" and pattern[-2] != ".":
            base = pattern[:-1]
            if name == base or fnmatch(name, base + ".*"):
                return True
    return False


def part_excluded(patterns: tuple[str, ...], index: int | None, part: str) -> bool:
    """Whether ModelOpt's exclusion list leaves ``part`` of layer ``index`` unquantized (any of
    the part's usual module names excluded)."""
    if not patterns:
        return False
    if part == "head":
        return _excluded("lm_head", patterns)
    names = _PART_NAMES.get(part, ())
    return any(_excluded(f"{root}layers.{index}.{n}", patterns) for root in _ROOTS for n in names)


@dataclass(frozen=True)
class QuantSpec:
    """How linear weights inside the decoder layers are stored.

    ``weight_bits`` is the stored bits per weight; ``group_size`` the number of
    weights sharing one scale (0 = per channel / per tensor, negligible);
    ``scale_bytes`` the bytes of one scale (plus zero point when asymmetric).
    ``experts_only`` marks formats that quantize only MoE experts (mxfp4 in
    gpt-oss). ``lm_head`` says whether the output projection is quantized.
    ``exclude``: ModelOpt's excluded-module patterns (those parts stay in the model dtype).
    ``table``: a per-part format ((layer index or -1 for the head, part) -> format, None for
    unquantized) when the checkpoint names one per module (ModelOpt MIXED_PRECISION); with
    ``per_part`` set, a part the table does not name is unquantized, as vLLM leaves it.
    """

    method: str
    weight_bits: int
    group_size: int = 0
    scale_bytes: float = 0.0
    experts_only: bool = False
    lm_head: bool = False
    exclude: tuple[str, ...] = ()
    table: tuple[tuple[tuple[int, str], QuantSpec | None], ...] = ()
    per_part: bool = False
    # compressed-tensors: (target, format) in config_groups order, and the ignore list.
    targets: tuple[tuple[str, QuantSpec], ...] = ()
    ignore: tuple[str, ...] = ()

    @property
    def bytes_per_weight(self) -> float:
        extra = self.scale_bytes / self.group_size if self.group_size else 0.0
        return self.weight_bits / 8 + extra

    def for_part(self, index: int | None, part: str) -> QuantSpec | None:
        """The format of ``part`` of layer ``index`` (None: the head): the table's entry, or
        None when the table names it not (MIXED_PRECISION) or the exclusion list names it;
        otherwise this format."""
        if part_excluded(self.exclude, index, part):
            return None
        if self.targets:
            return _ct_part(self, index, part)
        if self.per_part:
            key = (-1 if index is None else index, part)
            return next((q for k, q in self.table if k == key), None)
        if part == "head" and not self.lm_head:
            return None
        return self


# ModelOpt's linear algorithms (vLLM 0.32's LINEAR_ALGOS) and their bytes; NVFP4's scale group
# is the config's group_size (16 unless it says otherwise).
_FP8 = QuantSpec("fp8", 8)
_FP8_BLOCK = QuantSpec("fp8", 8, group_size=128 * 128, scale_bytes=4)
_MODELOPT_ALGOS: dict[str, QuantSpec] = {
    "FP8": _FP8,
    "FP8_PER_CHANNEL_PER_TOKEN": _FP8,
    "FP8_PB_WO": _FP8_BLOCK,
    "NVFP4": QuantSpec("nvfp4", 4, 16, 1),
    "W4A16_NVFP4": QuantSpec("nvfp4", 4, 16, 1),
    "MXFP8": QuantSpec("mxfp8", 8, 32, 1),
}
MODELOPT_ALGOS = (*_MODELOPT_ALGOS, "MIXED_PRECISION")
# Inside a MIXED_PRECISION table only: block FP8 for routed experts (FP8_BLOCK_SCALES is an
# older name of FP8_PB_WO there, and leaves linear layers unquantized), and b12x's GGML block
# codecs (vllm/utils/b12x.py: weights per block, bytes per block) for linear layers, the LM
# head and routed experts.
_BLOCK_FP8_MOE = ("FP8_PB_WO", "FP8_BLOCK_SCALES")
_BLOCK_CODECS = {"Q8_0": (32, 34), "IQ2_XS": (256, 74), "IQ2_XXS": (256, 66)}
_MIXED_ALGOS = (*_MODELOPT_ALGOS, "FP8_BLOCK_SCALES", *_BLOCK_CODECS)
_USE = "use the checkpoint's own quantization config"


def _group_size(value: Any, field: str) -> int | None:
    """ModelOpt's group_size: None when unset, else an integer (a string of one is taken)."""
    if value is None:
        return None
    try:
        size = int(value) if not isinstance(value, bool | float) else None
    except (TypeError, ValueError):
        size = None
    if size is None or size < 1:
        raise PlanError(field, f"{_show(value)} is not a group size (vLLM: group_size must be an integer)", _USE)
    return size


def _with_group(fmt: QuantSpec, group: int | None) -> QuantSpec:
    return QuantSpec(fmt.method, fmt.weight_bits, group, fmt.scale_bytes) if group and fmt.method == "nvfp4" else fmt


def _mixed_format(name: str, recipe: Any, part: str, nvfp4_group: int, where: str) -> QuantSpec | None:
    """One quantized_layers entry as ``ModelOptMixedPrecisionConfig.get_quant_method`` serves the
    part it names: None where the part stays unquantized."""
    field = f"{where}.quantized_layers.{name}"
    algo = str(recipe.get("quant_algo", "") if isinstance(recipe, Mapping) else "").upper()
    if algo not in _MIXED_ALGOS:
        raise PlanError(
            f"{field}.quant_algo",
            f"{_show(algo or None)} is not a ModelOpt linear algorithm vLLM knows: it would build the layer "
            "unquantized and fail on the checkpoint's quantized tensors",
            f"use one of {', '.join(_MIXED_ALGOS)}",
        )
    assert isinstance(recipe, Mapping)
    if algo in _BLOCK_CODECS:
        block, payload = _BLOCK_CODECS[algo]
        want = {"group_size": block, "block_payload_bytes": payload, "packing": "ggml"}
        if any(recipe.get(k) != v for k, v in want.items()):
            raise PlanError(
                field,
                f"unsupported {algo} block contract (vLLM refuses the checkpoint: it needs {want})",
                _USE,
            )
        bits = 8 if algo == "Q8_0" else 2
        return QuantSpec(algo.lower(), bits, block, payload - block * bits / 8)
    if algo in _BLOCK_FP8_MOE and part == "experts":
        size = _group_size(recipe.get("group_size"), f"{field}.group_size") or 128
        return QuantSpec("fp8", 8, group_size=size * size, scale_bytes=4)
    if algo == "FP8_BLOCK_SCALES":
        return None  # not a linear algorithm: vLLM leaves a linear layer it names unquantized
    return _with_group(_MODELOPT_ALGOS[algo], nvfp4_group)


def _mixed_spec(layers: Mapping[str, Any], exclude: tuple[str, ...], group: int | None, where: str) -> QuantSpec:
    """``ModelOptMixedPrecisionConfig``: each part at the algorithm its modules are listed with;
    a part whose modules differ counts at the widest (unquantized the widest of all)."""
    first_nvfp4 = next(
        (r.get("group_size", 16) for r in layers.values()
         if isinstance(r, Mapping) and str(r.get("quant_algo", "")).upper() in ("NVFP4", "W4A16_NVFP4")),
        16,
    )  # fmt: skip
    nvfp4_group = group or _group_size(first_nvfp4, f"{where}.quantized_layers.group_size") or 16
    block_sizes = {
        _group_size(r.get("group_size", 128), f"{where}.quantized_layers.{n}.group_size") or 128
        for n, r in layers.items()
        if isinstance(r, Mapping) and str(r.get("quant_algo", "")).upper() in _BLOCK_FP8_MOE
    }
    if len(block_sizes) > 1:
        raise PlanError(
            f"{where}.quantized_layers",
            f"MIXED_PRECISION requires all block-FP8 MoE layers to use one group_size, got {sorted(block_sizes)} "
            "(vLLM refuses the checkpoint)",
            _USE,
        )
    table: dict[tuple[int, str], QuantSpec | None] = {}
    for name, recipe in layers.items():
        index, part = module_part(str(name))
        fmt = _mixed_format(str(name), recipe, part, nvfp4_group, where)
        if part == "other":
            continue
        key = (-1 if index is None else index, part)
        if key not in table:
            table[key] = fmt
            continue
        seen = table[key]
        if seen is not None and (fmt is None or fmt.bytes_per_weight > seen.bytes_per_weight):
            table[key] = fmt
    widest = max((q.bytes_per_weight for q in table.values() if q), default=1.0)
    return QuantSpec(
        "modelopt_mixed",
        int(widest * 8),
        exclude=exclude,
        table=tuple(sorted(table.items())),
        per_part=True,
        lm_head=(-1, "head") in table,
    )


def modelopt_spec(qcfg: Mapping[str, Any], where: str) -> QuantSpec:
    """The bytes of a ModelOpt checkpoint as ``ModelOptQuantConfigBase.from_config`` reads its
    config: hf_quant_config.json's ``quantization`` (quant_algo, exclude_modules, group_size,
    quantized_layers) or config.json's flat form (quant_algo, ignore, group_size,
    quantized_layers). The LM head is quantized unless excluded. PlanError for what vLLM
    refuses (no or an unknown algorithm, exclusions that are not a list, the fields the
    nested NVFP4 and MXFP8 forms require, MIXED_PRECISION without its table)."""
    nested = "quantization" in qcfg
    body = qcfg.get("quantization") if nested else qcfg
    if not isinstance(body, Mapping):
        raise PlanError(f"{where}.quantization", f"must be an object, got {_kind(body)} (vLLM refuses it)", _USE)
    prefix = f"{where}.quantization" if nested else where
    algo = str(body.get("quant_algo") or "").upper()
    exclude_key = "exclude_modules" if nested else "ignore"
    exclude = body.get(exclude_key, [])
    if not isinstance(exclude, list) or not all(isinstance(p, str) for p in exclude):
        raise PlanError(
            f"{prefix}.{exclude_key}",
            f"must be a list of module names, got {_kind(exclude)}: vLLM refuses the checkpoint",
            _USE,
        )
    kv_algo = body.get("kv_cache_quant_algo") if nested else None
    if kv_algo is not None and not isinstance(kv_algo, str):
        raise PlanError(f"{prefix}.kv_cache_quant_algo", f"must be a string, got {_kind(kv_algo)}", _USE)
    if algo not in MODELOPT_ALGOS:
        raise PlanError(
            f"{prefix}.quant_algo",
            f"{_show(algo or None)} is not a ModelOpt algorithm vLLM knows (it accepts {', '.join(MODELOPT_ALGOS)})",
            _USE,
        )
    group = _group_size(body.get("group_size"), f"{prefix}.group_size")
    required = {"NVFP4": ("group_size", "kv_cache_quant_algo", "exclude_modules"),
                "MXFP8": ("kv_cache_quant_algo", "exclude_modules")}  # fmt: skip
    family = "NVFP4" if "NVFP4" in algo else algo
    missing = [k for k in required.get(family, ()) if k not in body] if nested else []
    if missing:
        raise PlanError(
            prefix,
            f"{family} quantization requires the fields {missing} (vLLM refuses the checkpoint without them)",
            _USE,
        )
    if algo != "MIXED_PRECISION":
        base = _with_group(_MODELOPT_ALGOS[algo], group)
        return replace(base, exclude=tuple(exclude), lm_head=True)
    layers = body.get("quantized_layers")
    if not isinstance(layers, Mapping) or not layers:
        raise PlanError(
            f"{prefix}.quantized_layers",
            "MIXED_PRECISION needs a non-empty quantized_layers mapping (vLLM refuses the checkpoint without)",
            _USE,
        )
    return _mixed_spec(layers, tuple(exclude), group, prefix)


def mxfp8_spec(qcfg: Mapping[str, Any], where: str) -> QuantSpec:
    """MiniMax-style ``quant_method: mxfp8`` checkpoints (ModelOptMxFp8Config.from_config): no
    quant_algo, ``ignored_layers`` as the exclusions; with either key, the ModelOpt forms."""
    if "quantization" in qcfg or qcfg.get("quant_algo"):
        return modelopt_spec(qcfg, where)
    ignored = qcfg.get("ignored_layers") or []
    if not isinstance(ignored, list) or not all(isinstance(p, str) for p in ignored):
        raise PlanError(f"{where}.ignored_layers", f"must be a list of module names, got {_kind(ignored)}", _USE)
    return replace(_MODELOPT_ALGOS["MXFP8"], exclude=tuple(ignored), lm_head=True)


# The class names vLLM's compressed-tensors matching sees for a part (a target "Linear" is
# matched by containment, and also stands for RoutedExperts: _add_fused_moe_to_target_scheme_map).
_PART_CLASSES = {"experts": ("RoutedExperts", "Linear"), "head": ("ParallelLMHead",)}


def _ct_match(value: str, target: str, contains: bool = False) -> bool:
    """compressed-tensors' ``is_equal_or_regex_match``: ``re:`` targets are regexes matched at
    the start, others equal (or contained in either case, for class names)."""
    if target.startswith("re:"):
        return re.match(target[3:], value) is not None
    if contains:  # class names: contained, whatever the case
        return target.lower() in value.lower()
    return target == value


def _part_names(index: int | None, part: str) -> tuple[str, ...]:
    """A part's usual module names (projections, not bare containers)."""
    if part == "head":
        return ("lm_head",)
    return tuple(f"model.layers.{index}.{n}" for n in _PART_NAMES[part] if "." in n)


@lru_cache(maxsize=4096)
def _ct_part(quant: QuantSpec, index: int | None, part: str) -> QuantSpec | None:
    """compressed-tensors' ``get_scheme_dict`` for a part: None when the ignore list names the
    part's module, else the first target naming it, else the first its class matches, else
    None (unquantized)."""
    names = _part_names(index, part)
    if any(_ct_match(n, t) for n in names for t in quant.ignore):
        return None
    found = next((q for t, q in quant.targets if any(_ct_match(n, t) for n in names)), None)
    if found is not None:
        return found
    classes = _PART_CLASSES.get(part, ("Linear",))
    return next((q for t, q in quant.targets for c in classes if _ct_match(c, t, contains=True)), None)


def ct_group_spec(weights: Mapping[str, Any], bits: int, where: str) -> QuantSpec:
    """The bytes of one compressed-tensors weights scheme: ``bits`` stored per weight, a scale
    per group (group, tensor_group: NVFP4's fp8 scale per 16; an fp16 scale, plus a zero point
    when asymmetric, for integer groups), per 128 x 128 block (fp32), or per channel (none)."""
    strategy = str(weights.get("strategy") or "channel")
    kind = str(weights.get("type") or "int")
    if strategy in ("group", "tensor_group") and weights.get("group_size"):
        size = weights["group_size"]
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise PlanError(f"{where}.group_size", f"{_show(size)} is not a group size", "e.g. 128 (16 for NVFP4)")
        if kind == "float":
            return QuantSpec("compressed-tensors", bits, size, 1.0)
        return QuantSpec("compressed-tensors", bits, size, 2.0 + (0 if weights.get("symmetric", True) else bits / 8))
    if strategy == "block":
        block = weights.get("block_structure") or [128, 128]
        if not isinstance(block, list | tuple) or len(block) != 2:
            raise PlanError(f"{where}.block_structure", f"{_show(block)} is not two sizes", "e.g. [128, 128]")
        rows, cols = (_as_int(b, f"{where}.block_structure", 1, 1 << 16, "e.g. [128, 128]") for b in block)
        return QuantSpec("compressed-tensors", bits, rows * cols, 4.0)
    return QuantSpec("compressed-tensors", bits)
