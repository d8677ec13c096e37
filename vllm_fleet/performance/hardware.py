"""The roofline's inputs: what each GPU (or the CPU) and each link can do at best.

Peak figures are the vendors' dense numbers (a datasheet's "with sparsity" figure halved),
per GPU, in TFLOP/s and GB/s (10^9 bytes). What kernels actually reach of them is in
:mod:`vllm_fleet.performance.constants`, each with its source.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm_fleet.accounting.settings import Device

_H100 = "https://www.nvidia.com/en-us/data-center/h100/ (datasheet: SXM / PCIe / NVL columns)"
_H200 = "https://www.nvidia.com/en-us/data-center/h200/ (datasheet)"
_H20 = "https://www.nvidia.com/en-us/data-center/h20/ (H20 product brief: 148 TF bf16, 4.0 TB/s, 900 GB/s NVLink)"
_H800 = "NVIDIA H800 SXM product brief: H100 SXM compute, 400 GB/s NVLink"
_GH200 = "https://www.nvidia.com/en-us/data-center/grace-hopper-superchip/ (96 GB HBM3, 4 TB/s)"
_B200 = "https://www.nvidia.com/en-us/data-center/hgx/ (HGX B200, per GPU: 2.25 PF bf16, 4.5 PF fp8, 9 PF fp4 dense)"
_GB200 = "https://www.nvidia.com/en-us/data-center/gb200-nvl72/ (per GPU: 2.5 PF bf16, 5 PF fp8, 10 PF fp4 dense)"
_A100 = "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"
_A10 = "https://www.nvidia.com/en-us/data-center/products/a10-gpu/ (datasheet)"
_A10G = "AWS G5 (A10G): 72 SMs at 1.71 GHz, about 70 TF fp16 tensor, 600 GB/s (aws.amazon.com/ec2/instance-types/g5/)"
_A40 = "https://images.nvidia.com/content/Solutions/data-center/a40/nvidia-a40-datasheet.pdf"
_L40S = "https://www.nvidia.com/en-us/data-center/l40s/ (datasheet)"
_L40 = "https://www.nvidia.com/en-us/data-center/l40/ (datasheet)"
_L20 = "NVIDIA L20 product brief: 119.5 TF fp16, 239 TF fp8, 864 GB/s"
_L4 = "https://www.nvidia.com/en-us/data-center/l4/ (datasheet)"
_ADA = (
    "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf (Ada whitepaper, appendix)"
)
_GA102 = "https://www.nvidia.com/content/PDF/nvidia-ampere-ga-102-gpu-architecture-whitepaper-v2.pdf (fp32 accumulate)"
_RTXPRO = "https://www.nvidia.com/en-us/data-center/rtx-pro-6000-blackwell-server-edition/ (datasheet)"
_GB10 = "https://www.nvidia.com/en-us/products/workstations/dgx-spark/ (1 PF fp4 sparse, 273 GB/s LPDDR5x)"
_T4 = "https://www.nvidia.com/en-us/data-center/tesla-t4/ (datasheet)"
_V100 = "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf"
_MI300X = "https://www.amd.com/en/products/accelerators/instinct/mi300/mi300x.html (datasheet)"
_RTX6000ADA = "https://www.nvidia.com/en-us/design-visualization/rtx-6000/ (datasheet)"


@dataclass(frozen=True)
class Accelerator:
    """One GPU's peaks: dense TFLOP/s per compute dtype, memory and link bandwidth (GB/s, one direction)."""

    name: str
    tflops: dict[str, float]  # bf16 (fp16 where the GPU has no bf16), fp8, int8, fp4
    hbm_gbps: float
    nvlink_gbps: float  # per GPU, one direction; 0 without NVLink
    pcie_gbps: float  # one direction, the slot's generation x16
    source: str
    notes: tuple[str, ...] = field(default=())

    def peak(self, dtype: str) -> float:
        """TFLOP/s for ``dtype``, falling back to the next wider type the GPU has."""
        for name in {"fp4": ("fp4", "fp8", "bf16"), "fp8": ("fp8", "bf16"), "int8": ("int8", "bf16")}.get(
            dtype, ("bf16",)
        ):
            if name in self.tflops:
                return self.tflops[name]
        return self.tflops["bf16"]

    def compute_dtype(self, dtype: str) -> str:
        """The dtype the GEMMs actually run in on this GPU (fp8 on Ampere runs as bf16: Marlin)."""
        return dtype if dtype in self.tflops else "bf16"


def _a(name: str, bf16: float, hbm: float, nvlink: float, pcie: float, source: str, **low: float) -> Accelerator:
    return Accelerator(name, {"bf16": bf16, **low}, hbm, nvlink, pcie, source)


GEN5, GEN4, GEN3 = 64.0, 32.0, 16.0

ACCELERATORS: dict[str, Accelerator] = {
    a.name.lower(): a
    for a in (
        _a("H100-SXM", 989.4, 3350, 450, GEN5, _H100, fp8=1978.9, int8=1978.9),
        _a("H100-PCIe", 756.0, 2000, 0, GEN5, _H100, fp8=1513.0, int8=1513.0),
        _a("H100-NVL", 835.5, 3900, 300, GEN5, _H100, fp8=1670.5, int8=1670.5),
        _a("H200", 989.4, 4800, 450, GEN5, _H200, fp8=1978.9, int8=1978.9),
        _a("H20", 148.0, 4000, 450, GEN5, _H20, fp8=296.0, int8=296.0),
        _a("H800", 989.4, 3350, 200, GEN5, _H800, fp8=1978.9, int8=1978.9),
        _a("GH200", 989.4, 4000, 450, GEN5, _GH200, fp8=1978.9, int8=1978.9),
        _a("B200", 2250.0, 8000, 900, GEN5, _B200, fp8=4500.0, int8=4500.0, fp4=9000.0),
        _a("GB200", 2500.0, 8000, 900, GEN5, _GB200, fp8=5000.0, int8=5000.0, fp4=10000.0),
        _a("A100-80G", 312.0, 2039, 300, GEN4, _A100, int8=624.0),
        _a("A100-40G", 312.0, 1555, 300, GEN4, _A100, int8=624.0),
        _a("A800", 312.0, 2039, 200, GEN4, _A100 + " (A800: 400 GB/s NVLink)", int8=624.0),
        _a("A10", 125.0, 600, 0, GEN4, _A10, int8=250.0),
        _a("A10G", 70.0, 600, 0, GEN4, _A10G, int8=140.0),
        _a("A40", 149.7, 696, 56, GEN4, _A40, int8=299.3),
        _a("L40S", 362.05, 864, 0, GEN4, _L40S, fp8=733.0, int8=733.0),
        _a("L40", 181.05, 864, 0, GEN4, _L40, fp8=362.0, int8=362.0),
        _a("L20", 119.5, 864, 0, GEN4, _L20, fp8=239.0, int8=239.0),
        _a("L4", 121.0, 300, 0, GEN4, _L4, fp8=242.5, int8=242.5),
        _a("RTX-6000-Ada", 364.2, 960, 0, GEN4, _RTX6000ADA, fp8=728.5, int8=728.5),
        _a("RTX-A6000", 154.8, 768, 56, GEN4, _GA102, int8=309.7),
        _a("RTX-PRO-6000", 503.8, 1792, 0, GEN5, _RTXPRO, fp8=1007.6, int8=1007.6, fp4=2015.2),
        _a("GB10", 125.0, 273, 0, GEN5, _GB10, fp8=250.0, int8=250.0, fp4=500.0),
        _a("RTX-4090", 165.2, 1008, 0, GEN4, _ADA, fp8=330.3, int8=330.3),
        _a("RTX-3090", 71.0, 936, 56, GEN4, _GA102, int8=284.0),
        _a("RTX-2000-Ada", 48.0, 224, 0, GEN4, _ADA + " (RTX 2000 Ada: 224 GB/s)", fp8=96.0, int8=96.0),
        _a("T4", 65.0, 320, 0, GEN3, _T4 + " (fp16; no bf16)", int8=130.0),
        _a("V100-32G", 125.0, 900, 150, GEN3, _V100 + " (fp16; no bf16)"),
        _a("V100-16G", 125.0, 900, 150, GEN3, _V100 + " (fp16; no bf16)"),
        _a(
            "MI300X",
            1307.4,
            5300,
            448,
            GEN5,
            _MI300X + " (Infinity Fabric: 7 links x 64 GB/s)",
            fp8=2614.9,
            int8=2614.9,
        ),
    )
}

# A GPU the catalog does not know: its architecture's slowest common member, said in the plan.
BY_ARCH: dict[int, str] = {70: "v100-16g", 75: "t4", 80: "a100-40g", 86: "a10", 89: "l4", 90: "h100-pcie", 100: "b200"}

# The CPU build: peak per core and cycle by ISA (vLLM's CPU build wants AVX-512; AMX on Sapphire
# Rapids and later), and memory bandwidth per core (tests/gpu/perf_check.py's CPU run on our 2-core
# EPYC: 0.2 TFLOP/s of bf16 GEMM, 31 GB/s of copy, 2026-12-07). The engine's own costs are
# constants.CPU_*, measured on the local default.
CPU_FLOPS_PER_CYCLE = {"amx": 1024.0, "avx512": 64.0, "avx2": 32.0}
CPU_GHZ = 2.6
CPU_GBPS_PER_CORE = 15.0


def accelerator(device: Device) -> tuple[Accelerator, str]:
    """The peaks of ``device`` and a note when they are a stand-in."""
    found = ACCELERATORS.get(device.name.lower())
    if found:
        return found, ""
    cap = device.compute_capability
    key = max((k for k in BY_ARCH if k <= cap), default=80)
    stand_in = ACCELERATORS[BY_ARCH[key]]
    return stand_in, f"{device.name}: no roofline figures in the catalog; predicted as a {stand_in.name}"


def cpu_accelerator(cores: int, isa: str = "avx512") -> Accelerator:
    """The CPU build's roofline: ``cores`` at :data:`CPU_GHZ`, its ISA's FMA width."""
    per_cycle = CPU_FLOPS_PER_CYCLE.get(isa, CPU_FLOPS_PER_CYCLE["avx2"])
    tflops = cores * CPU_GHZ * per_cycle / 1000
    return Accelerator(
        f"CPU ({cores} cores, {isa})",
        {"bf16": tflops},
        cores * CPU_GBPS_PER_CORE,
        0.0,
        0.0,
        "cores x clock x the ISA's fp32 FMA lanes; memory bandwidth per core",
    )
