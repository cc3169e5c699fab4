// The wrapper chain around a real backend (the interpreter): order of
// pre_compile and post_compile, edits seen by later wrappers, results vs eager.
#include <crucible/ir/interpreter.h>
#include <crucible/runtime/compiler_wrapper.h>
#include <crucible/runtime/error.h>

#include <ATen/ATen.h>

#include "catch.h"
#include "testing.h"

using namespace crucible;
using runtime::GraphRequest;
using runtime::GraphWrapper;

namespace {

// Logs each hook; at runtime logs "call NAME" before running the inner callable.
class LoggingWrapper : public GraphWrapper {
 public:
  LoggingWrapper(std::string name, std::vector<std::string>& log) : name_(std::move(name)), log_(log) {}
  std::string_view name() const override { return name_; }
  void pre_compile(GraphRequest& request) override {
    log_.push_back("pre " + name_ + " nodes=" + std::to_string(request.graph.num_nodes()));
  }
  ir::CompiledFn post_compile(ir::CompiledFn compiled, const GraphRequest& request) override {
    log_.push_back("post " + name_ + " nodes=" + std::to_string(request.graph.num_nodes()));
    return [name = name_, &log = log_, compiled = std::move(compiled)](std::vector<at::Tensor>& args) {
      log.push_back("call " + name);
      return compiled(args);
    };
  }

 private:
  std::string name_;
  std::vector<std::string>& log_;
};

// Appends relu to the graph's output, as a graph-editing prologue does.
class ReluWrapper : public GraphWrapper {
 public:
  std::string_view name() const override { return "relu"; }
  void pre_compile(GraphRequest& request) override {
    ir::Value* out = request.graph.outputs().at(0);
    ir::Node* relu = request.graph.add_call("aten::relu", {out});
    relu->result()->set_meta(out->meta());
    request.graph.set_output({relu->result()});
  }
};

// y = x * 2 + b
ir::Graph affine(const at::Tensor& x, const at::Tensor& b) {
  ir::Graph g;
  ir::Value* px = g.add_placeholder("x", ir::TensorMeta::of(x));
  ir::Value* pb = g.add_placeholder("b", ir::TensorMeta::of(b));
  ir::Node* mul = g.add_call("aten::mul.Scalar", {px, c10::Scalar(2.0)});
  mul->result()->set_meta(ir::TensorMeta::of(x));
  ir::Node* add = g.add_call("aten::add.Tensor", {mul->result(), pb, c10::Scalar(1)});
  add->result()->set_meta(ir::TensorMeta::of(x));
  g.set_output({add->result()});
  return g;
}

}  // namespace

TEST_CASE("wrappers run pre_compile in order and post_compile in reverse around the interpreter",
          "[runtime][wrapper]") {
  at::manual_seed(0);
  const auto x = at::randn({4, 5}), b = at::randn({4, 5});
  const ir::Graph g = affine(x, b);
  std::vector<std::string> log;
  runtime::WrapperList<GraphRequest> wrappers{std::make_shared<LoggingWrapper>("A", log),
                                              std::make_shared<ReluWrapper>(),
                                              std::make_shared<LoggingWrapper>("C", log)};
  ir::Backend backend = runtime::wrap_backend(wrappers, ir::interpret);
  ir::CompiledFn fn = backend(g, {x, b});
  // A sees the graph as given (2 placeholders, mul, add, output = 5 nodes),
  // C sees it after the relu wrapper's edit; both posts see the final graph.
  REQUIRE(log == std::vector<std::string>{"pre A nodes=5", "pre C nodes=6", "post C nodes=6", "post A nodes=6"});
  log.clear();
  std::vector<at::Tensor> args{x, b};
  const auto out = fn(args);
  // At runtime the first wrapper's epilogue is outermost.
  REQUIRE(log == std::vector<std::string>{"call A", "call C"});
  REQUIRE(out.size() == 1);
  // Same kernels as the boxed calls, so bitwise equal.
  REQUIRE_EQUAL_TENSORS(out[0], at::relu(x * 2 + b));
  // The caller's graph is untouched.
  REQUIRE(g.num_nodes() == 5);
}

TEST_CASE("compile_with_wrappers hands the edited request to the compiler", "[runtime][wrapper]") {
  const auto x = at::randn({3}), b = at::randn({3});
  runtime::WrapperList<GraphRequest> wrappers{std::make_shared<ReluWrapper>(), std::make_shared<ReluWrapper>()};
  size_t compiled_nodes = 0;
  ir::CompiledFn fn =
      runtime::compile_with_wrappers<GraphRequest>(wrappers, GraphRequest{affine(x, b), {x, b}}, [&](GraphRequest& r) {
        compiled_nodes = r.graph.num_nodes();
        return ir::interpret(r.graph, r.example_inputs);
      });
  REQUIRE(compiled_nodes == 7);
  std::vector<at::Tensor> args{x, b};
  REQUIRE_EQUAL_TENSORS(fn(args)[0], at::relu(at::relu(x * 2 + b)));
}

TEST_CASE("wrap_backend refuses an empty backend", "[runtime][wrapper]") {
  REQUIRE_THROWS_WITH(runtime::wrap_backend({}, ir::Backend()), CRUCIBLE_HAS_SUBSTR("backend is empty"));
}
