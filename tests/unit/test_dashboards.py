"""The monitoring role's Grafana dashboards: they load, their panel ids are unique, every query is
PromQL that promtool accepts once the template variables are substituted, and they only name the
metrics vLLM 0.32 exposes and the scrape jobs the role renders."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import ROOT
from tests.unit.test_alert_rules import promtool
from vllm_fleet.deploy import dashboards
from vllm_fleet.deploy.dashboards import SCRAPE_JOBS, panel_queries, vllm_name_problems
from vllm_fleet.errors import PlanError

DASHBOARDS = ROOT / "roles/monitoring/files/dashboards"
SERVING = DASHBOARDS / "vllm-fleet-serving.json"
CLUSTER = DASHBOARDS / "vllm-fleet-cluster.json"
ALL = [SERVING, CLUSTER]
PROMETHEUS_DS = {"type": "prometheus", "uid": "${datasource}"}


def _load(path: Path) -> dict[str, Any]:
    data = json.loads(path.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def _variables(dash: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {var["name"]: var for var in dash["templating"]["list"]}


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.name)
def test_dashboard_loads_with_unique_ids_and_a_datasource_variable(path: Path) -> None:
    dash = _load(path)
    assert dash["uid"] == path.stem and dash["title"]
    assert 36 <= dash["schemaVersion"] <= 41
    ids = [panel["id"] for panel in dashboards.panels(dash)]
    assert len(ids) == len(set(ids)), ids
    datasource = _variables(dash)["datasource"]
    assert datasource["type"] == "datasource" and datasource["query"] == "prometheus"
    for panel in dashboards.panels(dash):
        assert {"x", "y", "w", "h"} <= set(panel["gridPos"]), panel["title"]
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == PROMETHEUS_DS, panel["title"]
        assert panel["targets"], panel["title"]
        refs = [target["refId"] for target in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == PROMETHEUS_DS, panel["title"]


def test_panels_do_not_overlap() -> None:
    for path in ALL:
        cells: dict[tuple[int, int], str] = {}
        for panel in dashboards.panels(_load(path)):
            pos = panel["gridPos"]
            for x in range(pos["x"], pos["x"] + pos["w"]):
                for y in range(pos["y"], pos["y"] + pos["h"]):
                    assert (x, y) not in cells, f"{path.name}: {panel['title']!r} overlaps {cells[(x, y)]!r}"
                    cells[(x, y)] = panel["title"]


def test_serving_dashboard_has_the_instance_variable_and_uses_it() -> None:
    dash = _load(SERVING)
    var = _variables(dash)["instance"]
    assert var["type"] == "query" and var["datasource"] == PROMETHEUS_DS
    assert var["query"]["query"] == var["definition"] == "label_values(vllm:num_requests_running, instance)"
    assert var["includeAll"] and var["multi"] and var["allValue"] == ".*"
    for panel in dashboards.panels(dash):
        for target in panel.get("targets", []):
            # A multi-value variable only works in a regex matcher.
            assert 'instance=~"$instance"' in target["expr"], panel["title"]
            assert '="$instance"' not in target["expr"], panel["title"]


def test_serving_dashboard_shows_what_the_issue_asks_for() -> None:
    exprs = " ".join(expr for _, expr in panel_queries(SERVING))
    for needle in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "rate(vllm:generation_tokens_total",
        "rate(vllm:prompt_tokens_total",
        "histogram_quantile(0.5, sum by (le, instance, vllm_instance) (rate(vllm:time_to_first_token_seconds_bucket",
        "histogram_quantile(0.95, sum by (le, instance, vllm_instance) (rate(vllm:time_to_first_token_seconds_bucket",
        "histogram_quantile(0.95, sum by (le, instance, vllm_instance) (rate(vllm:inter_token_latency_seconds_bucket",
        "histogram_quantile(0.95, sum by (le, instance, vllm_instance) (rate(vllm:e2e_request_latency_seconds_bucket",
        "rate(vllm:prefix_cache_hits_total",
        "rate(vllm:prefix_cache_queries_total",
        "increase(vllm:num_preemptions_total",
    ):
        assert needle in exprs, needle


def test_cluster_dashboard_shows_what_the_issue_asks_for() -> None:
    exprs = " ".join(expr for _, expr in panel_queries(CLUSTER))
    for needle in (
        "sum by (job) (up)",
        "node_cpu_seconds_total",
        "node_memory_MemAvailable_bytes",
        "nginx_connections_active",
        "rate(nginx_http_requests_total",
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_GPU_TEMP",
        "ray_node_cpu_count",
    ):
        assert needle in exprs, needle


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.name)
def test_queries_use_known_vllm_metrics_and_jobs(path: Path) -> None:
    queries = panel_queries(path)
    assert queries
    for title, expr in queries:
        assert "$" not in expr and "[[" not in expr, (title, expr)
        assert vllm_name_problems(expr) == [], title
        for job in re.findall(r'job=~?"([^"]*)"', expr):
            assert job in SCRAPE_JOBS, (title, job)
    for var in _load(path)["templating"]["list"]:
        if var["type"] == "query":
            assert vllm_name_problems(var["definition"]) == [], var["name"]


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.name)
def test_queries_are_promql_that_promtool_accepts(path: Path, tmp_path: Path) -> None:
    exe = promtool()
    queries = panel_queries(path)
    rules = {
        "groups": [
            {
                "name": path.stem,
                "rules": [{"record": f"dashboard:query_{i}", "expr": expr} for i, (_, expr) in enumerate(queries)],
            }
        ]
    }
    rules_file = tmp_path / "queries.rules.yml"
    rules_file.write_text(yaml.safe_dump(rules), encoding="utf-8")
    result = subprocess.run(
        [exe, "check", "rules", str(rules_file)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(queries)} rules found" in result.stdout


def test_promtool_refuses_an_unsubstituted_variable(tmp_path: Path) -> None:
    """The check above can fail: a query with Grafana's $__rate_interval left in is not PromQL."""
    exe = promtool()
    rules_file = tmp_path / "bad.rules.yml"
    rules_file.write_text(
        yaml.safe_dump(
            {"groups": [{"name": "bad", "rules": [{"record": "x:y", "expr": "rate(up[$__rate_interval])"}]}]}
        ),
        encoding="utf-8",
    )
    result = subprocess.run(
        [exe, "check", "rules", str(rules_file)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode != 0


def _write(tmp_path: Path, dash: dict[str, Any]) -> Path:
    path = tmp_path / "dash.json"
    path.write_text(json.dumps(dash), encoding="utf-8")
    return path


def test_panel_queries_substitutes_every_variable_form(tmp_path: Path) -> None:
    dash = {
        "templating": {
            "list": [
                {"name": "instance", "type": "query"},
                {"name": "model", "type": "custom"},
                {"name": "step", "type": "interval", "query": "5m,10m"},
                {"name": "quantile", "type": "constant", "query": "0.99"},
            ]
        },
        "panels": [
            {
                "type": "row",
                "title": "collapsed",
                "collapsed": True,
                "panels": [
                    {
                        "title": "inner",
                        "targets": [
                            {
                                "refId": "A",
                                "expr": 'rate(up{instance=~"$instance", m=~"${model:regex}"}[$__rate_interval])',
                            },
                            {"refId": "B", "expr": 'histogram_quantile($quantile, x{m=~"[[model]]"}[$step])'},
                            {"refId": "C"},
                        ],
                    }
                ],
            },
            {"title": "outer", "targets": [{"refId": "A", "expr": "avg_over_time(up[${__range}])"}]},
        ],
    }
    assert panel_queries(_write(tmp_path, dash)) == [
        ("inner", 'rate(up{instance=~".*", m=~".*"}[1m])'),
        ("inner", 'histogram_quantile(0.99, x{m=~".*"}[5m])'),
        ("outer", "avg_over_time(up[1h])"),
    ]


def test_panel_queries_names_an_unknown_variable(tmp_path: Path) -> None:
    dash = {
        "templating": {"list": []},
        "panels": [{"title": "p", "targets": [{"refId": "A", "expr": "up{x=~'$nope'}"}]}],
    }
    with pytest.raises(PlanError, match=r"panel 'p' target A: uses \$nope.*fix: add nope to templating.list"):
        panel_queries(_write(tmp_path, dash))


def test_panel_queries_refuses_a_file_that_is_not_a_dashboard(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text("{not json", encoding="utf-8")
    with pytest.raises(PlanError, match=r"broken\.json: cannot read the dashboard"):
        panel_queries(path)
