#!/usr/bin/env python3
"""PyTorch's own data parallelism (DistributedDataParallel) on a replica of
a zoo model (models/src/zoo.cpp), to set beside crucible_spmd_bench in one
run on the same machine:

  python3 bench/ddp_zoo.py --size full                         # one GPU, no DDP
  torchrun --nproc-per-node 2 bench/ddp_zoo.py --size full     # DDP, buckets of 1, 4, 25, 100 MiB
  torchrun --nproc-per-node 4 bench/ddp_zoo.py --model resnet18 --size full --batch 64
  torchrun --nproc-per-node 2 bench/ddp_zoo.py --size full --buckets 25 --fsdp --compile   # and FSDP2

The replicas are torch_zoo.py's (the zoo's layout, sizes and
initialization; GPT is nanoGPT's GPT-2 with its head tied to the token
embedding, ResNet-18 torchvision's at 224^2 with 1000 classes), and so is
each rank's batch (the zoo's example batch, seeded by rank). The step is
the zoo's too: mean cross-entropy, backward, AdamW(3e-4) (torch's default,
the foreach implementation on CUDA). DDP keeps its defaults (BatchNorm's
running statistics broadcast from rank 0 at every forward). Each timed
step ends by reading the loss, which waits for the step's kernels, as the
C++ rows do. --fused: AdamW(fused=True) instead, in every row. --fsdp adds
FSDP2 (torch.distributed.fsdp.fully_shard on each transformer block or
residual block, then the model; its defaults: fp32, reshard after forward;
--fsdp-param-dtype bfloat16: MixedPrecisionPolicy(param_dtype=bf16,
reduce_dtype=float32)), with --compile also compiled. Rows are printed as `name ms/step samples/s
peak MiB` (samples of the global batch; the peak is
torch.cuda.max_memory_allocated over the timed steps, the parameters,
gradients and optimizer state included).
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
from torch_zoo import MODEL_NAMES, WithLoss, make_model


def time_steps(name, model, batch, steps, global_batch, rank, fused=False):
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=fused or None)
    inputs, targets = batch

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss = model(inputs, targets)
        loss.backward()
        optimizer.step()
        return loss.item()

    for _ in range(3):  # warm-up: the caching allocator, cuBLAS, DDP's first-iteration bucket rebuild
        step()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    ms = (time.perf_counter() - start) / steps * 1e3
    peak = torch.cuda.max_memory_allocated() / 2**20
    if rank == 0:
        print(f"{name:40s} {ms:9.2f} ms/step {global_batch / ms * 1e3:10.1f} samples/s {peak:9.0f} MiB", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=MODEL_NAMES, default="gpt")
    ap.add_argument("--size", choices=("small", "full"), default="small")
    ap.add_argument("--batch", type=int, default=8, help="per GPU")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--buckets", default="1,4,25,100", help="DDP bucket_cap_mb values, comma-separated (empty: no DDP row)")
    ap.add_argument("--matmul-precision", default="highest", choices=["highest", "high"])
    ap.add_argument("--compile", action="store_true", help="also time torch.compile(model) (default mode)")
    ap.add_argument("--fsdp", action="store_true", help="also time FSDP2's fully_shard (with --compile, compiled too)")
    ap.add_argument("--fsdp-param-dtype", choices=["float32", "bfloat16"], default="float32",
                    help="FSDP2's MixedPrecisionPolicy(param_dtype, reduce_dtype=float32)")
    ap.add_argument("--fused", action="store_true",
                    help="AdamW's fused (single-kernel) implementation in every row, as a PyTorch user chasing speed would pick")
    ap.add_argument("--dist-backend", default="nccl", choices=["nccl", "gloo"],
                    help="gloo lets ranks share GPUs (local rank modulo the count): to compare memory on one GPU")
    args = ap.parse_args()
    torch.set_float32_matmul_precision(args.matmul_precision)

    distributed = "WORLD_SIZE" in os.environ
    if distributed:
        dist.init_process_group(args.dist_backend)
        local = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local % torch.cuda.device_count())
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    device = torch.device("cuda", torch.cuda.current_device())
    inputs, targets = make_model(args.model, args.size)[1](args.batch, 1 + rank)  # each rank a batch of its own
    batch = (inputs.to(device), targets.to(device))

    def fresh():
        torch.manual_seed(0)
        return WithLoss(make_model(args.model, args.size)[0]).to(device).train()

    if rank == 0:
        print(f"torch {torch.__version__}, {torch.cuda.get_device_name(device)}, {world} rank(s), "
              f"{args.model} {args.size}, batch {args.batch} per GPU, matmul precision {args.matmul_precision}", flush=True)
    global_batch = args.batch * world
    name = f"{args.model}-{args.size}"
    if not distributed:
        time_steps(f"eager/{name}", fresh(), batch, args.steps, global_batch, rank, args.fused)
        if args.compile:
            time_steps(f"compile/{name}", torch.compile(fresh()), batch, args.steps, global_batch, rank, args.fused)
        return
    from torch.nn.parallel import DistributedDataParallel as DDP

    for mb in (float(b) for b in args.buckets.split(",") if b):
        model = DDP(fresh(), device_ids=[device.index], bucket_cap_mb=mb)
        time_steps(f"ddp/{name}/{mb:g}", model, batch, args.steps, global_batch, rank, args.fused)
        if args.compile:
            model = torch.compile(DDP(fresh(), device_ids=[device.index], bucket_cap_mb=mb))
            time_steps(f"ddp-compile/{name}/{mb:g}", model, batch, args.steps, global_batch, rank, args.fused)
    if args.fsdp:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        bf16 = args.fsdp_param_dtype == "bfloat16"
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else \
            MixedPrecisionPolicy()

        def sharded():
            model = fresh()
            for m in model.modules():
                if type(m).__name__ in ("Block", "BasicBlock"):
                    fully_shard(m, mp_policy=policy)
            return fully_shard(model, mp_policy=policy)

        model = None  # the last DDP row's, if any
        torch.cuda.empty_cache()
        tag = "-bf16" if bf16 else ""
        time_steps(f"fsdp2{tag}/{name}", sharded(), batch, args.steps, global_batch, rank, args.fused)
        if args.compile:
            torch.cuda.empty_cache()
            time_steps(f"fsdp2{tag}-compile/{name}", torch.compile(sharded()), batch, args.steps, global_batch, rank, args.fused)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
