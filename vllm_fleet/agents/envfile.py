"""Environment files as systemd reads them (EnvironmentFile=): supervise gives a launch
the same environment as its unit would."""

from __future__ import annotations

from pathlib import Path


def read_env(path: str) -> dict[str, str]:
    """The environment file ``path`` (the launch's .env), read as systemd reads it."""
    return parse_env(Path(path).read_text()) if path else {}


_WHITESPACE, _NEWLINE, _COMMENTS, _SHELL_NEED_ESCAPE = " \t\n\r", "\n\r", "#;", '"\\`$'


def parse_env(text: str) -> dict[str, str]:
    """systemd's EnvironmentFile= grammar, so that a launch gets the same environment
    under this supervisor as under its unit (a port of parse_env_file_internal() in
    systemd's src/basic/env-file.c, v254+): KEY=VALUE lines, "#" or ";" comment lines;
    an unquoted value loses surrounding whitespace and a backslash keeps the next
    character; '...' is verbatim; inside "..." a backslash escapes \\ " ` $ and is kept
    before anything else. Nothing is expanded ($ is just a character). Later keys win.
    """
    env: dict[str, str] = {}
    state = "pre_key"
    key: list[str] = []
    value: list[str] = []
    key_ws: int | None = None  # where trailing whitespace of the key starts
    value_ws: int | None = None  # where trailing whitespace of an unquoted value starts

    def push(chomp: bool) -> None:
        name = "".join(key[:key_ws] if key_ws is not None else key)
        env[name] = "".join(value[:value_ws] if chomp and value_ws is not None else value)
        key.clear()
        value.clear()

    for c in text:
        if state == "pre_key":
            if c in _COMMENTS:
                state = "comment"
            elif c not in _WHITESPACE:
                state, key_ws = "key", None
                key.append(c)
        elif state == "key":
            if c in _NEWLINE:  # a line without "=" is ignored
                state = "pre_key"
                key.clear()
            elif c == "=":
                state, value_ws = "pre_value", None
            else:
                if c not in _WHITESPACE:
                    key_ws = None
                elif key_ws is None:
                    key_ws = len(key)
                key.append(c)
        elif state == "pre_value":
            if c in _NEWLINE:
                state = "pre_key"
                push(chomp=False)
            elif c == "'":
                state = "single_quote"
            elif c == '"':
                state = "double_quote"
            elif c == "\\":
                state = "value_escape"
            elif c not in _WHITESPACE:
                state = "value"
                value.append(c)
        elif state == "value":
            if c in _NEWLINE:
                state = "pre_key"
                push(chomp=True)
            elif c == "\\":
                state, value_ws = "value_escape", None
            else:
                if c not in _WHITESPACE:
                    value_ws = None
                elif value_ws is None:
                    value_ws = len(value)
                value.append(c)
        elif state == "value_escape":
            state = "value"
            if c not in _NEWLINE:  # an escaped newline continues the line
                value.append(c)
        elif state == "single_quote":
            if c == "'":
                state = "pre_value"
            else:
                value.append(c)
        elif state == "double_quote":
            if c == '"':
                state = "pre_value"
            elif c == "\\":
                state = "double_quote_escape"
            else:
                value.append(c)
        elif state == "double_quote_escape":
            state = "double_quote"
            if c in _SHELL_NEED_ESCAPE:
                value.append(c)
            elif c != "\n":
                value += ["\\", c]
        elif state == "comment":
            if c == "\\":
                state = "comment_escape"
            elif c in _NEWLINE:
                state = "pre_key"
        else:  # comment_escape
            state = "pre_key" if c in _NEWLINE else "comment"
    if state not in ("pre_key", "key", "comment", "comment_escape"):
        push(chomp=state == "value")
    return env
