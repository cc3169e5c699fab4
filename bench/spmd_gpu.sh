#!/usr/bin/env bash
# The data-parallel run on one machine with several GPUs, in one go: build
# what it needs, the NCCL equality test, then a zoo model's training step
# (GPT-2 small by default) at 1 GPU and at each N of NPROC GPUs (Crucible's
# spmd step with inductor, and PyTorch's DDP on a replica of the same model),
# each row's output kept under OUT.
#
#   bench/spmd_gpu.sh OUT [PHASE...]
#
# PHASEs (default all, in this order): build test crucible ddp. The build is
# incremental, so a later call on the same machine can run the rest alone.
#
# Environment: NPROC (world sizes, one or several: "2 4"; default every GPU;
# the equality test always uses every GPU), MODEL (gpt or resnet18, full
# size), BATCH (per GPU, default 8 for gpt, 64 for resnet18), STEPS (timed
# steps per row, default 20), BACKEND (default inductor), FILTER (the N-GPU
# call's --benchmark_filter: default every row), TRACE=1 (the step rows also
# write one-step profiler traces under OUT/trace/<N>gpu, summarized by
# bench/trace_overlap.py into OUT/overlap.txt).
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
read -ra nprocs <<<"${NPROC:-$(nvidia-smi -L | wc -l)}"
model=${MODEL:-gpt}
batch=${BATCH:-$([[ $model == gpt ]] && echo 8 || echo 64)}
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
flags=(--model="$model" --size=full "--batch=$batch" --device=cuda "--backend=$backend" "--steps=$steps"
       --matmul-precision=high --benchmark_counters_tabular=true)
trace() { [[ ${TRACE:-0} == 1 ]] && echo "--trace=$out/trace/$1" || echo --trace=; }
if want crucible; then
  log "Crucible, 1 GPU"
  timeout 300 "$B" "${flags[@]}" "$(trace 1gpu)" --benchmark_out="$out/crucible_1gpu.json" 2>&1 | tee "$out/crucible_1gpu.txt" |
    grep -E '^BM_' | tee -a "$out/summary.txt"
  for nproc in "${nprocs[@]}"; do
    log "Crucible, $nproc GPUs"
    timeout 420 build/tools/crucible launch --nproc "$nproc" -- "$B" "${flags[@]}" "$(trace "${nproc}gpu")" \
      "--benchmark_filter=${FILTER:-.}" --benchmark_out="$out/crucible_${nproc}gpu.json" 2>&1 |
      tee "$out/crucible_${nproc}gpu.txt" | grep -E '^BM_' | tee -a "$out/summary.txt"
  done
  if [[ ${TRACE:-0} == 1 ]]; then
    log "traces: bench/trace_overlap.py"
    python3 bench/trace_overlap.py --kernels "$out"/trace/*/*.json >"$out/overlap.txt" 2>&1
    grep -v '^  ' "$out/overlap.txt" | tee -a "$out/summary.txt"
  fi
fi
want ddp || exit 0
log "PyTorch, 1 GPU"
timeout 90 python3 bench/ddp_zoo.py --model "$model" --size full --batch "$batch" --steps "$steps" --matmul-precision high 2>&1 |
  tee "$out/ddp_1gpu.txt" | tail -2 | tee -a "$out/summary.txt"
for nproc in "${nprocs[@]}"; do
  log "PyTorch DDP, $nproc GPUs"
  timeout 150 torchrun --nproc-per-node "$nproc" bench/ddp_zoo.py --model "$model" --size full --batch "$batch" \
    --steps "$steps" --matmul-precision high 2>&1 | tee "$out/ddp_${nproc}gpu.txt" | grep -E 'ddp/|torch ' |
    tee -a "$out/summary.txt"
done
