// Which Values share storage: aliased_argument reads a call's schema (and
// knows aten::_unsafe_view, unsafe_split and unsafe_chunk), storage_root follows it to the Value that
// allocated the memory.
#include <crucible/ir/aliasing.h>
#include <crucible/ir/graph.h>

#include <ATen/ATen.h>

#include "catch.h"

using namespace crucible::ir;

namespace {
TensorMeta f32(std::vector<int64_t> sizes) { return TensorMeta::contiguous(std::move(sizes)); }
}  // namespace

TEST_CASE("aliased_argument and storage_root follow views to the Value that allocated the storage", "[ir][aliasing]") {
  Graph g;
  Value* x = g.add_placeholder("x", f32({4, 6}));
  Value* w = g.add_placeholder("w", f32({6, 6}));
  Value* product = g.add_call("aten::mm", {x, w})->result();
  Value* permuted = g.add_call("aten::permute", {product, std::vector<int64_t>{1, 0}})->result();
  Value* reshaped = g.add_call("aten::reshape", {permuted, std::vector<int64_t>{-1}})->result();
  Value* unsafe = g.add_call("aten::_unsafe_view", {product, std::vector<int64_t>{24}})->result();
  Node* split = g.add_call("aten::split.Tensor", {product, int64_t{2}, int64_t{0}}, size_t{2});
  // An LSTM cell's gates, as ATen's RNN code cuts them.
  Node* unsafe_split = g.add_call("aten::unsafe_split.Tensor", {product, int64_t{2}, int64_t{0}}, size_t{2});
  Node* unsafe_chunk = g.add_call("aten::unsafe_chunk", {product, int64_t{3}, int64_t{1}}, size_t{3});
  Value* written = g.add_call("aten::add_.Tensor", {x, x})->result();
  REQUIRE(aliased_argument(*x) == nullptr);        // a placeholder
  REQUIRE(aliased_argument(*product) == nullptr);  // a fresh result
  REQUIRE(aliased_argument(*permuted) == product);
  REQUIRE(aliased_argument(*reshaped) == permuted);  // reshape may alias: its schema says so
  REQUIRE(aliased_argument(*unsafe) == product);     // though its schema does not say so
  REQUIRE(aliased_argument(*split->result(1)) == product);
  REQUIRE(aliased_argument(*unsafe_split->result(1)) == product);  // nor do these
  REQUIRE(aliased_argument(*unsafe_chunk->result(2)) == product);
  REQUIRE(aliased_argument(*written) == x);  // an in-place op's result is its self
  REQUIRE(storage_root(reshaped) == product);
  REQUIRE(storage_root(split->result(1)) == product);
  REQUIRE(storage_root(product) == product);
  REQUIRE(storage_root(written) == x);
}
