"""The commands that read a job file: ``validate``, ``render``, ``plan``, ``schema`` and
``preflight`` (which runs the bandwidth test as the job would run)."""
from __future__ import annotations

import json
import re
import sys

from . import Progress, json_line, raw, say
from ..errors import UsageError


def load_job(path: str, changes=()):
    """The job file at ``path`` with ``--set``'s changes ((dotted path, value), in order; the last
    of a path wins), made as ``halo_sched.with_changes`` makes them: a bad path or value is a
    SpecError naming it, exit 2. Layout warnings are those of the result."""
    import warnings

    from ..layout import LayoutWarning
    from ..spec import load, with_changes

    if not changes:
        return load(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LayoutWarning)  # said of the changed job, below
        spec = load(path)
    return with_changes(spec, dict(changes), source=f"{path} with --set")


#: "trainer.script (line 5)": a problem's field and its line in the job file.
_WHERE = re.compile(r"^(.*?)(?: \(line (\d+)\))?$", re.S)


def _problem_json(where: str, message: str) -> dict:
    m = _WHERE.match(where or "")
    return {"field": m.group(1), "line": int(m.group(2)) if m.group(2) else None, "message": message}


def cmd_validate(args, scheduler) -> int:
    import warnings

    from ..errors import SpecError
    from ..layout import LayoutWarning
    from ..spec import checked_script

    bad = 0
    for f in args.files:
        s, problem, script_notes = None, None, []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", LayoutWarning)
            try:
                s = load_job(f, args.set)
                script_notes = [f"{f}: {line}" for line in checked_script(s, args.backend).notes]  # as its nodes see it
            except SpecError as err:
                problem = err
        notes = [str(w.message) for w in caught if issubclass(w.category, LayoutWarning)] + script_notes
        for line in notes:
            say(f"halo-sched: warning: {line}")
        if problem is not None:
            bad += 1
            if args.json:
                print(json_line({"file": f, "ok": False, "warnings": notes,
                                 "problems": [_problem_json(where, msg) for where, msg in problem.problems]}))
            else:
                say(str(problem))
            continue
        if args.json:
            print(json_line({"file": f, "ok": True, "name": s.name, "nodes": s.nodes,
                             "nproc_per_node": s.nproc_per_node, "world_size": s.world_size, "warnings": notes}))
        else:
            print(f"{f}: ok ({s.name}: {s.nodes} nodes x {s.nproc_per_node} processes = {s.world_size} ranks)")
    return 2 if bad else 0


def cmd_render(args, scheduler) -> int:
    spec = load_job(args.file, args.set)
    opts = {}
    if args.format:
        if args.backend != "nomad":
            raise UsageError("--format applies to --backend nomad only")
        opts["format"] = args.format
    text = scheduler(args.backend).render(spec, **opts)
    raw(sys.stdout, text if text.endswith("\n") else text + "\n")  # byte for byte what would be submitted
    return 0


def cmd_plan(args, scheduler) -> int:
    spec = load_job(args.file, args.set)
    sched = scheduler(args.backend)
    from ..backends.base import Plans

    if not isinstance(sched, Plans):
        raise UsageError(f"plan asks a scheduler (nomad, slurm); backend {args.backend!r} has no scheduler dry run")
    ok, text = sched.plan(spec)
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return 0 if ok else 1


def cmd_schema(args, scheduler) -> int:
    from ..spec import json_schema

    print(json.dumps(json_schema(), indent=2))
    return 0


def cmd_preflight(args, scheduler) -> int:
    from .. import preflight
    from ..values import parse_size

    spec = load_job(args.file, args.set)
    try:
        size = parse_size(args.size)
    except ValueError as err:
        raise UsageError(f"--size: {err}") from None
    sched = scheduler(args.backend)
    progress = {}

    def on_submit(job_id: str) -> None:
        say(f"halo-sched: preflight of {spec.name} submitted to {args.backend} as {job_id}")
        progress["p"] = Progress(sched, job_id)

    def on_change(state) -> None:
        if not args.quiet and "p" in progress:
            progress["p"].change(state)

    rep = preflight.run(spec, args.backend, size, min_mibps=args.min_mibps, iters=args.iters,
                        timeout=args.timeout, on_change=on_change, on_submit=on_submit)
    if rep.result is None and rep.log_tail:
        say("halo-sched: the test did not report; the job's last lines:")
        for line in rep.log_tail:
            say(f"  {line}")
    if args.json:
        print(preflight.as_json(rep))
    else:
        sys.stdout.write(preflight.format_table(rep))
    return 0 if rep.passed else 1

