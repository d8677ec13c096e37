"""What applying a plan will start, restart or stop, node by node, like ``terraform plan``.

Two states of the same shape are compared::

    {"nodes": {NODE: {"launches": [LAUNCH, ...], "ray": RAY | None}},
     "gateways": {HOST: {"port": 8080, "upstreams": ["10.77.0.12:8000", ...]}}}

* the **applied** state is what the roles recorded on the nodes: each started launch's
  ``<name>.launch.json`` (roles/vllm_server, :func:`launch_state` computes the same
  fields), the Ray membership (``cluster.json`` of roles/ray_cluster) and the gateway's
  ``gateway.json`` (roles/llm_gateway);
* the **planned** state comes from the new deployment records (:func:`planned_state`).

:func:`diff` names what the roles would do: a launch restarts when its argv, group wrapper,
environment (secrets included), runtime or (containers) image changes, as the role
decides; a new pip requirement alone is installed without a restart (a venv that holds
every requirement is kept). A rank of a multi-node group restarts with the group. Ray
no longer planned on a node is stopped (playbooks/cluster.yml); a gateway no longer
planned on a host is left running (``leave``). Secret-like environment values (``*TOKEN*``,
``*KEY*``, ``*SECRET*``, ``*PASSWORD*``) are only ever a sha256 prefix here, and
changes to them are reported as "changed", never with a value.

Pure Python, no Ansible import.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vllm_fleet.deploy.records import RECORD_ROLE_VARS
from vllm_fleet.errors import PlanError
from vllm_fleet.planning.table import format_table

FORMAT = "vllm-fleet-applied/1"
SECRET_NAME = re.compile(r"TOKEN|KEY|SECRET|PASSWORD", re.IGNORECASE)
# The secrets the vllm_server role adds to a launch's environment (not in the record).
MANAGED_SECRETS = ("VLLM_API_KEY", "HF_TOKEN")
# A secret-like value whose digest was left out (artifacts): present, value unknown.
REDACTED = "(secret)"
ARROW = "\N{RIGHTWARDS ARROW}"
_INTERRUPTS = ("restart", "stop")


def is_secret(name: str) -> bool:
    """Whether an environment variable's value is never shown (VLLM_API_KEY, HF_TOKEN, *TOKEN*...)."""
    return bool(SECRET_NAME.search(name))


def digest(value: object) -> str:
    """What a secret-like value is recorded as: ``sha256:`` and 12 hex digits (the role's
    ``'sha256:' ~ (value | string | hash('sha256'))[:12]``)."""
    text = str(value)
    if text == REDACTED:
        return REDACTED
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:12]


def _recorded_env(env: Mapping[str, Any]) -> dict[str, str]:
    return {str(k): digest(v) if is_secret(str(k)) else str(v) for k, v in sorted(env.items())}


def redact(env: Mapping[str, Any]) -> dict[str, str]:
    """``env`` with every secret-like value replaced by ``(secret)`` (for artifacts)."""
    return {str(k): REDACTED if is_secret(str(k)) else str(v) for k, v in sorted(env.items())}


def launch_state(
    launch: Mapping[str, Any],
    *,
    runtime: str,
    package: str,
    image: str,
    server_env: Mapping[str, Any] | None = None,
    secrets: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """What roles/vllm_server records for ``launch`` (templates/launch.json.j2): the
    launch's environment with ``vllm_server_env`` and the secrets the role adds (the API
    key on the serving launch, the Hub token), secret-like values as a digest; the pip
    requirement on the systemd runtime, the image in containers."""
    env: dict[str, Any] = {**dict(launch.get("env") or {}), **dict(server_env or {})}
    given = dict(secrets or {})
    if launch.get("serves") and given.get("VLLM_API_KEY"):
        env["VLLM_API_KEY"] = given["VLLM_API_KEY"]
    if given.get("HF_TOKEN"):
        env["HF_TOKEN"] = given["HF_TOKEN"]
    return {
        "name": str(launch["name"]),
        "instance": str(launch["instance"]),
        "executor": str(launch.get("executor") or ""),
        "argv": [str(a) for a in launch["argv"]],
        "wrapper": [str(a) for a in launch.get("wrapper") or []],
        "env": _recorded_env(env),
        "runtime": runtime,
        "package": package if runtime == "systemd" else "",
        "image": image if runtime == "container" else "",
        "serves": bool(launch.get("serves")),
    }


def requirements(record: Mapping[str, Any]) -> str:
    """The pip requirements the role installs for ``record`` (``vllm_server_package`` and
    ``vllm_server_extra_packages``, space-separated as its marker file holds them)."""
    vllm = record["vllm"]
    return " ".join([str(vllm.get("package") or ""), *[str(p) for p in vllm.get("extra_packages") or []]])


def node_state(
    record: Mapping[str, Any],
    *,
    server_env: Mapping[str, Any] | None = None,
    image: str | None = None,
    secrets: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """One node's planned state from its deployment record. ``image``: the serving image
    the prepare phase names (default: the record's); ``secrets``: the API key and Hub
    token, hashed here and never kept; None when unknown (a laptop), so they are not compared."""
    runtime = str(record["runtime"])
    launches = [
        launch_state(
            launch,
            runtime=runtime,
            package=requirements(record),
            image=image or str(record["vllm"]["image"]),
            server_env=server_env,
            secrets=secrets,
        )
        for launch in record["launches"]
    ]
    ray = record.get("ray")
    return {
        "launches": launches,
        "ray": None
        if ray is None
        else {
            "name": ray["name"],
            "head": ray["head"],
            "members": list(ray["members"]),
            "version": str(ray["version"]),
            "runtime": runtime,
        },
        "secrets_known": secrets is not None,
    }


def planned_state(
    nodes: Mapping[str, Mapping[str, Any]],
    records: Mapping[str, Mapping[str, Any]],
    gateway: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The planned state: ``nodes`` as :func:`node_state` gives them, and the gateway: the
    deployment's (``gateway``, vllm_fleet/deploy/records.py deployment_of), else the one the gateway
    host's record holds (``records``: the deployment records)."""
    gateways: dict[str, Any] = {}
    held = [r["gateway"] for r in records.values() if "upstreams" in (r.get("gateway") or {})]
    gw = gateway if gateway is not None else (held[0] if held else None)
    if gw and gw.get("enabled"):
        gateways[str(gw["host"])] = {"port": int(gw["port"]), "upstreams": [str(u) for u in gw["upstreams"]]}
    return {"nodes": {str(k): dict(v) for k, v in nodes.items()}, "gateways": gateways}


def applied_state(raw: Mapping[str, Any]) -> dict[str, Any]:
    """An applied state read back (the play's or a saved ``preview.json``), checked:
    PlanError naming the field when it is not one."""
    if not isinstance(raw, Mapping):
        raise PlanError("--diff", "not a JSON object", "pass artifacts/preview.json or an applied state")
    state = raw.get("applied", raw)
    if not isinstance(state, Mapping) or not isinstance(state.get("nodes"), Mapping):
        raise PlanError("--diff", "no 'nodes' (nor 'applied.nodes') object", "pass artifacts/preview.json")
    nodes: dict[str, Any] = {}
    for name, node in state["nodes"].items():
        if not isinstance(node, Mapping) or not isinstance(node.get("launches", []), list):
            raise PlanError("--diff", f"nodes.{name}: launches must be a list", "pass artifacts/preview.json")
        launches = []
        for i, launch in enumerate(node.get("launches") or []):
            if (
                not isinstance(launch, Mapping)
                or not isinstance(launch.get("name"), str)
                or not isinstance(launch.get("argv"), list)
            ):
                raise PlanError("--diff", f"nodes.{name}.launches[{i}]: needs a name and an argv list", "")
            launches.append(dict(launch))
        ray = node.get("ray")
        if ray is not None and not (isinstance(ray, Mapping) and isinstance(ray.get("members"), list)):
            raise PlanError("--diff", f"nodes.{name}.ray: needs members (a list) or null", "")
        nodes[str(name)] = {"launches": launches, "ray": dict(ray) if ray else None}
    gateways: dict[str, Any] = {}
    for host, gw in (state.get("gateways") or {}).items():
        if not isinstance(gw, Mapping) or not isinstance(gw.get("upstreams"), list):
            raise PlanError("--diff", f"gateways.{host}: needs upstreams (a list)", "")
        gateways[str(host)] = {"port": int(gw.get("port") or 0), "upstreams": [str(u) for u in gw["upstreams"]]}
    return {"nodes": nodes, "gateways": gateways}


def redacted_state(state: Mapping[str, Any]) -> dict[str, Any]:
    """``state`` as it may be written down: secret-like values as ``(secret)``, no digests."""
    nodes = {
        name: {
            **node,
            "launches": [{**launch, "env": redact(launch.get("env") or {})} for launch in node.get("launches") or []],
        }
        for name, node in state["nodes"].items()
    }
    return {"format": FORMAT, "nodes": nodes, "gateways": dict(state.get("gateways") or {})}


def safe_inputs(settings: Mapping[str, Any], context: Mapping[str, Any]) -> dict[str, Any]:
    """What a laptop needs to compute the same records again (``vllm-fleet plan --diff``):
    the node's resolved settings (extra_env's secret-like values redacted; the secrets
    themselves are never in them) and context (only the role variables the record reads)."""
    kept = dict(settings)
    kept["extra_env"] = redact(kept.get("extra_env") or {})
    ctx = {k: v for k, v in context.items() if k != "role_vars"}
    ctx["role_vars"] = {k: v for k, v in (context.get("role_vars") or {}).items() if k in RECORD_ROLE_VARS}
    return {"settings": kept, "context": ctx}


# ---------------------------------------------------------------- the comparison


@dataclass(frozen=True)
class Field:
    """One changed field: ``field`` is argv, model, env, wrapper, executor, runtime, image,
    package, head, version, members, upstream or port; ``name`` the flag or variable."""

    field: str
    name: str
    change: str  # changed, added, removed
    before: str | None = None
    after: str | None = None
    secret: bool = False

    def text(self) -> str:
        label = self.name or self.field
        if self.secret:
            return f"{label} {self.change}"
        if self.field == "env":
            if self.change == "added":
                return f"{label}={self.after} added"
            if self.change == "removed":
                return f"{label}={self.before} removed"
        if self.field == "upstream":
            return f"upstream {self.after or self.before} {self.change}"
        if self.change == "added":
            return f"{label} {self.after} added" if self.after else f"{label} added"
        if self.change == "removed":
            return f"{label} {self.before} removed" if self.before else f"{label} removed"
        return f"{label} {self.before or '(none)'} {ARROW} {self.after or '(none)'}"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"field": self.field, "name": self.name, "change": self.change}
        if self.secret:
            out["secret"] = True
        else:
            out["before"], out["after"] = self.before, self.after
        return out


@dataclass
class Change:
    """What happens to one thing on one node: ``component`` vllm (a launch), ray or
    gateway; ``action`` start, restart, stop, nothing, reinstall (the requirement alone
    changed), reload (nginx) or leave (a gateway no longer planned, left running)."""

    node: str
    component: str
    subject: str
    action: str
    reason: str = ""
    fields: list[Field] = field(default_factory=list)
    unit: str = ""
    model: str = ""
    notes: list[str] = field(default_factory=list)

    def details(self) -> str:
        return ", ".join([*([self.reason] if self.reason else []), *(f.text() for f in self.fields), *self.notes])

    def line(self) -> str:
        shown = self.details()
        return f"{self.subject} on {self.node}: {self.action}" + (f" ({shown})" if shown else "")

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "component": self.component,
            "subject": self.subject,
            "action": self.action,
            "reason": self.reason,
            "fields": [f.to_dict() for f in self.fields],
            "unit": self.unit,
            "model": self.model,
            "notes": list(self.notes),
            "line": self.line(),
        }


@dataclass
class Preview:
    changes: list[Change]
    warnings: list[str]

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for c in self.changes:
            out[c.action] = out.get(c.action, 0) + 1
        return out

    def summary(self) -> str:
        counts = self.counts()
        order = ("restart", "start", "stop", "reinstall", "reload", "leave", "nothing")
        shown = ", ".join(f"{counts[a]} {a}" for a in order if counts.get(a))
        return f"{len(self.changes)} item(s): {shown or 'nothing planned'}; {len(self.warnings)} warning(s)"

    def lines(self) -> list[str]:
        return [c.line() for c in self.changes] + [f"warning: {w}" for w in self.warnings] + [self.summary()]

    def by_node(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for c in self.changes:
            out.setdefault(c.node, []).append(c.line())
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "changes": [c.to_dict() for c in self.changes],
            "warnings": list(self.warnings),
            "counts": self.counts(),
            "summary": self.summary(),
            "lines": self.lines(),
            "by_node": self.by_node(),
        }


def parse_argv(argv: list[str]) -> tuple[list[str], dict[str, list[str | None]]]:
    """``vllm serve MODEL --flag value --switch`` as (positionals, {flag: [value or None, ...]}):
    a token after a ``--flag`` that does not start with ``--`` is its value; ``--flag=value`` too."""
    positional: list[str] = []
    flags: dict[str, list[str | None]] = {}
    i = 0
    while i < len(argv):
        token = str(argv[i])
        if token.startswith("--") and token != "--":
            name, eq, inline = token.partition("=")
            if eq:
                value: str | None = inline
            elif i + 1 < len(argv) and not str(argv[i + 1]).startswith("--"):
                value = str(argv[i + 1])
                i += 1
            else:
                value = None
            flags.setdefault(name, []).append(value)
        elif not flags:
            positional.append(token)
        else:  # a value after a value (--flag a b): keep it with the flag before
            last = list(flags)[-1]
            flags[last].append(token)
        i += 1
    return positional, flags


def _flag_value(values: list[str | None]) -> str:
    return " ".join(v for v in values if v is not None)


def _argv_fields(before: list[str], after: list[str]) -> list[Field]:
    pos_b, flags_b = parse_argv(before)
    pos_a, flags_a = parse_argv(after)
    out: list[Field] = []
    if pos_b[2:3] != pos_a[2:3]:  # vllm serve MODEL
        out.append(Field("model", "model", "changed", " ".join(pos_b[2:]), " ".join(pos_a[2:])))
    elif pos_b != pos_a:
        out.append(Field("argv", "command", "changed", " ".join(pos_b), " ".join(pos_a)))
    for name in [*flags_b, *(n for n in flags_a if n not in flags_b)]:
        secret = is_secret(name)
        if name not in flags_a:
            out.append(Field("argv", name, "removed", None if secret else _flag_value(flags_b[name]), secret=secret))
        elif name not in flags_b:
            out.append(
                Field("argv", name, "added", after=None if secret else _flag_value(flags_a[name]), secret=secret)
            )
        elif flags_b[name] != flags_a[name]:
            b, a = _flag_value(flags_b[name]), _flag_value(flags_a[name])
            out.append(Field("argv", name, "changed", None if secret else b, None if secret else a, secret))
    return out


def _env_fields(before: Mapping[str, str], after: Mapping[str, str], secrets_known: bool) -> list[Field]:
    out: list[Field] = []
    for key in sorted(set(before) | set(after)):
        if not secrets_known and key in MANAGED_SECRETS:
            continue  # a laptop does not know the secrets: not compared
        secret = is_secret(key)
        if key not in after:
            out.append(Field("env", key, "removed", None if secret else before[key], secret=secret))
        elif key not in before:
            out.append(Field("env", key, "added", after=None if secret else after[key], secret=secret))
        elif before[key] != after[key] and REDACTED not in (before[key], after[key]):
            out.append(
                Field("env", key, "changed", None if secret else before[key], None if secret else after[key], secret)
            )
    return out


def _runtime_of(launch: Mapping[str, Any]) -> str:
    if launch.get("runtime"):
        return str(launch["runtime"])
    return "container" if launch.get("mode") == "container" else "systemd"


def model_of(launch: Mapping[str, Any]) -> str:
    """The model a launch serves: its ``--served-model-name``, else its instance's name without the index."""
    _, flags = parse_argv(list(launch.get("argv") or []))
    named = [v for v in flags.get("--served-model-name", []) if v]
    return named[0] if named else str(launch.get("instance") or launch.get("name", "")).rsplit("-", 1)[0]


def _launch_change(node: str, old: Mapping[str, Any], new: Mapping[str, Any], secrets_known: bool) -> Change:
    fields = _argv_fields(list(old["argv"]), list(new["argv"]))
    missing: list[str] = []
    if "wrapper" in old:
        if list(old["wrapper"]) != list(new["wrapper"]):
            fields.append(
                Field("wrapper", "group wrapper", "changed", " ".join(old["wrapper"]), " ".join(new["wrapper"]))
            )
    else:
        missing.append("wrapper")
    if "env" in old:
        fields += _env_fields(old["env"], new["env"], secrets_known)
    else:
        missing.append("env")
    runtime_old, runtime_new = _runtime_of(old), str(new["runtime"])
    if runtime_old != runtime_new:
        fields.append(Field("runtime", "runtime", "changed", runtime_old, runtime_new))
    elif runtime_new == "container":
        if "image" not in old:
            missing.append("image")
        elif old["image"] != new["image"]:
            fields.append(Field("image", "image", "changed", str(old["image"]), str(new["image"])))
    if old.get("executor") and old["executor"] != new["executor"]:
        fields.append(Field("executor", "executor", "changed", str(old["executor"]), str(new["executor"])))
    package: list[Field] = []
    if runtime_old == runtime_new == "systemd":
        if "package" not in old:
            missing.append("package")
        elif set(str(new["package"]).split()) - set(str(old["package"]).split()):
            # The role keeps a venv that already holds every requirement (vllm_server tasks/venv.yml).
            package.append(Field("package", "package", "changed", str(old["package"]), str(new["package"])))
    change = Change(node, "vllm", str(new["instance"]), "nothing", unit=str(new["name"]), model=model_of(new))
    restart = [f for f in fields if f.field != "executor"]  # the executor shows in argv already
    if restart:
        change.action, change.fields = "restart", fields + package
    elif package:
        change.action, change.fields = "reinstall", package
        change.notes.append("the running vLLM keeps the old release until it restarts")
    if missing:
        change.notes.append(f"not recorded on the node, not compared: {', '.join(missing)}")
    return change


def _vllm_changes(node: str, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> list[Change]:
    before = {str(launch["name"]): launch for launch in (old or {}).get("launches") or []}
    after = {str(launch["name"]): launch for launch in (new or {}).get("launches") or []}
    secrets_known = bool((new or {}).get("secrets_known", True))
    out = []
    for name, launch in after.items():
        if name in before:
            out.append(_launch_change(node, before[name], launch, secrets_known))
        else:
            out.append(Change(node, "vllm", str(launch["instance"]), "start", "new", unit=name, model=model_of(launch)))
    for name, launch in before.items():
        if name not in after:
            subject = str(launch.get("instance") or name)
            out.append(Change(node, "vllm", subject, "stop", "dropped by the plan", unit=name, model=model_of(launch)))
    return out


def _ray_change(node: str, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> Change | None:
    if old is None and new is None:
        return None
    if old is None:
        assert new is not None
        part = f"head of {new['name']}" if new["head"] == node else f"joins {new['name']}, head {new['head']}"
        return Change(node, "ray", "Ray", "start", part)
    if new is None:  # playbooks/cluster.yml stops the Ray an earlier plan started
        return Change(node, "ray", "Ray", "stop", "the plan no longer uses Ray here")
    fields = [
        Field(k, k, "changed", str(old.get(k)), str(new[k]))
        for k in ("name", "head", "version", "runtime")
        if k in old and str(old[k]) != str(new[k])
    ]
    if fields:
        return Change(node, "ray", "Ray", "restart", fields=fields)
    change = Change(node, "ray", "Ray", "nothing")
    if list(old.get("members") or []) != list(new["members"]):
        old_members, new_members = ", ".join(old.get("members") or []), ", ".join(new["members"])
        change.fields.append(Field("members", "members", "changed", old_members, new_members))
    return change


def _gateway_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Change]:
    out = []
    for host, gw in new.items():
        if host not in old:
            out.append(Change(host, "gateway", "gateway", "start", "new: " + ", ".join(gw["upstreams"])))
            continue
        fields = [
            Field("upstream", "upstream", "added", after=u) for u in gw["upstreams"] if u not in old[host]["upstreams"]
        ]
        fields += [
            Field("upstream", "upstream", "removed", u) for u in old[host]["upstreams"] if u not in gw["upstreams"]
        ]
        if int(old[host]["port"]) != int(gw["port"]):
            fields.append(Field("port", "port", "changed", str(old[host]["port"]), str(gw["port"])))
        out.append(Change(host, "gateway", "gateway", "reload" if fields else "nothing", fields=fields))
    for host in old:
        if host not in new:
            out.append(
                Change(host, "gateway", "gateway", "leave",
                       "no longer planned here; site.yml leaves it running, playbooks/teardown.yml stops it")
            )  # fmt: skip
    return out


def _group_restarts(changes: list[Change], applied: Mapping[str, Any]) -> None:
    """A rank of a multi-node group (native, dp: the group wrapper) restarts with its group."""
    grouped = {
        str(launch["instance"])
        for node in applied["nodes"].values()
        for launch in node["launches"]
        if launch.get("wrapper")
    }
    for instance in grouped:
        ranks = [c for c in changes if c.component == "vllm" and c.subject == instance]
        moving = sorted({c.node for c in ranks if c.action in ("restart", "stop", "start")})
        if not moving:
            continue
        for c in ranks:
            if c.action in ("nothing", "reinstall"):
                c.action, c.reason = "restart", f"with its group: {instance} restarts on {', '.join(moving)}"


def _all_at_once(changes: list[Change], applied: Mapping[str, Any]) -> list[str]:
    """One warning per model whose every serving instance restarts or stops at once."""
    serving: dict[str, set[str]] = {}
    for node in applied["nodes"].values():
        for launch in node["launches"]:
            serving.setdefault(model_of(launch), set()).add(str(launch.get("instance") or launch["name"]))
    out = []
    for model, instances in sorted(serving.items()):
        mine = [c for c in changes if c.component == "vllm" and c.subject in instances]
        interrupted = {c.subject for c in mine if c.action in _INTERRUPTS}
        if interrupted and interrupted == instances:
            where = sorted({c.node for c in mine if c.action in _INTERRUPTS})
            out.append(
                f"every serving instance of {model} restarts or stops at once ({', '.join(sorted(instances))} "
                f"on {', '.join(where)}): no replica keeps serving until they are back"
            )
    return out


def diff(applied: Mapping[str, Any], planned: Mapping[str, Any]) -> Preview:
    """What applying ``planned`` over ``applied`` does, one :class:`Change` per launch, Ray
    membership and gateway, in node order; the warnings (everything of a model at once,
    runtime switches, requirements installed without a restart)."""
    changes: list[Change] = []
    names = list(dict.fromkeys([*planned["nodes"], *applied["nodes"]]))
    for node in names:
        old, new = applied["nodes"].get(node), planned["nodes"].get(node)
        changes += _vllm_changes(node, old, new)
        ray = _ray_change(node, (old or {}).get("ray"), (new or {}).get("ray"))
        if ray is not None:
            changes.append(ray)
    changes += _gateway_changes(applied.get("gateways") or {}, planned.get("gateways") or {})
    _group_restarts(changes, applied)
    warnings = _all_at_once(changes, applied)
    for c in changes:
        if any(f.field == "runtime" for f in c.fields):
            warnings.append(
                f"{c.subject} on {c.node} switches runtime: site.yml starts the new one without stopping the old "
                "(stop it first: playbooks/teardown.yml)"
            )
    if any(c.action == "reinstall" for c in changes):
        warnings.append(
            "a new vLLM requirement is installed where nothing else changes, without a restart: "
            "those launches keep the old release until they restart"
        )
    hosts = [*names, *(h for h in sorted(planned.get("gateways") or {}) if h not in names)]
    order = {n: i for i, n in enumerate(hosts)}
    changes.sort(key=lambda c: order.get(c.node, len(order)))
    return Preview(changes, warnings)


def render(preview: Preview) -> str:
    """The preview as a table for people, warnings and the summary below it."""
    rows = [[c.node, c.component, c.subject, c.action, c.details()] for c in preview.changes]
    lines = [format_table(["node", "what", "subject", "action", "changes"], rows)] if rows else ["nothing recorded"]
    lines += [f"warning: {w}" for w in preview.warnings]
    lines.append(preview.summary())
    return "\n".join(lines)


# ---------------------------------------------------------------- assembling a preview

PREVIEW_FORMAT = "vllm-fleet-preview/1"


def node_part(record: Mapping[str, Any], applied: Mapping[str, Any], options: Mapping[str, Any]) -> dict[str, Any]:
    """One node's share of the preview, as the play computes it on the node: the planned
    state of ``record``, the ``applied`` records read there (``launches``, ``ray``,
    ``gateway``; each None or missing when nothing is recorded) and the ``inputs`` a laptop
    needs to plan again. ``options``: ``server_env`` (vllm_server_env), ``image`` (the
    serving image's name), ``api_key``/``hf_token`` (hashed here, never returned),
    ``settings`` and ``context`` (those of the record)."""
    secrets = {"VLLM_API_KEY": str(options.get("api_key") or ""), "HF_TOKEN": str(options.get("hf_token") or "")}
    # vllm_server_env: given, else the inventory's (the record's context holds the role variables).
    context = options.get("context") or {}
    server_env = dict(options.get("server_env") or (context.get("role_vars") or {}).get("vllm_server_env") or {})
    image = str(options.get("image") or "") or None
    inputs = safe_inputs(options.get("settings") or {}, options.get("context") or {})
    inputs.update(server_env=redact(server_env), image=image, image_base=str(record["vllm"]["image"]))
    return {
        "planned": node_state(record, server_env=server_env, image=image, secrets=secrets),
        "gateway_plan": dict(record.get("gateway") or {}),
        "applied": {"launches": list(applied.get("launches") or []), "ray": applied.get("ray") or None},
        "applied_gateway": applied.get("gateway") or None,
        "inputs": inputs,
    }


def report(
    parts: Mapping[str, Mapping[str, Any]],
    gateways: Mapping[str, Any] | None = None,
    wishes: Mapping[str, Any] | None = None,
    gateway: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The preview of every node (``parts``: :func:`node_part` by node; ``gateways``: the
    gateway records read on hosts outside the nodes), as preview.json holds it: the
    changes and lines, the applied and planned states (no secrets, no digests) and the
    inputs ``vllm-fleet plan --diff`` plans again with."""
    found = {str(n): p["applied_gateway"] for n, p in parts.items() if p.get("applied_gateway")}
    found.update({str(h): g for h, g in (gateways or {}).items() if g})
    applied = applied_state({"nodes": {n: p["applied"] for n, p in parts.items()}, "gateways": found})
    # The planned gateway: the deployment's (``gateway``), else the gateway host's record's.
    holders = {n: {"gateway": p["gateway_plan"]} for n, p in parts.items()}
    planned = planned_state({n: p["planned"] for n, p in parts.items()}, holders, gateway)
    result = diff(applied, planned)
    return {
        "format": PREVIEW_FORMAT,
        **result.to_dict(),
        "applied": redacted_state(applied),
        "planned": redacted_state(planned),
        "inputs": {"wishes": dict(wishes or {}), "nodes": {n: p["inputs"] for n, p in parts.items()}},
    }
