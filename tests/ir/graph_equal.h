// Structural equality of two graphs, deeper than their printed text: the
// IValue kinds of constants (int vs float, list kinds), constant tensors'
// data, strides and offsets, and the signature.
#pragma once

#include <crucible/ir/graph.h>

#include <bit>
#include <cstdint>

#include "catch.h"
#include "testing.h"

namespace crucible::testing {

inline void require_same_constant(const c10::IValue& a, const c10::IValue& b) {
  INFO("constant of kind " << a.tagKind());  // printing a meta tensor would throw
  REQUIRE(a.tagKind() == b.tagKind());
  if (a.isTensor()) {
    REQUIRE(ir::TensorMeta::of(a.toTensor()) == ir::TensorMeta::of(b.toTensor()));
    if (!a.toTensor().is_meta()) REQUIRE_EQUAL_TENSORS(b.toTensor(), a.toTensor());
  } else if (a.isList()) {
    REQUIRE(*a.type() == *b.type());  // int[] vs Scalar[] vs ...
    REQUIRE(a.toListRef().size() == b.toListRef().size());
    for (size_t i = 0; i < a.toListRef().size(); ++i) require_same_constant(a.toListRef()[i], b.toListRef()[i]);
  } else if (a.isDouble()) {  // bitwise, so NaN == NaN and -0.0 != 0.0
    REQUIRE(std::bit_cast<uint64_t>(a.toDouble()) == std::bit_cast<uint64_t>(b.toDouble()));
  } else {
    REQUIRE(a == b);
  }
}

inline void require_same_graph(const ir::Graph& a, const ir::Graph& b) {
  REQUIRE(a.num_nodes() == b.num_nodes());
  REQUIRE(a.signature() == b.signature());
  auto name = [](const ir::Value* v) { return v ? v->name() : std::string("None"); };
  auto ib = b.nodes().begin();
  for (const ir::Node* na : a.nodes()) {
    const ir::Node* nb = *ib++;
    INFO("node " << na->target() << (na->num_results() ? " %" + na->result()->name() : ""));
    REQUIRE(na->kind() == nb->kind());
    REQUIRE(na->target() == nb->target());
    REQUIRE(na->source() == nb->source());
    REQUIRE(na->tags() == nb->tags());
    REQUIRE(na->num_results() == nb->num_results());
    for (size_t k = 0; k < na->num_results(); ++k) {
      const ir::Value *ra = na->result(k), *rb = nb->result(k);
      REQUIRE(ra->name() == rb->name());
      REQUIRE(*ra->type() == *rb->type());
      REQUIRE(ra->has_meta() == rb->has_meta());
      if (ra->has_meta()) REQUIRE(ra->meta() == rb->meta());
    }
    if (na->is_constant()) require_same_constant(na->constant_value(), nb->constant_value());
    REQUIRE(na->args().size() == nb->args().size());
    for (size_t i = 0; i < na->args().size(); ++i) {
      const ir::Argument &x = na->arg(i), &y = nb->arg(i);
      INFO("argument " << i);
      REQUIRE(x.is_value() == y.is_value());
      REQUIRE(x.is_value_list() == y.is_value_list());
      if (x.is_value()) {
        REQUIRE(x.value()->name() == y.value()->name());
      } else if (x.is_value_list()) {
        REQUIRE(x.value_list().size() == y.value_list().size());
        for (size_t j = 0; j < x.value_list().size(); ++j) REQUIRE(name(x.value_list()[j]) == name(y.value_list()[j]));
      } else {
        require_same_constant(x.constant(), y.constant());
      }
    }
  }
}

}  // namespace crucible::testing
