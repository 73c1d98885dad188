"""The default transport: SLURM's command-line clients (sbatch, squeue, sacct, scontrol, scancel).

Every call goes through an injectable ``runner(argv, input) -> CompletedProcess``, so tests can
answer like SLURM. One poll costs one scheduler call for any number of ids (chunked only for
argv length), at most 3 in the worst case, per cluster.

Submitting: sbatch gets every option of the typed request (request.py) on its command line and
the script on its standard input; the script's ``#SBATCH`` header is written from the same
options, and a command-line option wins over it, so what sbatch is asked never depends on the
script's text (nor on a submitter's ``SBATCH_*`` variables for an option the job sets).

Other clusters: ``sbatch --parsable`` run with ``--clusters``/``-M`` (the request's, or
``$SLURM_CLUSTERS``) prints ``ID;CLUSTER`` (src/sbatch/sbatch.c), and this transport
returns ``CLUSTER:ID``. Every later squeue/sacct/scontrol/scancel for that id gets
``--clusters=CLUSTER``; without it they would ask the local slurmctld, which does not know the job.
"""
from __future__ import annotations

import copy
import re
import subprocess
from typing import TYPE_CHECKING, Callable, Sequence

from halo_sched.jobstate import JobState, SlurmDetail
from halo_sched.backends.slurm import status as st
from halo_sched.errors import MissingDependency, SchedulerError
from halo_sched.exactly_once import TOKEN_PREFIX, run_once
from halo_sched.retry import SLURM_CALLS, Ambiguous, Transient, time_left

from .base import TRANSIENT, Transport, by_cluster, chunks, gave_up, split_cluster, unique, with_cluster

if TYPE_CHECKING:  # pragma: no cover
    from ..request import SbatchRequest

Runner = Callable[[list, "str | None"], subprocess.CompletedProcess]


def clean_scancel(stderr: str) -> str:
    """scancel's error lines as one line: ``scancel: error: Kill job error on job id 5: Invalid
    job id specified`` -> ``Kill job error on job id 5: Invalid job id specified`` (each line once,
    the program's own ``scancel:``/``error:`` prefixes dropped)."""
    lines = []
    for line in (stderr or "").splitlines():
        text = re.sub(r"^(?:\s*(?:scancel|error|fatal):\s*)+", "", line.strip(), flags=re.I)
        if text:
            lines.append(text)
    return "; ".join(dict.fromkeys(lines)) or "(no output)"


def default_runner(timeout: float = 60.0) -> Runner:
    def run(argv: list, input: str | None = None) -> subprocess.CompletedProcess:
        # A caller's deadline (halo_sched.retry.within: a wait's --timeout, status's bound) cuts
        # the command there: SLURM's clients themselves keep trying an unreachable controller
        # for MessageTimeout (10 s by default) before they fail.
        left = time_left()
        limit = timeout if left is None else max(0.5, min(timeout, left))
        # Other users' job names in squeue/scontrol output need not be UTF-8: never fail on them.
        return subprocess.run(argv, input=input, capture_output=True, text=True, encoding="utf-8",
                              errors="replace", timeout=limit, check=False)

    return run


class CliTransport(Transport):
    """SLURM's command-line clients.

    ``accounting``: None detects once per cluster whether ``sacct`` works (and caches the
    answer); True/False forces it. ``retries``: attempts for idempotent calls when the
    controller is busy.
    """

    name = "cli"

    def __init__(
        self,
        runner: Runner | None = None,
        chunk_size: int = 1000,
        accounting: bool | None = None,
        timeout: float = 60.0,
        retries: int = 3,
        retry_wait: float = 0.5,
    ):
        if chunk_size < 1:
            raise ValueError("chunk_size must be >= 1")
        self.runner = runner or default_runner(timeout)
        self.chunk_size = chunk_size
        self._forced_accounting = accounting
        self._accounting: dict[str | None, bool] = {}  # per cluster (None: the local one)
        self.policy = SLURM_CALLS.with_(attempts=retries, first_wait_s=retry_wait)

    def for_listing(self) -> "CliTransport":
        """The same clients, each call tried once (``list``: its caller bounds the whole query
        with :func:`halo_sched.retry.within`, which the default runner obeys)."""
        quick = copy.copy(self)
        quick.policy = self.policy.with_(attempts=1)
        return quick

    # -- plumbing ----------------------------------------------------------------------------

    def _call(self, argv: list, input: str | None = None) -> subprocess.CompletedProcess:
        try:
            return self.runner(list(argv), input)
        except FileNotFoundError as e:
            raise MissingDependency(
                f"{argv[0]} not found on PATH: the SLURM client commands are needed on this host "
                "(or use the 'rest' transport)"
            ) from e
        except subprocess.TimeoutExpired as e:
            raise Transient(f"{argv[0]} timed out after {e.timeout:.1f} s") from e
        except OSError as e:  # not executable, permission denied, ...
            raise MissingDependency(f"cannot run {argv[0]}: {e}") from e

    def _run(self, argv: list, input: str | None = None, retry: bool = True) -> subprocess.CompletedProcess:
        """One logical call. With ``retry``, transient controller errors are retried (for
        idempotent calls); without, the caller gets the failed result (a timeout as exit 124)."""
        if not retry:
            try:
                return self._call(argv, input)
            except Transient as e:
                return subprocess.CompletedProcess(argv, 124, "", str(e))

        def attempt() -> subprocess.CompletedProcess:
            proc = self._call(argv, input)
            if proc.returncode != 0 and TRANSIENT.search(proc.stderr or ""):
                raise Transient((proc.stderr or "").strip())
            return proc

        return self.policy.call(attempt, give_up=gave_up(argv[0]))

    @staticmethod
    def _fail(what: str, proc: subprocess.CompletedProcess) -> SchedulerError:
        msg = (proc.stderr or "").strip() or (proc.stdout or "").strip() or "(no output)"
        if what == "scancel":
            return SchedulerError(f"scancel refused (exit {proc.returncode}): {clean_scancel(msg)}")
        return SchedulerError(f"{what} failed (exit {proc.returncode}): {msg}")

    # -- submit / cancel ---------------------------------------------------------------------

    @staticmethod
    def sbatch_argv(request: SbatchRequest, *first: str) -> list[str]:
        """sbatch's command line for ``request``: ``first``, then every option of the request."""
        return ["sbatch", *first, *request.arguments()]

    def submit(self, request: SbatchRequest) -> str:
        # Never retried: a timed-out sbatch may have queued the job, and a second one would
        # run the training twice.
        proc = self._run(self.sbatch_argv(request, "--parsable"), input=request.script, retry=False)
        if proc.returncode == 124:
            raise SchedulerError(f"{proc.stderr}: the job may have been queued anyway; check squeue before resubmitting")
        if proc.returncode != 0:
            raise self._fail("sbatch", proc)
        return self._parse_id(proc)

    def submit_once(self, request: SbatchRequest, token: str = "", retry_s: float | None = None,
                    on_retry: Callable[[str], None] | None = None) -> str:
        """sbatch, exactly once, riding out a controller outage for ``retry_s`` seconds
        (halo_sched.exactly_once; ``HALO_SUBMIT_RETRY_S``, default 120).

        The job carries ``--comment=halo-token:TOKEN``. A controller error or a timed-out sbatch
        may follow a job slurmctld accepted ("Socket timed out on send/recv operation" comes after
        the request was sent), so every such failure is ambiguous: the token is looked up with
        squeue (``%k`` is the comment) before sbatch runs again. sbatch's other refusals (an
        invalid partition, a bad option) fail at once with SLURM's words."""
        cluster = ",".join(request.get("clusters") or ()) or None
        name = request.get("job-name")
        comment = f"{TOKEN_PREFIX}{token}"
        # The token is the job's comment (a comment the job file gives is replaced).
        argv = self.sbatch_argv(request.with_options(f"--comment={comment}"), "--parsable")

        def send() -> str:
            try:
                proc = self._call(argv, request.script)
            except Transient as e:  # sbatch timed out: it may have queued the job
                raise Ambiguous(str(e)) from e
            if proc.returncode != 0:
                if TRANSIENT.search(proc.stderr or "") or "temporarily unable to accept job" in (proc.stderr or "").lower():
                    raise Ambiguous((proc.stderr or "").strip())
                raise self._fail("sbatch", proc)
            return self._parse_id(proc)

        def lookup() -> str | None:
            argv = ["squeue", *(["--clusters=" + cluster] if cluster else []), "--noheader", "--states=all",
                    "--format=%i|%k", *([f"--name={name}"] if name else [])]
            try:
                proc = self._call(argv)
            except Transient as e:
                raise Ambiguous(str(e)) from e
            if proc.returncode != 0:
                raise Ambiguous(f"looking the job up failed: {(proc.stderr or '').strip()}")
            here = None
            for line in (proc.stdout or "").splitlines():
                if line.startswith("CLUSTER: "):  # squeue -M prints one such line per cluster
                    here = line.split(":", 1)[1].strip()
                    continue
                job_id, _, job_comment = line.strip().partition("|")
                if job_comment.strip() == comment:
                    return with_cluster(here if cluster else None, job_id.strip())
            return None

        return run_once("sbatch", send, lookup, retry_s, token=comment, on_retry=on_retry, who="SLURM",
                        not_done="nothing was submitted")

    def _parse_id(self, proc: subprocess.CompletedProcess) -> str:
        # "123", or "123;CLUSTER" when sbatch chose a cluster (-M): keep the cluster, or every
        # later query asks the wrong slurmctld and the job reads UNKNOWN.
        lines = [ln.strip() for ln in (proc.stdout or "").splitlines() if ln.strip()]
        m = re.fullmatch(r"(\d+)(?:;([A-Za-z0-9_.-]+))?", lines[-1] if lines else "")
        if not m:
            raise SchedulerError(f"sbatch printed no job id: {proc.stdout!r} {proc.stderr!r}")
        return with_cluster(m.group(2), m.group(1))

    def cancel_once(self, ids: Sequence[str], retry_s: float | None = None,
                    on_retry: Callable[[str], None] | None = None) -> None:
        """scancel, riding out a controller outage (a repeated scancel is harmless). A job that
        already ended counts as cancelled; an id slurmctld does not know is an error."""
        for cluster, local in by_cluster(ids).items():
            for chunk in chunks(list(local), self.chunk_size):
                argv = ["scancel", *st.cluster_args(cluster), *chunk]

                def send() -> None:
                    proc = self._call(argv)  # a timeout raises Transient: scancel is safe to repeat
                    err = (proc.stderr or "").strip()
                    if proc.returncode != 0 and TRANSIENT.search(err):
                        raise Transient(err)
                    # "Job/step already completing or completed": the outcome asked for.
                    done = [ln for ln in err.splitlines() if ln.strip() and "already completing or completed" not in ln]
                    if proc.returncode != 0 and done:
                        raise self._fail("scancel", subprocess.CompletedProcess(argv, proc.returncode, "", "\n".join(done)))

                run_once("scancel", send, lambda: None, retry_s, on_retry=on_retry, who="SLURM",
                         not_done="nothing was cancelled")

    def cancel(self, ids: Sequence[str], signal: str | None = None) -> None:
        # --batch: the signal goes to the batch script alone, exactly as slurm.signal's warning
        # (--signal=B:); the script forwards it to every rank (halo_sched/templates/slurm/sbatch.sh.j2).
        opts = ["--batch", f"--signal={signal}"] if signal else []
        for cluster, local in by_cluster(ids).items():
            for chunk in chunks(list(local), self.chunk_size):
                proc = self._run(["scancel", *st.cluster_args(cluster), *opts, *chunk])
                if proc.returncode != 0:
                    raise self._fail("scancel", proc)

    # -- query -------------------------------------------------------------------------------

    @property
    def accounting(self) -> bool | None:
        """Whether sacct works for the local cluster (None until a query found out)."""
        return self._accounting_of(None)

    def _accounting_of(self, cluster: str | None) -> bool | None:
        return self._forced_accounting if self._forced_accounting is not None else self._accounting.get(cluster)

    def query(self, ids: Sequence[str]) -> dict[str, JobState]:
        """One query per cluster the ids name; the answers keyed by the ids as given."""
        found: dict[str, JobState] = {}
        for cluster, local in by_cluster(ids).items():
            for local_id, state in self._query_cluster(list(local), cluster).items():
                if cluster:
                    state.id = with_cluster(cluster, state.id)
                    if state.slurm is None:
                        state.slurm = SlurmDetail()
                    state.slurm.cluster = cluster
                found.update(dict.fromkeys(local[local_id], state))
        return {job_id: found[job_id] for job_id in unique(ids)}

    def _query_cluster(self, ids: list[str], cluster: str | None) -> dict[str, JobState]:
        """sacct (when there is accounting), else/then squeue, then scontrol for what a filtered
        squeue missed: 1 call per poll normally, never more than 3 (chunks aside)."""
        found: dict[str, JobState] = {}
        list_all = False
        sacct_note = ""
        if self._accounting_of(cluster) is not False:
            probing = self._accounting_of(cluster) is None
            states, sacct_note = self._sacct(ids, cluster)
            if states is not None:
                found.update(st.select_states(ids, states))
            elif probing and self._accounting_of(cluster) is False:
                # This poll already spent a call finding out there is no accounting: list every
                # job at once, so an unknown id cannot cost a third call.
                list_all = True
        missing = [i for i in ids if i not in found]

        complete_listing = False
        if missing:
            states, complete_listing = self._squeue(missing, list_all, cluster)
            found.update(st.select_states(missing, states))
            missing = [i for i in ids if i not in found]

        # squeue --states=all shows what slurmctld holds; scontrol is the last word on jobs that
        # a filtered squeue did not report. After a full listing it cannot know more.
        if missing and not complete_listing and not self._accounting_of(cluster):
            found.update(st.select_states(missing, self._scontrol_all(cluster)))
            missing = [i for i in ids if i not in found]

        if self._accounting_of(cluster):
            why = "neither sacct nor slurmctld knows this job id"
        elif sacct_note:
            why = f"slurmctld does not know this job id, and sacct failed: {sacct_note}"
        else:
            why = (
                "slurmctld does not know this job id (it ended more than MinJobAge ago, or never "
                "existed) and this cluster has no accounting (sacct) to ask"
            )
        for job_id in missing:
            found[job_id] = st.unknown_state(job_id, why)
        return {i: found[i] for i in ids}

    def _sacct(self, ids: list[str], cluster: str | None) -> tuple[list[JobState] | None, str]:
        """sacct's states, or (None, why) when sacct cannot answer (then squeue must)."""
        states: list[JobState] = []
        for chunk in chunks(ids, self.chunk_size):
            # Not retried: squeue is the retry.
            proc = self._run(st.sacct_argv(chunk, cluster), retry=False)
            if proc.returncode != 0:
                if st.sacct_disabled(proc.stderr, proc.stdout):
                    self._accounting[cluster] = False
                    return None, ""
                # slurmdbd down or slow: this poll goes to slurmctld; ask sacct again next time.
                return None, (proc.stderr or "").strip()[:200]
            self._accounting[cluster] = True
            states += st.parse_sacct(proc.stdout)
        return states, ""

    def _squeue(self, ids: list[str], list_all: bool, cluster: str | None) -> tuple[list[JobState], bool]:
        """(states, whether this was a listing of every job)."""
        # squeue filters a multi-id --jobs list on the client after loading every job anyway, so
        # more ids than fit one argv are better served by one unfiltered listing than by chunks.
        if not list_all and len(ids) <= self.chunk_size:
            proc = self._run(st.squeue_argv(ids, cluster))
            if proc.returncode == 0:
                return st.parse_squeue(proc.stdout), False
            if not st.squeue_invalid_id(proc.stderr):
                raise self._fail("squeue", proc)
            # A single unknown id (any unknown id, in some versions) fails the whole call.
        proc = self._run(st.squeue_argv(None, cluster))
        if proc.returncode != 0:
            raise self._fail("squeue", proc)
        return st.parse_squeue(proc.stdout), True

    def _scontrol_all(self, cluster: str | None) -> list[JobState]:
        proc = self._run(st.scontrol_argv(None, cluster))
        if proc.returncode != 0:
            raise self._fail("scontrol show job", proc)
        return st.parse_scontrol_states(proc.stdout)

    # -- info --------------------------------------------------------------------------------

    def job_info(self, job_id: str) -> dict[str, str]:
        """Fields of ``scontrol show job ID`` (for a het/array job: the record shown as
        ``job_id``, else the first one; ``_records`` holds all)."""
        cluster, local = split_cluster(job_id)
        proc = self._run(st.scontrol_argv(local, cluster))
        if proc.returncode != 0:
            if st.squeue_invalid_id(proc.stderr):
                raise SchedulerError(
                    f"job {job_id} is not known to slurmctld (finished more than MinJobAge ago?)"
                )
            raise self._fail("scontrol show job", proc)
        records = st.parse_scontrol_jobs(proc.stdout)
        if not records:
            raise SchedulerError(f"scontrol show job {job_id} printed no job")
        pick = next((r for r in records if st.scontrol_display_id(r) == local), None)
        pick = pick or next((r for r in records if r.get("JobId") == local), records[0])
        return {**pick, "_records": records} if len(records) > 1 else dict(pick)

    def show_config(self, cluster: str | None = None) -> str:
        proc = self._run(["scontrol", *st.cluster_args(cluster), "show", "config"])
        if proc.returncode != 0:
            raise self._fail("scontrol show config", proc)
        return proc.stdout or ""

    def partitions(self, cluster: str | None = None) -> tuple[list[dict], list[dict]]:
        """Every partition and node of the cluster (``scontrol --oneliner show partition`` and
        ``show node``): two calls, made before a submit and by ``plan``."""
        out = []
        for what in ("partition", "node"):
            proc = self._run(["scontrol", *st.cluster_args(cluster), "--oneliner", "show", what])
            if proc.returncode != 0:
                raise self._fail(f"scontrol show {what}", proc)
            out.append([st.parse_scontrol_record(line) for line in (proc.stdout or "").splitlines() if "=" in line])
        return out[0], out[1]

    def test_only(self, request: SbatchRequest) -> tuple[bool, str]:
        # Submits nothing: sbatch asks slurmctld when and where the job would start.
        proc = self._run(self.sbatch_argv(request, "--test-only"), input=request.script)
        text = " ".join(ln.strip() for ln in ((proc.stderr or "") + (proc.stdout or "")).splitlines() if ln.strip())
        return proc.returncode == 0, text or f"sbatch --test-only exited {proc.returncode}"

    def version(self) -> str:
        """The cluster's Slurm release as the client reports it, e.g. ``22.05.8``."""
        proc = self._run(["scontrol", "--version"])
        m = re.search(r"(\d+\.\d+(?:\.\d+)?)", proc.stdout or "")
        if proc.returncode != 0 or not m:
            raise self._fail("scontrol --version", proc)
        return m.group(1)
