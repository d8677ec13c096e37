"""The performance model against public vLLM benchmark results (make bench-perf).

For every entry of ``tests/datasets/vllm_perf_public.yaml`` (collected from vLLM issues, vendor
and project benchmark repositories, each with its URL) the planner estimates the instance's
memory as usual and predicts what it serves under the entry's workload; the bench prints per
entry and as median / p90 the relative error of output throughput, TPOT (or median ITL, where
that is what was published) and TTFT, then, for every group of layouts measured on the same
hardware, model and workload, whether the planner's choice is the measured winner (within 5 %)
under each SLO the group's own latencies define.

A group's layouts are compared per GPU (a cluster of the group's largest GPU count runs
replicas of each layout), and an SLO is a bound on the published per-token latency: one case
without a bound and one at each layout's measured latency (+5 %).

    python tests/bench/perf_accuracy.py [--dataset FILE] [--json] [--verbose]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from vllm_fleet.accounting.base import known_release  # noqa: E402
from vllm_fleet.accounting.memory import estimate  # noqa: E402
from vllm_fleet.accounting.settings import Device, Settings  # noqa: E402
from vllm_fleet.model.catalog import lookup_gpu, lookup_model  # noqa: E402
from vllm_fleet.model.spec import ModelSpec, load_model, spec_from_config  # noqa: E402
from vllm_fleet.performance.predict import Placement, predict  # noqa: E402
from vllm_fleet.performance.serving import Prediction  # noqa: E402
from vllm_fleet.performance.workload import Workload  # noqa: E402

DATASET = ROOT / "tests" / "datasets" / "vllm_perf_public.yaml"
# vLLM's ShareGPT sample (benchmark_serving --dataset-name sharegpt): about 220 prompt and 195
# output tokens per request on Llama 3's tokenizer (the means vllm bench prints for 1,000 prompts).
SHAREGPT = (220, 195)

_MISTRAL = {"model_type": "mistral", "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16", "tie_word_embeddings": False}
# Models the catalog lacks, as their config.json states them (the values the planner reads).
CONFIGS: dict[str, dict[str, Any]] = {
    "mistralai/Mistral-7B-Instruct-v0.3": {**_MISTRAL, "architectures": ["MistralForCausalLM"], "hidden_size": 4096,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
        "vocab_size": 32768, "max_position_embeddings": 32768},
    "mistralai/Mistral-Nemo-Instruct-2407": {**_MISTRAL, "architectures": ["MistralForCausalLM"], "hidden_size": 5120,
        "num_hidden_layers": 40, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
        "intermediate_size": 14336, "vocab_size": 131072, "max_position_embeddings": 1024000},
    "mistralai/Mistral-Large-Instruct-2407": {**_MISTRAL, "architectures": ["MistralForCausalLM"],
        "hidden_size": 12288, "num_hidden_layers": 88, "num_attention_heads": 96, "num_key_value_heads": 8,
        "intermediate_size": 28672, "vocab_size": 32768, "max_position_embeddings": 131072},
}  # fmt: skip
# Dataset names the catalog holds under another name: (catalog model, --quantization).
ALIASES: dict[str, tuple[str, str | None]] = {
    "neuralmagic/Meta-Llama-3.1-8B-FP8": ("meta-llama/Llama-3.1-8B", "fp8"),
    "neuralmagic/Meta-Llama-3.1-70B-Instruct-FP8": ("meta-llama/Llama-3.1-70B", "fp8"),
    "NousResearch/Hermes-3-Llama-3.1-405B-FP8": ("meta-llama/Llama-3.1-405B", "fp8"),
    "mistralai/Mixtral-8x7B-Instruct-v0.1": ("mistralai/Mixtral-8x7B-v0.1", None),
    "mistralai/Mixtral-8x22B-Instruct-v0.1": ("mistralai/Mixtral-8x22B-v0.1", None),
    "Qwen/QwQ-32B": ("Qwen/Qwen2.5-32B", None),
    "Qwen/Qwen3-235B-A22B-Instruct-2507-FP8": ("Qwen/Qwen3-235B-A22B", "fp8"),
    "Qwen/Qwen3-235B-A22B-Instruct-2507": ("Qwen/Qwen3-235B-A22B", None),
    "deepseek-ai/DeepSeek-R1": ("deepseek-ai/DeepSeek-R1", None),
}
FIGURES = ("output_token_throughput", "tpot_ms", "ttft_ms")


def _spec(name: str) -> tuple[ModelSpec, str | None]:
    if name in CONFIGS:
        return spec_from_config(dict(CONFIGS[name]), name), None
    target, quant = ALIASES.get(name, (name, None))
    if lookup_model(target) is None:
        raise LookupError(f"{name}: not in the catalog and no config here")
    return load_model(target), quant


def _version(entry: dict[str, Any]) -> str:
    raw = str(entry.get("vllm_version") or "0.11.0").split()[0].split("+")[0].replace(".dev", ".")
    parts = [p for p in raw.split(".") if p.isdigit()][:3]
    version = ".".join(parts + ["0"] * (3 - len(parts)))
    return version if not known_release(version) else "0.11.0"


def _workload(entry: dict[str, Any]) -> Workload:
    w = entry["workload"]
    inp, out = w.get("input_len"), w.get("output_len")
    chat = inp is None or out is None or w.get("dataset") == "sharegpt"
    if inp is None or out is None:
        inp, out = SHAREGPT
    n = int(w.get("num_prompts") or 1000)
    rate = w.get("request_rate")
    conc = w.get("concurrency")
    if w["kind"] == "concurrency" and conc:
        return Workload(int(inp), int(out), n, concurrency=int(conc), chat_lengths=chat)
    if w["kind"] == "rate" and rate not in (None, "inf", float("inf")):
        return Workload(int(inp), int(out), n, request_rate=float(rate), chat_lengths=chat)
    return Workload(int(inp), int(out), n, chat_lengths=chat)


def run_entry(entry: dict[str, Any]) -> tuple[Prediction, dict[str, float | None]]:
    """The prediction for one entry and the measured figures it is compared with."""
    spec, quant = _spec(entry["model"])
    quant = entry.get("quantization") if entry.get("quantization") not in ("w4a16", "awq", "mxfp4") else quant
    if entry.get("quantization") in ("w4a16", "awq") and spec.quant is None:
        raise LookupError(f"a 4-bit checkpoint of {entry['model']} the bench has no config of")
    gpu = lookup_gpu(entry["gpu"])
    if gpu is None:
        raise LookupError(f"GPU {entry['gpu']} not in the catalog")
    device = Device(gpu.name, gpu.memory_gib, gpu.device, gpu.capability // 10, None, gpu.capability,
                    gpu.unified_memory, gpu.p2p or gpu.nvlink)  # fmt: skip
    settings = Settings(
        tensor_parallel_size=int(entry["tensor_parallel_size"]),
        pipeline_parallel_size=int(entry["pipeline_parallel_size"]),
        data_parallel_size=int(entry.get("data_parallel_size") or 1),
        enable_expert_parallel=bool(entry.get("expert_parallel")),
        quantization=quant if quant != "mxfp4" else None,
        max_model_len=min(spec.max_position_embeddings or 8192, 8192) if spec.max_position_embeddings else 8192,
        max_num_seqs=entry.get("max_num_seqs"),
        max_num_batched_tokens=entry.get("max_num_batched_tokens"),
        vllm_version=_version(entry),
        gpu_memory_utilization=0.9,
    )
    est = estimate(spec, device, settings, nvlink=gpu.nvlink)
    if not est.fits:  # the benchmark ran, so its operator gave vLLM more of the GPU
        est = estimate(spec, device, replace(settings, gpu_memory_utilization=0.95), nvlink=gpu.nvlink)
    if not est.fits:
        raise ValueError(f"does not fit as planned: {est.reason}")
    workload = _workload(entry)
    if entry["workload"]["kind"] == "offline" and entry["measured"].get("latency_s"):
        workload = replace(workload, num_prompts=int(entry["workload"].get("num_prompts") or 1))
    pred = predict(spec, est, device, workload, Placement(nvlink=gpu.nvlink))
    m = entry["measured"]
    tpot = m["tpot_ms"].get("median") or m["tpot_ms"].get("mean")
    latency_kind = "tpot"
    if tpot is None and m["itl_ms"].get("median"):
        tpot, latency_kind = m["itl_ms"]["median"], "itl"
    if tpot is None and m.get("latency_s"):
        tpot = m["latency_s"] * 1000 / max(workload.output_len, 1)
    measured = {
        "output_token_throughput": m.get("output_token_throughput"),
        "tpot_ms": tpot,
        "ttft_ms": m["ttft_ms"].get("median") or m["ttft_ms"].get("mean"),
        "latency_kind": latency_kind,
    }
    return pred, measured


def _predicted(pred: Prediction, key: str, latency_kind: str) -> float:
    if key == "output_token_throughput":
        return pred.output_token_throughput
    if key == "tpot_ms":
        return pred.itl_ms.median if latency_kind == "itl" else pred.tpot_ms.median
    return pred.ttft_ms.median


def _stats(values: list[float]) -> tuple[float, float]:
    if not values:
        return float("nan"), float("nan")
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return statistics.median(ordered), p90


def choice_cases(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For every group and SLO: the measured winner, the planner's choice, and whether they agree."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        if row["group"] and row["measured"]["output_token_throughput"] and row["measured"]["tpot_ms"]:
            groups.setdefault(row["group"], []).append(row)
    cases = []
    for name, members in sorted(groups.items()):
        if len(members) < 2:
            continue
        gpus = max(r["gpus"] for r in members)

        def per_gpu(r: dict[str, Any], which: str, gpus: int = gpus) -> float:
            return float(r[which]["output_token_throughput"]) * gpus / r["gpus"]

        bounds: list[float | None] = [None, *sorted({float(r["measured"]["tpot_ms"]) * 1.05 for r in members})]
        for bound in bounds:
            meets = [r for r in members if bound is None or r["measured"]["tpot_ms"] <= bound]
            if not meets:
                continue
            winner = max(meets, key=lambda r: per_gpu(r, "measured"))
            able = [r for r in members if bound is None or r["predicted"]["tpot_ms"] <= bound]
            chosen = max(able or members, key=lambda r: per_gpu(r, "predicted"))
            ok = chosen in meets and per_gpu(chosen, "measured") >= 0.95 * per_gpu(winner, "measured")
            cases.append({"group": name, "slo_ms": bound, "winner": winner["id"], "chosen": chosen["id"], "ok": ok})
    return cases


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", type=Path, default=DATASET)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--verbose", action="store_true", help="one line per entry")
    args = ap.parse_args(argv)
    entries = yaml.safe_load(args.dataset.read_text())["entries"]
    rows, skipped = [], []
    for entry in entries:
        try:
            pred, measured = run_entry(entry)
        except (LookupError, ValueError) as exc:
            skipped.append(f"{entry['id']}: {exc}")
            continue
        kind = str(measured.pop("latency_kind"))
        predicted = {k: _predicted(pred, k, kind) for k in FIGURES}
        ratio = {
            k: float(measured[k]) / predicted[k] if measured[k] and predicted[k] else None  # type: ignore[arg-type]
            for k in FIGURES
        }
        gpus = entry["tensor_parallel_size"] * entry["pipeline_parallel_size"] * (entry.get("data_parallel_size") or 1)
        v1 = tuple(int(p) for p in _version(entry).split(".")[:2]) >= (0, 8) if entry.get("vllm_version") else True
        rows.append({"id": entry["id"], "group": entry.get("group"), "gpus": gpus, "measured": measured, "v1": v1,
                     "predicted": predicted, "ratio": ratio, "bound": pred.bound, "batch": pred.batch})  # fmt: skip
    summary = {}
    for key in FIGURES:
        ratios = [r["ratio"][key] for r in rows if r["ratio"][key]]
        current = sorted(r["ratio"][key] for r in rows if r["ratio"][key] and r["v1"])
        errors = [abs(x - 1) for x in ratios]
        med, p90 = _stats(errors)
        ordered = sorted(ratios)
        band = (
            (ordered[int(0.1 * len(ordered))], ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))])
            if ordered
            else (0, 0)
        )
        summary[key] = {"n": len(errors), "median_error": med, "p90_error": p90, "ratio_p10_p90": band,
                        "v1_n": len(current), "v1_ratio_p10_p90": (
                            current[int(0.1 * len(current))], current[min(len(current) - 1, int(0.9 * len(current)))]
                        ) if current else (0, 0)}  # fmt: skip
    cases = choice_cases(rows)
    agree = sum(1 for c in cases if c["ok"])
    if args.json:
        print(json.dumps({"summary": summary, "cases": cases, "rows": rows, "skipped": skipped}, indent=2))
        return 0
    if args.verbose:
        print(f"{'entry':58} {'tok/s meas/pred':>20} {'tpot meas/pred':>18} {'ttft meas/pred':>20}  bound")
        for r in rows:
            m, p = r["measured"], r["predicted"]

            def pair(k: str, m: dict[str, Any] = m, p: dict[str, Any] = p) -> str:
                return f"{m[k] or 0:,.0f}/{p[k]:,.0f}" if k != "tpot_ms" else f"{m[k] or 0:.1f}/{p[k]:.1f}"

            print(f"{r['id'][:58]:58} {pair('output_token_throughput'):>20} {pair('tpot_ms'):>18} "
                  f"{pair('ttft_ms'):>20}  {r['bound']} B={r['batch']:.0f}")  # fmt: skip
    print(f"\n{len(rows)} entries compared, {len(skipped)} skipped")
    for line in skipped:
        print(f"  skipped {line}")
    print(f"\n{'figure':26} {'n':>4} {'median err':>11} {'p90 err':>9} {'meas/pred p10-p90':>19} {'V1 engine (n)':>18}")
    for key, s in summary.items():
        lo, hi = s["ratio_p10_p90"]
        vlo, vhi = s["v1_ratio_p10_p90"]
        print(f"{key:26} {s['n']:>4} {s['median_error']:>10.1%} {s['p90_error']:>8.1%} {lo:>9.2f}-{hi:.2f} "
              f"{vlo:>9.2f}-{vhi:.2f} ({s['v1_n']})")  # fmt: skip
    print(f"\nlayout choice: {agree}/{len(cases)} (group, SLO) cases choose the measured winner within 5 %"
          + (f" ({agree / len(cases):.0%})" if cases else ""))  # fmt: skip
    for c in cases:
        if not c["ok"] or args.verbose:
            slo = "none" if c["slo_ms"] is None else f"<= {c['slo_ms']:.1f} ms"
            mark = "ok  " if c["ok"] else "MISS"
            print(f"  {mark} {c['group']} (SLO {slo}): winner {c['winner']}, chosen {c['chosen']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
