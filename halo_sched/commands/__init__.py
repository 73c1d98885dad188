"""The commands of ``halo-sched``, one module per group; halo_sched/cli.py parses the command line
and runs the one named (its ``COMMANDS`` table says which module holds each), so start-up imports
only that command's module.

Each command is ``cmd_NAME(args, scheduler) -> exit code``: ``args`` is the parsed command line,
``scheduler(backend)`` gives a backend's scheduler (halo_sched.cli passes its ``_scheduler``, which
tests replace). Errors are raised as ``HaloError``; the CLI prints them and exits with their code.

- ``jobfile.py``: commands that read a job file (validate, render, plan, schema, preflight)
- ``wait.py``: submit and watch (waiting for a job's end, a run's retries)
- ``show.py``: status, list and logs (reading jobs)
- ``manage.py``: cancel, nodes (the node ledger) and gc (Nomad secrets)
- ``jobids.py``: which backend each job id went to
"""
