"""The commands that read a job file: ``validate``, ``render``, ``plan``, ``schema`` and
``preflight`` (which runs the bandwidth test as the job would run)."""
from __future__ import annotations

import json
import sys

from . import Progress, raw, say
from ..errors import UsageError


def cmd_validate(args, scheduler) -> int:
    from ..errors import SpecError
    from ..spec import checked_script, load

    bad = 0
    for f in args.files:
        try:
            s = load(f)
            notes = checked_script(s, args.backend).notes  # the script, as the backend's nodes see it
        except SpecError as err:
            say(str(err))
            bad += 1
            continue
        for line in notes:
            say(f"halo-sched: warning: {f}: {line}")
        print(f"{f}: ok ({s.name}: {s.nodes} nodes x {s.nproc_per_node} processes = {s.world_size} ranks)")
    return 2 if bad else 0


def cmd_render(args, scheduler) -> int:
    from ..spec import load

    spec = load(args.file)
    opts = {}
    if args.format:
        if args.backend != "nomad":
            raise UsageError("--format applies to --backend nomad only")
        opts["format"] = args.format
    text = scheduler(args.backend).render(spec, **opts)
    raw(sys.stdout, text if text.endswith("\n") else text + "\n")  # byte for byte what would be submitted
    return 0


def cmd_plan(args, scheduler) -> int:
    from ..spec import load

    spec = load(args.file)
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
    from ..spec import load
    from ..values import parse_size

    spec = load(args.file)
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

