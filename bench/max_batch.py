#!/usr/bin/env python3
"""The largest batch whose training step runs on one device, Crucible's
compiled step (crucible_spmd_bench's BM_Step row, per --backends) beside
PyTorch's torch.compile (bench/torch_zoo.py: the zoo's replicas with fused
AdamW, per --modes), in one run on the same machine:

  python3 bench/max_batch.py --model gpt --autocast bf16 --start 8 --limit 128 --out OUT
  python3 bench/max_batch.py --model resnet18 --dry-run     # the probes' commands, nothing run

Every probe is a fresh process (the caching allocator starts empty, and an
out-of-memory error cannot leave the next probe a fragmented or broken
device): the batch doubles from --start until a probe fails or --limit is
reached, then bisects between the last success and the first failure down
to --step. A probe succeeds when its process exits 0 and prints a step time.
It hit the limit when it failed and its output says out of memory
(torch_zoo.py's: the row's "failed:" line); any other failure (a crash, a
timeout, a compile error) is an error, which stops that side's search
instead of passing for its limit. For inductor-cudagraphs a step
that ran but whose CUDA-graph capture failed ("CUDA graph capture failed",
after which Crucible runs the graph without CUDA graphs) is a failure too:
out of memory when the warning says so, an error otherwise.

Each probe's output (stdout and stderr together) is kept in OUT/<side>_b<N>.log
(and crucible_spmd_bench's JSON in OUT/<side>_b<N>.json); the result is
printed as a Markdown table and written to OUT/max_batch.json and
OUT/max_batch.md. Peaks are the process's, compile and capture included:
crucible_spmd_bench's process_alloc_MiB and process_reserved_MiB, and
torch_zoo.py's torch.cuda.max_memory_allocated and max_memory_reserved.
"""
import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ZOO_BATCH = {"mlp": 256, "convnet": 64, "resnet18": 64, "gpt": 8}  # bench/torch_zoo.py's DEFAULT_BATCH
# PyTorch's and LibTorch's allocator errors ("CUDA out of memory", c10::OutOfMemoryError,
# "CUDA error: out of memory") and the cuBLAS/cuDNN workspaces' allocation failures.
OOM = re.compile(r"out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED|CUDNN_STATUS_ALLOC_FAILED", re.I)
# inductor/src/runtime/cuda_graphs.cpp's warning; e.what() inside may span lines (a c10 backtrace).
CAPTURE_FAILED = re.compile(r"CUDA graph capture failed.*?runs without CUDA graphs", re.S)


class Side:
    """One contestant: how to run a probe at a batch, and how to read its step time and peaks."""

    cudagraphs = False  # a failed CUDA-graph capture counts as a failure (Crucible's inductor-cudagraphs)

    def __init__(self, label, args):
        self.label, self.args = label, args
        self.slug = re.sub(r"[^\w-]", "_", label)

    def command(self, batch, json_path):
        raise NotImplementedError

    def read(self, output, json_path):
        """{"ms": step time, and the peaks printed} or None when the probe printed no step time."""
        raise NotImplementedError

    def failure(self, output):
        """The part of a failed probe's output that says why (where an out-of-memory error is looked for)."""
        # A failed capture's own out-of-memory text must not label a later, other crash.
        return CAPTURE_FAILED.sub("", output) if self.cudagraphs else output


class Crucible(Side):
    def __init__(self, backend, args):
        super().__init__(f"crucible/{backend}", args)
        self.backend = backend
        self.cudagraphs = backend.endswith("cudagraphs")

    def command(self, batch, json_path):  # the flags bench/zoo_gpu.sh gives, one BM_Step row
        a = self.args
        return [a.crucible_bench, f"--model={a.model}", f"--size={a.size}", f"--batch={batch}",
                f"--device={a.device}", f"--backend={self.backend}", f"--steps={a.steps}",
                "--matmul-precision=high", f"--autocast={a.autocast}", f"--memory-format={a.memory_format}",
                "--benchmark_filter=BM_Step/", f"--benchmark_out={json_path}", "--benchmark_out_format=json"]

    def read(self, output, json_path):
        # The JSON, not the console: a process that died mid-row leaves it unfinished (no row).
        try:
            rows = json.loads(Path(json_path).read_text())["benchmarks"]
        except (OSError, ValueError, KeyError):
            return None
        for row in rows:
            if row["name"].startswith("BM_Step/") and not row.get("error_occurred") and "real_time" in row:
                unit = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[row.get("time_unit", "ns")]
                keys = ("process_alloc_MiB", "process_reserved_MiB", "step_alloc_MiB", "step_reserved_MiB",
                        "process_rss_MiB")
                return {"ms": row["real_time"] * unit, **{k: row[k] for k in keys if k in row}}
        return None


class TorchCompile(Side):
    def __init__(self, mode, args):
        super().__init__("torch/eager" if mode == "eager" else f"torch.compile/{mode}", args)
        self.mode = mode

    def command(self, batch, json_path):
        a = self.args
        return [sys.executable, str(ROOT / "bench/torch_zoo.py"), "--models", a.model, "--size", a.size,
                "--batch", f"{a.model}={batch}", "--modes", self.mode, "--steps", str(a.steps),
                "--matmul-precision", "high", "--autocast", a.autocast, "--memory-format", a.memory_format,
                "--device", a.device]

    def read(self, output, json_path):
        # torch_zoo.py's row: "<mode> <model> <ms> ms/step ... [peak alloc <A> MiB  reserved <R> MiB]"
        m = re.search(rf"^{re.escape(self.mode)}\s+{self.args.model}\s+([\d.]+) ms/step(.*)$", output, re.M)
        if not m:
            return None
        r = {"ms": float(m.group(1))}
        peaks = re.search(r"peak alloc\s+([\d.]+) MiB\s+reserved\s+([\d.]+) MiB", m.group(2))
        if peaks:
            r["process_alloc_MiB"], r["process_reserved_MiB"] = float(peaks.group(1)), float(peaks.group(2))
        return r

    def failure(self, output):
        # The row's "failed: <error>" line alone: a process that died without one crashed (an error),
        # whatever a warning before said about memory.
        m = re.search(rf"^{re.escape(self.mode)}\s+{self.args.model}\s+failed: .*$", output, re.M)
        return m.group(0) if m else ""


def last_line(text):
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    return lines[-1][:300] if lines else ""


def classify(side, rc, output, row):
    """(outcome, reason): "ok", "oom" (the limit) or "error" (anything else; rc None: timed out)."""
    if rc == 0 and row:
        capture = CAPTURE_FAILED.search(output) if side.cudagraphs else None
        if not capture:
            return "ok", ""
        # The step ran, but without CUDA graphs: not the backend asked for.
        kind = "oom" if OOM.search(capture.group(0)) else "error"
        return kind, " ".join(capture.group(0).split())[:300]
    if rc is None:
        return "error", "timed out"
    rest = side.failure(output)
    oom = OOM.search(rest)
    if oom:
        line = rest[rest.rfind("\n", 0, oom.start()) + 1:].split("\n", 1)[0]
        return "oom", line.strip()[:300]
    how = f"exit {rc}" if rc >= 0 else f"killed by signal {-rc}"
    if rc == 0:
        how = "exit 0 without a step time"
    return "error", f"{how}: {last_line(output)}" if last_line(output) else how


def probe(side, batch, args):
    """Runs one probe in a process of its own (its own session, so that a timeout kills its children too)."""
    log, json_path = Path(args.out) / f"{side.slug}_b{batch}.log", Path(args.out) / f"{side.slug}_b{batch}.json"
    json_path.unlink(missing_ok=True)
    start = time.monotonic()
    with open(log, "w") as f:
        p = subprocess.Popen(side.command(batch, json_path), stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = p.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            rc = None
    output = log.read_text(errors="replace")
    row = side.read(output, json_path)
    outcome, reason = classify(side, rc, output, row)
    r = {"batch": batch, "outcome": outcome, "reason": reason, "seconds": round(time.monotonic() - start, 1),
         "log": str(log)}
    if outcome == "ok":
        r.update(row, samples_per_s=batch * 1e3 / row["ms"])
    print(f"  {side.label} batch {batch}: {outcome}"
          + (f", {row['ms']:.2f} ms/step" if outcome == "ok" else f" ({reason})") + f", {r['seconds']} s",
          flush=True)
    return r


def search(run, start, limit, step):
    """Doubling from `start` (to `limit` at most), then bisection to `step`, with run(batch) -> probe result.
    Returns the probes in order; an "error" probe ends the search there."""
    probes = []

    def tried(batch):
        probes.append(run(batch))
        return probes[-1]["outcome"]

    good, bad, batch = None, None, start
    while True:
        outcome = tried(batch)
        if outcome == "error":
            return probes
        if outcome == "oom":
            bad = batch
            break
        good = batch
        if batch >= limit:
            return probes
        batch = min(2 * batch, limit)
    if good is None:  # not even --start trains
        return probes
    while bad - good > step:  # the midpoint, rounded down to good + k * step
        batch = good + max(step, (bad - good) // 2 // step * step)
        outcome = tried(batch)
        if outcome == "error":
            return probes
        good, bad = (batch, bad) if outcome == "ok" else (good, batch)
    return probes


def summary(side, probes):
    ok = [p for p in probes if p["outcome"] == "ok"]
    best = max(ok, key=lambda p: p["batch"]) if ok else None
    oom = min((p for p in probes if p["outcome"] == "oom"), key=lambda p: p["batch"], default=None)
    error = next((p for p in probes if p["outcome"] == "error"), None)
    return {"side": side.label, "command": shlex.join(map(str, side.command("BATCH", "JSON"))),
            "max_batch": best["batch"] if best else None, "best": best,
            "smallest_oom": oom, "error": error, "probes": probes}


def table(results, args):
    rows = ["| side | largest batch | ms/step | samples/s | peak alloc MiB | peak reserved MiB | failures | probes |",
            "|---|---:|---:|---:|---:|---:|---|---:|"]
    for s in results:
        b, oom, error = s["best"] or {}, s["smallest_oom"], s["error"]
        largest = str(s["max_batch"]) if b else "none"
        fails = []
        if oom:
            capture = oom["reason"].startswith("CUDA graph capture failed")
            fails.append(f"{oom['batch']}: out of memory" + (" in CUDA-graph capture" if capture else ""))
        if error:  # the search stopped there: the largest batch is a lower bound only
            largest = f"≥ {largest}" if b else largest
            fails.append(f"{error['batch']}: error ({error['reason'][:80]})")
        elif b and not oom and s["max_batch"] >= args.limit:
            largest += " (the limit)"
        cells = [f"{b['ms']:.2f}", f"{b['samples_per_s']:.1f}"] if b else ["-", "-"]
        cells += [f"{b[k]:.0f}" if k in b else "-" for k in ("process_alloc_MiB", "process_reserved_MiB")]
        cells += ["; ".join(fails) or "-", str(len(s["probes"]))]
        rows.append(f"| {s['side']} | {largest} | {' | '.join(cells)} |")
    return "\n".join(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=sorted(ZOO_BATCH), default="gpt")
    ap.add_argument("--size", choices=["small", "full"], default="full", help="the zoo's size (small: a CPU smoke run)")
    ap.add_argument("--autocast", choices=["off", "bf16", "f16"], default="off")
    ap.add_argument("--memory-format", choices=["contiguous", "channels-last"], default="contiguous")
    ap.add_argument("--backends", default="inductor,inductor-cudagraphs",
                    help="Crucible backends, comma-separated (empty: none)")
    ap.add_argument("--modes", default="default,reduce-overhead",
                    help="torch.compile modes (or eager), comma-separated (empty: none)")
    ap.add_argument("--start", type=int, help="the first batch (default: the zoo's, gpt 8, resnet18 64, ...)")
    ap.add_argument("--limit", type=int, help="the largest batch tried (default: 16 x --start)")
    ap.add_argument("--step", type=int, help="the bisection's granularity (default: --start / 8, at least 1)")
    ap.add_argument("--steps", type=int, default=3, help="timed steps a probe (after 3 warm-up steps)")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke run")
    ap.add_argument("--timeout", type=int, default=900, help="seconds a probe may run (then it is an error)")
    ap.add_argument("--out", default="max_batch_out", help="folder for every probe's output and the result")
    ap.add_argument("--crucible-bench", default=str(ROOT / "build/bench/crucible_spmd_bench"))
    ap.add_argument("--dry-run", action="store_true", help="print the probes' commands, run nothing")
    args = ap.parse_args()
    args.start = args.start or ZOO_BATCH[args.model]
    args.limit = args.limit or 16 * args.start
    args.step = args.step or max(1, args.start // 8)
    if not 0 < args.start <= args.limit:
        ap.error("--start must be at least 1 and at most --limit")
    sides = [Crucible(b, args) for b in args.backends.split(",") if b]
    sides += [TorchCompile(m, args) for m in args.modes.split(",") if m]
    doubling = [args.start]
    while doubling[-1] < args.limit:
        doubling.append(min(2 * doubling[-1], args.limit))
    print(f"{args.model} ({args.size}), autocast {args.autocast}, {args.memory_format}, {args.device}: batches "
          f"{' '.join(map(str, doubling))} until one fails, then bisection to a step of {args.step}", flush=True)
    if args.dry_run:
        for s in sides:
            print(f"{s.label}:\n  {shlex.join(map(str, s.command('BATCH', Path(args.out) / f'{s.slug}_bBATCH.json')))}")
        return 0
    Path(args.out).mkdir(parents=True, exist_ok=True)
    results = []
    for s in sides:
        print(f"== {s.label}", flush=True)
        probes = search(lambda batch: probe(s, batch, args), args.start, args.limit, args.step)
        results.append(summary(s, probes))
    md = table(results, args)
    print("\n" + md)
    if any(s["error"] for s in results):
        print("\nerror: a probe failed for another reason than memory and ended that side's search "
              "(≥: the largest batch is a lower bound); see the probe's log.")
    Path(args.out, "max_batch.md").write_text(md + "\n")
    Path(args.out, "max_batch.json").write_text(json.dumps({"args": vars(args), "sides": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
