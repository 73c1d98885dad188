"""The job file: one backend-agnostic description of a multi-node torchrun job, read into a
validated :class:`JobSpec`.

``load(path)`` and ``loads(text)`` parse YAML into a JobSpec; every problem is reported with its
field path (and line, when it came from a file) as a :class:`~halo_sched.errors.SpecError`.
Reading is bounded: the file's size, YAML aliases and nesting are held to limits before any value
is built, and a pipe or device never blocks it. ``validated(spec)`` checks again a JobSpec that
was built or changed in code.

Validation is strict on purpose: a value that reaches a generated script must not be able to
change its meaning, so names and scheduler options are held to safe character sets
(halo_sched/values.py) by the models (halo_sched/models.py), and free text (env values, args,
setup) is quoted by the renderers.
"""
from __future__ import annotations

import functools
import os
import re
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic_core import ValidationError

from .errors import SpecError
from .jobfile_rules import JobFile, ScriptBase, cpu_notes
from .values import SBATCH_OPTIONS_REFUSED, SBATCH_OPTIONS_SET_BY, parse_go_duration, parse_size

if TYPE_CHECKING:  # pragma: no cover
    from .models import JobSpec

# The public names are load, loads, validated, json_schema and JobSpec. Parallelism, Trainer, the
# SBATCH_OPTIONS_* tables and the parsers are at home in models.py and values.py; they are named
# here too for code that imports them from halo_sched.spec (the models only when asked for).
__all__ = ["JobSpec", "checked_script", "from_dict", "from_record", "from_yaml", "json_schema", "load", "loads", "problems_from", "validated", "with_changes",
           "Parallelism", "Trainer", "SBATCH_OPTIONS_REFUSED", "SBATCH_OPTIONS_SET_BY", "parse_go_duration",
           "parse_size"]


def __getattr__(name: str) -> Any:
    if name in ("JobSpec", "Parallelism", "Trainer"):
        from . import models

        return getattr(models, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _line_index(text: str) -> dict[tuple, int]:
    """Map each YAML key path to its 1-based line, so errors can point into the file."""
    import yaml

    lines: dict[tuple, int] = {}

    def walk(root, top):
        # Iterative, and each node once: an alias shares its anchor's node, so a recursive walk
        # of a "billion laughs" file would never end (and a deep one would overflow the stack).
        seen: set[int] = set()
        todo = [(root, top)]
        while todo:
            node, path = todo.pop()
            if id(node) in seen:
                continue
            seen.add(id(node))
            if isinstance(node, yaml.MappingNode):
                for k, val in node.value:
                    key = k.value
                    lines[path + (key,)] = k.start_mark.line + 1
                    todo.append((val, path + (key,)))
            elif isinstance(node, yaml.SequenceNode):
                for i, item in enumerate(node.value):
                    lines[path + (i,)] = item.start_mark.line + 1
                    todo.append((item, path + (i,)))

    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except (yaml.YAMLError, RecursionError):
        return lines
    if root is not None:
        walk(root, ())
    return lines


_UNION_TAGS = {"int", "str", "float", "bool", "none", "dict", "list"}


def problems_from(err: ValidationError) -> list[tuple[tuple, str]]:
    out: list[tuple[tuple, str]] = []
    for e in err.errors(include_url=False):
        # Union members show up as loc parts ("int", "str", "list[str]"): not fields the user wrote.
        loc = tuple(x for x in e["loc"] if x not in ("function-after", "function-before")
                    and not (isinstance(x, str) and (x in _UNION_TAGS or "[" in x)))
        msg = e["msg"]
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
            # Checks across fields (model validators) name their field as "field: message".
            # (or a field of a section, "hang.timeout_s: message").
            m = re.fullmatch(r"([a-z_]+(?:\.[a-z_]+)?): (.*)", msg, re.S)
            if m and e["type"] == "value_error" and m.group(1).split(".")[0] in _fields_at(loc):
                loc, msg = loc + tuple(m.group(1).split(".")), m.group(2)
        if e["type"] == "extra_forbidden":
            msg = "unknown key" + _did_you_mean(loc) + " (see `halo-sched schema` for the fields this section accepts)"
        elif e["type"] == "missing":
            msg = "required field is missing"
        if out and out[-1][0] == loc:  # the members of one union: one problem
            out[-1] = (loc, f"{out[-1][1]}, or {msg[0].lower()}{msg[1:]}")
        else:
            out.append((loc, msg))
    return out


def _fields_at(loc: tuple) -> set[str]:
    """The fields of the section at ``loc`` (("servers", 0) -> a Server's); none for a value."""
    import typing

    from .models import JobSpec

    model: Any = JobSpec
    for part in loc:
        if isinstance(part, int):  # an item of a list[Model]
            model = next((a for a in typing.get_args(model) if hasattr(a, "model_fields")), None)
        else:
            field = getattr(model, "model_fields", {}).get(part)
            if field is None:
                return set()
            model = field.annotation
            # `Model | None` and `list[Model]`: the model (a list's items come with an index)
            if not hasattr(model, "model_fields") and typing.get_origin(model) is not list:
                model = next((a for a in typing.get_args(model) if hasattr(a, "model_fields")), None)
    return set(getattr(model, "model_fields", {}))


def _did_you_mean(loc: tuple) -> str:
    """", did you mean X?" for an unknown key at ``loc`` close to a field of its section."""
    import difflib

    if not loc or not isinstance(loc[-1], str):
        return ""
    close = difflib.get_close_matches(loc[-1], sorted(_fields_at(loc[:-1])), n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


def _fmt_loc(loc: tuple) -> str:
    s = ""
    for part in loc:
        if isinstance(part, int):
            s += f"[{part}]"
        else:
            s += ("." if s else "") + str(part)
    return s


SURROGATE = ("half of a UTF-16 surrogate pair, which is no character and cannot be written to a script "
             "or passed to a process")


def _key_text(key: Any) -> str:
    """A key as a field path shows it: as it is when it can be printed, else escaped; at most 40
    characters."""
    text = key if isinstance(key, str) else repr(key)
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            text = ascii(text)[1:-1]
    return text if len(text) <= 40 else text[:37] + "..."


def _surrogate(text: str) -> str | None:
    """The U+D800-U+DFFF a text holds, as 'U+D800', or None."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        return f"U+{ord(text[err.start]):04X}"
    return None


def content_problem(data: Any) -> tuple[tuple, str] | None:
    """What the job file's reader refuses in its text (:func:`loads`: the bounds on nesting and on
    values, keys that are not names, a lone surrogate, a value that contains itself), found in a
    job's content however it was built (a dict, a changed JobSpec): (the field's path, what is
    wrong), or None. (The text's size has no equal here: what an alias expands to is not bounded
    by it either; the models bound each value.) Iterative, each value visited once per place it
    is used (as YAML's aliases are counted), and bounded: it stops at the first problem, and the
    values bound ends it."""
    values = 0
    on_path: set[int] = set()
    # (value, its path, its depth) to visit; (None, id, None) to leave a container.
    todo: list[tuple[Any, Any, Any]] = [(data, (), 1)]
    while todo:
        value, path, depth = todo.pop()
        if depth is None:
            on_path.discard(path)
            continue
        values += 1
        if values > MAX_YAML_VALUES:
            return path[:1], f"more than {MAX_YAML_VALUES} values; a job file is far smaller"
        if depth > MAX_YAML_DEPTH:
            return path[:1], f"values nested more than {MAX_YAML_DEPTH} levels deep; a job file is far shallower"
        if isinstance(value, str):
            bad = _surrogate(value)
            if bad:
                return path, f"the text has {bad}, {SURROGATE}"
            continue
        if isinstance(value, dict):
            items = list(value.items())
        elif isinstance(value, (list, tuple, set, frozenset)):
            items = list(enumerate(value))
        else:
            continue  # a number, a boolean, None, or a type the models refuse by name
        if id(value) in on_path:
            return path, "a value contains itself"
        on_path.add(id(value))
        todo.append((None, id(value), None))
        for key, item in reversed(items):
            if isinstance(value, dict):
                values += 1
                if not isinstance(key, str):
                    return path, (f"key {_key_text(key)} is {type(key).__name__}, not a name; every key is a "
                                  "name (text)")
                bad = _surrogate(key)
                if bad:
                    return path, f"key {_key_text(key)} has {bad}, {SURROGATE}"
                key = _key_text(key)
            todo.append((item, path + (key,), depth + 1))
    return None


def _checked_content(data: Any, source: str | None = None, located=None) -> None:
    """SpecError naming the field when :func:`content_problem` finds one."""
    problem = content_problem(data)
    if problem is not None:
        loc, msg = problem
        raise SpecError([((located or _fmt_loc)(loc), msg)], source)


def from_dict(data: Any, source: str | None = None, text: str | None = None) -> JobSpec:
    """``data`` (a job file's YAML, read) validated by the models (halo_sched/models.py, with the
    checks of halo_sched/jobfile_rules.py): the one definition of a valid job file."""
    if not isinstance(data, dict):
        raise SpecError([("", "the job file must be a mapping of keys (name, nodes, trainer, ...)")], source)

    @functools.lru_cache(maxsize=1)
    def line_index() -> dict:  # only when there is something to report: it parses the YAML again
        return _line_index(text) if text else {}

    def located(loc: tuple) -> str:
        where, lines = _fmt_loc(loc), line_index()
        for n in range(len(loc), 0, -1):
            if lines.get(loc[:n]):
                return f"{where} (line {lines[loc[:n]]})"
        return where

    from .models import JobSpec

    # The same content as a job file, whatever its form: what the YAML reader refuses in a text
    # (a lone surrogate, nesting, the count of values) is refused here before the models read it.
    _checked_content(data, source, located)
    try:
        spec = JobSpec.model_validate(data)
    except ValidationError as err:
        raise SpecError([(located(loc), msg) for loc, msg in problems_from(err)], source) from None
    # Layout rules need the whole job (nodes x GPUs), so they run on the validated spec.
    import warnings

    from .layout import LayoutWarning, check as check_layout

    errors, notes = check_layout(spec)
    notes = notes + spec.slurm.warning_notes() + cpu_notes(spec)
    if errors:
        raise SpecError([(located(tuple(f.split("."))), msg) for f, msg in errors], source)
    for field, msg in notes:
        warnings.warn(f"{source + ': ' if source else ''}{located(tuple(field.split('.')))}: {msg}", LayoutWarning, stacklevel=2)
    return spec


MAX_JOB_FILE_BYTES = 1024 * 1024
# Bounds on what a job file may make the loader build, checked on the YAML events and the composed
# node graph BEFORE any Python value is constructed: a few hundred bytes of anchors can otherwise
# ask for gigabytes ("billion laughs"), and an alias inside its own anchor for an endless value.
MAX_YAML_VALUES = 100_000  # values after every alias is expanded
MAX_YAML_DEPTH = 64        # nesting, in the text and through aliases
MAX_YAML_ALIASES = 1_000   # `*name` references (a job file uses a handful)

_KEY_KINDS = {"null": "null (nothing)", "bool": "a boolean", "int": "a number", "float": "a number",
              "timestamp": "a date", "binary": "binary data"}


@functools.lru_cache(maxsize=1)
def _unique_key_loader():
    import yaml

    class Refused(yaml.MarkedYAMLError):
        """What the loader itself refuses (not a syntax error): reported with its line."""

        def __init__(self, problem: str, mark) -> None:
            super().__init__(problem=problem, problem_mark=mark)

    class Loader(yaml.SafeLoader):
        """SafeLoader that refuses a key given twice (plain YAML keeps the last one silently), a
        key that is not text, an alias inside its own anchor, and files that nest or alias beyond
        the bounds above, as it composes (before anything is built)."""

        def __init__(self, stream):
            super().__init__(stream)
            self.halo_open: dict[str, Any] = {}  # anchors whose value is still being read -> mark
            self.halo_depth = 0
            self.halo_aliases = 0

        def compose_node(self, parent, index):
            event = self.peek_event()
            if isinstance(event, yaml.AliasEvent):
                self.halo_aliases += 1
                if self.halo_aliases > MAX_YAML_ALIASES:
                    raise Refused(f"more than {MAX_YAML_ALIASES} aliases (*name); a job file needs far fewer",
                                  event.start_mark)
                if event.anchor in self.halo_open:
                    at = self.halo_open[event.anchor]
                    raise Refused(f"alias *{event.anchor} is inside the value of its own anchor &{event.anchor} "
                                  f"(line {at.line + 1}): a value cannot contain itself", event.start_mark)
                return super().compose_node(parent, index)
            if self.halo_depth >= MAX_YAML_DEPTH:
                raise Refused(f"values nested more than {MAX_YAML_DEPTH} levels deep; a job file is far shallower",
                              event.start_mark)
            anchor = getattr(event, "anchor", None)
            if anchor is not None and anchor not in self.anchors:  # (a duplicate: YAML's own error)
                self.halo_open[anchor] = event.start_mark
            self.halo_depth += 1
            try:
                return super().compose_node(parent, index)
            finally:
                self.halo_depth -= 1
                self.halo_open.pop(anchor, None)

        def construct_document(self, node):
            _check_expansion(node, Refused)
            return super().construct_document(node)

    def construct_mapping(loader, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *defaults`: SafeLoader merges below
                continue
            if key_node.tag == "tag:yaml.org,2002:bool" and key_node.style is None:
                # YAML 1.1 reads a plain on/off/yes/no as a boolean, also as a key: `retry: {on: [node]}`
                # would be {True: [...]}. A key is a name: it keeps the words written (the base
                # constructor below reads the same node, now a str).
                key_node.tag = "tag:yaml.org,2002:str"
            key = loader.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
            except TypeError:
                raise yaml.constructor.ConstructorError(None, None, "found unhashable key", key_node.start_mark) from None
            if not isinstance(key, str):
                kind = _KEY_KINDS.get(key_node.tag.rpartition(":")[2], type(key).__name__)
                raise Refused(f"key {key_node.value!r} is read by YAML as {kind}, not as a name; every key is a "
                              "name (quote it if this is the name you mean)", key_node.start_mark)
            if duplicate:
                raise Refused(f"duplicate key {key!r} (the first one would be silently lost)", key_node.start_mark)
            seen.add(key)
        return loader.construct_mapping(node, deep=deep)

    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)

    def construct_str(loader, node):
        value = loader.construct_scalar(node)
        if not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as err:  # "\ud800": YAML takes the escape, no file or argument can
                raise Refused(f"the text has U+{ord(value[err.start]):04X}, half of a UTF-16 surrogate pair, "
                              "which is no character and cannot be written to a script or passed to a process",
                              node.start_mark) from None
        return value

    Loader.add_constructor("tag:yaml.org,2002:str", construct_str)
    Loader.Refused = Refused
    return Loader


def _check_expansion(root, refused) -> None:
    """Refuse a document whose aliases expand to more than MAX_YAML_VALUES values or that nests
    deeper than MAX_YAML_DEPTH (a "billion laughs" file is a few hundred bytes), or whose node
    graph has a cycle. Counted on the composed node graph, each node once (memoized), so the
    check stays linear; a node met again while its own children are counted is a cycle (the
    composer refuses those first; this keeps the count finite whatever graph it is given)."""
    import yaml

    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    on_path: set[int] = set()

    def kids_of(node) -> list:
        return ([x for pair in node.value for x in pair] if isinstance(node, yaml.MappingNode)
                else list(node.value) if isinstance(node, yaml.SequenceNode) else [])

    stack = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            on_path.discard(key)
            kids = kids_of(node)
            size[key] = 1 + sum(size[id(k)] for k in kids)
            depth[key] = 1 + max((depth[id(k)] for k in kids), default=0)
            if size[key] > MAX_YAML_VALUES:
                raise refused(f"the document expands to more than {MAX_YAML_VALUES} values through its aliases "
                              "(anchors referencing anchors); a job file is far smaller", node.start_mark)
            if depth[key] > MAX_YAML_DEPTH:
                raise refused(f"values nested more than {MAX_YAML_DEPTH} levels deep; a job file is far shallower",
                              node.start_mark)
            continue
        if key in size:
            continue
        if key in on_path:
            raise refused("a value contains itself (an alias inside its own anchor)", node.start_mark)
        on_path.add(key)
        stack.append((node, True))
        stack.extend((k, False) for k in kids_of(node) if id(k) not in size)


def loads(text: str, source: str | None = None) -> JobSpec:
    import yaml

    if len(text) > MAX_JOB_FILE_BYTES:
        raise SpecError([("", f"the job file is {len(text)} characters; at most {MAX_JOB_FILE_BYTES} are read "
                              "(move large values into files the job reads)")], source)
    loader = _unique_key_loader()
    try:
        data = yaml.load(text, Loader=loader)  # noqa: S506 - a SafeLoader subclass
    except RecursionError:
        raise SpecError([("YAML", f"values nested too deeply to read (a job file nests at most "
                                  f"{MAX_YAML_DEPTH} levels)")], source) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "YAML"
        problem = getattr(err, "problem", None) or str(err)
        if not isinstance(err, loader.Refused):
            problem = f"YAML syntax error: {problem}"
        raise SpecError([(where, problem)], source) from None
    return from_dict(data, source, text)


_FILE_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket"),
               (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def _not_a_file(mode: int) -> str | None:
    """Why a file of this mode cannot be a job file (None: a regular file or a pipe)."""
    if stat.S_ISREG(mode) or stat.S_ISFIFO(mode):
        return None
    kind = next((k for test, k in _FILE_KINDS if test(mode)), "not a regular file")
    return f"is {kind}, not a regular file; give the path of a job file"


#: How long a job file given as a pipe (`validate <(envsubst < job.yaml)`, a named pipe) may take
#: to arrive whole: a pipe no one writes to ends the wait, never blocks it.
PIPE_READ_S = 10.0


def _read_pipe(fd: int, path: Path) -> bytes:
    """A pipe's bytes up to its end (the writer closed it), at most MAX_JOB_FILE_BYTES + 1, within
    PIPE_READ_S. ``fd`` is non-blocking; a named pipe with no writer reads as empty at once."""
    import select
    import time

    chunks: list[bytes] = []
    size, deadline = 0, time.monotonic() + PIPE_READ_S
    while size <= MAX_JOB_FILE_BYTES:
        try:
            chunk = os.read(fd, 65536)  # b"": the end (or a named pipe no one opened to write)
        except BlockingIOError:  # a writer, nothing from it yet
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise SpecError([("", f"{path} is a pipe that did not end within {PIPE_READ_S:g} s; give the path "
                                      "of a job file, or close the pipe's writing end")], str(path)) from None
            continue
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def load(path: str | Path) -> JobSpec:
    """Read and validate a job file: a regular file, or a pipe read until its end within
    PIPE_READ_S (a device or directory is refused without reading it, so nothing can make this
    block), at most MAX_JOB_FILE_BYTES."""
    p = Path(path)
    try:
        why = _not_a_file(os.stat(p).st_mode)  # before opening: opening a device can act on it
        if why:
            raise SpecError([("", f"{p} {why}")], str(p))
        # O_NONBLOCK: opening a named pipe waits for a writer otherwise, and what was checked
        # above may since have been replaced.
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            mode = os.fstat(f.fileno()).st_mode
            why = _not_a_file(mode)
            if why:
                raise SpecError([("", f"{p} {why}")], str(p))
            piped = stat.S_ISFIFO(mode)
            if piped:
                raw = _read_pipe(f.fileno(), p)
            else:
                raw = f.read(MAX_JOB_FILE_BYTES + 1)  # never more than the limit, whatever the file's size
        if len(raw) > MAX_JOB_FILE_BYTES:
            raise SpecError([("", f"the job file is larger than {MAX_JOB_FILE_BYTES} bytes (move large values "
                                  "into files the job reads)")], str(p))
        text = raw.decode("utf-8")
    except FileNotFoundError:
        raise SpecError([("", f"no such file: {p}")], str(p)) from None
    except (OSError, UnicodeDecodeError) as err:
        raise SpecError([("", f"cannot read: {err}")], str(p)) from None
    import hashlib

    spec = loads(text, str(p))
    spec._job_file = JobFile(str(p.resolve()), hashlib.sha256(raw).hexdigest())
    # A relative trainer.script is read from the job file's directory (a pipe's: the current one).
    cwd = os.getcwd()
    spec._script_base = ScriptBase(cwd if piped else os.path.dirname(spec._job_file.path), cwd, str(p), piped)
    return spec


def yaml_value(text: str) -> Any:
    """One value written as in a job file (the CLI's ``--set KEY=VALUE``): a YAML scalar
    (``4``, ``gpu``, ``true``, nothing for null) or a flow list or mapping (``[--lr, "0.1"]``),
    read by the job file's bounded reader. ValueError says why not."""
    import yaml

    try:
        return yaml.load(text, Loader=_unique_key_loader())  # noqa: S506 - a SafeLoader subclass
    except RecursionError:
        raise ValueError(f"nested more than {MAX_YAML_DEPTH} levels deep") from None
    except yaml.YAMLError as err:
        problem = " ".join(str(getattr(err, "problem", None) or err).split())
        raise ValueError(f"not a YAML value ({problem[:120]}); quote text that YAML reads otherwise") from None


def from_record(record: dict) -> JobSpec:
    """The spec a job was submitted with, from its record (``record["spec"]``, validated again),
    its relative ``trainer.script`` read from where the job file was (the record's job file and
    submit directory), as at the submit."""
    spec = from_dict(record.get("spec"), source=f"the record of {record.get('id')}")
    spec._script_base = ScriptBase.of_record(record)
    return spec


def checked_script(spec: Any, backend: str):
    """``spec.script_check(backend)`` (halo_sched/jobfile_rules.py: where a relative
    ``trainer.script`` is read from, and the path the nodes are given); a script that is not
    there is a SpecError naming ``trainer.script`` (with its line when the job file is unchanged)."""
    check = spec.script_check(backend)
    if check.problem:
        base = spec._script_base
        line = _line_in_file(spec.job_file, ("trainer", "script"))
        raise SpecError([(f"trainer.script{f' (line {line})' if line else ''}", check.problem)],
                        base.source if base else None)
    return check


def _line_in_file(job_file: JobFile | None, loc: tuple) -> int | None:
    """The line of ``loc`` in the job file read again, when it still holds the bytes read first."""
    import hashlib

    if job_file is None:
        return None
    try:
        fd = os.open(job_file.path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)  # a pipe never blocks
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return None
            raw = f.read(MAX_JOB_FILE_BYTES + 1)
        if hashlib.sha256(raw).hexdigest() != job_file.sha256:
            return None
        return _line_index(raw.decode("utf-8")).get(loc)
    except (OSError, UnicodeDecodeError):
        return None


def json_schema() -> dict:
    from .models import JobSpec

    return JobSpec.model_json_schema()


def _dumped(value: Any) -> Any:
    return value.model_dump(warnings=False) if hasattr(value, "model_dump") else value


def validated(spec: Any) -> JobSpec:
    """``spec`` validated again, as a job file is (``from_dict``: the fields, then the layout
    rules; its notes are not repeated), whatever built it: ``model_copy(update=...)`` and
    ``model_construct`` skip pydantic's validation, and ``JobSpec(...)`` skips the layout rules.
    Returns a new JobSpec; raises the SpecError a job file with the same content would."""
    from .models import JobSpec

    if not isinstance(spec, JobSpec):
        raise SpecError([("", f"expected a JobSpec (halo_sched.load or loads), got {type(spec).__name__}")])
    try:
        data = spec.model_dump(warnings=False)
    except Exception as err:  # noqa: BLE001 - a value no job file could hold
        raise SpecError([("", f"the spec holds a value that cannot be read back ({type(err).__name__})")]) from None
    # A section the spec never set and that still holds its default stays unset, as in the job
    # file: some rules hold only what a job file says (the hang default against a short time limit).
    defaults = JobSpec.model_fields
    for key in [k for k in data if k not in spec.model_fields_set and not defaults[k].is_required()]:
        default = defaults[key].get_default(call_default_factory=True)
        if _dumped(default) == data[key]:
            del data[key]
    _checked_content(data)
    try:
        checked = JobSpec.model_validate(data)
    except ValidationError as err:
        raise SpecError([(_fmt_loc(loc), msg) for loc, msg in problems_from(err)]) from None
    from .layout import check as check_layout

    errors, _ = check_layout(checked)
    if errors:
        raise SpecError(errors)
    checked._job_file = spec._job_file
    checked._attempt = spec._attempt
    checked._script_base = spec._script_base
    return checked


def from_yaml(source: "str | os.PathLike") -> JobSpec:
    """A JobSpec from YAML: ``source`` is a path (a ``pathlib.Path``, or a string naming a file
    that exists and holds no line break) read as :func:`load` reads it, else the YAML text itself
    (:func:`loads`). Raises SpecError naming each bad field."""
    if isinstance(source, os.PathLike) or (isinstance(source, str) and "\n" not in source and len(source) < 4096
                                           and os.path.isfile(source)):
        return load(source)
    if not isinstance(source, str):
        raise SpecError([("", f"expected YAML text or a path, got {type(source).__name__}")])
    return loads(source)


def _unset_defaults_dropped(spec: Any) -> dict:
    """The spec's fields as a job file would hold them: a section never set that still holds its
    default is left out (as :func:`validated` does, so the rules read what a job file says)."""
    from .models import JobSpec

    data = spec.model_dump(warnings=False)
    defaults = JobSpec.model_fields
    for key in [k for k in data if k not in spec.model_fields_set and not defaults[k].is_required()]:
        if _dumped(defaults[key].get_default(call_default_factory=True)) == data[key]:
            del data[key]
    return data


def with_changes(spec: Any, changes: dict, *, source: str | None = None) -> JobSpec:
    """A new JobSpec: ``spec`` with each dotted field of ``changes`` set
    (``{"trainer.args": ["--lr", "0.1"], "slurm.partition": "gpu", "servers.0.port": 8000}``),
    validated whole as a job file is. A bad path or value is a SpecError naming the field. The
    result is no longer the job file ``spec`` was loaded from: its record keeps no job file; a
    relative ``trainer.script`` is still read from that job file's directory. ``source`` names
    the result in errors and warnings (the CLI's ``--set``: the job file with its changes)."""
    from .models import JobSpec

    if not isinstance(spec, JobSpec):
        raise SpecError([("", f"expected a JobSpec, got {type(spec).__name__}")])
    if not isinstance(changes, dict):
        raise SpecError([("", f"changes must be a mapping of dotted field paths to values, got {type(changes).__name__}")])
    data = _unset_defaults_dropped(spec)
    for path, value in changes.items():
        parts = path.split(".") if isinstance(path, str) else []
        if not parts or not all(parts):
            raise SpecError([(str(path)[:80], "a field path is dotted names, like trainer.args or slurm.partition")],
                            source)
        node: Any = data
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            here = ".".join(parts[:i + 1])
            if isinstance(node, list):
                if not part.isdigit() or int(part) >= len(node):
                    raise SpecError([(here, f"no item {part} in a list of {len(node)}")], source)
                key: Any = int(part)
            elif isinstance(node, dict):
                key = part
                if not last and node.get(key) is None:
                    node[key] = {}  # a section left unset (or null): set it
            else:
                raise SpecError([(here, f"{'.'.join(parts[:i]) or 'the spec'} is a value, not a section")], source)
            if last:
                node[key] = value
            else:
                node = node[key]
    changed = from_dict(data, source=source or "with_changes")
    changed._script_base = spec._script_base
    return changed
