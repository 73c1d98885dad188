"""What ``submit`` and ``plan`` check before anything is queued: the job against its partition's
limits (a job that can never fit is refused, not left pending forever), the cluster's
preemption settings against ``slurm.signal``, and the plan's report (``sbatch --test-only``).
What the transport can read of the cluster (partitions, ``scontrol show config``) is asked here.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ...errors import HaloError, SchedulerError
from ...launch import compile_launch
from .capabilities import Lists, Named, ReadsConfig, ReadsPartitions, TestsOnly
from .outputs import output_problems
from .render import batch_request

if TYPE_CHECKING:  # pragma: no cover
    from ...models import JobSpec


def one_line(err: object) -> str:
    return " ".join(str(err).split())


def transport_name(transport) -> str:
    """The transport's name, for a message."""
    return (transport.name if isinstance(transport, Named) else "") or "this"


def read_partitions(transport, cluster: str | None,
                    bound_s: float | None = None) -> tuple[list[dict], list[dict]] | None:
    """The cluster's partitions and nodes; None where the transport cannot read them. With
    ``bound_s``: one attempt of each call, cut after that many seconds."""
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


def show_config(transport, cluster: str | None) -> str | None:
    """``scontrol show config`` of ``cluster`` (the job's ``slurm.clusters``, None for the
    default); None where the transport cannot read it (a stand-in transport may have no way)."""
    if not isinstance(transport, ReadsConfig):
        return None
    return transport.show_config(cluster)


def partition_problems(transport, spec: JobSpec, cluster: str | None,
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
        got = read_partitions(transport, cluster, bound_s)
    except HaloError as err:
        return [], f"unchecked: could not read the partitions: {one_line(err)}"
    if got is None:
        return [], f"unchecked: the {transport_name(transport)} transport cannot read the cluster's partitions"
    parts, nodes = got
    name = spec.slurm.partition
    part = next((p for p in parts if p.get("PartitionName") == name), None) if name else next(
        (p for p in parts if (p.get("Default") or "").upper() == "YES"), None)
    if part is None:  # sbatch names an unknown partition itself
        return [], f"unchecked: no partition {name or '(default)'} among {', '.join(p.get('PartitionName', '') for p in parts)}"
    limits = partition_limits(part, nodes)
    cpus = cpus_per_task(spec)
    problems = limit_problems(
        limits, nodes=spec.all_nodes + spec.slurm.spare_nodes,
        time_s=parse_slurm_time(spec.slurm.time) if spec.slurm.time else None, time_text=spec.slurm.time,
        cpus_per_task=cpus, mem_mb=parse_slurm_mem(spec.slurm.mem) if spec.slurm.mem else None,
        cpus_field="slurm.cpus_per_task" if spec.slurm.cpus_per_task is not None else
        f"slurm.cpus_per_task (unset: {cpus} for nproc_per_node {spec.nproc_per_node})",
        nodes_field="slurm.spare_nodes (with nodes)" if spec.slurm.spare_nodes else
        "nodes" if spec.all_nodes == spec.nodes else "nodes (with the servers' nodes)")
    fmt = lambda v, unit="": "unlimited" if v is None else f"{v}{unit}"  # noqa: E731
    checked = (f"partition {limits['name']}: at most {fmt(min([x for x in (limits['max_nodes'], limits['total_nodes']) if x is not None], default=None))} nodes, "
               f"time {limits['max_time'] or 'unlimited'}, {fmt(limits['cpus_per_node'])} CPUs and "
               f"{fmt(limits['mem_mb'], 'M')} memory per node")
    return problems, ("ok: " if not problems else "") + checked


def preemption_check(transport, spec: JobSpec) -> list[str]:
    """Lines saying why the job's ``slurm.signal`` warning will not come when the cluster
    preempts it, from ``scontrol show config`` (preemption.py); none without slurm.signal
    (then nothing is asked) or where the cluster sends it."""
    if spec.slurm.signal is None:
        return []
    from .preemption import parse_config, preemption_notes

    try:
        text = show_config(transport, compile_launch(spec).cluster)
    except HaloError as err:
        return [f"could not read the cluster's configuration to check that preemption sends slurm.signal's "
                f"warning: {err}"]
    if text is None:
        return [f"the {transport_name(transport)} transport cannot read the cluster's configuration: whether "
                "preemption sends slurm.signal's warning is unchecked (`scontrol show config`: "
                "PreemptParameters=send_user_signal, or SlurmctldParameters=preempt_send_user_signal before 23.02)"]
    return preemption_notes(spec, parse_config(text))


def plan(transport, spec: JobSpec) -> tuple[bool, str]:
    """``halo-sched plan --backend slurm``: submits nothing. Whether SLURM would take the job
    as rendered (``sbatch --test-only``: when and where it would start, or why not), and the
    cluster's preemption settings against ``slurm.signal``. (False, text) when SLURM would
    refuse the job."""
    from .preemption import describe, parse_config, preemption_notes

    from ... import ledger

    via = transport_name(transport)
    launch = compile_launch(spec, ledgered=ledger.exclusions())
    request = batch_request(launch)
    # What submit refuses (exit 2, naming the field), refused here the same way.
    problems, checked = partition_problems(transport, spec, launch.cluster)
    out_problems, out_checked = output_problems(launch.output, via)
    if problems or out_problems:
        from ...errors import SpecError

        raise SpecError(problems + out_problems, spec.job_file.path if spec.job_file else None)
    lines = [f"Plan for job {spec.name!r} on SLURM ({via} transport), {spec.all_nodes} "
             f"node{'s' if spec.all_nodes != 1 else ''}:"]
    ok = True
    try:
        tested = transport.test_only(request) if isinstance(transport, TestsOnly) else None
    except HaloError as err:
        tested = (False, str(err))
    if tested is None:
        lines.append(f"  placement: not checked (the {via} transport has no sbatch --test-only)")
    else:
        ok = tested[0]
        lines.append(f"  placement: {'ok' if ok else 'REFUSED'}: {tested[1]}")
    lines.append(f"  partition limits: {checked}")
    lines.append(f"  output file: {out_checked}")
    try:
        text = show_config(transport, launch.cluster)
    except HaloError as err:
        text, why = None, f"could not read it: {err}"
    else:
        why = f"the {via} transport cannot read it"
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
