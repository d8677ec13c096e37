"""A model folder's files without loading them: which are weights, each safetensors header's
tensor bytes (bounded reads, regular files only), small JSON files and the tokenizer's length.

Pure Python, no torch or vLLM import.
"""

from __future__ import annotations

import json
import math
import re
import stat
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vllm_fleet.errors import PlanError
from vllm_fleet.model.values import MAX_CONFIG_BYTES, MAX_HEADER_BYTES, _kind, _show

_SAFETENSORS_DTYPE_BYTES: dict[str, float] = {
    "F64": 8,
    "I64": 8,
    "U64": 8,
    "F32": 4,
    "I32": 4,
    "U32": 4,
    "F16": 2,
    "BF16": 2,
    "I16": 2,
    "U16": 2,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "F8_E8M0": 1,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "F6_E2M3": 0.75,
    "F6_E3M2": 0.75,
    "F4": 0.5,
}


_LAYER_RE = re.compile(r"(?:^|\.)(?:layers|h|blocks|block)\.(\d+)\.")


def _classify(name: str, num_layers: int) -> str | None:
    lowered = name.lower()
    towers = (
        "visual",
        "vision",
        "image_newline",
        "multi_modal_projector",
        "mm_projector",
        "audio_tower",
        "embed_audio",
    )
    if any(tag in lowered for tag in towers):
        return "vision"  # the multimodal towers and their projectors (Gemma 4's audio tower too)
    match = _LAYER_RE.search(name)
    if match:
        # DeepSeek's MTP module is stored as extra layers; vLLM skips it unless
        # speculative decoding asks for it.
        return "layer" if int(match.group(1)) < num_layers else None
    if "lm_head" in lowered or lowered.endswith("output.weight"):
        return "head"
    if "embed" in lowered or "wte" in lowered or "wpe" in lowered:
        return "embed"
    if "norm" in lowered:
        return "head"
    return "layer"


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files vLLM loads from ``folder`` (``DefaultModelLoader._prepare_weights``):
    ``glob("consolidated*.safetensors")`` when there is one (Mistral's format), else
    ``glob("*.safetensors")``; Python's glob skips dotfiles, so macOS ``._model.safetensors``
    copies are not weights. When the index (``model.safetensors.index.json``, or
    ``consolidated.safetensors.index.json``) is there, only the files it names count, and a
    file it names that is missing is an error, as in vLLM."""
    try:
        names = sorted(p.name for p in folder.iterdir() if p.name.endswith(".safetensors"))
    except OSError as exc:
        raise PlanError("--model", f"cannot list {folder}: {exc.strerror}", "check the folder's permissions") from exc
    names = [n for n in names if not n.startswith(".")]
    consolidated = [n for n in names if n.startswith("consolidated")]
    if consolidated:
        names, index_name = consolidated, "consolidated.safetensors.index.json"
    else:
        index_name = "model.safetensors.index.json"
    if not names:
        return []
    index = folder / index_name
    if not index.is_file():
        return [folder / n for n in names]
    try:
        data = json.loads(_read_text(index, MAX_CONFIG_BYTES))
    except (ValueError, RecursionError) as exc:
        raise PlanError(str(index), f"is not valid JSON ({_show(str(exc))})", "re-download it") from exc
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise PlanError(str(index), "has no weight_map of tensor -> file names", "re-download it")
    listed = set(weight_map.values())
    missing = sorted(listed - set(names))
    if missing:
        raise PlanError(
            str(index),
            f"names {len(missing)} file(s) that are not in the folder (e.g. {_show(missing[0])})",
            "finish the download (every shard the index names), or remove the index",
        )
    return [folder / n for n in names if n in listed]


def not_special(path: Path) -> None:
    """A FIFO, socket or device where a file should be: opening it would block (a FIFO waits
    for a writer), so it is refused before it is opened. Symlinks are followed (the Hub's cache)."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return  # the read that follows names the problem
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise PlanError(
            str(path),
            "is not a regular file (a FIFO, socket or device): reading it would block",
            "replace it with the downloaded file",
        )


def _read_text(path: Path, limit: int) -> str:
    """A small text file, UTF-8; PlanError naming it when it is unreadable or too large."""
    not_special(path)
    try:
        size = path.stat().st_size
        if size > limit:
            raise PlanError(str(path), f"is {size:,} bytes, larger than {limit:,}", "point --model at a model folder")
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PlanError(str(path), f"is not UTF-8 text (byte {exc.start})", "re-download it") from exc
    except OSError as exc:
        raise PlanError(str(path), f"cannot be read: {exc.strerror}", "check the file and its permissions") from exc


def _shape_elements(shape: Any, where: str, tensor: str) -> int:
    if not isinstance(shape, list):
        raise PlanError(
            where, f"tensor {_show(tensor)} has shape {_show(shape)}, not a list of sizes", "re-download it"
        )
    count = 1
    for dim in shape:
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 0:
            raise PlanError(where, f"tensor {_show(tensor)} has a bad dimension {_show(dim)}", "re-download it")
        count *= dim
    return count


def _header(path: Path) -> tuple[dict[str, Any], int]:
    """The JSON header of one safetensors file and the size of its data buffer."""
    where = str(path)
    not_special(path)
    try:
        size = path.stat().st_size
        with path.open("rb") as handle:
            raw = handle.read(8)
            if len(raw) != 8:
                raise PlanError(where, "not a safetensors file (shorter than 8 bytes)", "re-download it")
            (length,) = struct.unpack("<Q", raw)
            if length > MAX_HEADER_BYTES:
                raise PlanError(where, "safetensors header larger than 100 MiB", "re-download it")
            if length + 8 > size:
                raise PlanError(
                    where, f"header length {length:,} is larger than the file ({size:,} bytes)", "re-download it"
                )
            text = handle.read(length)
    except OSError as exc:
        raise PlanError(where, f"cannot be read: {exc.strerror}", "check the file and its permissions") from exc
    try:
        header = json.loads(text.decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        raise PlanError(where, f"unreadable safetensors header ({_show(str(exc))})", "re-download it") from exc
    if not isinstance(header, dict):
        raise PlanError(where, f"safetensors header is {_kind(header)}, not an object", "re-download it")
    return header, size - 8 - length


def _tensor_bytes(path: Path, tensor: str, meta: Any, buffer: int) -> int:
    """Bytes of one tensor, its dtype, shape and offsets checked the way safetensors checks them."""
    where = str(path)
    if not isinstance(meta, dict):
        raise PlanError(where, f"tensor {_show(tensor)} is described by {_kind(meta)}, not an object", "re-download it")
    dtype = meta.get("dtype")
    if not isinstance(dtype, str) or dtype not in _SAFETENSORS_DTYPE_BYTES:
        raise PlanError(where, f"tensor {_show(tensor)} has an unknown dtype {_show(dtype)}", "re-download it")
    elements = _shape_elements(meta.get("shape"), where, tensor)
    try:
        start, end = meta["data_offsets"]
        if isinstance(start, bool) or isinstance(end, bool) or not isinstance(start, int) or not isinstance(end, int):
            raise TypeError
    except (KeyError, ValueError, TypeError) as exc:
        raise PlanError(where, f"tensor '{tensor}' has no valid data_offsets", "re-download it") from exc
    if not 0 <= start <= end <= buffer:
        raise PlanError(
            where,
            f"tensor {_show(tensor)} data_offsets [{start}, {end}] lie outside its {buffer:,}-byte data",
            "re-download it",
        )
    expected = math.ceil(elements * _SAFETENSORS_DTYPE_BYTES[dtype])
    if end - start != expected:
        raise PlanError(
            where,
            f"tensor {_show(tensor)} takes {end - start:,} bytes but {dtype} x {elements:,} elements is {expected:,}",
            "re-download it",
        )
    return end - start


def read_safetensors_bytes(folder: Path, num_layers: int) -> dict[str, int] | None:
    """Sum tensor bytes per model part from safetensors headers (no tensor loaded)."""
    files = weight_files(folder)
    if not files:
        return None
    totals: dict[str, int] = {"embed": 0, "head": 0, "layer": 0, "vision": 0}
    for path in files:
        header, buffer = _header(path)
        for tensor, meta in header.items():
            if tensor == "__metadata__":
                if not isinstance(meta, dict):
                    raise PlanError(str(path), "__metadata__ is not an object", "re-download it")
                continue
            size = _tensor_bytes(path, tensor, meta, buffer)
            part = _classify(tensor, num_layers)
            if part is not None:
                totals[part] += size
    return totals


def _small_json(path: Path) -> Any:
    """A small JSON file next to config.json, or None when it is absent, too large or
    unreadable (vLLM's own problem: these files only refine what config.json says)."""
    try:
        if not path.is_file() or path.stat().st_size > MAX_CONFIG_BYTES:
            return None
        return json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return None


def _tokenizer_max_length(folder: Path) -> float | None:
    """model_max_length of the folder's tokenizer_config.json; None when there is none."""
    data = _small_json(folder / "tokenizer_config.json")
    value = data.get("model_max_length") if isinstance(data, dict) else None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0 or not math.isfinite(value):
        return None
    return float(value)


_RUNNER_BY_SUFFIX = (
    ("ForCausalLM", "generate"), ("ForConditionalGeneration", "generate"), ("ChatModel", "generate"),
    ("LMHeadModel", "generate"), ("ForTextEncoding", "pooling"), ("EmbeddingModel", "pooling"),
    ("ForSequenceClassification", "pooling"), ("ForTokenClassification", "pooling"),
    ("ForAudioClassification", "pooling"), ("ForImageClassification", "pooling"),
    ("ForVideoClassification", "pooling"), ("ClassificationModel", "pooling"), ("ForRewardModeling", "pooling"),
    ("RewardModel", "pooling"), ("Model", "pooling"),
)  # fmt: skip
_ST_POOLING = (
    "sentence_transformers.models.Pooling",
    "sentence_transformers.sentence_transformer.modules.pooling.Pooling",
)
# Sentence Transformers configs whose max_seq_length replaces vLLM's derived length, in its order.
_ST_CONFIGS = (
    "sentence_bert_config.json", "sentence_roberta_config.json", "sentence_distilbert_config.json",
    "sentence_camembert_config.json", "sentence_albert_config.json", "sentence_xlm-roberta_config.json",
    "sentence_xlnet_config.json",
)  # fmt: skip


def is_pooling(cfg: Mapping[str, Any], folder: Path | None = None) -> bool:
    """Whether vLLM runs the model as a pooling model (``ModelConfig._get_default_runner_type``):
    a Sentence Transformers modules.json with a Pooling module, else the first architecture
    whose suffix vLLM knows (``*ForCausalLM`` generates, ``*Model`` / ``*ForSequenceClassification``
    pool)."""
    if folder is not None:
        modules = _small_json(folder / "modules.json")
        if isinstance(modules, list) and any(isinstance(m, dict) and m.get("type") in _ST_POOLING for m in modules):
            return True
    archs = cfg.get("architectures")
    for arch in archs if isinstance(archs, list) else []:
        runner = next((r for suffix, r in _RUNNER_BY_SUFFIX if isinstance(arch, str) and arch.endswith(suffix)), None)
        if runner is not None:
            return runner == "pooling"
    return False


def _encoder_max_seq_length(folder: Path) -> tuple[str, Any] | None:
    """The first Sentence Transformers config with content, when it states max_seq_length."""
    for name in _ST_CONFIGS:
        data = _small_json(folder / name)
        if data:
            return (
                (str(folder / name), data["max_seq_length"])
                if isinstance(data, dict) and "max_seq_length" in data
                else None
            )
    return None
