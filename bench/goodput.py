"""Goodput at scale, by simulation (issue 32, item 4; issue 39, item 5): the share of a run's
GPU-hours that trains, for 1,024 and 16,384 GPUs over 54 days, with the interruptions Meta published
for Llama 3 405B (The Llama 3 Herd of Models, section 3.3.4, table 5: 466 job interruptions in a
54-day snapshot on up to 16,384 H100s, 47 planned and 419 unexpected, about 78% of the unexpected
ones hardware).

    python bench/goodput.py            # the tables (deterministic: seeded), a few seconds
    python bench/goodput.py --json     # the same rows as JSON: gpus, path, goodput, lost by cause
    python bench/goodput.py --write    # the tables into docs/performance.md
    python bench/goodput.py --gpus 4096 --checkpoint-min 5 --queue-min 120 ...   # other figures

The model, each term a parameter (defaults below; the measured ones read from bench/measured.json,
which the bench scripts that measured them write):

- Interruptions arrive as a Poisson process on the wall clock, the rate scaled linearly with the
  GPU count from Meta's (419 unexpected + 47 planned per 16,384 GPUs per 54 days). One that comes
  while the run is already down is absorbed (it costs nothing more).
- An unexpected one is the node's fault (hardware, HARDWARE_SHARE) or the job's (software, the
  rest); HANG_SHARE of each kind hangs instead of crashing. Of the hardware faults,
  ``node_lost_share`` lose the host outright (stated); when that host is the batch host (one of
  the allocation's nodes, at random), the batch script dies with it.
- Detection: a crash ends the job at once; a hang is found by halo-sched's hang detection
  (HANG_DETECT_S, docs/failures.md: about 33 s on an H200) or, without it, by NCCL's collective
  timeout (torch's default 10 min). A lost batch host is known when Slurm marks it down
  (``node_down_s``: its default SlurmdTimeout). The manual path: a person notices after NOTICE_H
  hours, whatever the failure.
- Recovery (``restart``, the tool's own; then the trainer reloads its checkpoint, RELOAD_MIN, and
  redoes the work since the last one, checkpoints every CHECKPOINT_MIN of training): a hardware
  fault with a spare left is swapped in the same allocation (``swap_s``, measured by
  bench/spares.py); the job's own fault restarts in place where the path has it (``inplace_s``,
  issue 39 item 1, bench/spares.py); a planned stop moves to a spare at its next checkpoint where
  the path has it (issue 39 item 3: ``planned_s``, from the warning to training again, measured by
  ``bench/spares.py --planned``; no work lost); with Slurm 25.11's expedited requeue
  (``--requeue=expedite``) a node's fault no spare can take (the spares used up, or the batch host
  lost) requeues the job at once, the highest priority, on its held nodes (``resubmit_s``: a job
  start on free nodes, measured by bench/spares.py), its spares with it; a lost batch host without
  it needs a waiting client (the older paths), the guardian (a one-CPU job that submits the
  successor: ``guardian_s``, stated, then the queue), or a person. Anything else goes through the
  queue (QUEUE_MIN, stated: a wait, not measured) and the new allocation has its spares again. A
  planned stop saves first, so it loses no work.
- Cost: the run holds its GPUs and its spares' for the whole 54 days; a spare's GPUs never train.
  Goodput = GPU-hours that trained / GPU-hours held. The tool's own share of the GPU-hours:
  detection + restart + queue + spares idle (rework and reload are the trainer's checkpoints').
"""
from __future__ import annotations

import argparse
import math
import random
import re
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "performance.md"
MARKS = ("<!-- bench/goodput.py -->", "<!-- /bench/goodput.py -->")
sys.path.insert(0, str(REPO / "bench"))
import measured  # noqa: E402  (bench/measured.py: the figures the bench scripts measured)

# Meta, Llama 3 (2024), table 5: a 54-day snapshot of 405B pre-training on up to 16,384 GPUs.
META_GPUS = 16_384
META_DAYS = 54
META_UNEXPECTED = 419
META_PLANNED = 466 - 419
HARDWARE_SHARE = 0.78

GPUS_PER_NODE = 8
DAY_S = 86_400.0


#: The measured inputs (bench/measured.json) and whether each was measured or is a bound.
MEASURED = {name: measured.value(name) for name in ("swap_s", "resubmit_s", "inplace_s", "planned_s")}


@dataclass(frozen=True)
class Params:
    gpus: int = 16_384
    days: float = META_DAYS
    #: Hot spares per allocation: one per SPARE_EVERY nodes, at least one (with spares).
    spare_every: int = 128
    hang_share: float = 0.10  # assumed: of each kind, the share that hangs instead of crashing
    hang_detect_s: float = 33.0  # docs/failures.md: hang detection on an H200
    nccl_timeout_s: float = 600.0  # torch's default NCCL collective timeout
    crash_detect_s: float = 5.0  # a crash: the job's end reaches the batch script / the watcher
    swap_s: float = MEASURED["swap_s"]  # bench/measured.json (bench/spares.py): fault -> training, same job
    inplace_s: float = MEASURED["inplace_s"]  # bench/measured.json: a restart in place (the bound until measured)
    resubmit_s: float = MEASURED["resubmit_s"]  # bench/measured.json (bench/spares.py): a job start on free nodes
    planned_s: float = MEASURED["planned_s"]  # bench/measured.json (bench/spares.py --planned): warning -> training
    node_lost_share: float = 0.05  # stated: of the hardware faults, the share that loses the host outright
    node_down_s: float = 300.0  # Slurm's default SlurmdTimeout: a lost host is marked down after it
    guardian_s: float = 30.0  # stated: the guardian job starts once its attempt ended, and submits
    queue_min: float = 30.0  # stated: a successor's wait in the queue, plus its start
    notice_h: float = 3.0  # the manual path: a person notices after some hours
    checkpoint_min: float = 10.0
    reload_min: float = 3.0
    reps: int = 100
    seed: int = 32

    @property
    def nodes(self) -> int:
        return math.ceil(self.gpus / GPUS_PER_NODE)

    def spares(self, every: int | None = None) -> int:
        return max(1, math.ceil(self.nodes / (every or self.spare_every)))


@dataclass(frozen=True)
class Scenario:
    name: str
    spares: bool
    hang_detection: bool
    manual: bool = False
    #: The job's own faults restart in the same allocation (a new step on the same nodes:
    #: issue 39 item 1), instead of going through the queue.
    inplace: bool = False
    #: A lost batch host: a client waits and resubmits (the older paths), or nobody does.
    client: bool = True
    #: A lost batch host: the guardian job submits the successor (no client: issue 39 item 2).
    guardian: bool = False
    #: Slurm 25.11's --requeue=expedite: a node's fault no spare takes (spares used up, batch host
    #: lost) requeues the job at once on its held nodes, its spares with it.
    expedite: bool = False
    #: A planned stop moves to a spare at the trainer's next checkpoint (issue 39 item 3).
    planned_swap: bool = False
    #: Spares per this many nodes, where the path sizes them its own way (None: --spare-every).
    spare_every: int | None = None


SCENARIOS = (
    Scenario("manual (a person resubmits)", spares=False, hang_detection=False, manual=True),
    Scenario("retry through the queue", spares=False, hang_detection=False),
    Scenario("retry + hang detection", spares=False, hang_detection=True),
    Scenario("spares, no hang detection", spares=True, hang_detection=False),
    Scenario("spares + hang detection", spares=True, hang_detection=True),
    Scenario("+ the job's faults restarted in place", spares=True, hang_detection=True, inplace=True),
    Scenario("+ no client: the guardian submits after a lost batch host", spares=True, hang_detection=True,
             inplace=True, client=False, guardian=True),
    Scenario("+ no client: Slurm 25.11's expedited requeue", spares=True, hang_detection=True, inplace=True,
             client=False, expedite=True),
    Scenario("+ planned stops onto a spare at a checkpoint", spares=True, hang_detection=True, inplace=True,
             client=False, expedite=True, planned_swap=True),
    Scenario("the same, one spare per 256 nodes", spares=True, hang_detection=True, inplace=True, client=False,
             expedite=True, planned_swap=True, spare_every=256),
)

#: What is lost, by term (seconds of the whole run's time, or GPU-seconds for the spares).
TERMS = ("rework", "detection", "queue", "restart", "reload", "spares idle")
#: The tool's own share: everything but the trainer's checkpoints (rework, reload).
TOOLS = ("detection", "restart", "queue", "spares idle")


@dataclass(frozen=True)
class Event:
    """One interruption: when (wall seconds), ``kind`` (hardware, software, planned), whether it
    hangs, and whether it lost the allocation's batch host outright."""

    at: float
    kind: str
    hangs: bool = False
    batch_host: bool = False


@dataclass
class Tally:
    held: float = 0.0  # GPU-seconds held
    lost: dict = field(default_factory=lambda: dict.fromkeys(TERMS, 0.0))  # GPU-seconds
    interruptions: int = 0
    swaps: int = 0

    @property
    def goodput(self) -> float:
        return 1.0 - sum(self.lost.values()) / self.held

    @property
    def tool(self) -> float:
        """The tool's own share of the GPU-hours held (:data:`TOOLS`)."""
        return sum(self.lost[k] for k in TOOLS) / self.held


def events(p: Params, rng: random.Random) -> list[Event]:
    """One run's interruptions (wall seconds, in order). Which hardware faults lose the batch host
    comes from a stream of its own (seeded from ``rng``'s state, which it leaves as it was), so the
    interruptions themselves are the same whatever ``node_lost_share``."""
    horizon = p.days * DAY_S
    scale = p.gpus / META_GPUS / (META_DAYS * DAY_S)
    hosts = random.Random(repr(rng.getstate()[1][:8]))
    out = []
    for kind, rate in (("unexpected", META_UNEXPECTED * scale), ("planned", META_PLANNED * scale)):
        t = rng.expovariate(rate)
        while t < horizon:
            if kind == "planned":
                out.append(Event(t, "planned"))
            else:
                hw = rng.random() < HARDWARE_SHARE
                lost = hw and hosts.random() < p.node_lost_share and hosts.random() < 1 / p.nodes
                out.append(Event(t, "hardware" if hw else "software", rng.random() < p.hang_share, batch_host=lost))
            t += rng.expovariate(rate)
    return sorted(out, key=lambda e: e.at)


def simulate(p: Params, s: Scenario, evs: list[Event]) -> Tally:
    """The run's time through ``evs``: what each interruption costs, by term."""
    gpus, horizon = p.nodes * GPUS_PER_NODE, p.days * DAY_S
    spares_held = p.spares(s.spare_every) if s.spares else 0
    tally = Tally(held=(gpus + spares_held * GPUS_PER_NODE) * horizon)
    tally.lost["spares idle"] = spares_held * GPUS_PER_NODE * horizon
    ckpt = p.checkpoint_min * 60
    trained_from = 0.0  # when training last (re)started: checkpoints every ckpt of training after it
    left = spares_held
    for e in evs:
        if e.at < trained_from:
            continue  # the run was down already
        tally.interruptions += 1
        cost = dict.fromkeys(TERMS, 0.0)
        if e.kind != "planned":
            cost["rework"] = (e.at - trained_from) % ckpt
            if s.manual:
                cost["detection"] = p.notice_h * 3600
            elif e.batch_host:
                cost["detection"] = p.node_down_s  # the batch script died with its host: Slurm's word
            elif e.hangs:
                cost["detection"] = p.hang_detect_s if s.hang_detection else p.nccl_timeout_s
            else:
                cost["detection"] = p.crash_detect_s
        if e.batch_host and not s.manual:
            if s.expedite:  # requeued at once on the held nodes, the lost one replaced: spares with it
                cost["restart"] = p.resubmit_s
                left = spares_held
            else:
                if s.guardian:
                    cost["restart"] = p.guardian_s
                elif not s.client:
                    cost["detection"] += p.notice_h * 3600  # nobody left to act: a person notices
                cost["queue"] = p.queue_min * 60
                left = spares_held
        elif e.kind == "hardware" and left > 0:
            left -= 1
            tally.swaps += 1
            cost["restart"] = p.swap_s
        elif e.kind == "hardware" and s.expedite:  # no spare left: the node's fault requeues the job at once
            cost["restart"] = p.resubmit_s
            left = spares_held
        elif e.kind == "software" and s.inplace:
            cost["restart"] = p.inplace_s
        elif e.kind == "planned" and s.planned_swap and left > 0:  # at its checkpoint, onto a spare
            left -= 1
            tally.swaps += 1
            cost["restart"] = p.planned_s
        else:
            cost["queue"] = p.queue_min * 60
            left = spares_held  # a new allocation, its spares with it
        cost["reload"] = p.reload_min * 60
        down = sum(cost.values())
        end = min(horizon, e.at + down)
        scale = (end - e.at) / down if down else 0.0  # the run's end cuts the last outage short
        for k, v in cost.items():
            tally.lost[k] += v * scale * gpus
        # The rework counts as time down: it is redone after the restart and makes no new progress.
        trained_from = end
    return tally


def run(p: Params, s: Scenario) -> Tally:
    """Mean over ``p.reps`` seeded runs (the same interruptions for every scenario)."""
    total = Tally(held=0.0)
    for i in range(p.reps):
        t = simulate(p, s, events(p, random.Random(p.seed * 1_000_003 + i)))
        total.held += t.held
        total.interruptions += t.interruptions
        total.swaps += t.swaps
        for k in TERMS:
            total.lost[k] += t.lost[k]
    return total


def rows(p: Params, sizes=(1024, 16_384)) -> list[dict]:
    """Every path at every size: ``{"gpus", "path", "spares", "goodput", "lost": {term: share},
    "tool"}`` (shares of the GPU-hours held)."""
    out = []
    for gpus in sizes:
        q = replace(p, gpus=gpus)
        for s in SCENARIOS:
            t = run(q, s)
            out.append({"gpus": gpus, "path": s.name, "spares": q.spares(s.spare_every) if s.spares else 0,
                        "goodput": t.goodput, "lost": {k: t.lost[k] / t.held for k in TERMS}, "tool": t.tool})
    return out


def _inputs(p: Params) -> str:
    def src(name: str, what: str) -> str:
        return (f"{what} {getattr(p, name):g} s (bench/measured.json, by {measured.entries()[name]['by']}"
                + ("" if measured.measured(name) else ": NOT MEASURED YET, the goal's bound") + ")")

    return (f"Llama 3's interruption rate scaled by GPU count, {HARDWARE_SHARE:.0%} of the unexpected ones hardware, "
            f"{p.hang_share:.0%} hanging, {p.node_lost_share:.0%} of the hardware ones losing the host; checkpoint "
            f"every {p.checkpoint_min:g} min, reload {p.reload_min:g} min, queue wait {p.queue_min:g} min, "
            + ", ".join([src("swap_s", "spare swap"), src("inplace_s", "restart in place"),
                         src("resubmit_s", "expedited requeue (a job start on free nodes)"),
                         src("planned_s", "planned swap (warning -> training)")])
            + f", guardian {p.guardian_s:g} s, a lost host known after {p.node_down_s:g} s, hang detection "
            f"{p.hang_detect_s:g} s vs NCCL's {p.nccl_timeout_s / 60:g} min, a person notices after {p.notice_h:g} h")


def _table(rs: list[dict]) -> list[str]:
    lines = ["| GPUs | path | goodput | the tool's share | lost to: " + " | ".join(TERMS) + " | largest loss |",
             "|---:|---|---:|---:|" + "---:|" * len(TERMS) + "---|"]
    for r in rs:
        top = max(r["lost"], key=r["lost"].__getitem__)
        spares = f" ({r['spares']} spare{'s' if r['spares'] != 1 else ''})" if r["spares"] else ""
        lines.append(f"| {r['gpus']:,} | {r['path']}{spares} | {r['goodput']:.1%} | {r['tool']:.2%} | "
                     + " | ".join(f"{r['lost'][k]:.1%}" for k in TERMS) + f" | {top} |")
    return lines


#: Issue 39's goal, at GOAL_GPUS with checkpoints every GOAL_CHECKPOINT_MIN minutes.
GOAL_GPUS, GOAL_CHECKPOINT_MIN, GOAL_TOOL, GOAL_GOODPUT = 16_384, 5.0, 0.010, 0.96


def table(p: Params, sizes=(1024, 16_384)) -> str:
    lines = [f"Goodput over {p.days:g} days (bench/goodput.py; mean of {p.reps} seeded runs; {_inputs(p)}):", ""]
    lines += _table(rows(p, sizes))
    goal = replace(p, checkpoint_min=GOAL_CHECKPOINT_MIN)
    if goal != p:
        rs = rows(goal, (GOAL_GPUS,))
        lines += ["", f"With checkpoints every {GOAL_CHECKPOINT_MIN:g} min (the goal's setting; the rest as above):", ""]
        lines += _table(rs)
    else:
        rs = [r for r in rows(p, sizes) if r["gpus"] == GOAL_GPUS]
    best = rs[-1] if rs else None
    if best is not None:
        ok = best["tool"] <= GOAL_TOOL and best["goodput"] >= GOAL_GOODPUT
        lines += ["", f"Goal (issue 39) at {GOAL_GPUS:,} GPUs with {GOAL_CHECKPOINT_MIN:g}-minute checkpoints: the tool's "
                      f"share at most {GOAL_TOOL:.1%} and goodput at least {GOAL_GOODPUT:.0%}: "
                      f"{'met' if ok else 'NOT met'} by the last path ({best['tool']:.2%}, {best['goodput']:.1%})."]
    return "\n".join(lines)


def replace_block(text: str, body: str) -> str:
    pattern = re.compile(re.escape(MARKS[0]) + r"\n.*?\n" + re.escape(MARKS[1]), re.S)
    if not pattern.search(text):
        raise SystemExit(f"{DOC}: no block between {MARKS[0]} and {MARKS[1]}")
    return pattern.sub(lambda _: f"{MARKS[0]}\n{body}\n{MARKS[1]}", text)


def doc_block() -> str | None:
    m = re.search(re.escape(MARKS[0]) + r"\n(.*?)\n" + re.escape(MARKS[1]), DOC.read_text(), re.S)
    return m.group(1) if m else None


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="write the default table into docs/performance.md")
    ap.add_argument("--json", action="store_true",
                    help="the rows as JSON: {inputs, rows: [{gpus, path, spares, goodput, lost: {term: share}, tool}]}")
    ap.add_argument("--gpus", type=int, action="append", help="GPU counts (default 1024 and 16384)")
    for f in Params.__dataclass_fields__.values():
        if f.name != "gpus":
            ap.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=f.default)
    a = ap.parse_args(argv)
    p = Params(**{k: getattr(a, k) for k in Params.__dataclass_fields__ if k != "gpus"})
    if a.json:
        import json

        inputs = {k: getattr(p, k) for k in Params.__dataclass_fields__ if k != "gpus"}
        print(json.dumps({"inputs": {**inputs, "measured": {k: measured.entries()[k] for k in MEASURED}},
                          "terms": list(TERMS), "tool_terms": list(TOOLS),
                          "rows": rows(p, tuple(a.gpus or (1024, 16_384)))}, indent=1))
        return 0
    text = table(p, tuple(a.gpus or (1024, 16_384)))
    if a.write:
        if a.gpus or p != Params():
            raise SystemExit("--write takes the defaults only (the doc's table is the default one)")
        DOC.write_text(replace_block(DOC.read_text(), text))
        print(f"wrote {DOC.relative_to(REPO)}")
        return 0
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
