// make_fx for C++: run a function over tensors once and record every ATen op
// it dispatches as an ir::Graph (torch/fx/experimental/proxy_tensor.py's
// make_fx, without Python).
#pragma once

#include <crucible/ir/graph.h>
#include <crucible/tracer/decomposition.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <vector>

namespace crucible::tracer {

/// What the traced function runs on. See Note [Fake mode] in make_fx.cpp.
enum class TraceMode : uint8_t {
  /// The function runs on the example inputs themselves (make_fx's "real").
  Real,
  /// The inputs are replaced by meta tensors of the same sizes, strides and
  /// dtype, so no data is computed (make_fx's "fake"). An op that has no Meta
  /// kernel in C++ (aten::relu in 2.11, for one) runs on zero-filled CPU
  /// tensors of the same metadata to learn its outputs' metadata.
  Fake,
};

struct TraceOptions {
  TraceMode mode = TraceMode::Real;
  /// Remove mutation and aliasing through LibTorch's functionalization: the
  /// graph has no in-place ops; inputs the function mutates come back as
  /// extra outputs (OutputKind::MutatedInput / MutatedInputMetadata) and are
  /// described by TraceResult::input_mutations (module state too: see Note
  /// [Functionalizing module state]). See Note [Functionalization].
  bool functionalize = false;
  /// Tensors the function uses that are not derived from its inputs become
  /// constant nodes; one larger than this (bytes) raises TraceError, since it
  /// is almost always state (a weight) that should be passed as an input.
  int64_t max_constant_bytes = int64_t{1} << 20;
  /// Ops rewritten while tracing (see decomposition.h).
  DecompositionTable decompositions;
};

/// How the traced function changed one of its inputs (functionalize only;
/// all false otherwise), as AOTAutograd's InputAliasInfo records it.
struct InputMutation {
  bool data = false;      ///< its elements were written (add_, copy_, ...)
  bool metadata = false;  ///< its sizes/strides/offset changed (transpose_, resize_, ...)
};

struct TraceResult {
  /// Placeholders: the example inputs, in order (module tracing puts the
  /// parameters and buffers first). Outputs: the function's results, then the
  /// extra outputs the signature describes. Backward ops carry the tag "backward".
  ir::Graph graph;
  /// One per placeholder.
  std::vector<InputMutation> input_mutations;
};

/// A function over tensors, as make_fx traces it.
using TensorFn = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>& inputs)>;

/// Runs `fn(example_inputs)` once, recording every ATen op it dispatches below
/// autograd (forward ops, and the backward ops of any torch::autograd::grad
/// or .backward() call inside `fn`, tagged "backward"). Placeholders are the
/// example inputs (meta and requires_grad taken from them); tensor results
/// carry the metadata of the tensors the ops produced (requires_grad is false
/// on them: the tracer runs below autograd; an undefined result, such as a
/// gradient a backward op was told not to compute, has no metadata). An op is
/// tagged "backward" when the autograd engine runs it, i.e. while a graph task
/// is current (torch::autograd::get_current_graph_task_id() != -1). The graph replays the
/// function: interpreting it on the same inputs gives the same outputs (RNG
/// ops draw from the generator they drew from while tracing).
///
/// Throws TraceError for data-dependent ops (.item(), nonzero, equal, ...),
/// for a large tensor not derived from the inputs, and when `fn` returns a
/// tensor it did not compute or receive. Any exception `fn` throws propagates.
/// One trace runs at a time in a process (others wait).
TraceResult make_fx(const TensorFn& fn, const std::vector<at::Tensor>& example_inputs,
                    const TraceOptions& options = {});

/// Convenience forms for one and two tensors in, one tensor out.
TraceResult make_fx(const std::function<at::Tensor(const at::Tensor&)>& fn, const at::Tensor& x,
                    const TraceOptions& options = {});
TraceResult make_fx(const std::function<at::Tensor(const at::Tensor&, const at::Tensor&)>& fn,
                    const at::Tensor& x, const at::Tensor& y, const TraceOptions& options = {});

}  // namespace crucible::tracer
