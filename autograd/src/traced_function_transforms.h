// Private: the pieces the dispatch and export paths build their traced
// functions and graphs from (the seed's traced_function_transforms.py).
#pragma once

#include <crucible/autograd/aot_request.h>
#include <crucible/ir/graph.h>

#include <vector>

namespace crucible::autograd::detail {

/// The tensors the function is given in a trace, for the traced `args`
/// (the seed's maybe_to_fresh_input). With `for_autograd`, a user input
/// that requires grad and is written (data or metadata) is replaced by a
/// clone, so autograd::grad sees it before the write and the write is legal
/// on a traced leaf; an input whose metadata alone is written is replaced by
/// an alias (aten::alias), so the traced input itself keeps its metadata
/// (the runtime wrapper applies the recorded one). Reached inputs (module
/// state, lifted tensors: `reached`, one per argument or fewer) are never
/// replaced: the function reads those tensors itself.
std::vector<at::Tensor> fresh_inputs(const std::vector<at::Tensor>& args, const ViewAndMutationMeta& meta,
                                     const std::vector<bool>& reached, bool for_autograd);

/// Keeps the first `count` outputs of a traced graph: drops what the
/// tracer appended after them (the new values of written inputs, which the
/// traced function already returned itself).
void keep_first_outputs(ir::Graph& graph, size_t count);

/// Marks the placeholders of a traced graph: the first num_params_buffers as
/// Parameter (requiring grad) or Buffer when the trace left them user
/// inputs, and the functionalized-RNG seed and offset (the last two of the
/// first `num_primals`) as State.
void mark_inputs(ir::Graph& graph, const AotRequest& request, size_t num_primals);

/// Adds `aten::copy_(input, value)` before the output node for every
/// (input, value) pair: a data write kept in the graph.
void add_input_copies(ir::Graph& graph, const std::vector<std::pair<size_t, ir::Value*>>& writes);

}  // namespace crucible::autograd::detail
