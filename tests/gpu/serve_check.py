#!/usr/bin/env python3
"""vLLM on a real GPU against the plan, for a machine with an NVIDIA GPU.

With vLLM installed (VLLM_PYTHON, default python3): for each config below, runs
site.yml's plan and serve phases on this machine through the vllm_server role
(systemd runtime with the vLLM already installed, --load-format dummy, no
weights, no tokenizer) and prints predicted vs reported KV tokens; then tears
down. With only PyTorch: measures what it can of the memory model on the GPU
(CUDA context + non-torch memory at start-up; the weights of each config built
on the device with transformers, if present) against the planner.

    python3 tests/gpu/serve_check.py OUT_DIR
Writes OUT_DIR/serve_check.json and prints one line per config.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from vllm_fleet.accounting.activation import _capture_sizes  # noqa: E402
from vllm_fleet.accounting.base import CUDA_CONTEXT_GIB, CUDA_GRAPH_MIB_PER_GRAPH_LAYER  # noqa: E402
from vllm_fleet.accounting.memory import estimate  # noqa: E402
from vllm_fleet.accounting.settings import Device, Settings  # noqa: E402
from vllm_fleet.model.spec import load_model  # noqa: E402

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "rms_norm_eps": 1e-5,
         "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
         "max_position_embeddings": 131072}  # fmt: skip
CONFIGS: dict[str, dict[str, Any]] = {
    "llama-1b-like": {**LLAMA, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
                      "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 128256,
                      "tie_word_embeddings": True},
    "llama-3.1-8b-like": {**LLAMA, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                          "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256},
}  # fmt: skip
RUNS = [("llama-1b-like", []), ("llama-3.1-8b-like", []), ("llama-3.1-8b-like", ["--enforce-eager"])]
MAX_LEN = 8192


def sh(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False, **kw)


def gpu() -> tuple[str, float] | None:
    out = sh(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"])
    if out.returncode != 0 or not out.stdout.strip():
        return None
    name, mib = out.stdout.splitlines()[0].rsplit(",", 1)
    return name.strip(), float(mib) / 1024


def write_model(base: Path, name: str) -> Path:
    folder = base / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(CONFIGS[name]))
    return folder


def with_vllm(python: str, out: Path, gpu_name: str, total_gib: float) -> list[dict[str, Any]]:
    prefix = sh([python, "-c", "import sys; print(sys.prefix)"]).stdout.strip()
    results = []
    for name, extra in RUNS:
        work = Path(tempfile.mkdtemp(prefix="vf-gpu-"))
        model = write_model(work, name)
        inventory = work / "hosts.yml"
        inventory.write_text(json.dumps({"all": {
            "hosts": {"localhost": {"ansible_connection": "local"}},
            "children": {"vllm_nodes": {"hosts": {"localhost": {
                "ansible_connection": "local", "vllm_fleet_gpu": gpu_name, "vllm_fleet_gpu_count": 1,
                "vllm_fleet_gpu_memory_gib": round(total_gib, 2), "vllm_fleet_address": "127.0.0.1"}}}},
            "vars": {"vllm_fleet_model": str(model), "vllm_fleet_max_model_len": MAX_LEN,
                     "vllm_fleet_enforce_eager": "--enforce-eager" in extra,
                     "vllm_fleet_runtime": "systemd", "vllm_fleet_prepare_model": False, "vllm_fleet_gateway": False,
                     "vllm_server_venv": prefix, "vllm_fleet_vllm_package": "", "vllm_server_wait_timeout": 900,
                     "vllm_fleet_extra_args": ["--load-format", "dummy", "--skip-tokenizer-init"]}}}))  # fmt: skip
        env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
        run = sh(["ansible-playbook", "site.yml", "-i", str(inventory), "--tags", "plan,serve",
                  "-e", f"vllm_fleet_artifacts_dir={work}"], cwd=ROOT, env=env)  # fmt: skip
        (out / f"serve-{name}{'-eager' if extra else ''}.log").write_text(run.stdout + run.stderr)
        found = re.search(r"vLLM reports ([\d,]+|no) KV tokens,\s+the plan predicted ([\d,]+)", run.stdout)
        row: dict[str, Any] = {"config": name, "flags": extra, "rc": run.returncode}
        if found:
            reported = None if found.group(1) == "no" else int(found.group(1).replace(",", ""))
            predicted = int(found.group(2).replace(",", ""))
            row.update(predicted=predicted, reported=reported, ratio=reported / predicted if reported else None)
        results.append(row)
        ratio = f"{row['ratio']:.3f}" if row.get("ratio") else "-"
        print(f"[gpu] vllm {name} {' '.join(extra)}: predicted {row.get('predicted')}, reported {row.get('reported')}, "
              f"ratio {ratio} (rc {run.returncode})")  # fmt: skip
        sh(["ansible-playbook", "playbooks/teardown.yml", "-i", str(inventory)], cwd=ROOT, env=env)
    return results


def torch_only(out: Path, gpu_name: str, total_gib: float) -> list[dict[str, Any]]:
    import torch

    if not torch.cuda.is_available():
        print("[gpu] SKIP torch has no CUDA here")
        return []
    free0, total = torch.cuda.mem_get_info()  # creates the context
    torch.cuda.synchronize()
    context_gib = (total - free0) / 2**30
    results: list[dict[str, Any]] = [
        {"measure": "cuda_context_gib", "value": round(context_gib, 3), "planned": CUDA_CONTEXT_GIB}
    ]
    print(f"[gpu] torch: CUDA context + driver reservations {context_gib:.3f} GiB of {total / 2**30:.1f} GiB "
          f"(the planner assumes {CUDA_CONTEXT_GIB})")  # fmt: skip
    results += calibrate(torch)
    try:
        from transformers import AutoConfig, AutoModelForCausalLM
    except ImportError:
        print("[gpu] SKIP weights: transformers is not installed")
        return results
    base = Path(tempfile.mkdtemp(prefix="vf-gpu-"))
    for name in CONFIGS:
        folder = write_model(base, name)
        spec = load_model(str(folder))
        est = estimate(spec, Device(gpu_name, total_gib), Settings(max_model_len=MAX_LEN))
        planned = est.ranks[0].weights_gib
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder), dtype=torch.bfloat16)
        model = model.to_empty(device="cuda")
        # to_empty gives tied parameters storages of their own (a 1B model's embedding counted
        # twice, 2026-12-04): tie them again and count each storage once, as vLLM holds them.
        model.tie_weights()
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                    for t in (*model.parameters(), *model.buffers())}  # fmt: skip
        measured = sum(storages.values()) / 2**30
        del model
        torch.cuda.empty_cache()
        results.append({"config": name, "weights_planned_gib": planned, "weights_measured_gib": round(measured, 4)})
        print(f"[gpu] torch weights {name}: planned {planned:.3f} GiB, on the device {measured:.3f} GiB "
              f"(ratio {measured / planned:.4f})")  # fmt: skip
    return results


def _non_torch(torch: Any) -> float:
    """Device memory in use that PyTorch's allocator does not hold (vLLM's "non-torch" part), GiB."""
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return (total - free - torch.cuda.memory_reserved()) / 2**30


def calibrate(torch: Any) -> list[dict[str, Any]]:
    """What the planner assumes of memory outside the weights and the KV cache, measured with
    PyTorch alone (vllm_fleet/accounting/memory.py: CUDA_CONTEXT_GIB, the non-torch base, the CUDA graph
    pool per graph and layer). Each measurement stands alone: one that fails is reported and
    the others still run."""
    rows: list[dict[str, Any]] = []

    def row(measure: str, value: float, planned: float | None, note: str) -> None:
        rows.append({"measure": measure, "value": round(value, 4), "planned": planned, "note": note})
        shown = f", the planner assumes {planned}" if planned is not None else ""
        print(f"[gpu] calibrate {measure}: {value:.4f}{shown} ({note})")

    dev = torch.device("cuda", 0)
    try:  # cuBLAS: its workspace is allocated on the first GEMM, outside PyTorch's allocator
        before = _non_torch(torch)
        a = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
        (a @ a).sum().item()
        row("cublas_workspace_gib", _non_torch(torch) - before, 0.15, "non-torch increase after the first bf16 GEMM")
        del a
    except Exception as err:  # a step that fails is reported, not fatal
        print(f"[gpu] calibrate cublas FAILED: {type(err).__name__}: {err}")
    try:  # NCCL: one rank (one GPU here); its buffers outside the allocator
        import torch.distributed as dist

        before = _non_torch(torch)
        store = dist.HashStore()
        dist.init_process_group("nccl", store=store, rank=0, world_size=1, device_id=dev)
        t = torch.ones(1 << 20, device=dev)
        dist.all_reduce(t)
        torch.cuda.synchronize()
        note = "init + one all_reduce, world size 1 (the planner charges none for one rank)"
        row("nccl_one_rank_gib", _non_torch(torch) - before, 0.0, note)
        dist.destroy_process_group()
    except Exception as err:
        print(f"[gpu] calibrate nccl FAILED: {type(err).__name__}: {err}")
    try:  # the caching allocator: reserved beyond allocated after a profile-like pass
        torch.cuda.empty_cache()
        keep = [torch.empty(int(s * 2**20), device=dev, dtype=torch.uint8) for s in (700, 300, 129, 64, 33)]
        for n in (8192, 4096, 2048, 1024):  # transient activations of shrinking batches
            x = torch.randn(n, 8192, device=dev, dtype=torch.bfloat16)
            y = torch.nn.functional.silu(x) * x
            del x, y
        allocated = torch.cuda.memory_allocated() / 2**30
        reserved = torch.cuda.memory_reserved() / 2**30
        note = f"reserved {reserved:.3f} GiB for {allocated:.3f} GiB live"
        row("allocator_slack_gib", reserved - allocated, None, note)
        del keep
        torch.cuda.empty_cache()
    except Exception as err:
        print(f"[gpu] calibrate allocator FAILED: {type(err).__name__}: {err}")
    try:  # CUDA graphs: a llama-1b-like decoder layer stack captured at vLLM's sizes, one pool
        hidden, inter, layers, seqs = 2048, 8192, 16, 256
        w = [
            {k: torch.randn(*shape, device=dev, dtype=torch.bfloat16) * 0.01
             for k, shape in (("qkv", (hidden, 3 * hidden)), ("o", (hidden, hidden)),
                              ("gu", (hidden, 2 * inter)), ("d", (inter, hidden)))}
            for _ in range(layers)
        ]  # fmt: skip
        sizes = sorted(_capture_sizes(seqs, 8192), reverse=True)  # vLLM captures the largest first
        static = torch.zeros(max(sizes), hidden, device=dev, dtype=torch.bfloat16)

        def forward(x: Any) -> Any:
            for lw in w:
                q, k, v = (x @ lw["qkv"]).chunk(3, dim=-1)
                x = x + ((q * k + v) @ lw["o"])
                g, u = (x @ lw["gu"]).chunk(2, dim=-1)
                x = x + ((torch.nn.functional.silu(g) * u) @ lw["d"])
            return x

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            forward(static[:1])  # warm-up outside the capture (cuBLAS handles, kernels)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        free0 = torch.cuda.mem_get_info()[0]
        pool = torch.cuda.graph_pool_handle()
        graphs = []
        for n in sizes:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool):
                forward(static[:n])
            graphs.append(g)
        torch.cuda.synchronize()
        used_mib = (free0 - torch.cuda.mem_get_info()[0]) / 2**20
        per = used_mib / (len(sizes) * layers)
        row("cuda_graph_mib_per_graph_layer", per, CUDA_GRAPH_MIB_PER_GRAPH_LAYER,
            f"{len(sizes)} graphs x {layers} layers, {used_mib:.1f} MiB in all (dense GEMMs and pointwise ops only, "
            "no attention kernel: a lower bound of what vLLM's piecewise graphs hold)")  # fmt: skip
        graphs[0].replay()
        torch.cuda.synchronize()
        del graphs, pool, static
        torch.cuda.empty_cache()
    except Exception as err:
        print(f"[gpu] calibrate cuda graphs FAILED: {type(err).__name__}: {err}")
    return rows


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "gpu-out")
    out.mkdir(parents=True, exist_ok=True)
    found = gpu()
    if found is None:
        print("[gpu] SKIP no NVIDIA GPU (nvidia-smi)")
        return 0
    name, total_gib = found
    python = os.environ.get("VLLM_PYTHON", "python3")
    has_vllm = sh([python, "-c", "import vllm"]).returncode == 0
    has_torch = sh([sys.executable, "-c", "import torch"]).returncode == 0
    report: dict[str, Any] = {"gpu": name, "total_gib": total_gib}
    if has_vllm:
        report["vllm"] = with_vllm(python, out, name, total_gib)
    else:
        print(f"[gpu] SKIP vLLM runs: {python} cannot import vllm")
    if has_torch:
        report["torch"] = torch_only(out, name, total_gib)
    elif not has_vllm:
        print("[gpu] SKIP neither vLLM nor PyTorch is installed")
    (out / "serve_check.json").write_text(json.dumps(report, indent=1))
    bad = [r for r in report.get("vllm", []) if r["rc"] != 0 or not r.get("reported")]
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
