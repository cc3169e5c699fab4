// Metadata propagation and the verifier's meta check: the metadata derived on
// meta tensors is what running the graph's kernels on real tensors gives;
// wrong metadata is reported at the first node with both metas; devices
// follow the inputs without a GPU; ops without a Meta kernel run on CPU
// stand-ins without touching the random stream.
#include <crucible/ir/error.h>
#include <crucible/ir/interpreter.h>
#include <crucible/ir/meta_call.h>
#include <crucible/ir/parser.h>
#include <crucible/ir/pass_manager.h>
#include <crucible/ir/printer.h>
#include <crucible/ir/propagate_meta.h>
#include <crucible/ir/verifier.h>

#include <ATen/ATen.h>

#include "catch.h"
#include "graph_equal.h"
#include "testing.h"

using namespace crucible::ir;
using crucible::testing::require_same_graph;

namespace {

// The metadata each tensor result of `g` has when the interpreter runs it on
// `inputs` (every result made an output of a copy of the graph), by name.
std::map<std::string, TensorMeta> real_metas(const Graph& g, const std::vector<at::Tensor>& inputs) {
  Graph probe = g.clone();
  std::vector<Value*> outs;
  for (Node* n : probe.nodes())
    if (n->is_call())
      for (const auto& r : n->results())
        if (r->is_tensor() && r->has_meta()) outs.push_back(r.get());
  probe.set_output(outs);
  std::vector<at::Tensor> copies;
  for (const at::Tensor& t : inputs) copies.push_back(t.clone());
  const auto results = Interpreter(probe).run(copies);
  std::map<std::string, TensorMeta> metas;
  for (size_t i = 0; i < outs.size(); ++i) metas[outs[i]->name()] = TensorMeta::of(results[i]);
  return metas;
}

// Every tensor result's metadata set to a wrong f32[1].
void clobber(Graph& g) {
  for (Node* n : g.nodes())
    if (n->is_call())
      for (const auto& r : n->results())
        if (r->is_tensor() && r->has_meta()) r->set_meta(TensorMeta::contiguous({1}));
}

}  // namespace

TEST_CASE("derived metadata is what the kernels give on real tensors: views, in-place ops, metadata mutation",
          "[ir][meta]") {
  // Views share storage with their base, so an in-place transpose_ of a
  // base is seen by what reads it afterwards, and views of views keep their
  // offsets; expand gives 0 strides, permute and channels_last clones keep
  // their layouts, reductions and comparisons change dtype.
  Graph g = parse(R"(
    %x : f32[4, 6] = placeholder()
    %idx : i64[3] = placeholder()
    %c : f32[4, 6] = aten::clone(%x)
    %t : f32[6, 4] stride=[1, 6] = aten::transpose_(%c, 0, 1)
    %m : f32[6, 4] = aten::mul.Scalar(%c, 2)
    %s : f32[6, 2] stride=[4, 1] offset=1 = aten::slice.Tensor(%m, 1, 1, 3)
    %d : f32[6] stride=[5] offset=1 = aten::diagonal(%m, 0, 0, 1)
    %e : f32[2, 6, 2] stride=[0, 4, 1] offset=1 = aten::expand(%s, [2, 6, 2])
    %p : f32[2, 6, 2] stride=[0, 4, 1] offset=1 = aten::permute(%e, [0, 1, 2])
    %cl : f32[2, 6, 2] = aten::clone(%p)
    %u : f32[6, 1, 4] = aten::unsqueeze(%m, 1)
    %ul : f32[6, 1, 4] = aten::clone(%u, memory_format=contiguous_format)
    %sum : f64[4] = aten::sum.dim_IntList(%m, [0], False, dtype=f64)
    %gt : b8[6, 4] = aten::gt.Scalar(%m, 0)
    %ix : f32[3, 4] = aten::index.Tensor(%m, [%idx])
    return (%t, %d, %cl, %ul, %sum, %gt, %ix, %x)
  )");
  const std::vector<at::Tensor> inputs{at::randn({4, 6}), at::tensor({0, 2, 5})};
  auto real = real_metas(g, inputs);
  clobber(g);
  REQUIRE(propagate_meta(g) == real.size());
  // A Value's metadata is what it had where it was defined: %c before the
  // transpose_ that changed it in place (the run ends with it transposed).
  REQUIRE(g.find_value("c")->meta() == TensorMeta::contiguous({4, 6}));
  REQUIRE(real.at("c").sizes == std::vector<int64_t>{6, 4});
  real.erase("c");
  for (const auto& [name, meta] : real) {
    INFO("%" << name << ": derived " << to_string(g.find_value(name)->meta()) << ", real " << to_string(meta));
    REQUIRE(g.find_value(name)->meta() == meta);
  }
  REQUIRE(g.find_value("m")->meta().sizes == std::vector<int64_t>{6, 4});  // reads %c after transpose_
  REQUIRE(g.find_value("x")->meta() == TensorMeta::contiguous({4, 6}));    // placeholders keep theirs
}

TEST_CASE("the meta check names the first node whose sizes, strides, offset, dtype or device are wrong", "[ir][meta]") {
  const std::string head = R"(
    %x : f32[2, 3] = placeholder()
    %w : f32[3, 4] = placeholder()
    %mm : f32[2, 4] = aten::mm(%x, %w)
  )";
  const std::string tail = R"(
    %n : f32[2, 4] = aten::neg(%mm)
    return (%n)
  )";
  auto check = [&](const std::string& middle) {
    verify(parse(head + middle + tail), VerifyOptions{.check_meta = true});
  };
  REQUIRE_NOTHROW(check(""));
  REQUIRE_THROWS_WITH(check("%r : f32[2, 4] = aten::relu(%x)"),
                      CRUCIBLE_HAS_SUBSTR("node %r (aten::relu): result %r is recorded as f32[2, 4], but aten::relu "
                                          "gives f32[2, 3] from its inputs"));
  REQUIRE_THROWS_WITH(
      check("%t : f32[4, 2] = aten::t(%mm)"),
      CRUCIBLE_HAS_SUBSTR("result %t is recorded as f32[4, 2], but aten::t gives f32[4, 2] stride=[1, 4]"));
  REQUIRE_THROWS_WITH(check("%s : f32[2, 2] = aten::slice.Tensor(%mm, 1, 2)"),
                      CRUCIBLE_HAS_SUBSTR("but aten::slice.Tensor gives f32[2, 2] stride=[4, 1] offset=2"));
  REQUIRE_THROWS_WITH(check("%h : f32[2, 4] = aten::to.dtype(%mm, f16)"),
                      CRUCIBLE_HAS_SUBSTR("result %h is recorded as f32[2, 4], but aten::to.dtype gives f16[2, 4]"));
  REQUIRE_THROWS_WITH(
      check("%g : f32[2, 4] @cuda:0 = aten::neg(%mm)"),
      CRUCIBLE_HAS_SUBSTR("result %g is recorded as f32[2, 4] @cuda:0, but aten::neg gives f32[2, 4] from"));
  // Two wrong nodes: the first is named.
  REQUIRE_THROWS_WITH(check("%a : f32[9] = aten::neg(%x)\n%b : f32[9] = aten::neg(%w)"),
                      CRUCIBLE_HAS_SUBSTR("node %a (aten::neg)"));
  // The stride of a size-1 dimension moves to no other element: not compared.
  REQUIRE_NOTHROW(check("%u : f32[2, 1, 4] stride=[4, 99, 1] = aten::unsqueeze(%mm, 1)"));
  // requires_grad is not metadata an op derives: not compared.
  REQUIRE_NOTHROW(check("%q : f32[2, 4] grad = aten::neg(%mm)"));
  // Shapes that do not fit: the node, its op and its inputs' metadata.
  REQUIRE_THROWS_WITH(check("%bad : f32[2, 2] = aten::mm(%x, %x)"),
                      CRUCIBLE_HAS_SUBSTR("node %bad (aten::mm) fails on meta tensors of its inputs' metadata "
                                          "(%x : f32[2, 3], %x : f32[2, 3])"));
}

TEST_CASE("the pass manager checks metadata after each pass when asked, and names the pass", "[ir][meta]") {
  Graph g = parse(R"(
    %x : f32[2, 3] = placeholder()
    %n : f32[2, 3] = aten::neg(%x)
    return (%n)
  )");
  // A pass that adds a node and gives it the metadata of the one it replaces.
  const Pass widen{"widen", [](Graph& graph) {
                     Node* rep = graph.add_call("aten::repeat", {graph.find_value("x"), std::vector<int64_t>{2, 1}});
                     rep->result()->set_meta(graph.find_value("n")->meta());  // wrong: repeat gives [4, 3]
                     graph.set_output({rep->result()});
                   }};
  Graph f = g.clone();
  REQUIRE_NOTHROW(PassManager({widen}).run(f));  // the structure is fine
  Graph h = g.clone();
  REQUIRE_THROWS_WITH(PassManager({widen}, PassManagerOptions{.verify_meta = true}).run(h),
                      CRUCIBLE_HAS_SUBSTR("pass 'widen' left an invalid graph: verify: node %repeat (aten::repeat): "
                                          "result %repeat is recorded as f32[2, 3], but aten::repeat gives f32[4, 3]"));
  // propagate_meta, registered as a pass, repairs it.
  Graph k = g.clone();
  PassManager({widen, PassRegistry::builtin().get("propagate_meta")}, PassManagerOptions{.verify = false}).run(k);
  REQUIRE_NOTHROW(verify(k, VerifyOptions{.check_meta = true}));
  REQUIRE(k.find_value("repeat")->meta() == TensorMeta::contiguous({4, 3}));
}

TEST_CASE("devices are derived without a GPU: aliases, device arguments, the common device", "[ir][meta]") {
  Graph g = parse(R"(
    %x : f32[2, 3] @cuda:0 = placeholder()
    %s : f32[] = placeholder()
    %buf : f32[2, 3] = placeholder()
    %add : f32[2, 3] @cuda:0 = aten::add.Tensor(%s, %x)
    %host : f32[2, 3] = aten::_to_copy(%add, device=cpu)
    %copy : f32[2, 3] = aten::copy_(%buf, %add)
    %z : f64[4] @cuda:1 = aten::zeros([4], dtype=f64, device=cuda:1)
    %e : f32[] = aten::mul.Tensor(%s, %s)
    return (%host, %copy, %z, %e)
  )");
  REQUIRE_NOTHROW(verify(g, VerifyOptions{.check_meta = true}));
  const Graph before = g.clone();
  clobber(g);
  propagate_meta(g);
  require_same_graph(g, before);
}

TEST_CASE("ops without a Meta kernel run on CPU stand-ins, and draw nothing from the random stream", "[ir][meta]") {
  // aten::relu has no Meta kernel in LibTorch 2.11; a random op on the
  // stand-ins would draw from the default CPU generator.
  const c10::OperatorHandle relu = resolve_operator("aten::relu");
  torch::jit::Stack stack{at::empty_strided({3, 2}, {1, 3}, at::TensorOptions().device(at::kMeta))};
  torch::jit::Stack direct = stack;
  REQUIRE_THROWS_AS(relu.callBoxed(direct), c10::NotImplementedError);
  call_on_meta(relu, stack);
  REQUIRE(stack.size() == 1);
  REQUIRE(stack[0].toTensor().is_meta());
  REQUIRE(TensorMeta::of(stack[0].toTensor()).strides == std::vector<int64_t>{1, 3});

  // An in-place op on stand-ins returns the meta input itself.
  const at::Tensor m = at::empty({4}, at::TensorOptions().device(at::kMeta));
  torch::jit::Stack inplace{m};
  call_on_cpu_stand_ins(resolve_operator("aten::relu_"), inplace);
  REQUIRE(inplace[0].toTensor().is_same(m));

  Graph g = parse(R"(
    %x : f32[8, 8] = placeholder()
    %d : f32[8, 8], %mask : b8[8, 8] = aten::native_dropout(%x, 0.5, True)
    %r : f32[8, 8] = aten::rand_like(%x)
    %b : f32[8, 8] = aten::bernoulli.p(%r, 0.5)
    %rl : f32[8, 8] = aten::relu(%b)
    return (%d, %mask, %rl)
  )");
  at::manual_seed(11);
  const at::Tensor expected = at::rand({4});
  at::manual_seed(11);
  clobber(g);
  propagate_meta(g);
  REQUIRE_NOTHROW(verify(g, VerifyOptions{.check_meta = true}));
  REQUIRE_EQUAL_TENSORS(at::rand({4}), expected);
  REQUIRE(g.find_value("mask")->meta().dtype == at::kBool);
}

TEST_CASE("propagate_meta leaves a graph it cannot derive unchanged, and infer_meta sets one new node", "[ir][meta]") {
  Graph g = parse(R"(
    %x : f32[2, 3] = placeholder()
    %n : f32[2, 3] = aten::neg(%x)
    %mm : f32[2, 2] = aten::mm(%n, %x)
    return (%mm)
  )");
  const std::string before = to_text(g);
  REQUIRE_THROWS_WITH(propagate_meta(g), CRUCIBLE_HAS_SUBSTR("node %mm (aten::mm) fails on meta tensors"));
  REQUIRE(to_text(g) == before);

  Graph h = parse(R"(
    %x : f32[2, 3] = placeholder()
    return (%x)
  )");
  Node* t = h.add_call("aten::t", {h.find_value("x")});
  Node* mm = h.add_call("aten::mm", {h.find_value("x"), t->result()});
  infer_meta(*t);
  infer_meta(*mm);
  REQUIRE(to_string(t->result()->meta()) == "f32[3, 2] stride=[1, 3]");
  REQUIRE(to_string(mm->result()->meta()) == "f32[2, 2]");
  REQUIRE_THROWS_WITH(infer_meta(*h.output_node()), CRUCIBLE_HAS_SUBSTR("only calls derive metadata"));
}
