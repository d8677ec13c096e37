"""The candidate layouts in order, by what they are predicted to serve.

The order, first difference wins:

1. the target concurrency (``target_concurrency``, a hard constraint) is met;
2. the model's context length is kept: a layout that fits only with ``max_model_len`` lowered
   comes after every layout that holds the full length;
3. goodput: requests/s meeting the SLO (planning/perf.py), the asked SLO or the default
   interactivity bound; goodputs within :data:`TIE` of the best count as equal;
4. among equals: fewer GPUs, then fewer cross-node hops, then fewer pipeline stages, then more
   KV cache.

When no layout meets the SLO at any load, goodput is 0 everywhere and layouts are ranked by
the throughput they reach at saturation instead, with a warning.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm_fleet.performance.workload import Slo
from vllm_fleet.planning.instances import Candidate
from vllm_fleet.planning.perf import ClusterPerf, Evaluator

TIE = 0.02


@dataclass
class Ranking:
    order: list[Candidate]
    perfs: dict[int, ClusterPerf]
    reasons: dict[int, str]  # why each candidate after the first lost
    warnings: list[str] = field(default_factory=list)
    by_throughput: bool = False  # no layout met the SLO

    @property
    def best(self) -> Candidate:
        return self.order[0]


def _kv(c: Candidate) -> int:
    return sum(e.kv_cache_tokens * max(e.data_parallel_size, 1) for e in c.estimates)


def _concurrency(c: Candidate) -> float:
    return sum(e.max_concurrency * max(e.data_parallel_size, 1) for e in c.estimates)


def _shown(c: Candidate, perf: ClusterPerf, by_throughput: bool) -> str:
    what = f"{perf.output_token_throughput:,.0f} tok/s"
    if not by_throughput:
        what += f", {perf.goodput:.2f} req/s within the SLO"
    return f"{c.layout}: {what}"


def rank(candidates: list[Candidate], evaluator: Evaluator, target: int | None, slo: Slo) -> Ranking:
    """``candidates`` (all fitting) in the order above, each loser with its reason."""
    perfs = {id(c): evaluator.cluster(c.estimates, c.instances) for c in candidates}
    full = max(e.max_model_len for c in candidates for e in c.estimates)
    by_throughput = all(perfs[id(c)].goodput <= 0 for c in candidates)

    def served(c: Candidate) -> float:
        p = perfs[id(c)]
        return p.request_throughput if by_throughput else p.goodput

    def meets(c: Candidate) -> bool:
        return target is None or _concurrency(c) >= target

    def keeps(c: Candidate) -> bool:
        return all(e.max_model_len >= full for e in c.estimates)

    def gpus(c: Candidate) -> int:
        return perfs[id(c)].gpus

    top = sorted(candidates, key=lambda c: (meets(c), keeps(c), served(c)), reverse=True)
    lead = top[0]
    tied = [
        c for c in top if (meets(c), keeps(c)) == (meets(lead), keeps(lead)) and served(c) >= served(lead) * (1 - TIE)
    ]
    tied.sort(key=lambda c: (gpus(c), c.hops, c.pp, -_kv(c)))
    best = tied[0]
    order = [best] + [c for c in top if c is not best]
    reasons: dict[int, str] = {}
    chosen = _shown(best, perfs[id(best)], by_throughput)
    for c in order[1:]:
        if meets(c) != meets(best):
            why = f"{best.layout} meets the target concurrency {target}"
        elif keeps(c) != keeps(best):
            lowest = min(e.max_model_len for e in c.estimates)
            why = f"it needs max_model_len lowered to {lowest:,}; {best.layout} keeps {full:,}"
        elif c in tied:
            if gpus(c) != gpus(best):
                on = f"on {gpus(c)} GPUs, not {gpus(best)}"
            elif c.hops != best.hops:
                on = f"with {c.hops} cross-node hop(s), not {best.hops}"
            elif c.pp != best.pp:
                on = f"with {c.pp} pipeline stages, not {best.pp}"
            else:
                on = f"with {_kv(c):,} KV tokens, not {_kv(best):,}"
            why = f"predicts the same within {TIE:.0%} ({_shown(c, perfs[id(c)], by_throughput)}) {on}"
        else:
            why = f"predicts less: {_shown(c, perfs[id(c)], by_throughput)}; chosen {chosen}"
        reasons[id(c)] = f"fits, but {why}"
    warnings = []
    if by_throughput:
        bound = slo.bound()
        warnings.append(
            f"no layout meets {bound.describe()} at any load on these nodes; layouts ranked by throughput "
            "at saturation instead"
        )
    if not keeps(best):
        lowest = min(e.max_model_len for e in best.estimates)
        keeper = next((c for c in order if keeps(c)), None)
        warnings.append(
            f"max_model_len lowered from {full:,} to {lowest:,} on {best.layout} so one request fits"
            + (f"; {keeper.layout} keeps it but does not meet the target concurrency" if keeper else
               "; no layout on these nodes holds the model's full length (more or larger GPUs, fp8 weights "
               "or an fp8 KV cache would)")
        )  # fmt: skip
    return Ranking(order, perfs, reasons, warnings, by_throughput)
