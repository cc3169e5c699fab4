#!/usr/bin/env python3
"""PyTorch's eager and torch.compile on replicas of Crucible's model zoo
(models/src/zoo.cpp), one training step per row, to set beside
crucible_spmd_bench's BM_StepEager and BM_Step rows in one run on the same
machine (--autocast bf16 on both sides: the forward and the loss under
autocast):

  python3 bench/torch_zoo.py                       # the four models, full size, every mode
  python3 bench/torch_zoo.py --models gpt --batch gpt=4 --modes eager,default
  crucible_spmd_bench --model=gpt --size=full --device=cuda --backend=inductor \\
      --matmul-precision=high --batch=8            # the C++ rows for the same step

The replicas mirror the zoo's make_model(name, size): the same layers, module
and parameter names, shapes and initialization (built on the CPU after
torch.manual_seed(0), in the zoo's order), the same inputs (example_batch(batch,
seed 1), seeded as the zoo seeds them) and the same loss (mean cross-entropy;
over every position for the GPT). A step is the zoo's eager_train_step with
AdamW(lr=3e-4), as in bench/bench_spmd.cpp, fused on a GPU (the fastest a
PyTorch user picks): zero_grad, loss, backward, optimizer step, then
loss.item(), which waits for the step's kernels. The
compiled modes compile the model together with its loss, as Crucible compiles
loss_of(model), with torch.compile(mode=...); the optimizer step stays eager.
Each row builds a fresh model, runs 3 warm-up steps (the first compiles; its
wall time is printed as "first step") and times --steps steps. On a GPU each
row also prints its memory peaks, compile and CUDA-graph capture included
(torch.cuda.max_memory_allocated and max_memory_reserved, reset before the
row, after the previous row's memory went back: crucible_spmd_bench's
process_alloc_MiB and process_reserved_MiB). A row that fails (out of memory,
say) prints "failed: <error>" and the others still run; the exit status is 1
when any row failed.
"""
import argparse
import contextlib
import gc
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

MODEL_NAMES = ("mlp", "convnet", "resnet18", "gpt")
DEFAULT_BATCH = {"mlp": 256, "convnet": 64, "resnet18": 64, "gpt": 8}

# --- MLP: flatten, Linear+ReLU per hidden size, Linear to the classes ----------------------


class MLP(nn.Module):
    def __init__(self, in_features, hidden, num_classes):
        super().__init__()
        sizes = [in_features, *hidden, num_classes]
        for i in range(len(sizes) - 1):
            self.add_module(f"fc{i + 1}", nn.Linear(sizes[i], sizes[i + 1]))

    def forward(self, x):
        x = x.flatten(1)
        *hidden, last = self.children()
        for layer in hidden:
            x = F.relu(layer(x))
        return last(x)


# --- ConvNet: LibTorch's MNIST example, logits out, dropout off as in the zoo's default ----


class ConvNet(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(1, 10, 5), nn.Conv2d(10, 20, 5)
        self.fc1, self.fc2 = nn.Linear(320, 50), nn.Linear(50, num_classes)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2(x), 2)).flatten(1)
        return self.fc2(F.relu(self.fc1(x)))


# --- GPT: nanoGPT's GPT-2 layout, attention written out, head tied to wte ------------------

GPT_SIZES = {  # the zoo's GptConfig for model_sizes() (dropout 0, biases on)
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
        self.register_buffer("bias", torch.ones(t, t).tril().view(1, 1, t, t))  # the causal mask

    def forward(self, x):
        b, t, c = x.shape
        hs = c // self.n_head
        q, k, v = (y.view(b, t, self.n_head, hs).transpose(1, 2) for y in self.c_attn(x).split(c, 2))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf")).softmax(-1)
        return self.c_proj((att @ v).transpose(1, 2).contiguous().view(b, t, c))


class GptMlp(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_fc, self.c_proj = nn.Linear(c["n_embd"], 4 * c["n_embd"]), nn.Linear(4 * c["n_embd"], c["n_embd"])

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(c["n_embd"]), Attention(c)
        self.ln_2, self.mlp = nn.LayerNorm(c["n_embd"]), GptMlp(c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


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


# --- ResNet-18: torchvision's BasicBlock network; He-normal (fan_out) convolutions --------


def conv(cin, cout, k, stride):
    return nn.Conv2d(cin, cout, k, stride=stride, padding=k // 2, bias=False)


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1, self.bn1 = conv(cin, cout, 3, stride), nn.BatchNorm2d(cout)
        self.conv2, self.bn2 = conv(cout, cout, 3, 1), nn.BatchNorm2d(cout)
        self.downsample_conv = self.downsample_bn = None
        if stride != 1 or cin != cout:
            self.downsample_conv, self.downsample_bn = conv(cin, cout, 1, stride), nn.BatchNorm2d(cout)

    def forward(self, x):
        out = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(out + (x if self.downsample_conv is None else self.downsample_bn(self.downsample_conv(x))))


class ResNet(nn.Module):
    def __init__(self, in_channels, width, num_classes, imagenet_stem, blocks=(2, 2, 2, 2)):
        super().__init__()
        self.conv1 = conv(in_channels, width, 7 if imagenet_stem else 3, 2 if imagenet_stem else 1)
        self.bn1, self.max_pool = nn.BatchNorm2d(width), imagenet_stem
        self.layers = nn.ModuleList()
        self.fc = nn.Linear(8 * width, num_classes)  # made before the blocks, as the zoo's
        cin = width
        for stage, n in enumerate(blocks):
            for i in range(n):
                self.layers.append(BasicBlock(cin, width << stage, 2 if i == 0 and stage > 0 else 1))
                cin = width << stage
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        if self.max_pool:
            x = F.max_pool2d(x, 3, 2, 1)
        for block in self.layers:
            x = block(x)
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


# --- the zoo's example batches and make_model --------------------------------------------


def image_batches(channels, size, classes):
    """Images in N(0, 1) and uniform labels from a generator seeded with `seed`."""

    def batch(batch_size, seed):
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(batch_size, channels, size, size, generator=gen)
        return x, torch.randint(0, classes, (batch_size,), generator=gen)

    return batch


def token_batches(c):
    """data::synthetic_token_batch(step 0): rows t_{j+1} = (t_j + d) mod V, random start and d in 1..4."""

    def batch(batch_size, seed, step=0):
        mask = (1 << 64) - 1  # the zoo's splitmix-style mix of (seed, step), in uint64
        z = (seed + 0x9E3779B97F4A7C15 * (step + 1)) & mask
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        gen = torch.Generator().manual_seed(z ^ (z >> 31))
        v, t = c["vocab_size"], c["block_size"]
        start = torch.randint(0, v, (batch_size, 1), generator=gen)
        stride = torch.randint(1, 5, (batch_size, 1), generator=gen)
        rows = (start + stride * torch.arange(t + 1)).remainder(v)
        return rows[:, :t].contiguous(), rows[:, 1:].contiguous()

    return batch


def make_model(name, size="full"):
    """The zoo's make_model: (module, example_batch(batch_size, seed) -> (inputs, targets))."""
    full = size == "full"
    if name == "mlp":
        return MLP(784, (1024, 1024) if full else (256, 128), 10), image_batches(1, 28, 10)
    if name == "convnet":  # one size
        return ConvNet(10), image_batches(1, 28, 10)
    if name == "gpt":
        return GPT(GPT_SIZES[size]), token_batches(GPT_SIZES[size])
    if name == "resnet18":
        if full:
            return ResNet(3, 64, 1000, imagenet_stem=True), image_batches(3, 224, 1000)
        return ResNet(1, 16, 10, imagenet_stem=False), image_batches(1, 28, 10)
    raise ValueError(f"unknown model {name!r}; the zoo has {', '.join(MODEL_NAMES)}")


class WithLoss(nn.Module):
    """The zoo's loss_of: mean cross-entropy of the model's logits ([B, C], or [B, T, V] flattened)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, inputs, targets):
        logits = self.model(inputs)
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


# --- timing --------------------------------------------------------------------------------


def time_row(name, size, batch_size, mode, steps, device, memory_format=torch.contiguous_format, autocast=None,
             profile=0):
    """(ms per timed step, seconds of the first step) of a fresh model in `mode`; with profile > 0, then prints
    the `profile` kernels that take the most GPU time over 3 more steps (torch.profiler)."""
    torch.manual_seed(0)
    model, example_batch = make_model(name, size)
    model.to(device).train()
    model.to(memory_format=memory_format)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=device.type == "cuda")
    inputs, targets = (t.to(device) for t in example_batch(batch_size, 1))
    if inputs.dim() == 4:
        inputs = inputs.contiguous(memory_format=memory_format)
    loss_fn = WithLoss(model) if mode == "eager" else torch.compile(WithLoss(model), mode=mode)

    def step():
        if mode == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=autocast) if autocast else contextlib.nullcontext():
            loss = loss_fn(inputs, targets)
        loss.backward()
        optimizer.step()
        return loss.item()

    start = time.perf_counter()
    step()
    first = time.perf_counter() - start
    for _ in range(2):  # the rest of the 3 warm-up steps
        step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    ms = (time.perf_counter() - start) / steps * 1e3
    if profile > 0:
        activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=activities) as prof:
            for _ in range(3):
                step()
        print(f"-- {mode} {name}: the {profile} kernels with the most GPU time over 3 steps", flush=True)
        print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=profile, max_name_column_width=90),
              flush=True)
    return ms, first


def parse_batches(items):
    """--batch gpt=4 (repeatable, or comma-separated; a bare N sets every model)."""
    batch = dict(DEFAULT_BATCH)
    for part in (p for item in items for p in item.split(",") if p):
        name, eq, n = part.rpartition("=")
        for m in [name] if eq else MODEL_NAMES:
            if m not in batch:
                raise SystemExit(f"--batch: unknown model {m!r}; the zoo has {', '.join(MODEL_NAMES)}")
            batch[m] = int(n)
    return batch


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODEL_NAMES))
    ap.add_argument("--size", choices=["small", "full"], default="full", help="the zoo's size (small: a CPU smoke run)")
    ap.add_argument("--batch", action="append", default=[], metavar="MODEL=N",
                    help="batch size per model, e.g. gpt=4 (defaults: "
                    + ", ".join(f"{m} {b}" for m, b in DEFAULT_BATCH.items()) + ")")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--matmul-precision", choices=["highest", "high"], default="high")
    ap.add_argument("--modes", default="eager,default,reduce-overhead,max-autotune-no-cudagraphs",
                    help="eager (no compile) and torch.compile modes, comma-separated")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--memory-format", choices=["contiguous", "channels-last"], default="contiguous",
                    help="channels-last: the model's 4-D parameters and the images, as crucible_spmd_bench's flag")
    ap.add_argument("--autocast", choices=["off", "bf16", "f16"], default="off",
                    help="the forward and the loss under torch.autocast (crucible_spmd_bench's --autocast)")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="after each row, the N kernels with the most GPU time over 3 steps (torch.profiler)")
    args = ap.parse_args()
    autocast = {"off": None, "bf16": torch.bfloat16, "f16": torch.float16}[args.autocast]
    models, modes = args.models.split(","), args.modes.split(",")
    for m in models:
        if m not in MODEL_NAMES:
            raise SystemExit(f"--models: unknown model {m!r}; the zoo has {', '.join(MODEL_NAMES)}")
    modes.sort(key=lambda m: m != "eager")  # eager first: the other rows' ratios need it
    batch = parse_batches(args.batch)
    torch.set_float32_matmul_precision(args.matmul_precision)
    device = torch.device(args.device)
    memory_format = torch.channels_last if args.memory_format == "channels-last" else torch.contiguous_format
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"torch {torch.__version__}, {gpu}, matmul precision {args.matmul_precision}, size {args.size}, "
          f"batch {' '.join(f'{m}={batch[m]}' for m in models)}, {args.steps} steps, {args.memory_format}, "
          f"autocast {args.autocast}", flush=True)

    failed = False
    for name in models:
        eager_ms = None
        for mode in modes:
            torch.compiler.reset()
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            try:
                ms, first = time_row(name, args.size, batch[name], mode, args.steps, device, memory_format, autocast,
                                     args.profile)
            except Exception as e:  # a failing mode is a row too
                failed = True
                # One line, not the first alone: a compile error wraps its cause
                # ("backend='inductor' raised:" / "OutOfMemoryError: ...").
                msg = " ".join(str(e).split())[:500]
                print(f"{mode:28s} {name:10s} failed: {type(e).__name__}: {msg}", flush=True)
            else:
                eager_ms = ms if mode == "eager" else eager_ms
                ratio = f"{eager_ms / ms:5.2f}" if eager_ms else "    -"
                memory = ""
                if device.type == "cuda":
                    memory = (f"  peak alloc {torch.cuda.max_memory_allocated(device) / 2**20:8.0f} MiB"
                              f"  reserved {torch.cuda.max_memory_reserved(device) / 2**20:8.0f} MiB")
                print(f"{mode:28s} {name:10s} {ms:9.2f} ms/step  {ratio}x eager  first step {first:6.1f} s{memory}",
                      flush=True)
            torch.compiler.reset()
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return 1 if failed else 0  # bench/max_batch.py reads an out-of-memory row from this and the row's line


if __name__ == "__main__":
    raise SystemExit(main())
