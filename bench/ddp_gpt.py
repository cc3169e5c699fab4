#!/usr/bin/env python3
"""PyTorch's own data parallelism (DistributedDataParallel) on a replica of
the zoo's GPT (models/src/zoo.cpp), to set beside crucible_spmd_bench in one
run on the same machine:

  python3 bench/ddp_gpt.py --size full                         # one GPU, no DDP
  torchrun --nproc-per-node 2 bench/ddp_gpt.py --size full     # DDP, buckets of 1, 4, 25, 100 MiB

The replica has the zoo's layout, sizes and initialization: nanoGPT's GPT-2
(pre-LayerNorm blocks, attention written out as QK^T/sqrt(d), causal mask,
softmax, @V; a 4x GELU MLP; the head tied to the token embedding). The step
is the zoo's too: mean cross-entropy over every token, backward, AdamW(3e-4)
(torch's default, the foreach implementation on CUDA). Each timed step ends by
reading the loss, which waits for the step's kernels, as the C++ rows do. Rows
are printed as `name  ms/step  samples/s` (samples of the global batch).
"""
import argparse
import math
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

SIZES = {  # the zoo's GptConfig for model_sizes()
    "small": dict(vocab_size=64, block_size=32, n_layer=2, n_head=2, n_embd=64),
    "full": dict(vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768),
}


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.n_head = c["n_head"]
        self.c_attn = nn.Linear(c["n_embd"], 3 * c["n_embd"])
        self.c_proj = nn.Linear(c["n_embd"], c["n_embd"])
        t = c["block_size"]
        self.register_buffer("bias", torch.ones(t, t).tril().view(1, 1, t, t))

    def forward(self, x):
        b, t, c = x.shape
        hs = c // self.n_head
        q, k, v = (y.view(b, t, self.n_head, hs).transpose(1, 2) for y in self.c_attn(x).split(c, 2))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf")).softmax(-1)
        return self.c_proj((att @ v).transpose(1, 2).contiguous().view(b, t, c))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln_1, self.attn, self.ln_2 = nn.LayerNorm(c["n_embd"]), Attention(c), nn.LayerNorm(c["n_embd"])
        self.c_fc, self.c_proj = nn.Linear(c["n_embd"], 4 * c["n_embd"]), nn.Linear(4 * c["n_embd"], c["n_embd"])

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(c["vocab_size"], c["n_embd"]), nn.Embedding(c["block_size"], c["n_embd"])
        self.h = nn.ModuleList(Block(c) for _ in range(c["n_layer"]))
        self.ln_f = nn.LayerNorm(c["n_embd"])
        with torch.no_grad():  # nanoGPT's init, as the zoo's
            for name, p in self.named_parameters():
                if name.endswith("c_proj.weight"):
                    p.normal_(0.0, 0.02 / math.sqrt(2 * c["n_layer"]))
                elif name.endswith("bias"):
                    p.zero_()
                elif "ln_" not in name:
                    p.normal_(0.0, 0.02)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1), device=idx.device))
        for block in self.h:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)


def time_steps(name, model, batch, steps, global_batch, rank):
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    inputs, targets = batch

    def step():
        optimizer.zero_grad(set_to_none=True)
        logits = model(inputs)
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
        loss.backward()
        optimizer.step()
        return loss.item()

    for _ in range(3):  # warm-up: the caching allocator, cuBLAS, DDP's first-iteration bucket rebuild
        step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    ms = (time.perf_counter() - start) / steps * 1e3
    if rank == 0:
        print(f"{name:40s} {ms:9.2f} ms/step {global_batch / ms * 1e3:10.1f} samples/s", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", choices=SIZES, default="small")
    ap.add_argument("--batch", type=int, default=8, help="per GPU")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--buckets", default="1,4,25,100", help="DDP bucket_cap_mb values, comma-separated")
    ap.add_argument("--matmul-precision", default="highest", choices=["highest", "high"])
    ap.add_argument("--compile", action="store_true", help="also time torch.compile(model) (default mode)")
    args = ap.parse_args()
    torch.set_float32_matmul_precision(args.matmul_precision)

    distributed = "WORLD_SIZE" in os.environ
    if distributed:
        dist.init_process_group("nccl")
        local = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local)
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    device = torch.device("cuda", torch.cuda.current_device())
    c = SIZES[args.size]
    gen = torch.Generator().manual_seed(1 + rank)  # each rank a batch of its own
    tokens = torch.randint(c["vocab_size"], (args.batch, c["block_size"] + 1), generator=gen)
    batch = (tokens[:, :-1].contiguous().to(device), tokens[:, 1:].contiguous().to(device))

    def fresh():
        torch.manual_seed(0)
        return GPT(c).to(device)

    if rank == 0:
        print(f"torch {torch.__version__}, {torch.cuda.get_device_name(device)}, {world} rank(s), "
              f"gpt {args.size}, batch {args.batch} per GPU, matmul precision {args.matmul_precision}", flush=True)
    global_batch = args.batch * world
    if not distributed:
        time_steps(f"eager/gpt-{args.size}", fresh(), batch, args.steps, global_batch, rank)
        if args.compile:
            time_steps(f"compile/gpt-{args.size}", torch.compile(fresh()), batch, args.steps, global_batch, rank)
        return
    from torch.nn.parallel import DistributedDataParallel as DDP

    for mb in (float(b) for b in args.buckets.split(",")):
        model = DDP(fresh(), device_ids=[device.index], bucket_cap_mb=mb)
        time_steps(f"ddp/gpt-{args.size}/{mb:g}", model, batch, args.steps, global_batch, rank)
        if args.compile:
            model = torch.compile(DDP(fresh(), device_ids=[device.index], bucket_cap_mb=mb))
            time_steps(f"ddp-compile/gpt-{args.size}/{mb:g}", model, batch, args.steps, global_batch, rank)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
