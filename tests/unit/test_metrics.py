"""vllm_fleet.ops.metrics: the Prometheus text format of vLLM 0.32's /metrics, and what it refuses.

The fixtures under data/ were written by vLLM 0.32's own PrometheusStatLogger and
prometheus_client (data/make_vllm_metrics.py), not by hand.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_fleet.ops import metrics
from vllm_fleet.ops.metrics import MetricsParseError, Sample, by_label, label_values, parse, render, total

DATA = Path(__file__).parent / "data"


def _fixture(name: str) -> metrics.Exposition:
    return parse((DATA / name).read_text())


def test_vllm_0_32_exposition_one_engine() -> None:
    exp = _fixture("vllm_metrics_0_32.txt")
    assert total(exp, "vllm:num_requests_running") == 2
    assert total(exp, "vllm:num_requests_waiting") == 1
    assert total(exp, "vllm:kv_cache_usage_perc") == 0.25
    assert total(exp, "vllm:generation_tokens_total") == 300
    assert total(exp, "vllm:prompt_tokens_total") == 400
    assert total(exp, "vllm:prefix_cache_queries_total") == 1000
    assert total(exp, "vllm:prefix_cache_hits_total") == 600
    assert total(exp, "vllm:num_preemptions_total") == 1
    assert label_values(exp, "vllm:cache_config_info", "num_gpu_blocks") == ["14695"]
    assert exp.types["vllm:generation_tokens"] == "counter"  # the family, as prometheus_client names it
    assert exp.types["vllm:num_requests_running"] == "gauge"
    assert exp.helps["vllm:kv_cache_usage_perc"].startswith("KV-cache usage")
    start = total(exp, "process_start_time_seconds")
    assert start is not None and start > 1.7e9
    # Histograms end with le="+Inf", the count of every observation.
    inf = [s for s in exp.named("vllm:iteration_tokens_total_bucket") if s.labels["le"] == "+Inf"]
    assert [s.value for s in inf] == [1.0]
    assert all(s.labels["model_name"] == "tiny-llama" for s in exp.named("vllm:num_requests_running"))


def test_data_parallel_exposition_sums_engines() -> None:
    exp = _fixture("vllm_metrics_0_32_dp2.txt")
    assert by_label(exp, "vllm:num_requests_running", "engine") == {"0": 2.0, "1": 3.0}
    assert total(exp, "vllm:num_requests_running") == 5
    assert total(exp, "vllm:generation_tokens_total") == 300 + 305
    assert total(exp, "vllm:generation_tokens_total", {"engine": "1"}) == 305
    assert by_label(exp, "vllm:prompt_tokens_total", "model_name") == {"tiny-llama": 810.0}
    assert label_values(exp, "vllm:cache_config_info", "num_gpu_blocks") == ["14695", "14695"]
    # Multiprocess mode (--api-server-count > 1): no process collector.
    assert total(exp, "process_start_time_seconds") is None


def test_absent_metric_is_none_not_zero() -> None:
    exp = parse("a 1\n")
    assert total(exp, "b") is None
    assert total(exp, "a", {"engine": "0"}) is None
    assert by_label(exp, "b", "engine") == {}


def test_escapes_special_values_timestamps_and_comments() -> None:
    text = (
        "# a plain comment\n"
        "#HELP not_meta this is a comment too\n"
        "# HELP m line one\\nline two \\\\ end\n"
        "# TYPE m gauge\n"
        "\n"
        'm{path="C:\\\\dir",quote="say \\"hi\\"",nl="a\\nb",empty=""} +Inf\n'
        'm{path="x",} -Inf 1700000000000\n'
        "  m_nan NaN -5\n"
        "m_sci\t1.5e-3\n"
        "m_int 42\n"
        "m_dot .5\n"
    )
    exp = parse(text)
    first = exp.samples[0]
    assert first.labels == {"path": "C:\\dir", "quote": 'say "hi"', "nl": "a\nb", "empty": ""}
    assert first.value == math.inf
    assert exp.samples[1].value == -math.inf and exp.samples[1].timestamp_ms == 1700000000000
    assert math.isnan(exp.samples[2].value) and exp.samples[2].timestamp_ms == -5
    assert [s.value for s in exp.samples[3:]] == [0.0015, 42.0, 0.5]
    assert exp.helps == {"m": "line one\nline two \\ end"}
    assert {k: v for k, v in exp.types.items() if v != "unknown"} == {"m": "gauge"}


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("m\n", "invalid metric name"),
        ("m 1_000\n", "Invalid value"),
        ("m 0x10\n", "could not convert"),
        ('m{a="1} 1\n', "could not convert"),
        ('m{a="1",a="2"} 1\n', "Invalid labels"),
        ('m{1a="x"} 1\n', "Invalid labels"),
        ("m{a=1} 1\n", "Invalid labels"),
        ('m{a="1" b="2"} 1\n', "Invalid labels"),
        ('m{a="1"}x 1\n', "could not convert"),
        ('m{a="1"} 1\nm{a="1"} 2\n', "twice"),  # ours: summed, it would count twice
        ("# TYPE m widget\n", "Invalid metric type"),
        ("# TYPE 9m gauge\n", "cannot parse"),
        ("9m 1\n", "invalid metric name"),
        ("<html>500 Internal Server Error</html>\n", "invalid metric name"),
    ],
)
def test_refuses_what_is_not_the_text_format(text: str, words: str) -> None:
    """What prometheus_client's parser refuses, and a series given twice, with the line."""
    with pytest.raises(MetricsParseError, match=None) as err:
        parse(text)
    assert words in str(err.value), str(err.value)
    assert str(err.value).startswith("line ")


@pytest.mark.parametrize(
    "text",
    ["m inf\n", 'm{a="\\t"} 1\n', "m 1\r\n", "# HELP m a\n# HELP m b\n", "m 1\n# TYPE m gauge\n"],
)
def test_takes_what_the_reference_parser_takes(text: str) -> None:
    """Where the reference parser is lenient (Python's float spelling, an unknown escape kept,
    CRLF, a second HELP, a TYPE after samples), so is status: the numbers are vLLM's own."""
    parse(text)


def test_the_error_names_the_line() -> None:
    with pytest.raises(MetricsParseError) as err:
        parse("a 1\nb 2\nc three\n")
    assert err.value.line == 3


_names = st.from_regex(r"[a-zA-Z_:][a-zA-Z0-9_:]{0,12}", fullmatch=True)
# Names beginning with __ are reserved for Prometheus itself (the parser refuses them).
_label_names = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,8}", fullmatch=True).filter(lambda n: not n.startswith("__"))
_values = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(10**12), 10**12).map(float),
)
_samples = st.builds(
    Sample,
    name=_names,
    labels=st.dictionaries(_label_names, st.text(max_size=12), max_size=4),
    value=_values,
    # Milliseconds of this era and the next (the parser reads seconds as a float: exact to 2**50 ms).
    timestamp_ms=st.one_of(st.none(), st.integers(-(2**41), 2**41)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_samples, max_size=8, unique_by=lambda s: (s.name, tuple(sorted(s.labels.items())))))
def test_render_then_parse_round_trips(samples: list[Sample]) -> None:
    got = parse(render(samples)).samples
    assert len(got) == len(samples)
    for a, b in zip(samples, got, strict=True):
        assert (a.name, dict(a.labels), a.timestamp_ms) == (b.name, dict(b.labels), b.timestamp_ms)
        assert (math.isnan(a.value) and math.isnan(b.value)) or a.value == b.value


@settings(max_examples=500, deadline=None)
@given(st.lists(st.sampled_from([*'ab_:{}=",\\ \t\n#019.eE+-', "Inf", "NaN", "# TYPE ", "# HELP "]), max_size=40))
def test_any_text_parses_or_raises_metrics_parse_error(pieces: list[str]) -> None:
    text = "".join(pieces)
    try:
        exp = parse(text)
    except MetricsParseError:
        return
    for s in exp.samples:
        assert isinstance(s.value, float)


def test_format_value_is_the_exposition_spelling() -> None:
    assert [metrics.format_value(v) for v in (math.inf, -math.inf, math.nan, 1.0, 1e-7)] == [
        "+Inf",
        "-Inf",
        "NaN",
        "1.0",
        "1e-07",
    ]


def test_a_timestamp_that_is_not_finite_is_refused_on_its_line() -> None:
    """Found by the fuzz test above in CI: prometheus_client reads "a Inf Inf" as a sample with
    an infinite timestamp, which no millisecond count holds."""
    with pytest.raises(MetricsParseError, match=r"line 2: .*timestamp of a is inf"):
        parse("b 1\na Inf Inf\n")
