"""``halo-sched preflight``: the NCCL guide's bandwidth test, run as the job would run.

The job file is kept whole (nodes, processes, GPUs, image, setup, env, secrets, fabric, layout)
and goes through the same backend (submit, then its placement guard and wait); only the
trainer is replaced by ``halo_sched/node/trainers/preflight_bw.py``. That file travels INSIDE the job:
three setup lines (run after the job's own) write it from base64 into a fresh temporary
directory on each node and enter it, and torchrun starts it from there. Why not a path or
``-m halo_sched...``: an image or a Nomad client need not have halo-sched installed, nor share
the submitter's filesystem; what the job's own setup makes of the node (venv, image) is what the
test must see. It needs only ``base64`` and ``mktemp`` (coreutils) and torch on the nodes.

Rank 0 prints one ``halo-sched-preflight {json}`` line; each node prints
``halo-sched-preflight-node {json}`` with its own checks before the process group forms (a node
that fails those exits at once, and its line is then all there is). Both are read back through
the backend's ``logs``, whatever prefix the backend puts before them. Everything here but
:func:`run` is pure. No torch.
"""
from __future__ import annotations

import base64
import json
import math
import re
from dataclasses import dataclass, field
from typing import Callable, Iterable

from .errors import UsageError
from .node import source_path
from .node.text import valid_data
from .node.trainers import preflight_bw

SCRIPT = source_path("trainers.preflight_bw")
RESULT_MARK = preflight_bw.RESULT_MARK
NODE_MARK = preflight_bw.NODE_MARK
SCRIPT_NAME = "halo_preflight_bw.py"
# The last marker on a line, then a JSON object to the end of the line (backends put their own
# prefix before it: "[node 1] " locally, "1: " from srun --label).
_LINE_RE = re.compile(r"(?:^|[\s:\]])(" + re.escape(RESULT_MARK) + r"(?:-node)?) (\{.*\})\s*$")
DEFAULT_ITERS = 3


def preflight_spec(spec, size: int, iters: int = DEFAULT_ITERS):
    """The job with its trainer replaced by the bandwidth test; all else as written."""
    from .models import Trainer

    from .launch import needs_gdr

    gdr = needs_gdr(spec)
    args = [
        "--size", str(size), "--iters", str(iters),
        "--device", "cuda" if spec.gpus_per_node else "cpu",
        "--interface", spec.network.interface or "",
        "--fabric", spec.network.fabric,
        "--gdr", "1" if gdr else "0",
        "--gpus-per-node", str(spec.gpus_per_node),
        "--nproc-per-node", str(spec.nproc_per_node),
        "--timeout-s", str(spec.rendezvous.timeout_s),
    ]
    payload = base64.b64encode(SCRIPT.read_bytes()).decode("ascii")
    setup = list(spec.setup) + [
        # One command per line: the entry script runs with `set -e`, which an `a && b` list escapes.
        "halo_preflight_dir=$(mktemp -d -t halo-preflight.XXXXXX)",
        f"printf '%s' '{payload}' | base64 -d > \"$halo_preflight_dir/{SCRIPT_NAME}\"",
        'cd "$halo_preflight_dir"',
    ]
    test = spec.model_copy(update={
        "name": f"{spec.name[:53]}-preflight",
        "trainer": Trainer(script=SCRIPT_NAME, args=args),
        "setup": setup,
    })
    # Its script is the node's own, written by setup in the directory setup ends in: not the job
    # file's (given to the nodes as written, not checked here).
    test._script_base = None
    return test


# ---- reading the results back -----------------------------------------------------------------


#: A record sent in parts (preflight_bw.emit, for srun's 1024-byte pieces): at most this many
#: parts, and this many records being put together at once (a hostile log costs no more).
_MAX_PARTS = 256
_MAX_OPEN = 16
_PART_RE = re.compile(r"(?:^|[\s:\]])(" + re.escape(RESULT_MARK) + r"(?:-node)?)"
                      + re.escape(preflight_bw.PART_SUFFIX) + r" (\{.*\})\s*$")


def _whole_lines(lines: Iterable[str]) -> Iterable[tuple[str, str]]:
    """(mark, JSON text) of each marker line, and of each record put back together from its
    parts once its last part is read."""
    open_parts: dict[tuple[str, str], dict[int, bytes]] = {}
    for line in lines:
        line = line.rstrip("\n")
        m = _LINE_RE.search(line)
        if m:
            yield m.group(1), m.group(2)
            continue
        m = _PART_RE.search(line)
        if not m:
            continue
        try:
            part = json.loads(m.group(2))
            ident, k, n = part["id"], part["k"], part["n"]
            if not (isinstance(ident, str) and _int(k) and _int(n) and 0 <= k < n <= _MAX_PARTS):
                continue
            chunk = base64.b64decode(part["b64"], validate=True)
        except (ValueError, TypeError, KeyError, RecursionError):
            continue
        key = (m.group(1), ident[:64])
        if key not in open_parts and len(open_parts) >= _MAX_OPEN:
            open_parts.pop(next(iter(open_parts)))
        got = open_parts.setdefault(key, {})
        got[k] = chunk[:preflight_bw.PART_BYTES]
        if len(got) == n and set(got) == set(range(n)):
            del open_parts[key]
            try:
                yield key[0], b"".join(got[i] for i in range(n)).decode()
            except UnicodeDecodeError:
                continue


def parse_lines(lines: Iterable[str]) -> tuple[dict | None, dict[int, dict]]:
    """(rank 0's result, each node's own checks) from the job's log lines. Anything that is not
    a whole, valid marker line (or a whole record of parts) is skipped: logs interleave and may
    hold a torn line."""
    result, nodes = None, {}
    for mark, text in _whole_lines(lines):
        try:
            # A rank printed it: no NaN/Infinity (1e400 is one too), no lone surrogate.
            data = valid_data(json.loads(text, parse_constant=_not_a_number, parse_float=_finite))
        except (ValueError, RecursionError):
            continue
        if not isinstance(data, dict):
            continue
        if mark == RESULT_MARK:
            if _valid_result(data):
                result = data  # the last one wins (a requeued job prints again)
        elif _int(data.get("node")) and _valid_checks(data.get("checks")):
            nodes[data["node"]] = data
    return result, nodes


def _not_a_number(text: str):
    raise ValueError(f"{text} is not a number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is not finite")
    return value


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2 ** 31


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < 1e15


def _valid_checks(checks) -> bool:
    """The node checks as the report reads them (every key it uses, of its type)."""
    return isinstance(checks, list) and all(
        isinstance(c, dict) and isinstance(c.get("check"), str) and isinstance(c.get("ok"), bool)
        and isinstance(c.get("detail", ""), str) and isinstance(c.get("fix", ""), str)
        and isinstance(c.get("host"), (str, type(None))) and (c.get("node") is None or _int(c.get("node")))
        for c in checks)


def _valid_result(data: dict) -> bool:
    """Rank 0's result as the report reads it; anything else is not one (never a verdict)."""
    pairs, ag = data.get("pairs"), data.get("all_gather")
    return (isinstance(pairs, list) and isinstance(ag, dict) and _int(ag.get("ranks")) and _number(ag.get("mib_s"))
            and all(isinstance(p, dict) and _int(p.get("src")) and _int(p.get("dst")) and _number(p.get("mib_s"))
                    and _number(p.get("bytes")) for p in pairs)
            and _valid_checks(data.get("checks")))


@dataclass
class Report:
    job_id: str
    backend: str
    state: str
    nodes: int
    size_bytes: int
    min_mibps: float | None
    result: dict | None
    node_lines: dict[int, dict]
    seconds: float = 0.0
    log_tail: list[str] = field(default_factory=list)

    @property
    def checks(self) -> list[dict]:
        if self.result is not None:
            return self.result["checks"]
        return [c for n in sorted(self.node_lines) for c in self.node_lines[n]["checks"]]

    @property
    def figures(self) -> list[tuple[str, float]]:
        if self.result is None:
            return []
        unit = self.result.get("pair_unit", "node")
        out = [(f"send/recv {unit} {p['src']} -> {unit} 0", float(p["mib_s"])) for p in self.result["pairs"]]
        ag = self.result["all_gather"]
        out.append((f"all_gather over {ag['ranks']} ranks", float(ag["mib_s"])))
        return out

    @property
    def slowest_pair(self) -> dict | None:
        pairs = (self.result or {}).get("pairs") or []
        return min(pairs, key=lambda p: p["mib_s"]) if pairs else None

    @property
    def reasons(self) -> list[str]:
        """Why the verdict is fail (empty: pass)."""
        out = []
        for c in self.checks:
            if not c["ok"]:
                out.append(f"node {c['node']} ({c['host']}): {c['check']}: {c['detail']}"
                           if c.get("node") is not None else f"{c['check']}: {c['detail']}")
        if self.result is None:
            missing = sorted(set(range(self.nodes)) - set(self.node_lines))
            out.append(f"the job ended {self.state} before rank 0 reported"
                       + (f" (no check report from node {', '.join(map(str, missing))})" if missing else ""))
        elif self.min_mibps is not None:
            for what, mibps in self.figures:
                if mibps < self.min_mibps:
                    out.append(f"{what}: {mibps:,.1f} MiB/s is below --min-mibps {self.min_mibps:g}")
        if self.result is not None and not out and self.state != "COMPLETED":
            out.append(f"the job ended {self.state} after the test")
        return out

    @property
    def passed(self) -> bool:
        return not self.reasons

    def to_json(self) -> dict:
        slow = self.slowest_pair
        r = self.result or {}
        return {
            "verdict": "pass" if self.passed else "fail", "reasons": self.reasons,
            "job_id": self.job_id, "backend": self.backend, "state": self.state, "seconds": round(self.seconds, 1),
            "nodes": self.nodes, "world": r.get("world"), "device": r.get("device"), "comm": r.get("comm"),
            "size_bytes": self.size_bytes, "iters": r.get("iters"), "min_mibps": self.min_mibps,
            "hosts": r.get("hosts", {str(n): d.get("host") for n, d in sorted(self.node_lines.items())}),
            "checks": [{k: c.get(k) for k in ("node", "host", "check", "ok", "detail", "fix")} for c in self.checks],
            "pairs": [{"src": p["src"], "dst": p["dst"], "bytes": p["bytes"], "mib_s": p["mib_s"],
                       "seconds": p["seconds"]} for p in r.get("pairs", [])],
            "all_gather": r.get("all_gather"),
            "slowest_pair": None if slow is None else {"src": slow["src"], "dst": slow["dst"], "mib_s": slow["mib_s"]},
        }


def format_table(rep: Report) -> str:
    """One table: the node checks, MiB/s per node pair and for the all_gather, the verdict."""
    r = rep.result or {}
    size = _human_bytes(rep.size_bytes)
    head = f"preflight {rep.job_id} on {rep.backend}: {rep.nodes} node{'s' if rep.nodes != 1 else ''}"
    if r:
        head += (f" x {r.get('nproc_per_node')} = {r['world']} ranks, {r['comm']} on {r['device']}, {size}, "
                 f"median of {r['iters']} timed runs")
    rows: list[tuple[str, str, str]] = []
    checks = rep.checks
    by_check: dict[str, list[dict]] = {}
    for c in checks:
        by_check.setdefault(c["check"], []).append(c)
    for name, cs in by_check.items():
        bad = [c for c in cs if not c["ok"]]
        if not bad:
            nodes = sorted({c["node"] for c in cs if c.get("node") is not None})
            where = f"{len(nodes)} node{'s' if len(nodes) != 1 else ''}" if nodes else "all ranks"
            first = cs[0]
            node0 = f"; node {first['node']}: {first['detail']}" if first.get("node") is not None else f": {first['detail']}"
            rows.append((f"check {name}", "ok", where + node0))
        for c in bad:
            node = f"node {c['node']} ({c['host']}): " if c.get("node") is not None else ""
            rows.append((f"check {name}", "FAIL", f"{node}{c['detail']}; fix: {c['fix']}"))
    for n in sorted(set(range(rep.nodes)) - set(rep.node_lines)) if not r else []:
        rows.append(("check node report", "FAIL", f"node {n}: no report (it never ran the test, or was stopped first)"))
    slow = rep.slowest_pair
    for what, mibps in rep.figures:
        mark = "" if rep.min_mibps is None else ("ok" if mibps >= rep.min_mibps else "LOW")
        rows.append((what, f"{mibps:,.1f}", mark))
    w0 = max([len("test")] + [len(a) for a, _, _ in rows])
    w1 = max([len("MiB/s")] + [len(b) for _, b, _ in rows])
    out = [head, "", f"{'test':<{w0}}  {'MiB/s':>{w1}}  result"]
    for a, b, c in rows:
        out.append(f"{a:<{w0}}  {b:>{w1}}  {c}".rstrip())
    out.append("")
    if slow is not None:
        unit = r.get("pair_unit", "node")
        host = r.get("hosts", {}).get(str(slow["src"]), "")
        out.append(f"slowest pair: {unit} {slow['src']}{f' ({host})' if host and unit == 'node' else ''} -> "
                   f"{unit} 0: {slow['mib_s']:,.1f} MiB/s")
    verdict = "PASS" if rep.passed else "FAIL"
    against = f" (--min-mibps {rep.min_mibps:g})" if rep.min_mibps is not None else ""
    out.append(f"verdict: {verdict}{against}; {rep.seconds:.1f}s from submit to result")
    for reason in rep.reasons:
        out.append(f"  - {reason}")
    return "\n".join(out) + "\n"


def _human_bytes(n: int) -> str:
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


# ---- running it -------------------------------------------------------------------------------


def run(spec, backend: str, size: int, min_mibps: float | None = None, iters: int = DEFAULT_ITERS,
        timeout: float | None = None, on_change: Callable | None = None, on_submit: Callable | None = None) -> Report:
    """Submit the preflight job through ``backend``, wait for it, read its result back."""
    import time

    from . import backends
    from .backends.base import JobStatus

    if size < 4 * spec.world_size:
        raise UsageError(f"--size {size} is too small: every one of the {spec.world_size} ranks needs at least 4 bytes")
    if iters < 1:
        raise UsageError("--iters must be at least 1")
    pf = preflight_spec(spec, size, iters)
    sched = backends.get(backend)
    start = time.monotonic()
    job_id = sched.schedule(sched.dryrun(pf))
    if on_submit:
        on_submit(job_id)
    try:
        state = sched.guard_placement(pf, job_id, on_change=on_change)
        if not state.status.terminal and state.status is not JobStatus.UNKNOWN:
            # A short test: poll often (backing off to 2 s) so its end is seen within seconds.
            state = sched.wait(job_id, timeout=timeout, poll=0.5, max_poll=2.0, on_change=on_change)
    except KeyboardInterrupt:
        sched.cancel([job_id])  # nobody will read this test's result: free its nodes now
        raise
    if not state.status.terminal and state.status is not JobStatus.UNKNOWN:
        sched.cancel([job_id])  # --timeout: a test still pending or stuck holds nodes for nothing
        state = sched.wait(job_id, timeout=60)
    lines = _read_logs(sched, job_id)
    result, node_lines = parse_lines(lines)
    return Report(job_id, backend, state.status.value, spec.nodes, size, min_mibps, result, node_lines,
                  seconds=time.monotonic() - start,
                  log_tail=[ln.rstrip("\n") for ln in lines if not _LINE_RE.search(ln)][-15:])


def _read_logs(sched, job_id: str) -> list[str]:
    from .errors import HaloError

    try:
        return list(sched.logs(job_id))
    except HaloError as err:
        return [f"(logs unavailable: {err})\n"]


def as_json(rep: Report) -> str:
    return json.dumps(rep.to_json(), allow_nan=False)  # parse_lines let no NaN in
