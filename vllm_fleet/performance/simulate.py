"""A benchmark run (``vllm bench throughput``, ``vllm bench serve`` at a rate or with
``--max-concurrency``): vLLM's scheduler simulated request by request.

A finite run is not a steady state: the first steps are all prompts, and the run ends with
the longest outputs decoding almost alone, which with chat-like lengths costs a large share of
the run. The simulation follows vLLM V1's scheduler: each step first gives every running
sequence its token, then fills the token budget with waiting prompts in arrival order (a
prompt may span steps: chunked prefill), admitting a request while ``max_num_seqs`` and the KV
cache (its prompt's blocks) allow. When the running sequences' KV outgrows the cache, the
newest are preempted (V1 recomputes them): back to the front of the queue, their prompt and
generated tokens computed again once readmitted. Between two events (a prompt done, a request
ended, the cache full) the batch is constant, so the run costs one step evaluation per event.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from vllm_fleet.performance.costs import StepCost, StepModel
from vllm_fleet.performance.workload import Workload

GOLDEN = 0.6180339887498949


@dataclass
class _Request:
    prompt: float  # prompt tokens still to compute
    held: float  # KV tokens held
    left: int  # tokens still to generate
    out: int
    sent: float = 0.0
    first: float = -1.0  # time of its first token
    end: float = 0.0


@dataclass(frozen=True)
class RunResult:
    duration: float
    ttft: list[float]  # seconds from sending to the first token, one per request
    tpot: list[float]
    itl: list[tuple[float, float]]  # (step time, tokens produced at that step time)
    mean_batch: float
    decode: StepCost | None
    mixed: StepCost | None
    output_tokens: int
    preemptions: int = 0


def _requests(w: Workload, n: int) -> list[_Request]:
    """``n`` requests whose lengths are ``w``'s quantiles, in a mixed (low-discrepancy) order,
    with their send times for a rate (Poisson gaps at the same quantiles)."""
    out = []
    sent = 0.0
    for k in range(n):
        q = min(max((k * GOLDEN) % 1.0, 0.5 / n), 1 - 0.5 / n)
        prompt = w.quantile(w.input_len, q) * (1 - w.prefix_hit)
        length = max(1, round(w.quantile(w.output_len, (q * 7.0 + 0.31) % 1.0)))
        if w.request_rate:
            gap_q = min(max(((k + 1) * 0.7548776662466927) % 1.0, 0.5 / n), 1 - 0.5 / n)
            sent += -math.log(1 - gap_q) / w.request_rate
        out.append(_Request(max(prompt, 1.0), 0.0, length, length, sent if w.request_rate else 0.0))
    return out


def simulate(
    model: StepModel, w: Workload, n: int, kv_tokens: int, max_seqs: int, budget: int, clients: int | None = None
) -> RunResult:
    """One DP rank's run of ``n`` requests: all sent at once, at ``w``'s rate, or by ``clients``
    (each sends its next request when its last one ends, as vllm bench serve --max-concurrency)."""
    pending = _requests(w, n)  # not yet sent (clients) or not yet arrived (rate)
    if clients is not None:
        for r in pending[:clients]:
            r.sent = 0.0
    queue: list[_Request] = []  # sent, waiting for the scheduler
    free_clients = clients
    prefix = w.input_len * w.prefix_hit
    running: list[_Request] = []  # admitted; those with prompt > 0 still prefill
    now = 0.0
    done: list[_Request] = []
    itl: list[tuple[float, float]] = []
    batch_time = 0.0
    decode_cost = mixed_cost = None
    pp = model.pp
    guard = 0
    preemptions = 0

    def arrive() -> None:
        nonlocal free_clients
        while pending:
            if clients is not None:
                if not free_clients:
                    return
                free_clients -= 1
                pending[0].sent = now
            elif pending[0].sent > now:
                return
            queue.append(pending.pop(0))

    while (pending or queue or running) and guard < 40 * n + 10_000:
        guard += 1
        arrive()
        if not queue and not running:
            now = max(now, pending[0].sent)
            continue
        decoding = [r for r in running if r.prompt <= 0]
        room = float(budget - len(decoding))
        prefill = 0.0
        finishing: list[_Request] = []
        for r in running:
            if r.prompt > 0 and room > 0:
                take = min(r.prompt, room)
                r.prompt -= take
                room -= take
                prefill += take
                if r.prompt <= 0:
                    finishing.append(r)
        used = sum(r.held for r in running)
        while queue and room > 0 and len(running) < max_seqs:
            nxt = queue[0]
            need = nxt.prompt + prefix
            if used + need > kv_tokens and running:
                break
            queue.pop(0)
            running.append(nxt)
            nxt.held = need
            used += need
            take = min(nxt.prompt, room)
            nxt.prompt -= take
            room -= take
            prefill += take
            if nxt.prompt <= 0:
                finishing.append(nxt)
        ctx = sum(r.held for r in decoding) / len(decoding) if decoding else 0.0
        cost = model.step(len(decoding) / pp, prefill / pp if pp > 1 else prefill, ctx, prefix if prefill else 0.0)
        if prefill:
            mixed_cost = cost
        else:
            decode_cost = cost
        steps = 1
        if not prefill and not finishing and decoding and not any(r.prompt > 0 for r in running):
            # Nothing changes the batch until the next end, or the next arrival that can be admitted.
            steps = min(r.left for r in decoding)
            admissible = len(running) < max_seqs and used < kv_tokens
            if queue and admissible:
                steps = 1
            elif pending and clients is None and admissible:
                steps = min(steps, max(1, math.ceil((pending[0].sent - now) / cost.total)))
            # The batch's KV grows a token a sequence a step: stop where the cache fills.
            steps = max(1, min(steps, int((kv_tokens - used) // len(decoding))))
        now += cost.total * steps
        batch_time += len(decoding) * cost.total * steps
        if decoding:
            itl.append((cost.total, float(len(decoding) * steps)))
        for r in decoding:
            r.left -= steps
            r.held += steps
        for r in finishing:
            if r.first < 0:  # a preempted request's recompute produces no first token again
                r.first = now
            r.left -= 1
            r.held += 1
        for r in [r for r in running if r.prompt <= 0 and r.left <= 0]:
            r.end = now
            running.remove(r)
            done.append(r)
            if free_clients is not None:
                free_clients += 1
        # A full cache preempts the newest requests (vLLM V1: recompute): they go back to the
        # front of the queue and compute their prompt and tokens again when readmitted.
        used = sum(r.held for r in running)
        while used > kv_tokens and len(running) > 1:
            victim = running.pop()
            used -= victim.held
            victim.prompt, victim.held = max(victim.held - prefix, 1.0), 0.0
            queue.insert(0, victim)
            preemptions += 1
    ttft = [r.first - r.sent + model.request_overhead for r in done]
    tpot = [(r.end - r.first) / (r.out - 1) for r in done if r.out > 1]
    start = min((r.sent for r in done), default=0.0)
    span = now - start
    tokens = sum(r.out for r in done)
    return RunResult(
        span, ttft, tpot, itl, batch_time / span if span else 0.0, decode_cost, mixed_cost, tokens, preemptions
    )


def quantiles(values: list[float], weights: list[float] | None = None) -> tuple[float, float, float, float]:
    """(mean, median, p90, p99) of ``values`` (weighted when ``weights`` are given)."""
    if not values:
        return (0.0, 0.0, 0.0, 0.0)
    pairs = sorted(zip(values, weights or [1.0] * len(values), strict=True))
    total = sum(w for _, w in pairs)
    mean = sum(v * w for v, w in pairs) / total if total else 0.0

    def at(q: float) -> float:
        acc = 0.0
        for v, w in pairs:
            acc += w
            if acc >= q * total - 1e-9:
                return v
        return pairs[-1][0]

    return (mean, at(0.5), at(0.9), at(0.99)) if not math.isnan(mean) else (0.0, 0.0, 0.0, 0.0)
