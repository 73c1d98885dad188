"""Will the cluster send ``slurm.signal``'s warning when it preempts the job? (pure)

sbatch's ``--signal`` warning comes before the time limit on every cluster. When a job is
PREEMPTED, slurmctld sends it only where it is told to: ``PreemptParameters=send_user_signal``
(the key since Slurm 23.02) or ``SlurmctldParameters=preempt_send_user_signal`` (the older
spelling, the only one 22.05 reads; both are substring matches, any case:
``src/slurmctld/node_scheduler.c`` ``_preempt_jobs``). Otherwise a preempted job's tasks get
SIGCONT and SIGTERM when its grace time starts, and are killed when it ends
(``_job_check_grace_internal`` in ``src/slurmctld/preempt.c``, 22.05; ``src/interfaces/preempt.c``
since 23.02): torchrun takes SIGTERM as the end of the job and no rank saves a checkpoint. A
cluster whose ``PreemptMode`` is OFF (or ``PreemptType`` preempt/none) never preempts at all, so
the warning comes before the time limit only.

What is read is ``scontrol show config`` (``Key = Value`` lines; 22.05 prints no
``PreemptParameters`` line at all). Partitions and QOSes may set their own PreemptMode and
GraceTime; this reads the cluster-wide settings.
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from ...models import JobSpec


_LINE_RE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\s*=\s?(.*?)\s*$")
# PreemptParameters=send_user_signal is read from this release on.
PREEMPT_PARAMETERS_SINCE = (23, 2)


def parse_config(text: str) -> dict[str, str]:
    """``scontrol show config`` -> {key: value}; the first of a repeated key wins (later sections
    such as cgroup.conf's reuse names), ``(null)`` reads as empty."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        m = _LINE_RE.match(line)
        if m and m.group(1) not in out:
            out[m.group(1)] = "" if m.group(2) == "(null)" else m.group(2)
    return out


def _version(config: dict[str, str]) -> tuple[int, int] | None:
    m = re.match(r"(\d+)\.(\d+)", config.get("SLURM_VERSION", ""))
    return (int(m.group(1)), int(m.group(2))) if m else None


def sends_warning_on_preemption(config: dict[str, str]) -> bool:
    """slurmctld sends the job's --signal warning when it preempts (as node_scheduler.c reads it)."""
    if "preempt_send_user_signal" in config.get("SlurmctldParameters", "").lower():
        return True
    version = _version(config)
    reads_key = version is None or version >= PREEMPT_PARAMETERS_SINCE
    return reads_key and "send_user_signal" in config.get("PreemptParameters", "").lower()


def preempts(config: dict[str, str]) -> bool:
    mode = config.get("PreemptMode", "").upper()
    return not (mode.startswith("OFF") or config.get("PreemptType", "").lower() in ("preempt/none", ""))


def key_to_set(config: dict[str, str]) -> str:
    """What the cluster's admins would add, for its release."""
    version = _version(config)
    if version is not None and version < PREEMPT_PARAMETERS_SINCE:
        return (f"SlurmctldParameters=preempt_send_user_signal (Slurm {config['SLURM_VERSION']} reads no "
                "PreemptParameters=send_user_signal; that key arrived in 23.02)")
    return "PreemptParameters=send_user_signal"


def preemption_notes(spec: JobSpec, config: dict[str, str]) -> list[str]:
    """One line per reason the job's warning will not come when the cluster preempts it; none
    when the job has no ``slurm.signal`` or the cluster sends it."""
    if spec.slurm.signal is None:
        return []
    signal = spec.slurm.signal
    sends = sends_warning_on_preemption(config)
    if not preempts(config):
        lines = [f"slurm.signal {signal}: this cluster does not preempt jobs (PreemptType="
                 f"{_shown(config, 'PreemptType')}, PreemptMode={_shown(config, 'PreemptMode')}): the warning "
                 "comes before the time limit only (and with `halo-sched cancel --signal`)"]
        if not sends:
            lines.append(f"slurm.signal {signal}: were preemption turned on, it would not send the warning either: "
                         f"{_missing(config)}")
        return lines
    if sends:
        return []
    return [f"slurm.signal {signal}: this cluster preempts jobs (PreemptMode={config.get('PreemptMode')}) without "
            f"sending the warning: {_missing(config)}; a preempted job's tasks get SIGTERM at once and no rank saves "
            "a checkpoint. Only the time limit (and `halo-sched cancel --signal`) sends it"]


def _shown(config: dict[str, str], key: str) -> str:
    """A setting as scontrol printed it: ``(null)`` where it printed that (24.11 does for an unset
    PreemptType; 22.05 prints preempt/none), ``?`` only where the key is missing."""
    if key not in config:
        return "?"
    return config[key] or "(null)"


def _missing(config: dict[str, str]) -> str:
    have = [f"{k}={config[k] or '(null)'}" for k in ("PreemptParameters", "SlurmctldParameters") if k in config]
    return f"its configuration lacks {key_to_set(config)} ({', '.join(have) or 'neither key set'})"


def describe(config: dict[str, str]) -> str:
    """One line: the cluster and its preemption settings, as read."""
    name = config.get("ClusterName") or "?"
    keys = ("PreemptType", "PreemptMode", "PreemptParameters")
    settings = ", ".join(f"{k}={config.get(k) or '(null)'}" for k in keys if k in config)
    return f"cluster {name}, Slurm {config.get('SLURM_VERSION') or '?'}: {settings or 'no preemption settings shown'}"
