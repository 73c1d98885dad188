#!/usr/bin/env bash
# The GPU runs behind the H200 figures (docs/performance.md, docs/verification.md): a 2-node x 1-GPU job on the local backend
# (NCCL), its bare-torchrun anchor, and the preflight bandwidth test with its anchor. Run from
# the repo root on a machine with 2 GPUs whose python3 has CUDA torch; halo-sched runs from the
# source tree (PYTHONPATH), its pure dependencies already importable.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export HALO_SCHED_HOME=${HALO_SCHED_HOME:-/tmp/halo-gpu-home}
PY=${PYTHON:-python3}
STEPS=${STEPS:-50}
nvidia-smi -L
$PY -c 'import torch; print("torch", torch.__version__, "cuda devices", torch.cuda.device_count())'
job=$(mktemp --suffix=.yaml)
cat > "$job" <<YAML
name: gpu-pair
nodes: 2
nproc_per_node: 1
gpus_per_node: 1
trainer:
  script: examples/train_ddp.py
  args: ["--device", "cuda", "--steps", "$STEPS"]
env: {OMP_NUM_THREADS: "4", NCCL_NVLS_ENABLE: "0"}
rendezvous: {port: 29531, timeout_s: 300}
YAML
TIMEFORMAT='elapsed %R s'
secs() { time "$@"; }
for round in 1 2; do
  echo "== round $round: halo-sched submit --wait (local backend, 2 nodes x 1 GPU)"
  secs $PY -m halo_sched.cli submit "$job" --backend local --wait -q 2>&1 | tail -4
  echo "== round $round: bare torchrun --standalone --nproc_per_node=2"
  secs torchrun --standalone --nproc_per_node=2 examples/train_ddp.py --device cuda --steps "$STEPS" 2>&1 | tail -2
done
echo "== preflight, nccl, 1G"
secs $PY -m halo_sched.cli preflight "$job" --backend local --size 1G --iters 5
echo "== preflight --json"
$PY -m halo_sched.cli preflight "$job" --backend local --size 256M --iters 3 --json
echo "== anchor: the bundled test under bare torchrun --standalone"
secs torchrun --standalone --nproc_per_node=2 halo_sched/node/trainers/preflight_bw.py \
  --size 1G --iters 5 --device cuda --gpus-per-node 2 --nproc-per-node 2 --pair-ranks 2>&1 | tail -15
echo "== the local launch overhead on a quiet machine: bench/trivial.yaml vs two bare torchrun (CPU, gloo)"
for round in 1 2 3; do
  secs $PY -m halo_sched.cli submit bench/trivial.yaml --backend local --wait -q > /dev/null
  secs bash -c 'torchrun --nnodes=2 --nproc_per_node=1 --node_rank=0 --master_addr=127.0.0.1 --master_port=29643 bench/trivial.py > /dev/null 2>&1 &
    torchrun --nnodes=2 --nproc_per_node=1 --node_rank=1 --master_addr=127.0.0.1 --master_port=29643 bench/trivial.py > /dev/null 2>&1; wait'
done
