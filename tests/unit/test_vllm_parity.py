"""The planner refuses what vLLM 0.32 refuses and nothing more: the model length vLLM
derives (``_get_and_verify_max_len``), the quantization it resolves (config.json, the
method's own file, the overrides, deprecated methods), the ports a plan really hands out
on each node, two inventory names for one machine, and the field names each edge shows.

Every model is a tiny folder in ``tmp_path`` with the config.json shapes real checkpoints have.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, filter_plugins
from vllm_fleet.accounting.memory import estimate
from vllm_fleet.accounting.settings import Device, Settings
from vllm_fleet.cli import main
from vllm_fleet.errors import PlanError, for_cli, for_inventory
from vllm_fleet.inventory import interface
from vllm_fleet.model.spec import load_model
from vllm_fleet.planning.cluster import cluster_from_data
from vllm_fleet.planning.strategy import Wishes, plan_cluster

TINY: dict[str, Any] = json.loads((ROOT / "inventories/local/files/tiny-llama/config.json").read_text())
H100 = [{"name": "n1", "gpu": "H100", "gpu_count": 1}]


def _cfg(**changes: Any) -> dict[str, Any]:
    cfg = dict(TINY)
    for key, value in changes.items():
        if value is None:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    return cfg


def _model(tmp_path: Path, cfg: dict[str, Any], files: dict[str, Any] | None = None) -> str:
    folder = tmp_path / "model"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    for name, content in (files or {}).items():
        (folder / name).write_text(content if isinstance(content, str) else json.dumps(content))
    return str(folder)


def _plan(model: str, nodes: list[dict[str, Any]] | None = None, **wishes: Any) -> dict[str, Any]:
    return plan_cluster(load_model(model), cluster_from_data({"nodes": nodes or H100}), Wishes(**wishes))


def _length(plan: dict[str, Any]) -> int:
    return int(plan["instances"][0]["max_model_len"])


# ---------------------------------------------------------------------------
# 1. max_model_len: vLLM's default and the bound of an explicit length
# ---------------------------------------------------------------------------

BERT = {"architectures": ["BertModel"], "position_embedding_type": "absolute"}
TOKENIZER_1024 = {"tokenizer_config.json": {"model_max_length": 1024}}
LONGROPE = {
    "max_position_embeddings": 4096,
    "original_max_position_embeddings": 1024,
    "rope_scaling": {"type": "su", "short_factor": [1.0], "long_factor": [4.0]},
}


@pytest.mark.parametrize(
    ("cfg", "files", "default"),
    [
        pytest.param(_cfg(seq_length=1024), {}, 1024, id="smaller-seq-length"),
        pytest.param(_cfg(n_positions=1024), {}, 1024, id="smaller-n-positions"),
        pytest.param(TINY, TOKENIZER_1024, 2048, id="tokenizer-ignored-for-a-causal-lm"),
        pytest.param(_cfg(**BERT), TOKENIZER_1024, 1024, id="tokenizer-caps-an-absolute-pooling-model"),
        pytest.param(
            _cfg(architectures=["BertModel"], position_embedding_type="rotary"), TOKENIZER_1024, 2048, id="rotary"
        ),
        pytest.param(
            _cfg(position_embedding_type="absolute"),
            {**TOKENIZER_1024, "modules.json": [{"type": "sentence_transformers.models.Pooling", "path": "1"}]},
            1024,
            id="sentence-transformers-pooling",
        ),
        pytest.param(_cfg(rope_scaling={"rope_type": "linear", "factor": 2.0}), {}, 4096, id="rope-linear-x2"),
        pytest.param(_cfg(rope_scaling={"type": "dynamic", "factor": 2.0}), {}, 4096, id="rope-legacy-type-key"),
        pytest.param(_cfg(rope_scaling={"rope_type": "yarn", "factor": 4.0}), {}, 2048, id="rope-yarn-prescaled"),
        pytest.param(
            _cfg(model_type="gemma3_text", rope_scaling={"rope_type": "linear", "factor": 8.0}), {}, 2048, id="gemma3"
        ),
        pytest.param(_cfg(**LONGROPE), {}, 1024, id="longrope-original-length"),
        pytest.param(_cfg(max_position_embeddings=None), {}, 2048, id="no-length-key"),
        pytest.param(
            _cfg(max_position_embeddings=None, rope_scaling={"rope_type": "linear", "factor": 2.0}),
            {},
            4096,
            id="no-length-key-scaled",
        ),
        pytest.param(_cfg(model_max_length=4096), {}, 4096, id="model-max-length-wins"),
        pytest.param(TINY, {"sentence_bert_config.json": {"max_seq_length": 256}}, 256, id="sentence-bert-config"),
    ],
)
def test_the_default_length_is_vllms(tmp_path: Path, cfg: dict[str, Any], files: dict[str, Any], default: int) -> None:
    plan = _plan(_model(tmp_path, cfg, files))
    assert _length(plan) == default
    assert plan["instances"][0]["vllm_args"][plan["instances"][0]["vllm_args"].index("--max-model-len") + 1] == str(
        default
    )


@pytest.mark.parametrize(
    ("cfg", "files", "length"),
    [
        pytest.param(TINY, TOKENIZER_1024, 2048, id="tokenizer-ignored"),
        pytest.param(_cfg(**LONGROPE), {}, 4096, id="longrope-up-to-max-positions"),
        pytest.param(_cfg(max_position_embeddings=None), {}, 65536, id="no-length-key-takes-any"),
        pytest.param(_cfg(architectures=["BertModel"], position_embedding_type="rotary"), TOKENIZER_1024, 2048, id="r"),
    ],
)
def test_explicit_lengths_vllm_accepts(tmp_path: Path, cfg: dict[str, Any], files: dict[str, Any], length: int) -> None:
    assert _length(_plan(_model(tmp_path, cfg, files), max_model_len=length)) == length


@pytest.mark.parametrize(
    ("cfg", "files", "length", "message"),
    [
        pytest.param(_cfg(n_positions=1024), {}, 2048, r"\(n_positions=1024\)", id="smallest-key"),
        pytest.param(
            _cfg(**BERT), TOKENIZER_1024, 2048, r"\(tokenizer_config\.json:model_max_length=1024\)", id="tokenizer"
        ),
        pytest.param(
            TINY,
            {"sentence_bert_config.json": {"max_seq_length": 256}},
            512,
            r"\(sentence_bert_config\.json:max_seq_length=256\)",
            id="sentence-bert-config",
        ),
        pytest.param(
            _cfg(rope_scaling={"rope_type": "linear", "factor": 2.0}),
            {},
            8192,
            r"\(max_position_embeddings=4096\)",
            id="scaled",
        ),
    ],
)
def test_explicit_lengths_vllm_refuses(
    tmp_path: Path, cfg: dict[str, Any], files: dict[str, Any], length: int, message: str
) -> None:
    with pytest.raises(PlanError, match=rf"--max-model-len: {length} is above the model's derived maximum {message}"):
        _plan(_model(tmp_path, cfg, files), max_model_len=length)


def test_an_unplannable_default_asks_for_a_length(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match=r"--max-model-len: vLLM's default length .* above 100,000,000"):
        _plan(_model(tmp_path, _cfg(max_position_embeddings=None, model_max_length=1e30)))


# ---------------------------------------------------------------------------
# 2. --quantization reads compression_config and the method's own file
# ---------------------------------------------------------------------------

GPTQ_FILE = {"bits": 8, "group_size": 128, "desc_act": False, "sym": True}
CT_4BIT = {
    "quant_method": "compressed-tensors",
    "config_groups": {
        "g0": {"weights": {"num_bits": 4, "strategy": "group", "group_size": 128}, "targets": ["Linear"]}
    },
}
MODELOPT_FILE = {"producer": {"name": "modelopt", "version": "0.19"}, "quantization": {"quant_algo": "FP8"}}


@pytest.mark.parametrize(
    ("files", "flag"),
    [
        pytest.param({"quantize_config.json": GPTQ_FILE}, "gptq", id="gptq-quantize-config"),
        pytest.param({"quantize_config.json": GPTQ_FILE}, "gptq_marlin", id="gptq-marlin-quantize-config"),
        pytest.param({"quant_config.json": {"w_bit": 4, "q_group_size": 128}}, "awq", id="awq-quant-config"),
        pytest.param({"hf_quant_config.json": MODELOPT_FILE}, "modelopt", id="modelopt-hf-quant-config"),
    ],
)
def test_the_methods_own_file_is_read(tmp_path: Path, files: dict[str, Any], flag: str) -> None:
    plan = _plan(_model(tmp_path, TINY, files), quantization=flag)
    assert plan["instances"][0]["vllm_args"][-2:] == ["--quantization", flag]


def test_the_files_bits_are_the_weights(tmp_path: Path) -> None:
    def weights(bits: int) -> float:
        (tmp_path / str(bits)).mkdir()
        model = _model(tmp_path / str(bits), TINY, {"quantize_config.json": {**GPTQ_FILE, "bits": bits}})
        return estimate(load_model(model), Device("H100", 79.19), Settings(quantization="gptq")).ranks[0].weights_gib

    assert weights(8) > weights(4)


def test_compression_config_is_the_checkpoints_quantization(tmp_path: Path) -> None:
    spec = load_model(_model(tmp_path, _cfg(compression_config=CT_4BIT)))
    assert spec.quant_method == "compressed-tensors" and spec.quant is not None and spec.quant.weight_bits == 4
    _plan(_model(tmp_path, _cfg(compression_config=CT_4BIT)), quantization="compressed-tensors")


@pytest.mark.parametrize(
    ("files", "flag", "message"),
    [
        pytest.param(
            {}, "gptq", r"gptq loads a checkpoint .* no quantization_config nor quantize_config\.json", id="no"
        ),
        pytest.param(
            {"quantize_config.json": GPTQ_FILE, "quant_config.json": {"w_bit": 4}},
            "awq",
            r"vLLM finds several awq config files in .* \(quant_config\.json, quantize_config\.json\)",
            id="two-awq-files",
        ),
        pytest.param(
            {"hf_quant_config.json": {"producer": {"name": "other"}, "quantization": {"quant_algo": "FP8"}}},
            "modelopt",
            r"hf_quant_config\.json: is not a ModelOpt config",
            id="modelopt-file-of-another-producer",
        ),
        pytest.param({}, "compressed-tensors", r"compressed-tensors loads a checkpoint", id="ct-without-config"),
    ],
)
def test_checkpoint_formats_without_their_config_are_refused(
    tmp_path: Path, files: dict[str, Any], flag: str, message: str
) -> None:
    with pytest.raises(PlanError, match=message):
        _plan(_model(tmp_path, TINY, files), quantization=flag)


# ---------------------------------------------------------------------------
# 3. The method vLLM runs (its overrides) decides the compute capability
# ---------------------------------------------------------------------------

T4 = [{"name": "t4", "gpu": "T4", "gpu_count": 1}]
NVFP4 = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "exclude_modules": ["lm_head"]}
MIXED = {
    "quant_method": "modelopt",
    "quant_algo": "MIXED_PRECISION",
    "quantized_layers": {"x": {"quant_algo": "NVFP4"}},
}
PRODUCER_NVFP4 = {
    "producer": {"name": "modelopt"},
    "quantization": {"quant_algo": "NVFP4", "group_size": 16, "kv_cache_quant_algo": None, "exclude_modules": []},
}


@pytest.mark.parametrize(
    ("qcfg", "method"),
    [
        pytest.param(NVFP4, "modelopt_fp4", id="modelopt-nvfp4"),
        pytest.param(MIXED, "modelopt_mixed", id="modelopt-mixed"),
        pytest.param(PRODUCER_NVFP4, "modelopt_fp4", id="modelopt-producer-shape"),
    ],
)
def test_modelopt_checkpoints_run_as_vllm_resolves_them(tmp_path: Path, qcfg: dict[str, Any], method: str) -> None:
    # vLLM needs 7.5 for modelopt_fp4 / modelopt_mixed (8.0 only for ModelOpt FP8): a T4 serves them.
    model = _model(tmp_path, _cfg(quantization_config=qcfg))
    plan = _plan(model, T4)
    assert plan["instances"][0]["nodes"] == ["t4"]
    from vllm_fleet.model.quantization import resolve_quantization

    assert resolve_quantization(load_model(model), None).method == method


def test_modelopt_fp8_still_needs_ampere(tmp_path: Path) -> None:
    qcfg = {"quant_method": "modelopt", "quant_algo": "FP8"}
    with pytest.raises(PlanError, match=r"--model: modelopt weights need compute capability 8\.0, T4 has 7\.5"):
        _plan(_model(tmp_path, _cfg(quantization_config=qcfg)), T4)


@pytest.mark.parametrize(
    ("model_cfg", "flag", "runs_as"),
    [
        pytest.param({"quantization_config": NVFP4}, "fp8", "modelopt_fp4", id="modelopt-ignores-the-flag"),
        pytest.param(
            {"model_type": "gpt_oss", "quantization_config": {"quant_method": "mxfp4"}},
            "mxfp4",
            "gpt_oss_mxfp4",
            id="gpt-oss-mxfp4",
        ),
        pytest.param({"quantization_config": {"quant_method": "gptq", "bits": 4}}, "marlin", "auto_gptq", id="marlin"),
    ],
)
def test_flags_vllm_overrides_are_not_refused(
    tmp_path: Path, model_cfg: dict[str, Any], flag: str, runs_as: str
) -> None:
    plan = _plan(_model(tmp_path, _cfg(**model_cfg)), quantization=flag)
    assert f"vLLM runs --quantization {flag} as {runs_as} for this checkpoint" in plan["warnings"]


def test_awq_on_the_cpu_has_no_override(tmp_path: Path) -> None:
    model = _model(tmp_path, _cfg(quantization_config={"quant_method": "awq", "bits": 4, "group_size": 128}))
    _plan(model, quantization="awq_marlin")  # CUDA: AutoAWQ takes awq_marlin
    cpu = [{"name": "c", "gpu": "cpu", "gpu_count": 1, "gpu_memory_gib": 16}]
    with pytest.raises(PlanError, match=r"awq_marlin does not match the checkpoint's quantization_config \(awq\)"):
        _plan(model, cpu, quantization="awq_marlin")


# ---------------------------------------------------------------------------
# 7. What vLLM 0.32 accepts as --quantization
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("flag", ["bitsandbytes", "gguf"])
def test_methods_vllm_0_32_dropped_are_refused(flag: str) -> None:
    with pytest.raises(PlanError, match=rf"--quantization: '{flag}' is not a quantization method vLLM knows"):
        _plan("Qwen/Qwen3-8B", quantization=flag)


def test_an_older_release_still_takes_bitsandbytes() -> None:
    plan = _plan("Qwen/Qwen3-8B", quantization="bitsandbytes", vllm_version="0.10.2")
    assert plan["instances"][0]["vllm_args"][-2:] == ["--quantization", "bitsandbytes"]


FBGEMM = {"quant_method": "fbgemm_fp8", "modules_to_not_convert": ["lm_head"], "activation_scale_ub": 1200.0}
FP_QUANT = {"quant_method": "fp_quant", "forward_dtype": "mxfp4", "hadamard_group_size": 32}
OPT_IN = ("--allow-deprecated-quantization",)


def test_deprecated_methods_need_vllms_opt_in(tmp_path: Path) -> None:
    model = _model(tmp_path, _cfg(quantization_config=FBGEMM))
    with pytest.raises(
        PlanError, match=r"--model: fbgemm_fp8 is deprecated .* fix: add --allow-deprecated-quantization"
    ):
        _plan(model)
    _plan(model, extra_args=OPT_IN)
    with pytest.raises(PlanError, match=r"--quantization: fbgemm_fp8 is deprecated"):
        _plan(model, quantization="fbgemm_fp8")


def test_fp_quant_needs_blackwell(tmp_path: Path) -> None:
    model = _model(tmp_path, _cfg(quantization_config=FP_QUANT))
    with pytest.raises(PlanError, match=r"fp_quant weights need compute capability 10\.0, H100-SXM has 9\.0"):
        _plan(model, extra_args=OPT_IN)
    _plan(model, [{"name": "b", "gpu": "B200", "gpu_count": 1}], extra_args=OPT_IN)


def test_the_cli_passes_the_opt_in_on(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = _model(tmp_path, _cfg(quantization_config=FBGEMM))
    cluster = tmp_path / "c.yml"
    cluster.write_text("nodes:\n- {name: n1, gpu: H100, gpu_count: 1}\n")
    assert main(["plan", "--model", model, "--cluster", str(cluster), "--json"]) == 2
    assert "fix: add --allow-deprecated-quantization" in capsys.readouterr().err
    assert main(["plan", "--model", model, "--cluster", str(cluster), "--allow-deprecated-quantization", "--json"]) == 0
    assert "--allow-deprecated-quantization" in json.loads(capsys.readouterr().out)["instances"][0]["vllm_args"]


def test_inventory_extra_args_carry_the_opt_in_when_every_node_has_it() -> None:
    both = {"vllm_fleet_extra_args": ["--allow-deprecated-quantization"]}
    n1, n2 = interface.resolve(both), interface.resolve({})
    assert interface.wishes(n1, None, [n1, interface.resolve(both)])["extra_args"] == list(OPT_IN)
    assert "extra_args" not in interface.wishes(n1, None, [n1, n2])


def test_an_environment_the_plan_reads_must_be_the_same_on_every_node() -> None:
    """The plan reads VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS (and the other variables it
    accounts for) once: a node whose launch would get another value is refused, naming both."""
    off = interface.resolve({"vllm_fleet_extra_env": {"VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS": "0"}})
    other = interface.resolve({"vllm_fleet_extra_env": {"VLLM_LOGGING_LEVEL": "DEBUG"}})
    assert interface.wishes(off, None, [off, off])["extra_env"] == {"VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS": "0"}
    with pytest.raises(PlanError, match=r"VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS differs between nodes \(0, None\)"):
        interface.wishes(off, None, [off, other])


# ---------------------------------------------------------------------------
# 4, 5. Ports: what the plan hands out on each node
# ---------------------------------------------------------------------------


def _nodes(names: list[str], **raw: Any) -> dict[str, dict[str, Any]]:
    return {n: interface.resolve({f"vllm_fleet_{k}": v for k, v in raw.items()}) for n in names}


EIGHT = [{"name": "n1", "gpu": "H100", "gpu_count": 8}]
TWO = [{"name": "n1", "gpu": "H100", "gpu_count": 1}, {"name": "n2", "gpu": "H100", "gpu_count": 1}]


def test_tp8_on_8_gpus_uses_one_port_next_to_the_gateway() -> None:
    plan = _plan("meta-llama/Llama-3.1-70B", EIGHT, tensor_parallel_size=8, port=8075, max_model_len=8192)
    assert [i["port"] for i in plan["instances"]] == [8075]
    interface.check_plan_ports(plan, _nodes(["n1"], port=8075, gateway="true", gpu_count=8))


def test_eight_replicas_collide_with_the_gateway() -> None:
    plan = _plan("Qwen/Qwen3-8B", EIGHT, port=8075, max_model_len=8192)
    with pytest.raises(PlanError) as err:
        interface.check_plan_ports(plan, _nodes(["n1"], port=8075, gpu_count=8))
    assert str(err.value).startswith(
        "vllm_fleet_port: vllm_fleet_port (the API ports of 8 instances) 8075-8082 overlaps "
        "vllm_fleet_gateway_port (nginx) 8080 on n1; fix: set vllm_fleet_port to 8081"
    )


def test_the_routers_ports_count_on_the_gateway_host_with_vllm_router() -> None:
    plan = _plan("Qwen/Qwen3-8B", EIGHT, port=8200, max_model_len=8192)
    interface.check_plan_ports(plan, _nodes(["n1"], port=8200, gpu_count=8))  # nginx alone: no router
    router = {"port": 8200, "gpu_count": 8, "gateway_balancer": "vllm-router"}
    with pytest.raises(PlanError) as err:
        interface.check_plan_ports(plan, _nodes(["n1"], **router))
    assert str(err.value).startswith(
        "vllm_fleet_port: vllm_fleet_port (the API ports of 8 instances) 8200-8207 overlaps "
        "llm_gateway_router_port (vllm-router) 8200 on n1; fix: set vllm_fleet_port to 8201"
    ), err.value
    # Moved by the inventory onto nginx's port: the router's variable is the one to move.
    moved = {"n1": {"llm_gateway_router_port": 8080}}
    blamed = "llm_gateway_router_port: llm_gateway_router_port (vllm-router) 8080 overlaps vllm_fleet_gateway_port"
    with pytest.raises(PlanError, match=re.escape(blamed)):
        interface.check_plan_ports(plan, _nodes(["n1"], gpu_count=8, gateway_balancer="vllm-router"), moved)
    # The defaults leave room: eight API ports from 8000, nginx on 8080, the router on 8200 and 8300.
    plan = _plan("Qwen/Qwen3-8B", EIGHT, max_model_len=8192)
    interface.check_plan_ports(plan, _nodes(["n1"], gpu_count=8, gateway_balancer="vllm-router"))


def test_ray_ports_count_only_where_ray_runs(tmp_path: Path) -> None:
    plan = _plan(_model(tmp_path, TINY), port=6379)
    interface.check_plan_ports(plan, _nodes(["n1"], port=6379))
    with pytest.raises(PlanError, match=re.escape("vllm_fleet_port (the API port of 1 instance) 6379 overlaps Ray's")):
        interface.check_plan_ports(plan, _nodes(["n1"], port=6379, ray="always"))


def test_ray_ports_on_the_members_of_a_ray_instance(tmp_path: Path) -> None:
    plan = _plan(_model(tmp_path, TINY), TWO, pipeline_parallel_size=2, multinode_backend="ray")
    assert plan["instances"][0]["executor"] == "ray"
    settings = _nodes(["n1", "n2"])
    moved = {"ray_cluster_client_server_port": 8000}
    interface.check_plan_ports(plan, settings, {"n2": moved})  # n2 serves no API port
    with pytest.raises(PlanError, match=r"ray_cluster_client_server_port: Ray's client_server_port 8000 overlaps"):
        interface.check_plan_ports(plan, settings, {"n1": moved})
    workers = {"ray_cluster_min_worker_port": 6000, "ray_cluster_max_worker_port": 7000}
    with pytest.raises(PlanError, match=r"Ray's worker port range 6000-7000 overlaps Ray's gcs_port 6379 on n2"):
        interface.check_plan_ports(plan, settings, {"n2": workers})


@pytest.mark.parametrize(
    ("wishes", "raw", "message"),
    [
        pytest.param(
            {"pipeline_parallel_size": 2, "multinode_backend": "native"},
            {"master_port": 8000},
            "vllm_fleet_master_port: vllm_fleet_master_port (and + 1, the group wrapper) 8000-8001 overlaps "
            "vllm_fleet_port (the API port of 1 instance) 8000 on n1",
            id="native-master-port",
        ),
        pytest.param(
            {"data_parallel_size": 2},
            {"dp_rpc_port": 8000},
            "vllm_fleet_dp_rpc_port: vllm_fleet_dp_rpc_port 8000 overlaps vllm_fleet_port (the API port of 1 instance)",
            id="dp-rpc-port",
        ),
        pytest.param(
            {"data_parallel_size": 2},
            {"master_port": 7999},
            "vllm_fleet_master_port: vllm_fleet_master_port + 1 (the group wrapper) 8000 overlaps vllm_fleet_port",
            id="dp-group-wrapper",
        ),
    ],
)
def test_multi_node_ports_on_the_head(
    tmp_path: Path, wishes: dict[str, Any], raw: dict[str, Any], message: str
) -> None:
    model = _model(tmp_path, TINY)
    plan = _plan(model, TWO, **wishes)
    with pytest.raises(PlanError, match=re.escape(message)):
        interface.check_plan_ports(plan, _nodes(["n1", "n2"], **raw))
    # The same values on single-node instances collide with nothing.
    interface.check_plan_ports(_plan(model, TWO), _nodes(["n1", "n2"], **raw))


# ---------------------------------------------------------------------------
# 8. Field names: the CLI's flags, the inventory's variables
# ---------------------------------------------------------------------------


def test_each_edge_names_its_own_fields() -> None:
    err = PlanError("--max-model-len", "4096 is above", "use --max-model-len 2048 or less, or set X=1 with --env")
    assert str(for_inventory(err)) == (
        "vllm_fleet_max_model_len: 4096 is above; fix: use vllm_fleet_max_model_len 2048 or less, "
        "or set X=1 with vllm_fleet_extra_env"
    )
    assert str(for_cli(PlanError("max_model_len", "x", "y"))) == "--max-model-len: x; fix: y"
    assert str(for_cli(PlanError("vllm_fleet_multinode_backend", "x"))) == "--multinode-backend: x"
    opt_in = PlanError("--quantization", "deprecated", "add --allow-deprecated-quantization")
    assert "add '--allow-deprecated-quantization' in vllm_fleet_extra_args" in str(for_inventory(opt_in))


def test_the_cli_names_flags_for_inventory_names(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = tmp_path / "c.yml"
    cluster.write_text("nodes:\n- {name: a, gpu: H100, gpu_count: 1}\n- {name: b, gpu: H100, gpu_count: 1}\n")
    assert main(["plan", "--model", _model(tmp_path, TINY), "--cluster", str(cluster), "-dp", "3"]) == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith("vllm-fleet plan: error: --data-parallel-size: DP=3 cannot run"), line


def _plugin() -> Any:
    pytest.importorskip("ansible")
    return filter_plugins()


def test_the_filters_name_inventory_variables() -> None:
    from ansible.errors import AnsibleFilterError

    filters = _plugin()
    with pytest.raises(AnsibleFilterError) as err:
        filters["vllm_fleet_plan"](
            [{"name": "x", "gpu": "H100", "gpu_count": 1}], "Qwen/Qwen3-8B", {"max_model_len": 10**6}
        )
    text = str(err.value)
    assert "vllm_fleet_max_model_len: 1000000 is above the model's derived maximum" in text
    assert "--max-model-len" not in text and "--env" not in text
    plan = filters["vllm_fleet_plan"]([{"name": "x", "gpu": "H100", "gpu_count": 1}], "Qwen/Qwen3-8B", {"port": 8080})
    settings = {"nodes": _nodes(["x"], gateway="true"), "role_vars": {}}
    with pytest.raises(AnsibleFilterError, match=r"vllm_fleet_check_ports: vllm_fleet_port: .* 8080 overlaps"):
        filters["vllm_fleet_check_ports"](plan, settings)
