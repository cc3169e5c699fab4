#!/usr/bin/env bash
# The zoo's training steps on one GPU, Crucible beside PyTorch, in one go
# on the same machine: build what it needs, then for each model Crucible's
# LibTorch eager step and its compiled step through each backend
# (crucible_spmd_bench's BM_StepEager and BM_Step), then PyTorch's eager
# and torch.compile modes on replicas of the same models
# (bench/torch_zoo.py). Every row's output is kept under OUT, the BM_ and
# per-mode lines also in OUT/summary.txt.
#
#   bench/zoo_gpu.sh OUT [PHASE...]
#
# PHASEs (default all, in this order): build crucible torch. The build is
# incremental, so a later call on the same machine can run the rest alone.
#
# Environment: MODELS (default "mlp convnet resnet18 gpt"), BACKENDS
# (default "inductor inductor-cudagraphs"), MODES (torch.compile modes,
# default "eager,default,reduce-overhead,max-autotune-no-cudagraphs"),
# AUTOCAST (off, bf16 or f16; default off), MEMORY_FORMAT (contiguous or
# channels-last; default contiguous), STEPS (timed steps a row, default 20),
# DEVICE (default cuda; cpu for a smoke run of the script).
# Batches are the zoo's defaults on both sides: MLP 256, ConvNet 64,
# ResNet-18 64, GPT 8. The largest batch each side trains: bench/max_batch.py.
set -uo pipefail
cd "$(dirname "$0")/.."
out=$1
shift
phases=" ${*:-build crucible torch} "
want() { [[ $phases == *" $1 "* ]]; }
mkdir -p "$out"
models=${MODELS:-mlp convnet resnet18 gpt}
backends=${BACKENDS:-inductor inductor-cudagraphs}
modes=${MODES:-eager,default,reduce-overhead,max-autotune-no-cudagraphs}
autocast=${AUTOCAST:-off}
memory_format=${MEMORY_FORMAT:-contiguous}
steps=${STEPS:-20}
device=${DEVICE:-cuda}
log() { printf '\n== %s\n' "$*" | tee -a "$out/summary.txt"; }
declare -A batch=([mlp]=256 [convnet]=64 [resnet18]=64 [gpt]=8)

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >"$out/gpu.txt" 2>&1 || true
if want build; then
  log "build"
  { time ./x build bench/crucible_spmd_bench; } >"$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
  tail -3 "$out/build.log" | tee -a "$out/summary.txt"
fi

if want crucible; then
  for m in $models; do
    for be in $backends; do
      log "Crucible $m (${batch[$m]}), $be, autocast $autocast, $memory_format"
      # One row per process, so that its memory peaks are its own; BM_StepEager
      # with the first backend only: it does not depend on it.
      rows=BM_Step/
      [[ $be == "${backends%% *}" ]] && rows="BM_Step/ BM_StepEager/"
      for row in $rows; do
        timeout 420 build/bench/crucible_spmd_bench "--model=$m" --size=full "--batch=${batch[$m]}" "--device=$device" \
          "--backend=$be" "--steps=$steps" --matmul-precision=high "--autocast=$autocast" \
          "--memory-format=$memory_format" "--benchmark_filter=$row" \
          --benchmark_out="$out/crucible_${m}_${be}_${row%/}.json" 2>&1 | tee "$out/crucible_${m}_${be}_${row%/}.txt" |
          grep -E '^BM_' | tee -a "$out/summary.txt"
      done
    done
  done
fi

want torch || exit 0
log "PyTorch $modes, autocast $autocast, $memory_format"
timeout 1800 python3 bench/torch_zoo.py --models "${models// /,}" --modes "$modes" --steps "$steps" \
  --autocast "$autocast" --memory-format "$memory_format" --device "$device" 2>&1 | tee "$out/torch.txt" |
  tee -a "$out/summary.txt"
