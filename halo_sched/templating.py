"""The one Jinja2 environment every renderer uses, and the quoting filters its templates need.

Templates live in the repository's top-level ``templates/`` (shipped in the wheel as
``halo_sched/templates``). Every user string reaches a template through one of these filters;
the templates never interpolate raw user text.
"""
from __future__ import annotations

import functools
import re
from pathlib import Path

import jinja2

_PKG = Path(__file__).resolve().parent


def template_dir() -> Path:
    shipped = _PKG / "templates"
    return shipped if shipped.is_dir() else _PKG.parent / "templates"


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def sh_quote(value: str) -> str:
    """A bash word that expands to exactly ``value``.

    Plain text is single-quoted (' as '\\''). Text with control characters uses bash's $'...'
    with escapes instead, so the script itself holds none: sbatch rejects any script containing
    a carriage return, and a raw newline would make one value span script lines.
    """
    if value and re.fullmatch(r"[A-Za-z0-9_@%+=:,./-]+", value):
        return value
    if _CONTROL.search(value):
        body = value.replace("\\", "\\\\").replace("'", "\\'")
        body = _CONTROL.sub(lambda m: {"\n": "\\n", "\t": "\\t", "\r": "\\r"}.get(m.group(), f"\\x{ord(m.group()):02x}"), body)
        return "$'" + body + "'"
    return "'" + value.replace("'", "'\\''") + "'"


_CONTROL_BUT_LINES = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def sh_block(value: str | list[str]) -> str:
    """Like :func:`sh_quote`, but text of several lines (or a list of lines, joined) stays
    several lines (single-quoted, readable in the script) unless it holds other control characters."""
    if isinstance(value, (list, tuple)):
        value = "\n".join(value)
    if not _CONTROL_BUT_LINES.search(value):
        return "'" + value.replace("'", "'\\''") + "'"
    return sh_quote(value)


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
    if isinstance(value, (int, float)):
        return str(value)
    return '"' + hcl_escape(str(value)) + '"'


def hcl_heredoc(value: str, indent: str = "") -> str:
    """An HCL heredoc (``<<TAG ... TAG``) for a multi-line literal, with a tag absent from it."""
    body = value.replace("${", "$${").replace("%{", "%%{")
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
        loader=jinja2.FileSystemLoader(str(template_dir())),
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
    return env


def render_template(name: str, **context) -> str:
    return environment().get_template(name).render(**context)
