// Private: pointwise lowering and fusion into kernels, and their C++ text.
#pragma once

#include <crucible/ir/graph.h>

#include <string>
#include <vector>

namespace crucible::inductor::detail {

/// One fused loop: `nodes` (pointwise, in graph order) computed element by
/// element over `numel` elements; `inputs` are read from memory, `outputs`
/// (Values read after the kernel, or graph outputs) written to fresh
/// contiguous buffers. Every other result lives in a register only.
struct Kernel {
  std::string name;  // the C symbol
  std::vector<const ir::Node*> nodes;
  std::vector<const ir::Value*> inputs;
  std::vector<const ir::Value*> outputs;
  int64_t numel = 0;
  c10::ScalarType dtype = c10::ScalarType::Float;
};

/// The schedule: graph nodes in order, each either an extern kernel (a Call
/// node run through the dispatcher) or the first node of a fused Kernel.
struct Schedule {
  struct Item {
    const ir::Node* extern_node = nullptr;  // set: an extern kernel
    size_t kernel = 0;                      // otherwise: kernels[kernel]
  };
  std::vector<Item> items;
  std::vector<Kernel> kernels;
};

/// True when `n` has a pointwise lowering its operands allow (Note [Pointwise lowering]).
bool is_lowerable(const ir::Node* n);

/// Groups runs of lowerable nodes of one size and dtype, with no extern
/// kernel between them, into Kernels (Note [Fusing pointwise runs]).
Schedule schedule(const ir::Graph& graph);

/// The translation unit of every kernel of `s`: plain C++ over raw
/// pointers, no ATen, one extern "C" function per kernel; `threads` > 0
/// fixes the OpenMP thread count of every loop.
std::string render_cpp(const Schedule& s, int threads);

}  // namespace crucible::inductor::detail
