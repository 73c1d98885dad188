"""The compiled job-file validator (halo_sched/jobfile_validator.py) against the models it is
generated from: current, and the same answer for every job file, valid or not.

`render` and `validate` read a job file through it, without pydantic's models; everything else
(and every error message) goes through the models. A difference between the two would render a
job the models refuse, or differently: the tests below compare them field by field, on the
examples, on the golden cases (tests/test_golden.py renders both ways) and on generated files."""
from __future__ import annotations

import copy
import warnings

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
import pydantic_core
from pydantic import BaseModel, ValidationError
from pydantic_core import SchemaValidator

from halo_sched import jobfile_codegen, jobfile_validator, spec as spec_mod
from halo_sched.errors import SpecError
from halo_sched.jobfile_rules import View
from halo_sched.models import JobSpec
from helpers import REPO

EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))


def dump(x):
    """A section (model or View) as plain data: its class name, the fields set and each value."""
    if isinstance(x, (BaseModel, View)):
        return {"<section>": type(x).__name__, "<set>": sorted(x.model_fields_set),
                **{k: dump(v) for k, v in vars(x).items()}}
    if isinstance(x, list):
        return [dump(v) for v in x]
    if isinstance(x, dict):
        return {k: dump(v) for k, v in x.items()}
    return x


def compiled(data):
    """The compiled validator, built here whatever pydantic-core is installed: on another version
    than the one it was generated with, these tests say whether it would still be right."""
    return SchemaValidator(jobfile_validator.SCHEMA).validate_python(data)


def both(data):
    """(what the compiled validator says, what the models say): ("ok", dump) or ("refused", None)."""
    answers = []
    for validate in (compiled, JobSpec.model_validate):
        try:
            answers.append(("ok", dump(validate(copy.deepcopy(data)))))
        except ValidationError:
            answers.append(("refused", None))
    return answers


def test_the_compiled_validator_is_current():
    """Fails when models.py (or a check it names) changed and the validator was not written again:
    run `python -m halo_sched.jobfile_codegen`."""
    if pydantic_core.__version__ != jobfile_validator.PYDANTIC_CORE:
        pytest.skip(f"generated with pydantic-core {jobfile_validator.PYDANTIC_CORE}, {pydantic_core.__version__} "
                    "installed (render then reads job files with the models)")
    assert spec_mod._compiled_validator() is not None
    assert jobfile_codegen.generate() == jobfile_codegen.TARGET.read_text(), \
        "halo_sched/jobfile_validator.py is stale: run python -m halo_sched.jobfile_codegen"


def test_the_test_environment_pins_the_pydantic_core_it_was_generated_with():
    pins = dict(line.split("==") for line in (REPO / "constraints.txt").read_text().splitlines()
                if line and not line.startswith("#"))
    assert pins["pydantic-core"] == jobfile_validator.PYDANTIC_CORE, \
        "constraints.txt and halo_sched/jobfile_validator.py name different pydantic-core versions"


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_every_example_reads_the_same_both_ways(path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        view, model = spec_mod.load(path, view=True), spec_mod.load(path)
    assert type(view).__module__ == "halo_sched.jobfile_validator"
    assert dump(view) == dump(model)
    assert view.job_file == model.job_file and view.job_file is not None
    assert view.derived_env() == model.derived_env() and view.secret_names == model.secret_names
    assert view.slurm.warning == model.slurm.warning and view.hang.first_step_limit == model.hang.first_step_limit


def test_a_left_out_section_is_its_defaults_with_nothing_set():
    data = {"name": "j", "nodes": 1, "nproc_per_node": 1, "trainer": {"script": "t.py"}}
    view, model = compiled(data), JobSpec.model_validate(data)
    assert dump(view) == dump(model)
    assert view.slurm.model_fields_set == set() and "slurm" not in view.model_fields_set
    assert view.nomad.datacenters == ["*"] and view.nomad.datacenters is not compiled(data).nomad.datacenters


def test_a_bad_file_gets_the_models_errors():
    text = "name: 'bad name'\nnodes: 0\nnproc_per_node: 1\ntrainer: {script: t.py}\nslurm: {tme: '1:00'}\n"
    with pytest.raises(SpecError) as by_view:
        spec_mod.loads(text, "job.yaml", view=True)
    with pytest.raises(SpecError) as by_model:
        spec_mod.loads(text, "job.yaml")
    assert str(by_view.value) == str(by_model.value)
    assert "slurm.tme (line 5): unknown key; did you mean time?" in str(by_view.value)


def test_a_view_is_read_only_but_keeps_what_load_records():
    view = spec_mod.load(REPO / "examples" / "ddp-cpu.yaml", view=True)
    with pytest.raises(TypeError, match="read-only"):
        view.nodes = 3
    with pytest.raises(TypeError, match="read-only"):
        view.slurm.time = "1"
    assert view.job_file.path.endswith("ddp-cpu.yaml") and view._attempt is None
    assert spec_mod.validated(view) is view


def test_another_pydantic_core_reads_it_with_the_models(monkeypatch):
    """A pydantic-core the schema was not generated with: no compiled validator, and the view
    path is the models' path."""
    monkeypatch.setattr(jobfile_validator, "PYDANTIC_CORE", "0.0.1")
    monkeypatch.setattr(spec_mod, "_compiled_validator", spec_mod._compiled_validator.__wrapped__)
    assert spec_mod._compiled_validator() is None
    s = spec_mod.load(REPO / "examples" / "ddp-cpu.yaml", view=True)
    assert isinstance(s, JobSpec)


def test_the_codegen_refuses_a_check_it_cannot_import_without_the_models():
    writer = jobfile_codegen._Writer()
    schema = {"type": "function-after", "function": {"type": "no-info", "function": lambda v: v},
              "schema": {"type": "str"}}
    with pytest.raises(jobfile_codegen._Refused, match="module-level function"):
        writer.convert(schema)
    with pytest.raises(jobfile_codegen._Refused, match="does not read back"):
        jobfile_codegen._source(writer.convert({"type": "float", "default": float("inf")}))


# Generated job files: an example with fields set to values, good and bad, that the checks
# care about (types, bounds, patterns, the rules across fields).
def _paths() -> list[tuple[str, ...]]:
    out = []
    for name, field in JobSpec.model_fields.items():
        out.append((name,))
        for cls in getattr(field.annotation, "__args__", (field.annotation,)):
            if isinstance(cls, type) and issubclass(cls, BaseModel):
                out += [(name, sub) for sub in cls.model_fields]
    return out + [("servers", 0, f) for f in ("name", "nodes", "port", "group_port", "command", "env", "setup")]


VALUES = st.sampled_from([
    None, True, False, 0, 1, 2, 8, -1, 29500, 70000, 1.5, "", "x", "a b", "x\n", "ib0", "efa", "docker", "exec",
    "USR2@120", "B:USR2@60", "USR1", "04:00:00", "1:00", "64G", "8GiB", "12h", "--exclusive", "--nodes=2",
    "nvcr.io/nvidia/pytorch:25.01-py3", "train.py", "pkg.train", "5GB/s", "1000:1000", "/data:/data:ro",
    ["a"], [], ["--x", "y"], ["node", "hang"], ["failed"], {"A": "1"}, {"NCCL_SOCKET_IFNAME": "x"}, {"A": 1},
    {"name": "vllm", "nodes": 1, "port": 8000, "command": ["serve"]},
])


@st.composite
def job_files(draw):
    data = yaml.safe_load(draw(st.sampled_from(EXAMPLES)).read_text())
    for path in draw(st.lists(st.sampled_from(_paths()), min_size=1, max_size=4)):
        node = data
        for key in path[:-1]:
            if isinstance(key, int):
                if not isinstance(node, list) or not node:
                    break
                node = node[0]
            else:
                if not isinstance(node.get(key), (dict, list)):
                    node[key] = [] if key == "servers" else {}
                node = node[key]
        else:
            if isinstance(node, dict):
                if draw(st.booleans()) and path[-1] in node and len(path) > 1:
                    del node[path[-1]]
                else:
                    node[path[-1]] = copy.deepcopy(draw(VALUES))  # a later path may write into it
    return data


@settings(max_examples=300, deadline=None)
@given(job_files())
def test_generated_job_files_get_the_same_answer_both_ways(data):
    view, model = both(data)
    assert view == model


@pytest.mark.long
@settings(max_examples=3000, deadline=None)
@given(job_files())
def test_generated_job_files_get_the_same_answer_both_ways_long(data):
    view, model = both(data)
    assert view == model
