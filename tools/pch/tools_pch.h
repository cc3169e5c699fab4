// Precompiled header for the crucible command: every subcommand parses ATen,
// the torch::nn module header and CLI11.
#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <CLI/CLI.hpp>
