"""What each candidate layout serves on the cluster, and the goodput it is ranked by.

Goodput is the cluster's requests per second whose TTFT and TPOT meet the SLO (the asked one,
else the default interactivity bound, stated in the plan):

* without a load in the workload, each instance's capacity under the SLO: the highest Poisson
  rate whose steady-state p90 TTFT and TPOT meet it (binary search on the closed forms of
  performance/serving.py), summed over the instances;
* with a rate or a number of clients for the cluster, that load spread over the instances as
  the gateway's least-connections does (in proportion to their capacity): the requests/s
  served, where every instance's share stays within its capacity, else that capacity.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from vllm_fleet.accounting.memory import Estimate
from vllm_fleet.model.spec import ModelSpec
from vllm_fleet.performance import constants as C
from vllm_fleet.performance.hardware import accelerator
from vllm_fleet.performance.predict import Placement, server_for
from vllm_fleet.performance.serving import Prediction, Server
from vllm_fleet.performance.workload import Calibration, Slo, Workload
from vllm_fleet.planning.cluster import Node

SEARCH_STEPS = 18


@dataclass
class InstancePerf:
    server: Server
    capacity: float  # requests/s within the SLO (0: not even one request meets it)
    saturation: float  # requests/s at the largest batch


@dataclass
class ClusterPerf:
    """A candidate's predicted service: per instance, and for the cluster."""

    instances: list[InstancePerf]
    predictions: list[Prediction]
    goodput: float  # requests/s meeting the SLO
    request_throughput: float
    output_token_throughput: float
    gpus: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "goodput": round(self.goodput, 4),
            "request_throughput": round(self.request_throughput, 4),
            "output_token_throughput": round(self.output_token_throughput, 2),
        }


def placement_of(
    inst: list[tuple[Node, int]], tp: int, partition: list[int] | None = None, calibration: Calibration | None = None
) -> Placement:
    nodes = list(dict.fromkeys(n.name for n, _ in inst))
    first = inst[0][0]
    parts = [p for p in partition or [] if p > 0]
    return Placement(
        stage_imbalance=max(parts) * len(parts) / sum(parts) if parts else 1.0,
        nodes=len(nodes),
        nvlink=all(n.nvlink for n, _ in inst),
        nic_gbps=min(n.nic_gbps for n, _ in inst),
        tp_across_nodes=tp > first.gpu_count,
        cpu_cores=first.cpu_cores,
        calibration=calibration or Calibration(),
    )


def _meets(server: Server, w: Workload, slo: Slo, rate: float) -> bool:
    ttft, tpot, _ = server.steady(w, rate)
    ok = slo.ttft_p90_ms is None or ttft.p90 * 1000 <= slo.ttft_p90_ms
    return ok and (slo.tpot_p90_ms is None or tpot.p90 * 1000 <= slo.tpot_p90_ms)


def capacity(server: Server, w: Workload, slo: Slo) -> tuple[float, float]:
    """(requests/s within ``slo``, requests/s at saturation) of one instance."""
    top = server.saturation(w)
    if top <= 0 or not _meets(server, w, slo, top * 1e-3):
        return 0.0, top
    if _meets(server, w, slo, top * 0.999):
        return top * 0.999, top
    lo, hi = top * 1e-3, top * 0.999
    for _ in range(SEARCH_STEPS):
        mid = (lo + hi) / 2
        if _meets(server, w, slo, mid):
            lo = mid
        else:
            hi = mid
    return lo, top


class Evaluator:
    """Predictions of candidates, cached per (estimate, placement): identical instances of a
    layout are costed once."""

    def __init__(self, spec: ModelSpec, workload: Workload, slo: Slo, calibration: Calibration | None = None) -> None:
        self.spec, self.workload, self.slo = spec, workload, slo
        self.calibration = calibration or Calibration()
        self._cache: dict[tuple[int, Placement], InstancePerf] = {}

    def instance(self, est: Estimate, inst: list[tuple[Node, int]]) -> InstancePerf:
        place = placement_of(inst, est.tensor_parallel_size, est.layer_partition, self.calibration)
        key = (id(est), place)
        if key not in self._cache:
            # A pipeline runs at its slowest stage's pace: mixed GPUs are costed as the slowest.
            slowest = min((n for n, _ in inst), key=lambda n: accelerator(n.device())[0].hbm_gbps)
            server = server_for(self.spec, est, slowest.device(), place)
            cap, top = capacity(server, self.workload, self.slo)
            self._cache[key] = InstancePerf(server, cap, top)
        return self._cache[key]

    def cluster(self, estimates: list[Estimate], instances: list[list[tuple[Node, int]]]) -> ClusterPerf:
        perfs = [self.instance(e, i) for e, i in zip(estimates, instances, strict=True)]
        w = self.workload
        total_cap = sum(p.capacity for p in perfs)
        total_top = sum(p.saturation for p in perfs)
        shares = [p.saturation / total_top if total_top else 1 / len(perfs) for p in perfs]
        predictions = []
        if w.load == "offline":
            # Each instance at its operating point: its SLO capacity, else saturation.
            rates = [p.capacity or p.saturation * 0.9 for p in perfs]
            goodput = total_cap
        else:
            if w.load == "rate":
                load = w.request_rate or 0.0
            else:  # clients: the rate they sustain at the capacity's latencies (Little's law)
                load = self._client_rate(perfs, w.concurrency or 1)
            rates = [min(load * s, p.saturation * 0.999) for s, p in zip(shares, perfs, strict=True)]
            goodput = sum(min(r, p.capacity) for r, p in zip(rates, perfs, strict=True))
        seen: dict[tuple[int, float], Prediction] = {}
        for perf, rate in zip(perfs, rates, strict=True):
            key = (id(perf), round(rate, 6))
            if key not in seen:
                seen[key] = perf.server.steady_prediction(replace(w, request_rate=rate, concurrency=None))
            predictions.append(seen[key])
        gpus = sum(g for inst in instances for _, g in inst)
        return ClusterPerf(
            perfs,
            predictions,
            goodput,
            sum(p.request_throughput for p in predictions),
            sum(p.output_token_throughput for p in predictions),
            gpus,
        )

    def _client_rate(self, perfs: list[InstancePerf], clients: int) -> float:
        """Requests/s ``clients`` closed-loop clients send: clients / response time, the response
        time at the instances' saturation-weighted pace (bounded by saturation)."""
        w = self.workload
        total = sum(p.saturation for p in perfs)
        rate = total * 0.5
        for _ in range(12):
            times = []
            for p in perfs:
                share = rate * (p.saturation / total if total else 1 / len(perfs))
                ttft, tpot, _ = p.server.steady(w, min(share, p.saturation * 0.999))
                times.append(ttft.mean + tpot.mean * max(w.output_len - 1, 0))
            response = sum(times) / len(times)
            rate = min(clients / response if response > 0 else total, total * 0.999)
        return rate


def verify_load(perf: InstancePerf, workload: Workload, max_model_len: int) -> dict[str, Any]:
    """The bounded load verify sends to one instance (its share of the gateway's), and what the
    plan predicts for it: the workload's lengths (at most 1,024 in and 128 out, within
    max_model_len), one client, a few requests, no new one after the time budget."""
    out_len = max(1, min(workload.output_len, C.VERIFY_MAX_OUTPUT, max_model_len // 2))
    in_len = max(1, min(workload.input_len, C.VERIFY_MAX_INPUT, max_model_len - out_len - 1))
    clients = C.VERIFY_CLIENTS_PER_INSTANCE * max(perf.server.dp, 1)
    requests = clients * C.VERIFY_REQUESTS_PER_CLIENT
    load = Workload(in_len, out_len, requests, concurrency=clients)
    pred = perf.server.predict(load)
    return {
        "requests": requests,
        "concurrency": clients,
        "budget_s": C.VERIFY_BUDGET_S,
        "input_len": in_len,
        "output_len": out_len,
        "output_token_throughput": round(pred.output_token_throughput, 2),
        "ttft_ms": {"median": round(pred.ttft_ms.median, 2), "p90": round(pred.ttft_ms.p90, 2)},
        "tpot_ms": {"median": round(pred.tpot_ms.median, 2), "p90": round(pred.tpot_ms.p90, 2)},
        "calibration": {
            "step_time": perf.server.model.calibration.step_time,
            "ttft": perf.server.model.calibration.ttft,
        },
    }
