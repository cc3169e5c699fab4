// Private: the graphs the two dispatch paths compile, also exported by
// aot_export_joint_simple.
#pragma once

#include <crucible/autograd/aot_request.h>
#include <crucible/ir/graph.h>

#include <cstddef>
#include <vector>

namespace crucible::autograd::detail {

/// The joint graph of request.flat_fn (Note [AOT dispatch], Note [Joint
/// graph contract]) and what the autograd Function needs to call its parts.
struct JointGraph {
  ir::Graph graph;
  size_t num_fwd_outputs = 0;
  std::vector<size_t> tangent_outputs;  // forward outputs that have a tangent
  std::vector<ir::TensorMeta> tangent_meta;
};

/// Traces the joint graph; request.fw_metadata must be the training analysis.
JointGraph create_joint_graph(const AotRequest& request);

/// Traces the inference graph under no_grad (Note [Forward graph outputs]),
/// turning the writes that request.fw_metadata keeps in the graph
/// (mutation_in_graph) into trailing aten::copy_ nodes.
ir::Graph create_inference_graph(const AotRequest& request);

}  // namespace crucible::autograd::detail
