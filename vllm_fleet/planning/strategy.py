"""Choose how a model is laid out on a cluster.

Candidates (each becomes instances behind the gateway, or is rejected with a
one-sentence reason):

* ``replicas``: single-node instances of TP (x PP inside the node) GPUs,
  as many as the nodes of one GPU type hold;
* ``pp``: instances spanning k nodes of one GPU type, TP inside each node and
  one PP stage per node;
* ``pp_mixed``: one stage per GPU type (mixed nodes), with a
  ``VLLM_PP_LAYER_PARTITION`` that balances the memory left for KV cache;
* ``instances``: independent single-node instances on every GPU type at once;
* ``dp_ep``: MoE models, data parallel attention with expert parallel MoE;
* ``tp_cross_node``: TP over several nodes, only with ``allow_cross_node_tp``.

Hard constraints: TP divides the attention heads, TP <= GPUs in a node
(unless cross-node TP is allowed), TP never mixes GPU types, PP <= layers.
Ranking: fits, then meets the target concurrency, then fewer cross-node hops,
then more instances (DP ranks count as instances), then more KV tokens.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from vllm_fleet.accounting.base import GIB
from vllm_fleet.accounting.kv import chunked_local_attn_hybrid_kv
from vllm_fleet.accounting.memory import Estimate, estimate, kv_heads_shard
from vllm_fleet.accounting.options import draft_spec_for
from vllm_fleet.accounting.settings import Device, Settings
from vllm_fleet.accounting.unified import estimate_cudagraphs
from vllm_fleet.errors import DoesNotFitError, NothingFitsError, PlanError
from vllm_fleet.model.length import check_max_model_len
from vllm_fleet.model.quantization import check_quantization_flag
from vllm_fleet.model.spec import ModelSpec
from vllm_fleet.performance.workload import calibration_from, slo_from, workload_from
from vllm_fleet.planning.checks import check_release, check_wishes, nodes_vllm_runs_on, valid_tps
from vllm_fleet.planning.cluster import Node, cluster_from_data, load_cluster
from vllm_fleet.planning.executor import choose_executor
from vllm_fleet.planning.instances import Candidate, instance_dict
from vllm_fleet.planning.perf import Evaluator, verify_load
from vllm_fleet.planning.rank import Ranking, rank
from vllm_fleet.planning.wishes import ALL_STRATEGIES, Wishes
from vllm_fleet.schema import values_of

__all__ = ["ALL_STRATEGIES", "Wishes", "choose_executor", "cluster_from_data", "load_cluster", "plan_cluster"]

MAX_PP_STAGES = 16


class _Planner:
    def __init__(self, spec: ModelSpec, nodes: list[Node], wishes: Wishes) -> None:
        self.spec = spec
        self.nodes = nodes
        self.wishes = wishes
        self.rejected: list[dict[str, Any]] = []
        self.candidates: list[Candidate] = []
        self.warnings: list[str] = []
        self._cache: dict[tuple[Any, ...], Estimate] = {}
        self.workload = workload_from(wishes.workload)
        self.slo = slo_from(wishes.slo)
        self.evaluator = Evaluator(spec, self.workload, self.slo.bound(), calibration_from(wishes.calibration))
        self.ranking: Ranking | None = None
        self.groups: dict[str, list[Node]] = {}
        for node in nodes:
            self.groups.setdefault(node.gpu_key, []).append(node)

    # -- estimates ---------------------------------------------------------

    def _settings(
        self,
        tp: int,
        pp: int,
        dp: int = 1,
        ep: bool = False,
        partition: list[int] | None = None,
        max_model_len: int | None = None,
    ) -> Settings:
        w = self.wishes
        chosen: dict[str, Any] = {
            "tensor_parallel_size": tp,
            "pipeline_parallel_size": pp,
            "data_parallel_size": dp,
            "gpu_memory_utilization": w.gpu_memory_utilization,
            "max_model_len": max_model_len or w.max_model_len,
        }
        return Settings(
            **{**values_of(w), **chosen},
            enable_expert_parallel=ep,
            layer_partition=partition,
            draft_spec=w.draft_spec,
            chunked_local_attn_hybrid_kv=chunked_local_attn_hybrid_kv(w.extra_env),
            estimate_cudagraphs=estimate_cudagraphs(w.extra_env),
        )

    def _estimate(
        self,
        devices: list[Device],
        tp: int,
        pp: int,
        dp: int = 1,
        ep: bool = False,
        partition: list[int] | None = None,
        nvlink: bool = True,
    ) -> Estimate:
        key = (tuple(devices), tp, pp, dp, ep, tuple(partition or ()), nvlink)
        if key in self._cache:
            return self._cache[key]
        est = estimate(
            self.spec, devices[0], self._settings(tp, pp, dp, ep, partition), devices_per_stage=devices, nvlink=nvlink
        )
        if (
            not est.fits
            and self.wishes.max_model_len is None
            and est.max_model_len_fit >= 1024
            and "max_model_len" in est.reason
        ):
            # Nobody asked for the model's full context: serve the longest that fits.
            fitted = est.max_model_len_fit // 1024 * 1024
            lowered = estimate(
                self.spec,
                devices[0],
                self._settings(tp, pp, dp, ep, partition, fitted),
                devices_per_stage=devices,
                nvlink=nvlink,
            )
            if lowered.fits:
                lowered.notes.append(
                    f"max_model_len lowered from {est.max_model_len} to {fitted} so one full-length request fits"
                )
                est = lowered
        self._cache[key] = est
        return est

    def _reject(
        self, kind: str, tp: int, pp: int, reason: str, dp: int = 1, ep: bool = False, nodes: list[str] | None = None
    ) -> None:
        layout = f"{kind}: TP={tp} PP={pp}" + (f" DP={dp}" if dp > 1 else "") + (" EP" if ep else "")
        self.rejected.append(
            {
                "layout": layout,
                "strategy": kind,
                "tensor_parallel_size": tp,
                "pipeline_parallel_size": pp,
                "data_parallel_size": dp,
                "enable_expert_parallel": ep,
                "nodes": nodes or [],
                "reason": reason,
            }
        )

    # -- candidates --------------------------------------------------------

    def _forced(self, tp: int, pp: int) -> bool:
        w = self.wishes
        return (w.tensor_parallel_size in (None, tp)) and (w.pipeline_parallel_size in (None, pp))

    def _tp_options(self, group: list[Node]) -> list[int]:
        per_node = min(n.gpu_count for n in group)
        heads = self.spec.num_attention_heads
        options = []
        for tp in range(1, per_node + 1):
            if tp & (tp - 1) and tp not in (3, 6, 12) and tp != per_node:
                continue
            if heads % tp:
                self._reject(
                    "replicas",
                    tp,
                    1,
                    f"TP={tp} rejected: {heads} attention heads not divisible by {tp}",
                    nodes=[group[0].name],
                )
                continue
            kv = self.spec.num_kv_heads
            if not kv_heads_shard(self.spec, tp):
                self._reject("replicas", tp, 1, f"TP={tp} rejected: neither divides nor is a multiple of {kv} KV heads")
                continue
            options.append(tp)
        return options

    def single_node(self) -> None:
        if not self.wishes.allows("replicas"):
            return
        for group in self.groups.values():
            dev = group[0].device()
            per_node = min(n.gpu_count for n in group)
            for tp in self._tp_options(group):
                for pp in (1, 2, 4, 8):
                    if tp * pp > per_node or pp > self.spec.num_layers or not self._forced(tp, pp):
                        continue
                    if pp > 1 and not self.wishes.allows("pp"):
                        continue
                    est = self._estimate([dev] * pp, tp, pp, nvlink=group[0].nvlink)
                    if not est.fits:
                        self._reject("replicas", tp, pp, f"on {dev.name}: {est.reason}", nodes=[n.name for n in group])
                        continue
                    instances = []
                    for node in group:
                        for _ in range(node.gpu_count // (tp * pp)):
                            instances.append([(node, tp)] * pp)
                    self.candidates.append(
                        Candidate("replicas", tp, pp, 1, False, instances, [est] * len(instances), 0)
                    )
                    break  # within a node, PP only when TP alone does not fit

    def multi_node_pp(self) -> None:
        if not self.wishes.allows("pp"):
            return
        for group in self.groups.values():
            if len(group) < 2:
                continue
            dev = group[0].device()
            per_node = min(n.gpu_count for n in group)
            tps = [t for t in self._tp_options(group) if t == per_node or self.wishes.tensor_parallel_size == t]
            for tp in tps:
                for k in range(2, min(len(group), MAX_PP_STAGES, self.spec.num_layers) + 1):
                    if not self._forced(tp, k):
                        continue
                    est = self._estimate([dev] * k, tp, k, nvlink=group[0].nvlink)
                    if not est.fits:
                        self._reject("pp", tp, k, f"across {k} {dev.name} nodes: {est.reason}")
                        continue
                    instances = [[(node, tp) for node in group[i : i + k]] for i in range(0, len(group) - k + 1, k)]
                    self.candidates.append(Candidate("pp", tp, k, 1, False, instances, [est] * len(instances), k - 1))
                    break

    def mixed_pp(self) -> None:
        """One stage per GPU type; layers balanced so every stage keeps the most KV."""
        if len(self.groups) < 2 or not self.wishes.allows("pp"):
            return
        groups = sorted(self.groups.values(), key=lambda g: -g[0].gpu_memory_gib)
        count = min(len(g) for g in groups)
        stages_nodes = [[g[i] for g in groups] for i in range(count)]
        first = stages_nodes[0]
        tp = min(n.gpu_count for n in first)
        pp = len(first)
        if self.spec.num_attention_heads % tp:
            self._reject("pp_mixed", tp, pp, f"TP={tp} rejected: {self.spec.num_attention_heads} heads not divisible")
            return
        if not kv_heads_shard(self.spec, tp):
            self._reject("pp_mixed", tp, pp, f"TP={tp} rejected: does not shard {self.spec.num_kv_heads} KV heads")
            return
        if not self._forced(tp, pp):
            return
        devices = [n.device() for n in first]
        partition = self.balanced_partition(devices, tp)
        if partition is None:
            self._reject(
                "pp_mixed", tp, pp, "no layer split leaves KV cache room on every stage", nodes=[n.name for n in first]
            )
            return
        est = self._estimate(devices, tp, pp, partition=partition, nvlink=False)
        if not est.fits:
            self._reject(
                "pp_mixed", tp, pp, f"with layer partition {partition}: {est.reason}", nodes=[n.name for n in first]
            )
            return
        even = self._estimate(devices, tp, pp, nvlink=False)
        if even.fits and even.kv_cache_tokens >= est.kv_cache_tokens:
            partition, est = even.layer_partition, even
        notes: tuple[str, ...] = ()
        if even.kv_cache_tokens < est.kv_cache_tokens:
            notes = (
                f"mixed GPUs: vLLM gives every rank the smallest rank's KV block count; the even split "
                f"{even.layer_partition} would hold {even.kv_cache_tokens:,} tokens, the balanced split "
                f"{partition} holds {est.kv_cache_tokens:,}",
            )
        instances = [[(node, tp) for node in stage] for stage in stages_nodes]
        self.candidates.append(
            Candidate(
                "pp_mixed", tp, pp, 1, False, instances, [est] * len(instances), pp - 1, partition, warnings=notes
            )
        )

    def balanced_partition(self, devices: list[Device], tp: int) -> list[int] | None:
        """Layer counts per stage that maximise the smallest stage's KV blocks."""
        layers = self.spec.num_layers
        pp = len(devices)
        probe = self._estimate(devices, tp, pp, nvlink=False)
        # Per-stage fixed bytes (non-layer) and per-layer weight/KV bytes, from the even split.
        fixed, per_layer_w, per_layer_kv = [], [], []
        for stage in range(pp):
            rank = next(r for r in probe.ranks if r.pp_stage == stage)
            n = rank.layers[1] - rank.layers[0]
            layer_w = self._layer_weight_bytes(devices, tp, stage, n)
            fixed.append(rank.budget_gib * GIB - rank.available_kv_gib * GIB - layer_w * n)
            per_layer_w.append(layer_w)
            per_layer_kv.append(rank.kv_bytes_per_token / max(n, 1) * probe.block_size)
        budgets = [next(r for r in probe.ranks if r.pp_stage == s).budget_gib * GIB for s in range(pp)]

        def counts(blocks: float) -> list[int]:
            return [
                max(0, int((budgets[s] - fixed[s]) // (per_layer_w[s] + blocks * per_layer_kv[s]))) for s in range(pp)
            ]

        lo, hi = 0.0, 1.0
        while sum(counts(hi)) >= layers and hi < 1e9:
            hi *= 2
        if sum(counts(lo)) < layers:
            return None
        for _ in range(60):
            mid = (lo + hi) / 2
            if sum(counts(mid)) >= layers:
                lo = mid
            else:
                hi = mid
        parts = counts(lo)
        # Trim the surplus from the stages with the most layers; every stage keeps one.
        while sum(parts) > layers:
            i = max(range(pp), key=lambda s: parts[s])
            parts[i] -= 1
        if min(parts) < 1:
            return None
        return parts

    def _layer_weight_bytes(self, devices: list[Device], tp: int, stage: int, n: int) -> float:
        if n <= 0:
            return 0.0
        one = estimate(self.spec, devices[stage], self._settings(tp, 1))
        whole = one.weights_gib * GIB
        embed_head = self.spec.vocab_size * self.spec.hidden_size * 2 * 2 / tp
        return max(whole - embed_head, 0.0) / self.spec.num_layers

    def mixed_instances(self) -> None:
        """Independent instances on every GPU type at once (behind the gateway)."""
        if len(self.groups) < 2:
            return
        per_group: list[Candidate] = []
        for key in self.groups:
            best = [c for c in self.candidates if c.kind == "replicas" and c.instances[0][0][0].gpu_key == key]
            if not best:
                return
            per_group.append(max(best, key=lambda c: c.score(None)))
        instances = [inst for c in per_group for inst in c.instances]
        estimates = [e for c in per_group for e in c.estimates]
        label = "instances: " + " + ".join(
            f"{len(c.instances)} x {c.instances[0][0][0].gpu} TP={c.tp} PP={c.pp}" for c in per_group
        )
        cand = Candidate(
            "instances",
            max(c.tp for c in per_group),
            max(c.pp for c in per_group),
            1,
            False,
            instances,
            estimates,
            0,
            label=label,
        )
        self.candidates.append(cand)

    def dp_ep(self) -> None:
        if not self.spec.is_moe or not self.wishes.allows("dp_ep"):
            return
        if self.wishes.tensor_parallel_size not in (None, 1) or self.wishes.pipeline_parallel_size not in (None, 1):
            return
        for group in self.groups.values():
            dev = group[0].device()
            per_node = min(n.gpu_count for n in group)
            # The smallest node count whose DP x EP group fits; EP never exceeds the experts.
            nodes_used = 1
            while nodes_used <= len(group):
                gpus = per_node * nodes_used
                if gpus > self.spec.num_experts:
                    break
                if gpus >= 2:
                    est = self._estimate([dev], 1, 1, dp=gpus, ep=True, nvlink=group[0].nvlink)
                    if est.fits:
                        count = len(group) // nodes_used
                        instances = [
                            [(node, per_node) for node in group[i * nodes_used : (i + 1) * nodes_used]]
                            for i in range(count)
                        ]
                        self.candidates.append(
                            Candidate("dp_ep", 1, 1, gpus, True, instances, [est] * len(instances), nodes_used - 1)
                        )
                        break
                    self._reject("dp_ep", 1, 1, f"on {gpus} {dev.name}: {est.reason}", dp=gpus, ep=True)
                nodes_used *= 2

    def dense_dp(self) -> None:
        """DP ranks of a dense model (each rank a whole copy, TP=1), only when asked."""
        dp = self.wishes.data_parallel_size
        if not dp or dp < 2 or self.spec.is_moe:
            return
        for group in self.groups.values():
            dev = group[0].device()
            per_node = min(n.gpu_count for n in group)
            if dp % per_node and dp > per_node:
                self._reject("dp", 1, 1, f"DP={dp} is not a multiple of the {per_node} GPUs per node", dp=dp)
                continue
            nodes_used = max(1, dp // per_node)
            if nodes_used > len(group):
                self._reject("dp", 1, 1, f"DP={dp} needs {nodes_used} {dev.name} nodes, {len(group)} exist", dp=dp)
                continue
            est = self._estimate([dev], 1, 1, dp=dp, ep=False, nvlink=group[0].nvlink)
            if not est.fits:
                self._reject("dp", 1, 1, f"on {dp} {dev.name}: {est.reason}", dp=dp)
                continue
            local = min(per_node, dp)
            instances = [[(node, local) for node in group[:nodes_used]]]
            self.candidates.append(Candidate("dp", 1, 1, dp, False, instances, [est], nodes_used - 1))

    def cross_node_tp(self) -> None:
        for group in self.groups.values():
            if len(group) < 2:
                continue
            per_node = min(n.gpu_count for n in group)
            tp = per_node * 2
            if not self.wishes.allow_cross_node_tp:
                if self.wishes.tensor_parallel_size and self.wishes.tensor_parallel_size > per_node:
                    self._reject(
                        "tp_cross_node",
                        self.wishes.tensor_parallel_size,
                        1,
                        f"TP={self.wishes.tensor_parallel_size} exceeds the {per_node} GPUs of a node; "
                        "pass --allow-cross-node-tp to span nodes with TP",
                    )
                continue
            if self.spec.num_attention_heads % tp or not kv_heads_shard(self.spec, tp) or not self._forced(tp, 1):
                continue
            # No peer-to-peer access across nodes: CustomAllreduce turns itself off there.
            dev = replace(group[0].device(), p2p=False)
            est = self._estimate([dev], tp, 1, nvlink=False)
            if not est.fits:
                self._reject("tp_cross_node", tp, 1, est.reason)
                continue
            nic = min(n.nic_gbps for n in group[:2])
            # Two all-reduces of hidden x 2 bytes per layer per token; ring moves 2(n-1)/n of it.
            per_token = 2 * self.spec.num_layers * self.spec.hidden_size * 2 * 2 * (tp - 1) / tp
            ms = per_token * 8192 / (nic * 1e9 / 8) * 1000
            self.warnings.append(
                f"TP={tp} across nodes all-reduces ~{per_token / 1e6:.1f} MB per token over {nic:g} Gb/s links "
                f"(~{ms:.0f} ms per 8K-token prefill batch); prefer PP across nodes"
            )
            instances = [[(node, per_node) for node in group[i : i + 2]] for i in range(0, len(group) - 1, 2)]
            self.candidates.append(
                Candidate("tp_cross_node", tp, 1, 1, False, instances, [est] * len(instances), 10 * len(group[:2]))
            )

    def check_types(self) -> None:
        if self.wishes.tensor_parallel_size and len(self.groups) > 1:
            tp = self.wishes.tensor_parallel_size
            if all(tp > min(n.gpu_count for n in g) for g in self.groups.values()):
                self._reject("tp", tp, 1, "TP never mixes GPU types; no single GPU type has that many GPUs in a node")

    def run(self) -> Candidate:
        self.check_types()
        self.single_node()
        self.multi_node_pp()
        self.mixed_pp()
        self.mixed_instances()
        self.dp_ep()
        self.dense_dp()
        self.cross_node_tp()
        if self.wishes.data_parallel_size and self.wishes.data_parallel_size > 1:
            forced = [c for c in self.candidates if c.dp == self.wishes.data_parallel_size]
            if not forced:
                dp_reasons = [r["reason"] for r in self.rejected if r.get("layout", "").startswith("dp")]
                total = sum(n.gpu_count for n in self.nodes)
                raise PlanError(
                    "vllm_fleet_data_parallel_size",
                    f"DP={self.wishes.data_parallel_size} cannot run: "
                    + (dp_reasons[-1] if dp_reasons else "no DP layout was possible"),
                    f"use a DP size of nodes x GPUs per node of one GPU type (at most {total} here), or unset it",
                )
            for other in [c for c in self.candidates if c not in forced]:
                self._reject(
                    other.kind, other.tp, other.pp, f"data_parallel_size={self.wishes.data_parallel_size} asked"
                )
            self.candidates = forced
        if not self.candidates:
            asked = self._forced_layout()
            if asked:
                raise NothingFitsError(
                    "model",
                    f"no layout of {self.spec.name} honours {asked[0]} on these nodes{asked[1]}",
                    "drop it and let the planner choose",
                )
            free = [r for r in self.rejected if "is free after" in r["reason"]]
            if free and not any("exceed" in r["reason"] or "KV cache holds" in r["reason"] for r in self.rejected):
                # Every layout that fits in memory is refused by vLLM's request_memory: the GPUs'
                # free memory (gpu_facts, or the inventory's gpu_free_gib) is below the budget.
                # The layout with the fewest GPUs per stage needs the least NCCL memory beside the budget.
                least = min(free, key=lambda r: r["tensor_parallel_size"] * r["pipeline_parallel_size"])
                raise DoesNotFitError(
                    "gpu_memory_utilization",
                    f"no layout of {self.spec.name} starts on these GPUs: {least['layout']}: {least['reason']}",
                    "lower gpu_memory_utilization as said, or stop what else holds the GPUs' memory (nvidia-smi)",
                )
            raise DoesNotFitError("model", self._nothing_fits(), self._what_would_fit())
        target = self.wishes.target_concurrency
        ranking = rank(self.candidates, self.evaluator, target, self.slo)
        best = ranking.best
        for other in ranking.order[1:]:
            self._reject(
                other.kind,
                other.tp,
                other.pp,
                ranking.reasons[id(other)],
                dp=other.dp,
                ep=other.ep,
                nodes=sorted({n.name for inst in other.instances for n, _ in inst}),
            )
            self.rejected[-1]["performance"] = ranking.perfs[id(other)].to_dict()
        self.ranking = ranking
        self.warnings.extend(best.warnings)
        self.warnings.extend(ranking.warnings)
        if target and sum(e.max_concurrency * max(e.data_parallel_size, 1) for e in best.estimates) < target:
            self.warnings.append(
                f"no layout reaches the target concurrency {target}; the best gives "
                f"{sum(e.max_concurrency for e in best.estimates):.1f}"
            )
        return best

    def _nothing_fits(self) -> str:
        fit = [r for r in self.rejected if "exceed" in r["reason"] or "KV cache holds" in r["reason"]]
        if fit:
            return f"no layout fits {self.spec.name}; closest: {fit[-1]['layout']}: {fit[-1]['reason']}"
        if self.rejected:
            return f"no layout fits {self.spec.name}; e.g. {self.rejected[-1]['layout']}: {self.rejected[-1]['reason']}"
        return f"no layout of {self.spec.name} is possible on these nodes"

    def _forced_layout(self) -> tuple[str, str] | None:
        """(the forced flags, why) when no layout failed for memory: then the forced sizes
        or strategies are what stands in the way, not max_model_len or fp8."""
        memory = ("exceed", "KV cache holds", "is free after", "no layer split leaves KV")
        if any(any(m in r["reason"] for m in memory) for r in self.rejected):
            return None
        w = self.wishes
        forced = [
            flag
            for flag, value in (
                (f"--tensor-parallel-size {w.tensor_parallel_size}", w.tensor_parallel_size),
                (f"--pipeline-parallel-size {w.pipeline_parallel_size}", w.pipeline_parallel_size),
                ("--strategy " + " --strategy ".join(w.strategies or ()), w.strategies),
            )
            if value
        ]
        if not forced:
            return None
        why = ""
        if w.strategies and set(w.strategies) <= {"dp_ep"} and not self.spec.is_moe:
            why = f"; dp_ep needs a MoE model and {self.spec.name} is dense"
        elif w.pipeline_parallel_size:
            why = (
                "; inside one node PP is 2, 4 or 8 stages, across nodes one stage per node of one GPU type "
                f"(PP={w.pipeline_parallel_size} needs {w.pipeline_parallel_size} such nodes)"
            )
        return " and ".join(forced), why

    def _what_would_fit(self) -> str:
        hints = []
        biggest = max(self.nodes, key=lambda n: n.gpu_memory_gib * n.gpu_count)
        dev = biggest.device()
        tp = max(t for t in valid_tps(self.spec, biggest.gpu_count))
        base = estimate(self.spec, dev, self._settings(tp, 1))
        if 256 <= base.max_model_len_fit < base.max_model_len and base.ranks[0].available_kv_gib > 0 and not base.fits:
            hints.append(f"--max-model-len {base.max_model_len_fit // 256 * 256} on one {dev.name} node")
        if not self.wishes.quantization and self.spec.quant is None:
            q = estimate(self.spec, dev, replace(self._settings(tp, 1), quantization="fp8"))
            if q.fits:
                hints.append(f"fp8 weights (--quantization fp8) on one {dev.name} node with TP={tp}")
        per_gpu_need = base.weights_gib * tp
        usable = dev.total_gib * base.gpu_memory_utilization * 0.75
        gpus = int(per_gpu_need / usable) + 1 if usable > 0 else 0
        hints.append(f"about {max(gpus, 2)} GPUs of {dev.total_gib:.0f} GiB for the weights plus KV cache")
        return "; or ".join(hints)


def plan_cluster(spec: ModelSpec, nodes: list[Node], wishes: Wishes | None = None) -> dict[str, Any]:
    """Plan ``spec`` on ``nodes``; the dict is what ``plan --json`` prints."""
    wishes = wishes or Wishes()
    check_wishes(spec, nodes, wishes)
    if wishes.speculative_config and wishes.draft_spec is None:
        wishes = replace(wishes, draft_spec=draft_spec_for(dict(wishes.speculative_config)))
    usable, refused = nodes_vllm_runs_on(spec, nodes, wishes)
    planner = _Planner(spec, usable, wishes)
    if refused:
        planner.warnings.append(f"left out {', '.join(refused)}: {refused[next(iter(refused))]}")
    long_len = check_max_model_len(spec, wishes.max_model_len, wishes.extra_env) if wishes.max_model_len else None
    if long_len:
        planner.warnings.append(long_len)
    replaced = check_quantization_flag(
        spec, wishes.quantization, rendered=True, vllm_version=wishes.vllm_version, extra_args=wishes.extra_args
    ).note
    if replaced:
        planner.warnings.append(replaced)
    best = planner.run()
    for est in {id(e): e for e in best.estimates}.values():
        if not wishes.max_model_len:  # the planner's own length (vLLM's default, or lowered to fit)
            note = check_max_model_len(spec, est.max_model_len, wishes.extra_env, asked=False)
            if note and note not in planner.warnings:
                planner.warnings.append(note)
    unknown_release = check_release(wishes.vllm_version)
    if unknown_release:
        planner.warnings.append(unknown_release)
    used: dict[str, int] = {}
    ports: dict[str, int] = {}
    memory: dict[int, dict[str, Any]] = {}
    ranking = planner.ranking
    assert ranking is not None
    predictions = ranking.perfs[id(best)].predictions
    instances = [
        instance_dict(planner.spec, planner.wishes, best, i, est, inst, used, ports, memory)
        for i, (est, inst) in enumerate(zip(best.estimates, best.instances, strict=True))
    ]
    shown: dict[int, dict[str, Any]] = {}  # one dict per distinct prediction, as memory
    loads: dict[int, dict[str, Any]] = {}  # verify's load, per distinct instance
    for inst_dict, pred, perf in zip(instances, predictions, ranking.perfs[id(best)].instances, strict=True):
        if id(pred) not in shown:
            shown[id(pred)] = pred.to_dict()
            if id(perf) not in loads:
                loads[id(perf)] = verify_load(perf, planner.workload, int(inst_dict["max_model_len"]))
            shown[id(pred)]["verify"] = loads[id(perf)]
            shown[id(pred)]["slo_capacity"] = round(perf.capacity, 4)  # requests/s within the SLO
        inst_dict["performance"] = shown[id(pred)]
    last_port = max(i["port"] for i in instances)
    if last_port > 65535:
        crowded = max(ports, key=lambda n: ports[n])
        raise PlanError(
            "vllm_fleet_port",
            f"{wishes.port} + {ports[crowded]} instances on {crowded} needs ports up to {last_port}, above 65535",
            f"use a first port of at most {65536 - ports[crowded]}",
        )
    gpus_used = sum(g for inst in best.instances for _, g in inst)
    total_gpus = sum(n.gpu_count for n in nodes)
    cluster_perf = ranking.perfs[id(best)]
    summary = (
        f"{best.layout}, {gpus_used}/{total_gpus} GPUs used, "
        f"{sum(i['memory']['kv_cache_tokens'] for i in instances):,} KV tokens in all, "
        f"predicted {cluster_perf.output_token_throughput:,.0f} output tok/s"
    )
    return {
        "model": spec.name,
        "model_source": spec.source,
        "vllm_version": wishes.vllm_version,
        "summary": summary,
        "strategy": best.kind,
        "cluster": {"nodes": len(nodes), "gpus": total_gpus, "gpu_types": sorted({n.gpu for n in nodes})},
        "nodes": [
            {"name": n.name, "gpu": n.gpu, "gpu_count": n.gpu_count, "address": n.address, "interface": n.interface}
            for n in nodes
        ],
        "instances": instances,
        "gateway": {
            "enabled": len(instances) > 1,
            "strategy": "least_conn",
            "upstreams": [i["endpoint"] for i in instances],
        },
        "warnings": planner.warnings,
        "rejected": planner.rejected,
        "performance": _plan_performance(planner, best),
        "ranking": RANKING,
    }


RANKING = (
    "fits > meets target concurrency > keeps the model's max_model_len > predicted goodput (requests/s within "
    "the SLO; within 2 % counts as equal) > fewer GPUs > fewer cross-node hops > fewer pipeline stages > "
    "more KV tokens"
)


def _plan_performance(planner: _Planner, best: Candidate) -> dict[str, Any]:
    """The cluster's predicted service, and what it was predicted for."""
    ranking = planner.ranking
    assert ranking is not None
    perf = ranking.perfs[id(best)]
    slo = planner.slo
    return {
        **perf.to_dict(),
        "workload": planner.workload.to_dict(),
        "workload_text": planner.workload.describe(),
        "slo": {"ttft_p90_ms": slo.bound().ttft_p90_ms, "tpot_p90_ms": slo.bound().tpot_p90_ms},
        "slo_asked": slo.asked,
        "ranked_by": "throughput (no layout meets the SLO)" if ranking.by_throughput else "goodput",
    }
