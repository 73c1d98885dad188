"""A spec that skipped validation cannot reach a shell, an #SBATCH line or an HCL job.

pydantic's ``model_copy(update=...)`` (the usual way to change a frozen model) validates nothing,
and ``JobSpec(...)`` built directly skips the layout rules a job file gets. Two lines of defence:

1. the public API (``halo_sched.render``/``submit``, every backend's render/dryrun/submit/plan)
   validates every spec again, as a job file is: the same SpecError, nothing rendered or sent;
2. the renderers themselves write nothing they cannot quote unless it fully matches a safe
   pattern (a RenderError, also a SpecError), whatever the model holds: checked here by calling
   them directly, and by running what they did render (bash, HashiCorp's HCL parser).
"""
from __future__ import annotations

import re

import pytest

import halo_sched
from halo_sched.backends.local import LocalScheduler
from halo_sched.backends.nomad import NomadScheduler
from halo_sched.backends.nomad.render import job_payload, render_hcl
from halo_sched.backends.slurm import SlurmScheduler
from halo_sched.backends.slurm.render import render_sbatch
from halo_sched.errors import SpecError
from halo_sched.node_runtime import server_shell
from helpers import entry_script
from helpers import server_script
from halo_sched.spec import JobSpec, Parallelism, Trainer
from halo_sched.templating import RenderError
from hclparse import hcl2json, jobspec
from helpers import base_env, fake_bin, run_entry, run_sbatch

BASE = """
name: inj
nodes: 2
nproc_per_node: 1
image: repo/img:1
trainer: {script: t.py, args: ["--x", "1"]}
env: {PLAIN: "1"}
setup: ["export FROM_SETUP=1"]
rendezvous: {port: 29517, timeout_s: 5}
slurm: {partition: p, account: a, qos: q, time: "10", mem: 1G, cpus_per_task: 2, extra_args: ["--comment=c"],
        signal: USR2@60}
"""
SERVERS = BASE + """
servers:
  - name: vllm
    nodes: 1
    command: [serve]
    port: 8000
    group_port: 51216
    env: {S: "1"}
    setup: ["export FROM_SERVER_SETUP=1"]
"""


def _sub(spec, section, **update):
    return spec.model_copy(update={section: getattr(spec, section).model_copy(update=update)})


def _server(spec, **update):
    return spec.model_copy(update={"servers": [spec.servers[0].model_copy(update=update)]})


def _cmd(mark) -> str:
    """Shell that creates ``mark`` wherever it is run, whatever quoting it lands in."""
    return f";touch {mark};$(touch {mark})`touch {mark}`'\"\ntouch {mark}\n"


# label -> (needs servers, change); each change is what an adversary reaches through model_copy.
INJECTIONS = {
    "env key": (False, lambda s, m: s.model_copy(update={"env": {f"A{_cmd(m)}B": "v"}})),
    "env value not text": (False, lambda s, m: s.model_copy(update={"env": {"A": 5}})),
    "name": (False, lambda s, m: s.model_copy(update={"name": f"x{_cmd(m)}"})),
    "name, an #SBATCH line": (False, lambda s, m: s.model_copy(update={"name": "x\n#SBATCH --wrap=touch"})),
    "name, a trailing newline": (False, lambda s, m: s.model_copy(update={"name": "x\n"})),
    "name, a path": (False, lambda s, m: s.model_copy(update={"name": "../../x"})),
    "partition": (False, lambda s, m: _sub(s, "slurm", partition=f"p{_cmd(m)}")),
    "partition, a trailing newline": (False, lambda s, m: _sub(s, "slurm", partition="p\n")),
    "account, a second option": (False, lambda s, m: _sub(s, "slurm", account="a --wrap=touch")),
    "time": (False, lambda s, m: _sub(s, "slurm", time=f"10{_cmd(m)}")),
    "signal": (False, lambda s, m: _sub(s, "slurm", signal=f"USR2{_cmd(m)}")),
    "extra_args": (False, lambda s, m: _sub(s, "slurm", extra_args=[f"--comment=c{_cmd(m)}"])),
    "container mounts": (False, lambda s, m: _sub(s, "slurm", container_mounts=[f"/a:/b{_cmd(m)}"])),
    "image": (False, lambda s, m: s.model_copy(update={"image": f"img{_cmd(m)}"})),
    "interface": (False, lambda s, m: _sub(s, "network", interface=f"eth0{_cmd(m)}")),
    # setup is shell by design: what matters is that it cannot break the script around it
    "setup, a carriage return": (False, lambda s, m: s.model_copy(update={"setup": ["echo a\rb"]})),
    "setup, a NUL": (False, lambda s, m: s.model_copy(update={"setup": ["echo a\x00"]})),
    "args, not text": (False, lambda s, m: s.model_copy(update={"trainer": s.trainer.model_copy(update={"args": ["--x", 5]})})),
    "module": (False, lambda s, m: s.model_copy(update={"trainer": Trainer.model_construct(module=f"os{_cmd(m)}", args=[])})),
    "script, a torchrun option": (False, lambda s, m: s.model_copy(update={"trainer": s.trainer.model_copy(update={"script": "--nnodes=9"})})),
    "secret name": (False, lambda s, m: s.model_copy(update={"secret_env": [f"A{_cmd(m)}"]})),
    "nodes as text": (False, lambda s, m: s.model_copy(update={"nodes": f"2{_cmd(m)}"})),
    "nodes as a bool": (False, lambda s, m: s.model_copy(update={"nodes": True})),
    "nproc_per_node as text": (False, lambda s, m: s.model_copy(update={"nproc_per_node": f"1{_cmd(m)}"})),
    "port as text": (False, lambda s, m: _sub(s, "rendezvous", port=f"29517{_cmd(m)}")),
    "timeout as text": (False, lambda s, m: _sub(s, "rendezvous", timeout_s=f"5{_cmd(m)}")),
    "cpus_per_task as text": (False, lambda s, m: _sub(s, "slurm", cpus_per_task=f"2{_cmd(m)}")),
    "max_requeues as text": (False, lambda s, m: _sub(s, "slurm", requeue=True, max_requeues=f"3{_cmd(m)}")),
    "nomad cpu as text": (False, lambda s, m: _sub(s, "nomad", cpu='1000\n}\njob "x" {')),
    "nomad priority as text": (False, lambda s, m: _sub(s, "nomad", priority="50\n}")),
    "gpus as text": (False, lambda s, m: s.model_copy(update={"gpus_per_node": f"1{_cmd(m)}"})),
    "server name": (True, lambda s, m: _server(s, name=f"v{_cmd(m)}")),
    "server name, a path": (True, lambda s, m: _server(s, name="../../v")),
    "server env key": (True, lambda s, m: _server(s, env={f"A{_cmd(m)}": "v"})),
    "server port as text": (True, lambda s, m: _server(s, port=f"8000{_cmd(m)}")),
    "server nodes as text": (True, lambda s, m: _server(s, nodes=f"1{_cmd(m)}")),
    "server group_port as text": (True, lambda s, m: _server(s, group_port=f"51216{_cmd(m)}")),
    "server health path": (True, lambda s, m: _server(s, health_path=f"/h{_cmd(m)}")),
    "server secret name": (True, lambda s, m: _server(s, secret_env=[f"A{_cmd(m)}"])),
    "server setup, a carriage return": (True, lambda s, m: _server(s, setup=["echo a\rb"])),
}
BACKENDS = ["slurm", "nomad", "local"]
# Values the job file's own patterns (re.match with `$`) let through: only a backend that writes
# the field refuses them (its full-match check), and the others do not write them at all.
ONLY_WHERE_WRITTEN = {"partition, a trailing newline": {"slurm"}, "container mounts": {"slurm"}}


def _bad(label, mark):
    servers, change = INJECTIONS[label]
    return change(halo_sched.loads(SERVERS if servers else BASE), mark)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("label", INJECTIONS)
def test_public_render_revalidates(label, backend, tmp_path):
    mark = tmp_path / "injected"
    bad = _bad(label, mark)
    if backend not in ONLY_WHERE_WRITTEN.get(label, {backend}):
        try:  # validation may refuse it anyway; if not, the backend leaves it out
            text = halo_sched.render(bad, backend)
        except SpecError:
            return
        assert text == halo_sched.render(halo_sched.loads(BASE), backend)
        return
    with pytest.raises(SpecError):
        halo_sched.render(bad, backend)
    assert not mark.exists()


@pytest.mark.parametrize("label", ["env key", "name", "name, a trailing newline", "image", "interface", "setup, a NUL",
                                   "args, not text", "module", "secret name", "nodes as text", "port as text",
                                   "server name", "server env key"])
def test_public_submit_revalidates_and_sends_nothing(label, tmp_path, monkeypatch):
    mark = tmp_path / "injected"
    sent = []

    class Recorder:  # a transport / API client: any use of it is a submission
        def __getattr__(self, name):
            sent.append(name)
            raise AssertionError(f"{name} reached the scheduler")

    root = tmp_path / "local"
    for sched in (SlurmScheduler(transport=Recorder()), NomadScheduler(client=Recorder()), LocalScheduler(root=root)):
        with pytest.raises(SpecError):
            sched.submit(_bad(label, mark))
        with pytest.raises(SpecError):
            sched.dryrun(_bad(label, mark))
    with pytest.raises(SpecError):
        NomadScheduler(client=Recorder()).plan(_bad(label, mark))
    monkeypatch.setenv("HALO_SCHED_HOME", str(tmp_path / "home"))
    with pytest.raises(SpecError):
        halo_sched.submit(_bad(label, mark), "local")
    assert sent == []
    assert not (tmp_path / "home").exists() and not root.exists()
    assert not mark.exists()


def test_the_same_error_as_a_job_file():
    """A model_copy'd spec fails as the job file with the same content does (field and words)."""
    bad = halo_sched.loads(BASE).model_copy(update={"env": {"A;B": "v"}})
    with pytest.raises(SpecError) as from_copy:
        halo_sched.render(bad, "slurm")
    assert not isinstance(from_copy.value, RenderError)
    with pytest.raises(SpecError) as from_file:
        halo_sched.loads(BASE.replace('{PLAIN: "1"}', '{"A;B": "v"}'))
    assert [m for _, m in from_copy.value.problems] == [m for _, m in from_file.value.problems]
    assert [f for f, _ in from_copy.value.problems] == ["env"]


def test_a_directly_built_spec_gets_the_layout_rules():
    """JobSpec(...) skips the layout rules a job file gets (from_dict runs them after the fields):
    on 2 nodes x 8 GPUs, ep8 with tp2 is refused; the public API refuses it too."""
    spec = JobSpec(name="lay", nodes=2, nproc_per_node=8, gpus_per_node=8, trainer=Trainer(script="t.py"),
                   parallelism=Parallelism(ep=8, tp=2), nomad={"driver": "raw_exec"})
    for backend in BACKENDS:
        with pytest.raises(SpecError) as err:
            halo_sched.render(spec, backend)
        assert any(f.startswith("parallelism") for f, _ in err.value.problems), err.value
    with pytest.raises(SpecError):
        halo_sched.loads("name: lay\nnodes: 2\nnproc_per_node: 8\ngpus_per_node: 8\ntrainer: {script: t.py}\n"
                         "parallelism: {ep: 8, tp: 2}\n")


def test_one_validation_per_public_call(monkeypatch):
    """Render time is benchmarked: submit -> dryrun -> render validates once, not at each step."""
    import halo_sched.spec as spec_module

    calls = []
    real = spec_module.validated
    monkeypatch.setattr(spec_module, "validated", lambda s: calls.append(1) or real(s))

    class Transport:
        def submit_once(self, request, **kw):
            return "42"

    spec = halo_sched.loads(SERVERS)
    monkeypatch.setattr("halo_sched.records.record_submit", lambda *a, **k: None)
    SlurmScheduler(transport=Transport()).submit(spec)
    halo_sched.render(spec, "nomad")
    LocalScheduler().dryrun(spec)
    assert len(calls) == 3
    # What is rendered is the validated copy of what was given.
    assert "#SBATCH --nodes=4\n" in halo_sched.render(spec.model_copy(update={"nodes": 3}), "slurm")


# ---- the second line: the renderers, called directly with what no validation let through ------


def _run_slurm(text, tmp_path):
    r, _ = run_sbatch(text, tmp_path / "sbatch", ["n1", "n2", "n3"])
    return r


def _run_entries(spec, tmp_path):
    bindir, out = fake_bin(tmp_path), tmp_path / "out"
    out.mkdir(exist_ok=True)
    env = base_env(bindir, out)
    run_entry(entry_script(spec), tmp_path, {"HALO_NODE_RANK": "0", "HALO_MASTER_ADDR": "127.0.0.1",
                                             "HALO_MASTER_PORT": "29500"}, env)
    for role in spec.servers:
        run_entry(server_script(spec, role), tmp_path,
                  {"HALO_SERVER_INDEX": "0", "HALO_TRAINER_MASTER_ADDR": "127.0.0.1",
                   "HALO_SERVER_SHELL": server_shell()}, env)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("label", INJECTIONS)
def test_renderers_refuse_or_quote_whatever_the_model_holds(label, backend, tmp_path):
    """Without the public API's validation: each renderer refuses the value (a RenderError, or
    another SpecError the renderer raises) or quotes it, and what it renders injects nothing when
    run (bash with stand-in srun/scontrol/torchrun) or parsed (HCL: the same job as the payload)."""
    mark = tmp_path / "injected"
    spec = _bad(label, mark)
    try:
        if backend == "slurm":
            text = render_sbatch(spec)
        elif backend == "nomad":
            payload = job_payload(spec)["Job"]
            text = render_hcl(spec)
        else:
            text = LocalScheduler.render.__wrapped__(LocalScheduler(root=tmp_path / "local"), spec)
    except SpecError:
        assert not mark.exists()
        return
    # Rendered: the value was quoted (never pasted bare). Prove it by running / parsing it.
    if backend == "slurm":
        assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f]", text)  # sbatch refuses a script with a CR
        _run_slurm(text, tmp_path)
    elif backend == "nomad":
        assert jobspec.comparable(jobspec.api_job(hcl2json.load(text))) == jobspec.comparable(payload)
    else:
        _run_entries(spec, tmp_path)
    assert not mark.exists(), f"{label}: rendered text ran the injected command"


UNQUOTABLE = ["env key", "name", "name, an #SBATCH line", "name, a trailing newline", "partition",
              "partition, a trailing newline", "account, a second option", "time", "signal", "extra_args",
              "interface", "module", "secret name", "nodes as text", "port as text", "cpus_per_task as text",
              "nomad cpu as text", "server name", "server env key", "server port as text"]


@pytest.mark.parametrize("label", UNQUOTABLE)
def test_unquotable_values_are_a_render_error(label, tmp_path):
    """Where nothing can quote the value (an #SBATCH line, a variable name, a name in paths or
    labels, a number), the renderer that would write it raises RenderError."""
    spec = _bad(label, tmp_path / "injected")
    backend_renders = {"slurm": render_sbatch, "nomad": lambda s: render_hcl(s),
                       "local": lambda s: LocalScheduler.render.__wrapped__(LocalScheduler(root=tmp_path), s)}
    raised = []
    for name, render in backend_renders.items():
        try:
            render(spec)
        except RenderError:
            raised.append(name)
    assert raised, f"{label}: no renderer refused it"
