"""The monitoring role's Prometheus alert rules: promtool checks and runs their unit tests, and every
alert has a test that fires it, one that asserts it stays quiet, a severity and a fix."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from typing import Any

import pytest
import yaml

from tests.conftest import ROOT
from vllm_fleet.deploy.dashboards import SCRAPE_JOBS, vllm_name_problems

RULES_DIR = ROOT / "roles/monitoring/files/rules"
RULES = RULES_DIR / "vllm-fleet.rules.yml"
RULE_TESTS = sorted((RULES_DIR / "tests").glob("*.yml"))
SEVERITIES = {"critical", "warning", "info"}
# The alerts the fleet promises (issue 14); more may follow, none of these may go.
REQUIRED_ALERTS = {
    "VllmInstanceDown",
    "RayNodeDown",
    "GatewayDown",
    "NodeExporterDown",
    "VllmKvCacheNearlyFull",
    "VllmPreemptions",
    "VllmWaitingQueueGrowing",
    "VllmTimeToFirstTokenHigh",
    "DcgmXidErrors",
    "DcgmEccDoubleBitErrors",
    "DcgmGpuTemperatureHigh",
}


def promtool() -> str:
    """promtool's path; skips the test where it is missing, unless VLLM_FLEET_PROMTOOL_REQUIRED=1 (CI)."""
    path = shutil.which("promtool")
    if path is None:
        if os.environ.get("VLLM_FLEET_PROMTOOL_REQUIRED") == "1":
            pytest.fail("promtool is not installed and VLLM_FLEET_PROMTOOL_REQUIRED=1: apt-get install prometheus")
        pytest.skip("promtool is not installed (apt-get install prometheus)")
    return path


def _alerts() -> list[dict[str, Any]]:
    data = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    return [rule for group in data["groups"] for rule in group["rules"] if "alert" in rule]


def _rule_tests() -> list[dict[str, Any]]:
    """Every alert_rule_test entry of every promtool test file."""
    out = []
    for path in RULE_TESTS:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        for test in data["tests"]:
            out.extend(test.get("alert_rule_test", []))
    return out


def test_promtool_check_rules() -> None:
    result = subprocess.run(
        [promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(_alerts())} rules found" in result.stdout


def test_promtool_test_rules() -> None:
    assert RULE_TESTS, "no promtool test files"
    result = subprocess.run(
        [promtool(), "test", "rules", *map(str, RULE_TESTS)],
        cwd=RULES_DIR / "tests",
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (result.stdout + result.stderr).count("SUCCESS") == len(RULE_TESTS)


def test_the_test_files_load_the_rules_file() -> None:
    for path in RULE_TESTS:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        assert [(path.parent / f).resolve() for f in data["rule_files"]] == [RULES.resolve()], path


def test_the_required_alerts_exist_once() -> None:
    names = [rule["alert"] for rule in _alerts()]
    assert len(names) == len(set(names)), names
    assert set(names) >= REQUIRED_ALERTS, REQUIRED_ALERTS - set(names)


@pytest.mark.parametrize("rule", _alerts(), ids=lambda rule: rule["alert"])
def test_alert_has_severity_summary_and_a_fix(rule: dict[str, Any]) -> None:
    assert rule.get("labels", {}).get("severity") in SEVERITIES
    annotations = rule.get("annotations", {})
    assert annotations.get("summary", "").strip()
    description = annotations.get("description", "")
    # The description says what happened and then what to do about it.
    head, sep, fix = description.partition("Fix:")
    assert sep and head.strip() and len(fix.split()) >= 5, description


@pytest.mark.parametrize("rule", _alerts(), ids=lambda rule: rule["alert"])
def test_alert_is_tested_firing_and_quiet(rule: dict[str, Any]) -> None:
    cases = [case for case in _rule_tests() if case["alertname"] == rule["alert"]]
    assert any(case.get("exp_alerts") for case in cases), f"no test case fires {rule['alert']}"
    assert any(not case.get("exp_alerts") for case in cases), f"no test case asserts {rule['alert']} stays quiet"
    for case in cases:
        for alert in case.get("exp_alerts") or []:
            assert alert["exp_labels"]["severity"] == rule["labels"]["severity"]
            # promtool compares annotations exactly: a test without them would fail, so they are
            # there and render the templates (no {{ left in).
            assert set(alert.get("exp_annotations", {})) == set(rule["annotations"]), rule["alert"]


@pytest.mark.parametrize("rule", _alerts(), ids=lambda rule: rule["alert"])
def test_alert_uses_known_vllm_metrics_and_jobs(rule: dict[str, Any]) -> None:
    expr = rule["expr"]
    assert vllm_name_problems(expr) == []
    for job in re.findall(r'job=~?"([^"]*)"', expr):
        assert job in SCRAPE_JOBS, f"{rule['alert']}: job {job!r} is not one the monitoring role renders"


def test_vllm_name_check_catches_the_usual_mistakes() -> None:
    assert vllm_name_problems("increase(vllm:num_preemptions_total[5m]) > 0") == []
    assert vllm_name_problems("vllm:num_preemptions_total > 0")  # a counter read raw
    assert vllm_name_problems("increase(vllm:num_preemptions[5m]) > 0")  # the registered name, not the series
    assert vllm_name_problems("rate(vllm:kv_cache_usage_perc[5m])")  # a gauge given to rate()
    assert vllm_name_problems("vllm:time_per_output_token_seconds_bucket")  # gone in vLLM 0.32
    assert vllm_name_problems("rate(vllm:iteration_tokens_total[5m])")  # a histogram: _total_bucket
    assert vllm_name_problems("rate(vllm:iteration_tokens_total_bucket[5m])") == []
