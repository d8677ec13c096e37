"""What one instance serves: a benchmark run simulated request by request (simulate.py:
estimate, verify), and vLLM's scheduler in steady state with a queueing model for online load
(the closed forms the layouts are ranked by).

vLLM V1's scheduler runs every admitted sequence one token per step and fills the rest of the
step's ``max_num_batched_tokens`` with prompt chunks. In steady state a running batch of B
sequences takes in B x input/output prompt tokens per step (one request ends every output
steps), so B is bounded by:

* ``max_num_seqs``;
* the KV cache: a sequence holds input + output/2 tokens on average (whole blocks);
* the token budget: B x (1 + input/output) <= ``max_num_batched_tokens``;
* the clients (closed loop) or the arrivals (Little's law, open loop).

A step with a prompt chunk of c tokens takes longer than a pure decode step; the share f of
steps carrying one makes the inter-token latency a two-point mixture and TPOT its mean over a
request. TTFT is a request's own path, half a step's wait, the prompt's chunks, and the prefill
queue: an M/D/1 wait of rho / (2 (1 - rho)) x the prompt's service time, rho the share of the
steps' prompt budget (max_num_batched_tokens - B) in use.
PP keeps one micro-batch per stage in flight: B/pp sequences a micro-batch, one token each per
pass through the pipeline.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from vllm_fleet.performance import constants as C
from vllm_fleet.performance.costs import StepCost, StepModel
from vllm_fleet.performance.simulate import quantiles, simulate
from vllm_fleet.performance.workload import Workload

Z90, Z99 = 1.2816, 2.3263
# A run longer than this is predicted from its first this-many requests (its steady state).
MAX_SIMULATED = 2000


@dataclass(frozen=True)
class Spread:
    mean: float
    median: float
    p90: float
    p99: float

    def to_dict(self) -> dict[str, float]:
        return {k: round(v, 2) for k, v in (("mean", self.mean), ("median", self.median), ("p90", self.p90),
                                            ("p99", self.p99))}  # fmt: skip

    def scaled(self, factor: float) -> Spread:
        return Spread(self.mean * factor, self.median * factor, self.p90 * factor, self.p99 * factor)


@dataclass
class Prediction:
    """What one instance serves under a workload (per second; latencies in ms)."""

    workload: Workload
    request_throughput: float
    output_token_throughput: float
    total_token_throughput: float
    ttft_ms: Spread
    tpot_ms: Spread
    itl_ms: Spread
    batch: float
    bound: str  # kv_cache, max_num_seqs, max_num_batched_tokens, clients, arrivals
    prefill_bound: str
    decode_bound: str
    saturation_rate: float  # requests/s where the queue starts to grow
    max_batch: float
    notes: list[str] = field(default_factory=list)

    def band(self) -> dict[str, list[float]]:
        """The p10-p90 band of each headline figure (the model's error on the public dataset)."""
        out = {}
        for key, value in (
            ("output_token_throughput", self.output_token_throughput),
            ("tpot_ms", self.tpot_ms.p90),
            ("ttft_ms", self.ttft_ms.p90),
        ):
            low, high = C.BAND[key]
            out[key] = [round(value * low, 2), round(value * high, 2)]
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "workload": self.workload.to_dict(),
            "request_throughput": round(self.request_throughput, 4),
            "output_token_throughput": round(self.output_token_throughput, 2),
            "total_token_throughput": round(self.total_token_throughput, 2),
            "ttft_ms": self.ttft_ms.to_dict(),
            "tpot_ms": self.tpot_ms.to_dict(),
            "itl_ms": self.itl_ms.to_dict(),
            "batch": round(self.batch, 2),
            "bound": self.bound,
            "prefill_bound": self.prefill_bound,
            "decode_bound": self.decode_bound,
            "saturation_rate": round(self.saturation_rate, 4),
            "band": self.band(),
            "notes": self.notes,
        }


@dataclass(frozen=True)
class Limits:
    """The scheduler's limits for one DP rank."""

    kv_tokens: int
    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int


@dataclass(frozen=True)
class _Steady:
    batch: float
    chunk: float  # prompt tokens of a step that carries a chunk
    share: float  # share of steps carrying one
    decode: StepCost
    mixed: StepCost
    rho: float  # the share of the steps' prompt budget (max_num_batched_tokens - batch) in use
    room: float  # that budget, tokens

    @property
    def mean_step(self) -> float:
        return (1 - self.share) * self.decode.total + self.share * self.mixed.total


class Server:
    """The steady state of one instance (``dp`` ranks, each ``tp`` x ``pp`` GPUs)."""

    def __init__(self, model: StepModel, limits: Limits) -> None:
        self.model = model
        self.limits = limits
        self.pp = model.pp
        self.dp = model.dp

    # -- the batch ------------------------------------------------------------------------

    def max_batch(self, w: Workload) -> tuple[float, str]:
        """The largest running batch of one DP rank and what bounds it."""
        lim = self.limits
        held = w.input_len + w.output_len / 2 + lim.block_size / 2
        kv = lim.kv_tokens / held
        new = w.input_len * (1 - w.prefix_hit)
        tokens = lim.max_num_batched_tokens * w.output_len / (w.output_len + new)
        options = {"kv_cache": kv, "max_num_seqs": float(lim.max_num_seqs), "max_num_batched_tokens": tokens}
        bound = min(options, key=lambda k: options[k])
        return max(options[bound], 1.0), bound

    def _steady(self, batch: float, w: Workload) -> _Steady:
        """Step costs with ``batch`` sequences decoding, prompts arriving as they end: a step
        takes in batch x input/output prompt tokens on average; below one prompt a step, a share
        of the steps carries one prompt's chunk, above it every step carries that many tokens."""
        lim = self.limits
        new = max(w.input_len * (1 - w.prefix_hit), 1.0)
        prefix = w.input_len * w.prefix_hit
        room = max(lim.max_num_batched_tokens - batch, 1.0)
        per_step = batch * new / max(w.output_len, 1)  # prompt tokens a step takes in on average
        one = min(new, room)
        if per_step >= one:
            chunk, share = min(per_step, room), 1.0
        else:
            chunk, share = one, per_step / one
        ctx = w.input_len + w.output_len / 2
        mb = batch / self.pp  # one micro-batch per stage
        decode = self.model.step(mb, 0.0, ctx)
        mixed = self.model.step(mb, chunk / self.pp if self.pp > 1 else chunk, ctx, prefix)
        return _Steady(batch, chunk, share, decode, mixed, min(per_step / room, 1.0), room)

    def _prompt_time(self, st: _Steady, w: Workload) -> float:
        """Seconds from a prompt's first chunk to its first token once the scheduler takes it."""
        new = max(w.input_len * (1 - w.prefix_hit), 1.0)
        return math.ceil(new / st.room) * st.mixed.total

    # -- the loads --------------------------------------------------------------------------

    def predict(self, w: Workload) -> Prediction:
        """The instance's figures (all DP ranks) for the run ``w`` describes (its load being the
        instance's): simulated request by request (simulate.py)."""
        cap, cap_bound = self.max_batch(w)
        saturation = self.saturation(w)
        n = max(1, math.ceil(min(w.num_prompts, MAX_SIMULATED) / self.dp))
        lim = self.limits
        clients = math.ceil(w.concurrency / self.dp) if w.concurrency else None
        per_rank = w if not w.request_rate else replace(w, request_rate=w.request_rate / self.dp)
        run = simulate(self.model, per_rank, n, lim.kv_tokens, lim.max_num_seqs, lim.max_num_batched_tokens, clients)
        x = n / run.duration if run.duration else 0.0
        total_x = x * self.dp
        out_mean = run.output_tokens / n
        if w.load == "offline":
            bound = cap_bound if n > cap else "clients"
        elif w.load == "concurrency":
            bound = cap_bound if (clients or 0) > cap else "clients"
        else:
            bound = cap_bound if (w.request_rate or 0) >= saturation else "arrivals"
        fallback = self._steady(min(cap, n), w)
        notes = []
        if run.preemptions:
            notes.append(f"the KV cache fills: {run.preemptions} preemption(s) in the run (vLLM recomputes them)")
        if w.load == "rate" and (w.request_rate or 0.0) >= saturation:
            notes.append(
                f"{w.request_rate:g} requests/s is at or above saturation ({saturation:.2f}/s): the queue grows "
                "for the whole run"
            )
        return Prediction(
            workload=w,
            request_throughput=total_x,
            output_token_throughput=total_x * out_mean,
            total_token_throughput=total_x * (w.input_len + out_mean),
            ttft_ms=Spread(*quantiles(run.ttft)).scaled(1000 * self.model.calibration.ttft),
            tpot_ms=Spread(*quantiles(run.tpot)).scaled(1000),
            itl_ms=Spread(*quantiles([t for t, _ in run.itl], [k for _, k in run.itl])).scaled(1000),
            batch=run.mean_batch * self.dp,
            bound=bound,
            prefill_bound=(run.mixed or fallback.mixed).bound,
            decode_bound=(run.decode or fallback.decode).bound,
            saturation_rate=saturation,
            max_batch=cap * self.dp,
            notes=notes,
        )

    def saturation(self, w: Workload) -> float:
        """Requests/s the instance ends at its largest batch: where a rate's queue starts to grow."""
        cap, _ = self.max_batch(w)
        st = self._steady(cap, w)
        per_rank = cap / (self._prompt_time(st, w) + max(w.output_len - 1, 0) * st.mean_step)
        return per_rank * self.dp

    def steady(self, w: Workload, rate: float) -> tuple[Spread, Spread, float]:
        """(TTFT, TPOT, requests/s) in seconds at a Poisson ``rate`` for the whole instance, in
        steady state (the closed forms: capacity planning, the layout's ranking)."""
        cap, _ = self.max_batch(w)
        x_max = self.saturation(w) / self.dp
        st, x, ttft = self._open(rate / self.dp, cap, x_max, w)
        return ttft, self._tpot(st, w), x * self.dp

    def steady_prediction(self, w: Workload) -> Prediction:
        """The instance at ``w``'s Poisson rate in steady state (closed forms, no simulation):
        what the plan prints for each instance at its operating point."""
        cap, cap_bound = self.max_batch(w)
        saturation = self.saturation(w)
        rate = w.request_rate or 0.0
        st, x, ttft = self._open(rate / self.dp, cap, saturation / self.dp, w)
        total_x = x * self.dp
        return Prediction(
            workload=w,
            request_throughput=total_x,
            output_token_throughput=total_x * w.output_len,
            total_token_throughput=total_x * (w.input_len + w.output_len),
            ttft_ms=ttft.scaled(1000),
            tpot_ms=self._tpot(st, w).scaled(1000),
            itl_ms=self._itl(st).scaled(1000),
            batch=st.batch * self.dp,
            bound=cap_bound if rate >= saturation * 0.99 else "arrivals",
            prefill_bound=st.mixed.bound,
            decode_bound=st.decode.bound,
            saturation_rate=saturation,
            max_batch=cap * self.dp,
        )

    def _tpot(self, st: _Steady, w: Workload) -> Spread:
        mean = st.mean_step
        gap = st.mixed.total - st.decode.total
        tokens = max(w.output_len - 1, 1)
        std = math.sqrt(st.share * (1 - st.share) / tokens) * gap
        return Spread(mean, mean, mean + Z90 * std, mean + Z99 * std)

    def _itl(self, st: _Steady) -> Spread:
        def quantile(q: float) -> float:
            return st.mixed.total if q > 1 - st.share else st.decode.total

        return Spread(st.mean_step, quantile(0.5), quantile(0.9), quantile(0.99))

    def _ttft_spread(self, base: float, wait: float, busy: float, w: Workload) -> Spread:
        """``base`` (a prompt's own chunks, at mean length) plus a queue wait of mean ``wait``,
        positive with probability ``busy`` and exponential then; prompt lengths spread by range_ratio."""

        def at(q: float) -> float:
            length = 1 + w.range_ratio * (2 * q - 1)
            tail = 0.0 if q <= 1 - busy or busy <= 0 else (wait / busy) * math.log(busy / (1 - q))
            return base * length + tail

        return Spread(base + wait, at(0.5), at(0.9), at(0.99))

    def _open(self, rate: float, cap: float, x_max: float, w: Workload) -> tuple[_Steady, float, Spread]:
        """Poisson arrivals at ``rate``: the batch from Little's law; past saturation the queue
        grows over the run's num_prompts."""
        if rate >= x_max:
            st = self._steady(cap, w)
            prompt = self._prompt_time(st, w) + st.mean_step / 2 + self.model.request_overhead
            n = w.num_prompts / self.dp
            grow = n / 2 * (1 / x_max - 1 / rate) if rate > 0 else 0.0
            return st, x_max, self._ttft_spread(prompt, grow, 1.0, w).scaled(self.model.calibration.ttft)
        batch = 1.0
        st = self._steady(batch, w)
        for _ in range(12):
            batch = min(cap, max(rate * (max(w.output_len - 1, 0) * st.mean_step), 1e-3))
            st = self._steady(batch, w)
        prompt = self._prompt_time(st, w) + st.mean_step / 2 + self.model.request_overhead
        rho = min(st.rho, 0.97)
        queue = rho / (2 * (1 - rho)) * self._prompt_time(st, w)
        return st, rate, self._ttft_spread(prompt, queue, rho, w).scaled(self.model.calibration.ttft)
