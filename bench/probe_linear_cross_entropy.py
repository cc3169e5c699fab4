#!/usr/bin/env python3
"""Times, on a GPU, ways of computing the chunked linear cross-entropy that
crucible::linear_cross_entropy_forward computes (Note [Chunked linear
cross-entropy] in ir/src/fuse_linear_cross_entropy.cpp): loss, grad_input and
grad_weight of mean cross_entropy(x @ W^T, target) for GPT-2's head, against
eager's linear + cross_entropy forward and backward, with each one's peak
memory beyond its inputs. Used to choose the chunk size and the weight
gradient's accumulation:

  python3 bench/probe_linear_cross_entropy.py [--rows 8192] [--channels 768] [--vocab 50257]
"""
import argparse
import time

import torch
import torch.nn.functional as F


def chunked(x, w, target, rows, accumulate):
    n = x.shape[0]
    valid = target.ne(-100)
    count = valid.sum().float()
    safe = target.masked_fill(~valid, 0).unsqueeze(1)
    loss = torch.zeros((), device=x.device)
    grad_input = torch.empty_like(x)
    grad_weight = torch.zeros(w.shape, device=x.device, dtype=torch.float32)
    for start in range(0, n, rows):
        xs = x[start:start + rows]
        logits = (xs @ w.t()).float()
        lse = logits.logsumexp(1, keepdim=True)
        t = safe[start:start + rows]
        keep = valid[start:start + rows].unsqueeze(1).float()
        loss += ((lse - logits.gather(1, t)) * keep).sum()
        g = logits.sub_(lse).exp_()
        g.scatter_add_(1, t, torch.full_like(t, -1.0, dtype=torch.float32))
        g.mul_(keep / count)
        g_in = g.to(x.dtype)
        grad_input[start:start + rows] = g_in @ w
        if accumulate == "float32":  # the weight gradient's matmul in float32 (TF32 at precision "high")
            grad_weight.addmm_(g_in.t().float(), xs.float())
        else:  # bf16 operands, float32 output and accumulation (addmm's out_dtype)
            torch.addmm(grad_weight, g_in.t(), xs, out_dtype=torch.float32, out=grad_weight)
    return loss / count, grad_input, grad_weight.to(w.dtype)


def eager(x, w, target):
    x = x.detach().requires_grad_()
    w = w.detach().requires_grad_()
    loss = F.cross_entropy(x @ w.t(), target)
    loss.backward()
    return loss, x.grad, w.grad


def timed(fn, steps=10):
    for _ in range(2):
        out = fn()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    start = time.perf_counter()
    for _ in range(steps):
        out = fn()
    torch.cuda.synchronize()
    ms = (time.perf_counter() - start) * 1e3 / steps
    return ms, (torch.cuda.max_memory_allocated() - base) / 2**20, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--channels", type=int, default=768)
    ap.add_argument("--vocab", type=int, default=50257)
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.manual_seed(0)
    x = torch.randn(a.rows, a.channels, device="cuda", dtype=torch.bfloat16)
    w = (torch.randn(a.vocab, a.channels, device="cuda") * 0.02).to(torch.bfloat16)
    target = torch.randint(0, a.vocab, (a.rows,), device="cuda")
    ms, mib, ref = timed(lambda: eager(x, w, target))
    print(f"{torch.cuda.get_device_name()}, x [{a.rows}, {a.channels}] bf16, W [{a.vocab}, {a.channels}] bf16")
    print(f"eager linear + cross_entropy, fwd + bwd     {ms:7.2f} ms  peak {mib:8.0f} MiB")
    for accumulate in ("float32", "out_dtype"):
        for rows in (256, 1024, 2048, 4096):
            try:
                ms, mib, out = timed(lambda: chunked(x, w, target, rows, accumulate))
            except Exception as e:  # out_dtype unsupported, say
                print(f"chunked {rows:5d} rows, {accumulate:9s}: failed: {e}")
                continue
            err = [(o.float() - r.float()).abs().max().item() for o, r in zip(out, ref)]
            print(f"chunked {rows:5d} rows, weight grad {accumulate:9s} {ms:7.2f} ms  peak {mib:8.0f} MiB"
                  f"  max |diff| loss {err[0]:.2e} grad_input {err[1]:.2e} grad_weight {err[2]:.2e}")


if __name__ == "__main__":
    main()
