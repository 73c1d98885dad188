"""Writes halo_sched/jobfile_validator.py, the compiled job-file validator, from the models.

    python -m halo_sched.jobfile_codegen          # rewrite it (after changing models.py)
    python -m halo_sched.jobfile_codegen --check  # exit 1 when it is stale (tests/test_jobfile_validator.py)

The models (halo_sched/models.py) stay the job file's one definition. pydantic compiles each into
a core schema, which pydantic-core turns into a validator; this module writes JobSpec's core
schema out as Python source, with every reference to the models replaced by what needs no
pydantic model to import:

- a section's class -> a :class:`~halo_sched.jobfile_rules.View` subclass of the same name, with
  the section's methods (its ``<Section>Methods`` mixin) and private attributes;
- a check -> the same function of halo_sched/jobfile_rules.py or halo_sched/values.py (a check
  defined anywhere else, a lambda say, is refused: it could not be imported without the models);
- a default made by a factory -> the same value, rebuilt each time (a section: its defaults);
- pydantic's JSON-Schema hooks and serializers -> dropped (the validator only reads).

Anything else it meets in the schema it refuses, naming where, so that a change to the models
that this translation does not cover fails here and never reaches a rendered job.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import Any

TARGET = Path(__file__).with_name("jobfile_validator.py")
# The modules a check may come from: neither imports pydantic's models.
_CHECK_MODULES = {"halo_sched.jobfile_rules": "rules", "halo_sched.values": "values"}
# Schema keys only pydantic's JSON Schema and serializers read, and refs no definition uses.
_DROPPED = {"metadata", "serialization", "ref", "post_init"}


class _Source(str):
    """Python source to write as it is (a name or a lambda), not as a string literal."""


class _Refused(Exception):
    pass


def _literal(value: Any, where: str) -> str:
    text = repr(value)
    try:
        same = ast.literal_eval(text) == value and type(ast.literal_eval(text)) is type(value)
    except (ValueError, SyntaxError):
        same = False
    if not same:
        raise _Refused(f"{where}: {text[:80]} does not read back as the same literal")
    return text


class _Writer:
    def __init__(self) -> None:
        from pydantic import BaseModel

        self.base_model = BaseModel
        self.views: dict[str, type] = {}  # name -> model class, in the order met

    def _view(self, cls: type, where: str) -> str:
        if not (isinstance(cls, type) and issubclass(cls, self.base_model)):
            raise _Refused(f"{where}: {cls!r} is not a model")
        known = self.views.setdefault(cls.__name__, cls)
        if known is not cls:
            raise _Refused(f"{where}: two models are named {cls.__name__}")
        return cls.__name__

    def _check(self, fn: Any, where: str) -> str:
        alias = _CHECK_MODULES.get(getattr(fn, "__module__", ""))
        name = getattr(fn, "__qualname__", "")
        if alias is None or not name.isidentifier() or getattr(sys.modules[fn.__module__], name, None) is not fn:
            raise _Refused(f"{where}: {fn!r} is not a module-level function of halo_sched/jobfile_rules.py or "
                           "halo_sched/values.py (write the check there and give the model that function)")
        return f"{alias}.{name}"

    def _factory(self, factory: Any, where: str) -> str:
        if factory in (list, dict):
            return factory.__name__
        value = factory()
        if isinstance(value, self.base_model):
            return f"lambda: {self._default_view(value, where)}"
        return f"lambda: {_literal(value, where)}"

    def _default_view(self, model: Any, where: str) -> str:
        fields = {}
        for name in type(model).model_fields:
            value = getattr(model, name)
            if isinstance(value, self.base_model):
                raise _Refused(f"{where}.{name}: a section's default holding a section is not translated")
            fields[name] = value
        return f"{self._view(type(model), where)}._default({_literal(fields, where)})"

    def convert(self, node: Any, where: str = "JobSpec") -> Any:
        if isinstance(node, dict):
            out = {}
            for key, value in node.items():
                at = f"{where}.{key}"
                if key in _DROPPED:
                    continue
                if key == "cls":
                    out[key] = _Source(self._view(value, at))
                elif key == "default_factory":
                    if node.get("default_factory_takes_data"):
                        raise _Refused(f"{at}: a factory taking the validated data is not translated")
                    out[key] = _Source(self._factory(value, at))
                elif key == "function" and callable(value):
                    out[key] = _Source(self._check(value, at))
                else:
                    out[key] = self.convert(value, at)
            return out
        if isinstance(node, list):
            return [self.convert(v, f"{where}[{i}]") for i, v in enumerate(node)]
        if isinstance(node, (str, int, float, bool, type(None))):
            return node
        raise _Refused(f"{where}: {node!r} cannot be written as source")


def _source(node: Any, indent: int = 0) -> str:
    """``node`` as Python source: a dict on one line when it fits in 100 characters."""
    pad = " " * indent
    if isinstance(node, _Source):
        return str(node)
    if isinstance(node, dict):
        one = "{" + ", ".join(f"{k!r}: {_source(v)}" for k, v in node.items()) + "}"
        if len(one) + indent <= 100 or not node:
            return one
        items = "".join(f"{pad}    {k!r}: {_source(v, indent + 4)},\n" for k, v in node.items())
        return "{\n" + items + pad + "}"
    if isinstance(node, list):
        return "[" + ", ".join(_source(v, indent) for v in node) + "]"
    return _literal(node, "value")


def generate() -> str:
    """The text of halo_sched/jobfile_validator.py for the models as they are now."""
    from .models import JobSpec

    JobSpec.model_rebuild(force=True)
    writer = _Writer()
    schema = _source(writer.convert(JobSpec.__pydantic_core_schema__))
    mixins: set[str] = set()
    classes = []
    for name, cls in sorted(writer.views.items()):
        bases = [b.__name__ for b in cls.__mro__[1:] if b.__module__ == "halo_sched.jobfile_rules"]
        mixins.update(bases)
        private = {k: v.get_default() for k, v in cls.__private_attributes__.items()}
        body = "    __slots__ = ()\n"
        if private:
            body += f"    _PRIVATE = {_literal(private, name + ' private attributes')}\n"
        classes.append(f"class {name}({', '.join([*bases, 'View'])}):\n{body}")
    names = ", ".join(sorted(mixins | {"View"}))
    import pydantic_core

    return (
        '"""The compiled job-file validator: GENERATED from halo_sched/models.py by\n'
        "``python -m halo_sched.jobfile_codegen``; do not edit (tests/test_jobfile_validator.py fails when\n"
        "it is stale). halo_sched/spec.py builds a pydantic-core SchemaValidator from SCHEMA: the same\n"
        "checks as the models, building the View classes below instead of the models. It is used only\n"
        "with the pydantic-core it was generated and tested with; another builds the models instead.\"\"\"\n"
        "# ruff: noqa: E501\n"
        "from . import jobfile_rules as rules, values\n"
        f"from .jobfile_rules import {names}\n\n"
        f"PYDANTIC_CORE = {pydantic_core.__version__!r}\n\n\n"
        + "\n\n".join(classes)
        + f"\n\nSCHEMA = {schema}\n"
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        text = generate()
    except _Refused as err:
        print(f"jobfile_codegen: cannot translate the models: {err}", file=sys.stderr)
        return 2
    if "--check" in argv:
        if TARGET.exists() and TARGET.read_text() == text:
            return 0
        print(f"{TARGET} is stale: run python -m halo_sched.jobfile_codegen", file=sys.stderr)
        return 1
    TARGET.write_text(text)
    print(f"wrote {TARGET}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
