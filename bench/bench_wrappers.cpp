// Host overhead of a compiled call through the CompilerWrapper chain: a
// one-node graph (x + y on 1-element tensors), so the time is the wrappers'
// epilogues plus the interpreter's dispatch, not work. Compared with the
// interpreter alone and with the direct at::add call.
#include <crucible/ir/interpreter.h>
#include <crucible/runtime/compiler_wrapper.h>

#include <ATen/ATen.h>
#include <benchmark/benchmark.h>

namespace {

using namespace crucible;

ir::Graph tiny_graph() {
  ir::Graph g;
  ir::Value* x = g.add_placeholder("x", ir::TensorMeta::contiguous({1}));
  ir::Value* y = g.add_placeholder("y", ir::TensorMeta::contiguous({1}));
  ir::Value* v = g.add_call("aten::add.Tensor", {x, y})->result();
  v->set_meta(ir::TensorMeta::contiguous({1}));
  g.set_output({v});
  return g;
}

// An epilogue of the shape the runtime wrappers have: look at the arguments
// (here: count the defined ones), call the inner callable, pass results on.
class PassThroughWrapper : public runtime::GraphWrapper {
 public:
  std::string_view name() const override { return "pass_through"; }
  ir::CompiledFn post_compile(ir::CompiledFn compiled, const runtime::GraphRequest&) override {
    return [compiled = std::move(compiled)](std::vector<at::Tensor>& args) {
      size_t defined = 0;
      for (const auto& a : args) defined += a.defined();
      benchmark::DoNotOptimize(defined);
      return compiled(args);
    };
  }
};

void BM_WrappedCall(benchmark::State& state) {
  runtime::WrapperList<runtime::GraphRequest> wrappers;
  for (int64_t i = 0; i < state.range(0); ++i) wrappers.push_back(std::make_shared<PassThroughWrapper>());
  const ir::Graph g = tiny_graph();
  const at::Tensor x = at::ones({1}), y = at::ones({1});
  const ir::CompiledFn fn = runtime::wrap_backend(wrappers, ir::interpret)(g, {x, y});
  for (auto _ : state) {
    std::vector<at::Tensor> args{x, y};
    benchmark::DoNotOptimize(fn(args));
  }
}

void BM_DirectAdd(benchmark::State& state) {
  const at::Tensor x = at::ones({1}), y = at::ones({1});
  for (auto _ : state) benchmark::DoNotOptimize(at::add(x, y));
}

}  // namespace

// 0 wrappers: the interpreter alone; 5: about as many as an AOT call stacks.
BENCHMARK(BM_WrappedCall)->Arg(0)->Arg(5)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_DirectAdd)->Unit(benchmark::kMicrosecond);
