"""vLLM's command line read the way vLLM reads it, to find secrets in extra arguments.

``vllm serve`` parses its arguments with ``FlexibleArgumentParser``
(vllm/utils/argparse_utils.py), an ``argparse.ArgumentParser`` that first
rewrites every argument starting with ``--``: in the option's name (before
``=``, up to the first ``.``) ``_`` becomes ``-``, so ``--api_key`` is
``--api-key``. A dotted name (``--api-key.x v``) is folded into JSON and given
to the option before the dot. The parser keeps argparse's ``allow_abbrev=True``,
so an unambiguous prefix of a long option is that option: ``--api-k`` is
``--api-key``, ``--hf-t=x`` is ``--hf-token=x``.

argparse is case sensitive: ``--API-KEY`` is an unknown option and vLLM exits
with it (and the value) in its error. ``secret_flags`` refuses case variants
too, since refusing is the safe side.

Pure Python, no vLLM import.
"""

from __future__ import annotations

# The options that carry a secret; the planner hands these to vLLM through its
# environment (VLLM_API_KEY, HF_TOKEN) instead.
SECRET_FLAGS = ("--api-key", "--hf-token")


def normalise_flag(arg: str) -> str:
    """The option name vLLM's parser looks up for one argument, or "" when the
    argument is not a long option: ``--api_key=x`` -> ``--api-key``,
    ``--hf_token.sub`` -> ``--hf-token``, ``-tp`` -> "", ``--`` -> "".

    The case is kept, as vLLM keeps it.
    """
    if not arg.startswith("--") or arg == "--":
        return ""
    name = arg[2:].split("=", 1)[0].split(".", 1)[0]
    return "--" + name.replace("_", "-")


def secret_flags(args: list[str]) -> list[str]:
    """The secret options (from ``SECRET_FLAGS``) that ``args`` would set, each
    once, in order of first appearance: exact names, ``=value`` forms,
    underscores, dotted names, any prefix argparse could expand to them, and
    case variants. Values are never returned."""
    found: list[str] = []
    for arg in args:
        name = normalise_flag(arg).lower()
        if len(name) <= len("--"):
            continue
        for flag in SECRET_FLAGS:
            # A prefix that is ambiguous in vLLM (--api, --h) makes argparse fail with
            # the argument, value included, in its message: refused as well.
            if flag.startswith(name) and flag not in found:
                found.append(flag)
    return found
