// ViewAndMutationMeta: what a function does to its inputs and how its
// outputs alias its inputs and each other, found by running it once under
// functionalization (torch/_functorch/_aot_autograd/schemas.py's
// ViewAndMutationMeta, InputAliasInfo and OutputAliasInfo, filled by
// collect_metadata_analysis.py). Every later stage reads it: the joint graph
// (which outputs get tangents), the runtime wrappers (which inputs to write
// back, which outputs to regenerate), the export checks.
#pragma once

#include <crucible/ir/tensor_meta.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace crucible::autograd {

/// How the function changed one input (the seed's InputAliasInfo).
struct InputAliasInfo {
  /// Its elements were written (mul_, copy_, an in-place op through a view).
  bool mutates_data = false;
  /// Its sizes, strides or storage offset changed (transpose_, as_strided_).
  bool mutates_metadata = false;
  /// It required grad when the function was compiled.
  bool requires_grad = false;
  /// It had no autograd history (a leaf) when the function was compiled.
  bool is_leaf = true;
  /// Every data write happened where autograd did not record it (under
  /// NoGradGuard): the write-back copies under no_grad too, so it adds no
  /// history to the caller's tensor (the seed's
  /// mutations_under_no_grad_or_inference_mode).
  bool mutations_under_no_grad = false;
  /// The write stays inside the compiled graph as a trailing aten::copy_
  /// (keep_inference_input_mutations), so no epilogue applies it (the seed's
  /// MutationType::MUTATED_IN_GRAPH).
  bool mutation_in_graph = false;
  /// With mutates_metadata: the input's sizes and strides after the call.
  std::vector<int64_t> final_sizes;
  std::vector<int64_t> final_strides;
  /// With mutates_metadata: storage_offset() after the call minus
  /// storage_offset() before, in elements (not bytes); 0 otherwise.
  int64_t final_offset_delta = 0;
  /// The function accumulated a gradient into its .grad (a .backward()
  /// inside it reached this module parameter or lifted tensor): the graph
  /// returns the gradient and the runtime wrapper adds it to the caller's
  /// .grad, as eager's backward does. See Note [Gradients a function accumulates].
  bool accumulates_grad = false;

  bool operator==(const InputAliasInfo&) const = default;
};

/// What an output is to the function's inputs and other outputs (the
/// seed's OutputType).
enum class OutputType : uint8_t {
  /// A fresh tensor: the compiled graph computes it and, on the autograd
  /// path, it gets a tangent if it requires grad.
  non_alias,
  /// A view of input `base_idx`: not a graph output; regenerated from the
  /// caller's input after the call (see Note [Regenerating aliased outputs]).
  alias_of_input,
  /// Input `base_idx` itself: the caller's tensor is returned.
  is_input,
  /// A view of an intermediate of the graph: the graph returns the view and,
  /// on the autograd path, its base as intermediate base `base_idx`; the view
  /// is regenerated from the base so autograd sees it as a view.
  alias_of_intermediate,
  /// A view of output `base_idx` (a non_alias output; also the second of two
  /// identical outputs): regenerated from that output.
  alias_of_intermediate_base_is_user_output,
};

/// The enumerator's name ("non_alias", "alias_of_input", ...), for messages.
/// Never throws; a value outside the enumeration gives "?".
std::string_view to_string(OutputType type);

/// One output (the seed's OutputAliasInfo).
struct OutputAliasInfo {
  OutputType output_type = OutputType::non_alias;
  /// The input, intermediate base or output the alias is of (unset for non_alias).
  std::optional<size_t> base_idx;
  /// Its metadata when the function was compiled (requires_grad included).
  ir::TensorMeta meta;
  /// For aliases: its storage offset minus its base's at the start of the
  /// call, in elements of the output's dtype (not bytes; the base's offset
  /// converted to them, Note [Views with another dtype]); 0 for non_alias
  /// and is_input.
  int64_t offset_delta = 0;

  bool operator==(const OutputAliasInfo&) const = default;
};

/// The whole analysis of one compilation's flat function over its flat
/// arguments.
struct ViewAndMutationMeta {
  /// One per flat argument.
  std::vector<InputAliasInfo> input_info;
  /// One per output of the function.
  std::vector<OutputAliasInfo> output_info;
  /// Bases of alias_of_intermediate outputs, which the graph returns on the
  /// autograd path (one per distinct base, in order of first use).
  std::vector<ir::TensorMeta> intermediate_bases;
  /// The analysis ran with gradients (the autograd path).
  bool is_train = false;
  /// The graph takes a Philox seed and offset as its last two inputs
  /// (see functionalized_rng_wrapper.h).
  bool is_rng_op_functionalized = false;

  /// Inputs whose mutation an epilogue applies after the call (data or
  /// metadata, not kept in the graph), in input order: the seed's
  /// mutated_inp_runtime_indices.
  std::vector<size_t> mutated_inp_runtime_indices() const;
  /// Inputs whose new data the graph returns (mutates_data, not in graph),
  /// in input order. See Note [Forward graph outputs].
  std::vector<size_t> mutated_data_inputs() const;
  /// Inputs whose .grad the function accumulates into (accumulates_grad),
  /// in input order: the graph returns their gradients last.
  std::vector<size_t> grad_accumulating_inputs() const;
  /// Outputs the graph computes (non_alias and the aliases of
  /// intermediates and of outputs), in output order.
  std::vector<size_t> graph_computed_outputs() const;
  /// True when any output is anything but non_alias.
  bool has_aliased_outputs() const;

  /// Every field, one line per input and output: for error messages, and
  /// part of the trace cache's key (Note [AOT trace cache]).
  std::string to_string() const;

  bool operator==(const ViewAndMutationMeta&) const = default;
};

// Note [Forward graph outputs]
// The graph compiled for a call (the forward of the autograd path, or the
// inference graph) returns, in order:
//   1. the user outputs the graph computes (graph_computed_outputs()):
//      non_alias outputs, and aliases of intermediates (which the runtime
//      wrapper turns back into views of their bases);
//   2. on the autograd path, the intermediate bases;
//   3. the new value of every input whose data it writes and whose write is
//      not kept in the graph (mutated_data_inputs()), in input order;
//   4. on the autograd path, the saved values for the backward; on the
//      inference path, the gradient of every input whose .grad the function
//      accumulates into (grad_accumulating_inputs()), in input order.
// Outputs that alias an input, and metadata-only input mutations, are not
// graph outputs: the runtime wrapper recreates them from the caller's
// tensors with the recorded sizes, strides and offset. The seed keeps them
// as graph outputs and reads their metadata at run time; here the guards fix
// the inputs' sizes and strides, so the recorded metadata is the run-time
// metadata and the graph need not compute them.

// Note [Gradients a function accumulates]
// A function that calls .backward() itself (a whole training step) leaves
// gradients in the .grad of the leaves it reached. For module parameters and
// lifted tensors (the tensors the function reads itself) the tracer returns
// them as Gradient outputs (functional_call's gradients_as_outputs, Note
// [Lifted tensors]); the metadata analysis marks those inputs
// accumulates_grad, the inference graph returns their gradients last, and
// the runtime wrapper adds each to the caller's .grad, or sets it when the
// .grad is undefined, as AccumulateGrad does. The trace ran AccumulateGrad,
// so the gradient the graph returns is laid out as its layout contract lays
// out .grad (a weight stored transposed gets a transposed .grad), and a
// backend keeps that layout (Note [Eager's strides at the outputs] in
// inductor/src/fx_passes/layout_opt.cpp). A gradient accumulated into a
// tensor passed as an argument is refused (AotError): the caller would have
// to find it on a copy. On the autograd path a function that runs its own
// backward is refused too: its gradients would not reach the caller's graph.

}  // namespace crucible::autograd
