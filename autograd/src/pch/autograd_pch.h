// Precompiled header for the autograd library: ATen's operator API and the
// autograd engine's C++ API, which most of its sources use.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
