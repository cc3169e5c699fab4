// Builds relu(x @ w + b) as a Crucible graph, prints it, runs it with the
// interpreter and checks the result against the same ATen calls made directly.
// Exit code 0 when they agree.
#include <crucible/ir/graph.h>
#include <crucible/ir/interpreter.h>
#include <crucible/ir/printer.h>
#include <crucible/ir/verifier.h>

#include <ATen/ATen.h>

#include <iostream>

int main() {
  using namespace crucible::ir;
  Graph g;
  Value* x = g.add_placeholder("x", TensorMeta::contiguous({8, 16}));
  Value* w = g.add_placeholder("w", TensorMeta::contiguous({16, 4}), {InputKind::Parameter, "fc.weight", {}});
  Value* b = g.add_placeholder("b", TensorMeta::contiguous({4}), {InputKind::Parameter, "fc.bias", {}});
  Node* addmm = g.add_call("aten::addmm", {b, x, w});
  addmm->result()->set_meta(TensorMeta::contiguous({8, 4}));
  Node* relu = g.add_call("aten::relu", {addmm->result()});
  relu->result()->set_meta(TensorMeta::contiguous({8, 4}));
  g.set_output({relu->result()});
  verify(g);
  std::cout << to_text(g);

  at::manual_seed(0);
  const at::Tensor X = at::randn({8, 16}), W = at::randn({16, 4}), B = at::randn({4});
  const at::Tensor out = Interpreter(g)({X, W, B}).at(0);
  // The interpreter calls the same kernels on the same inputs: bitwise equal.
  const bool same = at::equal(out, at::relu(at::addmm(B, X, W)));
  std::cout << (same ? "consumer: the interpreted graph equals eager ATen\n" : "consumer: MISMATCH\n");
  return same ? 0 : 1;
}
