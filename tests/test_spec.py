"""Job-file validation: every bad field is named, unknown keys are errors, and the CLI exits 2."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

import halo_sched
from halo_sched.errors import SpecError
from halo_sched.spec import JobSpec, parse_go_duration, parse_size
from helpers import REPO

MIN = """
name: ok
nodes: 2
nproc_per_node: 2
trainer: {script: train.py}
"""


def problems(text: str) -> dict[str, str]:
    with pytest.raises(SpecError) as ei:
        halo_sched.loads(text)
    return {field.split(" (line")[0]: msg for field, msg in ei.value.problems}


def test_minimal_defaults():
    s = halo_sched.loads(MIN)
    assert (s.nodes, s.nproc_per_node, s.gpus_per_node, s.world_size) == (2, 2, 0, 4)
    assert s.rendezvous.port is None  # each job its own (tests/test_launch_contract.py)
    assert s.derived_env() == {"DIST_SHARED_FILESYSTEM": "1", "DIST_STORE_TIMEOUT_HOURS": "4"}
    assert s.nomad.driver == "docker"


@pytest.mark.parametrize("text, field, words", [
    (MIN + "bogus: 1\n", "bogus", "unknown key"),
    (MIN + "slurm: {partitoin: gpu}\n", "slurm.partitoin", "unknown key"),
    (MIN.replace("nodes: 2", "nodes: 0"), "nodes", "greater than or equal to 1"),
    (MIN.replace("name: ok", "name: 'a b'"), "name", "letters, digits"),
    (MIN.replace("name: ok", "name: '$(x)'"), "name", "letters, digits"),
    (MIN + "env: {BAD-NAME: x}\n", "env", "not a valid environment variable name"),
    (MIN + "env: {FOO: 1}\n", "env", "quote it"),
    (MIN + "env: {FOO: on}\n", "env", "quote it"),
    (MIN + "env: {MASTER_ADDR: x}\n", "env", "set by torchrun"),
    (MIN + "env: {HALO_NODE_RANK: x}\n", "env", "set by torchrun"),
    (MIN + "env: {DIST_SHARED_FILESYSTEM: '0'}\n", "env", "storage/network"),
    (MIN + "gpus_per_node: 1\n", "nproc_per_node", "exceeds gpus_per_node"),
    (MIN.replace("trainer: {script: train.py}", "trainer: {script: t.py, module: m}"), "trainer", "exactly one"),
    (MIN.replace("trainer: {script: train.py}", "trainer: {script: train.sh}"), "trainer.script", ".py"),
    (MIN.replace("trainer: {script: train.py}", "trainer: {module: 'a;b'}"), "trainer.module", "module name"),
    (MIN + "rendezvous: {port: 80}\n", "rendezvous.port", "greater than or equal to 1024"),
    (MIN + "slurm: {time: '1 hour'}\n", "slurm.time", "SLURM time"),
    (MIN + "slurm: {partition: 'gpu; rm -rf /'}\n", "slurm.partition", "only letters"),
    (MIN + "slurm: {signal: USR1@60}\n", "slurm.signal", "NCCL"),
    (MIN + "slurm: {extra_args: ['--comment=a b']}\n", "slurm.extra_args", "without spaces"),
    (MIN + "slurm: {extra_args: ['--nodes=3']}\n", "slurm.extra_args", "sets --nodes itself"),
    (MIN + "nomad: {max_run_duration: 2 hours}\n", "nomad.max_run_duration", "Go syntax"),
    (MIN + "nomad: {shm_size: 8GiB, memory: 4096}\n", "nomad.shm_size", "smaller than memory"),
    (MIN + "nomad: {driver: podman}\n", "nomad.driver", "docker"),
    (MIN + "nomad: {volumes: ['/a']}\n", "nomad.volumes", "host_path"),
    (MIN + "network: {interface: 'eth0 x'}\n", "network.interface", "interface name"),
    (MIN + "network: {cross_node_expert_parallel: true}\n", "network.cross_node_expert_parallel", "efa only"),
    (MIN + "image: 'a b'\n", "image", "image reference"),
    (MIN + "setup: [\"echo a\\r\"]\n", "setup", "control character"),
    (MIN + "env: {halo_rank: '0'}\n", "env", "cannot be set here"),
    (MIN + "env: {UID: '1'}\n", "env", "bash variable"),
    (MIN + "env: {SECONDS: '1'}\n", "env", "bash variable"),
    (MIN + "env: {BASH_ENV: /x}\n", "env", "cannot be set here"),
    (MIN.replace("nproc_per_node: 2", "nproc_per_node: 1") + "gpus_per_node: 1\nenv: {CUDA_VISIBLE_DEVICES: '0'}\n",
     "env", "assigned per node"),
    (MIN.replace("nodes: 2", "nodes: true"), "nodes", "valid integer"),
    (MIN.replace("nodes: 2", "nodes: '2'"), "nodes", "valid integer"),
    (MIN + "slurm: {extra_args: ['--signal=USR1@120']}\n", "slurm.extra_args", "slurm.signal"),
    (MIN + "slurm: {extra_args: ['--ntasks-per-n=8']}\n", "slurm.extra_args", "--ntasks-per-node itself"),
    (MIN + "slurm: {extra_args: ['--clusters']}\n", "slurm.extra_args", "--clusters=NAME"),
    (MIN + "nomad: {driver: raw_exec, shm_size: 1GiB}\n", "nomad.shm_size", "docker driver only"),
    (MIN + "nomad: {driver: exec, volumes: ['/a:/b']}\n", "nomad.volumes", "docker driver only"),
    (MIN + "nomad: {shm_size: true}\n", "nomad.shm_size", "size"),
    (MIN + "nomad: {namespace: ml_team}\n", "nomad.namespace", "letters, digits and -"),
    (MIN + "nomad: {max_run_duration: 1ns}\n", "nomad.max_run_duration", "shorter than a second"),
    (MIN + "nomad: {max_run_duration: 99999999999h}\n", "nomad.max_run_duration", "longer than Nomad"),
])
def test_bad_field_is_named(text, field, words):
    found = problems(text)
    assert field in found, found
    assert words in found[field]


def test_every_problem_is_reported_with_its_line():
    with pytest.raises(SpecError) as ei:
        halo_sched.loads("name: ok\nnodes: -1\nnproc_per_node: 0\ntrainer: {script: x.py}\nextra: 1\n")
    fields = [f for f, _ in ei.value.problems]
    assert fields == ["nodes (line 2)", "nproc_per_node (line 3)", "extra (line 5)"]


def test_yaml_syntax_error_names_line():
    found = problems("name: ok\nnodes: [1\n")
    assert any("YAML syntax error" in m for m in found.values())
    assert any(k.startswith("line ") for k in found)


def test_not_a_mapping():
    assert "mapping" in problems("- a\n- b\n")[""]


def test_storage_and_fabric_env():
    s = halo_sched.loads(MIN + """
storage: {shared: true, input_shared: false, output_shared: true, store_timeout_hours: 8, nccl_timeout_minutes: 30}
network: {interface: ib0, fabric: efa, cross_node_expert_parallel: true, nccl_proto_simple: true, nccl_debug: INFO}
""")
    assert s.derived_env() == {
        "DIST_SHARED_FILESYSTEM": "1", "DIST_INPUT_SHARED_FILESYSTEM": "0", "DIST_OUTPUT_SHARED_FILESYSTEM": "1",
        "DIST_STORE_TIMEOUT_HOURS": "8", "DIST_NCCL_TIMEOUT_MINUTES": "30",
        "NCCL_SOCKET_IFNAME": "ib0", "GLOO_SOCKET_IFNAME": "ib0",
        "NCCL_NET_PLUGIN": "ofi", "NCCL_NET": "Libfabric", "NCCL_GIN_TYPE": "2", "NCCL_PROTO": "simple", "NCCL_DEBUG": "INFO",
    }


def test_sizes_and_durations():
    assert parse_size("8GiB") == 8 * 1024**3
    assert parse_size(1024) == 1024
    assert parse_go_duration("1h30m") == 5400 * 10**9
    with pytest.raises(ValueError):
        parse_size("lots")


def test_setup_accepts_a_block_string():
    s = halo_sched.loads(MIN + "setup: |\n  module load cuda\n  source env/bin/activate\n")
    assert s.setup == ["module load cuda", "source env/bin/activate"]


def test_schema_lists_fixed_keys():
    props = JobSpec.model_json_schema()["properties"]
    for key in ("name", "nodes", "nproc_per_node", "gpus_per_node", "trainer", "env", "setup", "image",
                "rendezvous", "storage", "slurm", "nomad"):
        assert key in props


def cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "halo_sched.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=60)


def test_cli_validate_exit_codes(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text(MIN)
    (tmp_path / "train.py").write_text("")  # its trainer.script, beside it
    bad = tmp_path / "bad.yaml"
    bad.write_text(MIN.replace("nodes: 2", "nodes: zero") + "slurm: {qos: 'a b'}\n")
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: [unclosed\n")
    r = cli("validate", str(good))
    assert r.returncode == 0 and "ok" in r.stdout
    for f, words in ((bad, ["nodes (line 3)", "slurm.qos"]), (broken, ["YAML syntax error"]),
                     (tmp_path / "missing.yaml", ["no such file"])):
        r = cli("validate", str(f))
        assert r.returncode == 2, r
        assert "Traceback" not in r.stderr
        for w in words:
            assert w in r.stderr


def test_cli_render_bad_backend_and_format(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text(MIN)
    r = cli("render", str(good), "--backend", "kubernetes")
    assert r.returncode == 2 and "unknown backend" in r.stderr
    r = cli("render", str(good), "--backend", "slurm", "--format", "json")
    assert r.returncode == 2 and "--format applies to --backend nomad" in r.stderr
    # The docker driver needs an image: a spec error naming the field, not a traceback.
    r = cli("render", str(good), "--backend", "nomad")
    assert r.returncode == 2 and "image" in r.stderr and "Traceback" not in r.stderr


def test_cli_schema_is_json():
    r = cli("schema")
    assert r.returncode == 0
    assert "trainer" in json.loads(r.stdout)["properties"]


def test_cli_never_imports_torch():
    code = "import sys, halo_sched.cli, halo_sched.backends.slurm.render, halo_sched.backends.nomad.render, halo_sched.backends.local; print('torch' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "False"


# What `render` must not load (docs/performance.md: start-up and peak memory): the scheduler's
# transports and parsers, job records, the exactly-once machinery, the other backends, and the
# libraries only they use.
NOT_FOR_RENDER = ("torch", "tenacity", "requests", "unicodedata", "halo_sched.records", "halo_sched.core",
                  "halo_sched.exactly_once", "halo_sched.backends.slurm.transport", "halo_sched.backends.slurm.status",
                  "halo_sched.backends.nomad", "halo_sched.backends.local", "halo_sched.node.failures",
                  # job states: what a scheduler says of a job, not what it is sent
                  "halo_sched.jobstate")


@pytest.mark.parametrize("argv, needs", [
    (["render", "examples/ddp-gpu.yaml", "--backend", "slurm"], ()),
    # Nomad's renderer is its backend's package; its NFC check of a job's text needs unicodedata.
    (["render", "examples/rl-servers.yaml", "--backend", "nomad"], ("halo_sched.backends.nomad", "unicodedata")),
    (["validate", "examples/ddp-gpu.yaml"], ()),
])
def test_render_and_validate_load_only_what_they_need(argv, needs):
    code = ("import contextlib, io, sys\nfrom halo_sched import cli\nwith contextlib.redirect_stdout(io.StringIO()):\n"
            f"    rc = cli.main({argv!r})\n"
            f"print(rc, sorted(set(sys.modules) & (set({NOT_FOR_RENDER!r}) - set({needs!r}))))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.stdout.split(None, 1) == ["0", "[]\n"], r.stdout + r.stderr


def test_image_on_slurm_uses_pyxis_unless_disabled():
    from halo_sched.backends.slurm.render import render_sbatch

    s = halo_sched.loads(MIN + "image: nvcr.io/nvidia/pytorch:25.01-py3\nslurm: {container_mounts: ['/data:/data:ro']}\n")
    text = render_sbatch(s)
    assert "--container-image=nvcr.io/nvidia/pytorch:25.01-py3" in text
    assert "\nhalo_container_pwd /data:/data:ro /data  #" in text  # the flags it becomes: tests/test_slurm_render.py
    s = halo_sched.loads(MIN + "image: nvcr.io/nvidia/pytorch:25.01-py3\nslurm: {container_runtime: none}\n")
    assert "--container-image" not in render_sbatch(s)


def test_duplicate_keys_are_errors():
    found = problems(MIN + "env: {A: '1'}\nenv: {B: '2'}\n")
    assert any("duplicate key 'env'" in m for m in found.values()), found


def test_slurm_feature_expressions_are_accepted():
    s = halo_sched.loads(MIN + "slurm: {constraint: '[rack1|rack2]&ib'}\n")
    assert s.slurm.constraint == "[rack1|rack2]&ib"


def test_backend_specific_render_errors_name_the_field():
    from halo_sched.backends.nomad.render import job_payload
    from halo_sched.backends.slurm.render import render_sbatch

    with pytest.raises(SpecError, match="would ignore the image"):
        job_payload(halo_sched.loads(MIN + "image: repo/img:1\nnomad: {driver: raw_exec}\n"))
    # Each value within one argument's limit, the entry script that carries them all over it.
    big = halo_sched.loads(MIN + f"env: {{BIG: '{'x' * 100_000}', BIG2: '{'x' * 40_000}'}}\n")
    with pytest.raises(SpecError) as ei:
        render_sbatch(big)
    assert ei.value.problems[0][0] == "env" and "one argument to srun" in ei.value.problems[0][1]
    assert "BIG" in halo_sched.render(big, "local")  # the local backend writes the entry to a file
    # The part that holds most of it is named: here the trainer's arguments (hypothesis found the
    # refusal naming env for 80,000 bytes of args).
    args = halo_sched.loads(MIN.replace("trainer: {script: train.py}", "trainer: {script: train.py, args: "
                                        f"['{'L' * 70_000}', '{'L' * 70_000}']}}"))
    with pytest.raises(SpecError) as ei:
        render_sbatch(args)
    assert ei.value.problems[0][0] == "trainer.args" and "trainer.args puts 140000 bytes" in ei.value.problems[0][1]


def test_yaml_merge_keys_still_work():
    s = halo_sched.loads(MIN + "nomad: {<<: {cpu: 2000, memory: 8192}, cpu: 3000}\n")
    assert (s.nomad.cpu, s.nomad.memory) == (3000, 8192)
    assert "unhashable" in " ".join(problems("? [a]\n: 1\n").values())


def test_common_app_env_names_are_allowed():
    s = halo_sched.loads(MIN + "env: {ENV: prod, nomad_thing: x}\n")
    assert s.env == {"ENV": "prod", "nomad_thing": "x"}


def test_unquoted_slurm_time_is_explained():
    found = problems(MIN + "slurm: {time: 1:30:00}\n")
    assert "quote it" in found["slurm.time"] and "5400" in found["slurm.time"]


# --------------------------------------------------------------------------------------------
# A YAML value the loader itself refuses, with its line.

@pytest.mark.parametrize("key, kind", [("~", "null"), ("null", "null"), ("1", "a number"), ("2024-01-01", "a date")])
@pytest.mark.parametrize("where", ["top", "env", "slurm"])
def test_a_key_yaml_reads_as_not_text_is_named_with_its_line(key, kind, where):
    extra = {"top": f"{key}: 1\n", "env": f"env: {{{key}: x}}\n", "slurm": f"slurm:\n  {key}: x\n"}[where]
    with pytest.raises(SpecError) as ei:
        halo_sched.loads(MIN + extra)
    (field, msg), = ei.value.problems
    line = 7 if where == "slurm" else 6  # MIN begins with an empty line
    assert field.startswith(f"line {line}, column "), field
    assert f"key '{key}' is read by YAML as {kind}" in msg and "quote it" in msg
    assert "None" not in msg


@pytest.mark.parametrize("key", ["on", "On", "off", "yes", "NO", "true", "y"])
def test_a_key_yaml_1_1_reads_as_a_boolean_stays_the_name_written(key):
    """A plain ``on`` (``off``, ``yes``, ...) is a boolean to YAML 1.1 but, as a key, a name: an
    environment variable named ON is ON; a quoted one was always a name."""
    assert halo_sched.loads(MIN + f"env: {{{key}: x}}\n").env == {key: "x"}


def test_a_lone_surrogate_escape_is_refused_with_its_line():
    # YAML takes "\ud800", but no UTF-8 file or process argument can carry it: render crashed.
    found = problems(MIN + 'env: {A: "\\ud800"}\n')
    assert any(k.startswith("line 6,") and "U+D800" in m for k, m in found.items()), found


# --------------------------------------------------------------------------------------------
# A trailing newline: `re.match` with `$` takes "name\n" as "name". Every checked text field.

def _base() -> dict:
    return {"name": "ok", "nodes": 2, "nproc_per_node": 2, "trainer": {"script": "train.py"}}


def _server(**kw) -> dict:
    return {"servers": [{"name": "vllm", "nodes": 1, "command": ["serve"], "port": 8000, **kw}]}


# (field as reported, the job file's data with VALUE where the text goes)
TEXT_FIELDS = [
    ("name", lambda v: {"name": v}),
    ("env", lambda v: {"env": {v: "x"}} if v.startswith("FOO") else None),
    ("trainer.module", lambda v: {"trainer": {"module": v}}),
    ("secret_env", lambda v: {"secret_env": [v]}),
    ("image", lambda v: {"image": v}),
    ("network.interface", lambda v: {"network": {"interface": v}}),
    ("slurm.partition", lambda v: {"slurm": {"partition": v}}),
    ("slurm.account", lambda v: {"slurm": {"account": v}}),
    ("slurm.qos", lambda v: {"slurm": {"qos": v}}),
    ("slurm.time", lambda v: {"slurm": {"time": v}}),
    ("slurm.mem", lambda v: {"slurm": {"mem": v}}),
    ("slurm.constraint", lambda v: {"slurm": {"constraint": v}}),
    ("slurm.signal", lambda v: {"slurm": {"signal": v}}),
    ("slurm.container_workdir", lambda v: {"slurm": {"container_workdir": v}}),
    ("slurm.container_mounts", lambda v: {"slurm": {"container_mounts": [v]}}),
    ("slurm.extra_args", lambda v: {"slurm": {"extra_args": [v]}}),
    ("nomad.datacenters", lambda v: {"nomad": {"datacenters": [v]}}),
    ("nomad.namespace", lambda v: {"nomad": {"namespace": v}}),
    ("nomad.region", lambda v: {"nomad": {"region": v}}),
    ("nomad.max_run_duration", lambda v: {"nomad": {"max_run_duration": v}}),
    ("nomad.shm_size", lambda v: {"nomad": {"shm_size": v}}),
    ("servers[0].name", lambda v: _server(name=v)),
    ("servers[0].health_path", lambda v: _server(health_path=v)),
    ("servers[0].image", lambda v: _server(image=v)),
    ("servers[0].env", lambda v: _server(env={v: "x"})),
    ("servers[0].secret_env", lambda v: _server(secret_env=[v])),
]
GOOD_TEXT = {"name": "ok", "env": "FOO", "trainer.module": "pkg.train", "secret_env": "TOKEN", "image": "repo/img:1",
             "network.interface": "ib0", "slurm.partition": "gpu", "slurm.account": "acct", "slurm.qos": "high",
             "slurm.time": "1:00:00", "slurm.mem": "16G", "slurm.constraint": "ib", "slurm.signal": "USR2@60",
             "slurm.container_workdir": "/w", "slurm.container_mounts": "/a:/b", "slurm.extra_args": "--comment=x",
             "nomad.datacenters": "dc1", "nomad.namespace": "ml", "nomad.region": "eu",
             "nomad.max_run_duration": "2h", "nomad.shm_size": "1GiB", "servers[0].name": "vllm",
             "servers[0].health_path": "/health", "servers[0].image": "repo/vllm:1", "servers[0].env": "FOO",
             "servers[0].secret_env": "TOKEN"}


def _job(field: str, value: str) -> str:
    import yaml

    data = _base()
    part = dict(TEXT_FIELDS)[field](value)
    for k, v in part.items():
        data[k] = {**data[k], **v} if k == "trainer" and "module" in v else v
    if "module" in data["trainer"]:
        del data["trainer"]["script"]
    if field in ("nomad.shm_size",):
        data["image"] = "repo/img:1"
    return yaml.safe_dump(data)


@pytest.mark.parametrize("field", [f for f, _ in TEXT_FIELDS])
def test_a_trailing_newline_is_not_part_of_any_name(field):
    halo_sched.loads(_job(field, GOOD_TEXT[field]))  # the value itself is fine
    found = problems(_job(field, GOOD_TEXT[field] + "\n"))
    assert field in found, found


def test_a_reserved_variable_with_a_newline_is_not_a_new_name():
    # "MASTER_ADDR\n" passed the reserved-name check and rendered `export MASTER_ADDR` then `=x`.
    found = problems(MIN + 'env: {"MASTER_ADDR\\n": x}\n')
    assert "not a valid environment variable name" in found["env"]


@pytest.mark.parametrize("iface, words", [
    ("bars-nonexistent0", "'bars-nonexistent0' is 17 characters, and Linux allows at most 15"),
    ("eth 0", "' ' is not allowed"),
    ("ib/0", "'/' is not allowed"),
])
def test_a_bad_interface_name_says_why(iface, words):
    assert words in problems(MIN + f"network: {{interface: '{iface}'}}\n")["network.interface"]


# --------------------------------------------------------------------------------------------
# What validate let through and the job then failed on.

BIG = "x" * 200_000
BIGGISH = "y" * 120_000  # under one string's limit; nine of them are over one process's


@pytest.mark.parametrize("text, field, words", [
    (MIN + f"env: {{BIG: '{BIG}'}}\n", "env", "at most 131071 bytes in one variable"),
    (MIN.replace("{script: train.py}", f"{{script: train.py, args: [a, '{BIG}']}}"), "trainer.args",
     "argument 1 is 200000 bytes"),
    (MIN + f"servers: [{{name: s, nodes: 1, port: 8000, command: [serve, '{BIG}']}}]\n", "servers[0].command",
     "Argument list too long"),
    (MIN + f"servers: [{{name: s, nodes: 1, port: 8000, command: [serve], env: {{A: '{BIG}'}}}}]\n",
     "servers[0].env", "131071"),
    (MIN + f"env: {{A: &v '{BIGGISH}', " + ", ".join(f"A{i}: *v" for i in range(8)) + "}\n", "env",
     "at most 1048576"),
    (MIN.replace("{script: train.py}", f"{{script: train.py, args: [&v '{BIGGISH}', "
                                       + ", ".join(["*v"] * 8) + "]}"), "trainer", "trainer.args come to"),
    (MIN + f"servers: [{{name: s, nodes: 1, port: 8000, command: [serve], env: {{A: &v '{BIGGISH}', "
           + ", ".join(f"A{i}: *v" for i in range(8)) + "}}]\n", "servers[0].env", "ARG_MAX"),
    (MIN + "storage: {store_timeout_hours: .inf}\n", "storage.store_timeout_hours", "finite"),
    (MIN + "storage: {store_timeout_hours: .nan}\n", "storage.store_timeout_hours", "finite"),
    (MIN + "storage: {store_timeout_hours: 1000}\n", "storage.store_timeout_hours", "less than or equal to 168"),
    (MIN + "storage: {nccl_timeout_minutes: 99999999999999999999}\n", "storage.nccl_timeout_minutes", "less than"),
    (MIN + "nomad: {cpu: 99999999999999999999}\n", "nomad.cpu", "less than or equal to 10000000"),
    (MIN + "nomad: {memory: 9223372036854775807}\n", "nomad.memory", "less than or equal to"),
    (MIN + "nomad: {placement_timeout_s: 99999999999999999999}\n", "nomad.placement_timeout_s", "less than"),
    (MIN + "slurm: {cpus_per_task: 70000}\n", "slurm.cpus_per_task", "less than or equal to 65533"),
    (MIN + "slurm: {mem: '-5G'}\n", "slurm.mem", "not a SLURM memory size"),
    (MIN + "slurm: {mem: 16GiB}\n", "slurm.mem", "not a SLURM memory size"),
    (MIN + "slurm: {mem: 1.5G}\n", "slurm.mem", "not a SLURM memory size"),
    (MIN + "slurm: {mem: 99999999999999999999T}\n", "slurm.mem", "more memory than any node"),
    (MIN + "slurm: {mem: 64G, extra_args: ['--mem-per-cpu=4G']}\n", "slurm.extra_args", "conflicts with slurm.mem"),
    (MIN + "slurm: {exclusive: true, extra_args: ['--exclusive=user']}\n", "slurm.extra_args", "slurm.exclusive"),
])
def test_what_would_fail_later_is_refused(text, field, words):
    found = problems(text)
    assert field in found, found
    assert words in found[field], found[field][:500]
    assert BIG not in found[field] and BIGGISH not in found[field]


def test_sizes_just_within_the_limits_load():
    value = "v" * (131072 - len("BIG=") - 1)
    s = halo_sched.loads(MIN + f"env: {{BIG: '{value}'}}\n")
    assert s.env["BIG"] == value
    assert problems(MIN + f"env: {{BIG: '{value}v'}}\n")["env"].startswith("BIG's value is 131068 bytes")
    assert halo_sched.loads(MIN + "slurm: {mem: 16GB}\nstorage: {store_timeout_hours: 0.5}\n").slurm.mem == "16GB"
    assert halo_sched.loads(MIN + "slurm: {mem: '0'}\n").slurm.mem == "0"  # all of each node's memory


def test_a_secret_too_large_to_pass_names_its_field_not_its_value():
    s = halo_sched.loads(MIN + "secret_env: [TOKEN]\n")
    with pytest.raises(SpecError) as ei:
        s.secret_values({"TOKEN": "s3cr3t" * 40_000})
    assert ei.value.problems[0][0] == "secret_env[0]"
    assert "TOKEN's value in the environment is 240000 bytes" in ei.value.problems[0][1]
    assert "s3cr3t" not in str(ei.value)


# --------------------------------------------------------------------------------------------
# slurm.extra_args may not repeat an option the renderer writes, nor make the job something else.

def _rendered_sbatch_options(text: str) -> set[str]:
    import re

    from halo_sched.backends.slurm.render import render_sbatch

    return set(re.findall(r"^#SBATCH (--[a-z-]+)", render_sbatch(halo_sched.loads(text)), re.M))


def test_the_list_of_rendered_sbatch_options_is_the_renderers():
    from halo_sched.spec import SBATCH_OPTIONS_SET_BY

    every = ("gpus_per_node: 2\nslurm: {partition: gpu, account: a, qos: q, time: '1:00:00', constraint: ib, "
             "cpus_per_task: 4, mem: 16G, signal: USR2@120, exclusive: true, requeue: %s}\n")
    written = _rendered_sbatch_options(MIN + every % "true") | _rendered_sbatch_options(MIN + every % "false")
    assert written == set(SBATCH_OPTIONS_SET_BY)


def _sbatch_cases():
    from halo_sched.spec import SBATCH_OPTIONS_REFUSED, SBATCH_OPTIONS_SET_BY

    for form in ("{}", "{}=1"):
        for option, field in SBATCH_OPTIONS_SET_BY.items():
            if form.format(option) != "--exclusive=1":  # --exclusive=user|mcs: slurm.exclusive cannot say it
                yield form.format(option), f"halo-sched sets {option} itself " + (
                    field if field.startswith("(") else f"(use {field} instead)")
        for option, why in SBATCH_OPTIONS_REFUSED.items():
            yield form.format(option), f"{option} cannot be given here: {why}"


@pytest.mark.parametrize("arg, words", list(_sbatch_cases()))
def test_extra_args_cannot_give_an_option_halo_sched_writes(arg, words):
    assert words in problems(MIN + f"slurm: {{extra_args: ['{arg}']}}\n")["slurm.extra_args"]


@pytest.mark.parametrize("arg, words", [
    ("--time=1:00:00", "use slurm.time instead"),
    ("--array=1-4", "one job, not an array"),
    ("--ti=5", "use slurm.time instead"),  # sbatch takes an unambiguous prefix
    ("--job-n=x", "use name instead"),
    ("-t", "'-t' is --time"),
    ("-p", "use slurm.partition instead"),
    ("-J", "use name instead"),
    ("-N", "use nodes"),
    ("-o", "sets --output itself"),
    ("-a", "not an array"),
    ("-G", "long form"),
])
def test_extra_args_name_the_field_that_sets_the_option(arg, words):
    assert words in problems(MIN + f"slurm: {{extra_args: ['{arg}']}}\n")["slurm.extra_args"]


def test_extra_args_that_only_begin_like_a_written_option_are_kept():
    args = ["--gpus=1", "--time-min=30", "--exclusive=user", "--mem-per-cpu=4G", "--wait-all-nodes=1",
            "--comment=x", "--export-file=/e", "--nodelist=n1"]
    s = halo_sched.loads(MIN + f"slurm: {{extra_args: {args}}}\n")
    assert s.slurm.extra_args == args


# --------------------------------------------------------------------------------------------
# An unknown key: the field it resembles.

@pytest.mark.parametrize("text, field, guess", [
    (MIN + "nodez: 3\n", "nodez", "nodes"),
    (MIN + "slurm: {partiton: gpu}\n", "slurm.partiton", "partition"),
    (MIN + "parallelism: {tpp: 2}\n", "parallelism.tpp", "tp"),
    (MIN + "servers: [{nmae: s, nodes: 1, command: [a], port: 8000}]\n", "servers[0].nmae", "name"),
    (MIN + "storage: {store_timeout_hour: 2}\n", "storage.store_timeout_hour", "store_timeout_hours"),
])
def test_an_unknown_key_suggests_the_field_it_resembles(text, field, guess):
    assert f"did you mean {guess}?" in problems(text)[field]


def test_an_unknown_key_like_nothing_suggests_nothing():
    assert "did you mean" not in problems(MIN + "zzzzzz: 1\n")["zzzzzz"]
