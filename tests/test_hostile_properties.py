"""Hostile text in one field of a VALID job at a time: the job either loads and renders on every
backend, or is refused with a SpecError that names that field (never another exception); no
rendered output, dry run, repr or error ever holds the value of a secret that is in the
submitter's environment; no hostile text adds an ``#SBATCH`` directive.

The jobs start from the shipped examples (examples/*.yaml) and a few minimal ones, each with a
``secret_env`` whose value is really exported (monkeypatch), and change one string field at a
time: every field in a deterministic sweep, then random fields and text (hypothesis). A run where
too few mutated jobs load would check nothing, so each test asserts how many loaded and rendered.

``HALO_HYPOTHESIS_EXAMPLES`` sets the random example count (default 100); the ``long`` run
(``pytest -m long``, in CI) tries 20x as many.
"""
from __future__ import annotations

import copy
import json
import os
import re
import warnings

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from halo_sched import backends
from halo_sched.errors import SpecError
from halo_sched.spec import JobSpec, from_dict
from helpers import REPO

EXAMPLES = int(os.environ.get("HALO_HYPOTHESIS_EXAMPLES", "100"))

SECRET_NAME = "HF_TOKEN"
# Distinct from every piece of hostile text below, so finding it anywhere is a leak.
SECRET_VALUE = "hf_9c1e7be0d4SECRETVALUE"

# Each piece targets a layer between the job file and a rank: shell quoting and expansion, sbatch
# directives, heredoc terminators, HCL and Go-template interpolation, NUL, sheer length.
PIECES = [
    "it's \"q\"",
    "$(touch /tmp/halo-pwned)",
    "`id`",
    "x\n#SBATCH --nodes=99",
    "#SBATCH --wrap=evil",
    "${HOME}",
    "$${HOME}",
    "%{ if true }x%{ endif }",
    "{{ .Job }}",
    "line\nrm -rf ~\n",
    "\nHALO_ENTRY_EOF\nEOT\n",
    "tab\tcr\r",
    "back\\slash",
    "nul\x00byte",
    "ü é 中",
    "L" * 20_000,
]
COMPOSITE = "".join(p for p in PIECES if "\x00" not in p and len(p) < 1000)


def _example(name: str) -> dict:
    return yaml.safe_load((REPO / "examples" / name).read_text())


def _bases() -> dict[str, dict]:
    out = {name: _example(name) for name in ("ddp-cpu.yaml", "ddp-gpu.yaml", "nomad-gpu.yaml", "rl-servers.yaml")}
    out["minimal"] = {
        "name": "m", "nodes": 1, "nproc_per_node": 1,
        "trainer": {"script": "t.py", "args": ["--x", "1"]},
        "env": {"A": "1"}, "setup": ["echo hi"], "nomad": {"driver": "raw_exec"},
    }
    out["every-option"] = {
        "name": "all", "nodes": 2, "nproc_per_node": 2, "image": "img:1",
        "trainer": {"module": "pkg.train", "args": ["--lr", "0.1"]},
        "env": {"A": "1", "B": "two"}, "setup": ["echo setup"],
        "network": {"interface": "eth0", "nccl_debug": "INFO"},
        "slurm": {"partition": "p", "account": "a", "qos": "q", "time": "1:00:00", "constraint": "c", "mem": "4G",
                  "signal": "USR2@60", "requeue": True, "container_mounts": ["/a:/b"], "container_workdir": "/w",
                  "extra_args": ["--mail-type=END"]},
        "nomad": {"driver": "docker", "volumes": ["/a:/b:ro"], "datacenters": ["dc1"], "namespace": "ns",
                  "region": "r", "max_run_duration": "1h", "shm_size": "1GiB"},
    }
    out["servers-raw-exec"] = {
        "name": "srv", "nodes": 1, "nproc_per_node": 1,
        "trainer": {"script": "t.py", "args": []},
        "servers": [{"name": "vllm", "nodes": 1, "command": ["serve", "--port", "8000"], "port": 8000,
                     "env": {"V": "1"}, "setup": ["echo s"], "health_path": "/health",
                     "secret_env": [SECRET_NAME]}],
        "nomad": {"driver": "raw_exec"},
    }
    for data in out.values():
        data["secret_env"] = [SECRET_NAME]
    return out


BASES = _bases()


def _string_paths(node, path=()) -> list[tuple]:
    """Every string leaf (and every env key) of a job dict, as a path of keys and list indexes."""
    out = []
    if isinstance(node, dict):
        for k, v in node.items():
            if path and path[-1] == "env":
                out.append(path + (("key", k),))
            out += _string_paths(v, path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _string_paths(v, path + (i,))
    elif isinstance(node, str):
        out.append(path)
    return out


FIELDS = [(base, path) for base, data in BASES.items() for path in _string_paths(data)
          if path != ("secret_env", 0) and path[-2:] != ("secret_env", 0)]


def mutate(data: dict, path: tuple, text: str, mode: str = "replace") -> dict:
    data = copy.deepcopy(data)
    node = data
    for k in path[:-1]:
        node = node[k]
    last = path[-1]
    if isinstance(last, tuple):  # an env key: the value stays
        node[last[1] + text if mode == "append" else text] = node.pop(last[1])
    else:
        node[last] = node[last] + text if mode == "append" else text
    return data


def _field(path: tuple) -> str:
    """The dotted field name a SpecError uses for ``path`` (list indexes dropped)."""
    return ".".join(str(k) for k in path if isinstance(k, str))


def _norm(field: str) -> str:
    field = re.sub(r" \(line \d+\)$", "", field)
    return re.sub(r"\[\d+\]", "", field)


def _sbatch_directives(script: str) -> list[str]:
    """The #SBATCH lines sbatch reads: those before the first command line."""
    out = []
    for line in script.splitlines()[1:]:
        if line.startswith("#SBATCH"):
            out.append(line)
        elif line.strip() and not line.startswith("#"):
            break
    return out


def _outputs(spec: JobSpec) -> dict[str, str]:
    """Everything a user can see or submit for ``spec``, per backend: the rendered text (render,
    and the dry run's text and payload). A backend that refuses the job gives its SpecError's text."""
    out: dict[str, str] = {"repr": repr(spec) + str(spec) + spec.model_dump_json()}
    for name, opts in (("local", {}), ("slurm", {}), ("nomad", {"format": "hcl"}), ("nomad", {"format": "json"})):
        key = name + "".join(f":{v}" for v in opts.values())
        sched = backends.get(name)
        try:
            out[key] = sched.render(spec, **opts)
            dry = sched.dryrun(spec, **opts)
            out[key + " dry-run"] = dry.text + json.dumps(dry.payload, default=str)
        except SpecError as err:
            out[key + " refused"] = str(err)
    return out


class Tally:
    def __init__(self):
        self.tried = self.loaded = self.rendered = 0

    def share(self, what: str) -> float:
        return getattr(self, what) / max(self.tried, 1)


def check(base: str, path: tuple, data: dict, tally: Tally) -> None:
    tally.tried += 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # layout notes: a warning, never a refusal
        try:
            spec = from_dict(data)
        except SpecError as err:
            assert err.problems, err
            assert all(isinstance(f, str) and isinstance(m, str) and m for f, m in err.problems), err.problems
            want = _field(path)
            # The refusal names the field that was changed (or the part of the job it belongs to).
            assert any(want.startswith(_norm(f)) or _norm(f).startswith(want) for f, _ in err.problems if f), \
                (base, path, err.problems)
            assert SECRET_VALUE not in str(err)
            return
        tally.loaded += 1
        assert isinstance(spec, JobSpec)
        outs = _outputs(spec)
    for where, text in outs.items():
        assert SECRET_VALUE not in text, f"the secret's value leaked into {where} ({base}, {path})"
    rendered = {k for k in outs if k in ("local", "slurm", "nomad:hcl", "nomad:json")}
    base_rendered = BASE_RENDERED[base]
    # Hostile text in a field that loads is a value like any other: it does not make a backend
    # refuse the job, unless the text itself is what that backend cannot carry (the refusal names it).
    for key in base_rendered - rendered:
        refusal = outs[key + " refused"]
        assert _field(path).split(".")[0] in refusal, (base, path, key, refusal)
    if rendered == base_rendered:
        tally.rendered += 1
    if "slurm" in rendered:
        # No newline, '#SBATCH' or quote in a value may add, drop or split a directive.
        assert len(_sbatch_directives(outs["slurm"])) == BASE_DIRECTIVES[base], (base, path, _sbatch_directives(outs["slurm"]))
    for key in rendered:
        assert SECRET_NAME in outs[key], f"{key} lost the secret's name ({base}, {path})"


def _base_outputs():
    rendered, directives = {}, {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for base, data in BASES.items():
            outs = _outputs(from_dict(data))
            rendered[base] = {k for k in outs if k in ("local", "slurm", "nomad:hcl", "nomad:json")}
            directives[base] = len(_sbatch_directives(outs["slurm"])) if "slurm" in outs else None
    return rendered, directives


BASE_RENDERED, BASE_DIRECTIVES = _base_outputs()


@pytest.fixture
def secret_in_env(monkeypatch):
    monkeypatch.setenv(SECRET_NAME, SECRET_VALUE)


def test_bases_load_and_render_everywhere(secret_in_env):
    """The starting points are valid jobs: each renders on every backend it is written for (the
    CPU and InfiniBand examples name no image, which Nomad's default docker driver needs)."""
    every = {"local", "slurm", "nomad:hcl", "nomad:json"}
    assert {b for b, r in BASE_RENDERED.items() if r == every} == set(BASES) - {"ddp-cpu.yaml", "ddp-gpu.yaml"}
    assert BASE_RENDERED["ddp-cpu.yaml"] == BASE_RENDERED["ddp-gpu.yaml"] == {"local", "slurm"}
    assert len(FIELDS) >= 100 and len(FREE_TEXT) >= 30, (len(FIELDS), len(FREE_TEXT))


@pytest.mark.parametrize("mode", ["replace", "append"])
def test_every_field_of_every_base_with_hostile_text(secret_in_env, mode):
    tally = Tally()
    for base, path in FIELDS:
        for text in (COMPOSITE, "nul\x00byte", "L" * 20_000):
            check(base, path, mutate(BASES[base], path, text, mode), tally)
    # Free text (args, env values, setup, server commands) takes anything: a sweep in which fewer
    # jobs load than that never reached the renderers.
    assert tally.share("loaded") >= 0.30, vars(tally)
    assert tally.share("rendered") >= 0.20, vars(tally)
    print(f"{mode}: {tally.tried} jobs, {tally.loaded} loaded, {tally.rendered} rendered on every backend")


hostile_text = st.one_of(
    st.lists(st.sampled_from(PIECES), min_size=1, max_size=4).map("".join),
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=60),
)


def _takes_text(base: str, path: tuple) -> bool:
    try:
        from_dict(mutate(BASES[base], path, COMPOSITE))
    except SpecError:
        return False
    return True


with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    FREE_TEXT = [f for f in FIELDS if _takes_text(*f)]
# Two draws in three from the fields that take free text, so that most random jobs load and reach
# the renderers (a uniform draw loads about a third, too close to the floor below).
random_field = st.one_of(st.sampled_from(FREE_TEXT), st.sampled_from(FREE_TEXT), st.sampled_from(FIELDS))


def _random_run(examples: int) -> Tally:
    tally = Tally()

    @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(random_field, hostile_text, st.sampled_from(["replace", "append"]))
    def one(field, text, mode):
        base, path = field
        check(base, path, mutate(BASES[base], path, text, mode), tally)

    one()
    return tally


def test_random_field_random_text(secret_in_env):
    tally = _random_run(EXAMPLES)
    assert tally.tried >= EXAMPLES * 0.9, vars(tally)
    assert tally.share("loaded") >= 0.30, vars(tally)
    print(f"random: {tally.tried} jobs, {tally.loaded} loaded, {tally.rendered} rendered on every backend")


@pytest.mark.long
def test_long_run_random_field_random_text(secret_in_env):
    """The random-field property run at 20x its examples (the `long` tier): each example renders a job on every
    backend; it is long because that is what the 20x run is for."""
    tally = _random_run(EXAMPLES * 20)
    assert tally.tried >= EXAMPLES * 20 * 0.9, vars(tally)
    assert tally.share("loaded") >= 0.30, vars(tally)
