"""Served model names: what the planner lets through to the files on the nodes."""

from __future__ import annotations

import pytest

from vllm_fleet.errors import PlanError
from vllm_fleet.names import SERVED_NAME_MAX, check_served_name


@pytest.mark.parametrize(
    "name",
    [
        "tiny-llama",
        "meta-llama/Llama-3.1-8B",
        "deepseek-ai/DeepSeek-R1",
        "Qwen/Qwen2.5-72B-Instruct-AWQ",
        "org_name/model.v2:latest",
        "7b",
        "a" * SERVED_NAME_MAX,
    ],
    ids=["plain", "hub-name", "hub-name-2", "hub-awq", "all-allowed-punctuation", "digit-first", "longest"],
)
def test_valid_served_names_pass_unchanged(name: str) -> None:
    assert check_served_name(name) == name


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        ("tiny\nEvil=1", r"'tiny\\nEvil=1'"),
        ("tiny\r", r"'tiny\\r'"),
        ("my model", "'my model'"),
        ('x"y', "'x\"y'"),
        ("cost$HOME", r"'cost\$HOME'"),
        ("100%", "'100%'"),
        ("a#b", "'a#b'"),
        ("a;b", "'a;b'"),
        ("back\\slash", r"'back\\\\slash'"),
        ("--api-key", "'--api-key'"),
        ("/abs/path", "'/abs/path'"),
        (".hidden", "'.hidden'"),
        ("modèle", "'modèle'"),
        ("", "''"),
        ("a" * (SERVED_NAME_MAX + 1), r"'a{76}\.\.\."),
        (7, "7"),
        (None, "None"),
    ],
    ids=[
        "newline", "carriage-return", "space", "double-quote", "dollar", "percent", "hash", "semicolon",
        "backslash", "option-like", "leading-slash", "leading-dot", "non-ascii", "empty", "too-long",
        "not-a-string", "none",
    ],
)  # fmt: skip
def test_bad_served_names_name_the_field_and_the_fix(name: object, shown: str) -> None:
    with pytest.raises(PlanError, match=rf"^vllm_fleet_served_model_name: {shown}") as err:
        check_served_name(name)
    assert err.value.field == "vllm_fleet_served_model_name"
    assert "meta-llama/Llama-3.1-8B" in err.value.fix
    assert "\n" not in str(err.value)
