"""Unified memory: integrated GPUs (GB10 of the DGX Spark, Jetson Thor and Orin) whose memory is
the host's, as vLLM measures it.

vLLM's worker takes one memory snapshot before it loads the model (``MemorySnapshot`` in
vllm/utils/mem_utils.py) and refuses to start when that snapshot's free memory is below
total x gpu_memory_utilization (``request_memory``). On an integrated GPU the free memory it reads
depends on the release:

* up to 0.11: ``cudaMemGetInfo``'s free memory, which on these parts is the kernel's MemFree: the
  page cache counts as used, so a host that has just read the model files refuses to start;
* 0.12 to 0.19: the host's MemAvailable (``psutil.virtual_memory().available``) on compute
  capabilities 8.7, 11.0 and 12.1 (Orin, Thor, Spark), cudaMemGetInfo elsewhere;
* 0.20 on: MemAvailable on every GPU whose ``is_integrated`` is set (vLLM PR #35356).

CUDA's total there is the host's memory (121.69 GiB on a 128 GB DGX Spark, its MemTotal), and
MemAvailable at the snapshot is that total less what the OS holds and what vLLM's own processes
(API server, engine core, the worker with its CUDA context) hold before it: 114.5 to 116 GiB on
quiet single Sparks, 2.6 GiB below the idle MemAvailable with vLLM 0.28 (llamastash PR #81),
about 110 GiB on two-node ones, 101 to 102 GiB on some kernel and driver pairs
(MiaAI-Lab/GLM-5.3-Flash-EXL3-2x-DGX-Sparks issue #47). The startup check is not the bound that
matters, though: whatever vLLM's budget takes is gone from the host, and Sparks whose
MemAvailable fell below 16 GiB while vLLM warmed up have frozen or reset
(NVIDIA/dgx-spark-playbooks issue #97, AEON-7/vllm-ultimate-dgx-spark issue #9). The planner
leaves ``UMA_HOST_RESERVE_GIB`` of the host outside vLLM's budget where no free memory is stated,
which is where vLLM's own GB10 recipe runs (0.85: "GB10's unified memory can't satisfy the
default 0.92", vllm-project/recipes PR #632); a stated ``gpu_free_gib`` (the MemAvailable the
snapshot reads, less what the host must keep) replaces it.

From 0.21 vLLM subtracts an estimate of its CUDA graphs' memory from the KV pool
(``profile_cudagraph_memory``), measured as the drop of ``cudaMemGetInfo``'s free memory across a
few captures. On unified memory that reading ignores reclaimable memory and goes up as well as
down while the kernel reclaims the page cache, so the estimate can be negative and the pool grows
by as much: -4.74 GiB (eugr/spark-vllm-docker PR #200), -10.33 and -35.69 GiB (vllm-project/vllm
issue #44740, PRs #44745 and #46932 open, 0.32 unchanged) on GB10s, a pool no plan can predict
that then runs the host out of memory. The fleet starts vLLM with
``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0`` on unified memory (:func:`launch_env`) unless the
operator's environment sets it: the pool is then the budget less the profiled non-KV memory, and
the graphs are captured on top of it, out of the host's reserve.

The KV pool is otherwise sized as on a discrete GPU; from 0.28 vLLM's non-KV charge is the drop of that
free memory from the snapshot to the end of its profile run, so on unified memory whatever the
host allocates meanwhile (a cold model load's page cache on releases reading MemFree, other
processes) comes out of the KV pool as well: the plan says so in an assumption.

Pure Python, no torch or vLLM import.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from vllm_fleet.accounting.base import GIB, parse_version
from vllm_fleet.accounting.settings import Device, env_flag

# What the plan leaves of a unified-memory host outside vLLM's budget, where no free memory is
# stated: 17.5 GiB, at most 15 % of the host (a 16 GB Jetson keeps 2.3 GiB; see the module
# docstring for the sources).
UMA_HOST_RESERVE_GIB = 17.5
UMA_HOST_RESERVE_SHARE = 0.15
# MemorySnapshot.measure's shared_sysmem_device_mem_sms in 0.12 to 0.19: Orin, Thor, Spark.
_MEMAVAILABLE_CAPABILITIES_0_12 = frozenset({87, 110, 121})
# vllm/envs.py: whether the CUDA graph estimate comes out of the KV pool ("1" by default from 0.21).
ESTIMATE_CUDAGRAPHS_ENV = "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS"


def estimate_cudagraphs(env: Mapping[str, str]) -> bool | None:
    """VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS as vllm/envs.py reads it, None where unset."""
    return env_flag(env, ESTIMATE_CUDAGRAPHS_ENV)


def graphs_in_budget(release_default: bool, devices: Sequence[Device], asked: bool | None) -> bool:
    """Whether vLLM subtracts its CUDA graph estimate from the KV pool of an instance on
    ``devices``: as the operator's environment asks (``asked``, from 0.21), else off where any GPU
    has unified memory (the fleet sets :data:`ESTIMATE_CUDAGRAPHS_ENV` to 0 there), else the
    release's default (``release_default``: on from 0.21)."""
    if not release_default:
        return False
    if asked is not None:
        return asked
    return not any(d.unified_memory and d.kind == "cuda" for d in devices)


def launch_env(release_default: bool, in_budget: bool) -> dict[str, str]:
    """The environment the plan's accounting needs vLLM to start with: the 0 wherever the release
    would subtract the estimate and the plan does not (:func:`graphs_in_budget`), the operator's own
    0 included (a launch path without the operator's environment, Ray Serve's or Kubernetes', keeps it)."""
    return {ESTIMATE_CUDAGRAPHS_ENV: "0"} if release_default and not in_budget else {}


def reads_available(device: Device, version: str) -> bool:
    """True when vLLM ``version`` reads the host's MemAvailable as ``device``'s free memory."""
    if not device.unified_memory or device.kind != "cuda":
        return False
    release = parse_version(version)
    if release >= (0, 20):
        return True
    return release >= (0, 12) and device.compute_capability in _MEMAVAILABLE_CAPABILITIES_0_12


def startup_free_bytes(device: Device) -> float:
    """The free memory vLLM's snapshot reads on ``device`` before vLLM's own use: the stated or
    measured free memory, else the whole GPU (discrete) or the host's memory less the OS and
    vLLM's host processes (unified memory)."""
    if device.free_gib is not None:
        return device.free_gib * GIB
    if device.unified_memory:
        return (device.total_gib - host_reserve_gib(device)) * GIB
    return device.total_gib * GIB


def start_limit(device: Device, outside_bytes: float) -> float:
    """The most gpu_memory_utilization ``device`` starts with: its free memory at vLLM's snapshot
    (:func:`startup_free_bytes`) less what vLLM holds outside its budget there (the CUDA context,
    NCCL: ``outside_bytes``), over its total, rounded down to 0.01."""
    free = startup_free_bytes(device)
    return float(math.floor((free - outside_bytes) / (device.total_gib * GIB) * 100) / 100)


def host_reserve_gib(device: Device) -> float:
    """What the plan leaves of ``device``'s host outside vLLM's budget (unified memory only)."""
    return min(UMA_HOST_RESERVE_GIB, UMA_HOST_RESERVE_SHARE * device.total_gib) if device.unified_memory else 0.0


def assumptions(device: Device, version: str, graphs: str = "") -> list[str]:
    """One line saying how the plan reads ``device``'s unified memory under ``version``;
    ``graphs``: what the launch does with vLLM's CUDA graph estimate there."""
    if not device.unified_memory or device.kind != "cuda":
        return []
    held = (
        f"{device.free_gib:g} GiB free as stated"
        if device.free_gib is not None
        else f"{device.total_gib - host_reserve_gib(device):.2f} GiB free: {host_reserve_gib(device):g} GiB left to "
        "the OS and vLLM's own processes (state gpu_free_gib, the host's MemAvailable, to replace it)"
    )
    if reads_available(device, version):
        how = "vLLM reads the host's MemAvailable as the GPU's free memory"
    else:
        how = (
            f"vLLM {version} reads cudaMemGetInfo (MemFree) there: the page cache counts as used, so drop the caches "
            "before it starts (echo 3 > /proc/sys/vm/drop_caches)"
        )
    return [
        f"unified memory ({device.name}, {device.total_gib:g} GiB shared with the host): {how}; {held}; what the "
        f"host allocates while vLLM profiles comes out of the KV pool{graphs}"
    ]


def graphs_assumption(release_default: bool, in_budget: bool, graphs_gib: float) -> str:
    """The clause :func:`assumptions` adds on what happens to the CUDA graph estimate."""
    if not release_default:
        return ""
    if in_budget:
        return (
            f"; {ESTIMATE_CUDAGRAPHS_ENV}=1: vLLM subtracts a CUDA graph estimate read from cudaMemGetInfo, which "
            "goes up and down on unified memory (negative estimates of up to -35.69 GiB on GB10s, vllm-project/vllm "
            "#44740), so under the V1 model runner, which does not clamp it, the real pool can be larger than "
            "planned by as much and run the host out of memory"
        )
    return (
        f"; the fleet starts vLLM with {ESTIMATE_CUDAGRAPHS_ENV}=0 (its estimate from cudaMemGetInfo goes negative "
        f"here, vllm-project/vllm #44740): the CUDA graphs' {graphs_gib:.2f} GiB come on top of the budget, from the "
        "host's reserve"
    )
