"""Run a Nomad job's tasks on this machine the way a Nomad client would start them.

No Nomad binary can be installed here, so this module re-implements the client-side steps that
decide whether a rendered job actually works: the allocation directory layout, the task
environment, runtime interpolation, template rendering (a Go-template subset with the
consul-template functions Nomad jobs use), the Nomad-native service registry behind
``nomadService``, the restart policy, and process supervision. Input is the API job (the dict
under ``"Job"`` of a ``{"Job": {...}}`` payload, JSON API field names).

Public API::

    with SimCluster(job, workdir, host_ip="127.0.0.1", node_attrs=None) as cluster:
        cluster.place(["worker"])          # half-placement: only some groups get allocations
        cluster.place(["workers[1]"])      # ... or only some name indexes of a group with Count > 1
        cluster.start()                    # tasks of every placed, not yet started allocation
        cluster.place(["leader"]); cluster.start()   # the leader arrives later
        codes = cluster.wait(timeout=10)   # {"job.worker[0]": 0, ...}; alloc_names= to narrow
        cluster.stdout("job.worker[0]")    # alloc/logs/<task>.stdout.0 (stderr() likewise)
        cluster.services("leader-svc")     # the Nomad-native registry behind nomadService
        cluster.set_variable("path", {...})  # Nomad Variables for nomadVar / nomadVarExists
    # leaving the block = cluster.stop(grace=2.0): deregister, kill_signal, SIGKILL the groups

    cluster.lose("job.workers[0]")       # its node goes down: lost + same-name replacement, or
                                         # "unknown" and kept (lost_after; replace = false < 1.11.2)
    cluster.advance(3600)                # the servers' clock: expired unknown -> lost + replaced
    cluster.allocations / cluster.alloc(name) -> Allocation (id, index, dir, ports, tasks, client_status)
    Allocation.tasks[name] -> TaskRun (state, pid, exit_code, restarts, env, argv, events, error, user)
    cluster.unsimulated -> job features present but not acted on (checks, reschedule, ...)

Orphaned grandchildren killed by stop() are reparented to PID 1; where PID 1 does not reap
(containers), they remain as zombies, which hold no resources. Nothing is left running.

Behaviour mirrored, and where it was confirmed (hashicorp/nomad and consul-template sources):

* Two different interpolation mechanisms exist on the client, and they disagree:

  - ``Env`` values, template ``DestPath``, service names/tags and meta go through
    ``helper/args.ReplaceEnv``: regex ``\\$\\{[a-zA-Z0-9_\\-\\.]+\\}``; a known name is replaced
    (task env first, then node attributes), an unknown ``${NAME}`` is left as is, ``$NAME``
    without braces is never touched and there is no escape (``$${X}`` becomes ``$`` + value).
  - The driver ``Config`` (``command``, ``args``) is NOT ReplaceEnv'd. The task runner
    (``runDriver``) decodes it with ``hclutils.ParseHclInterface`` as HCL2 JSON, so every
    string is an HCL2 *template* evaluated with the task env as variables
    (``TaskEnv.AllValues``: every env key, dotted keys nested, plus ``node.*``, ``attr.*``,
    ``meta.*`` and an ``env`` map). An unknown ``${NAME}`` fails the task at start ("Failed
    Validation: failed to parse config: Unknown variable: There is no variable named ..."),
    ``$${`` is the escape for a literal ``${`` and ``%%{`` for ``%{``. jobspec2 keeps unknown
    runtime variables as the text ``${NAME}`` (its ``UnknownVariable`` hook), which is why
    they reach the client at all. Seen in the wild: hashicorp/nomad#5809 (0.9 started failing
    on uninterpolatable ``${VAR}`` in config), #11311 and #9952 (the exact runtime error),
    #14972 (``%%{`` in HCL becomes ``%{`` and then fails on the client).

* Task environment (``client/taskenv/env.go`` ``Builder.buildEnv``): directories (host paths
  for raw_exec, whose FS isolation is "none"), resource limits, alloc/job/group/task names,
  group ports from ``AllocatedResources.Shared.Ports`` (``NOMAD_ADDR_``, ``NOMAD_HOST_ADDR_``,
  ``NOMAD_IP_``, ``NOMAD_HOST_IP_``, ``NOMAD_PORT_``, ``NOMAD_ALLOC_PORT_``,
  ``NOMAD_HOST_PORT_``), combined job/group/task meta as ``NOMAD_META_<KEY>`` and
  ``NOMAD_META_<key>`` (interpolated), then the agent's own environment minus the default
  ``env.denylist`` (only for non-image drivers, values interpolated, never overriding), then
  the task ``Env`` (interpolated, overriding host values), then template ``env = true`` vars.
  Finally only keys starting with ``NOMAD_ADDR_``, ``NOMAD_IP_``, ``NOMAD_PORT_``,
  ``NOMAD_HOST_PORT_`` or ``NOMAD_META_`` are cleaned with ``helper.CleanEnvVar`` (every char
  outside ``[A-Za-z0-9_.]`` -> ``_``; current Nomad keeps ``.``, older versions replaced it).
  Other task Env keys (e.g. ``my-var``) are kept as written (``TestEnvironment_DashesInTaskName``).
* Templates (``client/allocrunner/taskrunner/template/template.go``): all render before the
  task starts; DestPath goes through ``TaskEnv.ClientPath(dest, joinEscape=true)`` and must stay
  in the task or alloc dir; files are written atomically (consul-template
  ``renderer.AtomicWrite``: temp file + rename, parent dirs created) and only when the content
  changed; ``env`` reads the task env plus node attributes, masking the agent's own process env
  (``maskProcessEnv``); change modes noop/restart/signal as ``onTemplateRendered``; ``env=true``
  files are parsed with go-envparse semantics (``loadTemplateEnv``); defaults ChangeMode
  "restart", Perms "0644" (jobspec2 ``normalizeTemplates``).
* ``nomadService`` (consul-template ``dependency/nomad_service.go``): an empty list when the
  service is absent (a valid response, so the template renders and does not block);
  ``[tag.]name`` query syntax; results stable-sorted by name. ``nomadVarExists`` never blocks;
  ``nomadVar`` on a missing path blocks the first render (the task never starts), matching
  ``nomadVariableItemsFunc`` with ``EnableBlocking``.
* Command lookup (``executor.lookupBin``): ``<task>/local/<cmd>``, ``<task>/<cmd>``, an
  absolute path, then the agent's ``$PATH``; cwd is the task dir; stdout/stderr go to
  ``alloc/logs/<task>.stdout.0`` / ``.stderr.0``; template ``signal`` goes to the task's main
  process (``UniversalExecutor.Signal``).
* Restart policy: defaults batch 3 attempts/24h/15s/fail, service 2/30m/15s/fail; a batch
  task exiting 0 is complete; template restarts do not count as failures.

Not confirmed in source (from Nomad's documentation or inferred; kept where a choice had to
be made): the restart delay jitter (up to 25 %) and the "delay" mode; ``nomadService``
instance order (by registration ID, inferred from memdb index order) and the registration ID
format; the region part of the ``nomadService`` query regex; a port ``To`` of -1
meaning "same as the host port"; stop() signalling the whole process group (Nomad's executor
signals the task, then kills what is left after kill_timeout); the group ``MaxRunDuration``
field (Nomad 2.0.3+) is enforced from the allocation's creation
(``client/allocrunner/max_run_duration_hook.go``: CreateTime + duration, whatever the tasks'
state): its tasks are stopped, ``Allocation.max_run_exceeded`` is set and the allocation ends
``client_status`` "complete" with ``client_description`` "allocation exceeded max_run_duration".

Placement (a server's job, modelled only as far as names go): a group with Count N gets
allocations ``<job>.<group>[0..N-1]``; placing again fills exactly the indexes no live
allocation holds (``scheduler/reconciler/allocs.go`` ``AllocNameIndex.Next``). ``lose(name)``
follows the servers' reconciler of ``nomad_version`` (2.0.5 by default, PR #27053; or before
1.11.2, e.g. "1.11.1"): see :meth:`SimCluster.lose` for each rule with its file:line and tag;
``advance(seconds)`` runs the follow-up evaluations that expire ``unknown`` allocations. A fake
Nomad API (tests/nomad/fake_api.py ``attach_sim``) can decide instead and drive this cluster:
``node_died`` and ``kill_alloc`` are its hooks.

Docker (``docker_images={image: StandInImage}``): the task runs as a host process whose argv is
the container's Entrypoint + Cmd as :func:`docker_argv` composes them (drivers/docker/driver.go
v2.0.5 :1053, :1477-1491); the image's ENV replaces the agent's environment; directories are
host paths (Nomad's would be /local, /alloc, /secrets inside the container); ``ulimit``,
``shm_size``, ``devices``, ``volumes`` and GPU devices are recorded in ``unsimulated``.

Task users and file owners (v2.0.5; see :meth:`SimCluster._task_user`): the process runs as the
docker task's ``user`` or else the image's USER (drivers/docker/driver.go:1055), exec's
``nobody`` unless ``user`` is set (drivers/exec/driver.go:472-474; uid only, gid 0:
executor_linux_cgo.go:242-256), raw_exec's agent user unless ``user`` is set
(drivers/shared/executor/executor_unix.go:61-106); another user needs the simulator to run as
root, and a workdir whose parents that user may traverse. Templates are written with ``Perms``
and chowned afterwards only when ``Uid``/``Gid`` are set and >= 0
(client/allocrunner/taskrunner/template/template.go:811-826; consul-template v0.42.1
renderer/renderer.go:103-107). Directories get client/allocdir's modes (0777 through
``dropDirPermissions``, owner nobody; the workdir, Nomad's alloc_dir, 0711): see ``_new_alloc``.

Deliberate deviations, all loud: docker without a stand-in image and other image drivers are
refused (no containers here); ``exec`` is refused unless ``exec_as_raw_exec=True`` (Nomad would chroot it and set
NOMAD_TASK_DIR=/local; the simulator can only run it unisolated with host paths); unsupported
template syntax/functions, HCL expressions other than plain variable references, and job
features the simulator cannot honour raise :class:`UnsupportedJobError`. Everything runs on one
host, so all allocations share one "node". Rescheduling (server side) is not simulated.
"""

from __future__ import annotations

import json
import os
import platform
import random
import re
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import threading
import time
import uuid
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

__all__ = [
    "SimError",
    "UnsupportedJobError",
    "TaskConfigError",
    "TemplateError",
    "TaskStartError",
    "SimCluster",
    "StandInImage",
    "SWALLOWING_ENTRYPOINT",
    "docker_argv",
    "docker_user",
    "TaskUser",
    "SimHost",
    "Heartbeats",
    "fingerprint_address",
    "Allocation",
    "TaskRun",
    "ServiceRegistry",
    "GoTemplate",
    "BUILTIN_FUNCS",
    "replace_env",
    "clean_env_var",
    "eval_hcl_string",
    "hcl_variables",
    "parse_env_file",
    "process_group_members",
]


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------


class SimError(Exception):
    """Base class of everything this simulator raises on purpose."""


class UnsupportedJobError(SimError):
    """The job uses something the simulator cannot honour faithfully (not a Nomad error)."""


class TaskConfigError(SimError):
    """A real Nomad client would fail this task at start ("Failed Validation")."""


class TemplateError(SimError):
    """A real Nomad client would fail this template (parse or execution error)."""


class TaskStartError(SimError):
    """The task could not be launched (binary not found, exec failure, ...)."""


class _Blocked(Exception):
    """A template dependency is missing: consul-template keeps waiting, nothing is written."""


# --------------------------------------------------------------------------------------------
# Runtime interpolation (helper/args.ReplaceEnv) and key cleaning (helper.CleanEnvVar)
# --------------------------------------------------------------------------------------------

# Same character class as Nomad's envRe: dots and dashes allowed, nothing else.
_REPLACE_ENV_RE = re.compile(r"\$\{[a-zA-Z0-9_\-\.]+\}")


def replace_env(arg: str, *maps: dict[str, str]) -> str:
    """Nomad's ``ReplaceEnv``: ``${NAME}`` found in the first map that has it is replaced.

    Unknown names stay as written; ``$NAME`` is never touched; there is no escape syntax.
    """

    def sub(m: re.Match[str]) -> str:
        name = m.group(0)[2:-1]
        for mp in maps:
            if name in mp:
                return mp[name]
        return m.group(0)

    return _REPLACE_ENV_RE.sub(sub, arg)


def clean_env_var(s: str, r: str = "_") -> str:
    """``helper.CleanEnvVar``: keep ``[A-Za-z_.]`` and non-leading digits, replace the rest."""
    out = []
    for i, c in enumerate(s):
        ok = c == "_" or c == "." or ("a" <= c <= "z") or ("A" <= c <= "Z") or (i > 0 and "0" <= c <= "9")
        out.append(c if ok else r)
    return "".join(out)


# Prefixes whose keys Nomad cleans at the end of buildEnv (see #2405); nothing else is cleaned.
_CLEANED_PREFIXES = ("NOMAD_ADDR_", "NOMAD_IP_", "NOMAD_PORT_", "NOMAD_HOST_PORT_", "NOMAD_META_")

# config.DefaultEnvDenylist: host variables never passed to tasks.
DEFAULT_ENV_DENYLIST = frozenset(
    {
        "CONSUL_TOKEN",
        "CONSUL_HTTP_TOKEN",
        "VAULT_TOKEN",
        "NOMAD_LICENSE",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "GOOGLE_APPLICATION_CREDENTIALS",
    }
)


# --------------------------------------------------------------------------------------------
# HCL2 evaluation of the driver config (client/allocrunner/taskrunner runDriver)
# --------------------------------------------------------------------------------------------


def _add_nested_key(dst: dict[str, Any], key: str, value: str) -> bool:
    """``taskenv.addNestedKey``: ``a.b=c`` -> ``{"a": {"b": "c"}}``; False when it cannot nest."""
    segments = key.split(".")
    created_parent: dict[str, Any] | None = None
    created_key = ""
    cur = dst
    for seg in segments[:-1]:
        if seg == "":
            if created_parent is not None:
                del created_parent[created_key]
            return False
        existing = cur.get(seg)
        if existing is None:
            nxt: dict[str, Any] = {}
            cur[seg] = nxt
            if created_parent is None:
                created_parent, created_key = cur, seg
            cur = nxt
        elif isinstance(existing, dict):
            cur = existing
        else:
            if created_parent is not None:
                del created_parent[created_key]
            return False
    last = segments[-1]
    if last == "":
        if created_parent is not None:
            del created_parent[created_key]
        return False
    cur[last] = value
    return True


def hcl_variables(env_map: dict[str, str], node_attrs: dict[str, str]) -> dict[str, Any]:
    """``TaskEnv.AllValues``: the variables the driver config is evaluated with.

    Go walks its maps in random order; here keys are added in sorted order, so a key that
    collides with a nested path (``a`` and ``a.b``) resolves deterministically.
    """
    all_map: dict[str, Any] = {}
    for k in sorted(env_map):
        _add_nested_key(all_map, k, env_map[k])
    for k in sorted(node_attrs):
        _add_nested_key(all_map, k, node_attrs[k])
    all_map["env"] = dict(env_map)
    node = all_map.get("node")
    if isinstance(node, dict):
        if isinstance(all_map.get("attr"), dict):
            node["attr"] = all_map["attr"]
        if isinstance(all_map.get("meta"), dict):
            node["meta"] = all_map["meta"]
    return all_map


_HCL_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*")
_HCL_NUMBER = re.compile(r"[0-9]+")
_HCL_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"')


def _hcl_traversal(expr: str, source: str) -> list[str | int]:
    """Parse the one HCL expression form the simulator evaluates: a variable traversal."""
    s = expr.strip()
    m = _HCL_IDENT.match(s)
    if not m:
        raise UnsupportedJobError(
            f"HCL expression ${{{expr}}} in {source!r} is not a plain variable reference; "
            "the simulator evaluates only traversals like ${NAME}, ${a.b.c}, ${env[\"X\"]}"
        )
    steps: list[str | int] = [m.group(0)]
    i = m.end()
    while i < len(s):
        c = s[i]
        if c == ".":
            m = _HCL_IDENT.match(s, i + 1) or _HCL_NUMBER.match(s, i + 1)
            if not m:
                break
            steps.append(int(m.group(0)) if m.group(0).isdigit() else m.group(0))
            i = m.end()
        elif c == "[":
            j = i + 1
            while j < len(s) and s[j] == " ":
                j += 1
            m = _HCL_STRING.match(s, j) or _HCL_NUMBER.match(s, j)
            if not m:
                break
            key: str | int
            if m.re is _HCL_STRING:
                key = json.loads(m.group(0))  # HCL's string escapes are a superset of these
            else:
                key = int(m.group(0))
            j = m.end()
            while j < len(s) and s[j] == " ":
                j += 1
            if j >= len(s) or s[j] != "]":
                break
            steps.append(key)
            i = j + 1
        else:
            break
    if i != len(s):
        raise UnsupportedJobError(
            f"HCL expression ${{{expr}}} in {source!r} is not a plain variable reference "
            "(operators, function calls and literals are valid HCL but not simulated)"
        )
    return steps


def _hcl_resolve(steps: list[str | int], variables: dict[str, Any]) -> Any:
    root = steps[0]
    if root not in variables:
        raise TaskConfigError(
            f'failed to parse config: Unknown variable: There is no variable named "{root}".'
        )
    val = variables[root]
    for step in steps[1:]:
        if isinstance(val, dict):
            if step not in val:
                if isinstance(step, int) or root == "env":
                    raise TaskConfigError(
                        "failed to parse config: Invalid index: The given key does not identify "
                        "an element in this collection value."
                    )
                raise TaskConfigError(
                    f"failed to parse config: Unsupported attribute: This object does not have "
                    f'an attribute named "{step}".'
                )
            val = val[step]
        else:
            raise TaskConfigError(
                "failed to parse config: Unsupported attribute: Can't access attributes on a "
                "primitive-typed value (string)."
            )
    return val


def eval_hcl_string(s: str, variables: dict[str, Any], source: str = "config") -> str:
    """Evaluate one string of the driver config as an HCL2 template (JSON syntax)."""
    parts: list[tuple[str, str]] = []  # ("lit", text) | ("expr", text)
    lit: list[str] = []
    i, n = 0, len(s)
    while i < n:
        if s.startswith("$${", i):
            lit.append("${")
            i += 3
        elif s.startswith("%%{", i):
            lit.append("%{")
            i += 3
        elif s.startswith("${", i) or s.startswith("%{", i):
            kind = s[i]
            j, depth, in_str = i + 2, 1, False
            while j < n and depth:
                c = s[j]
                if in_str:
                    if c == "\\":
                        j += 1
                    elif c == '"':
                        in_str = False
                elif c == '"':
                    in_str = True
                elif c == "{":
                    depth += 1
                elif c == "}":
                    depth -= 1
                j += 1
            if depth:
                raise TaskConfigError(
                    f"failed to parse config: Unterminated template string in {source!r}"
                )
            body = s[i + 2 : j - 1]
            if body.startswith("~") or body.endswith("~"):
                raise UnsupportedJobError(f"HCL strip markers (~) in {source!r} are not simulated")
            if kind == "%":
                word = body.strip().split(" ", 1)[0]
                if word in ("if", "else", "endif", "for", "endfor"):
                    raise UnsupportedJobError(
                        f"HCL template directive %{{{body}}} in {source!r} is not simulated"
                    )
                raise TaskConfigError(
                    f'failed to parse config: Invalid template control keyword: "{word}" is not '
                    "a valid template control keyword."
                )
            if lit:
                parts.append(("lit", "".join(lit)))
                lit = []
            parts.append(("expr", body))
            i = j
        else:
            lit.append(s[i])
            i += 1
    if lit:
        parts.append(("lit", "".join(lit)))

    out = []
    for kind, text in parts:
        if kind == "lit":
            out.append(text)
            continue
        val = _hcl_resolve(_hcl_traversal(text, source), variables)
        if isinstance(val, dict):
            raise TaskConfigError(
                "failed to parse config: Invalid template interpolation value: Cannot include "
                "the given value in a string template: string required."
            )
        out.append(val)
    return "".join(out)


def _eval_config_value(v: Any, variables: dict[str, Any], source: str) -> Any:
    if isinstance(v, str):
        return eval_hcl_string(v, variables, source)
    if isinstance(v, bool):
        return "true" if v else "false"  # cty converts bool to string this way
    if isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, list):
        return [_eval_config_value(x, variables, f"{source}[{i}]") for i, x in enumerate(v)]
    raise TaskConfigError(f"failed to parse config: Incorrect attribute value type for {source}")


# --------------------------------------------------------------------------------------------
# go-envparse (templates with env = true)
# --------------------------------------------------------------------------------------------


def parse_env_file(data: bytes) -> dict[str, str]:
    """hashicorp/go-envparse ``Parse``, quirks included.

    Only truly empty lines are skipped: a comment-only or blank-with-spaces line has no ``=``
    and is an error, exactly like the Go parser. Control characters (tab included) in a value
    are errors.
    """
    env: dict[str, str] = {}
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    for lineno, ln in enumerate(lines, 1):
        if ln.endswith(b"\r"):
            ln = ln[:-1]  # bufio.ScanLines drops one trailing \r
        if not ln:
            continue
        if b"=" not in ln:
            raise TemplateError(f"error parsing env template: error on line {lineno}: missing '='")
        raw_key, raw_val = ln.split(b"=", 1)
        key = raw_key.strip()
        if key.startswith(b"export "):
            key = key[len(b"export ") :]
        value = raw_val.strip()
        if not key:
            raise TemplateError(f"error parsing env template: error on line {lineno}: empty key")
        k0 = key[0]
        if not (ord("A") <= k0 <= ord("Z") or ord("a") <= k0 <= ord("z") or k0 == ord("_")):
            raise TemplateError(
                f"error parsing env template: error on line {lineno}: key must start with "
                f"[A-Za-z_] but found {chr(k0)!r}"
            )
        out = bytearray()
        last_sig = 0
        mode = "normal"
        for b in value:
            if b < 32:
                raise TemplateError(
                    f"error parsing env template: error on line {lineno}: 0x{b:02x} is an "
                    "invalid value character"
                )
            if b > 127:
                if mode == "escape":
                    raise TemplateError(
                        f"error parsing env template: error on line {lineno}: multibyte "
                        "characters disallowed in escape sequences"
                    )
                out.append(b)
                last_sig = len(out)
                continue
            c = chr(b)
            if mode == "normal":
                if c == '"':
                    mode = "double"
                elif c == "'":
                    mode = "single"
                elif c == "#":
                    out = out[:last_sig]
                    break
                elif c in " \t":
                    out.append(b)
                else:
                    out.append(b)
                    last_sig = len(out)
            elif mode == "double":
                if c == '"':
                    mode = "normal"
                elif c == "\\":
                    mode = "escape"
                else:
                    out.append(b)
                    last_sig = len(out)
            elif mode == "escape":
                mapping = {'"': '"', "\\": "\\", "n": "\n", "t": "\t"}
                if c not in mapping:
                    raise TemplateError(
                        f"error parsing env template: error on line {lineno}: invalid escape "
                        f"sequence: {c}"
                    )
                out.extend(mapping[c].encode())
                last_sig = len(out)
                mode = "double"
            elif mode == "single":
                if c == "'":
                    mode = "normal"
                else:
                    out.append(b)
                    last_sig = len(out)
        else:
            if mode != "normal":
                what = {"double": 'unmatched "', "single": "unmatched '", "escape": "incomplete escape sequence"}
                raise TemplateError(
                    f"error parsing env template: error on line {lineno}: {what[mode]}"
                )
        env[key.decode()] = out.decode()
    return env


# --------------------------------------------------------------------------------------------
# Service registry (Nomad-native services, provider = "nomad")
# --------------------------------------------------------------------------------------------


class ServiceRegistry:
    """The cluster-wide table behind ``/v1/service/<name>`` and ``nomadService``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._regs: dict[str, dict[str, Any]] = {}

    def register(self, reg: dict[str, Any]) -> None:
        with self._lock:
            self._regs[reg["ID"]] = dict(reg)

    def deregister(self, ids: Iterable[str]) -> None:
        with self._lock:
            for i in ids:
                self._regs.pop(i, None)

    def get(self, name: str, namespace: str = "default") -> list[dict[str, Any]]:
        """Registrations of one service, ordered by ID.

        Nomad's state store answers from a memdb index whose entries end in the registration
        ID, so instance order among several allocations is effectively random (alloc UUIDs);
        ordering by ID reproduces that rather than placement order.
        """
        with self._lock:
            found = [
                dict(r)
                for r in self._regs.values()
                if r["ServiceName"] == name and r["Namespace"] == namespace
            ]
        return sorted(found, key=lambda r: r["ID"])

    def names(self, namespace: str = "default") -> list[dict[str, Any]]:
        with self._lock:
            tags: dict[str, set[str]] = {}
            for r in self._regs.values():
                if r["Namespace"] == namespace:
                    tags.setdefault(r["ServiceName"], set()).update(r.get("Tags") or [])
        return [{"ServiceName": n, "Tags": sorted(t)} for n, t in sorted(tags.items())]

    def all(self) -> list[dict[str, Any]]:
        with self._lock:
            return sorted((dict(r) for r in self._regs.values()), key=lambda r: r["ID"])


# --------------------------------------------------------------------------------------------
# Go text/template subset (as consul-template uses it)
# --------------------------------------------------------------------------------------------

_GO_SPACE = " \t\r\n"
_NOARG = object()
_KEYWORDS = {"if", "else", "end", "range", "with", "define", "template", "block", "break", "continue"}


class _TemplateObject:
    """A Go struct exposed to templates: named fields only, unknown fields are errors."""

    go_type = "struct"
    fields: tuple[str, ...] = ()

    def field(self, name: str) -> Any:
        if name in self.fields:
            return getattr(self, name)
        raise TemplateError(f"can't evaluate field {name} in type {self.go_type}")


class _NomadService(_TemplateObject):
    """consul-template ``dependency.NomadService``."""

    go_type = "*dependency.NomadService"
    fields = ("ID", "Name", "Node", "Address", "Port", "Datacenter", "Tags", "JobID", "AllocID")

    def __init__(self, reg: dict[str, Any]) -> None:
        self.ID = reg["ID"]
        self.Name = reg["ServiceName"]
        self.Node = reg.get("NodeID", "")
        self.Address = reg["Address"]
        self.Port = int(reg["Port"])
        self.Datacenter = reg.get("Datacenter", "")
        self.Tags = sorted(reg.get("Tags") or [])
        self.JobID = reg.get("JobID", "")
        self.AllocID = reg.get("AllocID", "")


class _NomadServicesSnippet(_TemplateObject):
    go_type = "*dependency.NomadServicesSnippet"
    fields = ("Name", "Tags")

    def __init__(self, name: str, tags: list[str]) -> None:
        self.Name = name
        self.Tags = tags


class _NomadVarItem(_TemplateObject):
    """``dependency.NomadVarItem``: prints as its value."""

    go_type = "dependency.NomadVarItem"
    fields = ("Key", "Value")

    def __init__(self, key: str, value: str) -> None:
        self.Key = key
        self.Value = value

    def __str__(self) -> str:
        return self.Value


class _NomadVarItems(dict):
    """``dependency.NomadVarItems``: a map, so ``.key`` looks up an item."""

    go_methods = ("Keys", "Values", "Tuples", "Metadata", "Parent", "ItemsMap")


@dataclass
class _Tok:
    kind: str  # field var ident string number bool nil dot ( ) | := = ,
    value: Any
    space_before: bool
    pos: int


@dataclass
class _Pipe:
    decl: list[str]
    assign: bool
    cmds: list[list[tuple]]


def _go_unquote(body: str, pos: int) -> str:
    out = []
    i = 0
    simple = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\", '"': '"'}
    while i < len(body):
        c = body[i]
        if c != "\\":
            out.append(c)
            i += 1
            continue
        i += 1
        e = body[i]
        if e in simple:
            out.append(simple[e])
            i += 1
        elif e == "x":
            out.append(chr(int(body[i + 1 : i + 3], 16)))
            i += 3
        elif e == "u":
            out.append(chr(int(body[i + 1 : i + 5], 16)))
            i += 5
        elif e == "U":
            out.append(chr(int(body[i + 1 : i + 9], 16)))
            i += 9
        elif e in "01234567":
            out.append(chr(int(body[i : i + 3], 8)))
            i += 3
        else:
            raise TemplateError(f"template: pos {pos}: invalid syntax in quoted string")
    return "".join(out)


_GO_FIELD = re.compile(r"\.([A-Za-z0-9_]+)")
_GO_VARIABLE = re.compile(r"\$[A-Za-z0-9_]*")
_GO_IDENT = re.compile(r"[A-Za-z0-9_]+")
_GO_NUMBER = re.compile(
    r"[+-]?(?:0[xX][0-9a-fA-F_]+|0[oO][0-7_]+|0[bB][01_]+|"
    r"(?:\d[\d_]*(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)"
)


def _go_number(text: str, pos: int) -> int | float:
    t = text.replace("_", "")
    try:
        if re.fullmatch(r"[+-]?0[0-7]+", t):
            return int(t, 8)
        if re.fullmatch(r"[+-]?(0[xXoObB][0-9a-fA-F]+|\d+)", t):
            return int(t, 0)
        return float(t)
    except ValueError:
        raise TemplateError(f"template: pos {pos}: bad number syntax: {text!r}") from None


class GoTemplate:
    """Parse once, execute many times. ``render(funcs)`` returns the output text.

    Supported: text copied byte-exact; ``{{- -}}`` trim markers; ``{{/* */}}`` comments;
    ``if``/``else if``/``else``/``with``/``range`` (with ``$i, $e :=``) /``end``; variables
    (``$x := ..``, ``$x = ..``, ``$``); fields ``.A.B`` on maps and the consul-template structs;
    pipelines ``|``; parentheses; string/raw/number/bool/nil constants; functions listed in
    :data:`SUPPORTED_FUNCTIONS`. Anything else raises :class:`UnsupportedJobError` (simulator
    limitation) or :class:`TemplateError` (Go would reject it too).
    """

    SUPPORTED_FUNCTIONS = (
        "and", "or", "not", "eq", "ne", "lt", "le", "gt", "ge", "index", "len",
        "print", "printf", "println",
        "env", "nomadService", "nomadServices", "nomadVar", "nomadVarExists",
    )

    def __init__(
        self,
        text: str,
        left_delim: str = "",
        right_delim: str = "",
        name: str = "template",
        functions: Iterable[str] | None = None,
    ):
        self.text = text
        # Go resolves function names at parse time ("function %q not defined"), so do we.
        self.functions = frozenset(self.SUPPORTED_FUNCTIONS if functions is None else functions) | {"and", "or"}
        self.left = left_delim or "{{"
        self.right = right_delim or "}}"
        self.name = name
        items = self._lex()
        self._items = items
        self._i = 0
        nodes, end = self._parse_list()
        if end is not None:
            raise TemplateError(f"template: {name}: unexpected {{{{{end[0]}}}}}")
        self.nodes = nodes

    # -- lexer ---------------------------------------------------------------------------------

    def _lex(self) -> list[Any]:
        src, ld, rd, n = self.text, self.left, self.right, len(self.text)
        items: list[Any] = []
        i = 0
        trim_next = False
        while True:
            j = src.find(ld, i)
            text = src[i:] if j < 0 else src[i:j]
            if trim_next:
                text = text.lstrip(_GO_SPACE)
            if j < 0:
                if text:
                    items.append(text)
                return items
            k = j + len(ld)
            left_trim = k + 1 < n and src[k] == "-" and src[k + 1] in _GO_SPACE
            if left_trim:
                text = text.rstrip(_GO_SPACE)
                k += 2
            if text:
                items.append(text)
            if src.startswith("/*", k):
                end = src.find("*/", k + 2)
                if end < 0:
                    raise TemplateError(f"template: {self.name}: unclosed comment")
                p = end + 2
                if p + 1 < n and src[p] in _GO_SPACE and src[p + 1] == "-" and src.startswith(rd, p + 2):
                    i, trim_next = p + 2 + len(rd), True
                elif src.startswith(rd, p):
                    i, trim_next = p + len(rd), False
                else:
                    raise TemplateError(f"template: {self.name}: comment ends before closing delimiter")
                continue
            toks, i, trim_next = self._lex_action(k)
            items.append(("action", toks, j))

    def _lex_action(self, p: int) -> tuple[list[_Tok], int, bool]:
        src, rd, n = self.text, self.right, len(self.text)
        toks: list[_Tok] = []
        space = False
        while True:
            if p >= n:
                raise TemplateError(f"template: {self.name}: unclosed action")
            if src[p] in _GO_SPACE and p + 1 < n and src[p + 1] == "-" and src.startswith(rd, p + 2):
                return toks, p + 2 + len(rd), True
            if src.startswith(rd, p):
                return toks, p + len(rd), False
            c = src[p]
            start = p
            if c in _GO_SPACE:
                space = True
                p += 1
                continue
            if c == '"':
                q = p + 1
                while q < n and src[q] != '"':
                    if src[q] == "\\":
                        q += 1
                    elif src[q] == "\n":
                        break
                    q += 1
                if q >= n or src[q] != '"':
                    raise TemplateError(f"template: {self.name}: unterminated quoted string")
                toks.append(_Tok("string", _go_unquote(src[p + 1 : q], p), space, start))
                p = q + 1
            elif c == "`":
                q = src.find("`", p + 1)
                if q < 0:
                    raise TemplateError(f"template: {self.name}: unterminated raw quoted string")
                toks.append(_Tok("string", src[p + 1 : q], space, start))
                p = q + 1
            elif c == "'":
                q = src.find("'", p + 1)
                if q < 0:
                    raise TemplateError(f"template: {self.name}: unterminated character constant")
                body = _go_unquote(src[p + 1 : q], p)
                if len(body) != 1:
                    raise TemplateError(f"template: {self.name}: malformed character constant")
                toks.append(_Tok("number", ord(body), space, start))
                p = q + 1
            elif c == "." and not (p + 1 < n and src[p + 1].isdigit()):
                m = _GO_FIELD.match(src, p)
                if m:
                    toks.append(_Tok("field", m.group(1), space, start))
                    p = m.end()
                else:
                    toks.append(_Tok("dot", None, space, start))
                    p += 1
            elif c == "$":
                m = _GO_VARIABLE.match(src, p)
                assert m is not None
                toks.append(_Tok("var", m.group(0), space, start))
                p = m.end()
            elif c in "()|,":
                toks.append(_Tok(c, c, space, start))
                p += 1
            elif src.startswith(":=", p):
                toks.append(_Tok(":=", ":=", space, start))
                p += 2
            elif c == "=":
                toks.append(_Tok("=", "=", space, start))
                p += 1
            elif c.isdigit() or c == "." or (c in "+-" and p + 1 < n and (src[p + 1].isdigit() or src[p + 1] == ".")):
                m = _GO_NUMBER.match(src, p)
                if not m or (m.end() < n and (src[m.end()].isalnum() or src[m.end()] == "_")):
                    raise TemplateError(f"template: {self.name}: bad number syntax at offset {p}")
                toks.append(_Tok("number", _go_number(m.group(0), p), space, start))
                p = m.end()
            elif c.isalpha() or c == "_":
                m = _GO_IDENT.match(src, p)
                assert m is not None
                word = m.group(0)
                if word in ("true", "false"):
                    toks.append(_Tok("bool", word == "true", space, start))
                elif word == "nil":
                    toks.append(_Tok("nil", None, space, start))
                else:
                    toks.append(_Tok("ident", word, space, start))
                p = m.end()
            else:
                raise TemplateError(f"template: {self.name}: unrecognized character in action: {c!r}")
            space = False

    # -- parser --------------------------------------------------------------------------------

    def _parse_list(self) -> tuple[list[tuple], tuple[str, list[_Tok]] | None]:
        nodes: list[tuple] = []
        while self._i < len(self._items):
            item = self._items[self._i]
            self._i += 1
            if isinstance(item, str):
                nodes.append(("text", item))
                continue
            _, toks, pos = item
            if not toks:
                raise TemplateError(f"template: {self.name}: missing value for command")
            first = toks[0]
            if first.kind == "ident" and first.value in _KEYWORDS:
                kw = first.value
                if kw in ("end", "else"):
                    return nodes, (kw, toks)
                if kw in ("if", "with", "range"):
                    nodes.append(self._parse_control(kw, toks[1:]))
                    continue
                raise UnsupportedJobError(
                    f"template {self.name}: {{{{{kw}}}}} is not supported by the simulator"
                )
            nodes.append(("action", self._parse_pipe(toks, decl_ok=True, range_decl=False)))
        return nodes, None

    def _parse_control(self, kw: str, toks: list[_Tok]) -> tuple:
        if not toks:
            raise TemplateError(f"template: {self.name}: missing value for {kw}")
        pipe = self._parse_pipe(toks, decl_ok=True, range_decl=(kw == "range"))
        body, end = self._parse_list()
        if end is None:
            raise TemplateError(f"template: {self.name}: unexpected EOF")
        else_body = None
        if end[0] == "else":
            rest = end[1][1:]
            if rest:
                if rest[0].kind == "ident" and rest[0].value == "if":
                    # {{else if x}} shares the final {{end}} with the outer control.
                    else_body = [self._parse_control("if", rest[1:])]
                    return (kw, pipe, body, else_body)
                if rest[0].kind == "ident" and rest[0].value == "with":
                    raise UnsupportedJobError(f"template {self.name}: {{{{else with}}}} is not supported")
                raise TemplateError(f"template: {self.name}: unexpected tokens after else")
            else_body, end = self._parse_list()
            if end is None or end[0] != "end":
                raise TemplateError(f"template: {self.name}: expected end; found {end and end[0]}")
        if len(end[1]) != 1:
            raise TemplateError(f"template: {self.name}: unexpected tokens in end")
        return (kw, pipe, body, else_body)

    def _parse_pipe(self, toks: list[_Tok], decl_ok: bool, range_decl: bool) -> _Pipe:
        decl: list[str] = []
        assign = False
        if decl_ok and len(toks) >= 2 and toks[0].kind == "var":
            if toks[1].kind in (":=", "="):
                decl = [toks[0].value]
                assign = toks[1].kind == "="
                toks = toks[2:]
            elif (
                range_decl
                and len(toks) >= 4
                and toks[1].kind == ","
                and toks[2].kind == "var"
                and toks[3].kind in (":=", "=")
            ):
                decl = [toks[0].value, toks[2].value]
                assign = toks[3].kind == "="
                toks = toks[4:]
        cmds: list[list[tuple]] = []
        cur: list[tuple] = []
        i = 0
        while i < len(toks):
            t = toks[i]
            if t.kind == "|":
                if not cur:
                    raise TemplateError(f"template: {self.name}: missing command before |")
                cmds.append(cur)
                cur = []
                i += 1
                continue
            node, i = self._parse_operand(toks, i)
            cur.append(node)
        if not cur:
            raise TemplateError(f"template: {self.name}: missing value for command")
        cmds.append(cur)
        return _Pipe(decl, assign, cmds)

    def _parse_operand(self, toks: list[_Tok], i: int) -> tuple[tuple, int]:
        t = toks[i]
        i += 1
        if t.kind == "field":
            chain = [t.value]
            node: tuple = ("field",)
        elif t.kind == "dot":
            chain = []
            node = ("dot",)
        elif t.kind == "var":
            chain = []
            node = ("var", t.value)
        elif t.kind in ("string", "number", "bool", "nil"):
            return ("const", t.value), i
        elif t.kind == "ident":
            if t.value in _KEYWORDS:
                raise TemplateError(f"template: {self.name}: unexpected keyword {t.value}")
            if t.value not in self.functions:
                raise UnsupportedJobError(
                    f'template {self.name}: function "{t.value}" is not supported by the simulator '
                    f"(supported: {', '.join(sorted(self.functions))})"
                )
            return ("ident", t.value), i
        elif t.kind == "(":
            depth, j = 1, i
            while j < len(toks) and depth:
                if toks[j].kind == "(":
                    depth += 1
                elif toks[j].kind == ")":
                    depth -= 1
                j += 1
            if depth:
                raise TemplateError(f"template: {self.name}: unclosed left paren")
            inner = self._parse_pipe(toks[i : j - 1], decl_ok=False, range_decl=False)
            chain = []
            node = ("pipe", inner)
            i = j
        else:
            raise TemplateError(f"template: {self.name}: unexpected {t.value!r} in operand")
        while i < len(toks) and toks[i].kind == "field" and not toks[i].space_before:
            chain.append(toks[i].value)
            i += 1
        return node + (tuple(chain),), i

    # -- execution -----------------------------------------------------------------------------

    def render(self, funcs: dict[str, Callable[..., Any]], missing_key_error: bool = False) -> str:
        out: list[str] = []
        ex = _Exec(self.name, funcs, missing_key_error)
        ex.walk(self.nodes, None, [("$", None)], out)
        return "".join(out)


class _Exec:
    def __init__(self, name: str, funcs: dict[str, Callable[..., Any]], missing_key_error: bool):
        self.name = name
        self.funcs = funcs
        self.missing_key_error = missing_key_error

    def walk(self, nodes: list[tuple], dot: Any, vars_: list[tuple[str, Any]], out: list[str]) -> None:
        mark = len(vars_)
        for node in nodes:
            kind = node[0]
            if kind == "text":
                out.append(node[1])
            elif kind == "action":
                pipe = node[1]
                val = self.eval_pipe(pipe, dot, vars_)
                if not pipe.decl:
                    out.append(self.to_text(val))
            elif kind in ("if", "with"):
                _, pipe, body, else_body = node
                inner = len(vars_)
                val = self.eval_pipe(pipe, dot, vars_)
                if _truth(val):
                    self.walk(body, val if kind == "with" else dot, vars_, out)
                elif else_body is not None:
                    self.walk(else_body, dot, vars_, out)
                del vars_[inner:]
            elif kind == "range":
                self.walk_range(node, dot, vars_, out)
        del vars_[mark:]

    def walk_range(self, node: tuple, dot: Any, vars_: list[tuple[str, Any]], out: list[str]) -> None:
        _, pipe, body, else_body = node
        inner = len(vars_)
        decl = pipe.decl
        val = self.eval_pipe(_Pipe([], False, pipe.cmds), dot, vars_)
        if isinstance(val, dict):
            seq = [(k, val[k]) for k in sorted(val)]
        elif isinstance(val, (list, tuple)):
            seq = list(enumerate(val))
        elif val is None:
            seq = []
        else:
            raise UnsupportedJobError(f"template {self.name}: range over {type(val).__name__} is not supported")
        if not seq:
            if else_body is not None:
                self.walk(else_body, dot, vars_, out)
            return
        for k, v in seq:
            if len(decl) == 1:
                vars_.append((decl[0], v))
            elif len(decl) == 2:
                vars_.append((decl[0], k))
                vars_.append((decl[1], v))
            self.walk(body, v, vars_, out)
            del vars_[inner:]

    def eval_pipe(self, pipe: _Pipe, dot: Any, vars_: list[tuple[str, Any]]) -> Any:
        val: Any = _NOARG
        for cmd in pipe.cmds:
            val = self.eval_cmd(cmd, dot, vars_, val)
        if pipe.decl:
            if pipe.assign:
                for idx in range(len(vars_) - 1, -1, -1):
                    if vars_[idx][0] == pipe.decl[0]:
                        vars_[idx] = (pipe.decl[0], val)
                        break
                else:
                    raise TemplateError(f"template: {self.name}: undefined variable: {pipe.decl[0]}")
            else:
                vars_.append((pipe.decl[0], val))
        return val

    def eval_cmd(self, cmd: list[tuple], dot: Any, vars_: list[tuple[str, Any]], final: Any) -> Any:
        first = cmd[0]
        if first[0] == "ident":
            name = first[1]
            if name in ("and", "or"):
                args = cmd[1:]
                val: Any = None
                for a in args:
                    val = self.eval_arg(a, dot, vars_)
                    if (name == "and") != _truth(val):
                        return val
                if final is not _NOARG:
                    val = final
                if not args and final is _NOARG:
                    raise TemplateError(f"template: {self.name}: wrong number of args for {name}")
                return val
            fn = self.funcs.get(name)
            if fn is None:
                raise UnsupportedJobError(
                    f'template {self.name}: function "{name}" is not supported by the simulator '
                    f"(supported: {', '.join(GoTemplate.SUPPORTED_FUNCTIONS)})"
                )
            args = [self.eval_arg(a, dot, vars_) for a in cmd[1:]]
            if final is not _NOARG:
                args.append(final)
            return fn(*args)
        if len(cmd) > 1 or final is not _NOARG:
            raise TemplateError(f"template: {self.name}: can't give argument to non-function {first}")
        return self.eval_arg(first, dot, vars_)

    def eval_arg(self, node: tuple, dot: Any, vars_: list[tuple[str, Any]]) -> Any:
        kind = node[0]
        if kind == "const":
            return node[1]
        if kind == "ident":
            return self.eval_cmd([node], dot, vars_, _NOARG)
        if kind == "dot":
            base, chain = dot, node[1]
        elif kind == "field":
            base, chain = dot, node[1]
        elif kind == "var":
            name = node[1]
            for vname, vval in reversed(vars_):
                if vname == name:
                    base = vval
                    break
            else:
                raise TemplateError(f"template: {self.name}: undefined variable: {name}")
            chain = node[2]
        elif kind == "pipe":
            base, chain = self.eval_pipe(node[1], dot, vars_), node[2]
        else:  # pragma: no cover - parser never produces other kinds
            raise TemplateError(f"template: {self.name}: bad node {node!r}")
        for name in chain:
            base = self.get_field(base, name)
        return base

    def get_field(self, obj: Any, name: str) -> Any:
        if obj is None:
            raise TemplateError(f"template: {self.name}: nil pointer evaluating interface {{}}.{name}")
        if isinstance(obj, _NomadVarItems) and name in _NomadVarItems.go_methods:
            raise UnsupportedJobError(f"template {self.name}: NomadVarItems.{name} is not supported")
        if isinstance(obj, _TemplateObject):
            return obj.field(name)
        if isinstance(obj, dict):
            if name in obj:
                return obj[name]
            if self.missing_key_error:
                raise TemplateError(f'template: {self.name}: map has no entry for key "{name}"')
            if isinstance(obj, _NomadVarItems):
                # Nomad renders with missingkey=zero unless the template sets error_on_missing_key
                # (consul-template v0.42.1 template/template.go:275-279; Nomad v2.0.5
                # client/allocrunner/taskrunner/template/template.go:790): the zero value of the
                # map's element type, a NomadVarItem (dependency/nomad_var_structs.go:67), which
                # prints as its empty Value (:135). Only a map of interface{} gives "<no value>".
                return _NomadVarItem("", "")
            return None
        raise TemplateError(f"template: {self.name}: can't evaluate field {name} in type {_go_type(obj)}")

    def to_text(self, val: Any) -> str:
        if val is None or val is _NOARG:
            return "<no value>"
        if isinstance(val, bool):
            return "true" if val else "false"
        if isinstance(val, int):
            return str(val)
        if isinstance(val, float):
            return _go_float(val)
        if isinstance(val, str):
            return val
        if isinstance(val, _NomadVarItem):
            return str(val)
        raise UnsupportedJobError(
            f"template {self.name}: printing a {_go_type(val)} directly is not simulated "
            "(Go would print its internal representation); print a field of it instead"
        )


def _go_type(v: Any) -> str:
    if isinstance(v, _TemplateObject):
        return v.go_type
    if isinstance(v, _NomadVarItems):
        return "*dependency.NomadVarItems"
    if isinstance(v, list):
        return "[]interface {}"
    if isinstance(v, dict):
        return "map[string]interface {}"
    return {str: "string", int: "int", float: "float64", bool: "bool"}.get(type(v), type(v).__name__)


def _go_float(f: float) -> str:
    if f.is_integer() and abs(f) < 1e21:
        return str(int(f))
    return repr(f)


def _truth(v: Any) -> bool:
    """Go text/template ``isTrue``."""
    if v is None or v is _NOARG:
        return False
    if isinstance(v, (bool, int, float)):
        return bool(v)
    if isinstance(v, (str, list, tuple, dict)):
        return len(v) > 0
    return True


def _basic(v: Any, fn: str) -> Any:
    if isinstance(v, _NomadVarItem):
        raise TemplateError(f"error calling {fn}: incompatible types for comparison")
    if v is None or isinstance(v, (str, int, float, bool)):
        return v
    raise TemplateError(f"error calling {fn}: invalid type for comparison")


def _cmp_ok(a: Any, b: Any, fn: str) -> None:
    num = (int, float)
    if isinstance(a, bool) != isinstance(b, bool):
        raise TemplateError(f"error calling {fn}: incompatible types for comparison")
    if isinstance(a, num) and isinstance(b, num):
        return
    if type(a) is not type(b):
        raise TemplateError(f"error calling {fn}: incompatible types for comparison")


def _fn_eq(a: Any, *bs: Any) -> bool:
    if not bs:
        raise TemplateError("error calling eq: missing argument for comparison")
    a = _basic(a, "eq")
    for b in bs:
        b = _basic(b, "eq")
        if a is None or b is None:
            if a is b:
                return True
            continue
        _cmp_ok(a, b, "eq")
        if a == b:
            return True
    return False


def _ordered(name: str, op: Callable[[Any, Any], bool]) -> Callable[[Any, Any], bool]:
    def fn(a: Any, b: Any) -> bool:
        a, b = _basic(a, name), _basic(b, name)
        if a is None or b is None or isinstance(a, bool):
            raise TemplateError(f"error calling {name}: invalid type for comparison")
        _cmp_ok(a, b, name)
        return op(a, b)

    return fn


def _fn_index(item: Any, *indices: Any) -> Any:
    for idx in indices:
        if item is None:
            raise TemplateError("error calling index: index of untyped nil")
        if isinstance(item, (list, tuple, str)):
            if not isinstance(idx, int) or isinstance(idx, bool):
                raise TemplateError(f"error calling index: cannot index slice/array with type {_go_type(idx)}")
            if idx < 0 or idx >= len(item):
                raise TemplateError(f"error calling index: index out of range: {idx}")
            item = item[idx] if not isinstance(item, str) else ord(item[idx])
        elif isinstance(item, dict):
            item = item.get(idx)
        else:
            raise TemplateError(f"error calling index: can't index item of type {_go_type(item)}")
    return item


def _fn_len(item: Any) -> int:
    if isinstance(item, (str, list, tuple, dict)):
        return len(item)
    raise TemplateError(f"error calling len: len of type {_go_type(item)}")


def _sprint_one(v: Any) -> str:
    if v is None:
        return "<nil>"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return _go_float(v)
    if isinstance(v, (int, str, _NomadVarItem)):
        return str(v)
    raise UnsupportedJobError(f"printing a {_go_type(v)} with print/printf is not simulated")


def _fn_print(*args: Any) -> str:
    # fmt.Sprint: a space between operands when neither side is a string.
    out = []
    for i, a in enumerate(args):
        if i > 0 and not isinstance(a, str) and not isinstance(args[i - 1], str):
            out.append(" ")
        out.append(_sprint_one(a))
    return "".join(out)


def _fn_println(*args: Any) -> str:
    return " ".join(_sprint_one(a) for a in args) + "\n"


_PRINTF_VERB = re.compile(r"%([-+# 0]*)(\d+)?(?:\.(\d+))?([a-zA-Z%])")


def _fn_printf(fmt: str, *args: Any) -> str:
    out: list[str] = []
    pos = 0
    argi = 0
    for m in _PRINTF_VERB.finditer(fmt):
        out.append(fmt[pos : m.start()])
        pos = m.end()
        flags, width, prec, verb = m.groups()
        if verb == "%":
            out.append("%")
            continue
        if verb not in "sdvq" or "#" in flags or "+" in flags or " " in flags:
            raise UnsupportedJobError(f"printf verb {m.group(0)!r} is not simulated")
        if argi >= len(args):
            raise UnsupportedJobError("printf with missing arguments is not simulated")
        a = args[argi]
        argi += 1
        if verb == "d":
            if not isinstance(a, int) or isinstance(a, bool):
                raise UnsupportedJobError(f"printf %d of {_go_type(a)} is not simulated")
            text = str(a)
        elif verb == "q":
            if not isinstance(a, str):
                raise UnsupportedJobError(f"printf %q of {_go_type(a)} is not simulated")
            text = '"' + a.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t") + '"'
        else:
            text = _sprint_one(a)
            if prec is not None and verb == "s":
                text = text[: int(prec)]
        if width:
            w = int(width)
            if "-" in flags:
                text = text.ljust(w)
            elif "0" in flags and verb == "d":
                text = text.rjust(w, "0")
            else:
                text = text.rjust(w)
        out.append(text)
    out.append(fmt[pos:])
    if argi != len(args):
        raise UnsupportedJobError("printf with extra arguments is not simulated")
    return "".join(out)


#: Go text/template builtins the simulator implements (and/or are handled lazily by the executor).
BUILTIN_FUNCS: dict[str, Callable[..., Any]] = {
    "index": _fn_index,
    "len": _fn_len,
    "not": lambda x: not _truth(x),
    "eq": _fn_eq,
    "ne": lambda a, b: not _fn_eq(a, b),
    "lt": _ordered("lt", lambda a, b: a < b),
    "le": _ordered("le", lambda a, b: a <= b),
    "gt": _ordered("gt", lambda a, b: a > b),
    "ge": _ordered("ge", lambda a, b: a >= b),
    "print": _fn_print,
    "printf": _fn_printf,
    "println": _fn_println,
}

# consul-template's query syntax for nomadService: [tag.]name[@region], nothing else
# (v0.42.1, Nomad 2.0.5's: dependency/nomad_service.go NomadServiceQueryRe = tagRe +
# serviceNameRe + regionRe, dependency/dependency.go; no namespace query).
_NOMAD_SERVICE_QUERY = re.compile(
    r"\A(?:(?P<tag>[\w=:.\-]+)\.)?(?P<name>[\w\-]+)(?:@(?P<region>[\w.\-]+))?\Z"
)


# --------------------------------------------------------------------------------------------
# Processes
# --------------------------------------------------------------------------------------------


def process_group_members(pgid: int) -> list[int]:
    """PIDs (not zombies) whose process group is ``pgid``, read from /proc."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:
            continue
        rest = stat[stat.rfind(")") + 2 :].split()
        if len(rest) >= 3 and rest[0] != "Z" and int(rest[2]) == pgid:
            members.append(int(entry))
    return members


def _check_can_become(user: "TaskUser", where: str) -> None:
    """Running a task as another user takes root here, as it does on a Nomad client."""
    if os.geteuid() != 0 and (user.uid, user.gid) != (os.geteuid(), os.getegid()):
        raise UnsupportedJobError(
            f"{where}: the task runs as uid {user.uid} gid {user.gid} ({user.why}); the simulator "
            "needs root to start it as that user"
        )


def _check_reachable(path: str, user: "TaskUser", where: str) -> None:
    """Every directory above the simulator's alloc_dir must let the task's user through, as a
    Nomad client's data_dir does; pytest's tmp_path (under a 0700 directory) does not."""
    if user.uid == 0:
        return
    gids = {user.gid, *user.groups}
    cur = os.path.dirname(os.path.abspath(path))
    while True:
        st = os.stat(cur)
        bit = 0o100 if st.st_uid == user.uid else 0o010 if st.st_gid in gids else 0o001
        if not st.st_mode & bit:
            raise UnsupportedJobError(
                f"{where}: uid {user.uid} cannot pass through {cur} (mode {stat.S_IMODE(st.st_mode):o}); "
                "give the simulator a workdir whose parents any user may traverse"
            )
        parent = os.path.dirname(cur)
        if parent == cur:
            return
        cur = parent


def _alloc_mkdir(path: str, perms: int) -> None:
    """client/allocdir/alloc_dir.go:715 ``allocMkdirAll`` (v2.0.5): MkdirAll, then
    ``dropDirPermissions`` (fs_unix.go:36-63): chmod to perms | 0777 and, when the agent runs as
    root, chown to nobody."""
    os.makedirs(path, exist_ok=True)
    os.chmod(path, perms | 0o777)
    if os.geteuid() == 0:
        import pwd

        nobody = pwd.getpwnam("nobody")
        os.chown(path, nobody.pw_uid, nobody.pw_gid)


def _kill_env_marked(*entries: str) -> None:
    """SIGKILL every live process of ours whose environment holds every one of ``entries`` (NAME=value)."""
    want = {e.encode() for e in entries}
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if want <= set(f.read().split(b"\0")):
                    os.kill(int(pid), signal.SIGKILL)
        except (OSError, ProcessLookupError):
            continue


def _kill_groups(pgids: set[int]) -> None:
    """Last-resort cleanup (weakref.finalize / interpreter exit): SIGKILL every group."""
    for pgid in list(pgids):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _parse_signal(name: str) -> signal.Signals:
    n = name.upper()
    if not n.startswith("SIG"):
        n = "SIG" + n
    try:
        return signal.Signals[n]
    except KeyError:
        raise UnsupportedJobError(f"unknown signal {name!r}") from None


def _ns_to_s(v: Any, default: float) -> float:
    if v is None:
        return default
    return float(v) / 1e9


# --------------------------------------------------------------------------------------------
# Cluster model
# --------------------------------------------------------------------------------------------


@dataclass
class _TemplateRun:
    index: int
    spec: dict[str, Any]
    compiled: GoTemplate
    change_mode: str
    change_signal: signal.Signals | None
    perms: int
    envvars: bool
    once: bool
    missing_key_error: bool
    dest: str = ""
    content: str | None = None
    #: The rendered file's owner, -1 = unchanged (the agent's): set only when the template's
    #: Uid/Gid are >= 0 (template.go:820-826 v2.0.5).
    uid: int = -1
    gid: int = -1


@dataclass(eq=False)
class TaskRun:
    """One task of one allocation, with everything the simulator knows about it."""

    name: str
    alloc: "Allocation" = field(repr=False)
    spec: dict[str, Any] = field(repr=False)
    state: str = "new"  # new | pending | running | restarting | dead
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    pid: int | None = None
    exit_code: int | None = None
    restarts: int = 0
    failed: bool = False
    error: str | None = None
    env: dict[str, str] = field(default_factory=dict, repr=False)
    argv: list[str] = field(default_factory=list)
    events: list[str] = field(default_factory=list, repr=False)
    templates: list[_TemplateRun] = field(default_factory=list, repr=False)
    template_env_view: dict[str, str] = field(default_factory=dict, repr=False)
    restart_at: float = 0.0
    restart_window_start: float = 0.0
    restart_count_in_window: int = 0
    service_ids: list[str] = field(default_factory=list)
    #: Who the process runs as (see SimCluster._task_user); None: the agent's own user.
    user: "TaskUser | None" = None

    @property
    def dir(self) -> str:
        return os.path.join(self.alloc.dir, self.name)

    def log_path(self, stream: str = "stdout") -> str:
        return os.path.join(self.alloc.dir, "alloc", "logs", f"{self.name}.{stream}.0")

    def event(self, text: str) -> None:
        self.events.append(f"{time.strftime('%H:%M:%S')} {text}")


@dataclass(eq=False)
class Allocation:
    """One placed instance of a task group: ``<job>.<group>[<index>]``."""

    id: str
    name: str
    index: int
    group: dict[str, Any] = field(repr=False)
    dir: str
    ports: dict[str, dict[str, Any]]  # label -> {"Label", "Value", "To", "HostIP"}
    tasks: dict[str, TaskRun] = field(default_factory=dict, repr=False)
    started: bool = False
    started_at: float = 0.0
    #: time.monotonic() at creation: max_run_duration counts from here, started or not.
    created_at: float = field(default_factory=time.monotonic)
    #: True once the group's max_run_duration ended the allocation (Nomad: complete, not failed).
    max_run_exceeded: bool = False
    #: Set when the outcome was decided outside the tasks ("lost", "unknown", or "complete"
    #: after max_run_duration); otherwise :attr:`client_status` follows the tasks.
    status_override: str | None = None
    client_description: str = ""
    #: The servers' clock (SimCluster._clock) when it turned unknown; lost_after counts from here.
    unknown_at: float = 0.0
    service_ids: list[str] = field(default_factory=list)
    #: The client node it runs on (SimCluster ``hosts``); None: this machine.
    host: Any = field(default=None, repr=False)

    @property
    def group_name(self) -> str:
        return self.group["Name"]

    @property
    def shared_dir(self) -> str:
        return os.path.join(self.dir, "alloc")

    def task_dir(self, task: str) -> str:
        return os.path.join(self.dir, task)

    def log_path(self, task: str, stream: str = "stdout") -> str:
        return self.tasks[task].log_path(stream)

    @property
    def terminal(self) -> bool:
        return all(t.state == "dead" for t in self.tasks.values())

    @property
    def client_status(self) -> str:
        """Nomad's ClientStatus: pending, running, complete, failed, lost or unknown."""
        if self.status_override:
            return self.status_override
        if not self.terminal:
            return "running" if any(t.state == "running" for t in self.tasks.values()) else "pending"
        return "complete" if self.exit_code == 0 else "failed"

    @property
    def exit_code(self) -> int | None:
        """First non-zero task exit code, else 0; None while running or if a task never ran."""
        codes = []
        for t in self.tasks.values():
            if t.state != "dead" or t.exit_code is None:
                return None
            codes.append(t.exit_code)
        return next((c for c in codes if c != 0), 0)


# --------------------------------------------------------------------------------------------
# Docker: the container's command, from the task config and the image (run as a host process)
# --------------------------------------------------------------------------------------------


@dataclass
class StandInImage:
    """What the docker driver takes from an image's config: ENTRYPOINT, CMD and ENV. No image is
    pulled: a docker task runs as a host process with the argv :func:`docker_argv` composes."""

    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    #: The image's USER ("uid", "uid:gid", "name" or "name:group"); "" is root. A task ``user``
    #: replaces it (drivers/docker/driver.go:1055 v2.0.5, ``User: task.User``; Docker falls back
    #: to the image's USER only when that is empty).
    user: str = ""


#: An image whose entrypoint ignores its arguments and exits 0, as vLLM's server image does with
#: anything but its own flags: a task that leaves the image's entrypoint in place never runs
#: its command.
SWALLOWING_ENTRYPOINT = ["/bin/sh", "-c", "echo 'image entrypoint: started its own program, ignored' \"$@\"; exit 0",
                         "image-entrypoint"]


def docker_argv(config: dict[str, Any], image: StandInImage) -> list[str]:
    """The container's argv: Entrypoint + Cmd.

    Nomad's side, drivers/docker/driver.go v2.0.5 createContainerConfig: ``Entrypoint:
    driverConfig.Entrypoint`` (:1053, from the task config alone); ``command`` set -> Cmd =
    [command] + args (:1477-1488); else args set -> Cmd = args (:1489-1491). Docker's side
    (moby ``daemon/commit.go`` merge, not in this checkout's sources; documented for
    ``docker run --entrypoint``): an empty Entrypoint takes the image's ENTRYPOINT and, when
    the Cmd is empty too, the image's CMD; a set Entrypoint drops both of the image's."""
    entrypoint = list(config.get("entrypoint") or [])
    command = config.get("command") or ""
    args = list(config.get("args") or [])
    cmd = [command] + args if command else args
    if not entrypoint:
        entrypoint = list(image.entrypoint)
        if not cmd:
            cmd = list(image.cmd)
    return entrypoint + cmd


# --------------------------------------------------------------------------------------------
# The task's user: who its process runs as, per driver
# --------------------------------------------------------------------------------------------


@dataclass
class TaskUser:
    """Who a task's process runs as: uid, primary gid, supplementary groups, and the variables
    the executor sets for that user (``USER``, ``LOGNAME``, ``HOME``; none for docker)."""

    uid: int
    gid: int
    groups: list[int] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    why: str = ""


def _host_user(name: str, where: str) -> Any:
    """``helper/users.Lookup`` (helper/users/lookup.go:23 v2.0.5): Go's ``user.Lookup``, a user
    *name* on the client host (a number is not looked up as a uid)."""
    import pwd

    try:
        return pwd.getpwnam(name)
    except KeyError:
        raise TaskStartError(f"{where}: failed to identify user {name}: user: unknown user {name}") from None


def docker_user(user: str, where: str) -> TaskUser:
    """The container's user from ``User`` (the task's, else the image's USER): "uid", "uid:gid",
    "name" or "name:group", as Docker resolves it against the image's /etc/passwd and
    /etc/group (moby/sys/user ``GetExecUser``, not in these sources). The stand-in image has
    none of its own, so names resolve on this host; a numeric uid not found there gets gid 0;
    no supplementary groups (the image's /etc/group names none for it)."""
    import grp
    import pwd

    name, _, group = user.partition(":")
    try:
        pw = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
        uid, gid = pw.pw_uid, pw.pw_gid
    except KeyError:
        if not name.isdigit():
            raise TaskStartError(f"{where}: unable to find user {name}: no matching entries in passwd file") from None
        uid, gid = int(name), 0
    if group:
        try:
            gid = int(group) if group.isdigit() else grp.getgrnam(group).gr_gid
        except KeyError:
            raise TaskStartError(f"{where}: unable to find group {group}: no matching entries in group file") from None
    return TaskUser(uid, gid, [], {}, f"docker user {user!r}")


#: Docker config keys the simulator acts on, and those it records as unsimulated.
_DOCKER_CONFIG_KEYS = ("image", "entrypoint", "command", "args", "network_mode")
_DOCKER_UNSIMULATED_KEYS = ("ulimit", "shm_size", "devices", "volumes")

_SUPPORTED_DRIVERS = ("raw_exec", "exec")
# Present in real jobs, decided by the servers or by timing the simulator does not model;
# recorded in SimCluster.unsimulated rather than refused.
_UNSIMULATED_GROUP_KEYS = (
    "ShutdownDelay",
    "ReschedulePolicy",
    "Update",
    "Migrate",
    "Spreads",
    "Affinities",
    "Constraints",
)
_RAW_EXEC_CONFIG_KEYS = ("command", "args")


@dataclass
class SimHost:
    """A client node of its own: a host its tasks run on, entered by ``enter`` (an argv prefix,
    e.g. ``nsenter -t PID --net --uts --mount --`` for a network namespace of
    tests/cluster/multihost.sh), with its own network fingerprint. ``network_interface`` is the
    client's option of that name ("" = the interface of the default route)."""

    name: str
    enter: list[str]
    network_interface: str = ""
    #: The fingerprinted address (:func:`fingerprint_address`): the ports' HostIP, the services'
    #: address, ``attr.unique.network.ip-address``. Set by SimCluster when empty.
    ip: str = ""
    id: str = field(default_factory=lambda: str(uuid.uuid4()))
    used_ports: set[int] = field(default_factory=set, repr=False)


def fingerprint_address(host: SimHost) -> str:
    """The address the client's network fingerprint gives the node, read on the host itself.

    client/fingerprint/network.go (v2.0.5): ``findInterface`` takes the ``network_interface``
    option, else the interface of the default route, and fails without either ("no
    network_interface given and failed to determine interface attached to default route");
    ``createNetworkResources`` takes that interface's addresses, link-local ones only when
    nothing else, IPv4 first (``sortNetworkResources``), and the first becomes
    ``unique.network.ip-address``; ``deriveAddressAliases`` gives the same interface's addresses
    the host network alias "default", from which the scheduler assigns every port that names no
    ``host_network`` (nomad/structs/network.go ``AssignPorts``: ``HostIP: addr.Address``)."""

    def run(*argv: str) -> str:
        p = subprocess.run([*host.enter, *argv], capture_output=True, text=True, timeout=30)
        if p.returncode != 0:
            raise SimError(f"{host.name}: {' '.join(argv)}: {p.stderr.strip()[:200]}")
        return p.stdout

    iface = host.network_interface
    if not iface:
        m = re.search(r"\bdev (\S+)", run("ip", "-4", "route", "show", "default"))
        if not m:
            raise SimError(f"{host.name}: Error while detecting network interface  during fingerprinting: "
                           "no network_interface given and failed to determine interface attached to default route")
        iface = m[1]
    addrs = re.findall(r"\binet (\d+\.\d+\.\d+\.\d+)/", run("ip", "-4", "-o", "addr", "show", "dev", iface))
    usable = [a for a in addrs if not a.startswith("169.254.")] or addrs
    if not usable:
        raise SimError(f"{host.name}: interface {iface} has no IPv4 address")
    return usable[0]


_HEARTBEAT_CODE = """
import socket, sys, time
addr, port, name = sys.argv[1], int(sys.argv[2]), sys.argv[3]
while True:
    try:
        with socket.create_connection((addr, port), timeout=2) as s:
            s.sendall(name.encode() + b"\\n")
    except OSError:
        pass
    time.sleep(float(sys.argv[4]))
"""


class Heartbeats:
    """Each SimHost's client heartbeating to the servers over the host's own network, and the
    servers' timer that marks a silent node down (``on_down(name)``, e.g. a fake API's node_down).

    Nomad: the client heartbeats the servers (client/client.go ``registerAndHeartbeat`` ->
    ``Node.UpdateStatus``); the server resets a timer of TTL + heartbeat_grace on each heartbeat
    and, when it fires, invalidates the node (nomad/heartbeat.go v2.0.5 :107-111, :130-138;
    defaults nomad/config.go :676-678: min_heartbeat_ttl 10 s, heartbeat_grace 10 s). Deviations:
    the TTL's random stagger (up to another TTL, ``helper.RandomStagger``) is left out and the
    client heartbeats every ``interval_s`` rather than about once per TTL, so a node that goes
    silent is down ``ttl_s + grace_s`` after, where Nomad takes 20-30 s after its last heartbeat.
    The heartbeat process runs in the host (its ``enter``), so a cut host's heartbeats stop with
    its link; ``listen`` is an address of this machine the hosts reach (the rig's mgmt bridge).
    ``on_up(name)``: a node that was down heartbeats again (its link healed)."""

    def __init__(self, hosts: Iterable[SimHost], listen: str, on_down: Callable[[str], Any],
                 ttl_s: float = 10.0, grace_s: float = 10.0, interval_s: float = 1.0,
                 on_up: Callable[[str], Any] | None = None) -> None:
        import sys

        self.on_down, self.on_up, self.limit = on_down, on_up, ttl_s + grace_s
        self.last: dict[str, float] = {}
        self.down: list[str] = []
        self._stop = threading.Event()
        self._srv = socket.create_server((listen, 0))
        self._srv.settimeout(0.5)
        port = self._srv.getsockname()[1]
        self._procs = [subprocess.Popen([*h.enter, sys.executable, "-c", _HEARTBEAT_CODE, listen, str(port), h.name,
                                         str(interval_s)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL, start_new_session=True) for h in hosts]
        self._threads = [threading.Thread(target=f, daemon=True) for f in (self._accept, self._watch)]
        for t in self._threads:
            t.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._srv.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(2)
                try:
                    name = conn.recv(256).decode(errors="replace").strip()
                except OSError:
                    continue
            self.last[name] = time.monotonic()
            if name in self.down:
                # A down node heartbeating again is ready (nomad/node_endpoint.go UpdateStatus, v2.0.5).
                self.down.remove(name)
                if self.on_up is not None:
                    self.on_up(name)

    def _watch(self) -> None:
        while not self._stop.wait(0.5):
            now = time.monotonic()
            for name, seen in list(self.last.items()):
                if name not in self.down and now - seen > self.limit:
                    self.down.append(name)
                    self.on_down(name)

    def close(self) -> None:
        self._stop.set()
        for p in self._procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
        for t in self._threads:
            t.join(timeout=5)
        self._srv.close()

    def __enter__(self) -> "Heartbeats":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class SimCluster:
    """A one-host stand-in for a Nomad cluster running one job.

    ``node_attrs`` uses interpolation keys: ``node.unique.name``, ``node.datacenter``,
    ``node.class``, ``attr.<name>``, ``meta.<name>``. ``variables`` maps Nomad Variable paths
    to their items, for ``nomadVar``/``nomadVarExists``. ``host_env`` replaces ``os.environ``
    as the agent's own environment. ``poll_interval`` is how often template dependencies,
    exits and restarts are checked (Nomad reacts to blocking queries; ~0.2 s is close enough).
    """

    def __init__(
        self,
        job: dict[str, Any],
        workdir: str | os.PathLike[str],
        host_ip: str = "127.0.0.1",
        node_attrs: dict[str, str] | None = None,
        *,
        variables: dict[str, dict[str, str]] | None = None,
        host_env: dict[str, str] | None = None,
        exec_as_raw_exec: bool = False,
        docker_images: dict[str, StandInImage] | None = None,
        nomad_version: str = "2.0.5",
        poll_interval: float = 0.2,
        hosts: list[SimHost] | None = None,
    ) -> None:
        if "Job" in job and "TaskGroups" not in job:
            raise SimError("pass the job itself (payload['Job']), not the {'Job': ...} payload")
        self.job = job
        self.workdir = os.path.abspath(os.fspath(workdir))
        os.makedirs(self.workdir, exist_ok=True)
        # The client's alloc_dir: 0711, any task user may pass through it (client/client.go:742,
        # :758 v2.0.5). Its parents are the caller's: see _check_reachable.
        os.chmod(self.workdir, 0o711)
        self.host_ip = host_ip
        self.job_id: str = job.get("ID") or job.get("Name") or ""
        if not self.job_id:
            raise SimError("job has no ID")
        self.job_name: str = job.get("Name") or self.job_id
        self.job_type: str = job.get("Type") or "service"
        self.region: str = job.get("Region") or "global"
        self.namespace: str = job.get("Namespace") or "default"
        self.exec_as_raw_exec = exec_as_raw_exec
        #: image name -> stand-in; docker tasks run (as host processes) only for these images.
        self.docker_images: dict[str, StandInImage] = dict(docker_images or {})
        #: The servers' lost-node rules (lose()): 2.0.5, or before 1.11.2 (e.g. "1.11.1").
        self.nomad_version: tuple[int, ...] = tuple(int(p) for p in nomad_version.split("."))
        self.poll_interval = poll_interval
        self.host_env = dict(os.environ if host_env is None else host_env)
        self.registry = ServiceRegistry()
        self.allocations: list[Allocation] = []
        #: Job features present in the job that the simulator does not act on.
        self.unsimulated: list[str] = []
        self._variables: dict[str, dict[str, str]] = {k: dict(v) for k, v in (variables or {}).items()}
        #: Where nomadVar/nomadVarExists read when set (path -> items or None): the servers'
        #: Variables, as the client's template runner queries them (a fake API's attach_sim sets
        #: it); otherwise set_variable()'s own store.
        self.variable_source: Callable[[str], dict[str, str] | None] | None = None
        #: The Task API and workload identities, when the servers are a fake API (its attach_sim sets
        #: it): ``task_api(alloc_id, task, secrets_dir)`` serves the agent's API on
        #: ``secrets_dir/api.sock`` and returns the task's signed identity. None: neither.
        self.task_api: Callable[[str, str, str], str] | None = None
        self._wi_tokens: dict[tuple[str, str], str] = {}
        self._lock = threading.RLock()
        self._stop_evt = threading.Event()
        self._monitor: threading.Thread | None = None
        self._stopping = False
        self._pgids: set[int] = set()
        self._used_ports: set[int] = set()
        self._groups = {g["Name"]: g for g in job.get("TaskGroups") or []}
        self._placed: set[str] = set()  # names of live allocations (not lost)
        self._clock_offset = 0.0  # advance(): the servers' clock runs ahead of the tasks
        self._monitor_error: BaseException | None = None
        # Safety net: a forgotten cluster still takes its process groups down with it.
        self._finalizer = weakref.finalize(self, _kill_groups, self._pgids)

        hostname = socket.gethostname()
        dcs = [d for d in job.get("Datacenters") or [] if d and "*" not in d]
        arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
        self.node_attrs: dict[str, str] = {
            "node.unique.id": str(uuid.uuid4()),
            "node.unique.name": hostname,
            "node.datacenter": dcs[0] if dcs else "dc1",
            "node.class": "",
            "node.region": self.region,
            "attr.kernel.name": "linux",
            "attr.cpu.arch": arch,
            "attr.unique.hostname": hostname,
            "attr.unique.network.ip-address": host_ip,
            "attr.driver.raw_exec": "1",
        }
        for k, v in (node_attrs or {}).items():
            if not (k.startswith("node.") or k.startswith("attr.") or k.startswith("meta.")):
                raise SimError(f"node attribute {k!r} must start with node., attr. or meta.")
            self.node_attrs[k] = str(v)
        #: Client nodes of their own (SimHost): each allocation runs on one, with that node's
        #: name, fingerprinted address and ports; None: every allocation on this machine.
        self.hosts: dict[str, SimHost] = {}
        for h in hosts or []:
            if not h.ip:
                h.ip = fingerprint_address(h)
            self.hosts[h.name] = h
        self._validate_job()

    def attrs(self, alloc: Allocation) -> dict[str, str]:
        """The node attributes of the allocation's node (its own on a SimHost)."""
        h = alloc.host
        if h is None:
            return self.node_attrs
        return {**self.node_attrs, "node.unique.id": h.id, "node.unique.name": h.name,
                "attr.unique.hostname": h.name, "attr.unique.network.ip-address": h.ip}

    # -- validation ------------------------------------------------------------------------------

    def _validate_job(self) -> None:
        if not self._groups:
            raise SimError("job has no TaskGroups")
        for key in ("Constraints", "Affinities", "Spreads", "Update", "Periodic", "ParameterizedJob"):
            if self.job.get(key):
                self.unsimulated.append(f"job: {key}")
        for gname, g in self._groups.items():
            for net in g.get("Networks") or []:
                mode = net.get("Mode") or "host"
                if mode != "host":
                    raise UnsupportedJobError(f"group {gname}: network mode {mode!r} is not simulated (host only)")
            for key in ("Volumes",):
                if g.get(key):
                    raise UnsupportedJobError(f"group {gname}: {key} are not simulated")
            for key in _UNSIMULATED_GROUP_KEYS:
                if g.get(key):
                    self.unsimulated.append(f"group {gname}: {key}")
            for svc in g.get("Services") or []:
                if svc.get("Checks"):
                    self.unsimulated.append(f"group {gname}: service {svc.get('Name')} checks")
            for task in g.get("Tasks") or []:
                self._validate_task(gname, task)

    def _validate_task(self, gname: str, task: dict[str, Any]) -> None:
        where = f"group {gname} task {task.get('Name')}"
        driver = task.get("Driver")
        docker = driver == "docker" and bool(self.docker_images)
        if docker:
            self._validate_docker_task(where, task)
        elif driver not in _SUPPORTED_DRIVERS:
            raise UnsupportedJobError(
                f"{where}: driver {driver!r} cannot run here (no containers or VMs on this machine); "
                "render the job with driver raw_exec for the simulator"
            )
        if driver == "exec" and not self.exec_as_raw_exec:
            raise UnsupportedJobError(
                f"{where}: the exec driver chroots the task (NOMAD_TASK_DIR=/local inside); the "
                "simulator cannot, pass exec_as_raw_exec=True to run it unisolated with host paths"
            )
        config = task.get("Config") or {}
        if not docker and "command" not in config:
            raise TaskConfigError(f'{where}: failed to parse config: Missing required argument "command"')
        extra = [] if docker else sorted(set(config) - set(_RAW_EXEC_CONFIG_KEYS))
        if extra:
            raise UnsupportedJobError(f"{where}: config keys {extra} are not simulated (command and args only)")
        for key in ("Lifecycle", "Vault", "Artifacts", "VolumeMounts", "CSIPluginConfig", "DispatchPayload"):
            if task.get(key):
                raise UnsupportedJobError(f"{where}: {key} is not simulated")
        res = task.get("Resources") or {}
        if res.get("Networks"):
            raise UnsupportedJobError(
                f"{where}: task-level networks (deprecated) are not simulated; use a group network"
            )
        if res.get("Devices") and not docker:
            raise UnsupportedJobError(f"{where}: devices (e.g. nvidia/gpu) cannot be provided by the simulator")
        if res.get("Cores"):
            self.unsimulated.append(f"{where}: Cores (NOMAD_CPU_CORES not set)")
        for i, t in enumerate(task.get("Templates") or []):
            tw = f"{where} template {i}"
            if t.get("SourcePath"):
                raise UnsupportedJobError(f"{tw}: SourcePath is not simulated (use EmbeddedTmpl)")
            mode = t.get("ChangeMode") or "restart"
            if mode not in ("noop", "restart", "signal"):
                raise UnsupportedJobError(f"{tw}: change_mode {mode!r} is not simulated")
            if mode == "signal":
                _parse_signal(t.get("ChangeSignal") or "")
            if t.get("Wait") or t.get("Splay"):
                self.unsimulated.append(f"{tw}: wait/splay timing")
            GoTemplate(t.get("EmbeddedTmpl") or "", t.get("LeftDelim") or "", t.get("RightDelim") or "", name=tw)
        for svc in task.get("Services") or []:
            if svc.get("Checks"):
                self.unsimulated.append(f"{where}: service {svc.get('Name')} checks")

    def _validate_docker_task(self, where: str, task: dict[str, Any]) -> None:
        """A docker task, run as a host process (see :func:`docker_argv`): its image must have a
        stand-in; host networking only; what a container would add is recorded as unsimulated."""
        config = task.get("Config") or {}
        image = config.get("image")
        if image not in self.docker_images:
            raise UnsupportedJobError(f"{where}: no stand-in for image {image!r} (docker_images=)")
        extra = sorted(set(config) - set(_DOCKER_CONFIG_KEYS) - set(_DOCKER_UNSIMULATED_KEYS))
        if extra:
            raise UnsupportedJobError(f"{where}: docker config keys {extra} are not simulated")
        if config.get("network_mode", "host") != "host":
            raise UnsupportedJobError(f"{where}: docker network_mode {config.get('network_mode')!r} (host only)")
        for key in _DOCKER_UNSIMULATED_KEYS:
            if config.get(key):
                self.unsimulated.append(f"{where}: docker {key}")
        if (task.get("Resources") or {}).get("Devices"):
            self.unsimulated.append(f"{where}: devices (no GPUs; NVIDIA_VISIBLE_DEVICES names none)")

    # -- variables -------------------------------------------------------------------------------

    def set_variable(self, path: str, items: dict[str, str]) -> None:
        with self._lock:
            self._variables[path] = {k: str(v) for k, v in items.items()}

    def delete_variable(self, path: str) -> None:
        with self._lock:
            self._variables.pop(path, None)

    # -- placement -------------------------------------------------------------------------------

    def place(self, group_names: Iterable[str] | None = None, node: str | None = None,
              alloc_id: str | None = None) -> list[Allocation]:
        """Create the allocations of the named groups (all groups when None).

        With ``hosts``, each runs on ``node`` (a host's name: the node the servers chose) or, when
        None, on the host with the fewest live allocations (the first of those).

        A group name places every index of 0..Count-1 that no live allocation holds (lowest
        first, as ``AllocNameIndex.Next`` in scheduler/reconciler/allocs.go); ``group[K]`` places
        that one index. Leave groups or indexes out to simulate Nomad's lack of gang scheduling.
        ``alloc_id``: the ID the servers gave the one allocation placed (a fake API's), else a fresh one.
        """
        names = list(self._groups) if group_names is None else list(group_names)
        created = []
        with self._lock:
            self._check_open()
            wanted: list[tuple[dict[str, Any], int]] = []
            for name in names:
                gname, _, idx = name.partition("[")
                if gname not in self._groups:
                    raise SimError(f"job has no group {gname!r} (groups: {sorted(self._groups)})")
                g = self._groups[gname]
                count = 1 if g.get("Count") is None else int(g["Count"])
                if idx:
                    index = int(idx.rstrip("]"))
                    if not 0 <= index < count:
                        raise SimError(f"{name}: index outside 0..{count - 1}")
                    indexes = [index]
                else:
                    indexes = [i for i in range(count) if f"{self.job_id}.{gname}[{i}]" not in self._placed]
                    if not indexes:
                        raise SimError(f"group {gname!r} is already placed")
                for index in indexes:
                    if f"{self.job_id}.{gname}[{index}]" in self._placed or any(
                            w[0] is g and w[1] == index for w in wanted):
                        raise SimError(f"{gname}[{index}] is already placed")
                    wanted.append((g, index))
            if alloc_id is not None and len(wanted) != 1:
                raise SimError("alloc_id names one allocation")
            for g, index in wanted:
                created.append(self._new_alloc(g, index, self._host_for(node, created), alloc_id))
            # Only a placement that fully succeeded counts.
            self._placed.update(a.name for a in created)
            self.allocations.extend(created)
        return created

    def _host_for(self, node: str | None, placing: Iterable[Allocation] = ()) -> SimHost | None:
        """``node``'s host, else the one with the fewest live allocations, counting those this
        placement made so far: with ``distinct_hosts`` the scheduler counts the plan's proposed
        allocations too (scheduler/feasible/feasible.go DistinctHostsIterator, ``ProposedAllocs``,
        v2.0.5), so one placement never puts two on one node while another is free."""
        if not self.hosts:
            return None
        if node is not None:
            if node not in self.hosts:
                raise SimError(f"no client node {node!r} (nodes: {sorted(self.hosts)})")
            return self.hosts[node]
        live = [a.host.name for a in [*self.allocations, *placing] if a.host is not None and not a.terminal]
        return min(self.hosts.values(), key=lambda h: live.count(h.name))

    # -- lost nodes (the servers' reconciler, by version) -----------------------------------------

    def node_died(self, alloc_name: str, status: str = "lost") -> Allocation:
        """The allocation's node is gone: its processes die with it, its ports go; ClientStatus
        becomes ``status`` ("lost" or "unknown"), which the servers decide (a fake Nomad API
        driving this cluster, or :meth:`lose`). A lost allocation gives up its name, so a
        replacement can take it; calling again turns an unknown one lost.

        Its service registrations stay while it is ``unknown``: the client that would deregister
        them (client/allocrunner/group_service_hook.go PreKill/Postrun, v2.0.5) is gone, and the
        servers delete a registration only for an allocation that is client-terminal (complete,
        failed, lost: nomad/state/state_store_service_registration.go
        ``deregisterServicesForTerminalAllocs``, called from state_store.go
        ``nestedUpdateAllocFromClient`` and ``upsertAllocsImpl``; nomad/structs/alloc.go
        ``terminalAllocationStatuses``) or garbage-collected (state_store.go ``DeleteEval``). So
        an unknown allocation's registration is still served, in ID order, until it is lost."""
        if status not in ("lost", "unknown"):
            raise SimError(f"status {status!r}: lost or unknown")
        with self._lock:
            self._check_open()
            alloc = next((a for a in reversed(self.allocations) if a.name == alloc_name), None)
            if alloc is None:
                raise KeyError(f"no allocation {alloc_name!r}")
            if alloc.status_override not in (None, "unknown") or (alloc.status_override is None and alloc.terminal
                                                                   and alloc.started):
                raise SimError(f"{alloc_name} is already {alloc.client_status}")
            for tr in alloc.tasks.values():
                if tr.proc is not None:
                    self._kill(tr, grace=0)  # the machine is gone: nothing gets a kill_timeout
                    tr.proc = None
                tr.state = "dead"
            # ... and so is every process the allocation started, also those that left the task's
            # process group (torchrun's workers run in sessions of their own): on this one host,
            # those whose environment carries the allocation's NOMAD_ALLOC_ID.
            _kill_env_marked(f"NOMAD_ALLOC_ID={alloc.id}")
            if status == "lost":  # client-terminal: the servers delete its registrations
                self._deregister_alloc(alloc)
            for net in alloc.group.get("Networks") or []:
                for p in net.get("ReservedPorts") or []:
                    self._used_ports.discard(int(p["Value"]))
            if status == "unknown":
                alloc.status_override = "unknown"
                alloc.client_description = "alloc is unknown since its node is disconnected"
                alloc.unknown_at = self._clock()
            else:
                alloc.status_override = "lost"
                alloc.client_description = "alloc is lost since its node is down"
                self._placed.discard(alloc.name)
            return alloc

    def _replace(self, alloc: Allocation) -> Allocation:
        """A replacement under the same Name (reconcile_cluster.go:856-875, v2.0.5: "Add
        replacements for lost allocs", ``name: alloc.Name``), placed, not started."""
        replacement = self._new_alloc(alloc.group, alloc.index)
        self._placed.add(replacement.name)
        self.allocations.append(replacement)
        return replacement

    def _new_reconciler(self) -> bool:
        return self.nomad_version >= (1, 11, 2)  # PR #27053, commit bdf5b27410

    def lose(self, alloc_name: str) -> Allocation | None:
        """The allocation's node goes down and the servers reconcile it. Returns the replacement
        (placed, not started), or None while the allocation is kept ``unknown``.

        ``nomad_version`` 2.0.5 (also 1.11.2+; scheduler/reconciler/filters.go):
        * not yet running: lost and replaced at once (:214-221 disconnected node, :286-291 down);
        * running, the group has a lost_after: the node is "disconnected" (nomad/heartbeat.go
          :158-173, :207-224), the allocation "disconnecting" (:232-237): unknown, never
          rescheduled with replace = false (:538-541); replaced once lost_after has passed
          (:meth:`advance`: Expired, :188-193, then lost, reconcile_cluster.go:438-440);
        * running, replace = false, no lost_after: the node is "down"; unknown (:277-284) with a
          follow-up evaluation now (reconcile_cluster.go:1548-1580, 1639) that finds it Expired
          (nomad/structs/alloc.go:817-838, lost_after 0) before the replace = false rules
          (:188-193): lost and replaced at once;
        * otherwise lost and replaced.
        Before 1.11.2 (v1.11.1 filters.go:148-175, reconcile_cluster.go:441-447): running with
        replace = false -> unknown and kept, expired or not; else lost and replaced."""
        with self._lock:
            self._check_open()
            alloc = next((a for a in reversed(self.allocations) if a.name == alloc_name), None)
            if alloc is None:
                raise KeyError(f"no allocation {alloc_name!r}")
            if alloc.status_override or (alloc.terminal and alloc.started):
                raise SimError(f"{alloc_name} is already {alloc.client_status}")
            running = alloc.client_status == "running"
            d = alloc.group.get("Disconnect") or {}
            lost_after, replace = int(d.get("LostAfter") or 0), d.get("Replace") is not False
            if not running:
                keep = False
            elif self._new_reconciler():
                keep = lost_after > 0
            else:
                keep = not replace
            self.node_died(alloc_name, "unknown" if keep or (running and not replace) else "lost")
            if keep:
                return None
            if alloc.status_override == "unknown":  # the follow-up evaluation, at once: expired
                self.node_died(alloc_name, "lost")
            return self._replace(alloc)

    def advance(self, seconds: float) -> list[Allocation]:
        """Let ``seconds`` pass for the servers' follow-up evaluations (not for the tasks): an
        unknown allocation whose lost_after has run out is Expired (nomad/structs/alloc.go
        :817-838, v2.0.5), lost and replaced (filters.go:188-193, reconcile_cluster.go:438-440);
        before 1.11.2 one with replace = false stays (v1.11.1 reconcile_cluster.go:441-447).
        Returns the replacements (placed, not started)."""
        with self._lock:
            self._clock_offset += seconds
            now = self._clock()
            out = []
            for alloc in list(self.allocations):
                if alloc.status_override != "unknown":
                    continue
                d = alloc.group.get("Disconnect") or {}
                lost_after, replace = int(d.get("LostAfter") or 0) / 1e9, d.get("Replace") is not False
                if alloc.unknown_at + lost_after > now:
                    continue
                if self._new_reconciler() or replace:
                    self.node_died(alloc.name, "lost")
                    out.append(self._replace(alloc))
            return out

    def _clock(self) -> float:
        return time.monotonic() + self._clock_offset

    def kill_alloc(self, alloc_name: str, grace: float | None = None) -> None:
        """The servers told this allocation to stop (job stopped): kill_signal, kill_timeout,
        SIGKILL, as :meth:`stop` does for every allocation; services deregistered."""
        with self._lock:
            alloc = next((a for a in reversed(self.allocations) if a.name == alloc_name), None)
            if alloc is None:
                return
            for tr in alloc.tasks.values():
                if tr.proc is not None:
                    self._kill(tr, grace=grace)
                    if tr.exit_code is None:
                        tr.exit_code = tr.proc.returncode
                    tr.proc = None
                tr.state = "dead"
            self._deregister_alloc(alloc)

    def _new_alloc(self, g: dict[str, Any], index: int, host: SimHost | None = None,
                   alloc_id: str | None = None) -> Allocation:
        alloc_id = alloc_id or str(uuid.uuid4())
        adir = os.path.join(self.workdir, alloc_id)
        ports: dict[str, dict[str, Any]] = {}
        # Ports are the node's: used ports are counted per address (nomad/structs/network.go
        # AssignPorts, getUsedPortsFor(addr.Address)), so two nodes may hold the same static port.
        used = self._used_ports if host is None else host.used_ports
        ip = self.host_ip if host is None else host.ip
        for net in g.get("Networks") or []:
            for p in net.get("ReservedPorts") or []:
                value = int(p["Value"])
                # A client-terminal allocation's ports are free again: the scheduler counts only
                # the node's allocations that are not (scheduler/feasible/context.go
                # ProposedAllocs, ``ClientTerminalStatus``, v2.0.5); an unknown one still holds its.
                holders = [a for a in self.allocations if a.host is host and any(q["Value"] == value for q in a.ports.values())]
                freed = bool(holders) and all(a.client_status in ("complete", "failed", "lost") for a in holders)
                if value in used and not freed:
                    raise UnsupportedJobError(
                        f"static port {value} ({p['Label']}) is reserved twice on the single simulated "
                        "host; Nomad would need another node for this allocation"
                    )
                used.add(value)
                ports[p["Label"]] = self._port(p, value, ip)
            for p in net.get("DynamicPorts") or []:
                ports[p["Label"]] = self._port(p, self._free_port() if host is None else self._host_port(host), ip)
        alloc = Allocation(
            id=alloc_id,
            name=f"{self.job_id}.{g['Name']}[{index}]",
            index=index,
            group=g,
            dir=adir,
            ports=ports,
            host=host,
        )
        # The allocation directory as the client lays it out, modes and owners included
        # (client/allocdir, v2.0.5): the alloc dir 0755, the agent's (alloc_dir.go:357); alloc/
        # 0755 and its logs/, tmp/, data/ 0777 (alloc_dir.go:362-371); the task dir and local/
        # 0777 (task_dir.go:131-137); tmp/ sticky 0777 (alloc_dir.go:80, task_dir.go:140-145);
        # secrets/ and private/ 0777 (task_dir.go:325-329; a noexec tmpfs when the agent is
        # root, fs_linux.go:65-100, not mounted here). Each goes through dropDirPermissions
        # (fs_unix.go:36-63): mode | 0777, owner nobody when the agent is root. A task of any
        # user reaches its files; the files' own modes and owners decide who reads them.
        os.makedirs(adir, exist_ok=True)
        os.chmod(adir, 0o755)
        _alloc_mkdir(os.path.join(adir, "alloc"), 0o755)
        for sub in ("logs", "tmp", "data"):
            _alloc_mkdir(os.path.join(adir, "alloc", sub), 0o777)
        for t in g.get("Tasks") or []:
            tdir = os.path.join(adir, t["Name"])
            _alloc_mkdir(tdir, 0o777)
            _alloc_mkdir(os.path.join(tdir, "local"), 0o777)
            _alloc_mkdir(os.path.join(tdir, "tmp"), stat.S_ISVTX | 0o777)
            for sub in ("secrets", "private"):
                _alloc_mkdir(os.path.join(tdir, sub), 0o777)
            alloc.tasks[t["Name"]] = TaskRun(name=t["Name"], alloc=alloc, spec=t)
        return alloc

    def _port(self, p: dict[str, Any], value: int, ip: str) -> dict[str, Any]:
        to = int(p.get("To") or 0)
        if to == -1:  # "same as the host port"
            to = value
        return {"Label": p["Label"], "Value": value, "To": to, "HostIP": ip}

    @staticmethod
    def _host_port(host: SimHost) -> int:
        # A node of its own: the dynamic range (default 20000-32000) less the ports this node
        # handed out (getDynamicPortsStochastic in nomad/structs/network.go). Its network
        # namespace is the test's own, so nothing else holds a port there.
        for _ in range(200):
            port = random.randint(20000, 32000)
            if port not in host.used_ports:
                host.used_ports.add(port)
                return port
        raise SimError(f"{host.name}: no free dynamic port in 20000-32000")

    def _free_port(self) -> int:
        # Nomad picks from its dynamic range (default 20000-32000); check it is bindable here.
        try:  # under pytest: reserved against every other test process (tests/helpers.py)
            from helpers import reserve_port
        except ImportError:
            reserve_port = None
        if reserve_port is not None:
            port = reserve_port(20000, 32000, self.host_ip)
            self._used_ports.add(port)
            return port
        for _ in range(200):
            port = random.randint(20000, 32000)
            if port in self._used_ports:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind((self.host_ip, port))
                except OSError:
                    continue
            self._used_ports.add(port)
            return port
        raise SimError("no free dynamic port in 20000-32000")

    # -- environment -----------------------------------------------------------------------------

    def _combined_meta(self, g: dict[str, Any], task: dict[str, Any] | None) -> dict[str, str]:
        meta: dict[str, str] = {}
        meta.update(self.job.get("Meta") or {})
        meta.update(g.get("Meta") or {})
        if task is not None:
            meta.update(task.get("Meta") or {})
        return meta

    def _task_prestart(self, tr: TaskRun) -> None:
        """The task runner's api and identity hooks, once per task (v2.0.5): the Task API socket
        ``secrets/api.sock`` for every task (client/allocrunner/taskrunner/api_hook.go Prestart),
        and its signed workload identity (identity_hook.go setDefaultToken): in ``NOMAD_TOKEN``
        with ``identity { env = true }`` (task_runner_getters.go setNomadToken -> taskenv
        SetDefaultWorkloadToken, client/taskenv/env.go:640-641), in ``secrets/nomad_token``
        (owner-only) with ``file = true``. Only when the servers are a fake API (``task_api``)."""
        key = (tr.alloc.id, tr.name)
        if self.task_api is None or key in self._wi_tokens:
            return
        secrets_dir = os.path.join(tr.dir, "secrets")
        self._wi_tokens[key] = token = self.task_api(tr.alloc.id, tr.name, secrets_dir)
        ident = tr.spec.get("Identity") or {}
        if ident.get("File"):
            path = os.path.join(secrets_dir, "nomad_token")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(token)

    def _base_env(self, alloc: Allocation, task: dict[str, Any] | None) -> dict[str, str]:
        """buildEnv up to (not including) host env, task Env and template env."""
        env: dict[str, str] = {}
        if task is not None and (task.get("Identity") or {}).get("Env") and (alloc.id, task["Name"]) in self._wi_tokens:
            # The workload identity comes before the agent's own environment: it wins over a
            # NOMAD_TOKEN there (env.go buildEnv: the host's never overrides).
            env["NOMAD_TOKEN"] = self._wi_tokens[(alloc.id, task["Name"])]
        if task is not None:
            tdir = alloc.task_dir(task["Name"])
            env["NOMAD_ALLOC_DIR"] = alloc.shared_dir
            env["NOMAD_TASK_DIR"] = os.path.join(tdir, "local")
            env["NOMAD_SECRETS_DIR"] = os.path.join(tdir, "secrets")
            res = task.get("Resources") or {}
            # The API canonicalizes missing values to api.DefaultResources: 100 MHz, 300 MB
            # (no CPU default when cores are reserved).
            cpu = int(res["CPU"]) if res.get("CPU") is not None else (0 if res.get("Cores") else 100)
            mem = int(res["MemoryMB"]) if res.get("MemoryMB") is not None else 300
            mem_max = int(res.get("MemoryMaxMB") or 0)
            if mem:
                env["NOMAD_MEMORY_LIMIT"] = str(mem)
            if mem_max:
                env["NOMAD_MEMORY_MAX_LIMIT"] = str(mem_max)
            if cpu:
                env["NOMAD_CPU_LIMIT"] = str(cpu)
        env["NOMAD_ALLOC_ID"] = alloc.id
        env["NOMAD_SHORT_ALLOC_ID"] = alloc.id[:8]
        env["NOMAD_ALLOC_NAME"] = alloc.name
        env["NOMAD_GROUP_NAME"] = alloc.group_name
        env["NOMAD_ALLOC_INDEX"] = str(alloc.index)
        if task is not None:
            env["NOMAD_TASK_NAME"] = task["Name"]
        env["NOMAD_JOB_ID"] = self.job_id
        env["NOMAD_JOB_NAME"] = self.job_name
        if self.job.get("ParentID"):
            env["NOMAD_JOB_PARENT_ID"] = self.job["ParentID"]
        env["NOMAD_DC"] = self.node_attrs["node.datacenter"]
        env["NOMAD_NAMESPACE"] = self.namespace
        env["NOMAD_REGION"] = self.region
        # Group ports: addGroupPort (Shared.Networks) then addPorts (Shared.Ports), same values.
        for label, p in alloc.ports.items():
            value, to, ip = str(p["Value"]), p["To"], p["HostIP"]
            port = str(to) if to > 0 else value
            addr = f"[{ip}]:{value}" if ":" in ip else f"{ip}:{value}"
            env["NOMAD_ADDR_" + label] = addr
            env["NOMAD_HOST_ADDR_" + label] = addr
            env["NOMAD_IP_" + label] = ip
            env["NOMAD_HOST_IP_" + label] = ip
            env["NOMAD_PORT_" + label] = port
            env["NOMAD_ALLOC_PORT_" + label] = port
            env["NOMAD_HOST_PORT_" + label] = value
        nodes = self.attrs(alloc)
        for k, v in self._combined_meta(alloc.group, task).items():
            for key in ("NOMAD_META_" + k.upper(), "NOMAD_META_" + k):
                env[replace_env(key, nodes, env)] = replace_env(str(v), nodes, env)
        return env

    def _task_env(self, alloc: Allocation, task: dict[str, Any], template_env: dict[str, str]) -> dict[str, str]:
        nodes = self.attrs(alloc)
        env = self._base_env(alloc, task)
        if task.get("Driver") == "docker":
            # An image driver gets none of the agent's environment (client/taskenv/env.go
            # buildEnv: host env only for non-image drivers); the container starts from the
            # image's ENV, which the task Env overrides (Docker merges Config.Env over it).
            image = self.docker_images.get((task.get("Config") or {}).get("image"), StandInImage())
            for k, v in image.env.items():
                env.setdefault(k, v)
        else:
            for k, v in self.host_env.items():
                if k in DEFAULT_ENV_DENYLIST or k in env:
                    continue
                env[k] = replace_env(v, nodes, env)
        # Nomad interpolates each task Env value against the map as it is being filled, in Go's
        # random map order, so one task var referring to another works only sometimes. The
        # simulator interpolates against the map *before* any task var, the deterministic
        # subset, so a job relying on that race fails here instead of flaking in production.
        snapshot = dict(env)
        for k, v in (task.get("Env") or {}).items():
            env[k] = replace_env(str(v), nodes, snapshot)
        env.update(template_env)
        cleaned: dict[str, str] = {}
        for k, v in env.items():
            if k.startswith(_CLEANED_PREFIXES):
                k = clean_env_var(k)
            cleaned[k] = v
        return cleaned

    # -- templates -------------------------------------------------------------------------------

    def _template_funcs(self, tr: TaskRun) -> dict[str, Callable[..., Any]]:
        env_view = tr.template_env_view
        namespace = self.namespace

        def env_fn(name: Any) -> str:
            return env_view.get(str(name), "")

        def nomad_service(*params: Any) -> list[_NomadService]:
            if len(params) == 3:
                raise UnsupportedJobError("nomadService <count> <key> <service> (rendezvous choose) is not simulated")
            if len(params) != 1:
                raise TemplateError("expected arguments <service> or <count> <key> <service>")
            if not isinstance(params[0], str):
                raise TemplateError("expected string for <service> argument")
            m = _NOMAD_SERVICE_QUERY.match(params[0])
            if not m:
                raise TemplateError(f"nomad.service: invalid format: {params[0]!r}")
            if m.group("region") and m.group("region") != self.region:
                raise UnsupportedJobError("nomadService across regions is not simulated")
            regs = self.registry.get(m.group("name"), namespace)
            if m.group("tag"):
                regs = [r for r in regs if m.group("tag") in (r.get("Tags") or [])]
            return [_NomadService(r) for r in regs]

        def nomad_services(*params: Any) -> list[_NomadServicesSnippet]:
            if params:
                raise UnsupportedJobError("nomadServices with a query argument is not simulated")
            return [_NomadServicesSnippet(r["ServiceName"], r["Tags"]) for r in self.registry.names(namespace)]

        def var_path(p: Any) -> str:
            if not isinstance(p, str):
                raise TemplateError("expected string for variable path")
            if "@" in p:
                raise UnsupportedJobError("nomadVar paths with @namespace/region are not simulated")
            return p

        def lookup(path: str) -> dict[str, str] | None:
            if self.variable_source is not None:
                return self.variable_source(path)
            return self._variables.get(path)

        def nomad_var_exists(path: Any) -> bool:
            return lookup(var_path(path)) is not None if path else False

        def nomad_var(path: Any) -> _NomadVarItems | None:
            if not path:
                return None
            items = lookup(var_path(path))
            if items is None:
                raise _Blocked(f"nomadVar {path!r} does not exist")
            return _NomadVarItems({k: _NomadVarItem(k, v) for k, v in items.items()})

        return {
            **BUILTIN_FUNCS,
            "env": env_fn,
            "nomadService": nomad_service,
            "nomadServices": nomad_services,
            "nomadVar": nomad_var,
            "nomadVarExists": nomad_var_exists,
        }

    def _client_path(self, raw: str, tr: TaskRun, env: dict[str, str]) -> str:
        """TaskEnv.ClientPath(raw, joinEscape=true) plus the sandbox check."""
        tdir, shared = tr.dir, tr.alloc.shared_dir
        path = replace_env(raw, env, self.attrs(tr.alloc))

        def escapes(p: str) -> bool:
            return all(os.path.relpath(p, base).startswith("..") for base in (tdir, shared))

        if not os.path.isabs(path) or escapes(path):
            path = os.path.join(tdir, path.lstrip("/") if os.path.isabs(path) else path)
        path = os.path.normpath(path)
        if escapes(path):
            raise TemplateError(f"template destination path escapes alloc directory: {raw!r}")
        return path

    def _prepare_templates(self, tr: TaskRun, base_env: dict[str, str]) -> None:
        tr.template_env_view = {**base_env, **self.attrs(tr.alloc)}
        tr.templates = []
        for i, t in enumerate(tr.spec.get("Templates") or []):
            perms = int(t.get("Perms") or "0644", 8)
            mode = t.get("ChangeMode") or "restart"
            tr.templates.append(
                _TemplateRun(
                    index=i,
                    spec=t,
                    compiled=GoTemplate(
                        t.get("EmbeddedTmpl") or "",
                        t.get("LeftDelim") or "",
                        t.get("RightDelim") or "",
                        name=f"{tr.alloc.name}/{tr.name}/template[{i}]",
                    ),
                    change_mode=mode,
                    change_signal=_parse_signal(t["ChangeSignal"]) if mode == "signal" else None,
                    perms=perms,
                    envvars=bool(t.get("Envvars")),
                    once=bool(t.get("Once")),
                    missing_key_error=bool(t.get("ErrMissingKey")),
                    dest=self._client_path(t.get("DestPath") or "", tr, base_env),
                    # template.go:820-826 v2.0.5: ct.Uid/ct.Gid only when set and >= 0 (the api
                    # struct's *int; nil and -1 both mean "leave the agent as owner").
                    uid=t["Uid"] if t.get("Uid") is not None and t["Uid"] >= 0 else -1,
                    gid=t["Gid"] if t.get("Gid") is not None and t["Gid"] >= 0 else -1,
                )
            )

    def _render(self, tr: TaskRun, tmpl: _TemplateRun) -> str:
        return tmpl.compiled.render(self._template_funcs(tr), tmpl.missing_key_error)

    @staticmethod
    def _write_atomic(path: str, content: str, perms: int, uid: int = -1, gid: int = -1) -> None:
        """consul-template v0.42.1 renderer.Render: ``AtomicWrite`` (renderer.go:103; temp file,
        chmod to Perms :195, rename :211), then ``setFileOwnership`` (renderer.go:107,
        file_ownership.go:27-31: a no-op when both are -1, else os.Chown(path, uid, gid))."""
        parent = os.path.dirname(path)
        os.makedirs(parent, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(content.encode())
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, perms)
            os.rename(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        if uid != -1 or gid != -1:
            os.chown(path, uid, gid)  # after the chmod, on the renamed file

    def _first_render(self, tr: TaskRun) -> bool:
        """Render every template before the task starts; False while a dependency is missing."""
        rendered = []
        try:
            for tmpl in tr.templates:
                rendered.append(self._render(tr, tmpl))
        except _Blocked:
            return False
        for tmpl, content in zip(tr.templates, rendered):
            self._write_atomic(tmpl.dest, content, tmpl.perms, tmpl.uid, tmpl.gid)
            tmpl.content = content
        return True

    def _template_env(self, tr: TaskRun) -> dict[str, str]:
        env: dict[str, str] = {}
        for tmpl in tr.templates:
            if tmpl.envvars:
                with open(tmpl.dest, "rb") as f:
                    env.update(parse_env_file(f.read()))
        return env

    # -- task lifecycle --------------------------------------------------------------------------

    def _task_user(self, task: dict[str, Any], where: str) -> TaskUser | None:
        """Who the driver runs the task as; None: the agent's own user (root on a real client).

        * docker: the container's ``User`` is ``task.User`` (drivers/docker/driver.go:1055
          v2.0.5); when empty Docker takes the image's USER (:class:`StandInImage` ``user``);
          both empty: root, the agent's user here.
        * exec: ``user`` defaults to "nobody" (drivers/exec/driver.go:472-474 v2.0.5), looked up
          by name on the host (helper/users/lookup.go:23). The libcontainer executor sets only
          ``process.UID`` and USER/LOGNAME/HOME (drivers/shared/executor/
          executor_linux_cgo.go:242-256): the GID is runc's zero value, 0, with no supplementary
          groups.
        * raw_exec: the agent's user unless ``user`` is set (drivers/rawexec/driver.go:436);
          then the universal executor's setCmdUser (drivers/shared/executor/executor.go:366-368,
          executor_unix.go:61-106): uid, primary gid, the user's groups, USER/LOGNAME/HOME. Its
          ``make([]uint32, len(gidStrings))`` followed by ``append`` leaves one 0 per group in
          front: the root group is among the supplementary groups, as on Nomad.
        """
        driver, user = task.get("Driver"), task.get("User") or ""
        if driver == "docker":
            image = self.docker_images.get((task.get("Config") or {}).get("image"), StandInImage())
            user = user or image.user
            return docker_user(user, where) if user else None
        if driver == "exec":
            pw = _host_user(user or "nobody", where)
            env = {"USER": pw.pw_name, "LOGNAME": pw.pw_name, "HOME": pw.pw_dir}
            return TaskUser(pw.pw_uid, 0, [], env, f"exec user {pw.pw_name!r}")
        if driver == "raw_exec" and user:
            pw = _host_user(user, where)
            gids = os.getgrouplist(pw.pw_name, pw.pw_gid)
            env = {"USER": pw.pw_name, "LOGNAME": pw.pw_name, "HOME": pw.pw_dir}
            return TaskUser(pw.pw_uid, pw.pw_gid, [0] * len(gids) + list(gids), env, f"raw_exec user {pw.pw_name!r}")
        return None

    def _plan(self, tr: TaskRun) -> tuple[list[str], dict[str, str]]:
        """Everything the client does between the last template render and exec."""
        env = self._task_env(tr.alloc, tr.spec, self._template_env(tr))
        variables = hcl_variables(env, self.attrs(tr.alloc))
        where = f"{tr.alloc.name}/{tr.name}"
        tr.user = self._task_user(tr.spec, where)
        if tr.user is not None:
            _check_can_become(tr.user, where)
            _check_reachable(tr.dir, tr.user, where)
            env.update(tr.user.env)  # appended after the task env: they win (exec.Cmd dedup)
        config = tr.spec.get("Config") or {}
        if tr.spec.get("Driver") == "docker":
            evaluated = {k: _eval_config_value(config[k], variables, f"{where} {k}")
                         for k in ("entrypoint", "command", "args") if k in config}
            argv = docker_argv(evaluated, self.docker_images[config["image"]])
            if not argv:
                raise TaskStartError(f"{where}: the container has no command (no entrypoint, command or CMD)")
            return [self._lookup_bin(tr, argv[0], env)] + argv[1:], env
        command = _eval_config_value(config["command"], variables, f"{where} command")
        args = _eval_config_value(config.get("args") or [], variables, f"{where} args")
        if not isinstance(command, str) or not isinstance(args, list):
            raise TaskConfigError(f"{where}: failed to parse config: Incorrect attribute value type")
        return [self._lookup_bin(tr, command, env)] + args, env

    def _lookup_bin(self, tr: TaskRun, cmd: str, env: dict[str, str]) -> str:
        for cand in (os.path.join(tr.dir, "local", cmd), os.path.join(tr.dir, cmd)):
            if os.path.exists(cand):
                return cand
        if os.path.isabs(cmd) and os.path.exists(cmd):
            return cmd
        # exec.LookPath runs in the executor, whose PATH is the agent's own.
        found = shutil.which(cmd, path=self.host_env.get("PATH", os.defpath))
        if found:
            return os.path.abspath(found)
        raise TaskStartError(f"{tr.alloc.name}/{tr.name}: binary {cmd!r} could not be found")

    def _spawn(self, tr: TaskRun, argv: list[str], env: dict[str, str]) -> None:
        with open(tr.log_path("stdout"), "ab") as out, open(tr.log_path("stderr"), "ab") as err:
            try:
                who: dict[str, Any] = {}
                if tr.user is not None:  # setgroups, setgid, setuid in the child (_task_user)
                    who = {"user": tr.user.uid, "group": tr.user.gid, "extra_groups": tr.user.groups}
                run = argv
                if tr.alloc.host is not None:  # on its node: the host's network, hostname, hosts file
                    if who:
                        raise TaskStartError(f"{tr.alloc.name}/{tr.name}: a task user on a SimHost is not simulated")
                    # The task dir as its cwd there too: entering a mount namespace (setns(2),
                    # nsenter --mount) sets the cwd to that namespace's root, so Popen's cwd alone
                    # is lost (the rig's tasks ran in "/").
                    chdir = (shutil.which("env") or "/usr/bin/env", "-C", tr.dir) if tr.alloc.host.enter else ()
                    run = [*tr.alloc.host.enter, *chdir, *argv]
                proc = subprocess.Popen(
                    run,
                    cwd=tr.dir,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    start_new_session=True,  # own session and process group, like the executor
                    **who,
                )
            except OSError as e:
                raise TaskStartError(f"{tr.alloc.name}/{tr.name}: failed to launch {argv[0]!r}: {e}") from e
        self._pgids.add(proc.pid)
        tr.proc, tr.pid, tr.argv, tr.env = proc, proc.pid, argv, env
        tr.state, tr.exit_code = "running", None
        tr.event(f"Started pid {proc.pid}" + (f" as uid {tr.user.uid} gid {tr.user.gid} ({tr.user.why})"
                                             if tr.user is not None else ""))
        self._register_task_services(tr)

    def _kill(self, tr: TaskRun, grace: float | None) -> None:
        """Stop a running task as the executor's Shutdown does (drivers/shared/executor/executor.go
        and executor_unix.go ``shutdownProcess``, hashicorp/nomad aa026cc): kill_signal to the
        task's process alone (``proc.Signal``: not its group, so the entry script passes it on),
        kill_timeout, then SIGKILL to the process and its process group (``killProcessTree``)."""
        proc = tr.proc
        if proc is None:
            return
        sig = _parse_signal(tr.spec.get("KillSignal") or "SIGINT")
        timeout = _ns_to_s(tr.spec.get("KillTimeout"), 5.0) if grace is None else grace
        if timeout > 0:
            try:
                proc.send_signal(sig)
            except ProcessLookupError:
                pass
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        self._destroy_remnants(tr)

    def _destroy_remnants(self, tr: TaskRun) -> None:
        """What the task left once it is stopped for good: the task runner's wrangler hook
        (client/allocrunner/taskrunner/wrangler_hook.go Stop -> client/lib/proclib/wrangler.go
        Wranglers.Destroy -> wrangler_cg2_linux.go Kill: cgroup.kill, hashicorp/nomad aa026cc)
        kills every process of the task's cgroup, also those that left its process group
        (torchrun's workers run in sessions of their own). On this one host, the task's processes
        are those whose environment carries its NOMAD_ALLOC_ID and NOMAD_TASK_NAME."""
        _kill_env_marked(f"NOMAD_ALLOC_ID={tr.alloc.id}", f"NOMAD_TASK_NAME={tr.name}")

    # -- services --------------------------------------------------------------------------------

    def _registration(self, alloc: Allocation, svc: dict[str, Any], env: dict[str, str], owner: str) -> dict[str, Any]:
        nodes = self.attrs(alloc)
        name = replace_env(svc.get("Name") or "", env, nodes)
        label = replace_env(svc.get("PortLabel") or "", env, nodes)
        if label in alloc.ports:
            port = alloc.ports[label]["Value"]
        elif label.isdigit():
            port = int(label)
        elif label:
            raise SimError(f"{alloc.name}: service {name!r} port label {label!r} is not a port of the group network")
        else:
            port = 0
        # client/serviceregistration/address.go GetAddress (v2.0.5), address mode auto/host: the
        # port label's AllocatedPortMapping HostIP (the node's fingerprinted address, see
        # fingerprint_address); without a port label the node's own address.
        host_ip = alloc.ports[label]["HostIP"] if label in alloc.ports else nodes["attr.unique.network.ip-address"]
        address = replace_env(svc.get("Address") or "", env, nodes) or host_ip
        return {
            "ID": f"_nomad-task-{alloc.id}-{owner}-{name}-{label}",
            "ServiceName": name,
            "Namespace": self.namespace,
            "NodeID": nodes["node.unique.id"],
            "Datacenter": self.node_attrs["node.datacenter"],
            "JobID": self.job_id,
            "AllocID": alloc.id,
            "Tags": [replace_env(t, env, nodes) for t in svc.get("Tags") or []],
            "Address": address,
            "Port": port,
        }

    @staticmethod
    def _is_nomad_provider(svc: dict[str, Any]) -> bool:
        # Provider defaults to "consul"; Consul services are invisible to nomadService.
        return (svc.get("Provider") or "consul") == "nomad"

    def _register_group_services(self, alloc: Allocation) -> None:
        env = self._base_env(alloc, None)
        for svc in alloc.group.get("Services") or []:
            if self._is_nomad_provider(svc):
                reg = self._registration(alloc, svc, env, f"group-{alloc.group_name}")
                self.registry.register(reg)
                alloc.service_ids.append(reg["ID"])

    def _register_task_services(self, tr: TaskRun) -> None:
        for svc in tr.spec.get("Services") or []:
            if self._is_nomad_provider(svc):
                reg = self._registration(tr.alloc, svc, tr.env, tr.name)
                self.registry.register(reg)
                tr.service_ids.append(reg["ID"])

    def _deregister_task(self, tr: TaskRun) -> None:
        self.registry.deregister(tr.service_ids)
        tr.service_ids = []

    def _deregister_alloc(self, alloc: Allocation) -> None:
        self.registry.deregister(alloc.service_ids)
        alloc.service_ids = []
        for tr in alloc.tasks.values():
            self._deregister_task(tr)

    # -- start -----------------------------------------------------------------------------------

    def start(self) -> list[Allocation]:
        """Start every placed allocation that has not started yet.

        Order per allocation, as the client does it: group services registered (alloc
        prerun), templates rendered (all before the task), env built, driver config evaluated,
        process launched. Errors the client would report for a task (failed validation,
        template errors, missing binary) are raised here before any process of this call is
        launched. A task whose template waits on a missing ``nomadVar`` stays pending and is
        started by the background loop once the variable exists.
        """
        with self._lock:
            self._check_open()
            # Lost before it started, or timed out by max_run_duration: never starts.
            new = [a for a in self.allocations if not a.started and not a.status_override]
            plans: list[tuple[TaskRun, list[str], dict[str, str]]] = []
            try:
                for alloc in new:
                    self._register_group_services(alloc)
                for alloc in new:
                    for tr in alloc.tasks.values():
                        self._task_prestart(tr)
                        self._prepare_templates(tr, self._task_env(alloc, tr.spec, {}))
                        if self._first_render(tr):
                            argv, env = self._plan(tr)
                            plans.append((tr, argv, env))
                        else:
                            tr.state = "pending"
                            tr.event("Template: missing dependency, waiting")
            except BaseException:
                for alloc in new:
                    self._deregister_alloc(alloc)
                    for tr in alloc.tasks.values():
                        tr.state = "new"
                raise
            launched: list[TaskRun] = []
            try:
                for tr, argv, env in plans:
                    self._spawn(tr, argv, env)
                    launched.append(tr)
            except BaseException:
                for tr in launched:
                    self._kill(tr, grace=0)
                    tr.state, tr.proc = "dead", None
                for alloc in new:
                    self._deregister_alloc(alloc)
                raise
            for alloc in new:
                alloc.started, alloc.started_at = True, time.monotonic()
                for tr in alloc.tasks.values():
                    tr.restart_window_start = time.monotonic()
            if self._monitor is None:
                self._monitor = threading.Thread(target=self._monitor_loop, name="nomad-client-sim", daemon=True)
                self._monitor.start()
        return new

    # -- background loop: exits, restarts, pending templates, re-renders -------------------------

    def _restart_policy(self, alloc: Allocation) -> dict[str, Any]:
        pol = alloc.group.get("RestartPolicy") or {}
        batch = self.job_type in ("batch", "sysbatch")
        return {
            "Attempts": int(pol["Attempts"]) if pol.get("Attempts") is not None else (3 if batch else 2),
            "Interval": _ns_to_s(pol.get("Interval"), 24 * 3600.0 if batch else 1800.0),
            "Delay": _ns_to_s(pol.get("Delay"), 15.0),
            "Mode": pol.get("Mode") or "fail",
        }

    def _on_exit(self, tr: TaskRun, code: int) -> None:
        tr.proc = None
        tr.exit_code = code
        tr.event(f"Terminated with exit code {code}")
        self._deregister_task(tr)
        if self._stopping:
            tr.state = "dead"
            self._destroy_remnants(tr)
            return
        batch = self.job_type in ("batch", "sysbatch")
        if batch and code == 0:
            tr.state = "dead"
            tr.event("Task completed")
            self._destroy_remnants(tr)
            return
        pol = self._restart_policy(tr.alloc)
        now = time.monotonic()
        if now - tr.restart_window_start > pol["Interval"]:
            tr.restart_window_start, tr.restart_count_in_window = now, 0
        if tr.restart_count_in_window < pol["Attempts"]:
            tr.restart_count_in_window += 1
            delay = pol["Delay"] + random.random() * 0.25 * pol["Delay"]
        elif pol["Mode"] == "delay":
            delay = max(0.0, tr.restart_window_start + pol["Interval"] - now)
        else:
            tr.state, tr.failed = "dead", code != 0
            tr.event("Not restarting: " + ("exceeded allowed attempts" if pol["Attempts"] else "policy allows none"))
            self._destroy_remnants(tr)
            return
        tr.state = "restarting"
        tr.restart_at = now + delay
        tr.event(f"Restarting in {delay:.1f}s")

    def _fail_task(self, tr: TaskRun, message: str) -> None:
        if tr.proc is not None:
            self._kill(tr, grace=None)
            tr.exit_code = tr.proc.returncode
            tr.proc = None
        self._deregister_task(tr)
        tr.state, tr.failed, tr.error = "dead", True, message
        tr.event(message)

    def _launch(self, tr: TaskRun) -> None:
        argv, env = self._plan(tr)
        self._spawn(tr, argv, env)

    def _relaunch(self, tr: TaskRun) -> None:
        try:
            self._launch(tr)
            tr.restarts += 1
        except (SimError, OSError) as e:
            self._fail_task(tr, f"Failed to start: {e}")

    def _rerender(self, tr: TaskRun) -> None:
        restart = False
        signals: set[signal.Signals] = set()
        for tmpl in tr.templates:
            if tmpl.once:
                continue
            try:
                content = self._render(tr, tmpl)
            except _Blocked:
                continue  # consul-template keeps the old file while a dependency is missing
            if content == tmpl.content:
                continue
            self._write_atomic(tmpl.dest, content, tmpl.perms, tmpl.uid, tmpl.gid)
            tmpl.content = content
            tr.event(f"Template re-rendered: {tmpl.dest}")
            if tmpl.change_mode == "restart":
                restart = True
            elif tmpl.change_mode == "signal" and tmpl.change_signal is not None:
                signals.add(tmpl.change_signal)
        if restart:
            tr.event("Template with change_mode restart re-rendered")
            self._kill(tr, grace=None)
            if tr.proc is not None:
                tr.proc = None
                self._deregister_task(tr)
            self._relaunch(tr)
        elif signals and tr.proc is not None:
            for sig in signals:
                tr.event(f"Template re-rendered: sending {sig.name}")
                try:
                    tr.proc.send_signal(sig)
                except ProcessLookupError:
                    pass

    def _enforce_max_run_duration(self, alloc: Allocation, now: float) -> None:
        limit = alloc.group.get("MaxRunDuration")
        if not limit or alloc.terminal or alloc.status_override or now - alloc.created_at < _ns_to_s(limit, 0.0):
            return
        alloc.max_run_exceeded = True
        alloc.status_override = "complete"
        alloc.client_description = "allocation exceeded max_run_duration"
        for tr in alloc.tasks.values():
            if tr.state == "dead":
                continue
            tr.event("max_run_duration exceeded: stopping the allocation")
            if tr.proc is not None:
                self._kill(tr, grace=None)
                tr.exit_code = tr.proc.returncode
                tr.proc = None
            self._deregister_task(tr)
            tr.state = "dead"

    def _tick(self) -> None:
        now = time.monotonic()
        for alloc in self.allocations:
            self._enforce_max_run_duration(alloc, now)  # from creation, started or not
            if not alloc.started:
                continue
            for tr in alloc.tasks.values():
                if tr.state == "running" and tr.proc is not None:
                    code = tr.proc.poll()
                    if code is not None:
                        self._on_exit(tr, code)
                        continue
                    try:
                        self._rerender(tr)
                    except (TemplateError, UnsupportedJobError) as e:
                        self._fail_task(tr, f"Template failed: {e}")
                elif tr.state == "restarting" and now >= tr.restart_at:
                    self._relaunch(tr)
                elif tr.state == "pending":
                    try:
                        if self._first_render(tr):
                            self._launch(tr)
                    except (SimError, OSError) as e:
                        self._fail_task(tr, f"Failed to start: {e}")
            if alloc.terminal and alloc.service_ids:
                self._deregister_alloc(alloc)  # alloc postrun: group services go away

    def _monitor_loop(self) -> None:
        while not self._stop_evt.wait(self.poll_interval):
            try:
                with self._lock:
                    if self._stopping:
                        return
                    self._tick()
            except BaseException as e:  # never die silently: surface it through wait()
                self._monitor_error = e
                return

    # -- waiting, logs, stop ---------------------------------------------------------------------

    def wait(
        self,
        timeout: float,
        *,
        raise_on_timeout: bool = True,
        alloc_names: Iterable[str] | None = None,
    ) -> dict[str, int | None]:
        """Wait until every started allocation is terminal; ``{alloc_name: exit_code}``.

        ``alloc_names`` limits the wait (and the result) to those allocations. The code is the
        first non-zero task exit code (negative: killed by that signal), else 0. ``None``
        means no code: the allocation is still running (only with ``raise_on_timeout=False``)
        or a task never ran (see ``TaskRun.error``).
        """
        wanted = None if alloc_names is None else {self.alloc(n).name for n in alloc_names}
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                if self._monitor_error is not None:
                    raise SimError(f"simulator loop failed: {self._monitor_error!r}") from self._monitor_error
                started = [a for a in self.allocations if a.started and (wanted is None or a.name in wanted)]
                # Run one tick here too so an exit is seen without waiting a full poll interval.
                if not self._stopping:
                    self._tick()
                if all(a.terminal for a in started):
                    return {a.name: a.exit_code for a in started}
                if time.monotonic() >= deadline:
                    if raise_on_timeout:
                        running = [a.name for a in started if not a.terminal]
                        raise TimeoutError(f"allocations still running after {timeout}s: {running}")
                    return {a.name: a.exit_code for a in started}
            time.sleep(min(0.05, self.poll_interval))

    def alloc(self, name: str) -> Allocation:
        """The newest allocation of that name (a lost one's replacement shares its Name)."""
        for a in reversed(self.allocations):
            if a.name == name:
                return a
        raise KeyError(f"no allocation {name!r} (placed: {[a.name for a in self.allocations]})")

    def _task(self, alloc_name: str, task: str | None) -> TaskRun:
        a = self.alloc(alloc_name)
        if task is None:
            if len(a.tasks) != 1:
                raise SimError(f"{alloc_name} has tasks {sorted(a.tasks)}; name one")
            return next(iter(a.tasks.values()))
        return a.tasks[task]

    def _read_log(self, alloc_name: str, task: str | None, stream: str) -> str:
        try:
            with open(self._task(alloc_name, task).log_path(stream), encoding="utf-8", errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def stdout(self, alloc_name: str, task: str | None = None) -> str:
        return self._read_log(alloc_name, task, "stdout")

    def stderr(self, alloc_name: str, task: str | None = None) -> str:
        return self._read_log(alloc_name, task, "stderr")

    def services(self, name: str) -> list[dict[str, Any]]:
        return self.registry.get(name, self.namespace)

    def _check_open(self) -> None:
        if self._stopping:
            raise SimError("the cluster is stopped")

    def stop(self, grace: float | None = 2.0) -> None:
        """Deregister every service, then kill every task (kill_signal, ``grace``, SIGKILL).

        ``grace=None`` uses each task's kill_timeout (Nomad's default 5 s). Afterwards no
        process of any task's process group is left; this is verified through /proc.
        """
        with self._lock:
            if self._stopping and not self._pgids:
                return
            self._stopping = True
        self._stop_evt.set()
        if self._monitor is not None and self._monitor is not threading.current_thread():
            self._monitor.join(timeout=30)
        with self._lock:
            for alloc in self.allocations:
                self._deregister_alloc(alloc)
            running = [tr for a in self.allocations for tr in a.tasks.values() if tr.proc is not None]
            for tr in running:
                sig = _parse_signal(tr.spec.get("KillSignal") or "SIGINT")
                try:
                    os.killpg(tr.proc.pid, sig)  # type: ignore[union-attr]
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + max(
                [(_ns_to_s(tr.spec.get("KillTimeout"), 5.0) if grace is None else grace) for tr in running] or [0]
            )
            for tr in running:
                try:
                    tr.proc.wait(timeout=max(0.0, deadline - time.monotonic()))  # type: ignore[union-attr]
                except subprocess.TimeoutExpired:
                    pass
            # Children that left the leader behind (or survived it) still sit in the group.
            for _ in range(50):
                alive = [g for g in self._pgids if process_group_members(g)]
                for g in alive:
                    try:
                        os.killpg(g, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                for tr in running:
                    try:
                        tr.proc.wait(timeout=0.1)  # type: ignore[union-attr]
                    except subprocess.TimeoutExpired:
                        pass
                if not alive:
                    break
                time.sleep(0.05)
            for tr in running:
                assert tr.proc is not None
                tr.exit_code = tr.proc.wait()
                tr.proc = None
                tr.event(f"Killed, exit code {tr.exit_code}")
            for a in self.allocations:
                for tr in a.tasks.values():
                    if tr.state != "dead":
                        tr.state = "dead"
            leftover = {g: process_group_members(g) for g in self._pgids}
            leftover = {g: m for g, m in leftover.items() if m}
            self._pgids.clear()
        if leftover:
            raise SimError(f"processes survived SIGKILL: {leftover}")

    def __enter__(self) -> "SimCluster":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
