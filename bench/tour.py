"""README.md's five-minute tour, run for real: its transcripts and the time `submit --wait` took
are written here and only here.

    python bench/tour.py            # run the tour in a fresh HALO_SCHED_HOME; print the blocks
    python bench/tour.py --write    # ... and write them into README.md

Each command is run as the README shows it, through bash, from the checkout's top, with
``halo-sched`` this interpreter's ``python -m halo_sched.cli`` (this checkout first on
PYTHONPATH), in a fresh 0700 ``HALO_SCHED_HOME`` (so that ``list`` shows the tour's two jobs).
A command that exits other than 0 stops the script (exit 1, its output shown): a transcript is
never written from a run that went wrong. Every block sits between ``<!-- bench/tour.py: NAME -->``
and ``<!-- /bench/tour.py: NAME -->`` in README.md; ``demo`` (in Set-up) is the last lines of
the tour's own ``submit --wait``, the same command ``make demo`` runs.

Checked: tests/test_docs_commands.py (fast tier) that the README's blocks hold the commands
below (:func:`command_problems`) and what validate and render print now, and runs the commands
that take a job id on stand-in jobs; tests/test_make_demo.py (torch) runs the tour's jobs after
the demo and finds each line the README shows in what the commands print
(:func:`output_problems`: job ids, times, ports, host names and losses aside).
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"

#: The tour, block by block: each command as the README shows it ({job}: the id ``submit --wait``
#: printed; {cancelled}: the id of the job submitted to be cancelled), and of a long output, how
#: many first lines the README shows before ``...`` and its end (:func:`ending`).
BLOCKS: dict[str, list[tuple[str, int | None]]] = {
    "validate": [("halo-sched validate examples/ddp-cpu.yaml", None)],
    "render": [("halo-sched render examples/ddp-cpu.yaml --backend local | head -5", None),
               ("halo-sched render examples/nomad-gpu.yaml --backend nomad | head -3", None)],
    "submit": [("halo-sched submit examples/ddp-cpu.yaml --backend local --wait", 6)],
    "ask": [("halo-sched status {job}", None),
            # --grep: only the trainer's loss lines (beside a busy machine, torch's warnings on rank 0's
            # stderr came between them, and the README's two lines were not the first two printed).
            ("halo-sched logs {job} --rank 0 --grep loss | head -2", None)],
    "cancel": [("halo-sched submit examples/ddp-cpu.yaml -q", None),
               ("halo-sched cancel {cancelled} --wait", None),
               ("halo-sched list", None)],
}
SUBMIT = BLOCKS["submit"][0][0]
#: Seconds any one command may take (the training run is about 10-30 s on 2 shared cores).
TIMEOUT_S = 600


def marks(name: str) -> tuple[str, str]:
    return f"<!-- bench/tour.py: {name} -->", f"<!-- /bench/tour.py: {name} -->"


@dataclass
class Step:
    """One command as shown, what it printed (stderr and stdout as a terminal interleaves them),
    its exit code and wall time."""

    command: str
    output: list[str]
    rc: int
    seconds: float


def tour_env(home: str | os.PathLike) -> dict:
    """This environment for the tour: a given HALO_SCHED_HOME, the local backend by default,
    this checkout first on PYTHONPATH, output unbuffered (stderr and stdout in the order written)."""
    env = {k: v for k, v in os.environ.items() if k not in ("HALO_SCHED_BACKEND", "HALO_SCHED_DEBUG")}
    env["HALO_SCHED_HOME"] = str(home)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in [env.get("PYTHONPATH", "")] if p])
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run(command: str, env: dict, timeout: float = TIMEOUT_S) -> Step:
    """``command`` through bash, ``halo-sched`` being this interpreter's CLI; pipefail: the exit
    code is halo-sched's even when ``head`` reads only the first lines."""
    script = f"set -o pipefail\nhalo-sched() {{ {shlex.quote(sys.executable)} -m halo_sched.cli \"$@\"; }}\n{command}\n"
    t0 = time.monotonic()
    r = subprocess.run(["bash", "-c", script], cwd=REPO, env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, errors="replace", timeout=timeout)
    return Step(command, r.stdout.splitlines(), r.returncode, time.monotonic() - t0)


def last_id(step: Step) -> str:
    """The job id a ``submit`` printed alone on its last line."""
    if not step.output:
        raise SystemExit(f"tour: `{step.command}` printed no job id")
    return step.output[-1].strip()


def run_tour(env: dict, submitted: Step | None = None, only: tuple[str, ...] | None = None) -> dict[str, list[Step]]:
    """Every block's steps (or those of the blocks named in ``only``), run in order
    (``submitted``: the ``submit --wait`` step when it was run already, as ``make demo``'s test
    runs it). Stops at the first command that fails."""
    ids: dict[str, str] = {}
    out: dict[str, list[Step]] = {}
    for name, steps in BLOCKS.items():
        if only is not None and name not in only:
            continue
        out[name] = []
        for command, _ in steps:
            shown = command.format(**ids)
            if shown == SUBMIT and submitted is not None:
                step = submitted
            else:
                step = run(shown, env)
            if step.rc != 0:
                raise SystemExit(f"tour: `{shown}` exited {step.rc}:\n" + "\n".join(step.output[-40:]))
            if shown == SUBMIT:
                ids["job"] = last_id(step)
            elif command.startswith("halo-sched submit") and "--wait" not in command:
                ids["cancelled"] = last_id(step)
            out[name].append(step)
    return out


def ending(step: Step) -> list[str]:
    """How ``submit --wait`` ends, as Set-up's block shows it (what ``make demo`` ends with): rank
    0's check of the world, the final state, the id alone on stdout's last line."""
    check = [line for line in step.output if "[rank 0] world: " in line]
    return check[-1:] + step.output[-3:]


def _shown_lines(step: Step, first: int | None) -> list[str]:
    end = ending(step)
    if first is None or len(step.output) <= first + len(end) + 1:
        return step.output
    return step.output[:first] + ["..."] + end


def blocks(result: dict[str, list[Step]]) -> dict[str, str]:
    """The README's text of each block (``demo`` included), from a tour's steps."""
    text = {}
    for name, steps in BLOCKS.items():
        lines = []
        for (_, cut), step in zip(steps, result[name]):
            lines += [f"$ {step.command}", *_shown_lines(step, cut)]
        text[name] = "```\n" + "\n".join(lines) + "\n```"
    submit = result["submit"][0]
    text["submit"] += (f"\n\n(`bench/tour.py`, {time.strftime('%Y-%m-%d')}: `submit --wait` took {submit.seconds:.0f} s, "
                       f"on {os.cpu_count()} CPUs at load average {os.getloadavg()[0]:.1f}.)")
    text["demo"] = "```\n" + "\n".join(ending(submit)) + "\n```"
    return text


def readme_block(name: str, text: str | None = None) -> str | None:
    """README's block ``name`` (between its marks), or None when it has none."""
    start, end = marks(name)
    m = re.search(re.escape(start) + r"\n(.*?)\n" + re.escape(end), README.read_text() if text is None else text, re.S)
    return m.group(1) if m else None


def replace_block(text: str, name: str, body: str) -> str:
    start, end = marks(name)
    pattern = re.compile(re.escape(start) + r"\n.*?\n" + re.escape(end), re.S)
    if not pattern.search(text):
        raise SystemExit(f"README.md: no block between {start} and {end}")
    return pattern.sub(lambda _: f"{start}\n{body}\n{end}", text)


def _fenced(block: str) -> list[str]:
    """The lines of a block's fenced code."""
    m = re.search(r"```\n(.*?)\n```", block, re.S)
    return m.group(1).splitlines() if m else []


def transcript(block: str) -> list[tuple[str, list[str]]]:
    """(command, the lines shown after it) of each ``$ `` line in a block's fenced code."""
    out: list[tuple[str, list[str]]] = []
    for line in _fenced(block):
        if line.startswith("$ "):
            out.append((line[2:], []))
        elif out:
            out[-1][1].append(line)
    return out


_NORMAL = [
    (re.compile(r"ddp-cpu-\d{8}-\d{6}-[0-9a-f]{6}"), "ID"),
    (re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"), "DATE"),
    (re.compile(r"^\[\d\d:\d\d\]"), "[MM:SS]"),
    (re.compile(r"127\.0\.0\.1:\d+"), "127.0.0.1:PORT"),
    (re.compile(r" on \S+: master "), " on HOST: master "),
    # Losses are the seeded trainer's, but a float's last digits may differ between CPUs.
    (re.compile(r"loss \d+\.\d+"), "loss X"),
]


def normal(line: str) -> str:
    for pattern, repl in _NORMAL:
        line = pattern.sub(repl, line)
    return line


def command_problems(readme: str | None = None) -> list[str]:
    """Where README.md's tour blocks are not this script's: a block missing, a command not the
    one the script runs (job ids aside), the submit block's line of figures not the script's."""
    problems = []
    for name, steps in BLOCKS.items():
        block = readme_block(name, readme)
        if block is None:
            problems.append(f"README.md has no {name} block ({marks(name)[0]})")
            continue
        shown = [normal(c) for c, _ in transcript(block)]
        ours = [normal(c.format(job="ddp-cpu-20000101-000000-000000", cancelled="ddp-cpu-20000101-000000-000000"))
                for c, _ in steps]
        if shown != ours:
            problems.append(f"{name}: README's commands {shown} are not the tour's {ours}")
    if readme_block("demo", readme) is None:
        problems.append(f"README.md has no demo block ({marks('demo')[0]})")
    if not re.search(FIGURES, readme_block("submit", readme) or "", re.M):
        problems.append("README.md's submit block has no line of figures written by bench/tour.py")
    return problems


#: The line under the submit block (:func:`blocks`).
FIGURES = (r"^\(`bench/tour\.py`, \d{4}-\d\d-\d\d: `submit --wait` took \d+ s, "
           r"on \d+ CPUs at load average \d+\.\d\.\)$")


#: A live state line of ``submit --wait`` (``[00:01] ID: RUNNING 2/2 nodes running``): whether a
#: poll catches the job PENDING, or RUNNING before it ends, depends on the machine's load.
LIVE_STATE = re.compile(r"^\[\d\d:\d\d\] \S+: (PENDING|RUNNING)\b")


def output_problems(result: dict[str, list[Step]], readme: str | None = None) -> list[str]:
    """Each line README.md's tour shows for the blocks in ``result`` that the commands did not
    print now (job ids, times, ports, host names and losses aside); empty when none."""
    problems = []
    for name, fresh in result.items():
        for (command, lines), step in zip(transcript(readme_block(name, readme) or ""), fresh):
            printed = {normal(line) for line in step.output}
            for line in lines:
                if line == "..." or LIVE_STATE.match(line):
                    continue  # the waiter's live state lines: which ones a poll catches is timing
                if normal(line) not in printed:
                    problems.append(f"{name}: `{command}`: README shows {line!r}, not printed now; printed: "
                                    f"{[ln[:200] for ln in step.output[:6]]!r}")
    if "submit" in result:
        printed = {normal(line) for line in result["submit"][0].output}
        for line in _fenced(readme_block("demo", readme) or ""):
            if normal(line) not in printed:
                problems.append(f"demo: README shows {line!r}, not printed by `{SUBMIT}`")
    return problems


def main(argv: list[str]) -> int:
    with tempfile.TemporaryDirectory(prefix="halo-tour-") as home:
        os.chmod(home, 0o700)
        result = run_tour(tour_env(home))
    text = blocks(result)
    if "--write" in argv:
        readme = README.read_text()
        for name, body in text.items():
            readme = replace_block(readme, name, body)
        README.write_text(readme)
        print(f"wrote {README.relative_to(REPO)}")
        return 0
    for name, body in text.items():
        print(f"{marks(name)[0]}\n{body}\n{marks(name)[1]}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
