// A hand-built graph that exercises every part of the text form: 20+ ops,
// multi-result and Tensor[] returns, Tensor[] / Tensor?[] arguments with
// None, every kind of schema constant, tensor and scalar constant nodes,
// non-contiguous metadata, signature kinds, source and tags. Shared by the
// text, JSON and DOT tests.
#pragma once

#include <crucible/ir/graph.h>

#include <ATen/ATen.h>

#include <cmath>
#include <limits>

namespace crucible::testing {

inline ir::TensorMeta meta(std::vector<int64_t> sizes, c10::ScalarType dtype = at::kFloat) {
  return ir::TensorMeta::contiguous(std::move(sizes), dtype);
}

/// Sets the results' metadata to that of `eager` (the same op run by ATen).
inline ir::Node* with_meta(ir::Node* n, std::vector<at::Tensor> eager) {
  for (size_t i = 0; i < eager.size(); ++i)
    if (eager[i].defined()) n->result(i)->set_meta(ir::TensorMeta::of(eager[i]));
  return n;
}

inline ir::Graph sample_graph() {
  using ir::Argument;
  using ir::InputKind;
  using ir::OutputKind;
  ir::Graph g;
  // Example tensors give the eager metadata of every result.
  const at::Tensor X = at::zeros({2, 3, 8, 8}), W = at::zeros({4, 3, 3, 3}), B = at::zeros({4});
  const at::Tensor I = at::zeros({2}, at::kLong), T = at::zeros({2, 4});

  ir::Value* x = g.add_placeholder("x", meta({2, 3, 8, 8}));
  ir::TensorMeta wm = meta({4, 3, 3, 3});
  wm.requires_grad = true;
  ir::Value* w = g.add_placeholder("w", wm, {InputKind::Parameter, "conv.weight", {}});
  g.rename(w, "conv.weight");  // names may hold dots
  ir::Value* b = g.add_placeholder("b", meta({4}), {InputKind::Parameter, "conv.bias", {}});
  g.add_placeholder("w_tied", wm, {InputKind::Parameter, "conv2.weight", 1});
  ir::Value* idx = g.add_placeholder("idx", meta({2}, at::kLong));
  ir::Value* mean_buf = g.add_placeholder("running_mean", meta({4}), {InputKind::Buffer, "bn.running_mean", {}});
  ir::TensorMeta tm{{4, 2}, {1, 5}, 3, at::kFloat};  // a transposed slice: strides and offset
  ir::Value* strided = g.add_placeholder("strided", tm, {InputKind::State, "opt.state", {}});
  ir::Value* tangent = g.add_placeholder("tangents_1", meta({2, 4}), {InputKind::Tangent, "", {}});

  const std::vector<int64_t> one{1, 1};
  ir::Node* conv =
      g.add_call("aten::convolution", {x, w, b, one, one, one, false, std::vector<int64_t>{0, 0}, int64_t{1}});
  const at::Tensor Conv = at::convolution(X, W, B, one, one, one, false, {0, 0}, 1);
  with_meta(conv, {Conv});
  conv->set_source("Conv2d(conv).forward");
  ir::Node* relu = with_meta(g.add_call("aten::relu", {conv->result()}), {Conv});
  relu->add_tag("recomputable");
  auto [Mp, Mpi] = at::max_pool2d_with_indices(Conv, {2, 2}, {2, 2});
  ir::Node* mp = with_meta(g.add_call("aten::max_pool2d_with_indices",
                                      {relu->result(), std::vector<int64_t>{2, 2}, std::vector<int64_t>{2, 2}}),
                           {Mp, Mpi});
  auto [Ln, Mean, Rstd] = at::native_layer_norm(Mp, {4}, {}, {}, 1e-5);
  ir::Node* ln = with_meta(g.add_call("aten::native_layer_norm",
                                      {mp->result(0), std::vector<int64_t>{4}, c10::IValue(), c10::IValue(), 1e-5}),
                           {Ln, Mean, Rstd});
  const at::Tensor S = at::sum(Ln, {2, 3}, true, at::kDouble);
  ir::Node* sum = with_meta(
      g.add_call("aten::sum.dim_IntList", {ln->result(0), std::vector<int64_t>{2, 3}, true, at::kDouble}), {S});
  ir::Node* to = with_meta(g.add_call("aten::to.dtype", {sum->result(), at::kFloat}), {S.to(at::kFloat)});
  ir::Node* view = with_meta(g.add_call("aten::view", {to->result(), std::vector<int64_t>{2, 4}}), {T});
  ir::Node* index = with_meta(g.add_call("aten::index.Tensor", {view->result(), Argument::ValueList{nullptr, idx}}),
                              {at::zeros({2, 2})});
  ir::Node* cat =
      with_meta(g.add_call("aten::cat", {Argument::ValueList{view->result(), tangent, index->result()}, int64_t{1}}),
                {at::zeros({2, 10})});
  ir::Node* split = with_meta(g.add_call("aten::split.Tensor", {cat->result(), int64_t{4}, int64_t{1}}, 3),
                              {at::zeros({2, 4}), at::zeros({2, 4}), at::zeros({2, 2})});
  ir::Node* add = with_meta(g.add_call("aten::add.Tensor", {split->result(0), split->result(1), int64_t{2}}), {T});
  ir::Node* mul = with_meta(g.add_call("aten::mul.Scalar", {add->result(), 0.1}), {T});
  ir::Node* adds = with_meta(g.add_call("aten::add.Scalar", {mul->result(), int64_t{3}, true}), {T});
  ir::Node* clamp = with_meta(g.add_call("aten::clamp", {adds->result(), -1.5, c10::IValue()}), {T});
  ir::Node* gelu = with_meta(g.add_call("aten::gelu", {clamp->result(), std::string("tanh \"approx\"\n")}), {T});
  ir::Node* mask = with_meta(g.add_call("aten::eq.Scalar", {gelu->result(), 0.0}), {at::zeros({2, 4}, at::kBool)});
  ir::Node* fill = with_meta(g.add_call("aten::masked_fill.Scalar",
                                        {gelu->result(), mask->result(), -std::numeric_limits<double>::infinity()}),
                             {T});
  ir::Node* norm = with_meta(
      g.add_call("aten::linalg_vector_norm", {fill->result(), 2.0, std::vector<int64_t>{1}, false, c10::IValue()}),
      {at::zeros({2})});
  ir::Node* size = g.add_call("aten::sym_size.int", {x, int64_t{0}});
  ir::Node* scaled = with_meta(g.add_call("aten::mul.Scalar", {norm->result(), size->result()}), {at::zeros({2})});
  ir::Node* zeros = with_meta(
      g.add_call("aten::zeros", {std::vector<int64_t>{2, 3}, at::kHalf, at::kStrided, c10::Device(at::kCPU), false}),
      {at::zeros({2, 3}, at::kHalf)});
  ir::Node* full = with_meta(g.add_call("aten::full", {std::vector<int64_t>{2}, int64_t{7}, at::kDouble, c10::IValue(),
                                                       c10::IValue(), c10::IValue()}),
                             {at::zeros({2}, at::kDouble)});
  ir::Node* copy = with_meta(g.add_call("aten::_to_copy", {strided, at::kBFloat16, at::kStrided, c10::Device(at::kCPU),
                                                           c10::IValue(), true, at::MemoryFormat::Contiguous}),
                             {at::zeros({4, 2}, at::kBFloat16)});
  ir::Node* clone = with_meta(g.add_call("aten::clone", {x, at::MemoryFormat::ChannelsLast}),
                              {X.clone(at::MemoryFormat::ChannelsLast)});
  ir::Node* up = with_meta(g.add_call("aten::upsample_bilinear2d.vec",
                                      {clone->result(), c10::IValue(), false, std::vector<double>{2.0, 1.5}}),
                           {at::zeros({2, 3, 16, 12})});
  ir::Node* slice =
      with_meta(g.add_call("aten::slice.Tensor", {up->result(), int64_t{2}, int64_t{1}, c10::IValue(), int64_t{2}}),
                {at::zeros({2, 3, 16, 12}).slice(2, 1, c10::nullopt, 2)});
  c10::impl::GenericList scalars(c10::NumberType::get());  // Scalar[]: an int and a float
  scalars.push_back(int64_t{1});
  scalars.push_back(0.5);
  ir::Node* foreach_add =
      with_meta(g.add_call("aten::_foreach_add.ScalarList", {Argument::ValueList{b, mean_buf}, scalars}, 2), {B, B});
  // A backward op with bool[3] and results it does not compute (no meta).
  ir::Node* lnb = g.add_call("aten::native_layer_norm_backward",
                             {ln->result(0), mp->result(0), std::vector<int64_t>{4}, ln->result(1), ln->result(2),
                              c10::IValue(), c10::IValue(), c10::List<bool>({true, false, false})});
  with_meta(lnb, {Mp});
  lnb->add_tag("backward");
  lnb->add_tag("needs review");
  lnb->set_source("LayerNorm(ln).backward");
  ir::Node* inplace =
      with_meta(g.add_call("aten::add_.Tensor", {strided, copy->result(), int64_t{1}}), {at::zeros({4, 2})});

  // Constants: tensors of every printable dtype, strided/expanded/offset
  // ones, and scalars of every kind a constant node holds.
  g.add_constant(at::tensor({0.1f, -1.0f / 3, 1e-30f, std::numeric_limits<float>::quiet_NaN(),
                             std::numeric_limits<float>::infinity(), -0.0f}));
  g.add_constant(at::tensor({0.1, 1.0 / 3, 1e300}, at::kDouble), "pi");
  g.add_constant(at::tensor({0.1f, 65504.0f, 3.140625f}).to(at::kHalf));
  g.add_constant(at::tensor({0.1f, 3e38f}).to(at::kBFloat16));
  g.add_constant(at::tensor({int64_t{-9007199254740993}, int64_t{7}}));
  g.add_constant(at::tensor({1, -2}, at::kInt));
  g.add_constant(at::tensor({0, 255}, at::kByte));
  g.add_constant(at::tensor({1, 0, 1}).to(at::kBool));
  g.add_constant(at::arange(6, at::kFloat).reshape({2, 3}).t());
  g.add_constant(at::tensor({1.5f}).expand({3, 2}));
  g.add_constant(at::arange(10, at::kFloat).slice(0, 3, 7));
  g.add_constant(at::full({}, 2.5).set_requires_grad(true));
  g.add_constant(at::empty({2, 2}, at::TensorOptions().device(at::kMeta)), "on_meta");
  g.add_constant(int64_t{-3}, "n");
  g.add_constant(2.5, "f");
  g.add_constant(true, "flag");
  g.add_constant(std::string("a \\ b"), "s");
  g.add_constant(c10::Device("cpu"), "dev");
  g.add_constant(c10::IValue(), "nothing");
  g.add_constant(std::vector<int64_t>{1, -2}, "ints");
  g.add_constant(std::vector<double>{0.5, 1e-7}, "floats");
  g.add_constant(c10::List<bool>({true, false}), "bools");

  g.set_output({scaled->result(), slice->result(), zeros->result(), full->result(), foreach_add->result(0),
                foreach_add->result(1), lnb->result(0), inplace->result(), mp->result(1), split->result(2)});
  g.signature().outputs = {{OutputKind::Loss, {}},        {OutputKind::UserOutput, {}},
                           {OutputKind::SavedValue, {}},  {OutputKind::UserOutput, {}},
                           {OutputKind::MutatedInput, 2}, {OutputKind::MutatedInput, 5},
                           {OutputKind::Gradient, 1},     {OutputKind::MutatedInputMetadata, 6},
                           {OutputKind::SavedValue, {}},  {OutputKind::UserOutput, {}}};
  g.output_node()->add_tag("outputs");
  return g;
}

}  // namespace crucible::testing
