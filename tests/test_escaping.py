"""Property tests: nothing a user writes can change the meaning of a generated script or job."""
from __future__ import annotations

import json
import re
import subprocess

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import halo_sched
from halo_sched.backends.nomad.render import _delimiters, job_payload, render_hcl
from halo_sched.backends.slurm.render import render_sbatch
from halo_sched.launch import entry_script
from halo_sched.templating import hcl_escape, hcl_heredoc, heredoc_tag, sh_quote
from helpers import base_env, fake_bin, hcl_load, records, run_entry, run_sbatch

# Any text a process can carry: no NUL, no lone surrogates. Bias towards the dangerous bits.
DANGER = st.sampled_from(["'", '"', "\\", "$", "${", "$(", "`", "%{", "{{", "}}", "\n", "\r", "\t", " ", "ü", "EOF",
                          "HALO_ENTRY_EOF", "EOT", "[[halo-", "#", ";", "&", "|", "*", "?", "~", "!", "-"])
TEXT = st.lists(st.one_of(DANGER, st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=5)),
                max_size=12).map("".join)
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@FAST
@given(TEXT)
def test_sh_quote_is_one_literal_word(value):
    r = subprocess.run(["bash", "-c", f"printf '%s' {sh_quote(value)}"], capture_output=True)
    assert r.returncode == 0
    assert r.stdout == value.encode()


@FAST
@given(TEXT)
def test_hcl_string_round_trips(value):
    assert hcl_load(f'x = "{hcl_escape(value)}"\n')["x"] == value


@FAST
@given(TEXT)
def test_hcl_heredoc_round_trips(value):
    body = value + "\nline\n"
    assert hcl_load(f"x = {hcl_heredoc(body)}\n")["x"] == body


@FAST
@given(TEXT)
def test_shell_heredoc_tag_never_a_line_of_the_body(value):
    tag = heredoc_tag(value, "HALO_ENTRY_EOF")
    assert tag not in value.split("\n")


@FAST
@given(TEXT)
def test_go_template_delimiters_absent(value):
    left, right = _delimiters(value)
    assert left not in value and right not in value


def _spec(value: str, arg: str, setup: str):
    return halo_sched.spec.JobSpec.model_validate({
        "name": "prop", "nodes": 2, "nproc_per_node": 1,
        "trainer": {"script": "t.py", "args": [arg]},
        "env": {"V": value}, "setup": [f"export S={sh_quote(setup)}"],
        "nomad": {"driver": "raw_exec"},
    })


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=TEXT, arg=TEXT, setup=TEXT)
def test_values_reach_torchrun_byte_exact(tmp_path_factory, value, arg, setup):
    tmp = tmp_path_factory.mktemp("p")
    spec = _spec(value, arg, setup)
    bindir, out = fake_bin(tmp), tmp / "out"
    out.mkdir()
    r = run_entry(entry_script(spec), tmp, {"HALO_NODE_RANK": "1", "HALO_MASTER_ADDR": "127.0.0.1"},
                  base_env(bindir, out, ["V", "S"]))
    assert r.returncode == 0, r.stderr
    rec = records(out)[1]
    assert rec["argv"][-1] == arg
    assert bytes.fromhex(rec["env_hex"]["V"]) == value.encode()
    assert bytes.fromhex(rec["env_hex"]["S"]) == setup.encode()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=TEXT, arg=TEXT)
def test_values_survive_the_sbatch_script(tmp_path_factory, value, arg):
    spec = _spec(value, arg, "x")
    text = render_sbatch(spec)
    # sbatch refuses any script with a carriage return; user text brings no control bytes.
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f]", text)
    r, recs = run_sbatch(text, tmp_path_factory.mktemp("s"), ["a", "b"], env_names=["V"])
    assert r.returncode == 0, r.stderr
    assert sorted(recs) == [0, 1]
    for rec in recs.values():
        assert rec["argv"][-1] == arg
        assert bytes.fromhex(rec["env_hex"]["V"]) == value.encode()


@settings(max_examples=60, deadline=None)
@given(value=TEXT, arg=TEXT)
def test_nomad_job_carries_user_text_only_in_the_entry_template(value, arg):
    spec = _spec(value, arg, "x")
    job = job_payload(spec)["Job"]
    entry = entry_script(spec)
    for g in job["TaskGroups"]:
        t = g["Tasks"][0]
        # Env and args hold only names Nomad defines; no user text is runtime-interpolated.
        assert all(v in ("0", "1", "${NOMAD_IP_rdzv}", "${NOMAD_TASK_DIR}/halo-master-addr") for v in t["Env"].values())
        assert t["Config"]["args"] == ["${NOMAD_TASK_DIR}/halo-entry.sh"]
        assert t["Templates"][0]["EmbeddedTmpl"] == entry
    # The HCL says the same: parse it and compare the entry template and env.
    groups = hcl_load(render_hcl(spec))["job"][0]["prop"]["group"]
    for g in groups:
        (name, body), = g.items()
        task = body["task"][0]["torchrun"]
        assert task["template"][0]["data"] == entry
        env = task["env"][0]
        jg = next(x for x in job["TaskGroups"] if x["Name"] == name)
        assert env == jg["Tasks"][0]["Env"]
    json.dumps(job)  # serialisable as the API payload
