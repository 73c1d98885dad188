"""Layout rules (parallelism:) at validate time, case by case (DOMAIN.md "Layout rules")."""
from __future__ import annotations

import warnings

import pytest

import halo_sched
from halo_sched.errors import SpecError
from halo_sched.layout import LayoutWarning
from helpers import cli


def job(nodes: int, gpus: int, par: str, extra: str = "") -> str:
    return (f"name: lay\nnodes: {nodes}\nnproc_per_node: {gpus}\ngpus_per_node: {gpus}\n"
            f"trainer: {{script: t.py}}\n{extra}parallelism: {par}\n")


# (nodes, gpus per node, parallelism, the field refused or None, words the message must hold)
CASES = [
    # DOMAIN.md's own examples on 2x8 GPUs
    (2, 8, "{ep: 8, tp: 2}", "parallelism.ep", "forms 2 EP groups"),
    (2, 8, "{ep: 16, tp: 2, ep_scope: global}", None, ""),
    (2, 8, "{ep: 16, tp: 2}", None, ""),  # auto goes global once EP outgrows the domain
    (2, 8, "{ep: 8}", None, ""),  # pure EP: two node-local groups, no rule
    (2, 8, "{ep: 16}", None, ""),
    (1, 8, "{ep: 8, tp: 2}", None, ""),  # one domain: EP and TP may mix freely
    (2, 4, "{ep: 4, tp: 2, nvlink_domain_size: 72}", None, ""),  # an NVL72 rack holds the whole job
    (2, 8, "{ep: 16, tp: 2, ep_scope: node}", "parallelism.ep_scope", "ep=16 is larger"),
    # HSDP: pure DP or CP only
    (2, 8, "{hsdp: true, tp: 2}", "parallelism.hsdp", "tp=2 rejects it"),
    (2, 8, "{hsdp: true, ep: 8}", "parallelism.hsdp", "ep=8"),
    (2, 8, "{hsdp: true, etp: 2}", "parallelism.hsdp", "etp=2"),
    (2, 8, "{hsdp: true}", None, ""),
    (2, 8, "{hsdp: true, cp: 2}", None, ""),
    # sizes that do not divide the world
    (2, 8, "{tp: 3}", "parallelism.tp", "tp=3 does not divide the world of 16 ranks"),
    (2, 8, "{ep: 5}", "parallelism.ep", "ep=5 does not divide"),
    (2, 8, "{etp: 32}", "parallelism.etp", "etp=32 does not divide"),
    (2, 8, "{cp: 6}", "parallelism.cp", "cp=6 does not divide"),
    (3, 8, "{tp: 8, cp: 2}", "parallelism.cp", "tp x cp = 16 does not divide the world of 24"),
    (2, 8, "{ep: 16, etp: 2}", "parallelism.etp", "ep x etp = 32"),
    (3, 8, "{nvlink_domain_size: 16}", "parallelism.nvlink_domain_size", "16 does not divide the world of 24"),
    (2, 8, "{nvlink_domain_size: 12}", "parallelism.nvlink_domain_size", "neither hold whole nodes"),
]


@pytest.mark.parametrize("nodes, gpus, par, field, words", CASES, ids=[f"{c[0]}x{c[1]} {c[2]}" for c in CASES])
def test_layout_rule(nodes, gpus, par, field, words):
    text = job(nodes, gpus, par)
    if field is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", LayoutWarning)
            halo_sched.loads(text)
        return
    with pytest.raises(SpecError) as err:
        halo_sched.loads(text)
    fields = [f for f, _ in err.value.problems]
    assert any(f.startswith(field + " ") or f == field for f in fields), err.value.problems
    assert words in str(err.value)


def test_hsdp_inside_one_domain_warns_only():
    with pytest.warns(LayoutWarning, match=r"parallelism\.hsdp.*does nothing"):
        halo_sched.loads(job(1, 8, "{hsdp: true}"))
    with warnings.catch_warnings():  # two nodes: HSDP replicates across them, no warning
        warnings.simplefilter("error", LayoutWarning)
        halo_sched.loads(job(2, 8, "{hsdp: true}"))


def test_cross_node_ep_on_efa_warns_without_gdr():
    efa = "network: {fabric: efa}\n"
    with pytest.warns(LayoutWarning, match="cross_node_expert_parallel"):
        halo_sched.loads(job(2, 8, "{ep: 16}", efa))
    with warnings.catch_warnings():
        warnings.simplefilter("error", LayoutWarning)
        halo_sched.loads(job(2, 8, "{ep: 16}", "network: {fabric: efa, cross_node_expert_parallel: true}\n"))
        halo_sched.loads(job(2, 8, "{ep: 8}", efa))  # node-local EP: nothing crosses


def test_every_rank_gets_the_layout_as_env():
    spec = halo_sched.loads(job(2, 8, "{ep: 16, tp: 2}"))
    env = spec.derived_env()
    assert {k: env[k] for k in env if k.startswith("HALO_PARALLEL_") or k == "NVLINK_DOMAIN_SIZE"} == {
        "HALO_PARALLEL_TP": "2", "HALO_PARALLEL_EP": "16", "HALO_PARALLEL_ETP": "1", "HALO_PARALLEL_CP": "1",
        "HALO_PARALLEL_DP": "8", "HALO_PARALLEL_HSDP": "0", "HALO_PARALLEL_EP_SCOPE": "global",
        "NVLINK_DOMAIN_SIZE": "8",
    }
    # In the one entry script every node runs, so every rank reads the same values.
    entry = halo_sched.render(spec, "slurm")
    assert "export HALO_PARALLEL_EP=16" in entry and "export NVLINK_DOMAIN_SIZE=8" in entry
    # Without the section nothing is added (the golden files pin that).
    assert "NVLINK_DOMAIN_SIZE" not in halo_sched.loads(job(2, 8, "null")).derived_env()


def test_layout_env_cannot_also_be_set_in_env():
    with pytest.raises(SpecError, match="NVLINK_DOMAIN_SIZE"):
        halo_sched.loads(job(2, 8, "{ep: 8}", 'env: {NVLINK_DOMAIN_SIZE: "72"}\n'))


def test_cli_refuses_with_exit_2_naming_the_field_and_warns_with_exit_0(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(job(2, 8, "{ep: 8, tp: 2}"))
    for cmd in (["validate", str(bad)], ["render", str(bad), "--backend", "slurm"],
                ["submit", str(bad), "--dry-run", "--backend", "slurm"]):
        r = cli(*cmd)
        assert r.returncode == 2, (cmd, r.stderr)
        assert "parallelism.ep (line 6)" in r.stderr and "Traceback" not in r.stderr
    hsdp = tmp_path / "hsdp.yaml"
    hsdp.write_text(job(1, 8, "{hsdp: true}"))
    (tmp_path / "t.py").touch()  # its trainer.script
    r = cli("validate", str(hsdp))
    assert r.returncode == 0, r.stderr
    assert r.stderr.startswith("halo-sched: warning: ") and "parallelism.hsdp (line 6)" in r.stderr
    assert "ok" in r.stdout
