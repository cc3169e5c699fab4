// The scheduler's grouping decisions (Note [Fusion] in
// inductor/src/scheduler.cpp) on small graphs: graph text in, the groups
// and extern kernels out in run order, each group as its tiling and the
// values its loops compute ("8x16: (%m) %y": an 8-row group of 16-element
// rows; %m stays inside its group, %y reaches memory).
#include "lowering/lowering.h"
#include "scheduler.h"

#include <crucible/ir/parser.h>

#include "catch.h"
#include "graph_testing.h"

#include <string>
#include <vector>

using namespace crucible;
using namespace crucible::inductor::detail;
using Lines = std::vector<std::string>;

namespace {

// The scheduler's steps for the graph of `text`, lowered for `device`.
Lines fused(const std::string& text, c10::Device device = c10::kCPU) {
  ir::Graph g = ir::parse(text);
  if (device.is_cuda()) crucible::testing::relabel_device(g, device);
  const Program p = lower(g);
  const Fusion f = fuse(p, g);
  Lines lines;
  for (const Schedule::Step& st : f.steps) {
    if (st.extern_node) {
      lines.push_back("extern " + st.extern_node->target());
      continue;
    }
    const Group& group = f.groups[static_cast<size_t>(st.kernel)];
    std::string line = std::to_string(group.outer) + (group.tiled ? "x" + std::to_string(group.inner) : "") + ":";
    for (int li : group.loops) {
      const int b = p.loops[static_cast<size_t>(li)].buffer;
      const std::string name = "%" + p.buffers[static_cast<size_t>(b)].value->name();
      line += " " + (f.info[static_cast<size_t>(st.kernel)].external.contains(b) ? name : "(" + name + ")");
    }
    lines.push_back(line);
  }
  return lines;
}

}  // namespace

TEST_CASE("scheduler: pointwise loops of one size run in one loop", "[scheduler]") {
  CHECK(fused(R"(
%x : f32[8, 16] = placeholder()
%a : f32[8, 16] = aten::mul.Scalar(%x, 2.0)
%b : f32[8, 16] = aten::add.Scalar(%a, 1.0)
return (%a, %b)
)") == Lines{"128: %a %b"});
}

TEST_CASE("scheduler: a softmax row is one group, its max and sum kept inside it", "[scheduler]") {
  CHECK(fused(R"(
%x : f32[8, 16] = placeholder()
%m : f32[8, 1] = aten::amax(%x, [-1], True)
%d : f32[8, 16] = aten::sub.Tensor(%x, %m)
%e : f32[8, 16] = aten::exp(%d)
%s : f32[8, 1] = aten::sum.dim_IntList(%e, [-1], True)
%y : f32[8, 16] = aten::div.Tensor(%e, %s)
return (%y)
)") == Lines{"8x16: (%m) (%s) %y"});
}

TEST_CASE("scheduler: a reduction retiles the pointwise group it reads", "[scheduler]") {
  CHECK(fused(R"(
%x : f32[8, 16] = placeholder()
%a : f32[8, 16] = aten::mul.Scalar(%x, 2.0)
%s : f32[8] = aten::sum.dim_IntList(%a, [-1])
return (%a, %s)
)") == Lines{"8x16: %a %s"});
}

TEST_CASE("scheduler: a column reduction opens its own group and takes its epilogue", "[scheduler]") {
  CHECK(fused(R"(
%x : f32[64, 16] = placeholder()
%c : f32[16] = aten::sum.dim_IntList(%x, [0])
%d : f32[16] = aten::mul.Scalar(%c, 2.0)
return (%d)
)") == Lines{"16x64: (%c) %d"});
}

TEST_CASE("scheduler: an extern kernel that reads the group closes it", "[scheduler]") {
  CHECK(fused(R"(
%x : f32[8, 8] = placeholder()
%w : f32[8, 8] = placeholder()
%a : f32[8, 8] = aten::relu(%x)
%mm : f32[8, 8] = aten::mm(%a, %w)
%b : f32[8, 8] = aten::add.Tensor(%mm, %a)
return (%b)
)") == Lines{"64: %a", "extern aten::mm", "64: %b"});
}

TEST_CASE("scheduler: an extern kernel that neither reads nor writes the group runs before it", "[scheduler]") {
  CHECK(fused(R"(
%x : f32[8, 8] = placeholder()
%w : f32[8, 8] = placeholder()
%v : f32[8, 8] = placeholder()
%a : f32[8, 8] = aten::mul.Scalar(%x, 2.0)
%mm : f32[8, 8] = aten::mm(%w, %v)
%b : f32[8, 8] = aten::add.Scalar(%a, 1.0)
return (%a, %mm, %b)
)") == Lines{"extern aten::mm", "64: %a %b"});
}

TEST_CASE("scheduler: a loop joins an earlier group it shares a read with (horizontal fusion)", "[scheduler]") {
  // Note [Horizontal fusion]: %c reads %x, as %a does; the matmul between
  // them reads %a, so %a's group closed before %c came.
  CHECK(fused(R"(
%x : f32[8, 8] = placeholder()
%w : f32[8, 8] = placeholder()
%a : f32[8, 8] = aten::relu(%x)
%mm : f32[8, 8] = aten::mm(%a, %w)
%c : f32[8, 8] = aten::mul.Scalar(%x, 3.0)
%d : f32[8, 8] = aten::add.Scalar(%mm, 1.0)
return (%c, %d)
)") == Lines{"64: %a %c", "extern aten::mm", "64: %d"});
}

TEST_CASE("scheduler: a read of another outer iteration's element keeps loops apart", "[scheduler]") {
  // %b reads %a transposed: an element another outer iteration makes.
  CHECK(fused(R"(
%x : f32[16, 16] = placeholder()
%a : f32[16, 16] = aten::relu(%x)
%t : f32[16, 16] = aten::t(%a)
%b : f32[16, 16] = aten::add.Tensor(%a, %t)
return (%a, %b)
)") == Lines{"256: %a", "256: %b"});
}

TEST_CASE("scheduler: independent loops share a group on the CPU, not on a GPU", "[scheduler]") {
  // Note [Independent loops on a GPU].
  const std::string text = R"(
%x : f32[64] = placeholder()
%y : f32[64] = placeholder()
%a : f32[64] = aten::mul.Scalar(%x, 2.0)
%b : f32[64] = aten::mul.Scalar(%y, 3.0)
return (%a, %b)
)";
  CHECK(fused(text) == Lines{"64: %a %b"});
  CHECK(fused(text, c10::Device(c10::kCUDA, 0)) == Lines{"64: %a", "64: %b"});
}
