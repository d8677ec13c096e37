"""Secret options in extra arguments, found the way vLLM's parser reads them."""

from __future__ import annotations

import argparse
import re
from typing import Any

import pytest

from vllm_fleet.cli_args import normalise_flag, secret_flags
from vllm_fleet.deploy.serve import ServeOptions
from vllm_fleet.errors import PlanError


@pytest.mark.parametrize(
    ("arg", "name"),
    [
        ("--api-key", "--api-key"),
        ("--api_key", "--api-key"),
        ("--api_key=s3cret", "--api-key"),
        ("--hf_token.sub=x", "--hf-token"),
        ("--served_model_name=a_b", "--served-model-name"),
        ("--API_Key", "--API-Key"),
        ("--max-model-len=a_b.c", "--max-model-len"),
        ("-tp", ""),
        ("--", ""),
        ("value_with_underscores", ""),
    ],
    ids=[
        "dashes", "underscores", "equals-value", "dotted", "value-kept", "case-kept",
        "value-not-normalised", "short-option", "end-of-options", "positional",
    ],
)  # fmt: skip
def test_normalise_flag_is_what_vllm_looks_up(arg: str, name: str) -> None:
    assert normalise_flag(arg) == name


@pytest.mark.parametrize(
    ("args", "found"),
    [
        (["--api-key", "x"], ["--api-key"]),
        (["--api-key=x"], ["--api-key"]),
        (["--api_key", "x"], ["--api-key"]),
        (["--api_key=x"], ["--api-key"]),
        (["--api-k", "x"], ["--api-key"]),
        (["--api-ke=x"], ["--api-key"]),
        (["--api", "x"], ["--api-key"]),
        (["--api-key.x", "v"], ["--api-key"]),
        (["--API-KEY", "x"], ["--api-key"]),
        (["--Api_Key=x"], ["--api-key"]),
        (["--hf-token", "x"], ["--hf-token"]),
        (["--hf_token=x"], ["--hf-token"]),
        (["--hf-t", "x"], ["--hf-token"]),
        (["--HF_TOKEN=x"], ["--hf-token"]),
        (["--hf-token=a", "--api_key=b", "--hf_token=c"], ["--hf-token", "--api-key"]),
        (["--seed", "1", "--api-server-count", "2"], []),
        (["--api-key-file", "/k"], []),
        (["--hf-overrides", "{}"], []),
        (["--hf-config-path", "/c"], []),
        (["-tp", "2", "--", "x"], []),
        (["--served-model-name", "api-key"], []),
        ([], []),
    ],
    ids=[
        "exact", "exact-equals", "underscore", "underscore-equals", "abbreviation", "abbreviation-equals",
        "ambiguous-prefix", "dotted", "upper-case", "mixed-case", "hf-exact", "hf-underscore",
        "hf-abbreviation", "hf-upper-case", "both-once-in-order", "other-api-flag", "longer-name",
        "other-hf-flag", "hf-config", "short-and-end", "value-named-like-a-flag", "empty",
    ],
)  # fmt: skip
def test_secret_flags(args: list[str], found: list[str]) -> None:
    assert secret_flags(args) == found


def _vllm_like_parser() -> argparse.ArgumentParser:
    """A stand-in for vllm serve's parser: argparse with the default allow_abbrev and
    a few of vLLM's options that share a prefix with the secret ones."""
    parser = argparse.ArgumentParser(exit_on_error=False)
    for flag in ("--api-key", "--api-server-count", "--hf-token", "--hf-overrides", "--hf-config-path", "--seed"):
        parser.add_argument(flag)
    return parser


def _as_vllm_rewrites(args: list[str]) -> list[str]:
    """FlexibleArgumentParser's rewrite of names: `_` to `-` before `=` and the first `.`."""
    out = []
    for arg in args:
        if arg.startswith("--"):
            key, eq, value = arg.partition("=")
            key = re.sub(r"(?<=--)[^.]*", lambda m: m.group(0).replace("_", "-"), key, count=1)
            out.append(key + eq + value)
        else:
            out.append(arg)
    return out


@pytest.mark.parametrize(
    "args",
    [["--api_key", "s"], ["--api-k=s"], ["--api_k", "s"], ["--hf_t=s"], ["--hf-tok", "s"]],
    ids=["underscore", "abbreviation", "underscore-abbreviation", "hf-underscore-abbreviation", "hf-abbreviation"],
)
def test_every_form_argparse_accepts_as_a_secret_is_found(args: list[str]) -> None:
    parsed = vars(_vllm_like_parser().parse_args(_as_vllm_rewrites(args)))
    set_by_args = {"--" + dest.replace("_", "-") for dest, value in parsed.items() if value == "s"}
    assert set_by_args and set_by_args <= {"--api-key", "--hf-token"}
    assert secret_flags(args) == sorted(set_by_args)


@pytest.mark.parametrize(
    ("extra_args", "flag"),
    [(["--api_key", "x"], "--api-key"), (["--api-k=x"], "--api-key"), (["--hf_token=x"], "--hf-token")],
    ids=["underscore", "abbreviation", "hf-underscore"],
)
def test_serve_options_refuse_the_secret_forms(extra_args: list[str], flag: str) -> None:
    with pytest.raises(PlanError, match=f"vllm_fleet_extra_args: holds {flag}: a secret on the command line"):
        ServeOptions.from_dict({"extra_args": extra_args})


def test_serve_options_keep_other_extra_args() -> None:
    options: dict[str, Any] = {"extra_args": ["--api-server-count", "2", "--hf-overrides", "{}"]}
    assert ServeOptions.from_dict(options).extra_args == ["--api-server-count", "2", "--hf-overrides", "{}"]
