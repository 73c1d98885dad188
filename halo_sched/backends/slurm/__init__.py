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
from ..base import DryRun, EndWatch, JobState, JobStatus, Scheduler, missing_output, tail_lines
from ...launch import compile_launch
from .render import render_batch, render_sbatch
from .capabilities import CancelsOnce, Lists, Named, ReadsConfig, ReadsPartitions, SubmitsOnce, TestsOnly

# Ends of one run after which SLURM may requeue the job (sbatch --requeue).
_MAY_REQUEUE = {JobStatus.PREEMPTED, JobStatus.NODE_FAIL}


class _NeverStarts(Exception):
    """Raised inside a wait by a job pending for a reason that never clears."""

    def __init__(self, state: JobState):
        super().__init__(state.reason)
        self.state = state


def _say(msg: str) -> None:
    import sys

    print(f"halo-sched: {msg}", file=sys.stderr, flush=True)


#: ``list``'s query (:meth:`SlurmScheduler.for_listing`): one attempt of each client command, all
#: of them within this many seconds. Slurm 22.05's squeue and sacct take no timeout of their own
#: (src/squeue/opts.c, src/sacct/options.c: no such option); against a stopped slurmctld squeue
#: waits MessageTimeout (10 s by default) before it fails, and a healthy one answers in well
#: under a second, so the command is cut here and the rows show their last known states.
LIST_ASK_S = 2.0

#: ``submit`` reads the partition limits first (a job that can never fit is refused, not queued);
#: one attempt, cut after this many seconds. A controller that does not answer must not hold the
#: submit silently (scontrol waits out MessageTimeout, then the transport retries): the check is
#: skipped with one line saying so, and the exactly-once submit that follows says each retry.
SUBMIT_CHECK_S = 5.0


class SlurmScheduler(Scheduler):
    name = "slurm"

    def __init__(self, transport=None, transport_name: str | None = None):
        self._transport = transport
        self._list_bound: float | None = None  # for_listing(): the whole query's bound
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
        launch = compile_launch(dryrun.spec)
        problems, checked = self.partition_problems(dryrun.spec, launch.cluster, bound_s=SUBMIT_CHECK_S)
        if checked.startswith("unchecked: could not read"):
            _say(f"partition limits {checked}; submitting without that check")
        problems += output_problems(launch.output, self._via())[0]
        if problems:
            from ...errors import SpecError

            raise SpecError(problems, dryrun.spec.job_file.path if dryrun.spec.job_file else None)
        for line in self.preemption_check(dryrun.spec):
            _say(f"warning: {line}")
        try:
            return self._submit(dryrun, dryrun.text, extra)
        except HaloError as err:
            ledgered = launch.exclude_hosts("slurm")
            if not ledgered or "Invalid node name" not in str(err):
                raise
        # sbatch refused the whole job over a node name it does not know (slurmctld "Invalid node
        # name specified": nothing was submitted): a ledger entry of another cluster, or a node
        # since removed. The node ledger never stops a job: submit it without the exclusion.
        _say(f"warning: SLURM does not know a host of the node ledger ({', '.join(ledgered)}); submitting "
             "without the ledger's --exclude (`halo-sched nodes clear HOST` forgets one)")
        text = render_batch(compile_launch(dryrun.spec, exclude_hosts=()))
        return self._submit(dryrun, text, extra)

    def _submit(self, dryrun: DryRun, text: str, extra: list[str]) -> str:
        if not isinstance(self.transport, SubmitsOnce):  # slurmrestd, pyslurm: one attempt
            return self.transport.submit(text, extra)
        return self.transport.submit_once(text, extra, token=dryrun.token, retry_s=self.retry_s, on_retry=_say)

    def preemption_check(self, spec: JobSpec) -> list[str]:
        """Lines saying why the job's ``slurm.signal`` warning will not come when the cluster
        preempts it, from ``scontrol show config`` (preemption.py); none without slurm.signal
        (then nothing is asked) or where the cluster sends it."""
        if spec.slurm.signal is None:
            return []
        from .preemption import parse_config, preemption_notes

        try:
            text = self._show_config(compile_launch(spec).cluster)
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

        launch = compile_launch(spec)
        script = render_batch(launch)
        # What submit refuses (exit 2, naming the field), refused here the same way.
        problems, checked = self.partition_problems(spec, launch.cluster)
        out_problems, out_checked = output_problems(launch.output, self._via())
        if problems or out_problems:
            from ...errors import SpecError

            raise SpecError(problems + out_problems, spec.job_file.path if spec.job_file else None)
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
        lines.append(f"  partition limits: {checked}")
        lines.append(f"  output file: {out_checked}")
        try:
            text = self._show_config(launch.cluster)
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

    def _partitions(self, cluster: str | None, bound_s: float | None = None) -> tuple[list[dict], list[dict]] | None:
        transport = self.transport
        if not isinstance(transport, ReadsPartitions):
            return None
        if bound_s is None:
            return transport.partitions(cluster)
        from ...retry import within

        if isinstance(transport, Lists):  # one attempt of each call
            transport = transport.for_listing()
        started = time.monotonic()
        try:
            with within(bound_s):
                return transport.partitions(cluster)
        except HaloError as err:
            if time.monotonic() - started >= bound_s - 0.5:
                raise SchedulerError(f"SLURM did not answer within {bound_s:g} s") from err
            raise

    def partition_problems(self, spec: JobSpec, cluster: str | None,
                           bound_s: float | None = None) -> tuple[list[tuple[str, str]], str]:
        """(field, why) for each way the job exceeds its partition's limits (MaxNodes, the nodes
        it has, MaxTime, the CPUs and memory of its nodes: SLURM would queue such a job and keep
        it pending forever), and a line saying what was checked. Nothing where the transport
        cannot read the partitions (the line says so) or the cluster does not answer (within
        ``bound_s``, one attempt, where given)."""
        from .reasons import limit_problems, partition_limits
        from .render import cpus_per_task
        from ...values import parse_slurm_mem, parse_slurm_time

        try:
            got = self._partitions(cluster, bound_s)
        except HaloError as err:
            return [], f"unchecked: could not read the partitions: {_one_line(err)}"
        if got is None:
            return [], f"unchecked: the {self._via()} transport cannot read the cluster's partitions"
        parts, nodes = got
        name = spec.slurm.partition
        part = next((p for p in parts if p.get("PartitionName") == name), None) if name else next(
            (p for p in parts if (p.get("Default") or "").upper() == "YES"), None)
        if part is None:  # sbatch names an unknown partition itself
            return [], f"unchecked: no partition {name or '(default)'} among {', '.join(p.get('PartitionName', '') for p in parts)}"
        limits = partition_limits(part, nodes)
        cpus = cpus_per_task(spec)
        problems = limit_problems(
            limits, nodes=spec.all_nodes,
            time_s=parse_slurm_time(spec.slurm.time) if spec.slurm.time else None, time_text=spec.slurm.time,
            cpus_per_task=cpus, mem_mb=parse_slurm_mem(spec.slurm.mem) if spec.slurm.mem else None,
            cpus_field="slurm.cpus_per_task" if spec.slurm.cpus_per_task is not None else
            f"slurm.cpus_per_task (unset: {cpus} for nproc_per_node {spec.nproc_per_node})",
            nodes_field="nodes" if spec.all_nodes == spec.nodes else "nodes (with the servers' nodes)")
        fmt = lambda v, unit="": "unlimited" if v is None else f"{v}{unit}"  # noqa: E731
        checked = (f"partition {limits['name']}: at most {fmt(min([x for x in (limits['max_nodes'], limits['total_nodes']) if x is not None], default=None))} nodes, "
                   f"time {limits['max_time'] or 'unlimited'}, {fmt(limits['cpus_per_node'])} CPUs and "
                   f"{fmt(limits['mem_mb'], 'M')} memory per node")
        return problems, ("ok: " if not problems else "") + checked

    def _show_config(self, cluster: str | None) -> str | None:
        """``scontrol show config`` of ``cluster`` (the job's ``slurm.clusters``, None for the
        default); None where the transport cannot read it (a stand-in transport may have no way)."""
        if not isinstance(self.transport, ReadsConfig):
            return None
        return self.transport.show_config(cluster)

    def for_listing(self) -> "SlurmScheduler":
        """``list``: one attempt of each client command, LIST_ASK_S for the whole query, the
        cause in one short line when SLURM did not answer (the transport's ``for_listing``; one
        that has none is used as it is)."""
        if not isinstance(self.transport, Lists):
            return self
        listing = SlurmScheduler(transport=self.transport.for_listing())
        listing._watcher_key = self._watcher_key
        listing._list_bound = LIST_ASK_S
        return listing

    def query(self, ids: Sequence[str]) -> dict[str, JobState]:
        if self._list_bound is None:
            return self._query(ids)
        from ...outage import is_outage
        from ...retry import within

        try:
            with within(self._list_bound):
                return self._query(ids)
        except SchedulerError as err:
            if not is_outage(err):
                raise
            cause = " ".join(str(err.__cause__ or err).split())
            cause = re.sub(r"^(?:[a-z]+: (?:error: )?)+", "", cause)
            cause = cause if len(cause) <= 80 else cause[:77] + "..."
            raise SchedulerError(f"SLURM did not answer within {self._list_bound:g} s ({cause})") from err

    def _query(self, ids: Sequence[str]) -> dict[str, JobState]:
        states = self.transport.query(list(ids))
        for job_id, state in states.items():
            if state.status in _MAY_REQUEUE and state.slurm is not None and state.slurm.source == "sacct":
                states[job_id] = self._live(job_id, state)
        for job_id, state in states.items():
            if state.status is JobStatus.FAILED and state.reason.startswith("JobLaunchFailure"):
                cause = self._launch_cause(job_id)
                if cause:
                    state.reason = state.reason[:-1] + f"; slurmd's log: {cause})"
        for job_id, state in states.items():
            if state.status is JobStatus.FAILED:
                # Which rank failed first: the failure lines the nodes wrote into the output file.
                # (Imported here, when a job failed: render and submit need none of it, 10 ms.)
                from ...node.failures import report_from_files

                state.failure = report_from_files(self._outputs(job_id, ask=False))
            elif state.status is JobStatus.RUNNING:  # the slowest rank, from the nodes' copies (progress.py)
                from .progress import stragglers_line

                state.progress = stragglers_line(self._outputs(job_id, ask=False), job_id)
        return states

    def _launch_cause(self, job_id: str) -> str:
        """slurmd's own words on why a batch script did not launch (``[ID.batch] error: Could
        not open stdout file ...``), from its log (``SlurmdLogFile`` of ``scontrol show config``,
        ``%n``/``%h`` the job's batch host) where this host can read it; else empty. Once per job."""
        cache = self.__dict__.setdefault("_launch_causes", {})
        if job_id in cache:
            return cache[job_id]
        cache[job_id] = ""
        from .transport.base import split_cluster

        try:
            cluster, local = split_cluster(job_id)
            if not isinstance(self.transport, ReadsConfig):
                return ""
            config = self.transport.show_config(cluster) or ""
            m = re.search(r"^SlurmdLogFile\s*=\s*(\S+)", config, re.M)
            host = self.transport.job_info(job_id).get("BatchHost") or ""
        except (HaloError, KeyError, TypeError):
            return ""
        if not m or m.group(1) == "(null)" or (("%n" in m.group(1) or "%h" in m.group(1)) and not host):
            return ""
        path = Path(m.group(1).replace("%n", host).replace("%h", host))
        try:
            with open(path, "rb") as f:
                f.seek(max(0, path.stat().st_size - 4 * 1024 * 1024))
                text = f.read().decode("utf-8", "replace")
        except OSError:
            return ""
        mark = f"[{local.split('_')[0]}.batch] error: "
        lines = [ln.split(mark, 1)[1].strip() for ln in text.splitlines() if mark in ln]
        cache[job_id] = "; ".join(dict.fromkeys(lines[:3]))[:300]
        return cache[job_id]

    def record_fields(self, dryrun: DryRun, job_id: str) -> dict:
        """For the job record: the output file as an absolute path, and the cluster (sbatch -M)."""
        cluster, _, num = job_id.rpartition(":")
        out = _expand_output(compile_launch(dryrun.spec).output, dryrun.spec.name, num)
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

    def wait(self, job_id: str, timeout: float | None = None, poll: float = 1.0, max_poll: float = 30.0,
             on_change=None, on_tick=None, outage_s: float | None = None, on_outage=None) -> JobState:
        """Until the job ends; a job pending for a reason that can never clear (reasons.py:
        PartitionNodeLimit, DependencyNeverSatisfied, ...) is cancelled at once and the wait ends
        CANCELLED with what to change in the job file (``verdict``)."""
        from .reasons import never_clears  # not on the render path

        def tick(state: JobState) -> None:
            if on_tick is not None:
                on_tick(state)
            if state.status is JobStatus.PENDING and never_clears(state.reason):
                raise _NeverStarts(state)

        try:
            return super().wait(job_id, timeout=timeout, poll=poll, max_poll=max_poll, on_change=on_change,
                                on_tick=tick, outage_s=outage_s, on_outage=on_outage)
        except _NeverStarts as stop:
            return self.end_impossible(job_id, stop.state)

    def end_impossible(self, job_id: str, state: JobState) -> JobState:
        """Cancel a job that can never start; its state, CANCELLED, saying why and what to change."""
        from dataclasses import replace

        from ..watcher import watcher_for
        from .reasons import explain
        from .transport.base import split_cluster

        try:
            job = self.transport.job_info(job_id)
        except (HaloError, KeyError, TypeError):
            job = {}
        part, nodes = None, []
        try:
            got = self._partitions(split_cluster(job_id)[0])
        except HaloError:
            got = None
        if got is not None:
            parts, nodes = got
            part = next((p for p in parts if p.get("PartitionName") == job.get("Partition")), None)
        why = explain(state.reason, job, part, nodes)
        try:
            self.cancel([job_id])
            done = "cancelled it"
        except HaloError as err:
            done = f"cancelling it failed ({_one_line(err)}): halo-sched cancel {job_id}"
        watcher_for(self).forget(job_id)
        return replace(state, status=JobStatus.CANCELLED, raw_state="CANCELLED", nodes_running=None,
                       verdict=f"can never start: {why}; {done}")

    def cancel(self, ids: Sequence[str], signal: str | None = None, **opts) -> dict[str, str]:
        """Cancel (or, with ``signal``, warn) jobs. Returns the ids that had already ended, with
        their state in words: scancel of an ended job succeeds silently, so they are asked first
        (one query); they are not sent to scancel."""
        ids = list(ids)
        ended: dict[str, str] = {}
        if not signal:
            try:
                states = self.transport.query(ids)
            except HaloError:
                states = {}
            ended = {i: st.describe() for i, st in states.items() if st.status.terminal}
            ids = [i for i in ids if i not in ended]
        if not ids:
            return ended
        # With a signal: the batch script gets it (as it gets slurm.signal's warning) and
        # forwards it to every rank; see halo_sched/templates/slurm/sbatch.sh.j2.
        if signal or not isinstance(self.transport, CancelsOnce):
            self.transport.cancel(ids, signal=signal)
        else:
            self.transport.cancel_once(ids, retry_s=self.retry_s, on_retry=_say)
        return ended

    def progress(self, state: JobState) -> str:
        if state.status is JobStatus.PENDING and not state.verdict:
            return self._pending_words(state)
        run = f", run {state.restarts + 1}" if state.restarts else ""
        nodelist = state.slurm.nodelist if state.slurm is not None else None
        if state.status.value == "RUNNING" and state.nodes_total:
            return f"RUNNING on {state.nodes_total} node{'s' if state.nodes_total != 1 else ''}" + (
                f" ({nodelist})" if nodelist else "") + run + (f" ({state.progress})" if state.progress else "")
        return state.describe()

    def _pending_words(self, state: JobState) -> str:
        """``PENDING for 1m05s: waiting for resources (nodes busy) (Resources): needs 1 node, 1 CPU;
        1 of 3 nodes idle, 0 CPUs free; expected start 12:51:03``."""
        from .reasons import in_words, reason_word

        d = state.slurm
        head = "PENDING"
        waited = _since(d.submitted if d is not None else None)
        if waited:
            head += f" for {waited}"
        words = in_words(state.reason) or "waiting to be scheduled"
        parts = [words]
        word = reason_word(state.reason)
        if word == "Dependency" and d is not None and d.dependency:
            parts.append(f"waits for {_dependency_words(d.dependency)}")
        elif word == "Resources":
            need = self._resources(state)
            if need:
                parts.append(need)
        if d is not None and d.expected_start:
            parts.append(f"expected start {d.expected_start.replace('T', ' ')} (squeue --start)")
        if state.restarts:
            parts.append(f"run {state.restarts + 1}")
        return f"{head}: " + "; ".join(parts)

    def _resources(self, state: JobState) -> str:
        """What a job pending for Resources needs, and what its partition has free (read once per
        job and reason, at most once a minute)."""
        cache = self.__dict__.setdefault("_need_cache", {})
        key = (state.id, state.reason)
        hit = cache.get(key)
        if hit is not None and time.monotonic() - hit[0] < 60:
            return hit[1]
        text = ""
        try:
            job = self.transport.job_info(state.id)
            got = self._partitions((state.slurm.cluster if state.slurm else None))
        except (HaloError, KeyError, TypeError):
            got = None
        if got is not None:
            from .reasons import _num

            want_nodes, want_cpus = _num(job.get("NumNodes")), _num(job.get("NumCPUs"))
            part = job.get("Partition")
            mine = [n for n in got[1] if part in (n.get("Partitions") or "").split(",")]
            idle = sum(1 for n in mine if (n.get("State") or "").upper().startswith("IDLE"))
            free = sum(max(0, (_num(n.get("CPUTot")) or 0) - (_num(n.get("CPUAlloc")) or 0)) for n in mine
                       if not re.match(r"(DOWN|DRAIN|FAIL|MAINT|RESERVED)", (n.get("State") or "").upper()))
            if want_nodes is not None:
                text = (f"needs {want_nodes} node{'s' if want_nodes != 1 else ''}"
                        + (f", {want_cpus} CPU{'s' if want_cpus != 1 else ''}" if want_cpus is not None else "")
                        + f"; partition {part} has {idle} of {len(mine)} nodes idle, {free} CPUs free")
        cache[key] = (time.monotonic(), text)
        return text

    def logs(self, job_id: str, follow: bool = False) -> Iterator[str]:
        """The job's output file (srun --label prefixes each line with its node rank). All nodes
        write into that one file; ``halo-sched logs --node K`` splits it on read."""
        paths = self._outputs(job_id)
        if not paths:
            raise SchedulerError(f"SLURM does not report an output file for job {job_id} (is it too old?)")
        if not follow:
            for path in paths:
                yield from _read(Path(path), False, lambda: True, lambda: self.query([job_id])[job_id])
            return
        # Following: the job's end comes from squeue/sacct in the background, so the file (on
        # the shared filesystem) is read and shown on while slurmctld is unreachable.
        ended = EndWatch(self.name, job_id, lambda: self.query([job_id])[job_id])
        try:
            for path in paths:
                yield from _read(Path(path), follow, ended, lambda: self.query([job_id])[job_id])
        finally:
            ended.close()


def _one_line(err: object) -> str:
    return " ".join(str(err).split())


def _since(stamp: str | None) -> str:
    """How long ago a SLURM time (``2026-12-01T12:25:13``, the controller's local time) was:
    ``1m05s``; empty when unknown."""
    import datetime as dt

    if not stamp:
        return ""
    try:
        then = dt.datetime.fromisoformat(stamp)
    except ValueError:
        return ""
    secs = int((dt.datetime.now() - then).total_seconds())
    if secs < 0:
        return ""
    if secs < 60:
        return f"{secs}s"
    if secs < 3600:
        return f"{secs // 60}m{secs % 60:02d}s"
    return f"{secs // 3600}h{secs % 3600 // 60:02d}m"


def _dependency_words(dep: str) -> str:
    """``afterany:620(unfulfilled),afterok:7(failed)`` -> ``job 620 to end (afterany, unfulfilled),
    job 7 to complete (afterok, failed)``."""
    kinds = {"after": "to start", "afterany": "to end", "afterok": "to complete", "afternotok": "to fail",
             "aftercorr": "to end (same task)", "afterburstbuffer": "to end", "singleton": ""}
    out = []
    for m in re.finditer(r"(\w+):([\d_+:]+?)(?:\+\d+)?(?:\((\w+)\))?(?=,|\?|$)", dep):
        kind, ids, how = m.group(1), m.group(2), m.group(3)
        for job in ids.split(":"):
            out.append(f"job {job} {kinds.get(kind, '')}".rstrip() + f" ({kind}{', ' + how if how else ''})")
    if dep.startswith("singleton"):
        out.append("the other jobs of its name and user to end (singleton)")
    return ", ".join(out) or dep


def output_problems(output: str, via: str) -> tuple[list[tuple[str, str]], str]:
    """(field, why) when the job's output file (``output``, the plan's sbatch ``--output``
    pattern; relative to the submit directory, as sbatch resolves it; job files cannot move it)
    cannot be created: its directory missing or not writable by this user. SLURM would accept
    the job and fail it at launch (``FAILED exit=181 reason=JobLaunchFailure``; slurmd's log
    holds the cause). Checked on this host, which sees the cluster's filesystem for the cli and
    pyslurm transports (they run on a submit host); the rest transport's slurmrestd may not."""
    if via == "rest":
        return [], "unchecked: slurmrestd may run on a host that does not share this one's filesystem"
    try:
        directory = Path(_expand_output(os.path.abspath(output), "x", "1")).parent
    except FileNotFoundError:  # the submit directory itself was removed
        return [("submit directory", "the current directory no longer exists: submit from another one")], "not checked"
    why = "(the job would end FAILED at launch, JobLaunchFailure)"
    if not directory.is_dir():
        return [("submit directory", f"output path {output}: directory {directory} does not exist {why}: create it "
                                     "or submit from another directory")], f"checked {directory}"
    if not os.access(directory, os.W_OK | os.X_OK):
        return [("submit directory", f"output path {output}: directory {directory} is not writable by this user "
                                     f"{why}: submit from a writable directory")], f"checked {directory}"
    return [], f"ok: writable {directory}"


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
