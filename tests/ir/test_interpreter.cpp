// The interpreter against the same ATen calls made directly, value freeing,
// and the errors it throws.
#include <crucible/ir/error.h>
#include <crucible/ir/interpreter.h>
#include <crucible/ir/verifier.h>

#include <ATen/ATen.h>
#include <torch/library.h>

#include "catch.h"
#include "testing.h"

using namespace crucible::ir;

namespace {

// Builds a graph next to the eager computation it stands for: each call
// records the eager results' metadata on its result Values.
struct Builder {
  Graph g;
  Value* input(std::string_view name, const at::Tensor& t) { return g.add_placeholder(name, TensorMeta::of(t)); }
  Node* call(std::string_view op, std::vector<Argument> args, const std::vector<at::Tensor>& eager,
             std::optional<size_t> list_size = {}) {
    Node* n = g.add_call(op, std::move(args), list_size);
    for (size_t i = 0; i < eager.size(); ++i)
      if (eager[i].defined()) n->result(i)->set_meta(TensorMeta::of(eager[i]));
    return n;
  }
};

using IntList = std::vector<int64_t>;

// Probes for the freeing test: `remember` watches its argument's TensorImpl,
// `check` records whether that TensorImpl has been freed by the time it runs.
c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl> g_watched{
    c10::make_intrusive<c10::TensorImpl, c10::UndefinedTensorImpl>(c10::DispatchKeySet(), caffe2::TypeMeta(),
                                                                   std::nullopt)};
bool g_freed_at_check = false;

at::Tensor remember(const at::Tensor& x) {
  g_watched = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>(x.getIntrusivePtr());
  return x.neg();
}

at::Tensor check(const at::Tensor& x) {
  g_freed_at_check = g_watched.expired();
  return x.neg();
}

}  // namespace

TORCH_LIBRARY(crucible_test, m) {
  m.def("remember(Tensor x) -> Tensor", &remember);
  m.def("check(Tensor x) -> Tensor", &check);
}

TEST_CASE("interpreter runs a 24-op graph exactly as direct ATen calls", "[ir][interpreter]") {
  at::manual_seed(0);
  const auto x = at::randn({4, 8}), w = at::randn({16, 8}), b = at::randn({16});
  const auto img = at::randn({2, 3, 8, 8}), conv_w = at::randn({4, 3, 3, 3}), conv_b = at::randn({4});
  const auto idx = at::tensor(IntList{3, 0, 2});
  const auto scale = at::full({4, 1, 1}, 0.5);

  // Eager: the same kernels the boxed calls reach, so results are bitwise equal.
  const auto t = at::t(w);
  const auto addmm = at::addmm(b, x, t);
  const auto relu = at::relu(addmm);
  const auto softmax = at::_softmax(relu, 1, false);
  const auto [ln, ln_mean, ln_rstd] = at::native_layer_norm(softmax, {16}, {}, {}, 1e-5);
  const auto mm = at::mm(ln, w);
  const auto cat = at::cat({mm, x, mm}, 0);
  const auto index = at::index(cat, {idx});
  const auto index2 = at::index(mm, {std::nullopt, idx});
  const auto split = at::split(cat, 4, 0);
  const auto add = at::add(split[0], split[2], 2);
  const auto sum = at::sum(add, {1});
  const auto view = add.view({8, 4});
  const auto permute = view.permute({1, 0});
  const auto contiguous = permute.contiguous();
  const auto conv = at::convolution(img, conv_w, conv_b, {1, 1}, {1, 1}, {1, 1}, false, {0, 0}, 1);
  const auto scaled = at::mul(conv, scale);
  const auto mean = at::mean(scaled, {2, 3});
  const int64_t size0 = mean.size(0);
  const auto add_s = at::add(sum, size0);
  auto cl = mean.clone();
  cl.relu_();
  const auto [mx, mx_idx] = at::max(mean, 1);
  const auto sq = at::mul(mean, mean);

  Builder B;
  Value* vx = B.input("x", x);
  Value* vw = B.input("w", w);
  Value* vb = B.input("b", b);
  Value* vimg = B.input("img", img);
  Value* vcw = B.input("conv_w", conv_w);
  Value* vcb = B.input("conv_b", conv_b);
  Value* vidx = B.input("idx", idx);
  Value* vscale = B.g.add_constant(scale, "scale");
  Value* nt = B.call("aten::t", {vw}, {t})->result();
  Value* naddmm = B.call("aten::addmm", {vb, vx, nt}, {addmm})->result();
  Value* nrelu = B.call("aten::relu", {naddmm}, {relu})->result();
  Value* nsoftmax = B.call("aten::_softmax", {nrelu, int64_t{1}, false}, {softmax})->result();
  Node* nln = B.call("aten::native_layer_norm", {nsoftmax, IntList{16}, c10::IValue(), c10::IValue(), 1e-5},
                     {ln, ln_mean, ln_rstd});
  Value* nmm = B.call("aten::mm", {nln->result(0), vw}, {mm})->result();
  Value* ncat = B.call("aten::cat", {Argument::ValueList{nmm, vx, nmm}, int64_t{0}}, {cat})->result();
  Value* nindex = B.call("aten::index.Tensor", {ncat, Argument::ValueList{vidx}}, {index})->result();
  Value* nindex2 = B.call("aten::index.Tensor", {nmm, Argument::ValueList{nullptr, vidx}}, {index2})->result();
  Node* nsplit = B.call("aten::split.Tensor", {ncat, int64_t{4}, int64_t{0}}, split, split.size());
  Value* nadd = B.call("aten::add.Tensor", {nsplit->result(0), nsplit->result(2), int64_t{2}}, {add})->result();
  Value* nsum = B.call("aten::sum.dim_IntList", {nadd, IntList{1}, false, c10::IValue()}, {sum})->result();
  Value* nview = B.call("aten::view", {nadd, IntList{8, 4}}, {view})->result();
  Value* npermute = B.call("aten::permute", {nview, IntList{1, 0}}, {permute})->result();
  Value* ncontig = B.call("aten::contiguous", {npermute, c10::MemoryFormat::Contiguous}, {contiguous})->result();
  Value* nconv =
      B.call("aten::convolution",
             {vimg, vcw, vcb, IntList{1, 1}, IntList{1, 1}, IntList{1, 1}, false, IntList{0, 0}, int64_t{1}}, {conv})
          ->result();
  Value* nscaled = B.call("aten::mul.Tensor", {nconv, vscale}, {scaled})->result();
  Value* nmean = B.call("aten::mean.dim", {nscaled, IntList{2, 3}, false, c10::IValue()}, {mean})->result();
  Value* nsize = B.call("aten::sym_size.int", {nmean, int64_t{0}}, {})->result();  // an int result
  Value* nadd_s = B.call("aten::add.Scalar", {nsum, nsize, int64_t{1}}, {add_s})->result();
  Value* ncl = B.call("aten::clone", {nmean, c10::IValue()}, {cl})->result();
  B.call("aten::relu_", {ncl}, {cl});  // in place: the output %clone sees it
  Node* nmax = B.call("aten::max.dim", {nmean, int64_t{1}, false}, {mx, mx_idx});
  Value* nsq = B.call("aten::mul.Tensor", {nmean, nmean}, {sq})->result();
  // Outputs include a placeholder, a constant and one value twice.
  B.g.set_output({nln->result(1), nln->result(2), nindex, nindex2, nsplit->result(1), nadd_s, ncontig, ncl,
                  nmax->result(0), nmax->result(1), nsq, nsq, vx, vscale});
  const std::vector<at::Tensor> expected{ln_mean, ln_rstd, index,  index2, split[1], add_s, contiguous,
                                         cl,      mx,      mx_idx, sq,     sq,       x,     scale};
  REQUIRE(B.g.num_nodes() - 9 >= 24);  // 7 placeholders, the constant, the output
  REQUIRE_NOTHROW(verify(B.g));

  Interpreter interp(B.g);
  std::vector<at::Tensor> inputs{x, w, b, img, conv_w, conv_b, idx};
  auto out = interp.run(inputs);
  REQUIRE(inputs.empty());  // consumed
  REQUIRE(out.size() == expected.size());
  for (size_t i = 0; i < out.size(); ++i) {
    INFO("output " << i);
    REQUIRE_EQUAL_TENSORS(out[i], expected[i]);
  }
  REQUIRE(out[12].is_same(x));  // a placeholder output is the input itself
  REQUIRE(out[13].is_same(scale));

  // Runs again with the same result (the plan is reusable) and via operator().
  auto again = interp({x, w, b, img, conv_w, conv_b, idx});
  REQUIRE_EQUAL_TENSORS(again[6], contiguous);
}

TEST_CASE("interpret() is a Backend that owns a copy of the graph", "[ir][interpreter]") {
  CompiledFn fn;
  const auto x = at::randn({3, 5});
  {
    Graph g;
    Value* vx = g.add_placeholder("x", TensorMeta::of(x));
    Node* relu = g.add_call("aten::relu", {vx});
    Node* sm = g.add_call("aten::_log_softmax", {relu->result(), int64_t{-1}, false});
    g.set_output({sm->result()});
    fn = interpret(g, {x});
  }  // the graph is gone; fn still runs
  std::vector<at::Tensor> in{x};
  auto out = fn(in);
  REQUIRE(in.empty());
  REQUIRE_EQUAL_TENSORS(out.at(0), at::_log_softmax(at::relu(x), -1, false));
}

TEST_CASE("interpreter frees an intermediate right after its last use", "[ir][interpreter]") {
  const auto x = at::randn({16});
  auto build = [&](bool keep_relu) {
    Graph g;
    Value* vx = g.add_placeholder("x", TensorMeta::of(x));
    Value* relu = g.add_call("aten::relu", {vx})->result();
    Value* r = g.add_call("crucible_test::remember", {relu})->result();  // last use of %relu
    Value* c = g.add_call("crucible_test::check", {r})->result();
    g.set_output(keep_relu ? std::vector<Value*>{c, relu} : std::vector<Value*>{c});
    return g;
  };
  Graph freed = build(false);
  auto out = Interpreter(freed)({x});
  REQUIRE(g_freed_at_check);                      // %relu died before %check ran, not at the end of the run
  REQUIRE_EQUAL_TENSORS(out.at(0), at::relu(x));  // neg(neg(relu(x)))

  Graph kept = build(true);
  out = Interpreter(kept)({x});
  REQUIRE_FALSE(g_freed_at_check);  // an output lives to the end
  REQUIRE_EQUAL_TENSORS(out.at(1), at::relu(x));
}

TEST_CASE("interpreter errors name the node and say what went wrong", "[ir][interpreter]") {
  Graph g;
  Value* a = g.add_placeholder("a", TensorMeta::contiguous({2, 3}));
  Value* b = g.add_placeholder("b", TensorMeta::contiguous({3, 4}));
  Node* mm = g.add_call("aten::mm", {a, b});
  g.set_output({mm->result()});
  Interpreter interp(g);
  REQUIRE_THROWS_WITH(interp({at::randn({2, 3})}), CRUCIBLE_HAS_SUBSTR("takes 2 inputs (one per placeholder), got 1"));
  REQUIRE_THROWS_AS(interp({at::randn({2, 3}), at::randn({5, 4})}), IrError);
  REQUIRE_THROWS_WITH(interp({at::randn({2, 3}), at::randn({5, 4})}), CRUCIBLE_HAS_SUBSTR("%mm (aten::mm) failed"));
  REQUIRE_THROWS_WITH(interp({at::randn({2, 3}), at::randn({5, 4})}), CRUCIBLE_HAS_SUBSTR("cannot be multiplied"));

  Graph no_output;
  no_output.add_placeholder("a", TensorMeta::contiguous({2}));
  REQUIRE_THROWS_WITH(Interpreter(no_output), CRUCIBLE_HAS_SUBSTR("no output node"));

  Graph int_output;
  Value* c = int_output.add_placeholder("c", TensorMeta::contiguous({2}));
  int_output.set_output({int_output.add_call("aten::sym_size.int", {c, int64_t{0}})->result()});
  REQUIRE_THROWS_WITH(Interpreter(int_output), CRUCIBLE_HAS_SUBSTR("returns tensors only"));
}
