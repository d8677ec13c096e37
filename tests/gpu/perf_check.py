"""What the performance model assumes, measured with PyTorch alone on a lent GPU (issue 45):

* GEMM efficiency: bf16 (and fp8 where torch._scaled_mm runs) at the shapes vLLM runs: decode
  (tokens 1-256 x a Llama-8B projection) and prefill chunks (2,048-8,192 tokens);
* HBM efficiency: a weight-sized copy, and a decode GEMV streaming a 1 GiB matrix;
* attention: causal scaled_dot_product_attention at prefill shapes (FLOPs / peak).

Each figure is printed beside the constant the planner uses (vllm_fleet/performance/constants.py)
and the catalog's peak for the device (hardware.py), and written to OUT/perf_check.json. On a
machine without CUDA it runs the same code on the CPU at small shapes (a dry run of the script).

    python tests/gpu/perf_check.py OUT_DIR
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

from vllm_fleet.accounting.settings import Device
from vllm_fleet.model.catalog import lookup_gpu
from vllm_fleet.performance import constants as C
from vllm_fleet.performance.hardware import accelerator


def _timed(fn: Any, device: str, repeat: int = 20) -> float:
    for _ in range(3):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeat


def main(out: Path) -> int:
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    name = torch.cuda.get_device_name(0) if cuda else "cpu"
    gpu = lookup_gpu(name) if cuda else None
    peak_bf16 = hbm = None
    arch = "cpu"
    if gpu is not None:
        acc, _ = accelerator(Device(gpu.name, gpu.memory_gib, "cuda", gpu.capability // 10, None, gpu.capability))
        peak_bf16, hbm, arch = acc.peak("bf16") * 1e12, acc.hbm_gbps * 1e9, gpu.arch
    dtype = torch.bfloat16
    scale = 1 if cuda else 8  # the CPU dry run: smaller shapes
    hidden, inter = 4096 // scale, 14336 // scale
    results: dict[str, Any] = {"device": name, "catalog": gpu.name if gpu else None, "gemm": [], "attention": []}
    weight = torch.randn(inter, hidden, device=device, dtype=dtype)
    for tokens in (1, 16, 64, 256, 2048, 8192):
        tokens = max(1, tokens // scale)
        x = torch.randn(tokens, hidden, device=device, dtype=dtype)
        seconds = _timed(lambda x=x: x @ weight.T, device)
        flops = 2 * tokens * hidden * inter
        row = {"tokens": tokens, "tflops": flops / seconds / 1e12, "gbps": weight.numel() * 2 / seconds / 1e9}
        if peak_bf16:
            row["of_peak"] = flops / seconds / peak_bf16
            row["of_hbm"] = weight.numel() * 2 / seconds / hbm  # type: ignore[operator]
        results["gemm"].append(row)
    big = torch.empty(256 * 1024 * 1024 // scale, device=device, dtype=torch.float32)
    dst = torch.empty_like(big)
    seconds = _timed(lambda: dst.copy_(big), device, repeat=10)
    results["copy_gbps"] = 2 * big.numel() * 4 / seconds / 1e9
    if hbm:
        results["copy_of_hbm"] = results["copy_gbps"] * 1e9 / hbm
    heads, head_dim = 32 // min(scale, 4), 128
    for seq in (1024, 4096):
        seq = seq // scale
        q = torch.randn(1, heads, seq, head_dim, device=device, dtype=dtype)
        seconds = _timed(lambda q=q: torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True), device)
        flops = 4 * heads * head_dim * seq * seq / 2
        row = {"seq": seq, "tflops": flops / seconds / 1e12}
        if peak_bf16:
            row["of_peak"] = flops / seconds / peak_bf16
        results["attention"].append(row)
    results["assumed"] = {
        "gemm_efficiency": C.GEMM_EFFICIENCY.get(arch),
        "hbm_efficiency": C.HBM_EFFICIENCY,
        "prefill_attention_efficiency": C.PREFILL_ATTENTION_EFFICIENCY,
    }
    (out / "perf_check.json").write_text(json.dumps(results, indent=1))
    for row in results["gemm"]:
        shown = f" ({row['of_peak']:.0%} of peak, {row['of_hbm']:.0%} of HBM)" if "of_peak" in row else ""
        print(f"[gpu] GEMM {row['tokens']:>5} x {hidden} x {inter}: {row['tflops']:.1f} TFLOP/s{shown}")
    print(f"[gpu] copy: {results['copy_gbps']:.0f} GB/s" + (f" ({results['copy_of_hbm']:.0%} of HBM)" if hbm else ""))
    for row in results["attention"]:
        shown = f" ({row['of_peak']:.0%} of peak)" if "of_peak" in row else ""
        print(f"[gpu] causal attention {row['seq']} tokens: {row['tflops']:.1f} TFLOP/s{shown}")
    print(f"[gpu] the planner assumes: {results['assumed']}")
    return 0


if __name__ == "__main__":
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "gpu-out")
    target.mkdir(parents=True, exist_ok=True)
    raise SystemExit(main(target))
