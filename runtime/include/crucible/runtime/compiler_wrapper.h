// CompilerWrapper: the prologue/epilogue pairs AOTAutograd puts around a
// compiler call, as torch/_functorch/_aot_autograd/runtime_wrappers.py's
// CompilerWrapper defines them.
#pragma once

#include <crucible/ir/backend.h>
#include <crucible/ir/graph.h>

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

namespace crucible::runtime {

// Note [Compiler wrapper order]
// A wrapper edits what goes into a compiler (pre_compile: the graph or
// function, its example inputs, its metadata) and what comes out of it
// (post_compile: the compiled callable). Wrappers are applied like nested
// function calls: the first wrapper's pre_compile sees the request as the
// user made it and the last one's sees it just before the compiler, so on the
// way out the last wrapper's post_compile wraps the compiled callable first
// and the first wrapper's post_compile wraps outermost. Hence pre_compile in
// list order, post_compile in reverse. Example: a dedupe wrapper listed first
// removes duplicate inputs before every later wrapper looks at the inputs,
// and at runtime its epilogue is the first thing to see the user's arguments
// (it drops the duplicates before the inner wrappers run).
//
// A wrapper keeps whatever its post_compile needs from its pre_compile in its
// own members (the seed's "extra metadata via attributes"); what it puts into
// the returned callable must be captured by value, since the wrapper object
// may be reused for another compile.

/// One prologue/epilogue pair around a compiler. `Request` is what the
/// compiler consumes: `GraphRequest` for ir::Backend chains; the autograd
/// library uses a request holding a flat function, its arguments and its
/// ViewAndMutationMeta. See Note [Compiler wrapper order].
template <typename Request>
class CompilerWrapper {
 public:
  virtual ~CompilerWrapper() = default;

  /// A short name for timing reports and error messages ("AOTDedupeWrapper").
  virtual std::string_view name() const = 0;

  /// Edits the request before the compiler (and before later wrappers) sees it.
  virtual void pre_compile(Request& request) { (void)request; }

  /// Wraps the compiled callable. `request` is the request after every
  /// wrapper's pre_compile ran (the seed's runtime_metadata).
  virtual ir::CompiledFn post_compile(ir::CompiledFn compiled, const Request& request) {
    (void)request;
    return compiled;
  }
};

template <typename Request>
using WrapperList = std::vector<std::shared_ptr<CompilerWrapper<Request>>>;

/// Runs every wrapper's pre_compile in order, then `compile`, then every
/// post_compile in reverse order, and returns the outermost callable.
/// See Note [Compiler wrapper order]. Exceptions from any step propagate.
template <typename Request>
ir::CompiledFn compile_with_wrappers(const WrapperList<Request>& wrappers, Request request,
                                     const std::function<ir::CompiledFn(Request&)>& compile) {
  for (const auto& w : wrappers) w->pre_compile(request);
  ir::CompiledFn fn = compile(request);
  for (auto it = wrappers.rbegin(); it != wrappers.rend(); ++it) fn = (*it)->post_compile(std::move(fn), request);
  return fn;
}

/// What an ir::Backend consumes: a graph and one example input per placeholder.
struct GraphRequest {
  ir::Graph graph;
  std::vector<at::Tensor> example_inputs;
};

using GraphWrapper = CompilerWrapper<GraphRequest>;

/// An ir::Backend that runs `wrappers` around `backend`: each call clones the
/// graph into a GraphRequest, runs the chain (see compile_with_wrappers) and
/// returns the outermost callable. Throws WrapperError if `backend` is empty.
ir::Backend wrap_backend(WrapperList<GraphRequest> wrappers, ir::Backend backend);

}  // namespace crucible::runtime
