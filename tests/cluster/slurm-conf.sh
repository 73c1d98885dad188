# Sourced by slurm-cluster.sh and multihost.sh: the slurm.conf settings both clusters share, the
# ones where a test cluster must behave as production sites run theirs (CPU binding, requeue only
# when asked, ...). Each script writes its own names, addresses, ports, job-id band and timeouts
# around them. Uses STATE (the state dir), MUNGE_SOCKET and SLURM_VERSION.
common_slurm_conf() {
    cat <<EOF
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# Our own munged socket, so a system munged (other key) cannot interfere. cred_expire: a
# requeued job may start again cred_expire+1 s after the requeue (slurmctld's
# batch_requeue_fini); the default 120 would make every requeue test wait two minutes.
AuthInfo=socket=$MUNGE_SOCKET,cred_expire=10
StateSaveLocation=$STATE/spool/ctld
SlurmdSpoolDir=$STATE/spool/%n
SlurmctldPidFile=$STATE/run/slurmctld.pid
SlurmdPidFile=$STATE/run/slurmd-%n.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
# CPU binding as on production clusters: each task is bound to the CPUs srun gives it, so a
# missing srun --cpus-per-task shows up here as a rank squeezed onto one CPU.
TaskPlugin=task/affinity
# Batch jobs requeue only when they ask (sbatch --requeue): proves halo-sched asks itself.
JobRequeue=0
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
$([[ $SLURM_VERSION == 22.05 ]] && echo SwitchType=switch/none || echo "# no SwitchType: the switch/none plugin is gone after 22.05 (none is the default)")
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
# Finished jobs must stay visible to squeue/scontrol for a while (there is no sacct here).
MinJobAge=300
# Time limits are enforced to the minute, and killed jobs go quickly. KillWait (30 s by default)
# is also how long a node's tasks outlive another's failure under --kill-on-bad-exit: 2 s is
# harsher than most sites, on purpose (a hung job's monitors must finish within it).
OverTimeLimit=0
KillWait=2
InactiveLimit=0
Waittime=0
SlurmctldTimeout=60
EOF
}
