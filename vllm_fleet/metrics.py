"""A small, strict parser of the Prometheus text exposition format (version 0.0.4).

What ``GET /metrics`` of a vLLM server returns (prometheus_client's ``generate_latest``)::

    # HELP vllm:generation_tokens_total Number of generation tokens processed.
    # TYPE vllm:generation_tokens_total counter
    vllm:generation_tokens_total{engine="0",model_name="tiny-llama"} 300.0

Samples with labels (values escaped as ``\\\\``, ``\\"`` and ``\\n``), ``+Inf`` / ``-Inf`` /
``NaN``, optional millisecond timestamps, ``# HELP`` / ``# TYPE`` lines and plain comments.
Anything else is a :class:`MetricsParseError` naming the line: a half-read page must not
turn into numbers. No Prometheus server and no prometheus_client needed.

:func:`total` and :func:`by_label` sum a metric over its label sets: with data parallelism
vLLM exports one series per engine (``engine="0"``, ``engine="1"``...).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

TYPES = frozenset({"counter", "gauge", "histogram", "summary", "untyped"})
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_SPECIAL = {"+Inf": math.inf, "Inf": math.inf, "-Inf": -math.inf, "NaN": math.nan}
_TIMESTAMP = re.compile(r"-?[0-9]+")
_BLANK = " \t"
_UNESCAPE = {"\\": "\\", '"': '"', "n": "\n"}


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
    types: dict[str, str] = field(default_factory=dict)  # metric name -> counter, gauge, ...
    helps: dict[str, str] = field(default_factory=dict)

    def named(self, name: str) -> list[Sample]:
        return [s for s in self.samples if s.name == name]


def _unescape_help(text: str, lineno: int) -> str:
    out = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            nxt = text[i + 1 : i + 2]
            if nxt not in ("\\", "n"):
                raise MetricsParseError(lineno, f"bad escape '\\{nxt}' in HELP (only \\\\ and \\n)")
            out.append(_UNESCAPE[nxt])
            i += 2
            continue
        out.append(ch)
        i += 1
    return "".join(out)


_META = re.compile(r"#[ \t]+(HELP|TYPE)(?:[ \t]+(\S*))?(?:[ \t]+(.*))?")


def _comment(line: str, lineno: int, exp: Exposition, seen: set[str]) -> None:
    m = _META.fullmatch(line)
    if not m:
        return  # a plain comment
    keyword, name, value = m.group(1), m.group(2) or "", m.group(3) or ""
    if not _NAME.fullmatch(name):
        raise MetricsParseError(lineno, f"# {keyword} needs a metric name, got {name!r}")
    if keyword == "HELP":
        if name in exp.helps:
            raise MetricsParseError(lineno, f"second # HELP for {name}")
        exp.helps[name] = _unescape_help(value, lineno)
        return
    kind = value.strip(_BLANK)
    if kind not in TYPES:
        raise MetricsParseError(lineno, f"# TYPE {name}: unknown type {kind!r} (one of {', '.join(sorted(TYPES))})")
    if name in exp.types:
        raise MetricsParseError(lineno, f"second # TYPE for {name}")
    if name in seen:
        raise MetricsParseError(lineno, f"# TYPE {name} after its samples")
    exp.types[name] = kind


def _labels(line: str, pos: int, lineno: int) -> tuple[dict[str, str], int]:
    """The labels of ``{...}`` starting at ``line[pos] == '{'``; returns them and the index after ``}``."""
    labels: dict[str, str] = {}
    i = pos + 1
    while True:
        while i < len(line) and line[i] in _BLANK:
            i += 1
        if i < len(line) and line[i] == "}":
            return labels, i + 1
        m = _LABEL_NAME.match(line, i)
        if not m:
            raise MetricsParseError(lineno, f"expected a label name or '}}' at column {i + 1}")
        lname = m.group()
        i = m.end()
        while i < len(line) and line[i] in _BLANK:
            i += 1
        if line[i : i + 2] != '="':
            raise MetricsParseError(lineno, f'expected =" after label {lname} at column {i + 1}')
        i += 2
        chars = []
        while True:
            if i >= len(line):
                raise MetricsParseError(lineno, f"label {lname}: unterminated value")
            ch = line[i]
            if ch == '"':
                i += 1
                break
            if ch == "\\":
                nxt = line[i + 1 : i + 2]
                if nxt not in _UNESCAPE:
                    raise MetricsParseError(lineno, f"label {lname}: bad escape '\\{nxt}' (only \\\\, \\\" and \\n)")
                chars.append(_UNESCAPE[nxt])
                i += 2
                continue
            chars.append(ch)
            i += 1
        if lname in labels:
            raise MetricsParseError(lineno, f"label {lname} twice")
        labels[lname] = "".join(chars)
        while i < len(line) and line[i] in _BLANK:
            i += 1
        if i < len(line) and line[i] == ",":
            i += 1
        elif i < len(line) and line[i] == "}":
            return labels, i + 1
        else:
            raise MetricsParseError(lineno, f"expected ',' or '}}' after label {lname} at column {i + 1}")


def parse_value(text: str) -> float:
    """A sample value: a decimal float, ``+Inf``, ``-Inf`` or ``NaN`` (not Python's 'inf', '1_0')."""
    if text in _SPECIAL:
        return _SPECIAL[text]
    if not _NUMBER.fullmatch(text):
        raise ValueError(f"{text!r} is not a number")
    return float(text)


def _sample(line: str, lineno: int) -> Sample:
    m = _NAME.match(line)
    if not m:
        raise MetricsParseError(lineno, f"expected a metric name, got {line[:40]!r}")
    name = m.group()
    i = m.end()
    labels: dict[str, str] = {}
    if i < len(line) and line[i] == "{":
        labels, i = _labels(line, i, lineno)
    if i < len(line) and line[i] not in _BLANK:
        raise MetricsParseError(lineno, f"{name}: unexpected {line[i]!r} at column {i + 1}")
    fields = line[i:].split()
    if len(fields) not in (1, 2) or any(c not in _BLANK for c in line[i:] if c.isspace()):
        raise MetricsParseError(lineno, f"{name}: expected 'value [timestamp]', got {line[i:].strip()!r}")
    try:
        value = parse_value(fields[0])
    except ValueError as exc:
        raise MetricsParseError(lineno, f"{name}: {exc}") from None
    timestamp = None
    if len(fields) == 2:
        if not _TIMESTAMP.fullmatch(fields[1]):
            raise MetricsParseError(lineno, f"{name}: timestamp {fields[1]!r} is not integer milliseconds")
        timestamp = int(fields[1])
    return Sample(name, labels, value, timestamp)


def parse(text: str) -> Exposition:
    """Every sample, ``# TYPE`` and ``# HELP`` of ``text``; :class:`MetricsParseError` on anything else."""
    exp = Exposition()
    seen_names: set[str] = set()
    seen_series: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line.strip(_BLANK):
            continue
        if line.startswith("#"):
            _comment(line, lineno, exp, seen_names)
            continue
        sample = _sample(line.lstrip(_BLANK), lineno)
        key = (sample.name, tuple(sorted(sample.labels.items())))
        if key in seen_series:
            raise MetricsParseError(lineno, f"{sample.name}{dict(sample.labels)} twice")
        seen_series.add(key)
        seen_names.add(sample.name)
        exp.samples.append(sample)
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
