// fuse_addmm and fold_view_chains: graph text in -> graph text out, where
// they must not apply, and the interpreted results before and after against
// eager LibTorch.
#include <crucible/ir/fold_view_chains.h>
#include <crucible/ir/fuse_addmm.h>
#include <crucible/ir/interpreter.h>
#include <crucible/ir/parser.h>
#include <crucible/ir/printer.h>
#include <crucible/ir/verifier.h>

#include <ATen/ATen.h>

#include "catch.h"
#include "testing.h"

using namespace crucible::ir;

namespace {

// addmm adds the bias inside the GEMM (BLAS's C := alpha*A*B + beta*C), so its
// result may differ from mm then add in the last bits: at most a few ulps of
// float32 for the sums of 16 products tested here (1e-6 relative), and an
// absolute floor for elements near zero.
constexpr double kAddmmRtol = 1e-6;
constexpr double kAddmmAtol = 1e-6;

void require_meta_right(const Graph& g) { REQUIRE_NOTHROW(verify(g, VerifyOptions{.check_meta = true})); }

}  // namespace

TEST_CASE("fuse_addmm: mm + add becomes addmm, the bias on either side, alpha kept", "[ir][rewrite][addmm]") {
  Graph g = parse(R"(
    %x : f32[8, 16] = placeholder()
    %w : f32[16, 4] = placeholder()
    %b : f32[4] = placeholder()
    %c : f32[8, 4] = placeholder()
    %mm : f32[8, 4] = aten::mm(%x, %w)
    %add : f32[8, 4] = aten::add.Tensor(%mm, %b, alpha=1)
    %mm_1 : f32[8, 4] = aten::mm(%x, %w)
    %add_1 : f32[8, 4] = aten::add.Tensor(%c, %mm_1, alpha=2)
    %mm_2 : f32[8, 4] = aten::mm(%x, %w)
    %add_2 : f32[8, 4] = aten::add.Tensor(%mm_2, %c, alpha=0.5)
    return (%add, %add_1, %add_2)
  )");
  const std::vector<at::Tensor> in{at::randn({8, 16}), at::randn({16, 4}), at::randn({4}), at::randn({8, 4})};
  const auto before = Interpreter(g)(in);
  REQUIRE(fuse_addmm(g) == 3);
  REQUIRE(to_text(g) ==
          "%x : f32[8, 16] = placeholder()\n"
          "%w : f32[16, 4] = placeholder()\n"
          "%b : f32[4] = placeholder()\n"
          "%c : f32[8, 4] = placeholder()\n"
          "%addmm : f32[8, 4] = aten::addmm(%b, %x, %w, beta=1, alpha=1)\n"
          "%addmm_1 : f32[8, 4] = aten::addmm(%c, %x, %w, beta=1, alpha=2)\n"
          "%addmm_2 : f32[8, 4] = aten::addmm(%c, %x, %w, beta=0.5, alpha=1)\n"
          "return (%addmm, %addmm_1, %addmm_2)\n");
  require_meta_right(g);
  const auto after = Interpreter(g)(in);
  // The new graph runs exactly eager's addmm; the old one eager's mm and add.
  REQUIRE_EQUAL_TENSORS(after[0], at::addmm(in[2], in[0], in[1]));
  REQUIRE_EQUAL_TENSORS(before[0], at::mm(in[0], in[1]) + in[2]);
  for (size_t i = 0; i < after.size(); ++i) {
    INFO("output " << i);
    REQUIRE_CLOSE(after[i], before[i], kAddmmRtol, kAddmmAtol);
  }
  REQUIRE(fuse_addmm(g) == 0);
}

TEST_CASE("fuse_addmm: a Linear on 3-D input, view -> mm -> _unsafe_view -> add, becomes view -> addmm -> view",
          "[ir][rewrite][addmm]") {
  // What at::matmul makes of x[2, 5, 16] @ w.t() (a 3-D input folded into
  // one mm), followed by the bias add of a Linear.
  Graph g = parse(R"(
    %x : f32[2, 5, 16] = placeholder()
    %w : f32[4, 16] = placeholder()
    %b : f32[4] = placeholder()
    %t : f32[16, 4] stride=[1, 16] = aten::t(%w)
    %view : f32[10, 16] = aten::view(%x, [10, 16])
    %mm : f32[10, 4] = aten::mm(%view, %t)
    %_unsafe_view : f32[2, 5, 4] = aten::_unsafe_view(%mm, [2, 5, 4])
    %add : f32[2, 5, 4] = aten::add.Tensor(%_unsafe_view, %b, alpha=1)
    %relu : f32[2, 5, 4] = aten::relu(%add)
    return (%relu)
  )");
  const std::vector<at::Tensor> in{at::randn({2, 5, 16}), at::randn({4, 16}), at::randn({4})};
  const auto before = Interpreter(g)(in);
  REQUIRE(fuse_addmm(g) == 1);
  REQUIRE(to_text(g) ==
          "%x : f32[2, 5, 16] = placeholder()\n"
          "%w : f32[4, 16] = placeholder()\n"
          "%b : f32[4] = placeholder()\n"
          "%t : f32[16, 4] stride=[1, 16] = aten::t(%w)\n"
          "%view : f32[10, 16] = aten::view(%x, [10, 16])\n"
          "%addmm : f32[10, 4] = aten::addmm(%b, %view, %t, beta=1, alpha=1)\n"
          "%_unsafe_view_1 : f32[2, 5, 4] = aten::_unsafe_view(%addmm, [2, 5, 4])\n"
          "%relu : f32[2, 5, 4] = aten::relu(%_unsafe_view_1)\n"
          "return (%relu)\n");
  require_meta_right(g);
  const auto after = Interpreter(g)(in);
  REQUIRE_CLOSE(after[0], before[0], kAddmmRtol, kAddmmAtol);
  // LibTorch's own linear on contiguous 3-D input takes the same addmm path.
  REQUIRE_EQUAL_TENSORS(after[0], at::relu(at::linear(in[0], in[1], in[2])));
}

TEST_CASE("fuse_addmm: LibTorch's linear outside its fused path adds the bias in place, and fuses the same",
          "[ir][rewrite][addmm]") {
  // at::linear on a non-contiguous 3-D input: matmul, then output.add_(bias).
  Graph g = parse(R"(
    %x : f32[5, 2, 16] = placeholder()
    %w : f32[4, 16] = placeholder()
    %b : f32[4] = placeholder()
    %xt : f32[2, 5, 16] stride=[16, 32, 1] = aten::transpose.int(%x, 0, 1)
    %t : f32[16, 4] stride=[1, 16] = aten::t(%w)
    %c : f32[2, 5, 16] = aten::clone(%xt, memory_format=contiguous_format)
    %view : f32[10, 16] = aten::_unsafe_view(%c, [10, 16])
    %mm : f32[10, 4] = aten::mm(%view, %t)
    %_unsafe_view : f32[2, 5, 4] = aten::_unsafe_view(%mm, [2, 5, 4])
    %add_ : f32[2, 5, 4] = aten::add_.Tensor(%_unsafe_view, %b)
    return (%add_)
  )");
  const std::vector<at::Tensor> in{at::randn({5, 2, 16}), at::randn({4, 16}), at::randn({4})};
  const auto before = Interpreter(g)(in);
  REQUIRE(fuse_addmm(g) == 1);
  REQUIRE(to_text(g).find("%addmm : f32[10, 4] = aten::addmm(%b, %view, %t, beta=1, alpha=1)\n"
                          "%_unsafe_view_1 : f32[2, 5, 4] = aten::_unsafe_view(%addmm, [2, 5, 4])\n"
                          "return (%_unsafe_view_1)\n") != std::string::npos);
  require_meta_right(g);
  const auto after = Interpreter(g)(in);
  REQUIRE_CLOSE(after[0], before[0], kAddmmRtol, kAddmmAtol);
  REQUIRE_CLOSE(after[0], at::linear(in[0].transpose(0, 1), in[1], in[2]), kAddmmRtol, kAddmmAtol);
}

TEST_CASE("fuse_addmm applies only where addmm computes what the add did", "[ir][rewrite][addmm]") {
  auto fused = [](const std::string& text) {
    Graph g = parse(text);
    const size_t n = fuse_addmm(g);
    require_meta_right(g);
    return n;
  };
  const std::string xw = R"(
    %x : f32[6, 8] = placeholder()
    %w : f32[8, 4] = placeholder()
  )";
  // A full [M, N] matrix and a [1, N] row broadcast as addmm's self does.
  REQUIRE(fused(xw + R"(
    %c : f32[6, 4] = placeholder()
    %mm : f32[6, 4] = aten::mm(%x, %w)
    %add : f32[6, 4] = aten::add.Tensor(%mm, %c)
    return (%add))") == 1);
  REQUIRE(fused(xw + R"(
    %c : f32[1, 4] = placeholder()
    %mm : f32[6, 4] = aten::mm(%x, %w)
    %add : f32[6, 4] = aten::add.Tensor(%mm, %c)
    return (%add))") == 1);
  // A bias that widens the result: the add broadcasts mm up, addmm cannot.
  REQUIRE(fused(xw + R"(
    %c : f32[3, 6, 4] = placeholder()
    %mm : f32[6, 4] = aten::mm(%x, %w)
    %add : f32[3, 6, 4] = aten::add.Tensor(%mm, %c)
    return (%add))") == 0);
  // Type promotion: f32 + f64 is f64; addmm wants one dtype.
  REQUIRE(fused(xw + R"(
    %c : f64[4] = placeholder()
    %mm : f32[6, 4] = aten::mm(%x, %w)
    %add : f64[6, 4] = aten::add.Tensor(%mm, %c)
    return (%add))") == 0);
  // The product read elsewhere too: fusing would compute it twice.
  REQUIRE(fused(xw + R"(
    %c : f32[4] = placeholder()
    %mm : f32[6, 4] = aten::mm(%x, %w)
    %add : f32[6, 4] = aten::add.Tensor(%mm, %c)
    %neg : f32[6, 4] = aten::neg(%mm)
    return (%add, %neg))") == 0);
  // Through a view, a 2-D bias [T, N] broadcasts over the batch of the 3-D
  // view, and would meet other rows of the 2-D product.
  REQUIRE(fused(xw + R"(
    %c : f32[3, 4] = placeholder()
    %mm : f32[6, 4] = aten::mm(%x, %w)
    %v : f32[2, 3, 4] = aten::_unsafe_view(%mm, [2, 3, 4])
    %add : f32[2, 3, 4] = aten::add.Tensor(%v, %c)
    return (%add))") == 0);
  // Through a view that moves the columns, the bias would meet other columns.
  REQUIRE(fused(xw + R"(
    %c : f32[2] = placeholder()
    %mm : f32[6, 4] = aten::mm(%x, %w)
    %v : f32[12, 2] = aten::view(%mm, [12, 2])
    %add : f32[12, 2] = aten::add.Tensor(%v, %c)
    return (%add))") == 0);
  // An in-place write to the weight between the product and the add (an
  // optimizer update in a train-step graph): addmm would read the new weight.
  REQUIRE(fused(xw + R"(
    %c : f32[4] = placeholder()
    %mm : f32[6, 4] = aten::mm(%x, %w)
    %upd : f32[8, 4] = aten::mul_.Scalar(%w, 0.5)
    %add : f32[6, 4] = aten::add.Tensor(%mm, %c)
    return (%add, %upd))") == 0);
}

TEST_CASE("fold_view_chains: a chain of views, _unsafe_views and reshapes becomes one", "[ir][rewrite][views]") {
  Graph g = parse(R"(
    %x : f32[2, 3, 4] = placeholder()
    %a : f32[6, 4] = aten::view(%x, [6, 4])
    %b : f32[24] = aten::_unsafe_view(%a, [24])
    %c : f32[4, 6] = aten::reshape(%b, [4, -1])
    %n : f32[4, 6] = aten::neg(%c)
    %d : f32[3, 8] = aten::view(%n, [3, 8])
    %e : f32[24] = aten::view(%d, [24])
    return (%e, %c)
  )");
  const std::vector<at::Tensor> in{at::randn({2, 3, 4})};
  const auto before = Interpreter(g)(in);
  REQUIRE(fold_view_chains(g) == 3);
  REQUIRE(to_text(g) ==
          "%x : f32[2, 3, 4] = placeholder()\n"
          "%reshape : f32[4, 6] = aten::reshape(%x, [4, -1])\n"
          "%n : f32[4, 6] = aten::neg(%reshape)\n"
          "%view : f32[24] = aten::view(%n, [24])\n"
          "return (%view, %reshape)\n");
  require_meta_right(g);
  const auto after = Interpreter(g)(in);
  // Views move no data: bitwise, and the folded view still shares x's storage.
  for (size_t i = 0; i < after.size(); ++i) REQUIRE_EQUAL_TENSORS(after[i], before[i]);
  REQUIRE_EQUAL_TENSORS(after[0], (-in[0]).view({24}));
  at::Tensor x = in[0].clone();
  REQUIRE(Interpreter(g)({x})[1].data_ptr() == x.data_ptr());
  REQUIRE(fold_view_chains(g) == 0);
}

TEST_CASE("fold_view_chains keeps a reshape that copies and a view read elsewhere", "[ir][rewrite][views]") {
  Graph g = parse(R"(
    %x : f32[3, 4] = placeholder()
    %t : f32[4, 3] stride=[1, 4] = aten::t(%x)
    %r : f32[12] = aten::reshape(%t, [12])
    %v : f32[3, 4] = aten::view(%r, [3, 4])
    %a : f32[12] = aten::view(%x, [12])
    %b : f32[2, 6] = aten::view(%a, [2, 6])
    %s : f32[12] = aten::sin(%a)
    return (%v, %b, %s)
  )");
  const std::string text = to_text(g);
  // %r copies the transposed %t (its readers see a fresh tensor, not x's
  // storage); %a is read by %sin as well as %b.
  REQUIRE(fold_view_chains(g) == 0);
  REQUIRE(to_text(g) == text);
  const at::Tensor x = at::randn({3, 4});
  REQUIRE_EQUAL_TENSORS(Interpreter(g)({x})[0], x.t().reshape({12}).view({3, 4}));
}
