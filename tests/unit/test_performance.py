"""The performance model (issue 45): step costs against hand-worked FLOP and byte counts, the
queueing model against its closed forms, the simulator against a run worked by hand, the layout
chosen by predicted goodput (the issue's two examples), the SLO moving the winner, and the JSON
contract of estimate and plan."""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path

import pytest

from tests.conftest import ROOT
from vllm_fleet.accounting.memory import estimate
from vllm_fleet.accounting.settings import Device, Settings
from vllm_fleet.cli import main
from vllm_fleet.errors import PlanError
from vllm_fleet.model.catalog import lookup_gpu
from vllm_fleet.model.spec import load_model
from vllm_fleet.ops.calibrate import calibration
from vllm_fleet.performance import constants as C
from vllm_fleet.performance.costs import model_shape
from vllm_fleet.performance.predict import server_for
from vllm_fleet.performance.simulate import quantiles, simulate
from vllm_fleet.performance.workload import Workload, slo_from, workload_from
from vllm_fleet.planning.cluster import cluster_from_data
from vllm_fleet.planning.strategy import Wishes, plan_cluster

GIB = 1 << 30
ONE_NODE = {"nodes": [{"name": "n1", "gpu": "H100-SXM", "gpu_count": 8}]}


def _h100() -> Device:
    gpu = lookup_gpu("H100-SXM")
    assert gpu is not None
    return Device(gpu.name, gpu.memory_gib, "cuda", 9, None, 90)


def _server(model: str, tp: int = 1, **settings: object) -> object:
    spec = load_model(model)
    est = estimate(spec, _h100(), Settings(tensor_parallel_size=tp, **settings))  # type: ignore[arg-type]
    return spec, est, server_for(spec, est, _h100())


# -- step costs against hand-worked counts ----------------------------------------------------


def test_llama_8b_parameter_counts_are_config_arithmetic() -> None:
    shape = model_shape(load_model("meta-llama/Llama-3.1-8B"))
    # q, k, v, o: 4096 x 128 x (32 + 2 x 8) + 32 x 128 x 4096; the MLP: 3 x 4096 x 14336.
    assert shape.attn == 4096 * 128 * 48 + 32 * 128 * 4096 == 41_943_040
    assert shape.dense_mlp == 3 * 4096 * 14336
    total = (shape.attn + shape.dense_mlp) * 32 + shape.head + shape.embed
    assert abs(total - 8.03e9) / 8.03e9 < 0.001  # the card's 8.03 billion


def test_a_lone_decode_step_reads_the_weights_and_its_kv_at_the_stated_bandwidth() -> None:
    _, est, server = _server("meta-llama/Llama-3.1-8B", max_model_len=8192)
    model = server.model  # type: ignore[attr-defined]
    cost = model.step(1, 0.0, 1000)
    hbm = 3350e9
    embed = 128256 * 4096 * model.bpp  # read by row, not streamed
    weights = est.weights_gib * GIB - embed
    kv = 1000 * est.kv_bytes_per_token
    expected = weights / (hbm * C.HBM_EFFICIENCY) + kv / (hbm * C.KV_READ_EFFICIENCY)
    assert cost.memory == pytest.approx(expected, rel=0.01)
    # 2 FLOPs per active parameter and token, padded to the GEMM tile's 64 rows; memory wins.
    assert cost.bound == "memory" and cost.comm == 0.0
    fixed, per_seq = C.engine_overhead(est.vllm_version)
    assert cost.total == pytest.approx(cost.memory + fixed + per_seq, rel=0.01)


def test_tp_all_reduces_cost_twice_per_layer_ring_bytes_over_nvlink() -> None:
    _, _, server = _server("meta-llama/Llama-3.1-70B", tp=4, max_model_len=8192)
    model = server.model  # type: ignore[attr-defined]
    tokens = 512
    size = tokens * 8192 * 2
    one = C.ALLREDUCE_LATENCY_S["nvlink"] + 2 * 3 / 4 * size / (450e9 * C.LINK_EFFICIENCY["nvlink"])
    assert model.step(tokens, 0.0, 100).comm == pytest.approx(2 * 80 * one, rel=1e-6)


def test_prefill_is_compute_bound_and_grows_with_the_prompt() -> None:
    _, _, server = _server("meta-llama/Llama-3.1-8B", max_model_len=8192)
    model = server.model  # type: ignore[attr-defined]
    short, long = model.step(0, 2048, 0), model.step(0, 8192, 0)
    assert short.bound == long.bound == "compute"
    # Linear parts x4, causal attention x16 (tokens x (prefix + tokens / 2)): more than x4 in all.
    assert long.compute > 4 * short.compute


def test_moe_decode_reads_only_the_experts_its_tokens_route_to() -> None:
    _, _, server = _server("Qwen/Qwen3-30B-A3B", max_model_len=8192)
    model = server.model  # type: ignore[attr-defined]
    experts, k = 128, 8
    assert model.experts_touched(1) == pytest.approx(k)
    assert model.experts_touched(4) == pytest.approx(experts * (1 - (1 - k / experts) ** 4))
    assert model.experts_touched(10_000) == pytest.approx(experts)


# -- the queueing model against its closed forms --------------------------------------------


def test_the_prefill_queue_is_m_d_1() -> None:
    _, _, server = _server("meta-llama/Llama-3.1-8B", max_model_len=8192)
    w = Workload(1024, 256)
    spread = server._ttft_spread(0.1, 0.05, 0.5, w)  # type: ignore[attr-defined]
    assert spread.mean == pytest.approx(0.15)
    # P(wait > 0) = rho, then exponential with mean wait / rho: the p90 of the tail.
    assert spread.p90 == pytest.approx(0.1 + (0.05 / 0.5) * math.log(0.5 / 0.1))
    assert spread.median == pytest.approx(0.1)  # below 1 - rho nobody waits


def test_the_steady_batch_is_littles_law() -> None:
    _, _, server = _server("meta-llama/Llama-3.1-8B", max_model_len=8192)
    w = Workload(1024, 256)
    rate = 4.0
    cap, _ = server.max_batch(w)  # type: ignore[attr-defined]
    st, x, _ = server._open(rate, cap, server.saturation(w), w)  # type: ignore[attr-defined]
    assert x == rate
    assert st.batch == pytest.approx(rate * 255 * st.mean_step, rel=1e-3)


def test_past_saturation_the_rate_served_is_saturation() -> None:
    _, _, server = _server("meta-llama/Llama-3.1-8B", max_model_len=8192)
    w = Workload(1024, 256)
    top = server.saturation(w)  # type: ignore[attr-defined]
    _, _, served = server.steady(w, top * 3)  # type: ignore[attr-defined]
    assert served == pytest.approx(top, rel=1e-6)


def test_a_run_simulated_is_the_run_worked_by_hand() -> None:
    """Four requests at once, prompts fitting one step together: one prefill step, then every
    request decodes together to the end; nothing waits."""
    _, _, server = _server("meta-llama/Llama-3.1-8B", max_model_len=8192)
    model = server.model  # type: ignore[attr-defined]
    w = Workload(512, 64, 4)
    run = simulate(model, w, 4, kv_tokens=10**6, max_seqs=256, budget=8192)
    first = model.step(0, 2048, 0, 0).total
    decode = model.step(4, 0, 512 + 1, 0).total  # the context grows; the first step's is worked here
    assert run.ttft[0] == pytest.approx(first + model.request_overhead)
    assert run.duration == pytest.approx(first + 63 * decode, rel=0.02)
    assert run.output_tokens == 4 * 64
    assert quantiles([1.0, 2.0, 3.0, 4.0]) == (2.5, 2.0, 4.0, 4.0)


def test_a_full_cache_preempts_and_recomputes_but_every_request_ends() -> None:
    _, _, server = _server("meta-llama/Llama-3.1-8B", max_model_len=8192)
    model = server.model  # type: ignore[attr-defined]
    w = Workload(100, 100, 4)
    roomy = simulate(model, w, 4, kv_tokens=10**6, max_seqs=256, budget=8192)
    tight = simulate(model, w, 4, kv_tokens=300, max_seqs=256, budget=8192)
    assert roomy.preemptions == 0 and tight.preemptions > 0
    assert tight.output_tokens == roomy.output_tokens == 400
    assert tight.duration > roomy.duration  # the recomputed prompts and the smaller batch cost time


# -- the layout chosen for what it serves ----------------------------------------------------


def _plan(model: str, **wishes: object) -> dict[str, object]:
    return plan_cluster(load_model(model), cluster_from_data(ONE_NODE), Wishes(**wishes))  # type: ignore[arg-type]


def _layout(entry: dict[str, object]) -> tuple[object, object]:
    return entry["tensor_parallel_size"], entry["pipeline_parallel_size"]


@pytest.mark.parametrize(
    ("model", "before"),
    [("meta-llama/Llama-3.1-70B", (2, 1)), ("Qwen/Qwen3-32B", (1, 1))],
)
def test_the_issues_examples_keep_the_length_and_serve_more(model: str, before: tuple[int, int]) -> None:
    """One node of 8 x H100: the layout chosen before (TP=2 x4 with the length lowered to 24,576;
    TP=1 x8) is rejected for the length it lowers, and the one chosen predicts more."""
    plan = _plan(model)
    inst = plan["instances"][0]  # type: ignore[index]
    assert inst["max_model_len"] == load_model(model).max_position_embeddings  # type: ignore[index]
    old = next(r for r in plan["rejected"] if _layout(r) == before and "performance" in r)  # type: ignore[attr-defined]
    assert "max_model_len lowered" in old["reason"] or "needs max_model_len lowered" in old["reason"]
    chosen = plan["performance"]  # type: ignore[index]
    assert chosen["output_token_throughput"] > old["performance"]["output_token_throughput"]
    assert chosen["goodput"] > old["performance"]["goodput"]


def test_the_winner_moves_with_the_allowed_time_per_token() -> None:
    """Public measurements move the winner from TP=8 towards smaller TP replicas as TPOT grows."""
    tps = [_plan("Qwen/Qwen3-32B", slo={"tpot_p90_ms": t})["instances"][0]["tensor_parallel_size"]  # type: ignore[index]
           for t in (15, 40, 60)]  # fmt: skip
    assert tps[0] == 8 and tps == sorted(tps, reverse=True) and tps[-1] < 8


def test_target_concurrency_stays_a_hard_constraint() -> None:
    """TP=4 x2 predicts the most but holds 43 requests at full length; TP=8 holds 49."""
    assert _layout(_plan("Qwen/Qwen3-32B")["instances"][0]) == (4, 1)  # type: ignore[index]
    plan = _plan("Qwen/Qwen3-32B", target_concurrency=45)
    conc = sum(i["memory"]["max_concurrency"] for i in plan["instances"])  # type: ignore[union-attr]
    assert conc >= 45 and _layout(plan["instances"][0]) == (8, 1)  # type: ignore[index]


def test_an_slo_no_layout_meets_ranks_by_throughput_and_says_so() -> None:
    plan = _plan("meta-llama/Llama-3.1-70B", slo={"tpot_p90_ms": 1})
    assert plan["performance"]["ranked_by"].startswith("throughput")  # type: ignore[index]
    assert any("no layout meets TPOT p90 <= 1 ms" in w for w in plan["warnings"])  # type: ignore[attr-defined]


def test_every_fitting_rejected_layout_carries_its_cluster_prediction() -> None:
    plan = _plan("meta-llama/Llama-3.1-70B")
    fitting = [r for r in plan["rejected"] if r["reason"].startswith("fits")]  # type: ignore[attr-defined]
    assert fitting and all(set(r["performance"]) == {"goodput", "request_throughput", "output_token_throughput"}
                           for r in fitting)  # fmt: skip


def test_a_calibration_slows_the_prediction_by_its_factor() -> None:
    base = _plan("meta-llama/Llama-3.1-8B", max_model_len=8192)
    slow = _plan("meta-llama/Llama-3.1-8B", max_model_len=8192, calibration={"step_time": 2.0})
    ratio = slow["performance"]["output_token_throughput"] / base["performance"]["output_token_throughput"]  # type: ignore[index]
    assert 0.3 < ratio < 0.75


def test_calibrate_reads_verify_rows() -> None:
    row = {
        "endpoint": "gw:8080",
        "load": {
            "failed": 0,
            "calibration": {"step_time": 1.0, "ttft": 1.0},
            "output_token_throughput": {"ratio": 0.5},
            "tpot_ms": {"ratio": 2.0},
            "ttft_ms": {"ratio": 4.0},
        },
    }
    assert calibration([row]) == {"step_time": 2.0, "ttft": 2.0, "from": ["gw:8080"]}
    with pytest.raises(PlanError, match="no endpoint whose load was measured"):
        calibration([{"endpoint": "x", "load": None}])


# -- inputs ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"input_len": 0}, "vllm_fleet_workload.input_len"),
        ({"output_len": 1.5}, "vllm_fleet_workload.output_len"),
        ({"concurrency": 4, "request_rate": 2}, "vllm_fleet_workload"),
        ({"prompt": 3}, "vllm_fleet_workload.prompt"),
        ({"prefix_hit": 2}, "vllm_fleet_workload.prefix_hit"),
        ("1024", "vllm_fleet_workload"),
    ],
)
def test_a_bad_workload_names_its_field(raw: object, field: str) -> None:
    with pytest.raises(PlanError) as err:
        workload_from(raw)
    assert err.value.field == field


def test_a_bad_slo_names_its_field() -> None:
    with pytest.raises(PlanError) as err:
        slo_from({"tpot_p90_ms": -1})
    assert err.value.field == "vllm_fleet_slo.tpot_p90_ms"


def test_a_bad_load_flag_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", "--gpu", "H100-SXM", "--model", "Qwen/Qwen3-8B", "--request-rate", "fast"]) == 2
    assert "--request-rate" in capsys.readouterr().err


# -- the JSON contract (read by checks outside the repository) ---------------------------------

SPREAD = {"mean", "median", "p90", "p99"}


def _check_performance(perf: dict[str, object]) -> None:
    assert set(perf["workload"]) == {"input_len", "output_len", "num_prompts", "concurrency", "request_rate"}  # type: ignore[arg-type]
    for key in ("request_throughput", "output_token_throughput", "total_token_throughput", "batch"):
        assert isinstance(perf[key], float | int) and perf[key] >= 0  # type: ignore[operator]
    for key in ("ttft_ms", "tpot_ms", "itl_ms"):
        assert set(perf[key]) == SPREAD  # type: ignore[arg-type]
    assert perf["bound"] in ("kv_cache", "max_num_seqs", "max_num_batched_tokens", "clients", "arrivals")
    assert "band" in perf


@pytest.mark.parametrize("load", [[], ["--concurrency", "16"], ["--request-rate", "2.5"]])
def test_estimate_json_performance(load: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["estimate", "--gpu", "H100-SXM", "--model", "Qwen/Qwen3-8B", "--input-len", "512", "--output-len", "128"]
    assert main([*argv, "--num-prompts", "200", *load, "--json"]) == 0
    perf = json.loads(capsys.readouterr().out)["performance"]
    _check_performance(perf)
    assert perf["workload"]["input_len"] == 512 and perf["workload"]["num_prompts"] == 200
    assert perf["output_token_throughput"] == pytest.approx(perf["request_throughput"] * 128, rel=0.05)


def test_plan_json_performance(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = tmp_path / "c.yml"
    cluster.write_text(json.dumps(ONE_NODE))
    argv = ["plan", "--cluster", str(cluster), "--model", "meta-llama/Llama-3.1-70B", "--slo-tpot-ms", "40",
            "--slo-ttft-ms", "3000", "--concurrency", "64", "--json"]  # fmt: skip
    assert main(argv) == 0
    plan = json.loads(capsys.readouterr().out)
    for inst in plan["instances"]:
        _check_performance(inst["performance"])
    assert set(plan["performance"]) >= {"output_token_throughput", "request_throughput", "goodput"}
    assert plan["performance"]["slo"] == {"ttft_p90_ms": 3000.0, "tpot_p90_ms": 40.0}


def test_the_performance_package_sits_between_accounting_and_planning() -> None:
    for path in (ROOT / "vllm_fleet/performance").glob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ImportFrom) and node.module:
                assert not node.module.startswith(("vllm_fleet.planning", "vllm_fleet.deploy", "vllm_fleet.ops")), (
                    f"{path.name} imports {node.module}"
                )
