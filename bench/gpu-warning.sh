#!/usr/bin/env bash
# The held preemption warning with NCCL ranks on GPUs: a 2-node x 1-GPU job on the local backend
# whose trainer installs its warning handler 8 s late. The warning is sent as SLURM's batch
# script sends it (halo_sched/templates/slurm/sbatch.sh.j2): SIGURG to every process of the job, WARN_AFTER
# seconds after submit (default 2: while the ranks still start; 40: while they train). Each node's
# entry must hand SIGUSR2 to its rank once the rank handles it; the ranks stop together at one
# step, save one checkpoint (when a step ran) and the job ends COMPLETED.
# Run from the repo root on a machine with 2 GPUs whose python3 has CUDA torch (as bench/gpu.sh).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export HALO_SCHED_HOME=${HALO_SCHED_HOME:-/tmp/halo-gpu-home}
PY=${PYTHON:-python3}
out=$(mktemp -d)
job=$out/job.yaml
cat > "$job" <<YAML
name: gpu-warning
nodes: 2
nproc_per_node: 1
gpus_per_node: 1
trainer:
  script: examples/train_ddp.py
  args: ["--device", "cuda", "--steps", "100000", "--step-time", "0.05", "--handler-after", "8",
         "--checkpoint-dir", "$out/ckpt", "--report-dir", "$out/reports"]
env: {OMP_NUM_THREADS: "4", NCCL_NVLS_ENABLE: "0"}
rendezvous: {port: 29533, timeout_s: 300}
YAML
id=$($PY -m halo_sched.cli submit "$job" --backend local -q | tail -n 1)
echo "job $id"
sleep "${WARN_AFTER:-2}"
sent=$(date +%s.%N)
# Every process of the job, as `scancel --signal=URG` reaches every process of a step.
for p in $(grep -lzx "HALO_LOCAL_JOB=.*" /proc/[0-9]*/environ 2> /dev/null | cut -d/ -f3); do
  kill -URG "$p" 2> /dev/null
done
echo "URG sent at $sent"
$PY -m halo_sched.cli watch "$id" --backend local
echo "watch exit $?"
$PY -m halo_sched.cli logs "$id" --backend local | grep -E "warning at|SIGUSR2|checkpoint|world:"
$PY - "$out/reports" "$sent" <<'PY'
import json, pathlib, sys
sent = float(sys.argv[2])
for p in sorted(pathlib.Path(sys.argv[1]).glob("rank*.json")):
    r = json.loads(p.read_text())
    got = f"{r['warned_at'] - sent:.2f} s after the send" if r["warned_at"] else "none (stopped with the others)"
    print(f"rank {r['rank']}: signals {r['warnings']}, its signal {got}, stopped {r['stopped']}, "
          f"saved step {r['saved_step']}, world ok {r['ok']}")
PY
