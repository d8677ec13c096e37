"""The workload a layout is chosen for, and the service level it must meet.

One declaration of each key (:data:`WORKLOAD_KEYS`, :data:`SLO_KEYS`) gives the inventory's
``vllm_fleet_workload`` / ``vllm_fleet_slo`` mappings (and each ``vllm_fleet_models`` entry's
``workload`` / ``slo``), the ``vllm-fleet estimate`` / ``plan`` flags and their checks.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from vllm_fleet.errors import PlanError
from vllm_fleet.performance import constants as C


@dataclass(frozen=True)
class Key:
    name: str
    cli: str
    kind: type
    help: str
    maximum: float
    commands: tuple[str, ...] = ("estimate", "plan")


WORKLOAD_KEYS: tuple[Key, ...] = (
    Key("input_len", "--input-len", int, f"mean prompt tokens (default {C.DEFAULT_INPUT_LEN})", 10**8),
    Key("output_len", "--output-len", int, f"mean generated tokens (default {C.DEFAULT_OUTPUT_LEN})", 10**8),
    Key("num_prompts", "--num-prompts", int, "requests in the run (default 1000, as vllm bench)", 10**9),
    Key("concurrency", "--concurrency", int, "clients, each sending its next request when one ends", 10**9),
    Key("request_rate", "--request-rate", float, "requests per second, Poisson arrivals", 10**9),
    Key("prefix_hit", "--prefix-hit", float, "share of each prompt already in the prefix cache (0-1)", 1.0),
    Key("range_ratio", "--range-ratio", float, "lengths uniform in len x (1 +- r), as vllm bench's random", 1.0),
    Key(
        "chat_lengths",
        "--chat-lengths",
        bool,
        "lengths spread like chat logs (ShareGPT): exponential around the means, cut at 6x",
        1.0,
    ),
)
SLO_KEYS: tuple[Key, ...] = (
    Key("ttft_p90_ms", "--slo-ttft-ms", float, "time to first token at p90, ms", 10**9, ("plan",)),
    Key("tpot_p90_ms", "--slo-tpot-ms", float, "time per output token at p90, ms", 10**9, ("plan",)),
)


@dataclass(frozen=True)
class Workload:
    """Requests of ``input_len`` prompt and ``output_len`` generated tokens (means), sent all at
    once (offline, as ``vllm bench throughput``), by ``concurrency`` clients (closed loop), or at
    ``request_rate`` per second (Poisson); for one instance or, in a plan, the whole cluster."""

    input_len: int = C.DEFAULT_INPUT_LEN
    output_len: int = C.DEFAULT_OUTPUT_LEN
    num_prompts: int = 1000
    concurrency: int | None = None
    request_rate: float | None = None
    prefix_hit: float = 0.0
    range_ratio: float = 0.0
    chat_lengths: bool = False

    def quantile(self, mean: int, q: float) -> float:
        """The length at quantile ``q`` (0-1) of a request whose mean length is ``mean``."""
        if self.chat_lengths:
            # Exponential with this mean, cut at 6 x mean (the cut's mass put back on the rest).
            cut = 1 - math.exp(-6.0)
            return max(1.0, -mean * math.log(1 - q * cut) / (1 - 6.0 * math.exp(-6.0) / cut))
        return max(1.0, mean * (1 + self.range_ratio * (2 * q - 1)))

    @property
    def load(self) -> str:
        if self.concurrency is not None:
            return "concurrency"
        if self.request_rate is not None:
            return "rate"
        return "offline"

    def to_dict(self) -> dict[str, Any]:
        return {
            "input_len": self.input_len,
            "output_len": self.output_len,
            "num_prompts": self.num_prompts,
            "concurrency": self.concurrency,
            "request_rate": self.request_rate,
        }

    def describe(self) -> str:
        if self.load == "concurrency":
            load = f"{self.concurrency} concurrent clients"
        elif self.load == "rate":
            load = f"{self.request_rate:g} requests/s"
        else:
            load = "load: as much as the SLO allows"
        spread = ", chat-like lengths" if self.chat_lengths else ""
        return f"{self.input_len:,} in / {self.output_len:,} out{spread}, {load}"


@dataclass(frozen=True)
class Slo:
    ttft_p90_ms: float | None = None
    tpot_p90_ms: float | None = None

    @property
    def asked(self) -> bool:
        return self.ttft_p90_ms is not None or self.tpot_p90_ms is not None

    def bound(self) -> Slo:
        """The SLO ranked by: the asked one, else the default interactivity bound."""
        if self.asked:
            return self
        return Slo(C.DEFAULT_TTFT_P90_MS, C.DEFAULT_TPOT_P90_MS)

    def describe(self) -> str:
        parts = []
        if self.ttft_p90_ms is not None:
            parts.append(f"TTFT p90 <= {self.ttft_p90_ms:g} ms")
        if self.tpot_p90_ms is not None:
            parts.append(f"TPOT p90 <= {self.tpot_p90_ms:g} ms")
        return " and ".join(parts) or "none"


def _value(key: Key, raw: Any, field: str) -> Any:
    if key.kind is bool:
        if not isinstance(raw, bool):
            raise PlanError(field, f"{raw!r} is not true or false", f"{key.name}: true")
        return raw
    fix = f"a positive {'whole ' if key.kind is int else ''}number, e.g. {key.name}: " + (
        "0.5" if key.maximum == 1.0 else "1024"
    )
    if isinstance(raw, bool) or not isinstance(raw, int | float | str):
        raise PlanError(field, f"{raw!r} is not a number", fix)
    try:
        number = float(raw)
    except ValueError:
        raise PlanError(field, f"{raw!r} is not a number", fix) from None
    if not math.isfinite(number):
        raise PlanError(field, f"{raw!r} is not a finite number", fix)
    low_ok = number >= 0 if key.maximum == 1.0 else number > 0
    if not low_ok or number > key.maximum:
        raise PlanError(field, f"{raw!r} is out of range (0-{key.maximum:g})", fix)
    if key.kind is int:
        if not number.is_integer():
            raise PlanError(field, f"{raw!r} is not a whole number", fix)
        return int(number)
    return number


def _read(keys: tuple[Key, ...], raw: Any, field: str) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        example = ", ".join(f"{k.name}: ..." for k in keys[:2])
        raise PlanError(field, f"must be a mapping, got {raw!r}", f"e.g. {{{example}}}")
    known = {k.name: k for k in keys}
    out = {}
    for name, value in raw.items():
        if name not in known:
            raise PlanError(f"{field}.{name}", "is not a key of it", f"use {', '.join(known)}")
        if value is None:
            continue
        out[str(name)] = _value(known[str(name)], value, f"{field}.{name}")
    return out


CALIBRATION_KEYS: tuple[Key, ...] = (
    Key("step_time", "--calibration", float, "measured / predicted time of an engine step", 100.0, ("plan",)),
    Key("ttft", "--calibration", float, "measured / predicted time to first token", 100.0, ("plan",)),
)


@dataclass(frozen=True)
class Calibration:
    """Factors on the model's predictions from the cluster's own verify run (1: the model as is)."""

    step_time: float = 1.0
    ttft: float = 1.0


def calibration_from(raw: Any, field: str = "vllm_fleet_calibration") -> Calibration:
    return Calibration(**_read(CALIBRATION_KEYS, raw, field))


def workload_from(raw: Any, field: str = "vllm_fleet_workload") -> Workload:
    """A checked :class:`Workload` from an inventory mapping (or the CLI's flags)."""
    values = _read(WORKLOAD_KEYS, raw, field)
    if "concurrency" in values and "request_rate" in values:
        raise PlanError(field, "sets both concurrency and request_rate", "keep one: clients, or a rate of requests")
    names = {f.name for f in fields(Workload)}
    return Workload(**{k: v for k, v in values.items() if k in names})


def slo_from(raw: Any, field: str = "vllm_fleet_slo") -> Slo:
    return Slo(**_read(SLO_KEYS, raw, field))


def add_flags(parser: argparse.ArgumentParser, command: str) -> None:
    """The workload's (and, for plan, the SLO's) keys as ``vllm-fleet`` flags; checked by
    :func:`workload_from` / :func:`slo_from` as the inventory's mappings are."""
    for prefix, keys in (("workload_", WORKLOAD_KEYS), ("slo_", SLO_KEYS)):
        for key in keys:
            if command not in key.commands:
                continue
            if key.kind is bool:
                parser.add_argument(key.cli, dest=prefix + key.name, action="store_true", default=None, help=key.help)
            else:
                parser.add_argument(key.cli, dest=prefix + key.name, default=None, metavar="N", help=key.help)


def from_args(args: argparse.Namespace) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(workload, slo) mappings of the flags given, None where none was; each value checked
    with the flag named."""
    out: list[dict[str, Any] | None] = []
    for prefix, keys in (("workload_", WORKLOAD_KEYS), ("slo_", SLO_KEYS)):
        given = {}
        for key in keys:
            raw = getattr(args, prefix + key.name, None)
            if raw is not None:
                given[key.name] = _value(key, raw, key.cli)
        out.append(given or None)
    return out[0], out[1]
