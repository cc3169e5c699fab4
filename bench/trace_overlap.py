#!/usr/bin/env python3
"""How much of a data-parallel step's communication ran under its compute.

Reads the Chrome traces `crucible_spmd_bench --trace DIR` writes (one step
each, recorded by PyTorch's profiler) and prints, per trace, on the GPU:

  span      first GPU activity to last, ms
  compute   time some non-NCCL kernel, copy or memset ran (their union), ms
  nccl      time some NCCL kernel ran (their union), ms
  hidden    share of `nccl` during which compute also ran
  exposed   nccl - hidden part: time the GPU did communication alone, ms
  idle      span - (compute and nccl together): time the GPU did nothing, ms

then, with --kernels, every NCCL kernel (start in ms from the span's start,
duration, the share of it under compute) and the longest gaps in compute
after the first NCCL kernel starts: where the compute stream waited.

    python3 bench/trace_overlap.py [--kernels] DIR/*.json

An NCCL kernel's time includes waiting for the other ranks to reach it, so
a rank that is ahead sees long NCCL kernels that are mostly waiting.
"""
import argparse
import json
import sys


def union(intervals):
    """Sorted, disjoint intervals covering the given (start, end) pairs."""
    merged = []
    for s, e in sorted(intervals):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return merged


def length(intervals):
    return sum(e - s for s, e in intervals)


def intersect(a, b):
    """Intersection of two sorted, disjoint interval lists."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if s < e:
            out.append([s, e])
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def gpu_events(path):
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    return [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and e.get("dur", 0) > 0]


def is_nccl(e):
    return e["cat"] == "kernel" and e["name"].startswith("nccl")


def report(path, kernels):
    events = gpu_events(path)
    if not events:
        print(f"{path}: no GPU activity")
        return
    t0 = min(e["ts"] for e in events)
    span = max(e["ts"] + e["dur"] for e in events) - t0
    nccl = union((e["ts"], e["ts"] + e["dur"]) for e in events if is_nccl(e))
    compute = union((e["ts"], e["ts"] + e["dur"]) for e in events if not is_nccl(e))
    both = intersect(nccl, compute)
    busy = length(union(nccl + compute))
    ms = 1e-3
    hidden = length(both) / length(nccl) if nccl else 0.0
    print(
        f"{path}: span {span * ms:.2f} ms, compute {length(compute) * ms:.2f}, nccl {length(nccl) * ms:.2f}, "
        f"hidden {hidden:.0%}, exposed {(length(nccl) - length(both)) * ms:.2f}, idle {(span - busy) * ms:.2f}"
    )
    if not kernels or not nccl:
        return
    for e in sorted((e for e in events if is_nccl(e)), key=lambda e: e["ts"]):
        under = length(intersect([[e["ts"], e["ts"] + e["dur"]]], compute))
        print(
            f"  nccl  at {(e['ts'] - t0) * ms:8.3f} ms  {e['dur'] * ms:7.3f} ms  under compute {under / e['dur']:4.0%}"
            f"  stream {e['args'].get('stream')}  {e['name'][:60]}"
        )
    gaps = [(b[0] - a[1], a[1]) for a, b in zip(compute, compute[1:]) if a[1] >= nccl[0][0]]
    for gap, at in sorted(gaps, reverse=True)[:8]:
        print(f"  compute idle at {(at - t0) * ms:8.3f} ms for {gap * ms:.3f} ms")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernels", action="store_true", help="list every NCCL kernel and the longest compute gaps")
    parser.add_argument("traces", nargs="+")
    args = parser.parse_args()
    for path in args.traces:
        report(path, args.kernels)
    return 0


if __name__ == "__main__":
    sys.exit(main())
