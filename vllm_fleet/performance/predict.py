"""One instance's prediction from its memory estimate and where it runs."""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm_fleet.accounting.memory import Estimate
from vllm_fleet.accounting.settings import Device
from vllm_fleet.model.catalog import lookup_gpu
from vllm_fleet.model.spec import ModelSpec
from vllm_fleet.performance.costs import Links, StepModel
from vllm_fleet.performance.hardware import Accelerator, accelerator, cpu_accelerator
from vllm_fleet.performance.serving import Limits, Prediction, Server
from vllm_fleet.performance.workload import Calibration, Workload


@dataclass(frozen=True)
class Placement:
    """Where an instance's ranks sit: how many nodes, the NIC between them, NVLink inside."""

    nodes: int = 1
    nvlink: bool = True
    nic_gbps: float = 100.0
    tp_across_nodes: bool = False
    cpu_cores: int | None = None
    # PP: the largest stage's layers over the mean (an uneven VLLM_PP_LAYER_PARTITION paces the
    # pipeline by its largest stage).
    stage_imbalance: float = 1.0
    # The cluster's own speed from a verify run (vllm_fleet_calibration).
    calibration: Calibration = field(default_factory=Calibration)


def _arch(device: Device) -> str:
    gpu = lookup_gpu(device.name)
    if gpu is not None:
        return gpu.arch
    cap = device.compute_capability
    for low, name in ((100, "blackwell"), (90, "hopper"), (89, "ada"), (80, "ampere"), (75, "turing")):
        if cap >= low:
            return name
    return "volta"


def _links(acc: Accelerator, place: Placement, cpu: bool) -> Links:
    if cpu:
        net = place.nic_gbps / 8
        return Links("cpu", 10.0, "network" if place.nodes > 1 else "cpu", net if place.nodes > 1 else 10.0,
                     "cpu", 10.0)  # fmt: skip
    inside = ("nvlink", acc.nvlink_gbps) if place.nvlink and acc.nvlink_gbps else ("pcie", acc.pcie_gbps)
    network = ("network", place.nic_gbps / 8)
    tp = network if place.tp_across_nodes else inside
    across = network if place.nodes > 1 else inside
    return Links(tp[0], tp[1], across[0], across[1], across[0], across[1])


def server_for(spec: ModelSpec, est: Estimate, device: Device, place: Placement | None = None) -> Server:
    """The steady-state model of the instance ``est`` describes, on ``device`` GPUs."""
    place = place or Placement()
    cpu = device.kind == "cpu"
    if cpu:
        acc, arch = cpu_accelerator(place.cpu_cores or 1), "cpu"
    else:
        acc, _ = accelerator(device)
        arch = _arch(device)
    model = StepModel(
        spec, est, acc, arch, _links(acc, place, cpu), cpu=cpu, imbalance=place.stage_imbalance,
        calibration=place.calibration,
    )  # fmt: skip
    limits = Limits(
        kv_tokens=max(est.kv_cache_tokens, 1),
        max_num_seqs=est.max_num_seqs,
        max_num_batched_tokens=est.max_num_batched_tokens,
        block_size=est.block_size,
    )
    return Server(model, limits)


def predict(
    spec: ModelSpec, est: Estimate, device: Device, workload: Workload, place: Placement | None = None
) -> Prediction:
    """What the instance serves under ``workload`` (its load being this instance's)."""
    pred = server_for(spec, est, device, place).predict(workload)
    if not est.fits:
        pred.notes.append(f"the layout does not fit: {est.reason}")
    stand_in = "" if device.kind == "cpu" else accelerator(device)[1]
    if stand_in:
        pred.notes.append(stand_in)
    return pred
