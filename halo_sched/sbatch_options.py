"""sbatch's options as halo-sched knows them: the one table of their names (long and short) and
the kind of value each takes, and :class:`Setting`, one option with its typed value.

A setting is made once, from the launch plan (backends/slurm/render.py ``sbatch_request``) or
from one ``--name[=value]`` of ``slurm.extra_args`` when the job file is loaded
(:func:`parse_setting`, exit 2 naming the field on a bad value); every view of it is written
from the typed value: the script's ``#SBATCH`` line, sbatch's command line, slurmrestd's job
description, pyslurm's attributes. Nothing reads an option back out of rendered text.

No pydantic and no I/O: the job file's checks (jobfile_rules.py) import it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

from .values import SBATCH_ARG_RE, SLURM_TIME_RE, parse_slurm_mem, parse_slurm_time, parse_warning


class Time(NamedTuple):
    """A time limit as sbatch takes it (``04:00:00``), and what it means."""

    text: str
    seconds: int | None  # None: UNLIMITED

    @property
    def minutes(self) -> int | None:
        """Minutes, rounded up (sbatch's time_str2mins)."""
        return None if self.seconds is None else -(-self.seconds // 60)


class Memory(NamedTuple):
    """A memory size as sbatch takes it (``64G``), and its MiB (src/common/proc_args.c str_to_mbytes)."""

    text: str
    mib: int


class Signal(NamedTuple):
    """``--signal=[{R|B}:]SIG[@secs]``; ``seconds`` None: sbatch's default (60 s)."""

    flags: str
    signal: str  # the name without SIG: USR2
    seconds: int | None


# ---------------------------------------------------------------------------------------------
# Kinds: parse (the text after "=", or None without one) -> value; text(value) -> what follows "=".


class Kind(NamedTuple):
    parse: Callable[[str | None], Any]
    text: Callable[[Any], str | None] = lambda v: None if v is None else str(v)


def _needs(value: str | None) -> str:
    if value is None or value == "":
        raise ValueError("needs a value (--name=value)")
    return value


def _none(value: str | None) -> None:
    if value is not None:
        raise ValueError("takes no value")
    return None


def _count(value: str | None) -> int:
    text = _needs(value)
    if not re.fullmatch(r"[0-9]{1,9}", text):
        raise ValueError(f"{text!r} is not a whole number")
    return int(text)


def _time(value: str | None) -> Time:
    text = _needs(value)
    if not SLURM_TIME_RE.fullmatch(text):
        raise ValueError(f"{text!r} is not a SLURM time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS")
    return Time(text, parse_slurm_time(text))


def _memory(value: str | None) -> Memory:
    text = _needs(value)
    return Memory(text, parse_slurm_mem(text))


def _signal(value: str | None) -> Signal:
    parsed = parse_warning(_needs(value))
    if parsed is None:
        raise ValueError(f"{value!r} is not [B:]SIGNAL[@seconds]")
    return Signal(*parsed)


def _signal_text(w: Signal) -> str:
    return (f"{w.flags}:" if w.flags else "") + w.signal + (f"@{w.seconds}" if w.seconds is not None else "")


def _node_list(value: str | None) -> tuple[str, ...]:
    """``node[1-3],node5`` -> ``("node[1-3]", "node5")``: the commas inside a host range's
    brackets are not separators."""
    items, depth, cur = [], 0, ""
    for ch in _needs(value):
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
        else:
            cur += ch
    items.append(cur)
    if depth != 0 or not all(items):
        raise ValueError(f"{value!r} is not a node list (HOST[,HOST...], host ranges as node[1-3])")
    return tuple(items)


def _gpus(value: str | None) -> str:
    text = _needs(value)
    if not re.fullmatch(r"(?:[A-Za-z0-9_.-]+:)?\d+", text):
        raise ValueError(f"{text!r} is not [TYPE:]COUNT")
    return text


def _gres(value: str | None) -> tuple[str, ...]:
    items = tuple(re.sub(r"^gres[:/]", "", i) for i in _needs(value).split(","))
    if not all(items):
        raise ValueError(f"{value!r} has an empty item")
    return items


def _one_of(*words: str, bare: bool = False) -> Callable[[str | None], str | None]:
    def parse(value: str | None) -> str | None:
        if value is None and bare:
            return None
        text = _needs(value).lower()
        if text not in words:
            raise ValueError(f"{value!r} is not {', '.join(words[:-1])} or {words[-1]}")
        return text
    return parse


def _yes_no(value: str | None) -> bool:
    if value is None or value.lower() in ("yes", "1", "true"):
        return True
    if value.lower() in ("no", "0", "false"):
        return False
    raise ValueError(f"{value!r} is not yes or no")


# sbatch --mail-type names (sbatch(1)).
MAIL_TYPES = ("NONE", "BEGIN", "END", "FAIL", "REQUEUE", "ALL", "INVALID_DEPEND", "STAGE_OUT", "TIME_LIMIT",
              "TIME_LIMIT_90", "TIME_LIMIT_80", "TIME_LIMIT_50", "ARRAY_TASKS")


def _mail_types(value: str | None) -> tuple[str, ...]:
    names = tuple(n.upper() for n in _needs(value).split(","))
    bad = [n for n in names if n not in MAIL_TYPES]
    if bad:
        raise ValueError(f"{', '.join(bad)}: not a mail type ({', '.join(MAIL_TYPES)})")
    return names


def _optional_count(value: str | None) -> int | None:
    return None if value is None else _count(value)


def _no_kill(value: str | None) -> str | None:
    if value is not None and value.lower() != "off":
        raise ValueError("takes no value, or off")
    return None if value is None else "off"


def _zero_one(value: str | None) -> bool:
    if _needs(value) not in ("0", "1"):
        raise ValueError(f"{value!r} is not 0 or 1")
    return value == "1"


TEXT = Kind(_needs)
FLAG = Kind(_none)
COUNT = Kind(_count)
TIME = Kind(_time, lambda v: v.text)
MEMORY = Kind(_memory, lambda v: v.text)
NODES = Kind(_node_list, ",".join)
LIST = Kind(_gres, ",".join)
#: An option sbatch takes that this table does not type (a site's SPANK plugin's, such as pyxis's
#: --container-image): sbatch's command line carries it as written; slurmrestd and pyslurm have
#: no field for it and refuse it.
UNTYPED = Kind(lambda v: v)


class Option(NamedTuple):
    long: str
    short: str | None
    kind: Kind
    #: Only on sbatch's command line, never an #SBATCH line: --export, which a submitter's
    #: SBATCH_EXPORT would override from the script (its environment beats #SBATCH lines).
    command_line_only: bool = False


# Every sbatch option halo-sched writes or lets a job file give, each once: its long name, its
# one letter (sbatch(1)), the kind of its value. The transports translate these names.
OPTIONS: dict[str, Option] = {o.long: o for o in (
    Option("job-name", "J", TEXT),
    Option("nodes", "N", COUNT),  # sbatch also takes "2-4"; halo-sched asks for an exact count
    Option("ntasks", "n", COUNT),
    Option("ntasks-per-node", None, COUNT),
    Option("cpus-per-task", "c", COUNT),
    Option("mincpus", None, COUNT),
    Option("time", "t", TIME),
    Option("time-min", None, TIME),
    Option("partition", "p", TEXT),
    Option("account", "A", TEXT),
    Option("qos", "q", TEXT),
    Option("reservation", None, TEXT),
    Option("comment", None, TEXT),
    Option("wckey", None, TEXT),
    Option("licenses", "L", TEXT),
    Option("dependency", "d", TEXT),
    Option("array", "a", TEXT),
    Option("prefer", None, TEXT),
    Option("constraint", "C", TEXT),
    Option("cluster-constraint", None, TEXT),
    Option("clusters", "M", NODES),
    Option("mail-user", None, TEXT),
    Option("mail-type", None, Kind(_mail_types, ",".join)),
    Option("container", None, TEXT),
    Option("begin", "b", TEXT),
    Option("deadline", None, TEXT),
    Option("output", "o", TEXT),
    Option("error", "e", TEXT),
    Option("input", "i", TEXT),
    Option("open-mode", None, Kind(_one_of("append", "truncate"))),
    Option("chdir", "D", TEXT),
    Option("export", None, TEXT, command_line_only=True),
    Option("nodelist", "w", NODES),
    Option("exclude", "x", NODES),
    Option("mem", None, MEMORY),
    Option("mem-per-cpu", None, MEMORY),
    Option("mem-per-gpu", None, MEMORY),
    Option("tmp", None, MEMORY),
    Option("threads-per-core", None, COUNT),
    Option("sockets-per-node", None, COUNT),
    Option("cores-per-socket", None, COUNT),
    Option("core-spec", "S", COUNT),
    Option("thread-spec", None, COUNT),
    Option("gpus", "G", Kind(_gpus)),
    Option("gpus-per-node", None, Kind(_gpus)),
    Option("gpus-per-task", None, Kind(_gpus)),
    Option("cpus-per-gpu", None, COUNT),
    Option("gpu-bind", None, TEXT),
    Option("gres", None, LIST),
    Option("network", None, TEXT),
    Option("signal", None, Kind(_signal, _signal_text)),
    Option("exclusive", None, Kind(_one_of("user", "mcs", "topo", bare=True))),
    Option("oversubscribe", "s", FLAG),
    Option("requeue", None, FLAG),
    Option("no-requeue", None, FLAG),
    Option("hold", "H", FLAG),
    Option("nice", None, Kind(_optional_count)),
    Option("kill-on-invalid-dep", None, Kind(_yes_no, lambda v: "yes" if v else "no")),
    Option("spread-job", None, FLAG),
    Option("use-min-nodes", None, FLAG),
    Option("wait-all-nodes", None, Kind(_zero_one, lambda v: "1" if v else "0")),
    Option("no-kill", "k", Kind(_no_kill)),
    Option("contiguous", None, FLAG),
    Option("overcommit", "O", FLAG),
    # Refused in a job file (values.SBATCH_OPTIONS_REFUSED); here for their short letters.
    Option("wrap", None, TEXT),
    Option("test-only", None, FLAG),
    Option("wait", "W", FLAG),
)}
#: sbatch's one-letter options -> the long ones.
SHORT: dict[str, str] = {o.short: o.long for o in OPTIONS.values() if o.short}


@dataclass(frozen=True)
class Setting:
    """One sbatch option with its value, typed by the option's kind (None for a flag)."""

    option: str  # the long name, without dashes
    value: Any = None

    @property
    def typed(self) -> bool:
        return self.option in OPTIONS

    @property
    def command_line_only(self) -> bool:
        return self.typed and OPTIONS[self.option].command_line_only

    def value_text(self) -> str | None:
        """The value as sbatch's text (what follows ``=``), or None."""
        return (OPTIONS[self.option].kind if self.typed else UNTYPED).text(self.value)

    def text(self) -> str:
        """``--name`` or ``--name=value``: an #SBATCH line's word and sbatch's argument alike."""
        value = self.value_text()
        return f"--{self.option}" + ("" if value is None else f"={value}")


def parse_setting(arg: str) -> Setting:
    """One ``--name`` or ``--name=value`` -> its typed Setting; ValueError naming what is wrong.
    A name this table does not know stays as written (``UNTYPED``); a prefix of one it knows
    must be written out (sbatch would expand it)."""
    if not SBATCH_ARG_RE.fullmatch(arg):
        raise ValueError(f"{arg!r}: each sbatch option is --name or --name=value, without spaces, quotes, '#', '$' "
                         "or '`'")
    name, eq, value = arg[2:].partition("=")
    option = OPTIONS.get(name)
    if option is None:
        longer = [f"--{o}" for o in OPTIONS if o.startswith(name)]
        if longer:
            raise ValueError(f"{arg!r}: write the option's full name ({' or '.join(longer[:3])}): slurmrestd and "
                             "pyslurm know full names only")
        return Setting(name, value if eq else None)
    try:
        return Setting(name, option.kind.parse(value if eq else None))
    except ValueError as e:
        raise ValueError(f"{arg!r}: --{name} {e}") from None
