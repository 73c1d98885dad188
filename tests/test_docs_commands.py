"""Every command README.md and docs/cli.md show keeps running (issue 41, item 6).

- Each ``halo-sched`` command shown (a ``$ halo-sched ...`` line of a transcript, an inline
  ``halo-sched ...`` in the text) is parsed by the CLI's own parser: a renamed or removed option
  fails here, those that need a cluster included.
- The cheap ones (no job id, no cluster) are run for real on the local backend, bounded in time,
  as the README shows them (pipes too); they exit 0, and validate and render print what the
  README's tour shows.
- The tour's commands that take a job id (``status``, ``logs``, ``cancel --wait``, ``list``) are
  run as shown on stand-in jobs (a torchrun that exits at once, a node asleep in its setup);
  what they print is the README's, job ids and times aside. tests/test_make_demo.py runs the
  tour's own jobs (real torchrun).
- The README's tour is bench/tour.py's (its commands and its line of figures); docs/cli.md's
  command table has every command and option the parser has, and no other, an option bracketed
  exactly when it may be left out.
- A page and heading that halo-sched's code or the job file's schema points a reader to exists;
  docs/library.md's quoted errors are what the library says now.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shlex
import signal
import sys
import time

import pytest

import halo_sched
from halo_sched import cli
from halo_sched.backends.base import JobStatus
from helpers import REPO, example_job, free_port

PAGES = ("README.md", "docs/cli.md")


def _tour():
    spec = importlib.util.spec_from_file_location("bench_tour", REPO / "bench" / "tour.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


tour = _tour()

# ---- the commands the pages show -----------------------------------------------------------------

INLINE = re.compile(r"(`+)(.+?)\1")


def _fences(text: str):
    """(line number, line, inside a fenced block) of every line."""
    fence = None
    for n, line in enumerate(text.splitlines(), 1):
        m = re.match(r"^\s*(`{3,}|~{3,})", line)
        if m:
            fence = None if fence else m.group(1)
            continue
        yield n, line, fence is not None


def shown_commands(page: str) -> list[tuple[str, str]]:
    """(where, command) of each concrete ``halo-sched`` command on the page: ``$ halo-sched ...``
    lines in fenced blocks, and inline code holding ``halo-sched WORD ...`` that is a command, not
    a synopsis (no ``[``, ``...`` or ``\\|``)."""
    out = []
    for n, line, fenced in _fences((REPO / page).read_text()):
        if fenced:
            if line.startswith("$ halo-sched "):
                out.append((f"{page}:{n}", line[2:]))
            continue
        for m in INLINE.finditer(line):
            code = m.group(2).strip()
            if re.search(r"(^|[\s(])halo-sched [a-z]", code) and not re.search(r"\[|\.\.\.|\\\|", code):
                out.append((f"{page}:{n}", code))
    return out


def argv_of(command: str) -> list[str]:
    """The arguments after ``halo-sched`` (a variable set before it, ``source <(`` around it and a
    pipe after it left out)."""
    words = shlex.split(command.replace("<(", " ").replace(")", " "))
    words = words[words.index("halo-sched") + 1:]
    return words[:words.index("|")] if "|" in words else words


def _parse(argv: list[str]) -> str | None:
    """The parser's error for ``argv``, or None when it parses (a command named alone, as in
    "`halo-sched preflight`: the fabric before ...", is one that exists)."""
    import contextlib
    import io

    if len(argv) == 1:
        return None if argv[0] in cli.COMMANDS else f"no command {argv[0]!r}"
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            cli.build_parser().parse_args(argv)
    except SystemExit as e:
        return err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else f"exit {e.code}"
    return None


def test_the_pages_show_commands_to_check():
    found = {page: shown_commands(page) for page in PAGES}
    assert len(found["README.md"]) >= 12 and len(found["docs/cli.md"]) >= 3, found
    words = {argv_of(c)[0] for cmds in found.values() for _, c in cmds}
    assert {"validate", "render", "submit", "status", "logs", "cancel", "list", "nodes", "completion"} <= words, words


@pytest.mark.parametrize("page", PAGES)
def test_every_command_shown_parses(page):
    bad = [f"{where}: `{c}`: {err}" for where, c in shown_commands(page) if (err := _parse(argv_of(c)))]
    assert bad == []


def test_a_renamed_option_fails_the_parse():
    """The check itself: an option the parser does not know is caught, as a renamed one would be."""
    assert _parse(argv_of("halo-sched logs x --rank 0 | head -2")) is None
    assert "unrecognized arguments: --rnak" in _parse(argv_of("halo-sched logs x --rnak 0"))


# ---- the cheap ones, run -------------------------------------------------------------------------

#: Commands that need no job id and no cluster: run for real wherever a page shows them.
CHEAP = {"validate", "render", "list", "nodes", "export", "completion", "schema", "notify"}


@pytest.fixture
def env():
    """The CLI's environment in this test's own HALO_SCHED_HOME (the library's too)."""
    home = os.environ["HALO_SCHED_HOME"]
    os.makedirs(home, mode=0o700, exist_ok=True)
    return tour.tour_env(home)


def _runnable(command: str) -> str | None:
    """The command as bash runs it here: ``source <(X)`` is X; ``X | source`` is X; one with a
    variable set before it (another HALO_SCHED_HOME) is not run."""
    if command.startswith("source <(halo-sched "):
        return command[len("source <("):command.index(")")]
    if not command.startswith("halo-sched "):
        return None
    return command.split(" | source")[0]


def test_the_cheap_commands_shown_run_as_shown(env):
    ran, bad = [], []
    for page in PAGES:
        for where, command in shown_commands(page):
            shell = _runnable(command)
            argv = argv_of(command)
            if shell is None or argv[0] not in CHEAP or argv[:2] == ["nodes", "clear"]:
                continue
            step = tour.run(shell, env, timeout=120)
            ran.append(shell)
            if step.rc != 0:
                bad.append(f"{where}: `{shell}` exited {step.rc}: {step.output[-3:]}")
    assert bad == []
    assert {"halo-sched render examples/nomad-gpu.yaml --backend nomad | head -3", "halo-sched completion fish",
            "halo-sched list"} <= set(ran), ran


def test_the_tour_is_bench_tour_py_and_validate_and_render_print_what_it_shows(env):
    """The README's tour blocks are the script's (commands, line of figures); the deterministic
    ones print now what they show."""
    assert tour.command_problems() == []
    result = tour.run_tour(env, only=("validate", "render"))
    assert tour.output_problems(result) == []


def test_the_cpu_example_is_refused_for_nomad_as_the_tour_says(env):
    """The tour renders examples/nomad-gpu.yaml for Nomad because the CPU example names no image:
    rendering that one for Nomad is exit 2 with the words the README quotes."""
    readme = (REPO / "README.md").read_text()
    quoted = re.search(r"is exit 2 saying so: `([^`]+)`", readme).group(1)
    step = tour.run("halo-sched render examples/ddp-cpu.yaml --backend nomad", env, timeout=120)
    assert step.rc == 2 and any(quoted in line for line in step.output), step.output


def test_the_check_sees_a_command_or_a_line_the_tour_does_not_have(env):
    readme = (REPO / "README.md").read_text()
    changed = readme.replace("$ halo-sched validate examples/ddp-cpu.yaml", "$ halo-sched validate examples/other.yaml")
    assert any("validate" in p for p in tour.command_problems(changed))
    changed = readme.replace("ok (ddp-cpu: 2 nodes x 2 processes = 4 ranks)", "ok (ddp-cpu: 3 nodes)")
    result = tour.run_tour(env, only=("validate",))
    assert tour.output_problems(result, changed) == \
        ["validate: `halo-sched validate examples/ddp-cpu.yaml`: README shows 'examples/ddp-cpu.yaml: ok (ddp-cpu: 3 nodes)', "
         "not printed now; printed: ['examples/ddp-cpu.yaml: ok (ddp-cpu: 2 nodes x 2 processes = 4 ranks)']"]


# ---- the tour's commands that take a job id, on stand-in jobs ------------------------------------

def _stand_in_setup(tmp_path) -> str:
    """A setup line that puts a torchrun that exits 0 first on PATH: a job that completes without torch."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    (bindir / "torchrun").write_text("#!/bin/sh\nexit 0\n")
    (bindir / "torchrun").chmod(0o755)
    return f'export PATH="{bindir}:$PATH"'


def _submit(job, env, *args) -> str:
    step = tour.run(f"halo-sched submit {shlex.quote(str(job))} {' '.join(args)}", env, timeout=120)
    assert step.rc == 0, step.output
    return tour.last_id(step)


def _readme_ids() -> tuple[str, str]:
    """The ids the README's tour shows: the job submit --wait ran, the job cancel stopped."""
    submitted = tour.ending(tour.Step("", tour._fenced(tour.readme_block("submit")), 0, 0))[-1]
    cancel = tour.transcript(tour.readme_block("cancel"))
    return submitted, cancel[0][1][-1]


def test_the_tours_job_commands_run_as_shown_on_stand_in_jobs(tmp_path, env):
    done_dir, asleep_dir = tmp_path / "done", tmp_path / "asleep"
    done_dir.mkdir()
    asleep_dir.mkdir()
    done = _submit(example_job(done_dir, free_port(), setup=[_stand_in_setup(tmp_path)]), env, "--wait", "-q")
    asleep = _submit(example_job(asleep_dir, free_port(), setup=["sleep 300"]), env, "-q")
    job, cancelled = _readme_ids()
    assert job != cancelled
    ran = []
    for name in ("ask", "cancel"):
        steps = []
        for command, _ in tour.transcript(tour.readme_block(name)):
            if command.startswith("halo-sched submit"):
                steps.append(tour.Step(command, [], 0, 0))  # the example's training: tests/test_make_demo.py
                continue
            step = tour.run(command.replace(job, done).replace(cancelled, asleep), env, timeout=120)
            assert step.rc == 0, (command, step.output)
            ran.append(command.split()[1])
            # The stand-in job trained nothing: its rank-0 log is not the README's.
            steps.append(tour.Step(command, step.output if " logs " not in command else [], 0, 0))
        shown = {name: steps}
        problems = [p for p in tour.output_problems(shown) if "halo-sched logs" not in p and "halo-sched submit" not in p]
        assert problems == []
    assert ran == ["status", "logs", "cancel", "list"]


def test_a_cancelled_local_job_shows_cancelling_until_its_processes_stopped(tmp_path, env):
    """The README's cancel: ``cancel`` returns once the stop is asked for; until the job's
    processes have stopped, ``status`` and ``list`` say so (RUNNING, raw CANCELLING), never
    RUNNING as if nothing had been asked. The supervisor is held stopped (SIGSTOP) to keep that
    moment open, then let go: the job ends CANCELLED."""
    job = example_job(tmp_path, free_port(), setup=["sleep 300"])
    job_id = _submit(job, env, "-q")
    handle = halo_sched.job(job_id, "local")
    deadline = time.monotonic() + 60
    while handle.status().status is not JobStatus.RUNNING:
        assert time.monotonic() < deadline, handle.status()
        time.sleep(0.2)
    sup = int((handle.scheduler.root / job_id / "supervisor.pid").read_text().split()[0])
    os.kill(sup, signal.SIGSTOP)
    try:
        step = tour.run(f"halo-sched cancel {job_id}", env, timeout=120)
        assert step.rc == 0 and step.output == [f"halo-sched: cancel requested for {job_id}"], step.output
        cancelling = "RUNNING 2/2 nodes running raw=CANCELLING reason=cancel requested; its processes are being stopped"
        status = tour.run(f"halo-sched status {job_id}", env, timeout=120)
        assert status.rc == 0 and status.output[-1].startswith(f"{job_id}\t{cancelling}"), status.output
        listed = tour.run("halo-sched list", env, timeout=120)
        assert listed.rc == 0 and cancelling in listed.output[-1], listed.output
    finally:
        os.kill(sup, signal.SIGCONT)
    assert handle.wait(timeout=60, poll=0.2).status is JobStatus.CANCELLED
    assert tour.run(f"halo-sched status {job_id}", env).output[-1] == f"{job_id}\tCANCELLED reason=cancelled by user"


# ---- docs/cli.md's command table -----------------------------------------------------------------

def cli_table() -> dict[str, list[str]]:
    """docs/cli.md's CLI table: each command's synopses (``\\|`` read as ``|``)."""
    text = (REPO / "docs" / "cli.md").read_text()
    table = text[text.index("## CLI"):text.index("### Exit codes")]
    out: dict[str, list[str]] = {}
    for row in table.splitlines():
        if not row.startswith("| `halo-sched "):
            continue
        first = re.split(r"(?<!\\)\|", row)[1]
        for m in INLINE.finditer(first):
            synopsis = m.group(2).replace("\\|", "|")
            out.setdefault(synopsis.split()[1], []).append(synopsis)
    return out


def _options(synopsis: str) -> dict[str, int]:
    """Each option of a synopsis and how many brackets it sits in."""
    depth, out = 0, {}
    for token in re.findall(r"\[|\]|[^\s\[\]]+", synopsis):
        if token == "[":
            depth += 1
        elif token == "]":
            depth -= 1
        elif token.startswith("-"):
            out.setdefault(token.split("=")[0], depth)
    return out


def _subparser(name: str) -> argparse.ArgumentParser:
    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def table_problems(table: dict[str, list[str]]) -> list[str]:
    problems = [f"docs/cli.md's table has no row for `halo-sched {c}`" for c in cli.COMMANDS if c not in table]
    problems += [f"docs/cli.md's table shows `halo-sched {c}`, which the CLI does not have" for c in table
                 if c not in cli.COMMANDS]
    for name, synopses in table.items():
        if name not in cli.COMMANDS:
            continue
        shown: dict[str, int] = {}
        for s in synopses:
            shown.update(_options(s))
        known = set()
        for action in _subparser(name)._actions:
            if not action.option_strings or action.dest in ("help", "debug"):
                continue
            known |= set(action.option_strings)
            where = [o for o in action.option_strings if o in shown]
            if not where:
                problems.append(f"`halo-sched {name}`: docs/cli.md does not show {'/'.join(action.option_strings)}")
            elif action.required != (shown[where[0]] == 0):
                problems.append(f"`halo-sched {name}`: docs/cli.md shows {where[0]} "
                                f"{'optional' if shown[where[0]] else 'required'}; the CLI has it "
                                f"{'required' if action.required else 'optional'}")
        problems += [f"`halo-sched {name}`: docs/cli.md shows {o}, which the CLI does not have"
                     for o in shown if o not in known]
    return problems


def test_the_cli_table_has_every_command_and_option_and_none_other():
    assert table_problems(cli_table()) == []


def test_the_table_check_sees_a_missing_command_a_stale_option_and_a_wrong_bracket():
    table = cli_table()
    table.pop("schema")
    table["render"] = ["halo-sched render FILE --backend B [--format hcl|json] [--set KEY.PATH=VALUE]... [--colour]"]
    got = table_problems(table)
    assert "docs/cli.md's table has no row for `halo-sched schema`" in got
    assert "`halo-sched render`: docs/cli.md shows --backend required; the CLI has it optional" in got
    assert "`halo-sched render`: docs/cli.md shows --colour, which the CLI does not have" in got


def test_the_set_row_names_the_commands_that_take_set():
    text = (REPO / "docs" / "cli.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `--set KEY.PATH=VALUE` ("))
    named = set(re.findall(r"`(\w+)`", row[:row.index(")")]))
    takes = {name for name in cli.COMMANDS
             if any("--set" in a.option_strings for a in _subparser(name)._actions)}
    assert named == takes


def test_the_top_level_options_are_in_docs_cli_md():
    text = (REPO / "docs" / "cli.md").read_text()
    for option in ("--version", "--debug"):
        assert re.search(rf"`[^`]*{option}\b[^`]*`", text), option


# ---- where the code sends a reader; what the docs quote ------------------------------------------

POINTER = re.compile(r"(README(?:\.md)?|docs/[\w-]+\.md)[,:]? *\\?\"([^\"\\]+)\\?\"")


def _headings_and_leads(path) -> list[str]:
    text = path.read_text()
    heads = [m.group(1) for m in re.finditer(r"^#{1,6}\s+(.*?)\s*$", text, re.M)]
    leads = [m.group(1) for m in re.finditer(r"\*\*([^*]+)\*\*", text)]
    return heads + leads


def pointer_problems(text: str, where: str) -> list[str]:
    problems = []
    for m in POINTER.finditer(text):
        page = REPO / ("README.md" if m.group(1).startswith("README") else m.group(1))
        name = " ".join(m.group(2).split())  # a pointer a docstring wrapped over two lines
        if not page.exists():
            problems.append(f"{where}: {m.group(0)}: no {page.relative_to(REPO)}")
        elif not any(h.startswith(name) for h in _headings_and_leads(page)):
            problems.append(f"{where}: {m.group(0)}: {page.relative_to(REPO)} has no heading or bold lead {name!r}")
    return problems


def test_every_page_and_heading_the_code_points_to_exists():
    problems = []
    for path in sorted((REPO / "halo_sched").rglob("*")):
        if path.suffix in (".py", ".sh", ".j2") and path.is_file():
            problems += pointer_problems(path.read_text(), str(path.relative_to(REPO)))
    assert problems == []
    assert pointer_problems('(README: "Hangs")', "x"), "the check finds a heading README does not have"


def test_the_schema_points_to_sections_that_exist():
    import json

    from halo_sched.spec import json_schema

    schema = json.dumps(json_schema())
    assert "Hangs" in schema and pointer_problems(schema.replace('\\"', '"'), "the schema") == []


def test_docs_library_md_quotes_what_with_changes_says():
    text = (REPO / "docs" / "library.md").read_text()
    spec = halo_sched.load(REPO / "examples" / "ddp-cpu.yaml")
    for change, intro in (({"slurm.partitoin": "gpu"}, "a misspelt path is an error naming it ("),
                          ({"trainer.args": "x"}, "naming each bad field by its\npath (")):
        at = text.index(intro) + len(intro)
        quoted = re.match(r"`([^`]+)`", text[at:]).group(1)
        with pytest.raises(halo_sched.SpecError) as err:
            halo_sched.with_changes(spec, change)
        assert quoted in str(err.value), (quoted, str(err.value))
