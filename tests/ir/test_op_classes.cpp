// The op-classification table (Note [Op classes]): which operators each
// class holds, matched by overload or by operator as the class says, and
// the differences between classes that are there on purpose.
#include <crucible/ir/op_classes.h>

#include "catch.h"

using crucible::ir::is_op_class;
using crucible::ir::OpClass;

TEST_CASE("op classes: an IndexView is the overload it names, not every overload", "[op_classes]") {
  CHECK(is_op_class("aten::view", OpClass::IndexView));
  CHECK(is_op_class("aten::transpose.int", OpClass::IndexView));
  CHECK(is_op_class("aten::squeeze", OpClass::IndexView));
  CHECK(is_op_class("aten::squeeze.dims", OpClass::IndexView));
  // view.dtype reinterprets the bytes: a view, but not one of indices.
  CHECK_FALSE(is_op_class("aten::view.dtype", OpClass::IndexView));
  CHECK_FALSE(is_op_class("aten::squeeze.dimname", OpClass::IndexView));
  CHECK_FALSE(is_op_class("aten::as_strided", OpClass::IndexView));
  CHECK_FALSE(is_op_class("aten::add.Tensor", OpClass::IndexView));
}

TEST_CASE("op classes: every RowMajorView is an IndexView that keeps element order", "[op_classes]") {
  for (const char* op : {"aten::view", "aten::_unsafe_view", "aten::reshape", "aten::unsqueeze"}) {
    CAPTURE(op);
    CHECK(is_op_class(op, OpClass::RowMajorView));
    CHECK(is_op_class(op, OpClass::IndexView));
  }
  for (const char* op : {"aten::permute", "aten::transpose.int", "aten::expand", "aten::slice.Tensor"}) {
    CAPTURE(op);
    CHECK_FALSE(is_op_class(op, OpClass::RowMajorView));
    CHECK(is_op_class(op, OpClass::IndexView));
  }
}

TEST_CASE("op classes: classes of whole operators take any overload, or none", "[op_classes]") {
  CHECK(is_op_class("aten::mm", OpClass::ComputeIntensive));
  CHECK(is_op_class("aten::mm.out", OpClass::ComputeIntensive));
  CHECK(is_op_class("aten::convolution_backward", OpClass::ComputeIntensive));
  CHECK_FALSE(is_op_class("aten::add.Tensor", OpClass::ComputeIntensive));
  CHECK(is_op_class("aten::sum.dim_IntList", OpClass::CheapToRecompute));
  CHECK(is_op_class("aten::where.self", OpClass::CheapToRecompute));
  CHECK(is_op_class("crucible::philox_rand", OpClass::CheapToRecompute));
  CHECK_FALSE(is_op_class("aten::mm", OpClass::CheapToRecompute));
  // A schema's name() leaves the overload out.
  CHECK(is_op_class("aten::fill_", OpClass::OverwritesSelf));
  CHECK(is_op_class("aten::fill_.Scalar", OpClass::OverwritesSelf));
  CHECK(is_op_class("aten::random_.from", OpClass::OverwritesSelf));
  CHECK_FALSE(is_op_class("aten::add_.Tensor", OpClass::OverwritesSelf));
}

TEST_CASE("op classes: host syncs are the overloads named", "[op_classes]") {
  CHECK(is_op_class("aten::item", OpClass::HostSync));
  CHECK(is_op_class("aten::_local_scalar_dense", OpClass::HostSync));
  CHECK(is_op_class("crucible::assert_equal", OpClass::HostSync));
  CHECK_FALSE(is_op_class("aten::nonzero.out", OpClass::HostSync));
  CHECK_FALSE(is_op_class("aten::add.Tensor", OpClass::HostSync));
}

TEST_CASE("op classes: names no class lists, and nodes that are not calls", "[op_classes]") {
  for (OpClass c : {OpClass::IndexView, OpClass::RowMajorView, OpClass::ComputeIntensive, OpClass::CheapToRecompute,
                    OpClass::HostSync, OpClass::OverwritesSelf}) {
    CHECK_FALSE(is_op_class("", c));
    CHECK_FALSE(is_op_class("placeholder", c));
    CHECK_FALSE(is_op_class("mylib::op.overload", c));
  }
}
