#!/usr/bin/env python3
"""What PyTorch's AOTAutograd saves for the backward on replicas of Crucible's
model zoo (bench/torch_zoo.py), with its default partition and with its
min-cut rematerialization partition, to set beside crucible_bench's
BM_Partition rows (bench/bench_partitioner.cpp) in one run:

  python3 bench/torch_partition.py                           # small zoo, batch 8, and GPT-2 small at full size
  crucible_bench --benchmark_filter=BM_Partition             # Crucible's rows (saved_MiB, saved_tensors)

Each model's loss (the zoo's mean cross-entropy, WithLoss) goes through
torch._functorch.aot_autograd.aot_module with a partition_fn that wraps
PyTorch's and records the forward's saved values: the forward graph's outputs
after its num_fwd_outputs, tensors only, each counted at its own size
(numel * itemsize: a saved view counts its own elements, as Crucible counts
them). The compilers are nop: the graphs run as traced, once.
"""
import argparse

import torch
from torch._functorch.aot_autograd import aot_module
from torch._functorch.compilers import nop
from torch._functorch.partitioners import default_partition, min_cut_rematerialization_partition

import torch_zoo

PARTITIONS = {"default": default_partition, "min-cut": min_cut_rematerialization_partition}


def saved(model, inputs, partition):
    """(tensors, bytes) the forward saves for the backward under `partition`."""
    record = {}

    def recording(joint, joint_inputs, **kwargs):
        fw, bw = partition(joint, joint_inputs, **kwargs)
        outputs = next(n for n in fw.graph.nodes if n.op == "output").args[0]
        vals = [n.meta.get("val") for n in outputs[kwargs["num_fwd_outputs"]:]]
        tensors = [v for v in vals if isinstance(v, torch.Tensor)]
        record["tensors"] = len(tensors)
        record["bytes"] = sum(t.numel() * t.element_size() for t in tensors)
        return fw, bw

    compiled = aot_module(model, fw_compiler=nop, bw_compiler=nop, partition_fn=recording)
    compiled(*inputs)
    return record["tensors"], record["bytes"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--rows", default="mlp:small,convnet:small,resnet18:small,gpt:small,gpt:full",
                    help="model:size pairs (the zoo's sizes)")
    args = ap.parse_args()
    print(f"torch {torch.__version__}, {args.device}, batch {args.batch}; saved for backward: tensors / bytes",
          flush=True)
    print(f"{'model':10s} {'size':6s} {'default':>24s} {'min-cut':>24s}")
    for row in args.rows.split(","):
        name, size = row.split(":")
        cells = []
        for partition in PARTITIONS.values():
            torch.manual_seed(0)
            model, example_batch = torch_zoo.make_model(name, size)
            model = torch_zoo.WithLoss(model).to(args.device).train()
            inputs = [t.to(args.device) for t in example_batch(args.batch, 0)]
            n, nbytes = saved(model, inputs, partition)
            cells.append(f"{n} / {nbytes}")
            del model, inputs
            if args.device == "cuda":
                torch.cuda.empty_cache()
        print(f"{name:10s} {size:6s} {cells[0]:>24s} {cells[1]:>24s}", flush=True)


if __name__ == "__main__":
    main()
