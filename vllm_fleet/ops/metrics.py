"""Read what ``GET /metrics`` of a vLLM server returns: the Prometheus text exposition format
(version 0.0.4), parsed by prometheus_client's own parser (the reference: vLLM exports with
prometheus_client's ``generate_latest``)::

    # HELP vllm:generation_tokens_total Number of generation tokens processed.
    # TYPE vllm:generation_tokens_total counter
    vllm:generation_tokens_total{engine="0",model_name="tiny-llama"} 300.0

Anything the parser refuses is a :class:`MetricsParseError` naming the first line it refuses:
a half-read page must not turn into numbers. A series given twice is refused too (the parser
keeps both; summed, they would count one engine twice). No Prometheus server needed.

:func:`total` and :func:`by_label` sum a metric over its label sets: with data parallelism
vLLM exports one series per engine (``engine="0"``, ``engine="1"``...).

prometheus_client costs about 35 ms to import: only ``vllm-fleet status`` loads this module
(the CLI imports it for that command alone), never the planner.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families


class MetricsParseError(ValueError):
    """The text is not the Prometheus text format; ``line`` is 1-based."""

    def __init__(self, line: int, problem: str) -> None:
        self.line = line
        self.problem = problem
        super().__init__(f"line {line}: {problem}")


@dataclass(frozen=True)
class Sample:
    name: str
    labels: Mapping[str, str]
    value: float
    timestamp_ms: int | None = None


@dataclass
class Exposition:
    samples: list[Sample] = field(default_factory=list)
    types: dict[str, str] = field(default_factory=dict)  # metric family -> counter, gauge, ...
    helps: dict[str, str] = field(default_factory=dict)

    def named(self, name: str) -> list[Sample]:
        return [s for s in self.samples if s.name == name]


def _families(text: str) -> Exposition:
    exp = Exposition()
    for family in text_string_to_metric_families(text):
        exp.types[family.name] = family.type
        if family.documentation:
            exp.helps[family.name] = family.documentation
        for s in family.samples:
            if s.timestamp is not None and not math.isfinite(float(s.timestamp)):
                raise ValueError(f"the timestamp of {s.name} is {s.timestamp}, not a finite number")
            stamp = None if s.timestamp is None else round(float(s.timestamp) * 1000)
            exp.samples.append(Sample(s.name, dict(s.labels), float(s.value), stamp))
    return exp


def _first_bad_line(lines: list[str]) -> int:
    """The 1-based line where the parser first refuses ``lines`` (it reads them in order)."""
    for n in range(1, len(lines) + 1):
        try:
            _families("\n".join(lines[:n]) + "\n")
        except ValueError:
            return n
    return len(lines)


def _line_of(text: str, key: tuple[str, tuple[tuple[str, str], ...]], nth: int) -> int:
    """The 1-based line of the ``nth`` sample of series ``key``."""
    count = 0
    for n, line in enumerate(text.split("\n"), start=1):
        if line.lstrip().startswith("#") or not line.strip():
            continue
        for s in _families(line).samples:
            if (s.name, tuple(sorted(s.labels.items()))) == key:
                count += 1
                if count == nth:
                    return n
    return 0


def parse(text: str) -> Exposition:
    """Every sample, ``# TYPE`` and ``# HELP`` of ``text``; :class:`MetricsParseError` on what the
    reference parser refuses and on a series given twice."""
    try:
        exp = _families(text)
    except ValueError as exc:  # prometheus_client's errors name the content, not the line
        lines = text.split("\n")
        line = _first_bad_line(lines)
        problem = str(exc).strip() or f"cannot parse {lines[line - 1][:60]!r}"
        raise MetricsParseError(line, problem) from None
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    for sample in exp.samples:
        key = (sample.name, tuple(sorted(sample.labels.items())))
        if key in seen:
            raise MetricsParseError(_line_of(text, key, 2), f"{sample.name}{dict(sample.labels)} twice")
        seen.add(key)
    return exp


def _matches(sample: Sample, match: Mapping[str, str]) -> bool:
    return all(sample.labels.get(k) == v for k, v in match.items())


def total(exp: Exposition, name: str, match: Mapping[str, str] | None = None) -> float | None:
    """``name`` summed over every label set (that has the labels of ``match``); None when absent."""
    values = [s.value for s in exp.samples if s.name == name and _matches(s, match or {})]
    return math.fsum(values) if values else None


def by_label(exp: Exposition, name: str, label: str, match: Mapping[str, str] | None = None) -> dict[str, float]:
    """``name`` summed per value of ``label`` (e.g. per ``model_name``, per ``engine``)."""
    out: dict[str, list[float]] = {}
    for s in exp.samples:
        if s.name == name and _matches(s, match or {}):
            out.setdefault(s.labels.get(label, ""), []).append(s.value)
    return {k: math.fsum(v) for k, v in sorted(out.items())}


def label_values(exp: Exposition, name: str, label: str) -> list[str]:
    """The values ``label`` takes on the samples of ``name``, in order, repeats kept."""
    return [s.labels[label] for s in exp.samples if s.name == name and label in s.labels]


def format_value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render(samples: Iterable[Sample], types: Mapping[str, str] | None = None) -> str:
    """Samples as the text format (the inverse of :func:`parse`, for tests and stand-ins)."""
    lines = []
    typed: set[str] = set()
    for s in samples:
        if types and s.name in types and s.name not in typed:
            lines.append(f"# TYPE {s.name} {types[s.name]}")
            typed.add(s.name)
        labels = ",".join(f'{k}="{_escape(v)}"' for k, v in s.labels.items())
        line = s.name + (f"{{{labels}}}" if labels else "") + " " + format_value(s.value)
        if s.timestamp_ms is not None:
            line += f" {s.timestamp_ms}"
        lines.append(line)
    return "\n".join(lines) + "\n"
