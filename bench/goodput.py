"""Goodput at scale, by simulation (issue 32, item 4): the share of a run's GPU-hours that trains,
for 1,024 and 16,384 GPUs over 54 days, with the interruptions Meta published for Llama 3 405B
(The Llama 3 Herd of Models, section 3.3.4, table 5: 466 job interruptions in a 54-day snapshot
on up to 16,384 H100s, 47 planned and 419 unexpected, about 78% of the unexpected ones hardware).

    python bench/goodput.py            # the table (deterministic: seeded), well under 10 s
    python bench/goodput.py --write    # the same table into docs/performance.md
    python bench/goodput.py --gpus 4096 --checkpoint-min 5 --queue-min 120 ...   # other figures

The model, each term a parameter (defaults below, where measured here said so):

- Interruptions arrive as a Poisson process on the wall clock, the rate scaled linearly with the
  GPU count from Meta's (419 unexpected + 47 planned per 16,384 GPUs per 54 days). One that comes
  while the run is already down is absorbed (it costs nothing more).
- An unexpected one is the node's fault (hardware, HARDWARE_SHARE) or the job's (software, the
  rest); HANG_SHARE of each kind hangs instead of crashing.
- Detection: a crash ends the job at once; a hang is found by halo-sched's hang detection
  (HANG_DETECT_S, docs/failures.md: about 33 s on an H200) or, without it, by NCCL's collective
  timeout (torch's default 10 min). The manual path: a person notices after NOTICE_H hours,
  whatever the failure.
- Recovery: a hardware fault with a spare left is swapped in the same allocation (SWAP_S,
  measured by bench/spares.py); anything else (software, planned, no spare left) goes through
  the queue (QUEUE_MIN, stated: a wait, not measured) and the new allocation has its spares again.
  Every restart then reloads the checkpoint (RELOAD_MIN) and redoes the work since the last one
  (checkpoints every CHECKPOINT_MIN of training; a planned stop saves first, so loses none).
- Cost: the run holds its GPUs and its spares' for the whole 54 days; a spare's GPUs never train.
  Goodput = GPU-hours that trained / GPU-hours held.
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

# Meta, Llama 3 (2024), table 5: a 54-day snapshot of 405B pre-training on up to 16,384 GPUs.
META_GPUS = 16_384
META_DAYS = 54
META_UNEXPECTED = 419
META_PLANNED = 466 - 419
HARDWARE_SHARE = 0.78

GPUS_PER_NODE = 8
DAY_S = 86_400.0


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
    swap_s: float = 5.2  # bench/spares.py, median: fault to every rank training again, same job
    queue_min: float = 30.0  # stated: a successor's wait in the queue, plus its start
    notice_h: float = 3.0  # the manual path: a person notices after some hours
    checkpoint_min: float = 10.0
    reload_min: float = 3.0
    reps: int = 100
    seed: int = 32

    @property
    def nodes(self) -> int:
        return math.ceil(self.gpus / GPUS_PER_NODE)

    def spares(self) -> int:
        return max(1, math.ceil(self.nodes / self.spare_every))


@dataclass(frozen=True)
class Scenario:
    name: str
    spares: bool
    hang_detection: bool
    manual: bool = False
    #: What-if, not built: a software fault restarts in the same allocation too (a new step on the
    #: same nodes, as a swap does), instead of going through the queue.
    inplace_software: bool = False


SCENARIOS = (
    Scenario("manual (a person resubmits)", spares=False, hang_detection=False, manual=True),
    Scenario("retry through the queue", spares=False, hang_detection=False),
    Scenario("retry + hang detection", spares=False, hang_detection=True),
    Scenario("spares, no hang detection", spares=True, hang_detection=False),
    Scenario("spares + hang detection", spares=True, hang_detection=True),
    Scenario("what-if, not built: + the job's faults restarted in place", spares=True, hang_detection=True,
             inplace_software=True),
)

#: What is lost, by term (seconds of the whole run's time, or GPU-seconds for the spares).
TERMS = ("rework", "detection", "queue", "swap", "reload", "spares idle")


@dataclass(frozen=True)
class Event:
    """One interruption: when (wall seconds), ``kind`` (hardware, software, planned), whether it hangs."""

    at: float
    kind: str
    hangs: bool = False


@dataclass
class Tally:
    held: float = 0.0  # GPU-seconds held
    lost: dict = field(default_factory=lambda: dict.fromkeys(TERMS, 0.0))  # GPU-seconds
    interruptions: int = 0
    swaps: int = 0

    @property
    def goodput(self) -> float:
        return 1.0 - sum(self.lost.values()) / self.held


def events(p: Params, rng: random.Random) -> list[Event]:
    """One run's interruptions (wall seconds, in order)."""
    horizon = p.days * DAY_S
    scale = p.gpus / META_GPUS / (META_DAYS * DAY_S)
    out = []
    for kind, rate in (("unexpected", META_UNEXPECTED * scale), ("planned", META_PLANNED * scale)):
        t = rng.expovariate(rate)
        while t < horizon:
            if kind == "planned":
                out.append(Event(t, "planned"))
            else:
                out.append(Event(t, "hardware" if rng.random() < HARDWARE_SHARE else "software",
                                 rng.random() < p.hang_share))
            t += rng.expovariate(rate)
    return sorted(out, key=lambda e: e.at)


def simulate(p: Params, s: Scenario, evs: list[Event]) -> Tally:
    """The run's time through ``evs``: what each interruption costs, by term."""
    gpus, horizon = p.nodes * GPUS_PER_NODE, p.days * DAY_S
    spares_held = p.spares() if s.spares else 0
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
            elif e.hangs:
                cost["detection"] = p.hang_detect_s if s.hang_detection else p.nccl_timeout_s
            else:
                cost["detection"] = p.crash_detect_s
        if e.kind == "hardware" and left > 0:
            left -= 1
            tally.swaps += 1
            cost["swap"] = p.swap_s
        elif e.kind == "software" and s.inplace_software:
            cost["swap"] = p.swap_s
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


def table(p: Params, sizes=(1024, 16_384)) -> str:
    lines = [f"Goodput over {p.days:g} days (bench/goodput.py; mean of {p.reps} seeded runs; Llama 3's interruption "
             f"rate scaled by GPU count, {HARDWARE_SHARE:.0%} of the unexpected ones hardware, {p.hang_share:.0%} "
             f"hanging; checkpoint every {p.checkpoint_min:g} min, reload {p.reload_min:g} min, queue wait "
             f"{p.queue_min:g} min, spare swap {p.swap_s:g} s, hang detection {p.hang_detect_s:g} s vs NCCL's "
             f"{p.nccl_timeout_s / 60:g} min, a person notices after {p.notice_h:g} h):", "",
             "| GPUs | path | goodput | lost to: " + " | ".join(TERMS) + " | largest loss |",
             "|---:|---|---:|" + "---:|" * len(TERMS) + "---|"]
    for gpus in sizes:
        q = replace(p, gpus=gpus)
        for s in SCENARIOS:
            t = run(q, s)
            shares = {k: t.lost[k] / t.held for k in TERMS}
            top = max(shares, key=shares.__getitem__)
            spares = f" ({q.spares()} spare{'s' if q.spares() != 1 else ''})" if s.spares else ""
            lines.append(f"| {gpus:,} | {s.name}{spares} | {t.goodput:.1%} | "
                         + " | ".join(f"{shares[k]:.1%}" for k in TERMS) + f" | {top} |")
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
    ap.add_argument("--gpus", type=int, action="append", help="GPU counts (default 1024 and 16384)")
    for f in Params.__dataclass_fields__.values():
        if f.name != "gpus":
            ap.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=f.default)
    a = ap.parse_args(argv)
    p = Params(**{k: getattr(a, k) for k in Params.__dataclass_fields__ if k != "gpus"})
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
