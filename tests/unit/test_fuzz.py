"""Fuzzing the CLI with hypothesis: random config.json files (valid-ish and broken), cluster
files, safetensors headers and flags. Every run ends in exit 0 with a sane plan or exit 2
with exactly one line on stderr; never another exception (no per-example deadline: a
wall-clock limit fails on a loaded machine, speed belongs to tests/bench). Derandomized
(a fixed seed, no example database), so CI sees the same examples.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import struct
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import ROOT
from vllm_fleet.cli import main
from vllm_fleet.model.catalog import GPUS, MODELS

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, event, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

EXAMPLES = 200
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,  # no wall-clock limit per example (speed is measured by tests/bench, not asserted)
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)

TINY: dict[str, Any] = json.loads((ROOT / "inventories/local/files/tiny-llama/config.json").read_text())

# Values of every JSON type, hostile ones included.
ANY_JSON = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=12),
    ),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=10,
)
# Numbers a real config.json could hold, around the edges.
SMALL = st.one_of(st.integers(min_value=-4, max_value=96), st.sampled_from([0, 1, 2, 3, 7, 8, 128, 4096, 10**6, 10**9]))
NUMBERISH = st.one_of(SMALL, ANY_JSON)

INT_FIELDS = [
    "hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size", "num_key_value_heads", "head_dim",
    "intermediate_size", "max_position_embeddings", "num_local_experts", "num_experts_per_tok",
    "moe_intermediate_size", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "q_lora_rank",
    "sliding_window", "first_k_dense_replace", "decoder_sparse_step", "n_shared_experts",
    "shared_expert_intermediate_size", "seq_length", "model_max_length", "sliding_window_pattern",
    "max_window_layers", "n_positions", "vision_params",
]  # fmt: skip
OTHER_FIELDS = {
    "model_type": st.sampled_from(["llama", "qwen2", "qwen3_moe", "gemma2", "gemma3", "gpt_oss", "deepseek_v3", "x"]),
    "torch_dtype": st.one_of(st.sampled_from(["bfloat16", "float16", "float32", "torch.float16", "int4"]), ANY_JSON),
    "tie_word_embeddings": st.one_of(st.booleans(), ANY_JSON),
    "attention_bias": st.one_of(st.booleans(), ANY_JSON),
    "use_sliding_window": st.one_of(st.booleans(), ANY_JSON),
    "multi_query": st.one_of(st.booleans(), ANY_JSON),
    "partial_rotary_factor": st.one_of(st.floats(allow_nan=True), ANY_JSON),
    "layer_types": st.one_of(st.lists(st.sampled_from(["full_attention", "sliding_attention"]), max_size=6), ANY_JSON),
    "mlp_only_layers": st.one_of(st.lists(st.integers(-2, 8), max_size=4), ANY_JSON),
    "rope_scaling": st.one_of(
        st.fixed_dictionaries(
            {"rope_type": st.sampled_from(["linear", "dynamic", "yarn", "llama3", "default"]), "factor": NUMBERISH}
        ),
        ANY_JSON,
    ),
    "text_config": st.one_of(st.just(dict(TINY)), ANY_JSON),
}
QUANT = st.one_of(
    ANY_JSON,
    st.fixed_dictionaries(
        {"quant_method": st.sampled_from(["fp8", "awq", "gptq", "compressed-tensors", "mxfp4", "bitsandbytes", "x"])},
        optional={
            "bits": NUMBERISH,
            "group_size": NUMBERISH,
            "weight_block_size": st.one_of(st.lists(NUMBERISH, max_size=3), ANY_JSON),
            "config_groups": st.one_of(
                st.fixed_dictionaries(
                    {"g": st.fixed_dictionaries({"weights": st.fixed_dictionaries({"num_bits": NUMBERISH})})}
                ),
                ANY_JSON,
            ),
            "load_in_8bit": ANY_JSON,
        },
    ),
)


@st.composite
def configs(draw: st.DrawFn) -> Any:
    """config.json contents: mostly the tiny Llama with some keys changed or removed."""
    if draw(st.integers(0, 19)) == 0:
        return draw(ANY_JSON)  # not even an object, sometimes
    cfg: dict[str, Any] = dict(TINY) if draw(st.booleans()) else {}
    if not cfg:
        for key in ("hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size"):
            cfg[key] = draw(SMALL)
    for key in draw(st.lists(st.sampled_from(INT_FIELDS), max_size=5, unique=True)):
        cfg[key] = draw(NUMBERISH)
    for key in draw(st.lists(st.sampled_from(sorted(OTHER_FIELDS)), max_size=3, unique=True)):
        cfg[key] = draw(OTHER_FIELDS[key])
    if draw(st.integers(0, 4)) == 0:
        cfg["quantization_config"] = draw(QUANT)
    for key in draw(st.lists(st.sampled_from(sorted(cfg)), max_size=2, unique=True)):
        del cfg[key]
    return cfg


GPU_NAMES = [g.name for g in GPUS.values()] + ["h100", "Z9000", "", "cpu"]
NODE_VALUES = {
    "gpu": st.sampled_from(GPU_NAMES),
    "gpu_count": st.sampled_from([1, 2, 4, 8, 0, -1, 1.5, True, 1025, 10**12, "8"]),
    "gpu_memory_gib": st.sampled_from([2, 24, 80, 0.001, 5000, math.nan]),
    "nvlink": st.sampled_from([True, False, "yes", "maybe"]),
    "nic_gbps": st.sampled_from([25, 400, 0, -1, math.inf]),
    "address": st.sampled_from(["10.0.0.1", "10.0.0.2", "a b"]),
    "interface": st.sampled_from(["eth0", "ib0"]),
    "gpu_free_gib": st.sampled_from([10, 70, 0]),
}
# Plausible nodes with a value or two off, and nodes of any JSON at all.
PLAUSIBLE_NODE = st.fixed_dictionaries(
    {
        "name": st.sampled_from(["n1", "n2", "n3", "n4"]),
        "gpu": st.one_of(st.sampled_from(["H100", "A100-80G", "L4", "T4", "V100-32G", "cpu"]), NODE_VALUES["gpu"]),
        "gpu_count": st.one_of(st.sampled_from([1, 2, 4, 8]), NODE_VALUES["gpu_count"]),
    },
    optional={
        k: st.one_of(v, ANY_JSON) if k in ("nvlink", "address") else v
        for k, v in NODE_VALUES.items()
        if k not in ("gpu", "gpu_count")
    },
)
HOSTILE_NODE = st.fixed_dictionaries(
    {"name": st.one_of(st.sampled_from(["n1", "n2", "n3"]), ANY_JSON)},
    optional={k: st.one_of(v, ANY_JSON) for k, v in NODE_VALUES.items()},
)
CLUSTERS = st.one_of(
    st.fixed_dictionaries({"nodes": st.lists(PLAUSIBLE_NODE, min_size=1, max_size=4)}),
    st.fixed_dictionaries({"nodes": st.lists(st.one_of(PLAUSIBLE_NODE, HOSTILE_NODE), min_size=1, max_size=4)}),
    st.lists(HOSTILE_NODE, max_size=3),
    ANY_JSON,
)
GOOD_CLUSTER = {
    "nodes": [
        {"name": "n1", "gpu": "H100", "gpu_count": 4},
        {"name": "n2", "gpu": "L4", "gpu_count": 3},
        {"name": "n3", "gpu": "T4", "gpu_count": 1},
    ]
}


def _flag(name: str, values: st.SearchStrategy[Any]) -> st.SearchStrategy[list[str]]:
    return values.map(lambda v: [name, str(v)])


COMMON_FLAGS = [
    _flag("--max-model-len", st.sampled_from([1, 512, 2048, 4096, 131072, 10**8, 0, -1, "x", 1.5])),
    _flag("-tp", st.sampled_from([1, 2, 3, 4, 6, 8, 16, 1024, 0])),
    _flag("-pp", st.sampled_from([1, 2, 3, 4, 8, 0])),
    _flag("--dtype", st.sampled_from(["auto", "bfloat16", "float16", "float32", "int8"])),
    _flag("--quantization", st.sampled_from(["fp8", "awq", "gptq", "w4a16", "mxfp4", "gptq_marlin", "foo", ""])),
    _flag("--kv-cache-dtype", st.sampled_from(["auto", "fp8", "fp8_e5m2", "fp4"])),
    _flag("--gpu-memory-utilization", st.sampled_from([0.9, 1.0, 0.01, 0, 1.5, "nan"])),
    _flag("--env", st.sampled_from(["VLLM_ALLOW_LONG_MAX_MODEL_LEN=1", "X=", "=1", "NOEQ"])),
]
PLAN_FLAGS = [
    *COMMON_FLAGS,
    _flag("--strategy", st.sampled_from(["replicas", "tp", "pp", "dp_ep", "instances", "bogus"])),
    _flag("-dp", st.sampled_from([1, 2, 3, 4, 0])),
    _flag("--target-concurrency", st.sampled_from([1, 100, 10**9, 0])),
    _flag("--max-num-seqs", st.sampled_from([1, 256, 2**20, 0])),
    st.just(["--allow-cross-node-tp"]),
    st.just(["--enforce-eager"]),
    _flag("--multinode-backend", st.sampled_from(["auto", "ray", "native"])),
]
EST_FLAGS = [
    *COMMON_FLAGS,
    _flag("--gpu", st.sampled_from(["H100", "T4", "V100-32G", "L4", "cpu", "Z9"])),
    _flag("--block-size", st.sampled_from([1, 16, 128, 0, 70000])),
    _flag("--max-num-batched-tokens", st.sampled_from([1, 2048, 10**8, 0])),
    _flag("--layer-partition", st.sampled_from(["2,2", "1,3", "4", "a,b", "0,4", "-1,5"])),
    _flag("--data-parallel-size", st.sampled_from([1, 2, 8])),
    st.just(["--enable-expert-parallel"]),
]


def _flags(options: list[st.SearchStrategy[list[str]]]) -> st.SearchStrategy[list[str]]:
    return st.lists(st.one_of(options), max_size=4).map(lambda parts: [a for part in parts for a in part])


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's own errors
            code = exc.code if isinstance(exc.code, int) else 2
    return code, out.getvalue(), err.getvalue()


def _check(argv: list[str]) -> tuple[int, Any]:
    """Exit 0 with JSON; exit 2 with exactly one stderr line; exit 3 (does not fit): estimate's
    JSON, or plan's one stderr line. The parsed JSON or None."""
    code, out, err = _run(argv)
    event(f"exit {code}")  # pytest --hypothesis-show-statistics shows how many plans and refusals ran
    assert code in (0, 2, 3), (argv, code, err)
    if code == 2 or (code == 3 and not out):
        lines = err.splitlines()
        assert len(lines) == 1 and ": error: " in lines[0], (argv, err)
        assert "Traceback" not in err
        return code, None
    assert err == "", (argv, err)
    data = json.loads(out)
    json.dumps(data, allow_nan=False)  # no NaN or infinity anywhere in what is printed
    assert (code == 3) == (data.get("fits") is False), (argv, code)
    return code, data


def _sane_plan(plan: dict[str, Any], argv: list[str]) -> None:
    nodes = {n["name"]: n["gpu_count"] for n in plan["nodes"]}
    assert all(_plain_int(c) and c >= 1 for c in nodes.values()), (argv, "gpu counts", nodes)
    used: dict[str, int] = {}
    assert plan["instances"], (argv, "no instance")
    for inst in plan["instances"]:
        memory = inst["memory"]
        for key in ("kv_cache_tokens", "num_gpu_blocks", "kv_cache_gib", "max_concurrency"):
            assert memory["fits"] and memory[key] > 0, (argv, inst["name"], key, memory[key])
        assert inst["max_model_len"] >= 1 and 1 <= inst["port"] <= 65535, (argv, inst["max_model_len"], inst["port"])
        assert inst["tensor_parallel_size"] >= 1 and inst["pipeline_parallel_size"] >= 1, argv
        assert all(isinstance(a, str) and "\n" not in a for a in inst["vllm_args"]), (argv, inst["vllm_args"])
        for stage in inst["stages"]:
            used[stage["node"]] = used.get(stage["node"], 0) + stage["gpu_count"]
            assert stage["layers"][0] <= stage["layers"][1], (argv, stage)
    assert all(used[n] <= nodes[n] for n in used), (argv, used, nodes)


LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "max_target_positions",
               "max_sequence_length", "max_seq_length", "seq_len")  # fmt: skip
OLD_GPUS = {"T4", "V100-32G", "V100-16G"}  # compute capability below 8.0


def _plain_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _vllm_would_start(plan: dict[str, Any], cfg: Any, flags: list[str]) -> None:
    """Oracles for what vLLM refuses at start-up, on configs simple enough to judge: a
    max_model_len above the model's length keys (without VLLM_ALLOW_LONG_MAX_MODEL_LEN), a TP
    that does not shard the KV heads, bfloat16 on GPUs below compute capability 8.0."""
    if not isinstance(cfg, dict) or "text_config" in cfg:
        return
    lengths = [cfg[k] for k in LENGTH_KEYS if cfg.get(k) is not None]
    simple = all(_plain_int(v) for v in lengths) and not ({"rope_scaling", "model_max_length"} & set(cfg))
    cap = min(lengths) if lengths and simple else None
    heads, kv = cfg.get("num_attention_heads"), cfg.get("num_key_value_heads", cfg.get("num_attention_heads"))
    gqa = _plain_int(heads) and _plain_int(kv) and not cfg.get("kv_lora_rank") and not cfg.get("multi_query")
    gpus = {n["name"]: n["gpu"] for n in plan["nodes"]}
    for inst in plan["instances"]:
        if cap is not None and "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1" not in flags:
            assert inst["max_model_len"] <= cap, (flags, inst["max_model_len"], cap)
        tp = inst["tensor_parallel_size"]
        if gqa and kv:
            assert kv % tp == 0 or tp % kv == 0, (flags, tp, kv)
        if "bfloat16" in flags:
            assert not {gpus[n] for n in inst["nodes"]} & OLD_GPUS, (flags, inst["nodes"])


def _model_folder(root: Path, cfg: Any) -> Path:
    folder = root / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))  # NaN and Infinity as Python writes them
    return folder


@FUZZ
@given(cfg=configs(), flags=_flags(PLAN_FLAGS))
def test_fuzz_config_json_plan(cfg: Any, flags: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = _model_folder(Path(tmp), cfg)
        cluster = Path(tmp) / "cluster.yml"
        cluster.write_text(yaml.safe_dump(GOOD_CLUSTER))
        argv = ["plan", "--model", str(folder), "--cluster", str(cluster), "--json", *flags]
        code, data = _check(argv)
        if code == 0:
            _sane_plan(data, argv)
            _vllm_would_start(data, cfg, flags)


@FUZZ
@given(cfg=configs(), flags=_flags(EST_FLAGS))
def test_fuzz_config_json_estimate(cfg: Any, flags: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = _model_folder(Path(tmp), cfg)
        device = [] if "--gpu" in flags else ["--gpu-memory-gib", "24"]
        code, data = _check(["estimate", "--model", str(folder), "--json", *device, *flags])
        if code == 0:  # an estimate may say "does not fit"; its numbers are still numbers
            assert data["kv_cache_tokens"] >= 0 and data["num_gpu_blocks"] >= 0 and data["max_model_len"] >= 1
            if data["fits"]:
                assert data["kv_cache_tokens"] > 0 and data["available_kv_gib"] > 0


MODELS_FOR_CLUSTERS = ["Qwen/Qwen3-8B", "meta-llama/Llama-3.2-3B", "Qwen/Qwen3-30B-A3B", "openai/gpt-oss-20b"]


@FUZZ
@given(
    cluster=CLUSTERS,
    model=st.sampled_from([*MODELS_FOR_CLUSTERS, "tiny"]),
    raw=st.one_of(st.none(), st.binary(max_size=64)),
    flags=_flags(PLAN_FLAGS),
)
def test_fuzz_cluster_file_plan(cluster: Any, model: str, raw: bytes | None, flags: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "cluster.yml"
        if raw is not None:
            path.write_bytes(raw)  # whatever bytes: YAML or not, UTF-8 or not
        else:
            path.write_text(yaml.safe_dump(cluster))
        ref = str(ROOT / "inventories/local/files/tiny-llama") if model == "tiny" else model
        argv = ["plan", "--model", ref, "--cluster", str(path), "--json", *flags]
        code, data = _check(argv)
        if code == 0:
            _sane_plan(data, argv)
            _vllm_would_start(data, TINY if model == "tiny" else MODELS[model], flags)


SHAPES = st.one_of(st.lists(st.integers(min_value=-2, max_value=64), max_size=3), ANY_JSON)
TENSOR = st.one_of(
    st.fixed_dictionaries(
        {"dtype": st.one_of(st.sampled_from(["BF16", "F32", "F8_E4M3", "Q7"]), ANY_JSON), "shape": SHAPES},
        optional={"data_offsets": st.one_of(st.lists(st.integers(min_value=-8, max_value=4096), max_size=3), ANY_JSON)},
    ),
    ANY_JSON,
)
HEADERS = st.one_of(
    st.dictionaries(st.sampled_from(["model.layers.0.w", "lm_head.weight", "__metadata__", "x"]), TENSOR, max_size=3),
    ANY_JSON,
)


@FUZZ
@given(
    header=HEADERS,
    length=st.one_of(st.none(), st.integers(min_value=0, max_value=2**64 - 1)),
    data=st.binary(max_size=64),
    garbage=st.one_of(st.none(), st.binary(max_size=32)),
    name=st.sampled_from(["model.safetensors", "._model.safetensors", "consolidated.safetensors"]),
)
def test_fuzz_safetensors_headers(
    header: Any, length: int | None, data: bytes, garbage: bytes | None, name: str
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = _model_folder(Path(tmp), TINY)
        text = json.dumps(header).encode() if garbage is None else garbage
        size = len(text) if length is None else length
        (folder / name).write_bytes(struct.pack("<Q", size) + text + data)
        _check(["estimate", "--model", str(folder), "--gpu", "H100", "--json"])


def test_the_fuzz_targets_cover_the_catalog() -> None:
    # The cluster fuzz plans real catalog models; keep the names valid.
    assert set(MODELS_FOR_CLUSTERS) <= set(MODELS)
