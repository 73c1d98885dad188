"""SLURM's pending reasons in words, and which of them can never clear (pure: no I/O).

The reason words are slurmctld's (``job_reason_string``, src/common/slurm_protocol_defs.c at
slurm-22-05-11-1, the release this project's cluster runs; src/common/job_state_reason.c at
slurm-25-11-7-1 lists the same words). A job waits for one of them; some clear by themselves
(other jobs end, a reservation starts, an administrator releases a hold), others only when the
job itself changes, so ``submit --wait``/``watch``/``Job.wait()`` end such a job at once
(:data:`NEVER`), cancel it and say what to change in the job file.

What counts as "never" (each from the Slurm source, 22.05):
  * PartitionNodeLimit / PartitionTimeLimit: ``job_limits_check`` (src/slurmctld/job_mgr.c,
    ``case ESLURM_INVALID_NODE_COUNT: fail_reason = WAIT_PART_NODE_LIMIT``; the time case
    likewise) compares the job with its partition's *configured* MaxNodes/MinNodes/MaxTime, not
    with what is free: only a changed job or partition clears it.
  * PartitionConfig: ``ESLURM_REQUESTED_PART_CONFIG_UNAVAILABLE``, documented in
    src/slurmctld/node_scheduler.c (``_pick_best_nodes``): "the job can not be initiated until the
    partition's configuration changes" (e.g. more CPUs per task than any node of it has, a QOS or
    account the partition does not allow).
  * DependencyNeverSatisfied (``WAIT_DEP_INVALID``): the dependency failed (``afterok`` on a
    job that failed); slurmctld keeps the job pending unless kill_invalid_depend is set.
  * InvalidAccount / InvalidQOS (``FAIL_ACCOUNT``/``FAIL_QOS``), AccountNotAllowed /
    QOSNotAllowed (``WAIT_ACCOUNT``/``WAIT_QOS``), BadConstraints (``FAIL_BAD_CONSTRAINTS``),
    MaxMemPerLimit (``WAIT_PN_MEM_LIMIT``: more memory per node than the partition's MaxMemPerNode).
  * Per-job and per-node maxima and minima of a QOS or association (``QOSMax*PerJob*``,
    ``QOSMax*PerNode``, ``AssocMax*PerJob*``, ``AssocMax*PerNode``, ``QOSMin*``): the job alone
    exceeds them, whatever else runs. Group (``*Grp*``), per-user, per-account and job-count
    limits (``AssocMaxJobsLimit``, ``QOSMaxJobsPerUserLimit``, ...) clear as other jobs end.
"""
from __future__ import annotations

import re
from typing import Mapping

#: Reasons that never clear while the job stays as it is: reason -> (what is wrong, what to change).
NEVER: dict[str, tuple[str, str]] = {
    "PartitionNodeLimit": ("more nodes than the partition allows",
                           "lower nodes or pick another slurm.partition"),
    "PartitionTimeLimit": ("a longer time limit than the partition allows",
                           "lower slurm.time or pick another slurm.partition"),
    "PartitionConfig": ("a request the partition's configuration cannot meet",
                        "lower slurm.cpus_per_task/slurm.mem/nodes or pick another slurm.partition"),
    "DependencyNeverSatisfied": ("a dependency that can no longer be met",
                                 "fix the dependency in slurm.extra_args and submit again"),
    "InvalidAccount": ("an account SLURM does not know", "fix slurm.account"),
    "InvalidQOS": ("a QOS SLURM does not know", "fix slurm.qos"),
    "AccountNotAllowed": ("an account the partition does not allow", "change slurm.account or slurm.partition"),
    "QOSNotAllowed": ("a QOS the partition does not allow", "change slurm.qos or slurm.partition"),
    "BadConstraints": ("node features no node of the partition has", "fix slurm.constraint"),
    "MaxMemPerLimit": ("more memory per node than the partition allows",
                       "lower slurm.mem or pick another slurm.partition"),
}

# QOS/association limits the job alone exceeds (per job, per node, a minimum).
_NEVER_LIMIT_RE = re.compile(r"^(?:QOS|Assoc)Max\w*Per(?:Job|Node)\w*$|^QOSMin\w+$")

#: Reasons that may clear, in words.
MAY_CLEAR: dict[str, str] = {
    "None": "waiting to be scheduled",
    "Priority": "waiting behind jobs of higher priority",
    "Resources": "waiting for resources (nodes busy)",
    "Dependency": "waiting for a job it depends on",
    "BeginTime": "waiting for its begin time",
    "ReqNodeNotAvail": "nodes it needs are unavailable (down, drained or reserved for maintenance)",
    "Reservation": "waiting for its reservation",
    "JobHeldUser": "held by its user (scontrol release)",
    "JobHeldAdmin": "held by an administrator",
    "JobHoldMaxRequeue": "held after too many requeues (scontrol release)",
    "PartitionDown": "its partition is down",
    "PartitionInactive": "its partition is inactive",
    "NodeDown": "a node it needs is down",
    "Licenses": "waiting for licenses",
    "Prolog": "its prolog is running",
    "Cleaning": "its nodes are being cleaned up after its last run",
    "SchedDefer": "scheduling deferred",
    "JobArrayTaskLimit": "the array's task limit (%) is reached",
    "BurstBufferResources": "waiting for burst buffer space",
    "BurstBufferStageIn": "staging in burst buffer data",
    "PowerNotAvail": "waiting for power",
    "PowerReserved": "waiting for reserved power",
    "FrontEndDown": "front end nodes are down",
    "QOSUsageThreshold": "the QOS usage threshold is reached",
    "AccountingPolicy": "an accounting limit is reached",
    "FedJobLock": "waiting for the federation's job lock",
}


def reason_word(reason: str | None) -> str:
    """SLURM's reason word: ``ReqNodeNotAvail, UnavailableNodes:node1`` -> ``ReqNodeNotAvail``."""
    return re.split(r"[\s,(]", (reason or "").strip(), maxsplit=1)[0]


def never_clears(reason: str | None) -> bool:
    """Whether a pending job waiting for ``reason`` can never start as it is."""
    word = reason_word(reason)
    return word in NEVER or bool(_NEVER_LIMIT_RE.match(word))


def pending_reason(reason: str | None) -> bool:
    """Whether ``reason`` is one a job waits for (so it explains no end: a cancelled pending job
    keeps its last pending reason)."""
    word = reason_word(reason)
    if not word or word == "None":
        return False
    return (word in MAY_CLEAR or never_clears(word) or
            bool(re.match(r"^(?:QOS|Assoc|Max)\w*(?:Limit|PerAccount|Minutes|Unknown|GRES|BB|License|Energy|Billing)",
                          word)))


def in_words(reason: str | None) -> str:
    """A pending reason in words (the word itself stays, for a search in SLURM's docs)."""
    word = reason_word(reason)
    if not word:
        return ""
    if word in NEVER:
        return f"{NEVER[word][0]} ({word})"
    if word in MAY_CLEAR:
        rest = reason.strip()[len(word):].lstrip(" ,")
        return f"{MAY_CLEAR[word]} ({word}{': ' + rest if rest else ''})"
    if never_clears(word):
        return f"over a limit of its QOS or account ({word})"
    if pending_reason(word):
        return f"a limit of its QOS or account is reached for now ({word})"
    return word


# ---------------------------------------------------------------------------------------------
# What to change, from the job's and its partition's fields (scontrol show job/partition/node)


def leading_int(value: str | None) -> int | None:
    """The number a SLURM field starts with (``8``, ``8(x2)``, ``64000M``); None without one."""
    m = re.match(r"^\s*(\d+)", value or "")
    return int(m.group(1)) if m else None


def _limit(value: str | None) -> int | None:
    """A partition limit; None when UNLIMITED/INFINITE/absent."""
    if not value or value.strip().upper() in ("UNLIMITED", "INFINITE", "NONE", "N/A", "(NULL)"):
        return None
    return leading_int(value)


def _seconds(value: str | None) -> int | None:
    from halo_sched.values import parse_slurm_time

    if not value or value.strip().upper() in ("UNLIMITED", "INFINITE", "NONE", "N/A", "(NULL)"):
        return None
    try:
        return parse_slurm_time(value.strip())
    except (ValueError, TypeError):
        return None


def node_sizes(nodes: list[Mapping[str, str]], partition: str) -> list[tuple[int, int]]:
    """(CPUs, memory MiB) of each node of ``partition`` (``scontrol show node`` records)."""
    out = []
    for n in nodes:
        if partition in (n.get("Partitions") or "").split(","):
            cpus = leading_int(n.get("CPUTot")) or 0
            out.append((cpus, leading_int(n.get("RealMemory")) or 0))
    return out


def partition_limits(part: Mapping[str, str], nodes: list[Mapping[str, str]]) -> dict:
    """The limits a job of ``part`` (``scontrol show partition`` record) must fit."""
    name = part.get("PartitionName", "")
    sizes = node_sizes(nodes, name)
    max_nodes = _limit(part.get("MaxNodes"))
    total = leading_int(part.get("TotalNodes"))
    per_node_cpus = _limit(part.get("MaxCPUsPerNode"))
    cpus = max((c for c, _ in sizes), default=None)
    if per_node_cpus is not None and cpus is not None:
        cpus = min(cpus, per_node_cpus)
    mem = max((m for _, m in sizes), default=None)
    part_mem = _limit(part.get("MaxMemPerNode"))
    if part_mem is not None:
        mem = part_mem if mem is None else min(mem, part_mem)
    return {"name": name, "max_nodes": max_nodes, "total_nodes": total, "max_time_s": _seconds(part.get("MaxTime")),
            "max_time": part.get("MaxTime"), "cpus_per_node": cpus, "mem_mb": mem}


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def limit_problems(limits: dict, *, nodes: int | None, time_s: int | None, time_text: str | None,
                   cpus_per_task: int | None, mem_mb: int | None, cpus_field: str = "slurm.cpus_per_task",
                   nodes_field: str = "nodes") -> list[tuple[str, str]]:
    """(job file field, why) for each way the request exceeds the partition ``limits``."""
    name = limits["name"]
    out: list[tuple[str, str]] = []
    cap = min([x for x in (limits["max_nodes"], limits["total_nodes"]) if x is not None], default=None)
    if nodes is not None and cap is not None and nodes > cap:
        what = "at most" if limits["max_nodes"] is not None and limits["max_nodes"] == cap else "only"
        out.append((nodes_field, f"{nodes} but partition {name} has {what} {_plural(cap, 'node')} "
                                 f"(PartitionNodeLimit): lower {nodes_field} or pick another slurm.partition"))
    if time_s is not None and limits["max_time_s"] is not None and time_s > limits["max_time_s"]:
        out.append(("slurm.time", f"{time_text} but partition {name} allows at most {limits['max_time']} "
                                  "(PartitionTimeLimit): lower slurm.time or pick another slurm.partition"))
    if cpus_per_task is not None and limits["cpus_per_node"] is not None and cpus_per_task > limits["cpus_per_node"]:
        out.append((cpus_field, f"{cpus_per_task} but the nodes of partition {name} have at most "
                                f"{_plural(limits['cpus_per_node'], 'CPU')} (PartitionConfig): lower {cpus_field} "
                                "or pick another slurm.partition"))
    if mem_mb is not None and limits["mem_mb"] is not None and mem_mb > limits["mem_mb"]:
        out.append(("slurm.mem", f"{mem_mb}M but the nodes of partition {name} have at most "
                                 f"{limits['mem_mb']}M: lower slurm.mem or pick another slurm.partition"))
    return out


def explain(reason: str, job: Mapping[str, str], part: Mapping[str, str] | None,
            nodes: list[Mapping[str, str]]) -> str:
    """Why a job waiting for a never-clearing ``reason`` cannot start, naming what to change:
    from its ``scontrol show job`` fields and its partition's (when they could be read)."""
    word = reason_word(reason)
    if part is not None:
        problems = limit_problems(
            partition_limits(part, nodes),
            nodes=leading_int(job.get("NumNodes")),
            time_s=_seconds(job.get("TimeLimit")), time_text=job.get("TimeLimit"),
            cpus_per_task=leading_int(job.get("CPUs/Task")),
            mem_mb=leading_int(job.get("MinMemoryNode")) or None)
        # The one that SLURM named first, then the others.
        problems.sort(key=lambda p: f"({word})" not in p[1])
        if problems:
            return "; ".join(f"{field}: {msg}" for field, msg in problems)
    if word == "DependencyNeverSatisfied":
        dep = (job.get("Dependency") or "").strip()
        return (f"its dependency can never be met ({dep or word}: the job it waits for ended the wrong way; "
                "DependencyNeverSatisfied): fix the dependency in slurm.extra_args and submit again")
    what, change = NEVER.get(word, ("a request over a limit of its QOS or account", "change the request, "
                                    "slurm.qos or slurm.account"))
    return f"{what} ({word}): {change}"


__all__ = ["MAY_CLEAR", "NEVER", "explain", "in_words", "limit_problems", "never_clears", "node_sizes",
           "partition_limits", "pending_reason", "reason_word"]
