"""The vllm_server role's supervisor for hosts without systemd, with real processes."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import jinja2
import pytest

from tests.conftest import ROOT, agent
from vllm_fleet.agents.envfile import parse_env


def _call(state: Path, *args: str) -> dict[str, object]:
    out = subprocess.run(
        [*agent("supervise"), *args[:1], "--state", str(state), "--name", "t", *args[1:]],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def _wait_for(predicate, timeout: float = 15) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def test_start_is_idempotent_restarts_on_change_and_stop_ends_the_group(tmp_path: Path) -> None:
    env = tmp_path / "t.env"
    env.write_text("GREETING=hello\n")
    cmd = [sys.executable, "-c", "import os, time; print(os.environ['GREETING'], flush=True); time.sleep(60)"]
    first = _call(tmp_path, "start", "--env-file", str(env), "--", *cmd)
    assert first["changed"] is True
    log = tmp_path / "t.log"
    assert _wait_for(lambda: log.exists() and "hello" in log.read_text())
    assert _call(tmp_path, "start", "--env-file", str(env), "--", *cmd)["changed"] is False
    child = _call(tmp_path, "status")["child"]

    env.write_text("GREETING=again\n")  # a changed environment restarts it
    assert _call(tmp_path, "start", "--env-file", str(env), "--", *cmd)["changed"] is True
    assert _wait_for(lambda: "again" in log.read_text())
    assert not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().split(")")[1][:3]

    status = _call(tmp_path, "status")
    assert status["running"] is True and status["restarts"] == 0
    assert _call(tmp_path, "stop")["changed"] is True
    assert _call(tmp_path, "status")["running"] is False
    assert _wait_for(lambda: not Path(f"/proc/{status['child']}").exists())


def test_a_failing_command_is_restarted_and_counted(tmp_path: Path) -> None:
    cmd = [sys.executable, "-c", "import sys; print('boom', flush=True); sys.exit(3)"]
    _call(tmp_path, "start", "--", *cmd)
    assert _wait_for(lambda: int(_call(tmp_path, "status")["restarts"]) >= 1)  # type: ignore[call-overload]
    assert "exited with 3, restarting" in (tmp_path / "t.log").read_text()
    _call(tmp_path, "stop")
    assert _call(tmp_path, "status")["running"] is False


# A value with everything an environment file must carry: spaces (leading and trailing too),
# both quotes, $ and ${...} (never expanded), #, ;, a backtick, backslashes, %.
TRICKY = " a \"b\" 'c' $HOME ${PATH} #d ;e `f` \\g\\ 100% "


@pytest.mark.parametrize(
    ("text", "env"),
    [
        ("A=1\nB=two words\n", {"A": "1", "B": "two words"}),
        ("A=  padded  \n", {"A": "padded"}),
        ('A="  kept  "\n', {"A": "  kept  "}),
        ("A='single $x \\n'\n", {"A": "single $x \\n"}),
        ('A="q \\" b \\\\ d \\$ t \\` x \\n"\n', {"A": 'q " b \\ d $ t ` x \\n'}),
        ('A="$HOME ${PATH}"\n', {"A": "$HOME ${PATH}"}),
        ("A=x #not a comment\n", {"A": "x #not a comment"}),
        ("# comment\n; comment\n  # indented\nA=1\n", {"A": "1"}),
        ("A=1\nno equals sign\nB=2\n", {"A": "1", "B": "2"}),
        ("A=un\\ quoted\\\\\n", {"A": "un quoted\\"}),
        ("A=line \\\ncontinued\n", {"A": "line continued"}),
        ('A="multi\nline"\n', {"A": "multi\nline"}),
        ("A=\nB=\"\"\n", {"A": "", "B": ""}),
        ("A=1\nA=2\n", {"A": "2"}),
        ("A = spaced \n", {"A": "spaced"}),
        ('A="no final newline"', {"A": "no final newline"}),
        ("A=x\r\nB=y\r\n", {"A": "x", "B": "y"}),
    ],
    ids=[
        "plain", "unquoted-trimmed", "double-quoted-kept", "single-quoted-verbatim", "double-quote-escapes",
        "no-expansion", "hash-inside-value", "comments", "line-without-equals", "unquoted-backslash",
        "unquoted-continuation", "double-quoted-newline", "empty", "last-wins", "spaces-around-equals",
        "no-final-newline", "crlf",
    ],
)  # fmt: skip
def test_parse_env_reads_systemd_environment_files(text: str, env: dict[str, str]) -> None:
    assert parse_env(text) == env


def _render_env_file(mode: str, env: dict[str, str]) -> str:
    """roles/vllm_server/templates/launch.env.j2 as Ansible renders it (trim_blocks)."""
    environment = jinja2.Environment(trim_blocks=True, undefined=jinja2.StrictUndefined)
    environment.filters["regex_replace"] = lambda value, pattern, replacement="": re.sub(pattern, replacement, value)
    template = environment.from_string((ROOT / "roles/vllm_server/templates/launch.env.j2").read_text())
    launch = {"name": "vllm-t-0", "instance": "t-0", "role": "head", "serves": True, "env": env}
    return template.render(
        ansible_managed="Ansible managed", item=launch, vllm_server_env={}, __vllm_server_mode=mode,
        __vllm_server_launch_secrets={"vllm-t-0": {"VLLM_API_KEY": 'k"$ey\\'}},
    )  # fmt: skip


def test_the_env_file_template_and_the_supervisor_agree_on_every_value() -> None:
    env = {"TRICKY": TRICKY, "PLAIN": "1", "EMPTY": "", "NUMBER": "8000"}
    text = _render_env_file("process", env)
    assert parse_env(text) == {**env, "VLLM_API_KEY": 'k"$ey\\'}
    assert 'TRICKY=" a \\"b\\" \'c\' \\$HOME \\${PATH} #d ;e \\`f\\` \\\\g\\\\ 100% "' in text.splitlines()


def test_the_container_env_file_stays_literal() -> None:
    # community.docker reads KEY=VALUE literally: no quotes may be added for it.
    text = _render_env_file("container", {"A": 'x "y" $z'})
    # The key is not in it: a container's environment is part of its configuration (docker inspect).
    assert 'A=x "y" $z' in text.splitlines() and "VLLM_API_KEY" not in text


def test_the_container_secrets_file_gives_sh_every_value_as_it_is(tmp_path: Path) -> None:
    """launch.secrets.j2, read by the container's entry point (sh: set -a; . FILE)."""
    environment = jinja2.Environment(trim_blocks=True, undefined=jinja2.StrictUndefined)
    environment.filters["regex_replace"] = lambda value, pattern, replacement="": re.sub(pattern, replacement, value)
    template = environment.from_string((ROOT / "roles/vllm_server/templates/launch.secrets.j2").read_text())
    secrets = {"VLLM_API_KEY": "k'\"$ey\\ `x` $(id)", "HF_TOKEN": "hf_plain"}
    launch = {"name": "vllm-t-0", "instance": "t-0"}
    path = tmp_path / "launch.secrets"
    path.write_text(
        template.render(ansible_managed="m", item=launch, __vllm_server_launch_secrets={"vllm-t-0": secrets})
    )
    script = 'set -a; . "$0"; set +a; printf "%s\\n%s" "$VLLM_API_KEY" "$HF_TOKEN"'
    done = subprocess.run(["sh", "-c", script, str(path)], capture_output=True, text=True, check=True, env={})
    assert done.stdout.split("\n") == [secrets["VLLM_API_KEY"], "hf_plain"]


def test_a_supervised_command_gets_the_values_exactly(tmp_path: Path) -> None:
    env = tmp_path / "t.env"
    env.write_text(_render_env_file("process", {"TRICKY": TRICKY}))
    out = tmp_path / "seen"
    cmd = [
        sys.executable,
        "-c",
        f"import os, time; open({str(out)!r}, 'w').write(os.environ['TRICKY']); time.sleep(60)",
    ]
    _call(tmp_path, "start", "--env-file", str(env), "--", *cmd)
    try:
        assert _wait_for(lambda: out.exists() and out.read_text() == TRICKY), out.read_text() if out.exists() else None
    finally:
        _call(tmp_path, "stop")
