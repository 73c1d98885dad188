"""Does the cluster send slurm.signal's warning when it preempts? `plan --backend slurm` and
`submit` read `scontrol show config` through the transport and say so. Fixtures: the test
cluster's own output (Slurm 22.05, recorded) and hand-written 23.11 ones
(tests/fixtures/slurm/README.md). The real cluster's turn is in tests/test_slurm_ports.py."""
from __future__ import annotations

import re
import subprocess

import pytest

import halo_sched
from halo_sched.backends.slurm import SlurmScheduler
from halo_sched.backends.slurm.preemption import parse_config, preemption_notes, sends_warning_on_preemption
from halo_sched.backends.slurm.transport import CliTransport
from helpers import REPO

FIXTURES = REPO / "tests" / "fixtures" / "slurm"
REAL_2205 = (FIXTURES / "22.05" / "scontrol_config.out").read_text()
SENDS_2311 = (FIXTURES / "23.11" / "scontrol_config_send_user_signal.out").read_text()
SILENT_2311 = (FIXTURES / "23.11" / "scontrol_config_no_signal.out").read_text()
# The test cluster built from Debian's slurm-wlm 24.11.5 (tests/cluster, HALO_SLURM_VERSION=24.11).
REAL_2411 = (FIXTURES / "24.11" / "scontrol_config.out").read_text()

MIN = "name: t\nnodes: 2\nnproc_per_node: 2\ntrainer: {script: train.py}\n"
SIGNAL = MIN + "slurm: {signal: 'USR2@120'}\n"


def _preempting_2205(ctld: str) -> str:
    """The recorded 22.05 configuration, preempting (REQUEUE), with SlurmctldParameters=ctld."""
    text = re.sub(r"^PreemptMode +=.*$", "PreemptMode             = REQUEUE", REAL_2205, flags=re.M)
    text = re.sub(r"^PreemptType +=.*$", "PreemptType             = preempt/partition_prio", text, flags=re.M)
    return re.sub(r"^SlurmctldParameters +=.*$", f"SlurmctldParameters     = {ctld}", text, flags=re.M)


def test_parse_reads_key_value_lines():
    config = parse_config(REAL_2205)
    assert config["PreemptMode"] == "OFF" and config["PreemptType"] == "preempt/none"
    assert config["SLURM_VERSION"] == "22.05.8" and config["ClusterName"] == "halo"
    assert config["SlurmctldParameters"] == "" and "PreemptParameters" not in config  # 22.05 prints none
    assert parse_config(SENDS_2311)["PreemptParameters"] == "send_user_signal,reclaim_licenses"


@pytest.mark.parametrize("text, sends", [
    (SENDS_2311, True),                                      # PreemptParameters=send_user_signal (23.02+)
    (SILENT_2311, False),
    (_preempting_2205("preempt_send_user_signal"), True),    # the legacy spelling, any release
    (_preempting_2205("enable_configless,Preempt_Send_User_Signal"), True),
    (_preempting_2205("(null)"), False),
    # 22.05 reads PreemptParameters not at all (node_scheduler.c): the key there does nothing.
    (_preempting_2205("(null)").replace("PreemptMode             = REQUEUE",
                                        "PreemptMode             = REQUEUE\nPreemptParameters = send_user_signal"), False),
])
def test_which_configurations_send_the_warning_on_preemption(text, sends):
    assert sends_warning_on_preemption(parse_config(text)) is sends


def test_notes_name_what_is_missing_for_the_release():
    spec = halo_sched.loads(SIGNAL)
    (line,) = preemption_notes(spec, parse_config(SILENT_2311))
    assert "PreemptMode=CANCEL" in line and "lacks PreemptParameters=send_user_signal" in line and "SIGTERM" in line
    (line,) = preemption_notes(spec, parse_config(_preempting_2205("(null)")))
    assert "SlurmctldParameters=preempt_send_user_signal" in line and "23.02" in line
    assert preemption_notes(spec, parse_config(SENDS_2311)) == []
    # A cluster that never preempts: the warning comes before the time limit only.
    lines = preemption_notes(spec, parse_config(REAL_2205))
    assert "does not preempt jobs" in lines[0] and "PreemptMode=OFF" in lines[0]
    assert "SlurmctldParameters=preempt_send_user_signal" in lines[1]
    # 24.11 and 26.05 print (null) for an unset PreemptType (22.05 printed preempt/none): said as
    # printed, not as "?".
    for real in (REAL_2411, (FIXTURES / "26.05" / "scontrol_config.out").read_text()):
        lines = preemption_notes(spec, parse_config(real))
        assert "(PreemptType=(null), PreemptMode=OFF)" in lines[0] and "PreemptParameters=send_user_signal" in lines[1]
    # Nothing to say about a job that asks for no warning.
    assert preemption_notes(halo_sched.loads(MIN), parse_config(SILENT_2311)) == []


def _runner(config: str, test_only=(0, "sbatch: Job 9 to start at 2026-12-01T10:00:00 using 4 processors on nodes "
                                       "n[1-2] in partition debug")):
    calls = []

    def run(argv, input=None):
        calls.append(list(argv))
        if argv[:3] == ["scontrol", "show", "config"] or argv[-2:] == ["show", "config"]:
            return subprocess.CompletedProcess(argv, 0, config, "")
        if argv[:2] == ["sbatch", "--test-only"]:
            return subprocess.CompletedProcess(argv, test_only[0], "", test_only[1])
        if argv[:2] == ["sbatch", "--parsable"]:
            return subprocess.CompletedProcess(argv, 0, "77\n", "")
        return subprocess.CompletedProcess(argv, 0, "", "")
    return run, calls


def test_plan_says_where_the_job_would_start_and_what_preemption_sends():
    run, calls = _runner(SILENT_2311)
    ok, text = SlurmScheduler(transport=CliTransport(runner=run)).plan(halo_sched.loads(SIGNAL))
    assert ok, text
    assert "placement: ok: sbatch: Job 9 to start" in text
    assert "PreemptMode=CANCEL" in text and "warning: slurm.signal USR2@120" in text
    assert ["scontrol", "show", "config"] in calls
    # Nothing was submitted: the script went to sbatch --test-only only.
    assert [c[:2] for c in calls if c[0] == "sbatch"] == [["sbatch", "--test-only"]]

    run, _ = _runner(SENDS_2311, test_only=(1, "allocation failure: Requested node configuration is not available"))
    ok, text = SlurmScheduler(transport=CliTransport(runner=run)).plan(halo_sched.loads(SIGNAL))
    assert not ok and "placement: REFUSED: allocation failure" in text
    assert "sent before the time limit and when preempted" in text and "warning" not in text


def test_plan_asks_the_cluster_the_job_names():
    run, calls = _runner(SENDS_2311)
    SlurmScheduler(transport=CliTransport(runner=run)).plan(
        halo_sched.loads(MIN + "slurm: {signal: 'USR2@120', extra_args: ['--clusters=gpu2']}\n"))
    assert ["scontrol", "--clusters=gpu2", "show", "config"] in calls


def test_submit_warns_once_and_still_submits(capsys):
    run, calls = _runner(SILENT_2311)
    sched = SlurmScheduler(transport=CliTransport(runner=run))
    job = sched.submit(halo_sched.loads(SIGNAL))
    assert job.id == "77"
    err = capsys.readouterr().err
    assert err.count("halo-sched: warning: slurm.signal USR2@120") == 1 and "send_user_signal" in err
    # Without slurm.signal nothing is asked.
    run, calls = _runner(SILENT_2311)
    SlurmScheduler(transport=CliTransport(runner=run)).submit(halo_sched.loads(MIN))
    assert not any("config" in c for c in calls) and capsys.readouterr().err == ""


def test_a_transport_without_the_configuration_says_it_is_unchecked(capsys):
    class NoConfig(CliTransport):
        name = "rest"

        def show_config(self, cluster=None):
            return None

    run, _ = _runner(SILENT_2311)
    SlurmScheduler(transport=NoConfig(runner=run)).submit(halo_sched.loads(SIGNAL))
    assert "the rest transport cannot read the cluster's configuration" in capsys.readouterr().err


def test_an_unreadable_configuration_does_not_stop_the_submit(capsys):
    def run(argv, input=None):
        if "config" in argv:
            return subprocess.CompletedProcess(argv, 1, "", "scontrol: error: Access denied")
        return subprocess.CompletedProcess(argv, 0, "78\n", "")

    job = SlurmScheduler(transport=CliTransport(runner=run)).submit(halo_sched.loads(SIGNAL))
    assert job.id == "78" and "could not read the cluster's configuration" in capsys.readouterr().err
