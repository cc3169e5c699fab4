// Precompiled header for the benchmark cases: ATen, the torch::nn module
// header and Google Benchmark dominate their parse time (about 50 s a file
// on 2 cores without it).
#include <ATen/ATen.h>
#include <benchmark/benchmark.h>
#include <torch/nn/module.h>
