"""JobSpec -> sbatch script (pure). The script embeds the shared per-node entry unchanged.

Every value of the spec that lands on an ``#SBATCH`` line or in shell text is checked here against
a full-match pattern (or as a number) as it is written, and again by the template's filters:
whatever the model holds (``model_copy`` does not validate), nothing but a valid value is written."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ...errors import SpecError
from ...launch import Launch, compile_launch, render_entry
from ...servers import render_server
from ...node_runtime import runtime
from ...templating import RenderError, check, checked_int, heredoc_tag, render_template, sh_quote
from ...sbatch_options import OPTIONS, Setting, Signal, parse_setting
from .progress import mirror_shell
from .outputs import result_shell
from .request import SbatchRequest

if TYPE_CHECKING:  # pragma: no cover
    from ...models import JobSpec

# CPUs each rank gets by default (slurm.cpus_per_task unset, slurm.exclusive false): the node's one
# task (its torchrun) asks for nproc_per_node x this. Without any, `--ntasks-per-node=1` gets one
# CPU per node (site defaults aside), and under task/affinity every rank of the node and every
# DataLoader worker would share it. One per rank on the CPU (a gloo rank computes on its own CPU);
# four per rank with GPUs, for the DataLoader workers that feed each GPU (an 8-GPU node then asks
# for 32 CPUs, which every common 8-GPU node has).
DEFAULT_CPUS_PER_RANK_CPU = 1
DEFAULT_CPUS_PER_RANK_GPU = 4

# What srun sets for its one task per node describes that task, not a rank: SLURM_PROCID is the
# node index, SLURM_NTASKS the node count, SLURM_LOCALID 0 (srun(1), OUTPUT ENVIRONMENT
# VARIABLES). Libraries that detect SLURM from them (Lightning's SLURMEnvironment, submitit)
# would configure a world of one rank per node, so each task removes them before the entry, once
# SLURM_NODEID has given the node rank: the task's ids and counts, the step's own variables
# (SLURM_STEP_*, and the srun that launched it), and the task's CPU binding (SLURM_CPU_BIND*: srun
# reads SLURM_CPU_BIND as --cpu-bind, so a rank's own srun would inherit this task's mask; the
# affinity itself stays). Everything that describes the job, its allocation or the node stays
# (SLURM_JOB_*, SLURM_RESTART_COUNT, SLURM_CLUSTER_NAME, SLURM_CPUS_ON_NODE, SLURM_CPUS_PER_TASK,
# SLURMD_NODENAME, ...). docs/slurm.md: "A clean rank environment".
TASK_VARS = ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_NTASKS_PER_NODE",
             "SLURM_TASKS_PER_NODE", "SLURM_TASK_PID", "SLURM_GTIDS", "SLURM_STEPID", "SLURM_DISTRIBUTION",
             "SLURM_SRUN_COMM_HOST", "SLURM_SRUN_COMM_PORT", "SLURM_LAUNCH_NODE_IPADDR")
TASK_VAR_PREFIXES = ("SLURM_STEP_", "SLURM_CPU_BIND")


def unset_task_vars() -> str:
    """The words of an ``unset`` (bash, inside each task) that removes TASK_VARS and every
    variable named by TASK_VAR_PREFIXES."""
    return " ".join(TASK_VARS + tuple("${!%s@}" % p for p in TASK_VAR_PREFIXES))


def cpus_per_task(spec: JobSpec) -> int | None:
    """``--cpus-per-task`` of the job (sbatch and srun): slurm.cpus_per_task, else the default of
    DEFAULT_CPUS_PER_RANK_* per rank. None where the job holds its CPUs otherwise: ``exclusive``
    (every CPU of its nodes) or ``--cpus-per-gpu`` in extra_args (sbatch refuses both options);
    srun then gets what the job holds on a node (SLURM_JOB_CPUS_PER_NODE)."""
    s = spec.slurm
    if s.cpus_per_task is not None:
        return s.cpus_per_task
    if s.exclusive or any(a.partition("=")[0] == "--cpus-per-gpu" for a in s.extra_args):
        return None
    return spec.nproc_per_node * (DEFAULT_CPUS_PER_RANK_GPU if spec.gpus_per_node else DEFAULT_CPUS_PER_RANK_CPU)


# The job file's field behind an #SBATCH line, for an error about it ("slurm" for the rest).
DIRECTIVE_FIELDS = {"job-name": "name", "nodes": "nodes", "gpus-per-node": "gpus_per_node",
                    "exclude": "exclude_hosts", "output": "output"}


def _typed(option: str, text: str) -> Setting:
    """A job file field's value as ``option``'s typed value, by the parser ``slurm.extra_args``
    goes through too (halo_sched/sbatch_options.py)."""
    return Setting(option, OPTIONS[option].kind.parse(text))


def sbatch_request(launch: Launch) -> SbatchRequest:
    """The sbatch options of ``launch``, typed, in the order the script's header shows them
    (without its script: :func:`batch_request`)."""
    spec = launch.spec
    s = spec.slurm
    trainer = launch.trainer
    opts = [Setting("job-name", check(launch.name, "job name", "name")),
            # With server roles: one allocation for every role (the template says which nodes).
            # Hot spares (slurm.spare_nodes): the allocation holds them beside the trainer's nodes.
            Setting("nodes", checked_int(launch.all_nodes, "nodes") if launch.servers else
                    checked_int(trainer.nodes, "nodes") + checked_int(s.spare_nodes, "slurm.spare_nodes")),
            Setting("ntasks-per-node", 1)]
    if launch.max_gpus:
        opts.append(Setting("gpus-per-node", str(checked_int(launch.max_gpus, "gpus_per_node"))))
    for flag, value, kind in (("partition", s.partition, "SLURM word"), ("account", s.account, "SLURM word"),
                              ("qos", s.qos, "SLURM word"), ("time", s.time, "SLURM time"),
                              ("constraint", s.constraint, "SLURM constraint"),
                              ("cpus-per-task", cpus_per_task(spec), None), ("mem", s.mem, "SLURM word")):
        if value is not None:
            field = f"slurm.{flag.replace('-', '_')}"
            opts.append(Setting(flag, checked_int(value, field)) if kind is None else
                        _typed(flag, check(value, kind, field)))
    w = launch.warning
    if w.requested:
        # B: the batch shell alone gets the warning and forwards it to the steps itself (it must
        # know it was warned to requeue the job; see the template).
        opts.append(Setting("signal", Signal("".join(sorted(set(w.flags) | {"B"})), w.signal, w.seconds)))
    if s.exclusive:
        opts.append(Setting("exclusive"))
    own_no_kill = any(a.partition("=")[0] in ("--no-kill", "-k") for a in s.extra_args)
    if (s.spare_nodes or spec.retry is not None) and not own_no_kill:
        # A failed node leaves the allocation, the job and its batch script stay: hot spares take
        # its rank (node/spares.py); with retry:, the batch script starts the next attempt
        # (node/successor.py). A lost batch host: batch.sh halo_watch_batch_host, node/guardian.py.
        opts.append(Setting("no-kill"))
    if s.requeue is not None:
        opts.append(Setting("requeue" if s.requeue else "no-requeue"))
    ledgered = launch.exclude_hosts("slurm")
    try:
        extra = [parse_setting(check(a, "sbatch option", "slurm.extra_args")) for a in s.extra_args]
    except ValueError as e:  # only a spec changed without validation holds such a value
        raise RenderError([("slurm.extra_args", str(e))]) from None
    opts += [x for x in extra if not (ledgered and x.option == "exclude")]
    if ledgered:
        # The node ledger's hosts, joined with any --exclude of slurm.extra_args (sbatch keeps
        # only the last one given).
        own = [h for x in extra if x.option == "exclude" for h in x.value]
        hosts = list(dict.fromkeys(own + list(ledgered)))
        opts.append(Setting("exclude", tuple(check(h, "SLURM word", "exclude_hosts") for h in hosts)))
    opts.append(Setting("output", launch.output))
    opts.append(Setting("open-mode", "append"))
    if launch.secret_names:
        # secret_env: the values travel in sbatch's environment, by name, never in the script.
        # --export=ALL on the command line wins over a user's SBATCH_EXPORT=NONE, which would
        # drop them (srun's tasks then inherit the batch step's environment).
        opts.append(Setting("export", "ALL"))
    try:
        return SbatchRequest(options=tuple(opts), secret_names=launch.secret_names)
    except ValueError as e:  # an option of slurm.extra_args that halo-sched writes itself
        raise RenderError([("slurm.extra_args", str(e))]) from None


def container(launch: Launch, image: str | None) -> dict | None:
    """pyxis settings the template needs, or None when ``image`` is None or the job does not use
    pyxis (then it runs on the host)."""
    spec = launch.spec
    if not (image and spec.slurm.container_runtime == "pyxis"):
        return None
    mounts = [check(m, "SLURM word", "slurm.container_mounts") for m in spec.slurm.container_mounts]
    if not all(":" in m for m in mounts):
        raise RenderError([("slurm.container_mounts", "each mount is SRC:DST[:FLAGS]")])
    return {
        "workdir": spec.slurm.container_workdir,
        "mounts": ",".join(mounts),
        # Where each mount lands in the image (SRC:DST[:FLAGS]); "/" covers everything.
        "mount_dsts": [m.split(":")[1].rstrip("/") for m in mounts],
    }


def srun_options(launch: Launch, gpus: int, image: str | None) -> list[str]:
    """srun options beyond the one-task-per-node shape for nodes of ``gpus`` GPUs running in
    ``image`` (the trainer's or a server role's; shell text, pasted as is: each part is a checked
    number or quoted; the template sets the $halo_* variables they name), as lines of at most
    :data:`SRUN_LINE` characters (one option longer than that has a line of its own)."""
    opts = ['--cpus-per-task="$halo_cpus"']
    if checked_int(gpus, "gpus_per_node"):
        opts.append(f"--gpus-per-node={gpus}")
    c = container(launch, image)
    if c:
        # pyxis/enroot: every node's task runs inside the image, in the submit directory (or
        # slurm.container_workdir), so a relative trainer.script resolves as it did on submit.
        opts.append(f"--container-image={sh_quote(image)}")
        if c["mounts"] or not c["workdir"]:
            opts.append('--container-mounts="$halo_container_mounts"')
        opts.append('--container-workdir="$halo_container_workdir"')
    lines = [opts[0]]
    for opt in opts[1:]:
        if len(lines[-1]) + 1 + len(opt) > SRUN_LINE:
            lines.append(opt)
        else:
            lines[-1] += " " + opt
    return lines


#: The longest line of srun options the batch script packs (before its indent and " \").
SRUN_LINE = 96


# srun passes the entry script as one argument; Linux caps one argument at 128 KiB (MAX_ARG_STRLEN).
MAX_ENTRY_BYTES = 128 * 1024 - 1


def render_sbatch(spec: JobSpec) -> str:
    """:func:`render_batch` of ``spec``'s plan, kept off the node ledger's hosts."""
    from ... import ledger

    return render_batch(compile_launch(spec, ledgered=ledger.exclusions(), backend="slurm"))


def _largest_part(spec: JobSpec) -> tuple[str, int]:
    """(field, bytes) of the job file's part that puts the most into the entry script."""
    parts = {"env": sum(len(k.encode()) + len(v.encode()) for k, v in spec.env.items()),
             "setup": sum(len(line.encode()) for line in spec.setup),
             "trainer.args": sum(len(a.encode()) for a in spec.trainer.args)}
    field = max(parts, key=parts.__getitem__)
    return field, parts[field]


def render_batch(launch: Launch) -> str:
    """The sbatch script of ``launch``."""
    return batch_request(launch).script


def batch_request(launch: Launch) -> SbatchRequest:
    """``launch``'s typed sbatch request with its script, whose ``#SBATCH`` header is written from
    the request's options."""
    request = sbatch_request(launch)
    spec = launch.spec
    entry = render_entry(launch).rstrip("\n")
    size = len(entry.encode())
    if size > MAX_ENTRY_BYTES:
        field, held = _largest_part(spec)
        raise SpecError([(field, f"the node entry script is {size} bytes, over the {MAX_ENTRY_BYTES} that one "
                                 f"argument to srun can carry ({field} puts {held} bytes in it, the most of env, "
                                 "setup and trainer.args); move large values into files")])
    servers = []
    for r in launch.servers:
        text = render_server(launch, r).rstrip("\n")
        servers.append({"role": r, "srun_options": srun_options(launch, r.gpus, r.image),
                        "entry": text, "tag": heredoc_tag(text, "HALO_SERVER_EOF")})
    rdzv = launch.rendezvous
    return request.with_script(render_template(
        "slurm/sbatch.sh.j2",
        launch=launch,
        names=launch.names,
        warning=launch.warning,
        trainer=launch.trainer,
        servers=servers,
        spec=spec,
        spares=spec.slurm.spare_nodes,
        # The step loop: restarts inside the allocation (node/restart.py), with spares or retry: (not
        # with rollout servers: their steps run beside one trainer step).
        steps=bool(spec.slurm.spare_nodes or (spec.retry is not None and not launch.servers)),
        # What the batch shell runs itself after the trainer step failed (spares, the next attempt).
        batch_modules=bool(spec.slurm.spare_nodes or spec.retry is not None),
        directives=request.directives(),
        ledgered=bool(launch.exclude_hosts("slurm")),
        fields=DIRECTIVE_FIELDS,
        srun_options=srun_options(launch, launch.trainer.gpus, launch.trainer.image),
        # The mounts and working directory are shared by every role that runs in an image.
        container=next(filter(None, (container(launch, image) for image in
                                     [launch.trainer.image] + [r.image for r in launch.servers])), None),
        cpus=cpus_per_task(spec),
        cpus_default=spec.slurm.cpus_per_task is None,
        port_avoid=[p for p in rdzv.avoid if p in rdzv.derived],
        unset_task_vars=unset_task_vars(),
        # The hang monitor's copy of the ranks' progress, beside the output file (progress.py).
        progress_mirror=mirror_shell(launch.output) if spec.hang else None,
        # Rank 0's result file, beside the output file too (outputs.py).
        result_dir=result_shell(launch.output),
        entry=entry,
        tag=heredoc_tag(entry, "HALO_ENTRY_EOF"),
        runtime=runtime(),
        successor=successor_args(spec, request),
        watch=watch_seconds(request),
        maint_s=MAINT_S,
    ))


#: How often (s) a job with slurm.spare_nodes asks slurmctld whether a node of its step is to leave
#: for maintenance (batch.sh halo_maint_watch; HALO_MAINT_POLL_S in the job's environment overrides
#: it): three scontrol calls per job per period.
MAINT_S = 30

#: How often (s) the watcher step of a job with --no-kill asks whether the batch host is still in
#: the job (batch.sh halo_watch_batch_host): one scontrol call per job per period.
WATCH_S = 10


def watch_seconds(request: SbatchRequest) -> int:
    """WATCH_S for a job of more than one node submitted with --no-kill (on), else 0 (no watcher:
    a one-node job whose node is lost ends NODE_FAIL)."""
    return WATCH_S if request.has("no-kill") and request.get("no-kill") is None and request.get("nodes", 1) > 1 else 0


def successor_args(spec: JobSpec, request: SbatchRequest) -> dict | None:
    """What the batch script hands halo_sched/node/successor.py besides what SLURM tells it: the
    retry.on words, the hosts this job's request keeps off (the successor's --exclude must repeat
    them: sbatch keeps the command line's), and for an attempt rendered as one (``spec._attempt``)
    its run and hosts."""
    if spec.retry is None:
        return None
    attempt = getattr(spec, "_attempt", None)
    return {"on": ",".join(check(w, "SLURM word", "retry.on") for w in spec.retry.on),
            "kept_off": ",".join(check(h, "SLURM word", "exclude_hosts") for h in request.get("exclude", ())),
            "run_id": check(attempt.run_id, "SLURM word", "retry") if attempt is not None else "",
            "excluded": ",".join(check(h, "SLURM word", "retry") for h in attempt.exclude) if attempt is not None else ""}
