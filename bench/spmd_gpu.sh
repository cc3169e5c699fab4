#!/usr/bin/env bash
# The data-parallel run on one machine with several GPUs, in one go: build
# what it needs, the NCCL equality test, then GPT-2 small's training step at
# 1 GPU and at N GPUs (Crucible's spmd step with inductor, and PyTorch's DDP
# on a replica of the same model), each row's output kept under OUT.
#
#   bench/spmd_gpu.sh OUT [PHASE...]
#
# PHASEs (default all, in this order): build test crucible ddp. The build is
# incremental, so a later call on the same machine can run the rest alone.
#
# Environment: NPROC (default: every GPU), BATCH (per GPU, default 8),
# STEPS (timed steps per row, default 20), BACKEND (default inductor).
# Keeps NVLink multicast off (NCCL_NVLS_ENABLE=0), as machines whose GPUs
# are shared with others require.
set -uo pipefail
cd "$(dirname "$0")/.."
out=$1
shift
phases=" ${*:-build test crucible ddp} "
want() { [[ $phases == *" $1 "* ]]; }
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nproc=${NPROC:-$(nvidia-smi -L | wc -l)}
batch=${BATCH:-8}
steps=${STEPS:-20}
backend=${BACKEND:-inductor}
log() { printf '\n== %s\n' "$*" | tee -a "$out/summary.txt"; }

nvidia-smi topo -m >"$out/topo.txt" 2>&1 || true
if want build; then
  log "build"
  { time ./x build tools/crucible bench/crucible_spmd_bench tests/spmd/test_spmd tests/spmd/spmd_worker; } \
    >"$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
  tail -3 "$out/build.log" | tee -a "$out/summary.txt"
fi

if want test; then
  log "equality over NCCL: test_spmd [cuda]"
  CRUCIBLE_SPMD_WORKER=build/tests/spmd/spmd_worker OMP_NUM_THREADS=1 \
    timeout 300 build/tests/spmd/test_spmd '[cuda]' 2>&1 | tee "$out/test.log" | tail -5 | tee -a "$out/summary.txt"
fi

B=build/bench/crucible_spmd_bench
flags=(--model=gpt --size=full "--batch=$batch" --device=cuda "--backend=$backend" "--steps=$steps"
       --matmul-precision=high --benchmark_counters_tabular=true)
if want crucible; then
  log "Crucible, 1 GPU"
  timeout 300 "$B" "${flags[@]}" --benchmark_out="$out/crucible_1gpu.json" 2>&1 | tee "$out/crucible_1gpu.txt" |
    grep -E '^BM_' | tee -a "$out/summary.txt"
  log "Crucible, $nproc GPUs"
  timeout 420 build/tools/crucible launch --nproc "$nproc" -- "$B" "${flags[@]}" \
    --benchmark_out="$out/crucible_${nproc}gpu.json" 2>&1 | tee "$out/crucible_${nproc}gpu.txt" |
    grep -E '^BM_' | tee -a "$out/summary.txt"
fi
want ddp || exit 0
log "PyTorch, 1 GPU and DDP on $nproc GPUs"
timeout 90 python3 bench/ddp_gpt.py --size full --batch "$batch" --steps "$steps" --matmul-precision high 2>&1 |
  tee "$out/ddp_1gpu.txt" | tail -2 | tee -a "$out/summary.txt"
timeout 150 torchrun --nproc-per-node "$nproc" bench/ddp_gpt.py --size full --batch "$batch" --steps "$steps" \
  --matmul-precision high 2>&1 | tee "$out/ddp_${nproc}gpu.txt" | grep -E 'ddp/|torch ' | tee -a "$out/summary.txt"
