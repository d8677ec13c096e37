"""Every bad input is one line naming the field and the fix: numbers, model configs,
safetensors headers, plans vLLM would refuse at start-up, forced layouts, inventories.

CLI cases go through ``vllm_fleet.cli.main`` and assert exit 2 with exactly one stderr
line; library cases assert the PlanError's text.
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import FIXTURES, ROOT, write_safetensors
from vllm_fleet.accounting.memory import estimate
from vllm_fleet.accounting.settings import Device, Settings
from vllm_fleet.cli import main
from vllm_fleet.errors import NothingFitsError, PlanError
from vllm_fleet.inventory import interface
from vllm_fleet.model.families import check_layer_types
from vllm_fleet.model.length import _rope_parameters
from vllm_fleet.model.spec import load_model, spec_from_config
from vllm_fleet.planning.cluster import cluster_from_data, load_cluster
from vllm_fleet.planning.strategy import Wishes, plan_cluster

TINY_CFG: dict[str, Any] = json.loads((ROOT / "inventories/local/files/tiny-llama/config.json").read_text())
H100 = [{"name": "h1", "gpu": "H100", "gpu_count": 4}, {"name": "h2", "gpu": "H100", "gpu_count": 4}]


def _one_line_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str], message: str) -> str:
    """main(argv) exits 2 with one stderr line that contains ``message``; that line
    (argparse's own errors leave through SystemExit(2), the planner's return 2)."""
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code  # type: ignore[assignment]
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert message in lines[0], lines[0]
    return lines[0]


def _cluster_file(tmp_path: Path, text: str | bytes, name: str = "cluster.yml") -> Path:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def _node(**values: Any) -> dict[str, Any]:
    return {"name": "a", "gpu": "H100", "gpu_count": 1, **values}


# ---------------------------------------------------------------------------
# Numbers in the cluster (nodes)
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("nodes", "message"),
    [
        pytest.param([_node(gpu_count=True)], r"gpu_count: True is a boolean, not a number", id="count-bool"),
        pytest.param([_node(gpu_count=1.5)], r"gpu_count: 1\.5 is not a whole number", id="count-fraction"),
        pytest.param([_node(gpu_count=math.nan)], r"gpu_count: nan is not a finite number", id="count-nan"),
        pytest.param([_node(gpu_count=math.inf)], r"gpu_count: inf is not a finite number", id="count-inf"),
        pytest.param([_node(gpu_count="nan")], r"gpu_count: 'nan' is not a finite number", id="count-nan-text"),
        pytest.param([_node(gpu_count=-1)], r"gpu_count: must be positive, got -1", id="count-negative"),
        pytest.param([_node(gpu_count=1025)], r"gpu_count: 1025 is above 1024", id="count-above-1024"),
        pytest.param([_node(gpu_count=10**12)], r"gpu_count: 1000000000000 is above 1024", id="count-10e12"),
        pytest.param([_node(gpu_count=10**400)], r"gpu_count: 1000.* is too large", id="count-huge-int"),
        pytest.param([_node(gpu_count=[8])], r"gpu_count: \[8\] is not a number", id="count-list"),
        pytest.param([_node(gpu_memory_gib=math.nan)], r"gpu_memory_gib: nan is not a finite", id="memory-nan"),
        pytest.param([_node(gpu_memory_gib=5000)], r"gpu_memory_gib: 5000 is above 4096", id="memory-above"),
        pytest.param([_node(gpu_memory_gib=True)], r"gpu_memory_gib: True is a boolean", id="memory-bool"),
        pytest.param([_node(nic_gbps=-5)], r"nic_gbps: must be positive, got -5", id="nic-negative"),
        pytest.param([_node(nic_gbps="inf")], r"nic_gbps: 'inf' is not a finite number", id="nic-inf"),
        pytest.param([_node(nvlink="maybe")], r"nvlink: 'maybe' is not true or false", id="nvlink-text"),
        pytest.param([_node(gpu_free_gib=0)], r"gpu_free_gib: must be positive, got 0", id="free-zero"),
        pytest.param([_node(name="a b")], r"nodes\[0\]\.name: 'a b' is not a host name", id="name-space"),
        pytest.param([_node(name=["a"])], r"nodes\[0\]\.name: must be a string", id="name-list"),
        pytest.param([_node(gpu={"x": 1})], r"\.gpu: must be a GPU name", id="gpu-mapping"),
        pytest.param([_node(address="10.0.0.1\nx")], r"\.address: .* holds spaces or control", id="address-nl"),
        pytest.param([_node(interface=["eth0"])], r"\.interface: must be a string", id="interface-list"),
        pytest.param(
            [_node(name=f"n{i}") for i in range(10_001)], r"nodes: 10,001 nodes is above 10,000", id="10001-nodes"
        ),
        pytest.param(
            [_node(name=f"n{i}", gpu_count=1000) for i in range(70)],
            r"nodes: 70,000 GPUs in all is above 65,536",
            id="too-many-gpus",
        ),
    ],
)
def test_bad_node_numbers_name_the_field(nodes: list[dict[str, Any]], message: str) -> None:
    with pytest.raises(PlanError, match=message) as err:
        cluster_from_data({"nodes": nodes})
    assert "\n" not in str(err.value) and "; fix: " in str(err.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("nodes:\n- {name: a, gpu: H100, gpu_count: true}\n", "gpu_count: True is a boolean", id="bool"),
        pytest.param("nodes:\n- {name: a, gpu: H100, gpu_count: 1.5}\n", "1.5 is not a whole number", id="fraction"),
        pytest.param("nodes:\n- {name: a, gpu: H100, gpu_count: .nan}\n", "is not a finite number", id="nan"),
        pytest.param("nodes:\n- {name: a, gpu: H100, gpu_count: -.inf}\n", "is not a finite number", id="minus-inf"),
        pytest.param(
            "nodes:\n- {name: a, gpu: H100, gpu_count: 1000000000000}\n", "1000000000000 is above 1024", id="1e12-gpus"
        ),
        pytest.param(
            "nodes:\n- {name: a, gpu: H100, gpu_count: 8, gpu_count: 4}\n",
            "line 2 is not valid YAML (key 'gpu_count' appears twice in one mapping)",
            id="duplicate-key",
        ),
        pytest.param(b"nodes:\n- {name: \xff\xfe}\n", "is not UTF-8 text", id="not-utf8"),
        pytest.param("[" * 50_000 + "]" * 50_000, "--cluster: ", id="deep-nesting"),
        pytest.param("nodes: {a: 1}\n", "nodes: the cluster has no nodes", id="nodes-not-a-list"),
        pytest.param("nodes:\n- 7\n", "nodes[0]: must be a mapping", id="node-not-a-mapping"),
    ],
)
def test_bad_cluster_files_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str | bytes, message: str
) -> None:
    path = _cluster_file(tmp_path, text)
    _one_line_exit_2(["plan", "--model", "Qwen/Qwen3-8B", "--cluster", str(path)], capsys, message)


def test_cluster_that_is_a_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _one_line_exit_2(["plan", "--model", "Qwen/Qwen3-8B", "--cluster", str(tmp_path)], capsys, "is a folder")


# ---------------------------------------------------------------------------
# Numbers on the command line and in Settings / Wishes
# ---------------------------------------------------------------------------

EST = ["estimate", "--model", "Qwen/Qwen3-8B"]
PLAN = ["plan", "--model", "Qwen/Qwen3-8B", "--cluster", str(FIXTURES / "2x8xa800.yml")]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param([*EST, "--gpu-memory-gib", "nan"], "'nan' is not a finite number", id="memory-nan"),
        pytest.param([*EST, "--gpu-memory-gib", "inf"], "'inf' is not a finite number", id="memory-inf"),
        pytest.param([*EST, "--gpu-memory-gib", "5000"], "5000 is above 4096 GiB", id="memory-above"),
        pytest.param([*EST, "--gpu-memory-gib", "-1"], "must be positive, got -1", id="memory-negative"),
        pytest.param([*EST, "--gpu", "H100", "--max-model-len", "100000001"], "above 100,000,000", id="mml-above"),
        pytest.param([*EST, "--gpu", "H100", "--max-model-len", "0"], "must be a positive integer", id="mml-zero"),
        pytest.param([*EST, "--gpu", "H100", "--max-model-len", "1.5"], "'1.5' is not an integer", id="mml-float"),
        pytest.param([*EST, "--gpu", "H100", "--block-size", "70000"], "above 65,536", id="block-above"),
        pytest.param([*EST, "--gpu", "H100", "--max-num-seqs", "2000000"], "above 1,048,576", id="seqs-above"),
        pytest.param([*EST, "--gpu", "H100", "--env", "NOEQUALS"], "is not NAME=VALUE", id="env-no-equals"),
        pytest.param([*EST, "--gpu", "H100", "--layer-partition", "a,b"], "--layer-partition: 'a,b'", id="partition"),
        pytest.param([*PLAN, "-tp", "1025"], "1025 is above 1,024", id="tp-above"),
        pytest.param([*PLAN, "-dp", "0"], "must be a positive integer, got 0", id="dp-zero"),
        pytest.param([*PLAN, "--target-concurrency", "10000000000"], "above 1,000,000,000", id="target-above"),
        pytest.param([*PLAN, "--gpu-memory-utilization", "nan"], "must be in (0, 1]", id="util-nan"),
        pytest.param([*PLAN, "-tp", "8", "-pp", "4"], "TP=8 x PP=4 needs 32 GPUs, the cluster has 16", id="tp-x-pp"),
    ],
)
def test_bad_numbers_on_the_command_line_exit_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    _one_line_exit_2(argv, capsys, message)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        pytest.param(Settings(tensor_parallel_size=True), r"--tensor-parallel-size: must be a positive", id="tp-bool"),
        pytest.param(Settings(max_model_len=1.5), r"--max-model-len: must be a positive integer", id="mml-float"),  # type: ignore[arg-type]
        pytest.param(Settings(max_model_len=10**9), r"--max-model-len: 1,000,000,000 is above", id="mml-above"),
        pytest.param(
            Settings(gpu_memory_utilization=math.nan), r"must be a number from 0.01 to 1, got nan", id="util-nan"
        ),
        pytest.param(Settings(max_num_seqs=False), r"--max-num-seqs: must be a positive integer", id="seqs-bool"),
        pytest.param(Settings(layer_partition=[True]), r"--layer-partition: must be a list", id="partition-bool"),  # type: ignore[list-item]
    ],
)
def test_bad_settings_name_the_flag(settings: Settings, message: str) -> None:
    with pytest.raises(PlanError, match=message):
        estimate(load_model("Qwen/Qwen3-8B"), Device("H100", 79.19), settings)


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"rope_scaling": {}}, id="rope-empty"),
        pytest.param({"rope_scaling": False}, id="rope-false"),
        pytest.param({"rope_scaling": {"rope_type": "telechat3-yarn", "factor": 4.0}}, id="telechat3-yarn"),
        pytest.param({"rope_scaling": {"type": "su", "rope_type": "longrope"}}, id="su-longrope"),
        pytest.param(
            {"rope_scaling": {"rope_type": "bogus"}, "dual_chunk_attention_config": {"chunk_size": 8}}, id="dual-chunk"
        ),
        pytest.param({"model_type": "nemotron_h", "layer_types": ["mlp"]}, id="nemotron-h-own-check"),
    ],
)
def test_configs_vllm_loads_are_not_refused(changes: dict[str, Any]) -> None:
    """What vLLM's own patching or the config's own class accepts is not refused by the planner's
    copies of transformers' and vLLM's checks."""
    cfg = _cfg(**changes)
    _rope_parameters(cfg)
    check_layer_types(cfg, "config.json", 4)


def test_batched_tokens_below_the_sequences_do_not_start() -> None:
    """SchedulerConfig refuses max_num_batched_tokens below max_num_seqs, given or defaulted: that
    layout does not fit, with vLLM's message; an unset max_num_seqs is lowered to the batched tokens
    instead (EngineArgs), so giving the tokens alone starts."""
    spec, h100 = load_model("Qwen/Qwen3-8B"), Device("H100", 79.19)
    est = estimate(spec, h100, Settings(max_num_batched_tokens=64, max_num_seqs=128, max_model_len=4096))
    assert not est.fits
    assert est.reason.startswith("max_num_batched_tokens (64) must be greater than or equal to max_num_seqs (128)")
    est = estimate(spec, h100, Settings(max_num_seqs=16384, max_model_len=4096))  # the H100 default: 8,192 tokens
    assert not est.fits and "max_num_batched_tokens (8192)" in est.reason
    est = estimate(spec, h100, Settings(max_num_batched_tokens=512, max_model_len=4096))
    assert est.fits and (est.max_num_seqs, est.max_num_batched_tokens) == (512, 512)
    # A cluster where one GPU's defaults refuse the asked sequences and another's do not.
    nodes = [{"name": "h", "gpu": "H100-SXM", "gpu_count": 1}, {"name": "l", "gpu": "L20", "gpu_count": 1}]
    plan = plan_cluster(spec, cluster_from_data({"nodes": nodes}), Wishes(max_model_len=4096, max_num_seqs=4096))
    assert {i["gpu"] for i in plan["instances"]} == {"H100-SXM"}
    assert any("max_num_batched_tokens (2048)" in r["reason"] for r in plan["rejected"])


def test_nan_gpu_memory_is_refused() -> None:
    with pytest.raises(PlanError, match=r"--gpu-memory-gib: must be positive, got nan"):
        estimate(load_model("Qwen/Qwen3-8B"), Device("x", math.nan))


@pytest.mark.parametrize(
    ("wishes", "message"),
    [
        pytest.param(Wishes(tensor_parallel_size=True), r"tensor_parallel_size: must be a positive", id="tp-bool"),
        pytest.param(Wishes(max_num_seqs=0), r"max_num_seqs: must be a positive integer, got 0", id="seqs-zero"),
        pytest.param(Wishes(max_model_len=10**9), r"max_model_len: 1,000,000,000 is above", id="mml-above"),
        pytest.param(
            Wishes(gpu_memory_utilization=True), r"gpu_memory_utilization: must be a number from 0.01", id="util-bool"
        ),
        pytest.param(Wishes(port=70000), r"vllm_fleet_port: must be a port \(1 to 65535\)", id="port-above"),
        pytest.param(Wishes(strategies=("bogus",)), r"--strategy: unknown strategy 'bogus'", id="strategy"),
        pytest.param(Wishes(port=65535), r"vllm_fleet_port: 65535 \+ 8 instances on a800-1 .* above 65535", id="ports"),
        pytest.param(
            Wishes(data_parallel_size=8, tensor_parallel_size=2),
            r"--data-parallel-size: DP=8 with TP=2: the planner lays DP out as one GPU per rank",
            id="dp-with-tp",
        ),
    ],
)
def test_bad_wishes_name_the_field(wishes: Wishes, message: str) -> None:
    spec = load_model("meta-llama/Llama-3.1-8B")
    with pytest.raises(PlanError, match=message):
        plan_cluster(spec, load_cluster(FIXTURES / "2x8xa800.yml"), replace_mml(wishes))


def replace_mml(wishes: Wishes) -> Wishes:
    from dataclasses import replace

    return wishes if wishes.max_model_len else replace(wishes, max_model_len=8192)


# ---------------------------------------------------------------------------
# config.json that cannot describe a real model
# ---------------------------------------------------------------------------


def _cfg(**changes: Any) -> dict[str, Any]:
    cfg = dict(TINY_CFG)
    for key, value in changes.items():
        if value is None:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    return cfg


MLA = {"kv_lora_rank": 64, "qk_nope_head_dim": 16, "v_head_dim": 16}
GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 128}


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        pytest.param(
            _cfg(num_key_value_heads=3), r"num_key_value_heads: 3 KV heads do not divide the 4", id="kv-heads"
        ),
        pytest.param(
            _cfg(num_local_experts=8, num_experts_per_tok=9),
            r"num_experts_per_tok: 9 experts per token but the model has 8 experts",
            id="top-k-above-experts",
        ),
        pytest.param(_cfg(max_position_embeddings=0), r"max_position_embeddings: must be at least 1", id="ctx-0"),
        pytest.param(_cfg(max_position_embeddings=-8), r"max_position_embeddings: must be at least 1", id="ctx-neg"),
        pytest.param(_cfg(hidden_size=0), r"hidden_size: must be at least 1, got 0", id="hidden-0"),
        pytest.param(_cfg(num_hidden_layers=-2), r"num_hidden_layers: must be at least 1", id="layers-neg"),
        pytest.param(_cfg(num_attention_heads=0), r"num_attention_heads: must be at least 1", id="heads-0"),
        pytest.param(_cfg(vocab_size=0), r"vocab_size: must be at least 1", id="vocab-0"),
        pytest.param(_cfg(hidden_size=True), r"hidden_size: True is a boolean, not an integer", id="hidden-bool"),
        pytest.param(_cfg(num_hidden_layers=1.5), r"num_hidden_layers: 1\.5 is not an integer", id="layers-frac"),
        pytest.param(_cfg(num_hidden_layers=10**6), r"num_hidden_layers: 1000000 is above 4,096", id="layers-big"),
        pytest.param(_cfg(hidden_size="128"), r"hidden_size: '128' is a string, not an integer", id="hidden-text"),
        pytest.param(_cfg(hidden_size=math.inf), r"hidden_size: inf is not a finite number", id="hidden-inf"),
        pytest.param(_cfg(vocab_size=[1]), r"vocab_size: \[1\] is a list, not an integer", id="vocab-list"),
        pytest.param(
            _cfg(hidden_size=2, head_dim=None), r"hidden_size: 2 is smaller than the 4 attention heads", id="head-dim-0"
        ),
        pytest.param(
            _cfg(quantization_config="fp8"), r"quantization_config: must be a JSON object, got a string", id="q-str"
        ),
        pytest.param(_cfg(quantization_config=[GPTQ]), r"quantization_config: must be a JSON object", id="q-list"),
        pytest.param(
            _cfg(quantization_config={"bits": 4}), r"quantization_config\.quant_method: is missing", id="q-no-method"
        ),
        pytest.param(
            _cfg(quantization_config={"quant_method": 7}),
            r"quantization_config\.quant_method: 7 is not a method name",
            id="q-method-int",
        ),
        pytest.param(
            _cfg(quantization_config={"quant_method": "foo"}),
            r"quantization_config\.quant_method: unknown quantization method 'foo'",
            id="q-unknown",
        ),
        pytest.param(
            _cfg(quantization_config={"quant_method": "awq", "bits": 3}),
            r"quantization_config\.bits: 3-bit weights are not a awq format",
            id="awq-3-bit",
        ),
        pytest.param(
            _cfg(quantization_config={**GPTQ, "bits": 0}), r"quantization_config\.bits: must be at least 1", id="gptq-0"
        ),
        pytest.param(
            _cfg(quantization_config={**GPTQ, "bits": 64}),
            r"quantization_config\.bits: 64-bit weights are not a gptq format",
            id="gptq-64",
        ),
        pytest.param(
            _cfg(quantization_config={**GPTQ, "bits": True}),
            r"quantization_config\.bits: True is a boolean, not an integer",
            id="gptq-bool",
        ),
        pytest.param(
            _cfg(quantization_config={**GPTQ, "group_size": 0}),
            r"quantization_config\.group_size: 0 is not a group size",
            id="gptq-group-0",
        ),
        pytest.param(
            _cfg(
                quantization_config={
                    "quant_method": "compressed-tensors",
                    "config_groups": {"g": {"targets": ["Linear"], "weights": {"num_bits": 5}}},
                }
            ),
            r"quantization_config\.config_groups\.g\.weights\.num_bits: 5-bit weights are not a compressed-tensors",
            id="ct-5-bit",
        ),
        pytest.param(
            _cfg(quantization_config={"quant_method": "compressed-tensors", "config_groups": ["g"]}),
            r"quantization_config\.config_groups: must be an object, got a list",
            id="ct-groups-list",
        ),
        pytest.param(
            _cfg(quantization_config={"quant_method": "fp8", "weight_block_size": "128"}),
            r"quantization_config\.weight_block_size: '128' is not two sizes",
            id="fp8-block-text",
        ),
        pytest.param(
            _cfg(quantization_config={"quant_method": "fp8", "weight_block_size": [128, -1]}),
            r"quantization_config\.weight_block_size: must be at least 1",
            id="fp8-block-negative",
        ),
        pytest.param(
            _cfg(model_type="gemma3", sliding_window=16, sliding_window_pattern=0),
            r"sliding_window_pattern: must be at least 1",
            id="gemma3-pattern-0",
        ),
        pytest.param(_cfg(partial_rotary_factor=2), r"partial_rotary_factor: 2 is out of range", id="rotary-2"),
        pytest.param(
            _cfg(tie_word_embeddings="false"), r"tie_word_embeddings: 'false' is a string, not true or false", id="tie"
        ),
        pytest.param(_cfg(mlp_only_layers=5), r"mlp_only_layers: must be a list of layer indices", id="mlp-only"),
        pytest.param(
            _cfg(rope_scaling={"rope_type": "linear", "factor": "x"}),
            r"rope_scaling\.factor: 'x' is not a positive number",
            id="rope-factor",
        ),
        pytest.param(_cfg(**MLA), r"qk_rope_head_dim: missing or 0 for an MLA model", id="mla-no-rope"),
        pytest.param(_cfg(torch_dtype=5), r"torch_dtype: 5 is not a dtype name", id="dtype-int"),
        pytest.param(_cfg(num_experts=-1), r"num_experts: must be at least 0", id="experts-negative"),
        pytest.param(_cfg(seq_length=0), r"seq_length: must be at least 1", id="seq-length-0"),
        # What vLLM or transformers refuse when they load the model (issue 32):
        pytest.param(_cfg(rope_scaling=[1, 2]), r"rope_scaling: \[1, 2\] is not a mapping", id="rope-list"),
        pytest.param(
            _cfg(rope_scaling={"rope_type": "bogus", "factor": 2.0}),
            r"rope_scaling\.rope_type: 'bogus': vLLM raises 'Unknown RoPE scaling type bogus'",
            id="rope-unknown",
        ),
        pytest.param(
            _cfg(layer_types=["full_attention"]),
            r"layer_types: `num_hidden_layers` \(\d+\) must be equal to the number of `layer_types` \(1\)",
            id="layer-types-length",
        ),
        pytest.param(
            _cfg(layer_types=["bogus_attention"] * TINY_CFG["num_hidden_layers"]),
            r"layer_types: 'bogus_attention' is not a layer type transformers knows",
            id="layer-types-unknown",
        ),
        pytest.param(_cfg(layer_types="full_attention"), r"layer_types: 'full_attention' is not a list", id="lt-str"),
        pytest.param(
            _cfg(rope_scaling={"rope_type": "yarn", "type": "linear", "factor": 2.0}),
            r"rope_scaling: Found conflicts between 'rope_type=yarn' \(modern field\) and 'type=linear'",
            id="rope-conflict",
        ),
    ],
)
def test_impossible_config_names_the_key(cfg: dict[str, Any], message: str) -> None:
    with pytest.raises(PlanError, match=r"config\.json:" + message) as err:
        spec_from_config(cfg, "m", source="config.json")
    assert "\n" not in str(err.value) and "; fix: " in str(err.value)


# ---------------------------------------------------------------------------
# Model folders and safetensors headers of every shape
# ---------------------------------------------------------------------------


def _folder(tmp_path: Path, cfg: dict[str, Any] | None = None) -> Path:
    folder = tmp_path / "model"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg or TINY_CFG))
    return folder


def _raw(header: Any, data: bytes = b"", length: int | None = None) -> bytes:
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(text) if length is None else length) + text + data


BF16_2x2 = {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 8]}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        pytest.param(_raw({"w": BF16_2x2}, length=10**6), r"header length 1,000,000 is larger than the file", id="len"),
        pytest.param(_raw({"w": BF16_2x2}, length=2**63), r"header larger than 100 MiB", id="huge-len"),
        pytest.param(b"\x01\x02", r"shorter than 8 bytes", id="short"),
        pytest.param(_raw(b"not json"), r"unreadable safetensors header", id="not-json"),
        pytest.param(_raw(b'{"w": "\xff"}'), r"unreadable safetensors header", id="not-utf8"),
        pytest.param(_raw(b"[" * 100_000 + b"]" * 100_000), r"unreadable safetensors header", id="deep"),
        pytest.param(_raw([1, 2]), r"safetensors header is a list, not an object", id="json-list"),
        pytest.param(_raw(7), r"safetensors header is a int, not an object", id="json-number"),
        pytest.param(_raw({"w": "BF16"}), r"tensor 'w' is described by a string", id="meta-string"),
        pytest.param(_raw({"w": {**BF16_2x2, "shape": "2x2"}}, bytes(8)), r"has shape '2x2', not a list", id="shape"),
        pytest.param(_raw({"w": {**BF16_2x2, "shape": [-2, -2]}}, bytes(8)), r"bad dimension -2", id="negative-dim"),
        pytest.param(_raw({"w": {**BF16_2x2, "shape": [True, 4]}}, bytes(8)), r"bad dimension True", id="bool-dim"),
        pytest.param(_raw({"w": {**BF16_2x2, "dtype": "Q7"}}, bytes(8)), r"unknown dtype 'Q7'", id="dtype"),
        pytest.param(_raw({"w": {"shape": [2], "data_offsets": [0, 4]}}, bytes(4)), r"unknown dtype None", id="no-dt"),
        pytest.param(_raw({"w": BF16_2x2}, bytes(4)), r"data_offsets \[0, 8\] lie outside its 4-byte data", id="out"),
        pytest.param(
            _raw({"w": {**BF16_2x2, "data_offsets": [8, 0]}}, bytes(8)), r"\[8, 0\] lie outside", id="reversed"
        ),
        pytest.param(
            _raw({"w": {**BF16_2x2, "data_offsets": ["0", "8"]}}, bytes(8)), r"has no valid data_offsets", id="text"
        ),
        pytest.param(
            _raw({"w": {**BF16_2x2, "data_offsets": [0, 6]}}, bytes(8)),
            r"takes 6 bytes but BF16 x 4 elements is 8",
            id="size-mismatch",
        ),
        pytest.param(_raw({"__metadata__": [1], "w": BF16_2x2}, bytes(8)), r"__metadata__ is not an object", id="meta"),
    ],
)
def test_hostile_safetensors_header_names_the_file(tmp_path: Path, content: bytes, message: str) -> None:
    folder = _folder(tmp_path)
    (folder / "model.safetensors").write_bytes(content)
    with pytest.raises(PlanError, match=re.escape(str(folder / "model.safetensors")) + ": .*" + message) as err:
        load_model(str(folder))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("name", ["model.safetensors", "config.json"])
def test_a_fifo_is_refused_without_blocking(tmp_path: Path, name: str) -> None:
    """A FIFO where a file should be would block the planner on open (it waits for a writer)."""
    folder = _folder(tmp_path)
    (folder / name).unlink(missing_ok=True)
    os.mkfifo(folder / name)
    argv = [sys.executable, "-m", "vllm_fleet.cli", "estimate", "--model", str(folder), "--gpu", "H100-SXM"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert f"{folder / name}: is not a regular file (a FIFO, socket or device)" in done.stderr


def test_a_folder_named_like_a_shard(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    (folder / "model.safetensors").mkdir()
    with pytest.raises(PlanError, match=r"model\.safetensors: cannot be read"):
        load_model(str(folder))


@pytest.mark.parametrize(
    ("index", "message"),
    [
        pytest.param("{", r"model\.safetensors\.index\.json: is not valid JSON", id="broken"),
        pytest.param('{"metadata": {}}', r"has no weight_map", id="no-weight-map"),
        pytest.param(
            '{"weight_map": {"w": "model.safetensors", "v": "model-2.safetensors"}}',
            r"names 1 file\(s\) that are not in the folder \(e\.g\. 'model-2\.safetensors'\)",
            id="missing-shard",
        ),
    ],
)
def test_bad_safetensors_index(tmp_path: Path, index: str, message: str) -> None:
    folder = _folder(tmp_path)
    write_safetensors(folder / "model.safetensors", {"model.layers.0.w": ("BF16", [2, 2])})
    (folder / "model.safetensors.index.json").write_text(index)
    with pytest.raises(PlanError, match=message):
        load_model(str(folder))


@pytest.mark.parametrize("name", ["._model.safetensors", ".model.safetensors"], ids=["macos-resource-fork", "dotfile"])
def test_dotfiles_next_to_shards_are_skipped_as_vllm_does(tmp_path: Path, name: str) -> None:
    folder = _folder(tmp_path)
    write_safetensors(folder / "model.safetensors", {"model.layers.0.w": ("BF16", [2, 2])})
    (folder / name).write_bytes(b"\x00\x05\x16\x07 Mac OS X resource fork")
    spec = load_model(str(folder))
    assert spec.file_bytes == {"embed": 0, "head": 0, "layer": 8, "vision": 0}


def test_the_index_decides_which_shards_count(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    write_safetensors(folder / "model-1.safetensors", {"model.layers.0.w": ("BF16", [2, 2])})
    write_safetensors(folder / "stray.safetensors", {"model.layers.1.w": ("BF16", [64, 64])})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": "model-1.safetensors"}}))
    assert load_model(str(folder)).file_bytes == {"embed": 0, "head": 0, "layer": 8, "vision": 0}


@pytest.mark.parametrize(
    ("make", "message"),
    [
        pytest.param(
            lambda f: (f / "config.json").unlink(), r"is not a model folder \(no config\.json\)", id="no-config"
        ),
        pytest.param(
            lambda f: ((f / "config.json").unlink(), (f / "config.json").mkdir()),
            r"is not a model folder \(no config\.json\)",
            id="config-is-a-folder",
        ),
        pytest.param(
            lambda f: (f / "config.json").write_bytes(b'{"hidden_size": "\xe9"}'),
            r"config\.json: is not UTF-8 text",
            id="not-utf8",
        ),
        pytest.param(
            lambda f: (f / "config.json").write_text("[" * 100_000), r"config\.json is not valid JSON", id="deep"
        ),
        pytest.param(lambda f: (f / "config.json").write_text("NaN"), r"config\.json: is not a JSON object", id="nan"),
    ],
)
def test_broken_model_folder_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make: Callable[[Path], Any], message: str
) -> None:
    folder = _folder(tmp_path)
    make(folder)
    line = _one_line_exit_2([*EST[:2], str(folder), "--gpu", "H100"], capsys, "")
    assert re.search(message, line), line


def test_a_path_that_does_not_exist(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    _one_line_exit_2(["estimate", "--model", str(tmp_path / "nope"), "--gpu", "H100"], capsys, "does not exist")


# ---------------------------------------------------------------------------
# Plans vLLM itself refuses at start-up
# ---------------------------------------------------------------------------


def _plan_folder(tmp_path: Path, cfg: dict[str, Any], **wishes: Any) -> dict[str, Any]:
    folder = _folder(tmp_path, cfg)
    return plan_cluster(load_model(str(folder)), cluster_from_data({"nodes": H100}), Wishes(**wishes))


@pytest.mark.parametrize(
    ("cfg", "files", "wishes", "message"),
    [
        pytest.param(TINY_CFG, {}, {"max_model_len": 4096}, r"4096 is above the model's derived maximum", id="mml"),
        pytest.param(
            _cfg(seq_length=1024),
            {},
            {"max_model_len": 2048},
            r"2048 is above the model's derived maximum \(seq_length=1024\)",
            id="seq-length-below",
        ),
        pytest.param(
            _cfg(architectures=["BertModel"], position_embedding_type="absolute"),
            {"tokenizer_config.json": '{"model_max_length": 1024}'},
            {"max_model_len": 2048},
            r"derived maximum \(tokenizer_config\.json:model_max_length=1024\)",
            id="tokenizer-max-pooling-absolute",
        ),
        pytest.param(
            _cfg(rope_scaling={"rope_type": "linear", "factor": 2.0}),
            {},
            {"max_model_len": 8192},
            r"8192 is above the model's derived maximum \(max_position_embeddings=4096\)",
            id="rope-linear-x2",
        ),
        pytest.param(
            _cfg(rope_scaling={"rope_type": "yarn", "factor": 4.0}),
            {},
            {"max_model_len": 4096},
            r"derived maximum \(max_position_embeddings=2048\)",
            id="rope-yarn-prescaled",
        ),
    ],
)
def test_max_model_len_vllm_refuses(
    tmp_path: Path, cfg: dict[str, Any], files: dict[str, str], wishes: dict[str, Any], message: str
) -> None:
    folder = _folder(tmp_path, cfg)
    for name, text in files.items():
        (folder / name).write_text(text)
    with pytest.raises(PlanError, match=r"--max-model-len: .*" + message):
        plan_cluster(load_model(str(folder)), cluster_from_data({"nodes": H100}), Wishes(**wishes))


@pytest.mark.parametrize(
    ("cfg", "wishes"),
    [
        pytest.param(TINY_CFG, {"max_model_len": 4096, "extra_env": {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}}, id="env"),
        pytest.param(
            _cfg(rope_scaling={"rope_type": "linear", "factor": 2.0}), {"max_model_len": 4096}, id="rope-linear"
        ),
        pytest.param(_cfg(model_max_length=8192), {"max_model_len": 8192}, id="model-max-length"),
    ],
)
def test_max_model_len_vllm_accepts(tmp_path: Path, cfg: dict[str, Any], wishes: dict[str, Any]) -> None:
    plan = _plan_folder(tmp_path, cfg, **wishes)
    assert plan["instances"][0]["max_model_len"] == wishes["max_model_len"]


def test_allowed_long_context_warns(tmp_path: Path) -> None:
    plan = _plan_folder(tmp_path, TINY_CFG, max_model_len=4096, extra_env={"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "true"})
    assert any("VLLM_ALLOW_LONG_MAX_MODEL_LEN lets vLLM start" in w for w in plan["warnings"])


def _gpus(gpu: str, count: int = 8, name: str = "g1") -> dict[str, Any]:
    return {"name": name, "gpu": gpu, "gpu_count": count}


DEEPSEEK = "deepseek-ai/DeepSeek-R1"
GPTQ_CFG = _cfg(quantization_config=GPTQ)


@pytest.mark.parametrize(
    ("model", "nodes", "wishes", "message"),
    [
        pytest.param(
            "Qwen/Qwen3-8B",
            [_gpus("V100-32G")],
            {"dtype": "bfloat16"},
            r"--dtype: bfloat16 needs compute capability 8\.0, V100-32G has 7\.0",
            id="bf16-v100",
        ),
        pytest.param(
            "Qwen/Qwen3-8B",
            [_gpus("T4")],
            {"dtype": "bfloat16"},
            r"--dtype: bfloat16 needs compute capability 8\.0, T4 has 7\.5",
            id="bf16-t4",
        ),
        pytest.param(
            "Qwen/Qwen3-8B",
            [_gpus("V100-32G")],
            {"quantization": "fp8"},
            r"--quantization: fp8 weights need compute capability 7\.5, V100-32G has 7\.0",
            id="fp8-flag-v100",
        ),
        pytest.param(
            DEEPSEEK,
            [_gpus("V100-32G", name=f"g{i}") for i in range(8)],
            {"max_model_len": 4096},
            r"--model: fp8 weights need compute capability 7\.5, V100-32G has 7\.0",
            id="fp8-checkpoint-v100",
        ),
        pytest.param(
            "openai/gpt-oss-20b",
            [_gpus("T4")],
            {},
            r"--model: gpt_oss_mxfp4 weights need compute capability 8\.0, T4 has 7\.5",
            id="mxfp4-t4",
        ),
        pytest.param(
            DEEPSEEK,
            [_gpus("H200", name=f"g{i}") for i in range(2)],
            {"kv_cache_dtype": "fp8_e5m2", "max_model_len": 4096},
            r"--kv-cache-dtype: fp8_e5m2 has no MLA attention backend",
            id="mla-fp8-e5m2",
        ),
        pytest.param(
            DEEPSEEK,
            [{"name": "c", "gpu": "cpu", "gpu_count": 1, "gpu_memory_gib": 4000}],
            {"kv_cache_dtype": "fp8", "max_model_len": 4096},
            r"--kv-cache-dtype: fp8 is not a KV cache dtype of vLLM's CPU MLA backend",
            id="cpu-mla-fp8",
        ),
        pytest.param(
            DEEPSEEK,
            [_gpus("H200")],
            {"quantization": "awq"},
            r"--quantization: awq does not match the checkpoint's quantization_config \(fp8\)",
            id="flag-vs-checkpoint",
        ),
        pytest.param(
            "Qwen/Qwen3-8B",
            [_gpus("H100")],
            {"quantization": "awq"},
            r"--quantization: awq loads a checkpoint quantized with awq, but Qwen/Qwen3-8B has no",
            id="awq-on-bf16-checkpoint",
        ),
        pytest.param(
            "Qwen/Qwen3-8B",
            [_gpus("H100")],
            {"quantization": "w4a16"},
            r"--quantization: 'w4a16' is not a quantization method vLLM knows.*fix: use --quantization compressed",
            id="planner-shorthand",
        ),
        pytest.param(
            "Qwen/Qwen3-8B",
            [_gpus("H100")],
            {"quantization": "gptq-marlin"},
            r"fix: use --quantization gptq_marlin",
            id="misspelled-method",
        ),
    ],
)
def test_plans_vllm_refuses_at_start_up(
    model: str, nodes: list[dict[str, Any]], wishes: dict[str, Any], message: str
) -> None:
    with pytest.raises(PlanError, match=message) as err:
        plan_cluster(load_model(model), cluster_from_data({"nodes": nodes}), Wishes(**wishes))
    assert "\n" not in str(err.value) and "; fix: " in str(err.value)


def test_gpus_vllm_cannot_use_are_left_out_with_a_warning() -> None:
    nodes = [_gpus("T4", 4, "t4"), _gpus("A100-80G", 8, "a100")]
    plan = plan_cluster(load_model("Qwen/Qwen3-8B"), cluster_from_data({"nodes": nodes}), Wishes(dtype="bfloat16"))
    assert {n for i in plan["instances"] for n in i["nodes"]} == {"a100"}
    assert plan["warnings"][0].startswith("left out t4: bfloat16 needs compute capability 8.0")


@pytest.mark.parametrize(
    ("flag", "checkpoint"),
    [("gptq_marlin", GPTQ), ("gptq", GPTQ), ("moe_wna16", GPTQ), ("awq_marlin", {"quant_method": "awq"})],
    ids=["gptq-marlin", "gptq", "moe-wna16", "awq-marlin"],
)
def test_flags_vllm_accepts_for_a_checkpoint(tmp_path: Path, flag: str, checkpoint: dict[str, Any]) -> None:
    plan = _plan_folder(tmp_path, _cfg(quantization_config=checkpoint), quantization=flag)
    assert plan["instances"][0]["vllm_args"][-2:] == ["--quantization", flag]


def test_estimate_keeps_the_planners_shorthands(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*EST, "--gpu", "H100", "--quantization", "w4a16", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["quantization"] == "compressed-tensors"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(
            [*EST, "--gpu", "V100-32G", "--dtype", "bfloat16"], "bfloat16 needs compute capability 8.0", id="bf16"
        ),
        pytest.param(
            ["estimate", "--model", DEEPSEEK, "--gpu", "H200", "--quantization", "gptq"],
            "gptq does not match the checkpoint's quantization_config (fp8)",
            id="mismatch",
        ),
        pytest.param(
            [*EST, "--gpu", "H100", "--max-model-len", "65536"], "65536 is above the model's derived maximum", id="mml"
        ),
    ],
)
def test_estimate_refuses_what_vllm_refuses(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    _one_line_exit_2(argv, capsys, message)


def test_estimate_env_allows_a_long_context(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [*EST, "--gpu", "H100", "--max-model-len", "65536", "--env", "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1", "--json"]
    assert main(argv) == 0
    assert any("VLLM_ALLOW_LONG_MAX_MODEL_LEN" in n for n in json.loads(capsys.readouterr().out)["notes"])


# ---------------------------------------------------------------------------
# Forced layouts: the message names what is wrong
# ---------------------------------------------------------------------------


def _cluster4(tmp_path: Path) -> str:
    return str(_cluster_file(tmp_path, yaml.safe_dump({"nodes": H100})))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(
            ["--model", "mistralai/Mixtral-8x22B-v0.1", "-tp", "6"],
            "--tensor-parallel-size: TP=6 needs 6 GPUs in one node, the largest has 4; fix: use TP of at most 4 "
            "(valid for mistralai/Mixtral-8x22B-v0.1: 1, 2, 4) with PP across nodes, or pass --allow-cross-node-tp",
            id="tp-above-every-node",
        ),
        pytest.param(
            ["--model", "mistralai/Mixtral-8x22B-v0.1", "-tp", "6", "--allow-cross-node-tp"],
            "TP=6 needs 6 GPUs in one node, the largest has 4; fix: use TP of at most 4",
            id="tp-above-every-node-cross",
        ),
        pytest.param(
            ["--model", "Qwen/Qwen3-8B", "-pp", "3"],
            "no layout of Qwen/Qwen3-8B honours --pipeline-parallel-size 3 on these nodes",
            id="pp-3",
        ),
        pytest.param(
            ["--model", "Qwen/Qwen3-8B", "--strategy", "dp_ep"],
            "dp_ep needs a MoE model and Qwen/Qwen3-8B is dense; fix: drop it",
            id="dp-ep-dense",
        ),
    ],
)
def test_forced_layouts_say_what_is_wrong(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    line = _one_line_exit_2(["plan", "--cluster", _cluster4(tmp_path), *argv], capsys, message)
    assert "--max-model-len" not in line and "fp8" not in line


def test_tp_that_does_not_shard_the_kv_heads_is_never_planned() -> None:
    # Llama 3.2 3B: 24 heads, 8 KV heads; TP=3 divides the heads but not the KV heads (vLLM's
    # QKVParallelLinear refuses it), so a 3-GPU node gets TP=1 replicas, not TP=3.
    nodes = cluster_from_data({"nodes": [{"name": "n", "gpu": "L4", "gpu_count": 3}]})
    plan = plan_cluster(load_model("meta-llama/Llama-3.2-3B"), nodes, Wishes(max_model_len=4096))
    assert {i["tensor_parallel_size"] for i in plan["instances"]} == {1}
    reasons = [r["reason"] for r in plan["rejected"]]
    assert "TP=3 rejected: neither divides nor is a multiple of 8 KV heads" in reasons
    with pytest.raises(NothingFitsError):
        plan_cluster(load_model("meta-llama/Llama-3.2-3B"), nodes, Wishes(tensor_parallel_size=3))


# ---------------------------------------------------------------------------
# Inventory checks (interface.check_nodes)
# ---------------------------------------------------------------------------


def _nodes(**per_node: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: interface.resolve(raw) for name, raw in per_node.items()}


@pytest.mark.parametrize(
    ("per_node", "role_vars", "hosts", "ssh_ports", "message"),
    [
        pytest.param(
            _nodes(n1={}),
            {"n1": {"ray_cluster_gcs_port": "abc"}},
            None,
            None,
            "ray_cluster_gcs_port: 'abc' on n1",
            id="bad-ray-port",
        ),
        pytest.param(
            _nodes(n1={}),
            {"n1": {"ray_cluster_min_worker_port": 7000, "ray_cluster_max_worker_port": 6000}},
            None,
            None,
            "ray_cluster_min_worker_port: 7000 is above ray_cluster_max_worker_port 6000 on n1",
            id="ray-range-upside-down",
        ),
        pytest.param(
            _nodes(n1={"vllm_fleet_address": "10.0.0.1"}, n2={"vllm_fleet_address": "10.0.0.1"}),
            None,
            None,
            None,
            "vllm_fleet_address: n1 and n2 are one machine (10.0.0.1)",
            id="same-address",
        ),
        pytest.param(
            _nodes(n1={}, n2={}),
            None,
            {"n1": "192.0.2.7", "n2": "192.0.2.7"},
            None,
            "ansible_host: n1 and n2 are one machine (192.0.2.7, ansible_port 22)",
            id="same-ansible-host",
        ),
        pytest.param(
            _nodes(n1={}, n2={}),
            None,
            {"n1": "192.0.2.7", "n2": "192.0.2.7"},
            {"n1": 2222, "n2": "2222"},
            "ansible_host: n1 and n2 are one machine (192.0.2.7, ansible_port 2222)",
            id="same-ansible-host-and-port",
        ),
        pytest.param(
            _nodes(n1={"vllm_fleet_address": "10.0.0.1"}, n2={"vllm_fleet_address": "10.0.0.2"}),
            None,
            {"n1": "192.0.2.7", "n2": "192.0.2.7"},
            None,
            "ansible_host: n1 and n2 are one machine (192.0.2.7, ansible_port 22)",
            id="one-ssh-target-two-addresses",
        ),
    ],
)
def test_inventory_refusals_before_planning(
    per_node: dict[str, dict[str, Any]],
    role_vars: dict[str, dict[str, Any]] | None,
    hosts: dict[str, str | None] | None,
    ssh_ports: dict[str, Any] | None,
    message: str,
) -> None:
    with pytest.raises(PlanError, match=re.escape(message)) as err:
        interface.check_nodes(per_node, role_vars, hosts, ssh_ports)
    assert "\n" not in str(err.value) and "; fix: " in str(err.value)


@pytest.mark.parametrize(
    ("per_node", "role_vars", "hosts", "ssh_ports"),
    [
        pytest.param(_nodes(n1={"vllm_fleet_gpu_count": 8}), None, None, None, id="defaults"),
        pytest.param(_nodes(n1={}, n2={}), None, {"n1": "192.0.2.1", "n2": "192.0.2.2"}, None, id="two-machines"),
        # Two machines behind one address (NAT), reached on different SSH ports.
        pytest.param(
            _nodes(n1={}, n2={}), None, {"n1": "192.0.2.7", "n2": "192.0.2.7"}, {"n1": 2201, "n2": 2202}, id="nat"
        ),
        pytest.param(
            _nodes(n1={"vllm_fleet_address": "192.0.2.7"}, n2={}), None, {"n2": "192.0.2.7"}, None, id="addr-vs-host"
        ),
        # Ports alone are not refused before the plan says what runs where.
        pytest.param(_nodes(n1={"vllm_fleet_port": 6379}), None, None, None, id="port-on-ray-gcs"),
    ],
)
def test_inventories_that_pass_before_planning(
    per_node: dict[str, dict[str, Any]],
    role_vars: dict[str, dict[str, Any]] | None,
    hosts: dict[str, str | None] | None,
    ssh_ports: dict[str, Any] | None,
) -> None:
    interface.check_nodes(per_node, role_vars, hosts, ssh_ports)


def test_ray_ports_match_the_roles_defaults() -> None:
    defaults = yaml.safe_load((ROOT / "roles/ray_cluster/defaults/main.yml").read_text())
    assert {k: defaults[k] for k in interface.RAY_PORTS} == interface.RAY_PORTS
    low, high, low_default, high_default = interface.RAY_WORKER_PORTS
    assert (defaults[str(low)], defaults[str(high)]) == (low_default, high_default)
    gateway = yaml.safe_load((ROOT / "roles/llm_gateway/defaults/main.yml").read_text())
    assert {k: gateway[k] for k in interface.ROUTER_PORTS} == interface.ROUTER_PORTS


@pytest.mark.parametrize(
    ("name", "raw", "message"),
    [
        ("gpu_memory_gib", 5000, "5000.0 is above 4096"),
        ("max_model_len", 10**9, "1000000000 is above 100000000"),
        ("nic_gbps", 1e6, "1000000.0 is above 100000"),
        ("max_num_seqs", 2**21, "2097152 is above 1048576"),
    ],
    ids=["memory", "max-model-len", "nic", "max-num-seqs"],
)
def test_interface_upper_bounds(name: str, raw: Any, message: str) -> None:
    with pytest.raises(PlanError, match=re.escape(f"vllm_fleet_{name}: {message}")):
        interface.resolve({f"vllm_fleet_{name}": raw})


def test_duplicate_yaml_keys_are_an_error_for_ansible() -> None:
    text = (ROOT / "ansible.cfg").read_text()
    section = text.split("[defaults]", 1)[1].split("\n[", 1)[0]
    assert re.search(r"^duplicate_dict_key = error$", section, re.MULTILINE)


@pytest.mark.parametrize(
    ("wishes", "message"),
    [
        pytest.param(Wishes(max_loras=0), r"max_loras: must be a positive integer, got 0", id="max-loras"),
        pytest.param(Wishes(max_lora_rank=7), r"max_lora_rank: must be one of", id="lora-rank-choice"),
        pytest.param(Wishes(enable_lora="yes"), r"enable_lora: must be true or false", id="lora-bool"),  # type: ignore[arg-type]
        pytest.param(Wishes(speculative_config="ngram"), r"speculative_config: must be a mapping", id="spec-json"),  # type: ignore[arg-type]
        pytest.param(Wishes(cpu_offload_gb=-1.0), r"cpu_offload_gb: must be a number from 0", id="offload"),
    ],
)
def test_every_declared_bound_holds_for_a_python_caller(wishes: Wishes, message: str) -> None:
    """A Wishes built by hand meets each option's declaration (vllm_fleet/schema.py), as an inventory does."""
    with pytest.raises(PlanError, match=message):
        plan_cluster(load_model("meta-llama/Llama-3.1-8B"), load_cluster(FIXTURES / "2x8xa800.yml"), wishes)
