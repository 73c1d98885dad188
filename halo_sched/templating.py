"""The one Jinja2 environment every renderer uses, and the filters its templates need.

Templates live in ``halo_sched/templates/`` (package data: the wheel carries them); shell that
several scripts write (the deadline loop, the loopback check, the warning traps, ``halo_fail``,
torchrun's Python) is defined once there, as macros in ``fragments.sh.j2``. Every value
a template pastes into a script or a job goes through a filter, whatever the model holds (``model_copy(update=...)`` does not validate):

* free text is quoted for where it goes: ``sh`` (one bash word), ``sh_block`` (a multi-line bash
  string), ``hcl`` / ``hcl_heredoc`` (an HCL string);
* where quoting is impossible (an ``#SBATCH`` line, a variable name, an HCL key, a name used in
  paths or patterns, a number in arithmetic) the value is checked again against a full-match
  pattern as strict as the job file's (``job_name``, ``var``, ``server_name``, ``iface``,
  ``signal``, ``sbatch_opt``, ``hcl_key``, ``digits``, ``num``): anything else is a
  :class:`RenderError`.

The render modules build their f-strings from the same checks (:func:`check`, :func:`checked_int`).
The public API validates every spec first (``spec.validated``): these checks are the second line.
"""
from __future__ import annotations

import functools
import re
from pathlib import Path

import jinja2

from . import values
from .errors import SpecError

TEMPLATES = Path(__file__).resolve().parent / "templates"


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class RenderError(SpecError):
    """A value no renderer will write: the spec holds what no validated job file can (it was built
    or changed without validation). Exit code 2, like any invalid spec."""


# Full-match patterns for values pasted where nothing can quote them: the job file's own rule
# for the field (values.py, one definition each), plus a few that only the renderers write. A valid
# job renders; anything else does not.
PATTERNS = {
    "job name": values.NAME_RE,  # an #SBATCH line, paths, Nomad ids
    # a Nomad job id: the name, or the name and a submission's date and token
    "job id": re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}"),
    "variable name": values.ENV_NAME_RE,  # `export NAME=`, `${NAME}`
    "server name": values.SERVER_NAME_RE,  # variable, group and file names, unquoted in the scripts
    "network interface": values.IFACE_RE,
    "signal name": re.compile(r"[A-Z][A-Z0-9]{0,15}"),
    "sbatch option": values.SBATCH_ARG_RE,  # one word on an #SBATCH line
    "SLURM word": values.SLURM_WORD_RE,  # slurm.partition, account, qos, mem, container mounts
    "SLURM time": values.SLURM_TIME_RE,
    "SLURM constraint": values.SLURM_CONSTRAINT_RE,
    # an HCL attribute name (bare, before `=`)
    "HCL key": re.compile(r"[A-Za-z_][A-Za-z0-9_-]*"),
    # a number already written as text
    "count": re.compile(r"[0-9]{1,19}"),
    "Python module": values.MODULE_RE,
}
_MAX_INT = 2**63 - 1


def _refuse(what: str, kind: str, shown: str) -> RenderError:
    return RenderError([(what, f"{shown} is not a valid {kind}, and it would be written unquoted into the "
                               "rendered job; validate the spec (halo_sched.load/loads, or JobSpec.model_validate "
                               "after model_copy) and fix the field")])


def check(value, kind: str, what: str = "") -> str:
    """``value`` if it fully matches the pattern ``kind`` (a key of PATTERNS); else RenderError."""
    if isinstance(value, str) and PATTERNS[kind].fullmatch(value):
        return value
    shown = ascii(value)[:80] if isinstance(value, str) else f"a {type(value).__name__}"
    raise _refuse(what or kind, kind, shown)


def checked_int(value, what: str = "a number") -> int:
    """``value`` if it is an int (not a bool, not a string of digits) in 0..2**63-1."""
    if type(value) is int and 0 <= value <= _MAX_INT:
        return value
    shown = ascii(value)[:80] if isinstance(value, (str, int)) else f"a {type(value).__name__}"
    raise _refuse(what, "whole number", shown)


def checked_text(value, what: str) -> str:
    """Free text to be quoted: a str without NUL (no process argument or environment holds one)."""
    if not isinstance(value, str):
        raise RenderError([(what, f"a {type(value).__name__} where text was expected; validate the spec "
                                  "(halo_sched.load/loads, or JobSpec.model_validate after model_copy)")])
    if "\x00" in value:
        raise RenderError([(what, "contains a NUL byte, which no process argument or environment can carry")])
    return value


def sh_quote(value: str, what: str = "a value") -> str:
    """A bash word that expands to exactly ``value``.

    Plain text is single-quoted (' as '\\''). Text with control characters uses bash's $'...'
    with escapes instead, so the script itself holds none: sbatch rejects any script containing
    a carriage return, and a raw newline would make one value span script lines.
    """
    checked_text(value, what)
    if value and re.fullmatch(r"[A-Za-z0-9_@%+=:,./-]+", value):
        return value
    if _CONTROL.search(value):
        body = value.replace("\\", "\\\\").replace("'", "\\'")
        body = _CONTROL.sub(lambda m: {"\n": "\\n", "\t": "\\t", "\r": "\\r"}.get(m.group(), f"\\x{ord(m.group()):02x}"), body)
        return "$'" + body + "'"
    return "'" + value.replace("'", "'\\''") + "'"


_CONTROL_BUT_LINES = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def sh_block(value: str | list[str], what: str = "a value") -> str:
    """Like :func:`sh_quote`, but text of several lines (or a list of lines, joined) stays
    several lines (single-quoted, readable in the script) unless it holds other control characters."""
    if isinstance(value, (list, tuple)):
        value = "\n".join(checked_text(line, what) for line in value)
    checked_text(value, what)
    if not _CONTROL_BUT_LINES.search(value):
        return "'" + value.replace("'", "'\\''") + "'"
    return sh_quote(value, what)


def hcl_escape(value: str) -> str:
    """Body of an HCL2 quoted string whose value is exactly ``value``.

    HCL2 interpolates ``${`` and runs directives at ``%{``; neither may reach it unescaped.
    """
    out = []
    for ch in value:
        if ch == "\\":
            out.append("\\\\")
        elif ch == '"':
            out.append('\\"')
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    s = "".join(out)
    # `${NAME}` (a reference Nomad interpolates at run time) stays readable as `$${NAME}`. Any
    # other `${`, and every `%{`, becomes a \u escape: just as literal in HCL (tests parse every
    # rendered job with HashiCorp's parser), and no template sequence a reader could mistake.
    s = re.sub(r"\$\{(?=([A-Za-z0-9_.-]*)\})|\$\{", lambda m: "$${" if m.group(1) is not None else "$\\u007b", s)
    return s.replace("%{", "\\u0025{")


def hcl_string(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if type(value) is int:
        return str(value)
    if type(value) is float and value == value and abs(value) != float("inf"):
        return repr(value)
    return '"' + hcl_escape(checked_text(value, "an HCL value")) + '"'


def hcl_heredoc(value: str, indent: str = "") -> str:
    """An HCL heredoc (``<<TAG ... TAG``) for a multi-line literal, with a tag absent from it."""
    body = checked_text(value, "an HCL value").replace("${", "$${").replace("%{", "%%{")
    tag, n = "EOT", 0
    lines = body.split("\n")
    while any(line.strip() == tag for line in lines):
        n += 1
        tag = f"EOT{n}"
    if not body.endswith("\n"):
        body += "\n"
    return f"<<{tag}\n{body}{tag}"


def heredoc_tag(body: str, base: str) -> str:
    """A shell heredoc delimiter that does not occur as a line of ``body``."""
    lines = set(body.split("\n"))
    tag, n = base, 0
    while tag in lines:
        n += 1
        tag = f"{base}_{n}"
    return tag


def _bytecode_cache():
    """Compiled templates kept between runs (a per-user temporary directory, keyed by each
    template's source): compiling them is a third of a render's start-up."""
    try:
        return jinja2.FileSystemBytecodeCache()
    except (OSError, RuntimeError):  # no safe directory to keep them in: compile every time
        return None


@functools.lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
        bytecode_cache=_bytecode_cache(),
    )
    env.filters["sh"] = sh_quote
    env.filters["sh_block"] = sh_block
    env.filters["hcl"] = hcl_string
    env.filters["hcl_heredoc"] = hcl_heredoc
    env.filters["num"] = checked_int
    for name, kind in _WORD_FILTERS.items():
        env.filters[name] = functools.partial(_word_filter, kind)
    return env


# Template filter -> the PATTERNS entry it checks; ``{{ spec.name | job_name("name") }}``.
_WORD_FILTERS = {
    "job_name": "job name", "var": "variable name", "server_name": "server name", "iface": "network interface",
    "signal": "signal name", "sbatch_opt": "sbatch option", "hcl_key": "HCL key", "digits": "count",
}


def _word_filter(kind: str, value, what: str = "") -> str:
    return check(value, kind, what)


def render_template(name: str, **context) -> str:
    return environment().get_template(name).render(**context)
