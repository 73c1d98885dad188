"""The SLURM backend: render (``render.py``), talk to SLURM through a transport
(``transport.py``: sbatch/squeue/sacct/scontrol/scancel by default; slurmrestd or pyslurm on
request), parse what it says (``status.py``). This class only joins them.
"""
from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Iterator, Sequence

from ...errors import HaloError, SchedulerError
from ...models import JobSpec
from ..base import DryRun, JobState, JobStatus, Scheduler, missing_output, tail_lines
from .render import render_sbatch
from .capabilities import CancelsOnce, Named, ReadsConfig, SubmitsOnce, TestsOnly

# Ends of one run after which SLURM may requeue the job (sbatch --requeue).
_MAY_REQUEUE = {JobStatus.PREEMPTED, JobStatus.NODE_FAIL}


def _say(msg: str) -> None:
    import sys

    print(f"halo-sched: {msg}", file=sys.stderr, flush=True)


class SlurmScheduler(Scheduler):
    name = "slurm"

    def __init__(self, transport=None, transport_name: str | None = None):
        self._transport = transport
        self._transport_name = transport_name or os.environ.get("HALO_SLURM_TRANSPORT", "cli")
        # Handles on schedulers of one transport share one watcher (one squeue/sacct per poll);
        # without a transport object, those that reach the same cluster the same way.
        self._watcher_key = ("slurm", transport) if transport is not None else (
            "slurm", self._transport_name,
            *(os.environ.get(k) for k in ("SLURM_CONF", "HALO_SLURMRESTD_URL", "HALO_SLURMRESTD_SOCKET")))

    def watcher_key(self):
        return self._watcher_key

    @property
    def transport(self):
        if self._transport is None:
            from .transport import get_transport

            self._transport = get_transport(self._transport_name)
        return self._transport

    def render(self, spec: JobSpec, **opts) -> str:
        return render_sbatch(spec)

    def schedule(self, dryrun: DryRun) -> str:
        # secret_env: the values travel in sbatch's environment, by name, never in the script.
        # --export=ALL on the command line wins over a user's SBATCH_EXPORT=NONE, which would
        # drop them (srun's tasks then inherit the batch step's environment).
        extra = ["--export=ALL"] if dryrun.spec.secret_values() else []
        for line in self.preemption_check(dryrun.spec, dryrun.text):
            _say(f"warning: {line}")
        if not isinstance(self.transport, SubmitsOnce):  # slurmrestd, pyslurm: one attempt
            return self.transport.submit(dryrun.text, extra)
        return self.transport.submit_once(dryrun.text, extra, token=dryrun.token, retry_s=self.retry_s,
                                          on_retry=_say)

    def preemption_check(self, spec: JobSpec, script: str) -> list[str]:
        """Lines saying why the job's ``slurm.signal`` warning will not come when the cluster
        preempts it, from ``scontrol show config`` (preemption.py); none without slurm.signal
        (then nothing is asked) or where the cluster sends it."""
        if spec.slurm.signal is None:
            return []
        from .preemption import parse_config, preemption_notes

        try:
            text = self._show_config(script)
        except HaloError as err:
            return [f"could not read the cluster's configuration to check that preemption sends slurm.signal's "
                    f"warning: {err}"]
        if text is None:
            return [f"the {self._via()} transport cannot read the cluster's configuration: whether "
                    "preemption sends slurm.signal's warning is unchecked (`scontrol show config`: "
                    "PreemptParameters=send_user_signal, or SlurmctldParameters=preempt_send_user_signal before 23.02)"]
        return preemption_notes(spec, parse_config(text))

    def _via(self) -> str:
        """The transport's name, for a message."""
        return (self.transport.name if isinstance(self.transport, Named) else "") or "this"

    def plan(self, spec: JobSpec) -> tuple[bool, str]:
        """``halo-sched plan --backend slurm``: submits nothing. Whether SLURM would take the job
        as rendered (``sbatch --test-only``: when and where it would start, or why not), and the
        cluster's preemption settings against ``slurm.signal``. (False, text) when SLURM would
        refuse the job."""
        from .preemption import describe, parse_config, preemption_notes

        script = render_sbatch(spec)
        lines = [f"Plan for job {spec.name!r} on SLURM ({self._via()} transport), {spec.all_nodes} "
                 f"node{'s' if spec.all_nodes != 1 else ''}:"]
        ok = True
        try:
            tested = self.transport.test_only(script) if isinstance(self.transport, TestsOnly) else None
        except HaloError as err:
            tested = (False, str(err))
        if tested is None:
            lines.append(f"  placement: not checked (the {self._via()} transport has no sbatch --test-only)")
        else:
            ok = tested[0]
            lines.append(f"  placement: {'ok' if ok else 'REFUSED'}: {tested[1]}")
        try:
            text = self._show_config(script)
        except HaloError as err:
            text, why = None, f"could not read it: {err}"
        else:
            why = f"the {self._via()} transport cannot read it"
        if text is None:
            lines.append(f"  configuration: {why}")
        else:
            config = parse_config(text)
            lines.append(f"  {describe(config)}")
            notes = preemption_notes(spec, config)
            if spec.slurm.signal is None:
                lines.append("  slurm.signal: none (a preempted or timed-out job gets no warning)")
            elif not notes:
                lines.append(f"  slurm.signal {spec.slurm.signal}: sent before the time limit and when preempted")
            lines += [f"  warning: {n}" for n in notes]
        return ok, "\n".join(lines)

    def _show_config(self, script: str) -> str | None:
        """``scontrol show config`` of the cluster ``script`` names; None where the transport
        cannot read it (a stand-in transport may have no way)."""
        if not isinstance(self.transport, ReadsConfig):
            return None
        return self.transport.show_config(_cluster_of(script))

    def query(self, ids: Sequence[str]) -> dict[str, JobState]:
        from ...node.failures import report_from_files  # not on the render path (start-up memory)

        states = self.transport.query(list(ids))
        for job_id, state in states.items():
            if state.status in _MAY_REQUEUE and state.slurm is not None and state.slurm.source == "sacct":
                states[job_id] = self._live(job_id, state)
        for job_id, state in states.items():
            if state.status is JobStatus.FAILED:
                # Which rank failed first: the failure lines the nodes wrote into the output file.
                state.failure = report_from_files(self._outputs(job_id, ask=False))
        return states

    def record_fields(self, dryrun: DryRun, job_id: str) -> dict:
        """For the job record: the output file as an absolute path, and the cluster (sbatch -M)."""
        cluster, _, num = job_id.rpartition(":")
        m = re.search(r"^#SBATCH --output=(.*)$", dryrun.text, re.M)
        out = _expand_output(m.group(1) if m else "slurm-%j.out", dryrun.spec.name, num)
        return {"outputs": [out], "scheduler": {"cluster": cluster or None}}

    def _outputs(self, job_id: str, ask: bool = True) -> list[str]:
        """The job's output files: from its record (known after SLURM forgot the job), else, with
        ``ask``, from ``scontrol show job``."""
        from ...records import find

        for rec in find(job_id, self.name):
            if rec.get("outputs"):
                return list(rec["outputs"])
        if not ask:
            return []
        info = self.transport.job_info(job_id)
        return [p for p in dict.fromkeys([info.get("StdOut"), info.get("StdErr")]) if p]

    def _live(self, job_id: str, state: JobState) -> JobState:
        """sacct records a requeued run's end (PREEMPTED, NODE_FAIL) before the job is pending
        again; slurmctld itself shows such a job as REQUEUED/PENDING at once, so ask it."""
        from .status import scontrol_job_state

        try:
            live = scontrol_job_state(self.transport.job_info(job_id))
        except (SchedulerError, KeyError, TypeError):
            return state
        return live if not live.status.terminal and live.status is not JobStatus.UNKNOWN else state

    def cancel(self, ids: Sequence[str], signal: str | None = None, **opts) -> None:
        # With a signal: the batch script gets it (as it gets slurm.signal's warning) and
        # forwards it to every rank; see halo_sched/templates/slurm/sbatch.sh.j2.
        if signal or not isinstance(self.transport, CancelsOnce):
            self.transport.cancel(list(ids), signal=signal)
        else:
            self.transport.cancel_once(list(ids), retry_s=self.retry_s, on_retry=_say)

    def progress(self, state: JobState) -> str:
        run = f", run {state.restarts + 1}" if state.restarts else ""
        nodelist = state.slurm.nodelist if state.slurm is not None else None
        if state.status.value == "RUNNING" and state.nodes_total:
            return f"RUNNING on {state.nodes_total} node{'s' if state.nodes_total != 1 else ''}" + (
                f" ({nodelist})" if nodelist else "") + run
        return state.describe()

    def logs(self, job_id: str, follow: bool = False) -> Iterator[str]:
        """The job's output file (srun --label prefixes each line with its node rank). All nodes
        write into that one file; ``halo-sched logs --node K`` splits it on read."""
        paths = self._outputs(job_id)
        if not paths:
            raise SchedulerError(f"SLURM does not report an output file for job {job_id} (is it too old?)")
        for path in paths:
            yield from _read(Path(path), follow, lambda: self.query([job_id])[job_id].status.terminal,
                             lambda: self.query([job_id])[job_id])


def _cluster_of(script: str) -> str | None:
    """The one cluster a script names (``--clusters=NAME``), else None (the local one)."""
    from .transport.base import sbatch_options

    names = [v for k, v in sbatch_options(script) if k in ("clusters", "cluster", "M") and v]
    return names[-1] if names and "," not in names[-1] else None


def _expand_output(pattern: str, name: str, job_id: str) -> str:
    """sbatch's filename pattern for this job (the %-codes a job file can use), made absolute."""
    codes = {"j": job_id, "x": name, "u": os.environ.get("USER", ""), "%": "%", "A": job_id, "a": ""}
    text = re.sub(r"%(\d*)([jxuAa%])", lambda m: codes[m.group(2)].zfill(int(m.group(1) or 0)), pattern)
    return str(Path(text) if os.path.isabs(text) else Path.cwd() / text)


def _read(path: Path, follow: bool, finished, state_of=None) -> Iterator[str]:
    deadline = time.monotonic() + 30
    while not path.exists():
        if not follow or finished() or time.monotonic() > deadline:
            try:
                state = state_of() if state_of is not None else None
            except HaloError:
                state = None
            raise SchedulerError(f"{missing_output(path, state)}; logs are read on the submitting host's filesystem")
        time.sleep(0.5)
    yield from tail_lines(path, follow, finished)
