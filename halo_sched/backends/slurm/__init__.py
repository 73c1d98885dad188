"""The SLURM backend: render (``render.py``: the typed sbatch request of ``request.py`` and its
script), talk to SLURM through a transport
(``transport/``: sbatch/squeue/sacct/scontrol/scancel by default; slurmrestd or pyslurm on
request), parse what it says (``status.py``). This class only joins them with:

- ``checks.py``: what submit and plan check first (partition limits, preemption settings) and
  the plan's report;
- ``outputs.py``: the job's output file (can it be created, which files, reading them) and
  slurmd's words when the batch script did not launch;
- ``pending.py``: a pending job's progress words, and cancelling one that can never start
  (``reasons.py`` says which reasons never clear).
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Sequence

from ...errors import HaloError, SchedulerError
from ..base import DryRun, EndWatch, Scheduler
from ...launch import compile_launch
from .render import batch_request, render_sbatch
from .request import SbatchRequest
from .capabilities import CancelsOnce, Lists, SubmitsOnce

if TYPE_CHECKING:  # pragma: no cover
    from ...models import JobSpec
    from ...jobstate import JobState

__all__ = ["LIST_ASK_S", "SUBMIT_CHECK_S", "SlurmScheduler", "output_problems"]


def __getattr__(name: str):
    """``output_problems`` (outputs.py) is importable from here too, without putting outputs.py
    on the render path: it is imported when first asked for."""
    if name == "output_problems":
        from .outputs import output_problems

        return output_problems
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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

    def dryrun(self, spec: JobSpec, **opts) -> DryRun:
        """The dry run's ``payload`` is the typed sbatch request (request.py), ``text`` its script."""
        from ... import ledger

        request = batch_request(compile_launch(spec, ledgered=ledger.exclusions(), backend="slurm"))
        return DryRun(self.name, spec, request.script, payload=request)

    def schedule(self, dryrun: DryRun) -> str:
        from . import checks  # checks.py, outputs.py and pending.py: not on the render path
        from .outputs import output_problems

        from ... import ledger

        launch = compile_launch(dryrun.spec, ledgered=ledger.exclusions(), backend="slurm")
        problems, checked = checks.partition_problems(self.transport, dryrun.spec, launch.cluster,
                                                      bound_s=SUBMIT_CHECK_S)
        if checked.startswith("unchecked: could not read"):
            _say(f"partition limits {checked}; submitting without that check")
        problems += output_problems(launch.output, checks.transport_name(self.transport))[0]
        if problems:
            from ...errors import SpecError

            raise SpecError(problems, dryrun.spec.job_file.path if dryrun.spec.job_file else None)
        for line in self.preemption_check(dryrun.spec):
            _say(f"warning: {line}")
        request = dryrun.payload if isinstance(dryrun.payload, SbatchRequest) else batch_request(launch)
        try:
            job_id = self._submit(dryrun, request)
        except HaloError as err:
            ledgered = launch.exclude_hosts("slurm")
            if not ledgered or "Invalid node name" not in str(err):
                raise
            # sbatch refused the whole job over a node name it does not know (slurmctld "Invalid node
            # name specified": nothing was submitted): a ledger entry of another cluster, or a node
            # since removed. The node ledger never stops a job: submit it without the exclusion.
            _say(f"warning: SLURM does not know a host of the node ledger ({', '.join(ledgered)}); submitting "
                 "without the ledger's --exclude (`halo-sched nodes clear HOST` forgets one)")
            request = batch_request(compile_launch(dryrun.spec, backend="slurm"))
            job_id = self._submit(dryrun, request)
        if dryrun.spec.retry is not None:
            self.__dict__.setdefault("_guardians", {})[job_id] = self._submit_guardian(dryrun.spec, request, job_id)
        return job_id

    def _submit_guardian(self, spec: JobSpec, request: SbatchRequest, job_id: str) -> str | None:
        """The guardian of attempt ``job_id`` of a run (halo_sched/node/guardian.py): a one-CPU job
        pending until the attempt ends other than COMPLETED, which carries the run on if the
        attempt lost its batch host. Submitted in the attempt's environment (its failure key and
        secret_env by name, as the attempt's: the guardian submits the next attempt with it).
        Its id, or None (said: the run then stops at a lost batch host)."""
        from ...node.successor import guardian_script, options
        from ...sbatch_options import OPTIONS, Setting
        from .outputs import expand_output
        from .render import successor_args

        try:
            cluster, _, num = job_id.rpartition(":")
            launch = compile_launch(spec, backend="slurm")
            succ = successor_args(spec, request) or {}
            args = [str(spec.retry.attempts), succ.get("on", ""), succ.get("run_id") or num,
                    str(launch.restart_count), succ.get("excluded", ""), succ.get("kept_off", "")]
            out_dir = os.path.dirname(expand_output(launch.output, spec.name, num))
            # Typed as the job's own options are (render.py): the output's directory may hold spaces.
            settings = [Setting(name, OPTIONS[name].kind.parse(value)) for name, _, value in
                        (o[2:].partition("=") for o in options(num, out_dir, request.get("partition") or "",
                                                                 request.get("account") or "",
                                                                 request.get("qos") or ""))]
            if request.get("clusters"):
                settings.append(Setting("clusters", request.get("clusters")))
            if request.has("export"):
                settings.append(Setting("export", request.get("export")))
            guard = SbatchRequest(options=tuple(settings), secret_names=request.secret_names,
                                  script=guardian_script(request.script.encode(), num, args).decode())
            return self.transport.submit(guard)
        except (HaloError, ValueError, TypeError, KeyError, OSError) as err:  # the job is submitted: never lose it
            _say(f"warning: job {job_id}: its guardian was not submitted ({' '.join(str(err).split())[:300]}): "
                 "should the job lose the host its batch script runs on, the run stops at this attempt "
                 "(docs/recovery.md, \"A node lost outright\")")
            return None

    def _submit(self, dryrun: DryRun, request: SbatchRequest) -> str:
        if not isinstance(self.transport, SubmitsOnce):  # slurmrestd, pyslurm: one attempt
            return self.transport.submit(request)
        return self.transport.submit_once(request, token=dryrun.token, retry_s=self.retry_s, on_retry=_say)

    def preemption_check(self, spec: JobSpec) -> list[str]:
        """Why the job's ``slurm.signal`` warning will not come when the cluster preempts it
        (checks.py); nothing is asked without slurm.signal."""
        if spec.slurm.signal is None:
            return []
        from .checks import preemption_check

        return preemption_check(self.transport, spec)

    def plan(self, spec: JobSpec) -> tuple[bool, str]:
        """``halo-sched plan --backend slurm``: submits nothing (checks.py)."""
        from .checks import plan

        return plan(self.transport, spec)

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
        from ...jobstate import JobStatus

        states = self.transport.query(list(ids))
        for job_id, state in states.items():
            # Ends of one run after which SLURM may requeue the job (sbatch --requeue).
            requeued = state.status in (JobStatus.PREEMPTED, JobStatus.NODE_FAIL)
            if requeued and state.slurm is not None and state.slurm.source == "sacct":
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
                from ...node.failures import entry_failure_in, report_from_files
                from ...records import failure_key
                from .outputs import output_files

                files = output_files(self.transport, job_id, ask=False)
                state.failure = report_from_files(files, failure_key(job_id, self.name))
                if state.failure is None:  # no failure line: a node's entry script that gave up says why
                    state.reason = entry_failure_in(files) or state.reason
            elif state.status is JobStatus.NODE_FAIL:
                # The node SLURM lost is named by its own record (down_nodes.py), not by the
                # failure lines: a host cut off writes none, its peers' blame nobody.
                from ...node.failures import FailureReport, report_from_files
                from ...records import failure_key
                from .down_nodes import down_nodes
                from .outputs import output_files

                files = output_files(self.transport, job_id, ask=False)
                report = report_from_files(files, failure_key(job_id, self.name)) or FailureReport()
                down = down_nodes(self.transport, job_id, state.slurm.nodelist if state.slurm else None, files)
                if down:
                    report.failures[:0] = down
                    report.cause = down[0]
                state.failure = report if report.failures else None
            elif state.status is JobStatus.RUNNING:  # the slowest rank, from the nodes' copies (progress.py)
                from .outputs import output_files
                from .progress import stragglers_line

                state.progress = stragglers_line(output_files(self.transport, job_id, ask=False), job_id)
        for job_id, state in states.items():
            if state.status in (JobStatus.FAILED, JobStatus.CANCELLED):
                # A host that left a --no-kill job (its batch script's trainer step failed, or the
                # batch host itself: its watcher cancelled the job): the run's marker names it.
                left = self._left_host(job_id)
                if left is not None:
                    from ...node.failures import FailureReport

                    report = state.failure or FailureReport()
                    report.failures[:0] = [left]
                    report.cause = left
                    state.failure = report
        for job_id, state in states.items():
            if state.status is JobStatus.RUNNING or state.status.terminal:
                state.spares, state.in_place = _in_allocation(self.transport, job_id, state.status.terminal)
                swaps = state.spares["swaps"] if state.spares else []
                if state.failure is not None and (swaps or state.in_place):
                    from .spares import last_step  # the failure is the last step's, not a swapped-out host's

                    state.failure = last_step(state.failure, swaps, state.in_place or [])
        return states

    def _left_host(self, job_id: str):
        """The host whose loss ended attempt ``job_id`` of a run, as the marker its batch script
        or guardian signed says (a host SLURM took out of the allocation: down_nodes.LeftNode),
        or None."""
        import time as _time

        from ...node.failure_classes import Classification
        from ...node.successor import LEFT
        from ...records import find
        from .down_nodes import LeftNode, held

        rec = next(iter(find(job_id, self.name, on_bad=None)), None)
        if rec is None or not isinstance(rec.get("run"), dict):
            return None
        found = self.successor_of(rec)
        cls = Classification.from_dict((found or {}).get("class"))
        if cls is None or cls.reason != LEFT or not cls.host or cls.host != found.get("culprit"):
            return None
        when, node = found.get("failed_at"), found.get("node")
        node = node if isinstance(node, int) and not isinstance(node, bool) and 0 <= node < 100000 else None
        ranks, words = held([o for o in rec.get("outputs") or [] if isinstance(o, str)], node) if node is not None \
            else ((), "")
        by = found.get("by") if found.get("by") in ("its batch script", "its guardian") else "the attempt"
        where = f"node {node} ({cls.host})" if node is not None else cls.host
        return LeftNode(node=node, rank=None, local_rank=None, host=cls.host, exit_code=None, signal=None,
                        time=when if isinstance(when, (int, float)) else _time.time(),
                        error=f"SLURM took {where} out of the job: it stopped answering and was marked down"
                              f"{'; ' + words if words else ''}; {by} started attempt {_count(found.get('attempt')) + 1} "
                              f"as {found['job']}", node_name=cls.host, ranks=ranks)

    def _launch_cause(self, job_id: str) -> str:
        """outputs.launch_cause, once per job."""
        from .outputs import launch_cause

        cache = self.__dict__.setdefault("_launch_causes", {})
        if job_id not in cache:
            cache[job_id] = ""
            cache[job_id] = launch_cause(self.transport, job_id)
        return cache[job_id]

    def record_fields(self, dryrun: DryRun, job_id: str) -> dict:
        """For the job record: the output file as an absolute path, and the cluster (sbatch -M)."""
        from .outputs import expand_output

        cluster, _, num = job_id.rpartition(":")
        out = expand_output(compile_launch(dryrun.spec).output, dryrun.spec.name, num)
        guardian = self.__dict__.get("_guardians", {}).pop(job_id, None)
        return {"outputs": [out], "scheduler": {"cluster": cluster or None}, **({"guardian": guardian} if guardian else {})}

    starts_successor = True

    def successor_of(self, record: dict) -> dict | None:
        """The marker the failed attempt's batch script left beside its output file
        (halo_sched/node/successor.py), when it names a job."""
        from ...node.successor import marker_path, read_marker

        run = record.get("run") if isinstance(record.get("run"), dict) else {}
        outputs = record.get("outputs") if isinstance(record.get("outputs"), list) else []
        attempt = run.get("attempt")
        if not (outputs and isinstance(outputs[0], str) and isinstance(run.get("id"), str)
                and isinstance(attempt, int) and not isinstance(attempt, bool) and 0 <= attempt < 1000):
            return None
        key = record.get("failure_key")  # the job's key, which signed the marker (made at its submit)
        found = read_marker(marker_path(os.path.dirname(outputs[0]), run["id"], attempt + 1),
                            key if isinstance(key, str) else "")
        if found is None or not found.get("job") or found.get("run") != run["id"]:
            return None
        return found

    def attempt_fields(self, record: dict, job_id: str) -> dict:
        """The next attempt writes its output by the same pattern, with its own job id."""
        from ...launch import compile_launch
        from ...spec import from_dict
        from .outputs import expand_output

        try:
            spec = from_dict(record["spec"], source=f"the record of {record['id']}")
        except (HaloError, KeyError, TypeError, ValueError):
            return {"outputs": []}
        pattern = compile_launch(spec).output
        if not os.path.isabs(pattern):
            pattern = os.path.join(str(record.get("submit_dir") or "."), pattern)
        cluster, _, num = job_id.rpartition(":")
        return {"outputs": [expand_output(pattern, spec.name, num)]}

    def _live(self, job_id: str, state: JobState) -> JobState:
        """sacct records a requeued run's end (PREEMPTED, NODE_FAIL) before the job is pending
        again; slurmctld itself shows such a job as REQUEUED/PENDING at once, so ask it."""
        from ...jobstate import JobStatus
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
        from .pending import NeverStarts  # not on the render path

        def tick(state: JobState) -> None:
            if on_tick is not None:
                on_tick(state)
            if _never_starts(state):
                raise NeverStarts(state)

        try:
            return super().wait(job_id, timeout=timeout, poll=poll, max_poll=max_poll, on_change=on_change,
                                on_tick=tick, outage_s=outage_s, on_outage=on_outage)
        except NeverStarts as stop:
            return self.end_impossible(job_id, stop.state)

    def acts_on(self, job_id: str, state: JobState) -> JobState | None:
        """What :meth:`wait` does on a state, for the asyncio wait: a job that can never start is ended."""
        return self.end_impossible(job_id, state) if _never_starts(state) else None

    def end_impossible(self, job_id: str, state: JobState) -> JobState:
        """Cancel a job that can never start; its state, CANCELLED, saying why and what to change
        (pending.py)."""
        from .pending import end_impossible

        return end_impossible(self, job_id, state)

    def cancel(self, ids: Sequence[str], signal: str | None = None, **opts) -> dict[str, str]:
        """Cancel (or, with ``signal``, warn) jobs. Returns the ids that had already ended, with
        their state in words: scancel of an ended job succeeds silently, so they are asked first
        (one query); they are not sent to scancel."""
        ids = list(ids)
        ended: dict[str, str] = {}
        if not signal:
            self._cancel_guardians(ids)
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

    def _cancel_guardians(self, ids: Sequence[str]) -> None:
        """Cancel the guardians of the attempts ``ids`` (their records name them), first: a
        guardian left pending would start the next attempt of a run cancelled while its attempt
        was losing its batch host. One that has ended already is left; one SLURM refuses is said."""
        from ...records import find

        guards = [g for i in ids for rec in find(i, self.name, on_bad=None)[:1]
                  if isinstance(g := rec.get("guardian"), str) and g]
        if not guards:
            return
        try:
            states = self.transport.query(guards)
            live = [g for g in guards if g in states and not states[g].status.terminal]
            if live:
                self.transport.cancel(live)
        except HaloError as err:
            _say(f"warning: could not cancel guardian {', '.join(guards)}: {' '.join(str(err).split())[:200]}")

    def guardian_alive(self, job_id: str) -> bool:
        """Whether the guardian of attempt ``job_id`` (its record names it) may still carry its run
        on: it is pending or running (a reader then waits for it: runs.wait_run)."""
        from ...records import find

        guard = (find(job_id, self.name, on_bad=None) or [{}])[0].get("guardian")
        if not isinstance(guard, str) or not guard:
            return False
        try:
            state = self.transport.query([guard]).get(guard)
        except HaloError:
            return True  # not known: asked again on the next round
        return state is not None and not state.status.terminal and state.status.value != "UNKNOWN"

    def progress(self, state: JobState) -> str:
        from ...jobstate import JobStatus

        if state.status is JobStatus.PENDING and not state.verdict:
            from .pending import pending_words

            return pending_words(self.transport, state, self.__dict__.setdefault("_need_cache", {}))
        run = f", run {state.restarts + 1}" if state.restarts else ""
        nodelist = state.slurm.nodelist if state.slurm is not None else None
        if state.status.value == "RUNNING" and state.nodes_total:
            return f"RUNNING on {state.nodes_total} node{'s' if state.nodes_total != 1 else ''}" + (
                f" ({nodelist})" if nodelist else "") + run + (f" ({state.progress})" if state.progress else "")
        return state.describe()

    def read_result(self, job_id: str, record: dict | None = None) -> bytes | None:
        """Rank 0's result file beside the job's output file (outputs.result_path: the batch
        script's ``HALO_RESULT_FILE``), read on this host's view of the shared filesystem."""
        from ...launch import SLURM_OUTPUT
        from ...node.result import ResultError, read_bounded
        from .outputs import output_files, result_path, result_shell

        if result_shell(SLURM_OUTPUT) is None:
            raise ResultError("not carried: the output file's directory holds a %-code (docs/slurm.md)")
        outputs = (record or {}).get("outputs") if isinstance((record or {}).get("outputs"), list) else None
        path = result_path(outputs or output_files(self.transport, job_id, ask=False), job_id)
        if path is None:  # (a record of an earlier release): asked again by the next reader, nothing kept
            raise SchedulerError(f"no output file is known for job {job_id}, so neither is its result file")
        return read_bounded(path)

    def logs(self, job_id: str, follow: bool = False) -> Iterator[str]:
        """The job's output file (srun --label prefixes each line with its node rank). All nodes
        write into that one file; ``halo-sched logs --node K`` splits it on read."""
        from .outputs import output_files, read_output

        paths = output_files(self.transport, job_id)
        if not paths:
            raise SchedulerError(f"SLURM does not report an output file for job {job_id} (is it too old?)")
        if not follow:
            for path in paths:
                yield from read_output(Path(path), False, lambda: True, lambda: self.query([job_id])[job_id])
            return
        # Following: the job's end comes from squeue/sacct in the background, so the file (on
        # the shared filesystem) is read and shown on while slurmctld is unreachable.
        ended = EndWatch(self.name, job_id, lambda: self.query([job_id])[job_id])
        try:
            for path in paths:
                yield from read_output(Path(path), follow, ended, lambda: self.query([job_id])[job_id])
        finally:
            ended.close()


def _in_allocation(transport, job_id: str, ended: bool) -> tuple[dict | None, list[dict] | None]:
    """What the batch script did inside the allocation (node/restart.py), for a job its record
    says has slurm.spare_nodes or retry: (the spares left and the swaps; the restarts in place and
    a crash loop); (None, None) for any other job (nothing is read)."""
    from ...records import find

    for rec in find(job_id, "slurm", on_bad=None):
        spec = rec.get("spec") if isinstance(rec.get("spec"), dict) else {}
        total = (spec.get("slurm") or {}).get("spare_nodes") if isinstance(spec.get("slurm"), dict) else None
        spares = isinstance(total, int) and not isinstance(total, bool) and total > 0
        retry = isinstance(spec.get("retry"), dict)
        if not spares and not retry:
            return None, None
        from .outputs import output_files
        from .spares import restarts_of, spares_state, swaps_of

        key = rec.get("failure_key") if isinstance(rec.get("failure_key"), str) else ""
        files = output_files(transport, job_id, ask=False)
        return (spares_state(total, swaps_of(files, key, ended)) if spares else None,
                (restarts_of(files, key, ended) or None) if retry else None)
    return None, None


def _count(value) -> int:
    """A marker's attempt number as an int (0 for anything else)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2 ** 31 else 0


def _never_starts(state: JobState) -> bool:
    """Pending for a reason that can never clear (reasons.py: PartitionNodeLimit, ...)."""
    from ...jobstate import JobStatus
    from .reasons import never_clears

    return state.status is JobStatus.PENDING and never_clears(state.reason)
