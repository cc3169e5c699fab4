// The reference backend: runs a Graph node by node through the c10
// dispatcher, like torch.fx.Interpreter over a make_fx graph.
#pragma once

#include <crucible/ir/backend.h>
#include <crucible/ir/graph.h>

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

namespace crucible::ir {

/// Runs a graph on real tensors with boxed dispatcher calls. Every value is
/// freed right after its last use, so peak memory is that of the schedule.
/// The graph must outlive the Interpreter and must not change while it lives.
class Interpreter {
 public:
  /// Plans the run (operator handles, last uses). Throws IrError if the graph
  /// has no output node.
  explicit Interpreter(const Graph& graph);
  ~Interpreter();
  Interpreter(Interpreter&&) noexcept;
  Interpreter& operator=(Interpreter&&) noexcept;

  /// Runs the graph. `inputs` holds one tensor per placeholder, in order; it
  /// is consumed (cleared) so inputs can be freed early. Returns the outputs
  /// in order. Throws IrError naming the node (and its op) whose kernel
  /// failed, with the kernel's message, or if the input count is wrong.
  std::vector<at::Tensor> run(std::vector<at::Tensor>& inputs) const;
  /// Convenience: copies `inputs` first.
  std::vector<at::Tensor> operator()(const std::vector<at::Tensor>& inputs) const;

 private:
  struct Plan;
  std::unique_ptr<Plan> plan_;
};

/// The interpreter as a Backend: keeps its own copy of the graph.
CompiledFn interpret(const Graph& graph, const std::vector<at::Tensor>& example_inputs = {});

}  // namespace crucible::ir
