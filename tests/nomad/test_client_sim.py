"""Tests of the Nomad client simulator, with hand-written raw_exec jobs.

Scripts run through ``bash -c`` and reach the simulator as driver config, which a Nomad client
evaluates as HCL2: they use brace-less ``$VAR`` on purpose, ``${...}`` would be interpolated.
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import load_nomad_helper

_sim = load_nomad_helper("client_sim")
(BUILTIN_FUNCS, GoTemplate, SimCluster, TaskConfigError, TemplateError, UnsupportedJobError, clean_env_var,
 eval_hcl_string, hcl_variables, parse_env_file, process_group_members, replace_env) = (
    getattr(_sim, n) for n in ("BUILTIN_FUNCS", "GoTemplate", "SimCluster", "TaskConfigError", "TemplateError",
                               "UnsupportedJobError", "clean_env_var", "eval_hcl_string", "hcl_variables",
                               "parse_env_file", "process_group_members", "replace_env"))

NS = 1_000_000_000  # API durations are nanoseconds


def bash_task(name: str, script: str, **extra: Any) -> dict[str, Any]:
    return {
        "Name": name,
        "Driver": "raw_exec",
        "Config": {"command": "/bin/bash", "args": ["-c", script]},
        "Resources": {"CPU": 500, "MemoryMB": 256},
        **extra,
    }


def group(name: str, tasks: list[dict[str, Any]], count: int = 1, **extra: Any) -> dict[str, Any]:
    # A fixed-size job: no restarts unless a test asks for them.
    return {
        "Name": name,
        "Count": count,
        "Tasks": tasks,
        "RestartPolicy": {"Attempts": 0, "Mode": "fail", "Delay": 0, "Interval": 60 * NS},
        **extra,
    }


def job(*groups: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"ID": "sim", "Name": "sim", "Type": "batch", "Datacenters": ["dc1"], "TaskGroups": list(groups), **extra}


def wait_for(cond: Callable[[], bool], timeout: float = 20.0) -> None:  # generous: a loaded CI host
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.05)


@pytest.fixture
def make_cluster(tmp_path: Path) -> Iterator[Callable[..., SimCluster]]:
    clusters: list[SimCluster] = []

    def make(j: dict[str, Any], **kw: Any) -> SimCluster:
        kw.setdefault("poll_interval", 0.1)
        c = SimCluster(j, tmp_path / f"c{len(clusters)}", **kw)
        clusters.append(c)
        return c

    yield make
    for c in clusters:
        c.stop(grace=0.2)


def env_lines(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        if "=" in line:
            k, v = line.split("=", 1)
            out[k] = v
    return out


# ---------------------------------------------------------------------------------------------
# Task environment and directory layout
# ---------------------------------------------------------------------------------------------


def test_layout_and_task_environment(make_cluster: Callable[..., SimCluster]) -> None:
    j = job(
        group(
            "g",
            [bash_task("t", "pwd; env", Meta={"Task_Key": "t-${NOMAD_ALLOC_INDEX}"})],
            count=2,
            Networks=[
                {
                    "Mode": "host",
                    "ReservedPorts": [{"Label": "rdzv", "Value": 29517}],
                    "DynamicPorts": [{"Label": "http", "Value": 0}, {"Label": "my-port", "Value": 0}],
                }
            ],
            Meta={"foo": "bar"},
        ),
        Meta={"foo": "job-level", "Other": "o"},
    )
    with pytest.raises(UnsupportedJobError, match="reserved twice"):
        # count=2 with a static port cannot fit the one simulated host
        make_cluster(j).place()
    j["TaskGroups"][0]["Networks"][0]["ReservedPorts"] = []
    host_env = {**os.environ, "SIM_AGENT_VAR": "from-agent", "VAULT_TOKEN": "must-not-leak"}
    c = make_cluster(j, host_env=host_env)
    allocs = c.place()
    c.start()
    assert c.wait(timeout=10) == {"sim.g[0]": 0, "sim.g[1]": 0}

    a = c.alloc("sim.g[1]")
    for sub in ("alloc", "alloc/logs", "alloc/data", "alloc/tmp", "t/local", "t/secrets", "t/tmp"):
        assert (Path(a.dir) / sub).is_dir(), sub
    assert Path(a.log_path("t")) == Path(a.dir) / "alloc" / "logs" / "t.stdout.0"

    out = c.stdout("sim.g[1]")
    assert out.splitlines()[0] == a.task_dir("t")  # cwd is the task dir
    env = env_lines(out)
    http = a.ports["http"]["Value"]
    expected = {
        "NOMAD_ALLOC_ID": a.id,
        "NOMAD_SHORT_ALLOC_ID": a.id[:8],
        "NOMAD_ALLOC_NAME": "sim.g[1]",
        "NOMAD_ALLOC_INDEX": "1",
        "NOMAD_GROUP_NAME": "g",
        "NOMAD_TASK_NAME": "t",
        "NOMAD_JOB_ID": "sim",
        "NOMAD_JOB_NAME": "sim",
        "NOMAD_NAMESPACE": "default",
        "NOMAD_REGION": "global",
        "NOMAD_DC": "dc1",
        "NOMAD_ALLOC_DIR": a.shared_dir,
        "NOMAD_TASK_DIR": os.path.join(a.task_dir("t"), "local"),
        "NOMAD_SECRETS_DIR": os.path.join(a.task_dir("t"), "secrets"),
        "NOMAD_CPU_LIMIT": "500",
        "NOMAD_MEMORY_LIMIT": "256",
        "NOMAD_IP_http": "127.0.0.1",
        "NOMAD_HOST_IP_http": "127.0.0.1",
        "NOMAD_PORT_http": str(http),
        "NOMAD_HOST_PORT_http": str(http),
        "NOMAD_ADDR_http": f"127.0.0.1:{http}",
        # group meta overrides job meta; both the upper-cased and the written key exist
        "NOMAD_META_foo": "bar",
        "NOMAD_META_FOO": "bar",
        "NOMAD_META_OTHER": "o",
        "NOMAD_META_Other": "o",
        "NOMAD_META_TASK_KEY": "t-1",
        "NOMAD_META_Task_Key": "t-1",
        # dashes in a port label are cleaned to underscores for the NOMAD_PORT_ keys only
        "NOMAD_PORT_my_port": str(a.ports["my-port"]["Value"]),
        "NOMAD_HOST_ADDR_my-port": f"127.0.0.1:{a.ports['my-port']['Value']}",
        # raw_exec passes the agent's environment, minus the denylist
        "SIM_AGENT_VAR": "from-agent",
    }
    for k, v in expected.items():
        assert env.get(k) == v, k
    assert "VAULT_TOKEN" not in env
    assert "NOMAD_PORT_my-port" not in env
    assert allocs[0].ports["http"]["Value"] != http  # each allocation gets its own port
    assert 20000 <= http <= 32000


def test_a_task_on_an_entered_host_runs_in_its_task_dir(make_cluster: Callable[..., SimCluster]) -> None:
    """A host entered through an argv prefix (the rig's ``nsenter --mount``) runs the task in its
    task dir too: entering a mount namespace sets the cwd to its root, as this prefix's ``cd /``
    does (a trainer on the rig read and wrote its cue files in "/")."""
    host = _sim.SimHost("entered", enter=["/bin/sh", "-c", 'cd / && exec "$@"', "enter"], ip="127.0.0.1")
    c = make_cluster(job(group("g", [bash_task("t", "pwd")])), hosts=[host])
    c.place()
    c.start()
    assert c.wait(timeout=10) == {"sim.g[0]": 0}
    assert c.stdout("sim.g[0]").splitlines() == [c.alloc("sim.g[0]").task_dir("t")]


def test_args_are_evaluated_as_hcl_templates(make_cluster: Callable[..., SimCluster]) -> None:
    args = [
        "%s\n",
        "${NOMAD_ALLOC_INDEX}",
        "$HOME",  # brace-less: never touched
        "${HOME}",  # the agent's own environment is part of the task env for raw_exec
        "$${FOO}",  # the HCL escape: the task receives the literal ${FOO}
        "%%{x}",
        "${node.unique.name}",
        "${attr.kernel.name}",
        "${meta.rack}",
        'a-${NOMAD_GROUP_NAME}-b-${env["NOMAD_JOB_ID"]}',
    ]
    t = {"Name": "t", "Driver": "raw_exec", "Config": {"command": "printf", "args": args}}
    c = make_cluster(job(group("g", [t])), node_attrs={"node.unique.name": "sim-node-1", "meta.rack": "r7"})
    c.place()
    c.start()
    assert c.wait(timeout=10) == {"sim.g[0]": 0}
    assert c.stdout("sim.g[0]").splitlines() == [
        "0",
        "$HOME",
        os.environ["HOME"],
        "${FOO}",
        "%{x}",
        "sim-node-1",
        "linux",
        "r7",
        "a-g-b-sim",
    ]
    assert c.alloc("sim.g[0]").tasks["t"].argv[0] == "/usr/bin/printf"  # looked up in the agent's PATH


@pytest.mark.parametrize(
    "arg, message",
    [
        ("--master=${FOO}", 'Unknown variable: There is no variable named "FOO"'),
        ("${NOMAD_META_missing}", 'no variable named "NOMAD_META_missing"'),
        ("${node.unique.nope}", 'does not have an attribute named "nope"'),
        ("%{test}", 'Invalid template control keyword: "test"'),
    ],
)
def test_unknown_variable_in_args_fails_the_task(
    make_cluster: Callable[..., SimCluster], arg: str, message: str
) -> None:
    # Unlike env values, an uninterpolatable ${X} in the driver config fails the task at start
    # ("Failed Validation"): hashicorp/nomad#5809, #11311, #14972.
    c = make_cluster(job(group("g", [bash_task("t", "true") | {"Config": {"command": "/bin/echo", "args": [arg]}}])))
    c.place()
    with pytest.raises(TaskConfigError, match=message):
        c.start()
    assert c.alloc("sim.g[0]").tasks["t"].pid is None
    assert not c.services("anything")


def test_env_values_use_replace_env(make_cluster: Callable[..., SimCluster]) -> None:
    task = bash_task(
        "t",
        "printf '%s\\n' \"$A\" \"$B\" \"$C\" \"$D\" \"$E\" \"$F\" \"$G\"; env",
        Env={
            "A": "${NOMAD_ALLOC_INDEX}-x",
            "B": "${FOO}",  # unknown: kept as written
            "C": "$HOME",  # brace-less: kept
            "D": "${HOME}",  # client env
            "E": "${node.unique.name}",
            "F": "$${NOMAD_ALLOC_INDEX}",  # no escape at runtime: "$" + value
            "G": "${NOMAD_PORT_my-port}",  # interpolated before key cleaning, so this one resolves
            "my-var": "dashes kept in task env keys",
        },
    )
    j = job(group("g", [task], Networks=[{"DynamicPorts": [{"Label": "my-port"}]}]))
    c = make_cluster(j, node_attrs={"node.unique.name": "n-7"})
    c.place()
    c.start()
    assert c.wait(timeout=10) == {"sim.g[0]": 0}
    out = c.stdout("sim.g[0]")
    port = str(c.alloc("sim.g[0]").ports["my-port"]["Value"])
    assert out.splitlines()[:7] == ["0-x", "${FOO}", "$HOME", os.environ["HOME"], "n-7", "$0", port]
    assert env_lines(out)["my-var"] == "dashes kept in task env keys"


# ---------------------------------------------------------------------------------------------
# Templates
# ---------------------------------------------------------------------------------------------


def test_template_custom_delimiters_paths_and_perms(make_cluster: Callable[..., SimCluster]) -> None:
    body = (
        "x={{ x }} y={{- y -}}\n"
        "h=${HOME} e=$${E} %{d}\n"
        "idx=[[ env \"NOMAD_ALLOC_INDEX\" ]] [[ env \"NOT_SET_ANYWHERE\" ]]|\n"
        "  [[- /* trimmed comment */ -]]  \n"
        "tail\t\n"
    )
    expected = "x={{ x }} y={{- y -}}\nh=${HOME} e=$${E} %{d}\nidx=0 |tail\t\n"
    templates = [
        {"EmbeddedTmpl": body, "DestPath": "local/conf.txt", "LeftDelim": "[[", "RightDelim": "]]",
         "ChangeMode": "noop", "Perms": "0755"},
        {"EmbeddedTmpl": "in task dir", "DestPath": "${NOMAD_TASK_DIR}/sub/x.txt", "ChangeMode": "noop"},
        {"EmbeddedTmpl": "shared", "DestPath": "../alloc/shared.txt", "ChangeMode": "noop"},
        {"EmbeddedTmpl": "abs", "DestPath": "/etc/abs.txt", "ChangeMode": "noop"},
    ]
    c = make_cluster(job(group("g", [bash_task("t", "cat local/conf.txt", Templates=templates)])))
    c.place()
    c.start()
    assert c.wait(timeout=10) == {"sim.g[0]": 0}
    a = c.alloc("sim.g[0]")
    tdir = Path(a.task_dir("t"))
    conf = tdir / "local" / "conf.txt"
    assert conf.read_bytes() == expected.encode()
    assert c.stdout("sim.g[0]") == expected  # rendered before the task started
    assert stat.S_IMODE(conf.stat().st_mode) == 0o755
    assert (tdir / "local" / "sub" / "x.txt").read_text() == "in task dir"
    assert stat.S_IMODE((tdir / "local" / "sub" / "x.txt").stat().st_mode) == 0o644
    assert (Path(a.shared_dir) / "shared.txt").read_text() == "shared"
    assert (tdir / "etc" / "abs.txt").read_text() == "abs"  # absolute paths are joined to the task dir


def test_template_destination_must_stay_in_the_sandbox(make_cluster: Callable[..., SimCluster]) -> None:
    tmpl = {"EmbeddedTmpl": "x", "DestPath": "../../outside.txt", "ChangeMode": "noop"}
    c = make_cluster(job(group("g", [bash_task("t", "true", Templates=[tmpl])])))
    c.place()
    with pytest.raises(TemplateError, match="escapes alloc directory"):
        c.start()


LEADER_ADDR_TMPL = (
    '{{ with nomadService "sim-leader" }}{{ with index . 0 }}{{ .Address }}:{{ .Port }}{{ end }}{{ end }}'
)

WORKER_SCRIPT = """
for i in $(seq 1 DEADLINE); do
  if [ -s local/leader.addr ]; then echo "leader at $(cat local/leader.addr)"; exit 0; fi
  sleep 0.1
done
echo "no leader published in time" >&2
exit 3
"""


def leader_worker_job(deadline_ticks: int, change_mode: str = "noop") -> dict[str, Any]:
    leader = group(
        "leader",
        [bash_task("trainer", "sleep 1.5")],
        Networks=[{"DynamicPorts": [{"Label": "rdzv"}]}],
        Services=[{"Name": "sim-leader", "Provider": "nomad", "PortLabel": "rdzv"},
                  {"Name": "sim-consul-only", "PortLabel": "rdzv"}],
    )
    worker = group(
        "worker",
        [
            bash_task(
                "trainer",
                WORKER_SCRIPT.replace("DEADLINE", str(deadline_ticks)),
                Templates=[
                    {"EmbeddedTmpl": LEADER_ADDR_TMPL, "DestPath": "local/leader.addr", "ChangeMode": change_mode}
                ],
            )
        ],
    )
    return job(leader, worker)


def test_worker_template_renders_empty_until_leader_registers(make_cluster: Callable[..., SimCluster]) -> None:
    c = make_cluster(leader_worker_job(deadline_ticks=100))
    c.place(["worker"])
    c.start()
    addr_file = Path(c.alloc("sim.worker[0]").task_dir("trainer")) / "local" / "leader.addr"
    assert addr_file.exists() and addr_file.read_bytes() == b""  # empty, not blocking
    time.sleep(0.4)
    assert c.alloc("sim.worker[0]").tasks["trainer"].state == "running"
    assert addr_file.read_bytes() == b""

    c.place(["leader"])
    c.start()
    port = c.alloc("sim.leader[0]").ports["rdzv"]["Value"]
    regs = c.services("sim-leader")
    assert [(r["Address"], r["Port"]) for r in regs] == [("127.0.0.1", port)]
    assert c.services("sim-consul-only") == []  # provider defaults to consul: not in Nomad's registry

    codes = c.wait(timeout=15)
    assert codes == {"sim.worker[0]": 0, "sim.leader[0]": 0}
    assert f"leader at 127.0.0.1:{port}" in c.stdout("sim.worker[0]")
    assert c.services("sim-leader") == []  # deregistered once the leader allocation finished


def test_several_registrations_ordered_by_id(make_cluster: Callable[..., SimCluster]) -> None:
    # During a redeploy two registrations of one name overlap; instance 0 is whichever sorts
    # first in Nomad's state store (by registration ID), not the first one placed.
    svc = group(
        "svc",
        [bash_task("t", "sleep 30")],
        count=2,
        Networks=[{"DynamicPorts": [{"Label": "p"}]}],
        Services=[{"Name": "dup", "Provider": "nomad", "PortLabel": "p", "Tags": ["r${NOMAD_ALLOC_INDEX}"]}],
    )
    tmpl = (
        '{{ range nomadService "dup" }}{{ .Port }},{{ end }}'
        '|{{ with index (nomadService "dup") 0 }}{{ .Port }}{{ end }}'
        '|{{ range nomadService "r1.dup" }}{{ .Port }}{{ end }}|{{ range nomadServices }}{{ .Name }}{{ end }}'
    )
    reader = group("reader", [bash_task("t", "cat local/s", Templates=[{"EmbeddedTmpl": tmpl, "DestPath": "local/s"}])])
    c = make_cluster(job(svc, reader))
    c.place(["svc"])
    c.start()
    c.place(["reader"])
    c.start()
    assert c.wait(timeout=10, alloc_names=["sim.reader[0]"]) == {"sim.reader[0]": 0}
    regs = c.services("dup")
    ports = [r["Port"] for r in regs]
    assert [r["ID"] for r in regs] == sorted(r["ID"] for r in regs)
    by_tag = {r["Tags"][0]: r["Port"] for r in regs}
    assert c.stdout("sim.reader[0]") == f"{ports[0]},{ports[1]},|{ports[0]}|{by_tag['r1']}|dup"


def test_leader_never_placed_worker_times_out(make_cluster: Callable[..., SimCluster]) -> None:
    c = make_cluster(leader_worker_job(deadline_ticks=8))
    c.place(["worker"])
    c.start()
    assert c.wait(timeout=10) == {"sim.worker[0]": 3}
    assert "no leader published in time" in c.stderr("sim.worker[0]")
    addr_file = Path(c.alloc("sim.worker[0]").task_dir("trainer")) / "local" / "leader.addr"
    assert addr_file.read_bytes() == b""


def test_change_mode_restart_restarts_the_task(make_cluster: Callable[..., SimCluster]) -> None:
    j = leader_worker_job(deadline_ticks=0, change_mode="restart")
    j["TaskGroups"][1]["Tasks"][0]["Config"]["args"] = [
        "-c", "echo \"start: $(cat local/leader.addr)\"; sleep 30"
    ]
    j["TaskGroups"][1]["Tasks"][0]["KillTimeout"] = NS // 2
    c = make_cluster(j)
    c.place(["worker"])
    c.start()
    wait_for(lambda: "start: " in c.stdout("sim.worker[0]"))
    c.place(["leader"])
    c.start()
    port = c.alloc("sim.leader[0]").ports["rdzv"]["Value"]
    wait_for(lambda: f"start: 127.0.0.1:{port}" in c.stdout("sim.worker[0]"))
    assert c.stdout("sim.worker[0]").splitlines()[0] == "start: "
    assert c.alloc("sim.worker[0]").tasks["trainer"].restarts == 1


def test_change_mode_signal(make_cluster: Callable[..., SimCluster]) -> None:
    # SIGUSR1, not SIGHUP: a shell cannot trap a signal ignored when it started (bash: "Signals
    # ignored upon entry to the shell cannot be trapped"), and under nohup SIGHUP is.
    script = "trap 'echo got-hup' USR1; echo ready; while true; do sleep 0.05; done"
    tmpl = {"EmbeddedTmpl": '{{ if nomadVarExists "cfg/a" }}yes{{ end }}', "DestPath": "local/a",
            "ChangeMode": "signal", "ChangeSignal": "SIGUSR1"}
    c = make_cluster(job(group("g", [bash_task("t", script, Templates=[tmpl])])))
    c.place()
    c.start()
    wait_for(lambda: "ready" in c.stdout("sim.g[0]"))
    c.set_variable("cfg/a", {"k": "v"})
    wait_for(lambda: "got-hup" in c.stdout("sim.g[0]"))
    assert c.alloc("sim.g[0]").tasks["t"].restarts == 0


def test_env_template_and_nomad_variables(make_cluster: Callable[..., SimCluster]) -> None:
    templates = [
        {"EmbeddedTmpl": 'export MASTER_ADDR="10.0.0.1"\nMASTER_PORT = 29500 # comment\n',
         "DestPath": "secrets/env", "Envvars": True, "ChangeMode": "noop"},
        {"EmbeddedTmpl": '{{ if nomadVarExists "cfg/x" }}present{{ else }}absent{{ end }}',
         "DestPath": "local/guarded", "ChangeMode": "noop"},
        # nomadVar on a missing path blocks the first render: the task does not start
        {"EmbeddedTmpl": '{{ with nomadVar "cfg/y" }}{{ .key }}/{{ .missing }}{{ end }}',
         "DestPath": "local/blocking", "ChangeMode": "noop"},
    ]
    script = "echo \"$MASTER_ADDR:$MASTER_PORT $(cat local/guarded) $(cat local/blocking)\""
    c = make_cluster(job(group("g", [bash_task("t", script, Templates=templates)])))
    c.place()
    c.start()
    tr = c.alloc("sim.g[0]").tasks["t"]
    time.sleep(0.3)
    assert tr.state == "pending" and tr.pid is None
    c.set_variable("cfg/y", {"key": "v"})
    assert c.wait(timeout=10) == {"sim.g[0]": 0}
    # a missing key of an existing variable renders empty: the zero NomadVarItem (missingkey=zero)
    assert c.stdout("sim.g[0]") == "10.0.0.1:29500 absent v/\n"


def test_restart_policy(make_cluster: Callable[..., SimCluster]) -> None:
    g = group("g", [bash_task("t", "echo run; exit 4")])
    g["RestartPolicy"] = {"Attempts": 2, "Delay": NS // 20, "Interval": 60 * NS, "Mode": "fail"}
    c = make_cluster(job(g))
    c.place()
    c.start()
    assert c.wait(timeout=10) == {"sim.g[0]": 4}
    assert c.stdout("sim.g[0]") == "run\nrun\nrun\n"  # logs append across restarts, like Nomad's
    assert c.alloc("sim.g[0]").tasks["t"].restarts == 2


# ---------------------------------------------------------------------------------------------
# Refusals
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tmpl, error",
    [
        ('{{ service "x" }}', UnsupportedJobError),  # a consul-template function we don't model
        ('{{ template "x" }}', UnsupportedJobError),
        ('{{ with nomadService "a" }}x{{ else with nomadService "b" }}y{{ end }}', UnsupportedJobError),
        ("{{ .Foo", TemplateError),  # unclosed action: Go rejects it too
        ("{{ if true }}x", TemplateError),
        ("{{ end }}", TemplateError),
    ],
)
def test_unsupported_or_invalid_template_is_refused(tmp_path: Path, tmpl: str, error: type) -> None:
    t = bash_task("t", "true", Templates=[{"EmbeddedTmpl": tmpl, "DestPath": "local/x", "ChangeMode": "noop"}])
    with pytest.raises(error):
        SimCluster(job(group("g", [t])), tmp_path)


def test_a_nomad_service_query_consul_template_cannot_parse_fails_the_render(make_cluster: Callable[..., SimCluster]) -> None:
    # consul-template v0.42.1 (Nomad 2.0.5's) has no namespace query for nomadService: only
    # [tag.]name[@region] (dependency/nomad_service.go NomadServiceQueryRe).
    tmpl = '{{ range nomadService "x?ns=other" }}{{ .Address }}{{ end }}'
    t = bash_task("t", "true", Templates=[{"EmbeddedTmpl": tmpl, "DestPath": "local/x", "ChangeMode": "noop"}])
    c = make_cluster(job(group("g", [t])))
    c.place()
    with pytest.raises(TemplateError, match="invalid format"):
        c.start()


def test_unsupported_value_printing_raises_at_start(make_cluster: Callable[..., SimCluster]) -> None:
    t = bash_task("t", "true", Templates=[{"EmbeddedTmpl": '{{ nomadService "x" }}', "DestPath": "local/x"}])
    c = make_cluster(job(group("g", [t])))
    c.place()
    with pytest.raises(UnsupportedJobError, match="printing"):
        c.start()


def test_docker_and_exec_are_refused(tmp_path: Path) -> None:
    docker = {"Name": "t", "Driver": "docker", "Config": {"image": "x"}}
    with pytest.raises(UnsupportedJobError, match="raw_exec"):
        SimCluster(job(group("g", [docker])), tmp_path)
    exec_task = bash_task("t", "true") | {"Driver": "exec"}
    with pytest.raises(UnsupportedJobError, match="exec_as_raw_exec"):
        SimCluster(job(group("g", [exec_task])), tmp_path)
    SimCluster(job(group("g", [exec_task])), tmp_path, exec_as_raw_exec=True).stop()


def test_payload_wrapper_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(Exception, match=r"payload\['Job'\]"):
        SimCluster({"Job": job(group("g", [bash_task("t", "true")]))}, tmp_path)


# ---------------------------------------------------------------------------------------------
# Process cleanup
# ---------------------------------------------------------------------------------------------


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # Orphans are reparented to PID 1, which may not reap them here: a zombie is gone too.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_stop_leaves_no_processes(tmp_path: Path) -> None:
    # Background jobs of a non-interactive shell ignore SIGINT (the kill signal), and one child
    # is a grandchild in a subshell: only a process-group SIGKILL gets them all.
    script = (
        "sleep 300 & echo $! >> $NOMAD_ALLOC_DIR/pids; "
        "( sleep 300 & echo $! >> $NOMAD_ALLOC_DIR/pids; wait ) & "
        "echo $$ >> $NOMAD_ALLOC_DIR/pids; trap '' INT; sleep 300"
    )
    with SimCluster(job(group("g", [bash_task("t", script)], count=2)), tmp_path, poll_interval=0.1) as c:
        c.place()
        c.start()
        pid_files = [Path(a.shared_dir) / "pids" for a in c.allocations]
        wait_for(lambda: all(p.exists() and len(p.read_text().split()) == 3 for p in pid_files))
        pids = [int(x) for p in pid_files for x in p.read_text().split()]
        pgids = [t.pid for a in c.allocations for t in a.tasks.values()]
        assert all(not _gone(p) for p in pids)
        started = time.monotonic()
        c.stop(grace=0.3)
        assert time.monotonic() - started < 5
    assert all(_gone(p) for p in pids), pids
    assert all(process_group_members(g) == [] for g in pgids)
    assert all(t.state == "dead" for a in c.allocations for t in a.tasks.values())


def test_a_stopped_task_leaves_nothing_of_its_own_not_even_in_another_session(
        make_cluster: Callable[..., SimCluster]) -> None:
    # Nomad's wrangler hook kills the task's whole cgroup once the task stops for good
    # (wrangler_hook.go Stop, proclib cgroup.kill): a process that left the task's process group
    # (setsid, as torchrun's workers do) goes too, whether the task was stopped or ended itself.
    stays = "setsid sleep 300 & echo $! >> $NOMAD_ALLOC_DIR/pids; trap '' INT; sleep 300"
    ends = "setsid sleep 300 & echo $! >> $NOMAD_ALLOC_DIR/pids; sleep 0.5; exit 0"
    c = make_cluster(job(group("stopped", [bash_task("t", stays)]), group("ended", [bash_task("t", ends)])))
    c.place()
    c.start()
    pid_files = {a.name: Path(a.shared_dir) / "pids" for a in c.allocations}
    wait_for(lambda: all(p.exists() and p.read_text().strip() for p in pid_files.values()))
    pids = {name: int(p.read_text().split()[0]) for name, p in pid_files.items()}
    wait_for(lambda: c.alloc("sim.ended[0]").terminal)
    wait_for(lambda: _gone(pids["sim.ended[0]"]))
    assert not _gone(pids["sim.stopped[0]"])
    c.kill_alloc("sim.stopped[0]", grace=0.3)
    wait_for(lambda: _gone(pids["sim.stopped[0]"]))


def test_max_run_duration_stops_each_allocation_but_not_an_unplaced_group(make_cluster: Callable[..., SimCluster]) -> None:
    mrd = {"MaxRunDuration": NS // 2}
    leader = group("node-0", [bash_task("t", "sleep 30", KillTimeout=NS // 5)], **mrd)
    c = make_cluster(job(leader, group("workers", [bash_task("t", "sleep 30")], count=2, **mrd)))
    c.place(["node-0"])  # the workers never place: no allocation, so no timer (Nomad 2.0.3+ likewise)
    c.start()
    codes = c.wait(timeout=5)
    assert codes == {"sim.node-0[0]": codes["sim.node-0[0]"]} and codes["sim.node-0[0]"] != 0  # killed
    a = c.alloc("sim.node-0[0]")
    assert a.max_run_exceeded and (a.client_status, a.client_description) == (
        "complete", "allocation exceeded max_run_duration")


def test_max_run_duration_counts_from_creation_not_start(make_cluster: Callable[..., SimCluster]) -> None:
    # client/allocrunner/max_run_duration_hook.go: the deadline is CreateTime + duration.
    c = make_cluster(job(group("g", [bash_task("t", "sleep 30")], MaxRunDuration=NS // 2)))
    (a,) = c.place()
    time.sleep(0.6)
    c.wait(timeout=1)  # runs a tick; nothing started
    assert a.client_status == "complete" and a.client_description == "allocation exceeded max_run_duration"
    assert c.start() == [] and all(t.pid is None for t in a.tasks.values())


def test_group_count_takes_name_indexes_and_fills_the_missing_ones(make_cluster: Callable[..., SimCluster]) -> None:
    c = make_cluster(job(group("workers", [bash_task("t", 'echo "$NOMAD_ALLOC_INDEX"')], count=3)))
    assert [a.name for a in c.place(["workers[1]"])] == ["sim.workers[1]"]
    assert [a.name for a in c.place(["workers"])] == ["sim.workers[0]", "sim.workers[2]"]
    with pytest.raises(_sim.SimError, match="already placed"):
        c.place(["workers"])
    c.start()
    c.wait(timeout=10)
    assert {i: c.stdout(f"sim.workers[{i}]").strip() for i in range(3)} == {0: "0", 1: "1", 2: "2"}


HOUR_NS = 3600 * NS


@pytest.mark.parametrize("version, disconnect, kept, after_lost_after", [
    # Nomad's default (no disconnect block): lost, and replaced whatever the reschedule policy.
    ("2.0.5", None, False, None),
    ("1.11.1", None, False, None),
    # replace = false alone: since PR #27053 unknown, expired at once, replaced; before, kept.
    ("2.0.5", {"Replace": False}, False, None),
    ("1.11.1", {"Replace": False}, True, True),
    # What halo-sched renders: kept until lost_after on 2.0.5, kept for good before 1.11.2.
    ("2.0.5", {"LostAfter": 2 * HOUR_NS, "Replace": False}, True, False),
    ("1.11.1", {"LostAfter": 2 * HOUR_NS, "Replace": False}, True, True),
])
def test_a_lost_node_by_version(make_cluster: Callable[..., SimCluster], version, disconnect, kept,
                                after_lost_after) -> None:
    extra = {} if disconnect is None else {"Disconnect": disconnect}
    c = make_cluster(job(group("workers", [bash_task("t", "sleep 30", KillTimeout=NS // 5)], count=2, **extra)),
                     nomad_version=version)
    c.place()
    c.start()
    wait_for(lambda: all(a.client_status == "running" for a in c.allocations))
    replacement = c.lose("sim.workers[1]")
    statuses = sorted((a.name, a.client_status) for a in c.allocations)
    if not kept:
        assert replacement is not None and replacement.name == "sim.workers[1]" and replacement.index == 1
        assert statuses == [("sim.workers[0]", "running"), ("sim.workers[1]", "lost"), ("sim.workers[1]", "pending")]
        return
    assert replacement is None
    assert statuses == [("sim.workers[0]", "running"), ("sim.workers[1]", "unknown")]
    assert c.advance(3600) == []  # within lost_after (or none): still unknown
    replaced = c.advance(2 * 3600)
    if after_lost_after:  # kept for good
        assert replaced == [] and sorted(a.client_status for a in c.allocations) == ["running", "unknown"]
    else:  # lost_after ran out: expired, lost, replaced under its name
        assert [a.name for a in replaced] == ["sim.workers[1]"]
        assert sorted(a.client_status for a in c.allocations) == ["lost", "pending", "running"]


def test_an_unknown_allocation_keeps_its_service_registration_until_it_is_lost(
        make_cluster: Callable[..., SimCluster]) -> None:
    """The servers delete a Nomad-native registration only for a client-terminal allocation
    (nomad/state/state_store_service_registration.go deregisterServicesForTerminalAllocs, v2.0.5):
    an unknown one keeps its registration, served to every reader, until it is lost."""
    svc = {"Name": "srv", "Provider": "nomad", "PortLabel": "http"}
    net = [{"Mode": "host", "DynamicPorts": [{"Label": "http"}]}]
    c = make_cluster(job(group("workers", [bash_task("t", "sleep 30", KillTimeout=NS // 5)], count=2,
                               Services=[svc], Networks=net,
                               Disconnect={"LostAfter": 2 * HOUR_NS, "Replace": False})))
    c.place()
    c.start()
    wait_for(lambda: all(a.client_status == "running" for a in c.allocations))
    lost = c.alloc("sim.workers[1]")
    assert len(c.services("srv")) == 2
    assert c.lose("sim.workers[1]") is None and lost.client_status == "unknown"
    assert [r["AllocID"] for r in c.services("srv")].count(lost.id) == 1  # its process is dead; still served
    c.advance(3 * 3600)  # lost_after ran out: lost (client-terminal), its registration deleted
    assert lost.client_status == "lost" and lost.id not in [r["AllocID"] for r in c.services("srv")]


def test_a_pending_allocation_on_a_lost_node_is_replaced_at_once(make_cluster: Callable[..., SimCluster]) -> None:
    # filters.go:214-221 and :286-291 (v2.0.5): it never ran, so nothing disconnects.
    disconnect = {"LostAfter": 2 * HOUR_NS, "Replace": False}
    for version in ("2.0.5", "1.11.1"):
        c = make_cluster(job(group("workers", [bash_task("t", "sleep 30")], count=1, Disconnect=disconnect)),
                         nomad_version=version)
        c.place()
        replacement = c.lose("sim.workers[0]")
        assert replacement is not None and replacement.name == "sim.workers[0]"


def test_wait_timeout(make_cluster: Callable[..., SimCluster]) -> None:
    c = make_cluster(job(group("g", [bash_task("t", "sleep 30")])))
    c.place()
    c.start()
    with pytest.raises(TimeoutError, match=r"sim\.g\[0\]"):
        c.wait(timeout=0.3)
    assert c.wait(timeout=0.1, raise_on_timeout=False) == {"sim.g[0]": None}


# ---------------------------------------------------------------------------------------------
# Pure functions
# ---------------------------------------------------------------------------------------------


def test_replace_env_semantics() -> None:
    env = {"A": "1", "a.b-c": "2"}
    assert replace_env("${A} ${a.b-c} ${B} $A $${A} ${ A }", env) == "1 2 ${B} $A $1 ${ A }"
    assert replace_env("${X}", {}, {"X": "node"}) == "node"
    assert replace_env("${X}", {"X": "first"}, {"X": "second"}) == "first"


def test_clean_env_var() -> None:
    assert clean_env_var("NOMAD_PORT_my-port") == "NOMAD_PORT_my_port"
    assert clean_env_var("NOMAD_META_a.b c") == "NOMAD_META_a.b_c"
    assert clean_env_var("1x") == "_x"


def test_hcl_strings() -> None:
    v = hcl_variables({"A": "1", "x.y": "nested"}, {"attr.cpu.arch": "amd64", "node.unique.name": "n"})
    text = "${A}${x.y} ${node.attr.cpu.arch} ${attr.cpu.arch} $${A} $A %%{"
    assert eval_hcl_string(text, v) == "1nested amd64 amd64 ${A} $A %{"
    with pytest.raises(UnsupportedJobError):
        eval_hcl_string("${A + 1}", v)
    with pytest.raises(TaskConfigError, match="Unterminated"):
        eval_hcl_string("${A", v)


def test_go_template_engine() -> None:
    funcs = {**BUILTIN_FUNCS, "items": lambda: ["a", "b"], "empty": lambda: []}
    names = list(funcs)
    t = GoTemplate(
        '{{ $n := len "abc" }}{{ $n }} {{ if and (eq $n 3) (not false) }}ok{{ end }} '
        "{{ range $i, $e := items }}{{ $i }}={{ $e }},{{ else }}none{{ end }} "
        "{{ range empty }}x{{ else }}none{{ end }} "
        '{{ printf "%s:%d" "h" 7 }} {{ print 1 2 "x" }} {{ "q" | printf "%q" }} '
        "{{ if eq 1 2 }}a{{ else if ne 1 1 }}b{{ else }}c{{ end }} "
        "{{ index items 1 }} {{ with $x := index items 0 }}{{ $x }}{{ . }}{{ end }}",
        functions=names,
    )
    assert t.render(funcs) == '3 ok 0=a,1=b, none h:7 1 2x "q" c b aa'
    assert GoTemplate("a  {{- 1 -}}  b {{ 2 }}\n{{- /* c */ -}}\n c").render({}) == "a1b 2c"
    assert GoTemplate("{{-3}} {{ 3 -}} x").render({}) == "-3 3x"  # "-3" is a number, not a trim marker
    with pytest.raises(TemplateError, match="index out of range: 5"):
        GoTemplate("{{ index items 5 }}", functions=names).render(funcs)
    with pytest.raises(TemplateError, match="can't evaluate field"):
        GoTemplate("{{ (index items 0).Address }}", functions=names).render(funcs)


def test_parse_env_file_quirks() -> None:
    parsed = parse_env_file(b'A="x\\ty" # c\nexport B=2\nC=\'$HOME\'\n\nD=\n')
    assert parsed == {"A": "x\ty", "B": "2", "C": "$HOME", "D": ""}
    # go-envparse skips only empty lines: a comment line has no "=" and is an error
    with pytest.raises(TemplateError, match="line 2: missing"):
        parse_env_file(b"A=1\n# plain comment\n")
    with pytest.raises(TemplateError, match="invalid value character"):
        parse_env_file(b"A=x\ty\n")  # a raw tab is a control character


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_characters="{["), max_size=200))
def test_text_without_delimiters_is_copied_byte_exact(text: str) -> None:
    assert GoTemplate(text).render({}) == text
    assert GoTemplate(text + "{{ 1 }}", "[[", "]]").render({}) == text + "{{ 1 }}"
