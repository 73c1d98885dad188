"""``scontrol show job`` read whole (halo_sched/node/spares.py ``show_job_records``, which the
batch script's spares and successor steps and the submitter's transport share; issue 43 item 10):
a submit directory with spaces, quotes or ``=`` in it was cut at its first space when the
one-line layout was split on whitespace, and the failure lines in the output file were never
read. SLURM's own layout prints WorkDir, Comment and the Std* paths alone on their lines: read
from there, they come back exactly. The texts below were printed by the test cluster's
Slurm 22.05.8."""
from __future__ import annotations

from halo_sched.backends.slurm import status as st
from halo_sched.node.spares import show_job_records
from helpers import scontrol_show_job

DIR = "/tmp/se dir/it's \"q\" A=b x"
OUT = f"{DIR}/halo-my job X=1-4.out"
#: `scontrol show job 4` of a job submitted from DIR with -J "my job X=1" --comment "hi There=x".
MULTI = f"""JobId=4 JobName=my job X=1
   UserId=root(0) GroupId=root(0) MCS_label=N/A
   Priority=4294901756 Nice=0 Account=(null) QOS=(null)
   JobState=RUNNING Reason=None Dependency=(null)
   Requeue=0 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0
   RunTime=00:00:02 TimeLimit=UNLIMITED TimeMin=N/A
   SubmitTime=2026-12-06T07:48:00 EligibleTime=2026-12-06T07:48:00
   AccrueTime=2026-12-06T07:48:00
   StartTime=2026-12-06T07:48:00 EndTime=Unknown Deadline=N/A
   SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-12-06T07:48:00 Scheduler=Main
   Partition=debug AllocNode:Sid=localhost:25525
   ReqNodeList=(null) ExcNodeList=(null)
   NodeList=node1
   BatchHost=node1
   NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:*
   TRES=cpu=1,node=1,billing=1
   Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=*
   MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0
   Features=(null) DelayBoot=00:00:00
   OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null)
   Command=(null)
   WorkDir={DIR}
   Comment=hi There=x 
   StdErr={OUT}
   StdIn=/dev/null
   StdOut={OUT}
   Power=
   

"""


def test_slurm_s_own_layout_gives_paths_with_spaces_quotes_and_equals_whole():
    (job,) = show_job_records(MULTI)
    assert job["StdOut"] == job["StdErr"] == OUT and job["WorkDir"] == DIR
    assert job["JobName"] == "my job X=1" and job["Comment"] == "hi There=x "
    assert (job["JobId"], job["NodeList"], job["JobState"], job["TRES"]) == ("4", "node1", "RUNNING",
                                                                             "cpu=1,node=1,billing=1")
    assert job["AllocNode:Sid"] == "localhost:25525" and job["CPUs/Task"] == "1" and job["Power"] == ""
    # The submitter's transport reads it the same way.
    assert st.parse_scontrol_jobs(MULTI) == [job]


def test_the_one_line_layout_cuts_only_at_a_camelcase_key():
    """--oneliner puts every field on one line: a value runs up to the next CamelCase ``Key=``,
    so spaces, quotes and a lower-case ``a=b`` stay in it (the old whitespace split lost all after
    the first space); a CamelCase ``A=b`` inside a path cannot be told from a key there, which is
    why the batch script asks for SLURM's own layout."""
    one = MULTI.replace("\n   ", " ").split("\n")[0] + "\n"
    (job,) = show_job_records(one)
    assert job["NodeList"] == "node1" and job["StdIn"] == "/dev/null" and job["StdOut"] != OUT
    plain = show_job_records(one.replace("A=b", "a=b").replace("X=1", "x=1"))[0]
    assert plain["StdOut"] == OUT.replace("A=b", "a=b").replace("X=1", "x=1") and plain["JobName"] == "my job x=1"


def test_a_path_with_a_new_line_in_it_and_records_of_several_jobs():
    odd = "/data/two\nlines/halo-7.out"
    text = scontrol_show_job("7", odd, workdir="/data/two\nlines") + scontrol_show_job("8", "/data/x/halo-8.out")
    seven, eight = show_job_records(text)
    assert (seven["JobId"], seven["StdOut"], seven["WorkDir"]) == ("7", odd, "/data/two\nlines")
    assert (eight["JobId"], eight["StdOut"], eight["NodeList"]) == ("8", "/data/x/halo-8.out", "node[1-2]")
    assert show_job_records("") == [] and show_job_records("slurm_load_jobs error: Invalid job id\n") == []


def test_newer_releases_fields_on_lines_of_their_own():
    """24.11 and later (info_job.c): SubmitLine and Extra alone on their lines, NodeList with
    SchedNodeList on one."""
    text = ("JobId=9 ArrayJobId=9 ArrayTaskId=1 JobName=a b\n   NodeList=g[1-2] SchedNodeList=g[1-2]\n"
            "   SubmitLine=sbatch --comment x=1 job.sh\n   Extra=k=v w\n   WorkDir=/w d\n   StdOut=/w d/o 9.out\n")
    (job,) = show_job_records(text)
    assert (job["ArrayJobId"], job["JobName"], job["NodeList"], job["SchedNodeList"]) == ("9", "a b", "g[1-2]", "g[1-2]")
    assert (job["SubmitLine"], job["Extra"], job["StdOut"]) == ("sbatch --comment x=1 job.sh", "k=v w", "/w d/o 9.out")
