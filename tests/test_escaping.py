"""Property tests: nothing a user writes can change the meaning of a generated script or job."""
from __future__ import annotations

import json
import re
import subprocess
import unicodedata

import pytest

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import halo_sched.spec  # the module itself: `import halo_sched` loads it lazily, on first use
from halo_sched.errors import SpecError
from halo_sched.backends.nomad.render import delimiters, job_payload, render_hcl
from halo_sched.backends.slurm.render import render_sbatch
from helpers import entry_script
from halo_sched.templating import (
    PATTERNS, RenderError, check, checked_int, hcl_escape, hcl_heredoc, heredoc_tag, sh_block, sh_quote,
)
from hclparse import hcl2json, jobspec
from helpers import base_env, fake_bin, load_nomad_helper, records, run_entry, run_sbatch

# HCL is read with HashiCorp's own parser (tests/hclparse: hcl2json in one long-lived Node process).
hcl_load = hcl2json.load

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


# HCL normalizes every string to Unicode NFC (so do the cty strings the Nomad client decodes
# driver config into): only NFC text can round-trip; render_hcl and the volumes check refuse the rest.
NFC_TEXT = TEXT.map(lambda t: unicodedata.normalize("NFC", t))


@FAST
@given(NFC_TEXT)
def test_hcl_string_round_trips(value):
    assert hcl_load(f'x = "{hcl_escape(value)}"\n')["x"] == value


@FAST
@given(NFC_TEXT)
def test_hcl_heredoc_round_trips(value):
    # HashiCorp's parser refuses a lone CR in a heredoc (and reads CR LF as LF): the Nomad
    # template quotes any text holding a CR instead (see test_hcl_string_round_trips).
    body = value.replace("\r", "") + "\nline\n"
    assert hcl_load(f"x = {hcl_heredoc(body)}\n")["x"] == body


@FAST
@given(TEXT)
def test_shell_heredoc_tag_never_a_line_of_the_body(value):
    tag = heredoc_tag(value, "HALO_ENTRY_EOF")
    assert tag not in value.split("\n")


@FAST
@given(TEXT)
def test_go_template_delimiters_absent(value):
    left, right = delimiters(value)
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
    r = run_entry(entry_script(spec), tmp, {"HALO_NODE_RANK": "1", "HALO_MASTER_ADDR": "127.0.0.1",
                                                "HALO_MASTER_PORT": "29500"}, base_env(bindir, out, ["V", "S"]))
    assert r.returncode == 0, r.stderr
    rec = records(out)[1]
    assert rec["argv"][-1] == arg
    assert bytes.fromhex(rec["env_hex"]["V"]) == value.encode()
    assert bytes.fromhex(rec["env_hex"]["S"]) == setup.encode()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=TEXT, arg=TEXT)
def test_values_survive_the_sbatch_script(tmp_path_factory, value, arg):
    """Hostile values reach the nodes byte-exact through the rendered batch script. Can pass a minute on a
    loaded machine: each of its 25 examples runs the whole script under bash with stand-in SLURM tools."""
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
@given(value=NFC_TEXT, arg=NFC_TEXT)
def test_nomad_job_carries_user_text_only_in_the_entry_template(value, arg):
    spec = _spec(value, arg, "x")
    job = job_payload(spec)["Job"]
    entry = entry_script(spec)
    runtime = {"0", "1", "${NOMAD_IP_rdzv}", "${NOMAD_PORT_rdzv}", "${NOMAD_ALLOC_INDEX}",
               "${NOMAD_TASK_DIR}/halo-master-addr", "${NOMAD_TASK_DIR}/halo-logs", "${NOMAD_TASK_DIR}/halo-node.b64",
               "${NOMAD_TASK_DIR}/halo-result.json"}
    for g in job["TaskGroups"]:
        t = g["Tasks"][0]
        # Env and args hold only names Nomad defines; no user text is runtime-interpolated.
        assert set(t["Env"].values()) <= runtime
        assert t["Config"]["args"] == ["${NOMAD_TASK_DIR}/halo-entry.sh"]
        assert t["Templates"][0]["EmbeddedTmpl"] == entry
    # The HCL, read by HCL's own parser, is the same job as the payload.
    assert jobspec.comparable(jobspec.api_job(hcl_load(render_hcl(spec)))) == jobspec.comparable(job)
    json.dumps(job)  # serialisable as the API payload


def test_hcl_refuses_text_it_would_normalize():
    # U+2F800 is a CJK compatibility ideograph: HCL (and cty) would turn it into U+4E3D.
    with pytest.raises(SpecError, match=r"env\.V.*NFC"):
        render_hcl(_spec("\U0002f800", "a", "x"))
    assert job_payload(_spec("\U0002f800", "a", "x"))  # the API payload carries it exactly
    with pytest.raises(SpecError, match="NFC"):
        halo_sched.spec.from_dict({"name": "v", "nodes": 1, "nproc_per_node": 1, "image": "i",
                                   "trainer": {"script": "t.py"}, "nomad": {"volumes": ["/e\u0301:/x"]}})


# A path segment: any NFC text without ':' (the volume separator) or NUL, not empty.
SEGMENT = NFC_TEXT.map(lambda t: t.replace(":", "")).filter(bool)


@settings(max_examples=60, deadline=None)
@given(host=SEGMENT, container=SEGMENT, mode=st.sampled_from(["", ":ro", ":rw"]))
def test_docker_volumes_stay_literal_on_the_client(host, container, mode):
    client_sim = load_nomad_helper("client_sim")
    volume = f"{host}:{container}{mode}"
    spec = halo_sched.spec.JobSpec.model_validate({
        "name": "vol", "nodes": 2, "nproc_per_node": 1, "image": "repo/img:1", "trainer": {"script": "t.py"},
        "nomad": {"volumes": [volume]},
    })
    job = job_payload(spec)["Job"]
    for g in job["TaskGroups"]:
        (sent,) = g["Tasks"][0]["Config"]["volumes"]
        # The client evaluates driver config as HCL templates with the task env as variables:
        # the mount it makes is exactly what the user wrote, whatever the env holds.
        assert client_sim.eval_hcl_string(sent, {"NOMAD_JOB_ID": "j", "x": "X"}) == volume
    # The HCL file carries the same (escaped) config string as the payload.
    assert jobspec.comparable(jobspec.api_job(hcl_load(render_hcl(spec)))) == jobspec.comparable(job)


# ---- setup ------------------------------------------------------------------------------------


@FAST
@given(TEXT)
def test_sh_block_is_one_literal_word(value):
    r = subprocess.run(["bash", "-c", f"printf '%s' {sh_block(value)}"], capture_output=True)
    assert r.returncode == 0
    assert r.stdout == value.encode()


# What a setup line may hold (the job file refuses other control characters).
SETUP_TEXT = TEXT.map(lambda t: re.sub(r"[\x00-\x08\x0a-\x1f\x7f]", "", t))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(comments=st.lists(SETUP_TEXT, max_size=3), value=SETUP_TEXT,
       opener=st.sampled_from(["", "cat > /dev/null <<'X'", "cat > /dev/null <<HALO_ENTRY_EOF", ": <<'EOF'"]))
def test_setup_text_cannot_swallow_the_script(tmp_path_factory, comments, value, opener):
    """Whatever the setup lines hold, torchrun starts after them with what they exported: a heredoc
    left open, a quote, a delimiter of the script itself ends with setup."""
    tmp = tmp_path_factory.mktemp("setup")
    setup = ["# " + c for c in comments] + [f"export S={sh_quote(value)}"] + ([opener] if opener else [])
    spec = halo_sched.spec.JobSpec.model_validate({"name": "prop", "nodes": 2, "nproc_per_node": 1,
                                                   "trainer": {"script": "t.py"}, "setup": setup})
    bindir, out = fake_bin(tmp), tmp / "out"
    out.mkdir()
    r = run_entry(entry_script(spec), tmp, {"HALO_NODE_RANK": "1", "HALO_MASTER_ADDR": "127.0.0.1",
                                            "HALO_MASTER_PORT": "29500"},
                  base_env(bindir, out, ["S"]))
    assert r.returncode == 0, r.stderr
    assert bytes.fromhex(records(out)[1]["env_hex"]["S"]) == value.encode()


# ---- the renderers' own checks, whatever the model holds (model_copy does not validate) ------


# Kinds of value written bare into a script: whatever passes the check is a plain bash word.
BARE_KINDS = ["job name", "variable name", "server name", "network interface", "signal name", "count"]


@FAST
@given(st.sampled_from(BARE_KINDS), TEXT)
def test_a_value_written_bare_is_a_plain_word_or_refused(kind, value):
    try:
        checked = check(value, kind)
    except RenderError:
        return
    assert checked == value and sh_quote(value) == value  # nothing in it a shell would read


@FAST
@given(TEXT)
def test_an_sbatch_option_stays_one_option_on_its_line(value):
    try:
        check("--comment=" + value, "sbatch option")
    except RenderError:
        return
    assert not re.search(r"[\s'\"\\#`$\x00-\x1f\x7f-\x9f]", value)


@FAST
@given(st.one_of(st.integers(), st.booleans(), st.floats(), TEXT, st.none()))
def test_only_whole_numbers_are_written_as_numbers(value):
    try:
        n = checked_int(value)
    except RenderError:
        assert not (type(value) is int and 0 <= value < 2**63)
        return
    assert type(n) is int and str(n).isdigit()


BASE_SPEC = {"name": "prop", "nodes": 2, "nproc_per_node": 1, "trainer": {"script": "t.py"},
             "nomad": {"driver": "raw_exec"}, "slurm": {"partition": "p"}, "network": {"interface": "eth0"},
             "servers": [{"name": "srv", "nodes": 1, "command": ["serve"], "port": 8000}]}


def _copy(field, value):
    spec = halo_sched.spec.JobSpec.model_validate(BASE_SPEC)
    if field == "server name":
        return spec.model_copy(update={"servers": [spec.servers[0].model_copy(update={"name": value})]})
    if field in ("partition", "interface"):
        section = "slurm" if field == "partition" else "network"
        return spec.model_copy(update={section: getattr(spec, section).model_copy(update={field: value})})
    return spec.model_copy(update={field: value})


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["name", "partition", "interface", "server name"]), TEXT)
def test_model_copy_text_is_refused_or_written_as_it_is(field, value):
    """Any text put into a field written bare: the public API refuses it (SpecError) unless the
    job file's rules take it, and the renderers themselves refuse it (RenderError) unless it
    fully matches the field's safe pattern; then the script holds it verbatim, one word."""
    spec = _copy(field, value)
    kind = {"name": "job name", "partition": "SLURM word", "interface": "network interface",
            "server name": "server name"}[field]
    # (an empty interface is no interface: nothing is written)
    safe = PATTERNS[kind].fullmatch(value) is not None or (field == "interface" and value == "")
    renders = [render_sbatch, lambda s: halo_sched.render(s, "slurm")]
    if field in ("name", "server name"):  # Nomad writes these bare too (ids, labels, paths)
        renders += [render_hcl, lambda s: halo_sched.render(s, "nomad")]
    for render in renders:
        try:
            text = render(spec)
        except SpecError:
            continue
        assert safe, f"{field}={value!r} was written"
        assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f]", text)
