// The text form: print(parse(print(g))) == print(g), a golden graph in and
// out, parse errors with their line, column and message, and a parsed graph
// interpreted against direct ATen calls.
#include <crucible/ir/error.h>
#include <crucible/ir/interpreter.h>
#include <crucible/ir/parser.h>
#include <crucible/ir/printer.h>
#include <crucible/ir/verifier.h>

#include <sstream>

#include "catch.h"
#include "graph_equal.h"
#include "sample_graph.h"

using namespace crucible::ir;
using crucible::testing::require_same_graph;
using crucible::testing::sample_graph;

TEST_CASE("the sample graph round-trips through the text form", "[ir][text]") {
  const Graph g = sample_graph();
  const std::string text = to_text(g);
  INFO(text);
  const Graph back = parse(text);
  REQUIRE(to_text(back) == text);
  require_same_graph(g, back);  // IValue kinds, tensor data and strides, signature

  std::ostringstream os;
  print(back, os);
  REQUIRE(os.str() == text);
}

TEST_CASE("the text form spells every kind of constant", "[ir][text]") {
  const std::string text = to_text(sample_graph());
  INFO(text);
  for (const char* line : {
           "%conv.weight : f32[4, 3, 3, 3] grad = placeholder(kind=parameter, target=\"conv.weight\")",
           "%w_tied : f32[4, 3, 3, 3] grad = placeholder(kind=parameter, target=\"conv2.weight\", "
           "duplicate_of=%conv.weight)",
           "%strided : f32[4, 2] stride=[1, 5] offset=3 = placeholder(kind=state, target=\"opt.state\")",
           "%tangents_1 : f32[2, 4] = placeholder(kind=tangent)",
           "%convolution : f32[2, 4, 8, 8] = aten::convolution(%x, %conv.weight, %b, [1, 1], [1, 1], [1, 1], False, "
           "[0, 0], 1) "
           "{source=\"Conv2d(conv).forward\"}",
           "%relu : f32[2, 4, 8, 8] = aten::relu(%convolution) {tags=[recomputable]}",
           "%max_pool2d_with_indices : f32[2, 4, 4, 4], %max_pool2d_with_indices_1 : i64[2, 4, 4, 4] = "
           "aten::max_pool2d_with_indices(%relu, [2, 2], [2, 2], [0, 0], [1, 1], False)",
           "= aten::native_layer_norm(%max_pool2d_with_indices, [4], None, None, 1e-05)",
           "= aten::sum.dim_IntList(%native_layer_norm, [2, 3], True, dtype=f64)",
           "= aten::to.dtype(%sum, f32, False, False, None)",
           "= aten::index.Tensor(%view, [None, %idx])",
           "= aten::cat([%view, %tangents_1, %index], 1)",
           "%split : f32[2, 4], %split_1 : f32[2, 4], %split_2 : f32[2, 2] = aten::split.Tensor(%cat, 4, 1)",
           "= aten::add.Tensor(%split, %split_1, alpha=2)",
           "= aten::mul.Scalar(%add, 0.1)",
           "= aten::add.Scalar(%mul, 3, True)",
           "= aten::clamp(%add_1, -1.5, None)",
           "= aten::gelu(%clamp, approximate=\"tanh \\\"approx\\\"\\n\")",
           "= aten::masked_fill.Scalar(%gelu, %eq, -inf)",
           "= aten::linalg_vector_norm(%masked_fill, 2.0, [1], False, dtype=None)",
           "%sym_size : int = aten::sym_size.int(%x, 0)",
           "= aten::mul.Scalar(%linalg_vector_norm, %sym_size)",
           "%zeros : f16[2, 3] = aten::zeros([2, 3], dtype=f16, layout=strided, device=cpu, pin_memory=False)",
           "= aten::full([2], 7, dtype=f64, layout=None, device=None, pin_memory=None)",
           "= aten::_to_copy(%strided, dtype=bf16, layout=strided, device=cpu, pin_memory=None, non_blocking=True, "
           "memory_format=contiguous_format)",
           "%clone : f32[2, 3, 8, 8] stride=[192, 1, 24, 3] = aten::clone(%x, memory_format=channels_last)",
           "= aten::upsample_bilinear2d.vec(%clone, None, False, [2.0, 1.5])",
           "%slice : f32[2, 3, 8, 12] stride=[576, 192, 24, 1] offset=12 = aten::slice.Tensor(%upsample_bilinear2d, 2, "
           "1, None, 2)",
           "%_foreach_add : f32[4], %_foreach_add_1 : f32[4] = aten::_foreach_add.ScalarList([%b, %running_mean], [1, "
           "0.5])",
           "%native_layer_norm_backward : f32[2, 4, 4, 4], %native_layer_norm_backward_1 : Tensor, "
           "%native_layer_norm_backward_2 : Tensor = aten::native_layer_norm_backward(",
           "[True, False, False]) {source=\"LayerNorm(ln).backward\", tags=[backward, \"needs review\"]}",
           "%_tensor_constant : f32[6] = constant([0.1, -0.33333334, 1e-30, nan, inf, -0.0])",
           "%pi : f64[3] = constant([0.1, 0.3333333333333333, 1e+300])",
           "%_tensor_constant_1 : f16[3] = constant([0.099975586, 65504.0, 3.140625])",
           "%_tensor_constant_2 : bf16[2] = constant([0.100097656, 3.0040553e+38])",
           "%_tensor_constant_3 : i64[2] = constant([-9007199254740993, 7])",
           "%_tensor_constant_4 : i32[2] = constant([1, -2])",
           "%_tensor_constant_5 : u8[2] = constant([0, 255])",
           "%_tensor_constant_6 : b8[3] = constant([True, False, True])",
           "%_tensor_constant_7 : f32[3, 2] stride=[1, 3] = constant([0.0, 3.0, 1.0, 4.0, 2.0, 5.0])",
           "%_tensor_constant_8 : f32[3, 2] stride=[0, 0] = constant([1.5, 1.5, 1.5, 1.5, 1.5, 1.5])",
           "%_tensor_constant_9 : f32[4] offset=3 = constant([3.0, 4.0, 5.0, 6.0])",
           "%_tensor_constant_10 : f32[] grad = constant([2.5])",
           "%on_meta : f32[2, 2] @meta = constant()",
           "%n : int = constant(-3)",
           "%f : float = constant(2.5)",
           "%flag : bool = constant(True)",
           "%s : str = constant(\"a \\\\ b\")",
           "%dev : Device = constant(cpu)",
           "%nothing : NoneType = constant(None)",
           "%ints : int[] = constant([1, -2])",
           "%floats : float[] = constant([0.5, 1e-07])",
           "%bools : bool[] = constant([True, False])",
           "return (%mul_1 : loss, %slice, %zeros : saved_value, %full, %_foreach_add : mutated_input(%b), "
           "%_foreach_add_1 : mutated_input(%running_mean), %native_layer_norm_backward : gradient(%conv.weight), "
           "%add_ : mutated_input_metadata(%strided), %max_pool2d_with_indices_1 : saved_value, %split_2) "
           "{tags=[outputs]}",
       })
    CHECK_THAT(text, CRUCIBLE_HAS_SUBSTR(line));
}

TEST_CASE("golden: a graph in the text form reads back in canonical form", "[ir][text]") {
  // Comments, blank lines, keyword spellings of positional arguments,
  // defaults left out and attributes in any order; the output is canonical.
  const char* in = R"(# a small training graph
%x : f32[2, 3] = placeholder()

%w : f32[3, 3] grad = placeholder(target="fc.weight", kind=parameter)
%seed : u64[2] = placeholder()
%mm : f32[2, 3] = aten::mm(%x, mat2=%w)   # the matmul
%add : f32[2, 3] = aten::add.Tensor(%mm, other=%x) {tags=[backward], source="fc"}
%t : f32[3, 2] grad stride=[1, 3] = aten::t(%add)
%s : f32[] = aten::sum(%add)
%c : f64[2] = constant([1, 2.5])
%n : int = constant(3)
%p : f32[2, 3] = aten::add.Scalar(%add, %n)
return (%s : loss, %p, %mm : gradient(%w))
)";
  const char* expected = R"(%x : f32[2, 3] = placeholder()
%w : f32[3, 3] grad = placeholder(kind=parameter, target="fc.weight")
%seed : u64[2] = placeholder()
%mm : f32[2, 3] = aten::mm(%x, %w)
%add : f32[2, 3] = aten::add.Tensor(%mm, %x, alpha=1) {source="fc", tags=[backward]}
%t : f32[3, 2] stride=[1, 3] grad = aten::t(%add)
%s : f32[] = aten::sum(%add, dtype=None)
%c : f64[2] = constant([1.0, 2.5])
%n : int = constant(3)
%p : f32[2, 3] = aten::add.Scalar(%add, %n, 1)
return (%s : loss, %p, %mm : gradient(%w))
)";
  const Graph g = parse(in);
  REQUIRE(to_text(g) == expected);
  REQUIRE(g.signature().inputs[1].kind == InputKind::Parameter);
  REQUIRE(g.signature().outputs[2].input_index == std::optional<size_t>(1));
  REQUIRE(g.find_value("seed")->meta().dtype == at::kUInt64);
  REQUIRE(g.find_value("add")->node()->args().size() == 3);  // alpha filled from the schema
  REQUIRE(g.find_value("p")->node()->arg(1).value() == g.find_value("n"));
  REQUIRE(g.find_value("c")->node()->constant_value().toTensor().scalar_type() == at::kDouble);
}

TEST_CASE("parse errors name the line, the column and what was expected", "[ir][text]") {
  struct Case {
    std::string body;  // line 2, after a placeholder %x : f32[2, 3]
    int line, column;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"%y : f32[2, 3] = aten::frobnicate(%x)", 2, 18, "operator 'aten::frobnicate' is not registered"},
      {"%y : f32[2, 3] = aten::add.Tensr(%x, %x)", 2, 18, "overloads of aten::add are: aten::add.Scalar"},
      {"%y : f32[2, 3] = aten::add.Tensor(%x, %z)", 2, 39, "undefined value %z"},
      {"%x : f32[2, 3] = aten::neg(%x)", 2, 1, "%x is defined twice"},
      {"%y : f33[2, 3] = aten::neg(%x)", 2, 6, "unknown dtype 'f33'"},
      {"%y : f32[2, 3] = aten::add.Tensor(%x, %x, 2)", 2, 43,
       "too many positional arguments: aten::add.Tensor takes 2"},
      {"%y : f32[2, 3] = aten::add.Tensor(%x)", 2, 37, "missing argument 'other'"},
      {"%y : f32[2, 3] = aten::gelu(%x, approximate=\"tanh)", 2, 45, "unterminated string"},
      {"%y : f32[2, 3] = aten::add.Tensor(%x, %x, beta=2)", 2, 43, "has no argument 'beta'"},
      {"%y : f32[2, 3] = aten::add.Tensor(%x, %x, alpha=\"two\")", 2, 49,
       "argument 'alpha' (Scalar): expected a Scalar (int, float or bool), got string \"two\""},
      {"%y : f32[2, 3] = aten::sum(%x, dtype=f33)", 2, 38, "expected a dtype"},
      {"%a : f32[2, 3], %b : f32[2, 1] = aten::native_layer_norm(%x, [3], None, None, 1e-05)", 2, 34,
       "aten::native_layer_norm returns 3 value(s), 2 declared"},
      {"%c : f32[3] = constant([1.0, 2.0])", 2, 24, "has 3 elements, the data lists 2"},
      {"return (%x : grad)", 2, 14, "unknown output kind 'grad'"},
      {"return (%x : gradient(%x), %y)", 2, 28, "undefined value %y"},
      {"%y : f32[2] @gpu = placeholder()", 2, 14, "bad device 'gpu'"},
      {"%y : f32[2, 3] aten::neg(%x)", 2, 16, "expected '=', got 'aten::neg'"},
      {"%y : f32[2] = placeholder(target=\"a\\qb\")", 2, 36, "unknown escape '\\q'"},
      {"%y : f32[2, 3] = aten::neg(%x)\n%z : f32[2] = placeholder()", 3, 1,
       "placeholders come before every other node"},
      {"return (%x)\n%y : f32[2, 3] = aten::neg(%x)", 3, 18, "nothing may follow the output"},
      {"%y : f32[2, 3] = aten::neg(%x)\nreturn (%x : gradient(%y))", 3, 23, "%y is not a placeholder"},
      {"%n : float = aten::sym_size.int(%x, 0)", 2, 1, "%n has type int"},
      {"%y : f32[2, 3] = aten::neg(%x) $", 2, 32, "unexpected character '$'"},
  };
  for (const Case& c : cases) {
    const std::string text = "%x : f32[2, 3] = placeholder()\n" + c.body + "\n";
    INFO(text);
    try {
      parse(text);
      FAIL("parsed without an error");
    } catch (const ParseError& e) {
      INFO(e.what());
      CHECK(e.line() == c.line);
      CHECK(e.column() == c.column);
      CHECK_THAT(e.what(), CRUCIBLE_HAS_SUBSTR(c.message));
    }
  }
}

TEST_CASE("a parsed graph runs like the ATen calls it spells", "[ir][text][interpreter]") {
  const char* text = R"(%x : f32[4, 8] = placeholder()
%w : f32[6, 8] grad = placeholder(kind=parameter, target="fc.weight")
%b : f32[6] grad = placeholder(kind=parameter, target="fc.bias")
%idx : i64[3] = placeholder()
%img : f32[2, 3, 8, 8] = placeholder()
%cw : f32[4, 3, 3, 3] = placeholder(kind=parameter, target="conv.weight")
%t : f32[8, 6] stride=[1, 8] grad = aten::t(%w)
%addmm : f32[4, 6] = aten::addmm(%b, %x, %t, beta=1, alpha=1)
%ln : f32[4, 6], %mean : f32[4, 1], %rstd : f32[4, 1] = aten::native_layer_norm(%addmm, [6], None, None, 1e-05)
%gelu : f32[4, 6] = aten::gelu(%ln, approximate="tanh")
%index : f32[4, 3] = aten::index.Tensor(%gelu, [None, %idx])
%cat : f32[4, 9] = aten::cat([%gelu, %index], 1)
%s0 : f32[4, 4] stride=[9, 1], %s1 : f32[4, 4] stride=[9, 1] offset=4, %s2 : f32[4, 1] stride=[9, 1] offset=8 = aten::split.Tensor(%cat, 4, 1)
%mul : f32[4, 4] = aten::mul.Tensor(%s0, %s1)
%sum : f64[4] = aten::sum.dim_IntList(%mul, [1], dtype=f64)
%to : f32[4] = aten::to.dtype(%sum, f32)
%c : f32[4] = constant([0.5, -1.0, 2.0, 0.1])
%scaled : f32[4] = aten::mul.Tensor(%to, %c)
%clamp : f32[4] = aten::clamp(%scaled, -1.0)
%conv : f32[2, 4, 8, 8] = aten::convolution(%img, %cw, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
%mp : f32[2, 4, 4, 4], %mpi : i64[2, 4, 4, 4] = aten::max_pool2d_with_indices(%conv, [2, 2], [2, 2])
%avg : f32[2, 4] = aten::mean.dim(%mp, [2, 3])
%pos : b8[2, 4] = aten::gt.Scalar(%avg, 0.0)
%masked : f32[2, 4] = aten::masked_fill.Scalar(%avg, %pos, 0.0)
%n : int = aten::sym_size.int(%img, 0)
%scaled_avg : f32[2, 4] = aten::mul.Scalar(%masked, %n)
%half : f16[2, 4] = aten::_to_copy(%scaled_avg, dtype=f16, memory_format=contiguous_format)
return (%clamp : loss, %half, %mpi, %s2, %rstd)
)";
  const Graph g = parse(text);
  verify(g);
  REQUIRE(to_text(parse(to_text(g))) == to_text(g));

  at::manual_seed(0);
  const at::Tensor x = at::randn({4, 8}), w = at::randn({6, 8}), b = at::randn({6});
  const at::Tensor idx = at::tensor({5, 0, 2}, at::kLong), img = at::randn({2, 3, 8, 8}), cw = at::randn({4, 3, 3, 3});
  const auto out = Interpreter(g)({x, w, b, idx, img, cw});

  // The same calls made directly; the same kernels on the same inputs, so
  // the results must match bitwise.
  const at::Tensor addmm = at::addmm(b, x, w.t());
  const auto [ln, mean, rstd] = at::native_layer_norm(addmm, {6}, {}, {}, 1e-5);
  const at::Tensor gelu = at::gelu(ln, "tanh");
  const at::Tensor index = at::index(gelu, {std::nullopt, idx});
  const auto parts = at::split(at::cat({gelu, index}, 1), 4, 1);
  const at::Tensor sum = at::sum(parts[0] * parts[1], {1}, false, at::kDouble).to(at::kFloat);
  const at::Tensor clamp = at::clamp(sum * at::tensor({0.5f, -1.0f, 2.0f, 0.1f}), -1.0);
  const auto [mp, mpi] = at::max_pool2d_with_indices(
      at::convolution(img, cw, {}, {1, 1}, {1, 1}, {1, 1}, false, {0, 0}, 1), {2, 2}, {2, 2});
  const at::Tensor avg = at::mean(mp, {2, 3});
  const at::Tensor half = (avg.masked_fill(avg > 0.0, 0.0) * 2).to(at::kHalf);

  REQUIRE(out.size() == 5);
  REQUIRE_EQUAL_TENSORS(out[0], clamp);
  REQUIRE_EQUAL_TENSORS(out[1], half);
  REQUIRE_EQUAL_TENSORS(out[2], mpi);
  REQUIRE_EQUAL_TENSORS(out[3], parts[2]);
  REQUIRE_EQUAL_TENSORS(out[4], rstd);
  for (size_t i = 0; i < out.size(); ++i) {
    INFO("output " << i << ": " << to_string(TensorMeta::of(out[i])) << " vs " << to_string(g.outputs()[i]->meta()));
    REQUIRE(TensorMeta::of(out[i]) == g.outputs()[i]->meta());
  }
}

TEST_CASE("None for a Tensor argument that is not optional reads back as an undefined tensor", "[ir][text]") {
  // ATen passes an undefined tensor there: the memory-efficient attention's
  // backward without a bias, flash attention's backward its cum_seq_q.
  const char* in = R"(%go : f32[1, 1, 4, 8] = placeholder()
%q : f32[1, 1, 4, 8] = placeholder()
%lse : f32[1, 1, 32] = placeholder()
%seed : i64[] = placeholder()
%e : f32[1, 1, 4, 8], %e_1 : f32[1, 1, 4, 8], %e_2 : f32[1, 1, 4, 8], %e_3 : Tensor = aten::_scaled_dot_product_efficient_attention_backward(%go, %q, %q, %q, None, %go, %lse, %seed, %seed, 0.0, [True, True, True, False], False)
return (%e)
)";
  const Graph g = parse(in);
  verify(g);
  const std::string text = to_text(g);
  CHECK_THAT(text, CRUCIBLE_HAS_SUBSTR("(%go, %q, %q, %q, None, %go,"));
  REQUIRE(to_text(parse(text)) == text);
  const crucible::ir::Argument& bias = g.find_value("e")->node()->arg(4);
  REQUIRE(bias.is_constant());
  REQUIRE(bias.constant().isTensor());
  REQUIRE_FALSE(bias.constant().toTensor().defined());
}
