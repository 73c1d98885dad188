"""Every user string of the job shape, arbitrary: loading either gives a JobSpec or a SpecError
naming a field (never another exception), and what loads renders for every backend or is refused
as a SpecError. Secret values never reach a rendered file, whatever the names and text around them.

``HALO_HYPOTHESIS_EXAMPLES`` sets the example count (default 100); the ``long`` run
(``pytest -m long``, in CI) tries 20x as many.
"""
from __future__ import annotations

import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from halo_sched.backends.local import LocalScheduler
from halo_sched.backends.nomad.render import job_payload
from halo_sched.backends.slurm.render import render_sbatch
from halo_sched.errors import SpecError
from halo_sched.spec import JobSpec, from_dict

EXAMPLES = int(os.environ.get("HALO_HYPOTHESIS_EXAMPLES", "100"))
TRIED = {"count": 0}

text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
name_like = st.one_of(text, st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,12}", fullmatch=True))
count = st.one_of(st.integers(-5, 5000), st.booleans(), text, st.none())

job = st.fixed_dictionaries({
    "name": st.one_of(text, st.from_regex(r"[a-z][a-z0-9_.-]{0,20}", fullmatch=True)),
    "nodes": count,
    "nproc_per_node": count,
    "trainer": st.fixed_dictionaries({"script": st.one_of(text, st.just("t.py")), "args": st.lists(text, max_size=3)}),
    "env": st.dictionaries(name_like, text, max_size=3),
    "secret_env": st.lists(name_like, max_size=3),
    "setup": st.lists(text, max_size=2),
    "rendezvous": st.fixed_dictionaries({"port": count, "timeout_s": count}),
    "slurm": st.fixed_dictionaries({
        "partition": st.one_of(st.none(), text), "max_requeues": count, "container_workdir": st.one_of(st.none(), text),
        "extra_args": st.lists(text, max_size=2), "signal": st.one_of(st.none(), text),
    }),
    "nomad": st.fixed_dictionaries({"driver": st.just("raw_exec"), "volumes": st.just([]),
                                    "namespace": st.one_of(st.none(), text)}),
})
docker = st.fixed_dictionaries({"volumes": st.lists(text, max_size=2), "datacenters": st.lists(text, min_size=1, max_size=2)})


def check(data: dict) -> None:
    TRIED["count"] += 1
    try:
        spec = from_dict(data)
    except SpecError as err:
        assert err.problems and all(isinstance(f, str) and msg for f, msg in err.problems)
        return
    assert isinstance(spec, JobSpec)
    secret = "VALUE-" + "x" * 8
    for render in (lambda s: render_sbatch(s), lambda s: json.dumps(job_payload(s, "id-1")),
                   lambda s: LocalScheduler(root="/nonexistent").render(s)):
        try:
            out = render(spec)
        except SpecError:
            continue
        assert secret not in out
        for n in spec.secret_env:
            assert n in out


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(job)
def test_every_user_string_loads_or_names_its_field(data):
    check(data)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(job, docker)
def test_docker_strings(data, extra):
    data = dict(data, image="img:1", nomad={**extra, "driver": "docker"})
    check(data)


@pytest.mark.long
@settings(max_examples=EXAMPLES * 20, deadline=None, suppress_health_check=list(HealthCheck))
@given(job, docker)
def test_long_run_every_user_string(data, extra):
    check(dict(data, image="img:1", nomad={**extra, "driver": "docker"}))
    check(data)
