"""halo-sched across real network boundaries (issue 31): a SLURM cluster of four hosts in network
namespaces (tests/cluster/multihost.sh), each host with mgmt0 (10.77.0.0/24, SLURM's NodeAddr, the
host name resolves to it) and data0 (10.78.0.0/24, the training network). Real torchrun and gloo,
2 nodes x 2 ranks; the interfaces' byte counters say where the ranks' traffic went."""
from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

import pytest

from cluster.multihost_fixtures import _rig_session, rig, veth_bytes  # noqa: F401  (the fixtures)
from cluster.multihost_fixtures import node_steps, status_once_training
from helpers import REPO, cli, example_job, slurm_env, until

pytestmark = [pytest.mark.slurm, pytest.mark.torch, pytest.mark.multihost]

MB = 1 << 20


def cli_argv() -> list[str]:
    import sys

    return [sys.executable, "-m", "halo_sched.cli"]


def submit(tmp_path, rig, **fields) -> tuple[str, dict]:
    env = slurm_env(rig.env)
    shutil.copy(REPO / "tests" / "trainers" / "net_probe.py", tmp_path / "net_probe.py")
    shutil.copy(REPO / "tests" / "trainers" / "hang.py", tmp_path / "hang.py")
    fields.setdefault("trainer", {"script": "net_probe.py", "args": ["--steps", "10"]})
    job = example_job(tmp_path, 29500, **fields)
    r = cli("submit", str(job), "--backend", "slurm", "--quiet", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout.strip().splitlines()[-1], env


def wait_end(job_id: str, tmp_path, env, timeout: float) -> tuple[str, float]:
    t0 = time.monotonic()
    r = cli("watch", job_id, "--backend", "slurm", "--quiet", "--timeout", str(int(timeout)), cwd=tmp_path, env=env,
            timeout=timeout + 60)
    return r.stdout + r.stderr, time.monotonic() - t0


def output(job_id: str, tmp_path) -> str:
    return "".join(p.read_text(errors="replace") for p in tmp_path.glob(f"*{job_id.split(':')[-1]}*.out"))


def traffic(before, after) -> dict[str, int]:
    """Bytes sent by all hosts together, per network, between two readings."""
    out = {"mgmt0": 0, "data0": 0}
    for (h, net), v in after.items():
        out[net] += v["sent"] - before[(h, net)]["sent"]
    return out


def test_interface_data0_carries_rank0_address_and_collectives(tmp_path, rig):
    before = veth_bytes()
    job_id, env = submit(tmp_path, rig, network={"interface": "data0"})
    text, took = wait_end(job_id, tmp_path, env, 240)
    after = veth_bytes()
    out = output(job_id, tmp_path)
    print(text, out, sep="\n")
    assert "COMPLETED" in text, text + out
    master = re.search(r"master (\S+):(\d+)", out)
    assert master and master[1].startswith("10.78.0."), out
    assert re.findall(r"net-probe rank \d+ host (h\d) master_addr (\S+) gloo_ifname ([^\s\[]+)", out) and all(
        a == master[1] and i == "data0" for _, a, i in re.findall(r"net-probe rank \d+ host (h\d) master_addr (\S+) gloo_ifname ([^\s\[]+)", out)), out
    t = traffic(before, after)
    print(f"bytes sent: {t}, {took:.1f} s")
    # 10 all_reduces of 4 MiB across two hosts: tens of MiB on data0; SLURM's own messages on mgmt0.
    assert t["data0"] > 40 * MB and t["mgmt0"] < 4 * MB, t


def test_without_interface_rank0_is_nodeaddr_and_gloo_binds_the_host_name(tmp_path, rig):
    """No network.interface: rank 0's address is the first node's NodeAddr (mgmt0 here) and gloo
    binds the address the host's own name resolves to (mgmt0 too): docs/slurm.md says so, the
    rendered script's comment says so, and so does the job's output."""
    env = slurm_env(rig.env)
    job = example_job(tmp_path, 29500, trainer={"script": "net_probe.py", "args": ["--steps", "10"]})
    r = cli("render", str(job), "--backend", "slurm", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    assert "network.interface unset" in r.stdout and "NodeAddr" in r.stdout, r.stdout
    before = veth_bytes()
    job_id, env = submit(tmp_path, rig)
    text, _ = wait_end(job_id, tmp_path, env, 240)
    t = traffic(before, veth_bytes())
    out = output(job_id, tmp_path)
    print(text, out, t, sep="\n")
    assert "COMPLETED" in text, text + out
    assert re.search(r"master 10\.77\.0\.\d+:", out), out
    assert t["mgmt0"] > 40 * MB and t["data0"] < 1 * MB, t


def gate_failure(tmp_path, rig, timeout: float = 240) -> tuple[dict, float, str]:
    """Submit a 2-node job on h0,h1 naming data0 with the preflight gate, wait for its end; returns
    its status JSON, the seconds from submit to the end, and the job's output."""
    import json

    t0 = time.monotonic()
    job_id, env = submit(tmp_path, rig, network={"interface": "data0"}, preflight={"gate": True},
                         slurm={"extra_args": ["--nodelist=h0,h1"]})
    text, _ = wait_end(job_id, tmp_path, env, timeout)
    took = time.monotonic() - t0
    st = json.loads(cli("status", job_id, "--backend", "slurm", "--json", cwd=tmp_path, env=env).stdout)
    out = output(job_id, tmp_path)
    print(text, out, json.dumps(st, indent=1)[:3000], f"{took:.1f} s", sep="\n")
    assert "net-probe rank" not in out, out  # stopped before training
    return st, took, out


def test_the_gate_stops_a_job_whose_interface_one_host_lacks(tmp_path, rig):
    rename = "ip link set {0} down && ip link set {0} name {1} && ip link set {1} up"
    assert rig.exec("h1", "bash", "-c", rename.format("data0", "data1")).returncode == 0
    try:
        st, took, out = gate_failure(tmp_path, rig)
    finally:
        rig.exec("h1", "bash", "-c", rename.format("data1", "data0"))
    fc, first = st["failure_class"], st["failure"]["first"]
    assert fc["class"] == "node" and fc["by"] == "preflight" and fc["host"] == "h1", st
    assert first["node"] == 1 and "no interface data0 on this node (it has" in first["error"], first
    assert took < 120, took


def test_the_gate_stops_a_job_whose_host_has_no_link_on_the_interface(tmp_path, rig):
    """h1's data0 keeps its name, address and routes, but its cable is pulled (cut on data0
    alone): its carrier says so, and the gate fails h1 before torchrun."""
    rig.sh("cut", "h1", "data0")
    st, took, out = gate_failure(tmp_path, rig)
    fc, first = st["failure_class"], st["failure"]["first"]
    assert fc["class"] == "node" and fc["by"] == "preflight" and fc["host"] == "h1", st
    assert first["node"] == 1 and "interface data0: data0 (10.78.0.11) has no link" in first["error"], first
    assert took < 120, took


def test_the_gate_stops_a_job_whose_hosts_cannot_reach_each_other_on_the_interface(tmp_path, rig):
    """h1's data0 is up with a carrier, on another subnet (a VLAN misconfigured): no route to
    rank 0's address on data0. The gate fails h1, naming data0 and rank 0's address."""
    readdress = "ip addr flush dev data0 && ip addr add {0}/24 dev data0"
    assert rig.exec("h1", "bash", "-c", readdress.format("10.78.1.11")).returncode == 0
    try:
        st, took, out = gate_failure(tmp_path, rig)
    finally:
        rig.exec("h1", "bash", "-c", readdress.format("10.78.0.11"))
    fc, first = st["failure_class"], st["failure"]["first"]
    assert fc["class"] == "node" and fc["by"] == "preflight" and fc["host"] == "h1", st
    assert first["node"] == 1 and "reach rank 0 on data0: cannot reach rank 0's address 10.78.0.10:" in first["error"], first
    assert took < 120, took


def _status(job_id, tmp_path, env) -> dict:
    import json

    r = cli("status", job_id, "--backend", "slurm", "--json", cwd=tmp_path, env=env, timeout=60)
    try:
        return json.loads(r.stdout)
    except ValueError:
        return {}


def _job_hosts(job_id, env) -> list[str]:
    import subprocess

    from halo_sched.backends.slurm.down_nodes import expand_hostlist

    q = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%N"], env=env, capture_output=True, text=True, timeout=30)
    return expand_hostlist(q.stdout.strip())


def test_a_host_cut_mid_training_is_named_ledgered_and_the_retry_completes_without_it(tmp_path, rig):
    """`cut h1` mid-training: SLURM takes h1 out of the job (--no-kill, a run with retry:), the first attempt
    ends naming h1 as the host that left the allocation (node 1, its ranks), h1 is ledgered, and the retry
    its batch script submitted completes without it (tests/test_multihost_lost_node.py: the same with no
    client, and the batch host cut). Long: SLURM marks a silent host down only after SlurmdTimeout (20 s
    here), and the retry is a second real torchrun job. It trains 300 steps (60 s): beside the whole
    suite a 98 s start-up once left a 30 s run finished before the test had seen it train."""
    import json
    import subprocess

    env = slurm_env(rig.env)
    shutil.copy(REPO / "tests" / "trainers" / "hang.py", tmp_path / "hang.py")
    job = example_job(tmp_path, 29500, trainer={"script": "hang.py", "args": ["--steps", "300", "--step-time", "0.2"]},
                      rendezvous={"port": 29500, "timeout_s": 60}, hang={"timeout_s": 30},
                      retry={"attempts": 2, "on": ["node", "hang"]})
    submit = subprocess.Popen([*cli_argv(), "submit", str(job), "--backend", "slurm", "--wait", "--quiet",
                               "--timeout", "400"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        job_id, hosts = None, []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (job_id and len(hosts) == 2):
            time.sleep(1)
            q = subprocess.run(["squeue", "-h", "-o", "%i|%Z|%T|%j"], env=env, capture_output=True, text=True, timeout=30)
            # The attempt, not its guardian (halo-guardian-ID: the same directory, pending on it).
            mine = [ln.split("|") for ln in q.stdout.splitlines() if ln.split("|")[1:2] == [str(tmp_path)]
                    and not ln.split("|")[3].startswith("halo-guardian-")]
            if mine and mine[0][2] == "RUNNING":
                job_id = mine[0][0]
                hosts = _job_hosts(job_id, env)
        assert job_id and len(hosts) == 2, (job_id, hosts)
        # Training: both nodes past step 10.
        text = status_once_training(job_id, tmp_path, env, 2, 10, 120)
        assert "RUNNING" in text and len(node_steps(text)) == 2, text
        victim = hosts[1]
        rig.cut(victim)
        cut_at = time.monotonic()
        st = {}
        while time.monotonic() < cut_at + 180:
            st = _status(job_id, tmp_path, env)
            if st.get("status") not in (None, "RUNNING", "PENDING", "COMPLETING"):
                break
            time.sleep(1)
        took = time.monotonic() - cut_at
        print(json.dumps(st, indent=1)[:3000], f"attempt 1 ended {took:.1f} s after the cut", sep="\n")
        # hang.timeout_s + 90 s, or SLURM's own node failure first (80 s seen beside the rest of the
        # suite on 2 cores, 100 s with other test runs beside it too); a job nobody ends waits in its
        # collective for gloo's timeout (30 min).
        assert took <= 30 + 90, took
        # The host is named from SLURM's record of the node (down_nodes.py), which can lag the job's
        # NODE_FAIL on a loaded machine (seen once beside the rest of the suite): status asks again.
        # On a loaded machine status may answer from the record (live: false) until slurmctld answers.
        named_by = time.monotonic() + 60
        while not (st.get("failure_class") or {}).get("host") and time.monotonic() < named_by:
            time.sleep(2)
            st = _status(job_id, tmp_path, env) or st
        fc = st["failure_class"]
        assert fc["class"] == "node" and fc["host"] == victim, st
        first = st["failure"]["first"]
        assert first["node"] == 1 and f"({victim})" in first["error"] and "ranks 2, 3" in first["error"], first
        # Nothing of the job is left on the host that stayed up.
        deadline = time.monotonic() + 20
        while rig.job_pids(hosts[0], "hang.py") and time.monotonic() < deadline:
            time.sleep(0.5)
        assert rig.job_pids(hosts[0], "hang.py") == [], f"left running on {hosts[0]}"
        out, err = submit.communicate(timeout=400)
    finally:
        if submit.poll() is None:
            submit.kill()
            submit.communicate()
    print(out, err[-3000:])
    assert submit.returncode == 0 and "COMPLETED" in out + err, out + err[-3000:]
    ledger = json.loads(cli("nodes", "--json", env=env).stdout)
    assert [e["host"] for e in ledger] == [victim], ledger
    # status answers {} when it could not answer in time (a loaded machine): asked again.
    run = until(lambda: _status(job_id, tmp_path, env).get("run"), 60, step=2)
    assert run, _status(job_id, tmp_path, env)
    second = run["attempts"][1]
    assert second["status"] == "COMPLETED" and victim in second["excluded"], run


def test_a_host_cut_during_rendezvous_is_named_within_the_rendezvous_timeout(tmp_path, rig):
    """Node 1's setup takes 15 s, so node 0's torchrun waits in the rendezvous; h1 is cut then and
    never joins. The job must end within rendezvous.timeout_s + 30 s, naming h1."""
    import subprocess

    env = slurm_env(rig.env)
    shutil.copy(REPO / "tests" / "trainers" / "net_probe.py", tmp_path / "net_probe.py")
    job = example_job(tmp_path, 29500, trainer={"script": "net_probe.py", "args": ["--steps", "5"]},
                      rendezvous={"port": 29500, "timeout_s": 60}, hang={"timeout_s": 30},
                      setup=['if [ "$HALO_NODE_RANK" = 1 ]; then sleep 15; fi'],
                      slurm={"extra_args": ["--nodelist=h0,h1"]})
    r = cli("submit", str(job), "--backend", "slurm", "--quiet", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    job_id = r.stdout.strip().splitlines()[-1]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and "node 0 of 2 on h0" not in output(job_id, tmp_path):
        time.sleep(0.5)
    assert "node 0 of 2 on h0" in output(job_id, tmp_path), output(job_id, tmp_path)
    time.sleep(2)  # node 0's torchrun is in the rendezvous, node 1 still in its setup
    rig.cut("h1")
    cut_at = time.monotonic()
    st = {}
    while time.monotonic() < cut_at + 150:
        st = _status(job_id, tmp_path, env)
        if st.get("status") not in (None, "RUNNING", "PENDING", "COMPLETING"):
            break
        time.sleep(1)
    took = time.monotonic() - cut_at
    out = output(job_id, tmp_path)
    print(out[-3000:], st, f"ended {took:.1f} s after the cut", sep="\n")
    assert took <= 60 + 30, took
    assert "net-probe rank" not in out  # nobody trained
    fc = st["failure_class"]
    assert fc["class"] == "node" and fc["host"] == "h1", st
    assert "(h1)" in st["failure"]["first"]["error"], st
    assert rig.job_pids("h0", "net_probe.py") == [] and rig.job_pids("h0", "torchrun") == []
    subprocess.run(["scancel", job_id], env=env, capture_output=True, timeout=30)


def test_a_slow_link_makes_a_rank_on_that_host_the_straggler(tmp_path, rig):
    """delay h1 50 once the job trains (a link turning slow mid-run, as it does in production): every
    packet h1 sends on data0 is 50 ms late from then on. Three hosts (h0, h1, h2), 2 ranks
    each, reporting after their compute and when they leave the step's all_reduce: `status` names
    h1, the host common to the slow links, and its ranks, as a slow host's network, and names no
    slow rank. Not two hosts: the delay is one-way (h1's sends), and between two hosts nothing
    tells h1's slow sends from h0's slow receives (the round trip is the same from both ends; h0's
    ranks leave each all_reduce 50 ms after h1's, as they would if h0 received slowly). With three,
    h1 is the host common to the two slow pairs while h0-h2 is fast (docs/failures.md, Stragglers).
    Measured before the change: `status` named rank 1 on h0, 0.05 s behind the median rank."""
    env = slurm_env(rig.env)
    shutil.copy(REPO / "tests" / "trainers" / "hang.py", tmp_path / "hang.py")
    job = example_job(tmp_path, 29500, nodes=3, network={"interface": "data0"}, hang={"timeout_s": 60},
                      trainer={"script": "hang.py", "args": ["--steps", "400", "--step-time", "0.1", "--report-before"]},
                      slurm={"extra_args": ["--nodelist=h0,h1,h2"]})
    r = cli("submit", str(job), "--backend", "slurm", "--quiet", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    job_id = r.stdout.strip().splitlines()[-1]
    # The delay comes once every node trains: set while gloo connects the ranks, beside the whole suite it
    # once ended the job there (a peer closed the connection), before any step was timed.
    text = status_once_training(job_id, tmp_path, env, 3, 5, 150)
    steps = node_steps(text)
    assert "RUNNING" in text and len(steps) == 3 and min(steps) >= 5, text
    rig.delay("h1", 50)
    slow_host = re.compile(r"slowest: node (\d) \((h\d); ranks ([\d, ]+)\), a slow host's network: round trip ([0-9.]+) ms "
                           r"to node (\d) \((h\d)\), ([0-9.]+) ms to node (\d) \((h\d)\), ([0-9.]+) ms between the others")
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline:
        text = cli("status", job_id, "--backend", "slurm", cwd=tmp_path, env=env).stdout
        # The kernel's smoothed round trip (tcp_info) moves an eighth of the way to each new sample: named
        # at once, a link of the slow host can still read half its delay (25.7 ms seen beside the suite).
        # Asked again until both of h1's links have reached 40 ms.
        m = slow_host.search(text)
        if m and "every rank waits" in text and float(m[4]) >= 40 and float(m[7]) >= 40:
            break
        m = re.search(r"over the last (\d+) steps", text)
        if m and int(m[1]) >= 20:  # a rank named after 20 steps (as before the rule): no need to wait on
            break
        if "RUNNING" not in text and "PENDING" not in text:
            break
        time.sleep(3)
    print(text)
    cli("cancel", job_id, "--backend", "slurm", cwd=tmp_path, env=env)
    assert "RUNNING" in text, text
    m = slow_host.search(text)
    assert m and m[1] == "1" and m[2] == "h1" and m[3] == "2, 3", text
    assert {m[6], m[9]} == {"h0", "h2"} and float(m[4]) >= 40 and float(m[7]) >= 40 and float(m[10]) < 5, text
    assert "slowest: rank" not in text, text  # h0's ranks, behind the slow link, are not named


def test_preflight_gives_per_link_figures_and_names_the_slow_link(tmp_path, rig):
    """`halo-sched preflight` on three hosts over data0 with `delay h1 50`: a figure per link
    (each node's first rank to rank 0, between the hosts' own data0 interfaces); the slow one,
    h1's, is the slowest pair named with its host, and with --min-mibps the only one below it."""
    env = slurm_env(rig.env)
    job = example_job(tmp_path, 29500, nodes=3, nproc_per_node=1, network={"interface": "data0"},
                      slurm={"extra_args": ["--nodelist=h0,h1,h2"]})
    rig.delay("h1", 50)
    t0 = time.monotonic()
    r = cli("preflight", str(job), "--backend", "slurm", "--size", "4M", "--timeout", "180", "--min-mibps", "100",
            "--quiet", cwd=tmp_path, env=env, timeout=240)
    took = time.monotonic() - t0
    print(r.stdout, r.stderr[-2000:], f"{took:.1f} s", sep="\n")
    assert "check interface" in r.stdout and "FAIL  node" not in r.stdout, r.stdout
    pairs = {int(n): float(v.replace(",", "")) for n, v in
             re.findall(r"^send/recv node (\d) -> node 0\s+([0-9,.]+)", r.stdout, re.M)}
    assert sorted(pairs) == [1, 2], r.stdout
    # The delayed link is many times slower than the undelayed one measured beside it.
    assert pairs[1] * 4 < pairs[2], pairs
    assert re.search(r"^slowest pair: node 1 \(h1\) -> node 0: ", r.stdout, re.M), r.stdout
    assert r.returncode == 1 and "verdict: FAIL" in r.stdout, r.stdout
    assert re.search(r"^  - send/recv node 1 -> node 0: [0-9,.]+ MiB/s is below --min-mibps 100$", r.stdout, re.M), r.stdout
    assert "send/recv node 2 -> node 0: " not in r.stdout.split("verdict:")[1], r.stdout


def test_the_rig_refuses_a_network_this_machine_routes(rig):
    from cluster.multihost_fixtures import run_script

    p = run_script("up", env={**os.environ, "HALO_MULTIHOST_DATA_NET": "127.78.0.0/24"})
    assert p.returncode != 0, p.stdout + p.stderr
    assert "network 127.78.0.0/24 overlaps 127.0.0.0/8, which this machine already routes" in p.stderr, p.stderr
    assert run_script("status").returncode == 0  # the running rig was not touched


def test_down_after_a_crash_leaves_nothing_and_up_rebuilds(rig):
    import signal
    import subprocess

    from cluster.multihost_fixtures import run_script

    state = Path(rig.env["HALO_MULTIHOST_DIR"])
    # A crash: the controller and one host's anchor die, their pid files stay.
    for name in ("slurmctld", "anchor-h3"):
        os.kill(int((state / "run" / f"{name}.pid").read_text()), signal.SIGKILL)
    t0 = time.monotonic()
    p = run_script("down")
    took_down = time.monotonic() - t0
    assert p.returncode == 0, p.stdout + p.stderr
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    assert not re.search(r"^halo-h\d", netns, re.M) and "halo-mgmt" not in links and "hm-h" not in links, netns + links
    left = [d.name for d in Path("/proc").iterdir() if d.name.isdigit() and _mentions(d, str(state))]
    assert left == [], left
    t0 = time.monotonic()
    p = run_script("up", timeout=300)
    print(f"down after a crash {took_down:.1f} s, up {time.monotonic() - t0:.1f} s")
    assert p.returncode == 0 and run_script("status").returncode == 0, p.stdout + p.stderr


def _mentions(d: Path, text: str) -> bool:
    try:
        return text.encode() in (d / "cmdline").read_bytes() or text.encode() in (d / "environ").read_bytes()
    except OSError:
        return False
