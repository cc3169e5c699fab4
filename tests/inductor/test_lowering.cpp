// compile_fx_inner's loop-level lowering against eager LibTorch (not the
// interpreter): broadcast, transposed, expanded, sliced and reshaped
// operands; outputs that are views; reductions (sum, mean, amax, amin,
// var_mean) alone and fused with pointwise prologues and epilogues (softmax,
// log_softmax and layer norm rows as our graphs decompose them); mixed
// dtypes, comparisons and casts as Adam graphs have them; bf16 and f16
// loops; a value with
// several consumers; and a write to an input the schedule must not reorder.
//
// Every test states its tolerance and why; each graph is compiled with -O1
// (the loops' meaning does not depend on -O, compile time does).
//
// CRUCIBLE_TEST_DEVICE=cuda runs the same graphs on the GPU through the CUDA
// renderer (eager's answers still come from the CPU; the bounds below cover
// CUDA's float sums and libdevice's exp and erf as they cover the C++
// kernels'). Where no GPU is usable, that run compiles every graph's CUDA
// kernels with NVRTC for sm_90 (the H100's architecture) and compares
// nothing: the suite 'inductor-nvrtc' in CI.
#include <crucible/inductor/compile_fx.h>
#include <crucible/ir/graph.h>
#include <crucible/ir/propagate_meta.h>

#include <ATen/TensorIterator.h>

#include "catch.h"
#include "graph_testing.h"
#include "testing.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

using namespace crucible;
namespace fs = std::filesystem;

namespace {

using Args = std::vector<ir::Argument>;
using Dims = std::vector<int64_t>;

/// slice.Tensor's `end` as traced graphs write "to the end".
constexpr int64_t kEnd = std::numeric_limits<int64_t>::max();
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// One cache directory per test run: kernels compiled by one test case are
// reused by the others.
const std::string& test_cache() {
  static const std::string dir = crucible::testing::temp_dir("crucible-inductor-lowering");
  return dir;
}

inductor::InductorOptions options() {
  inductor::InductorOptions o;
  o.cache_dir = test_cache();
  o.flags = {"-O1", "-fopenmp"};  // the loops' meaning does not depend on -O; compile time does
  return o;
}

at::TensorOptions of(at::ScalarType dtype) { return at::TensorOptions().dtype(dtype); }

using crucible::testing::compile_only;
using crucible::testing::test_device;

// --- tolerances --------------------------------------------------------------

// Pointwise ops: fused code may contract a*b+c into one FMA (GCC's default
// -ffp-contract=fast) and calls libm's exp/tanh/erf where ATen calls its
// vectorized ones (Sleef); each differs from eager by a few ulps, so the
// bound is a few ulps of the dtype at the value's scale (f32's ulp is
// 1.2e-7, f64's 2.2e-16).
double rtol(at::ScalarType t) { return t == at::kDouble ? 1e-12 : 1e-5; }
double atol(at::ScalarType t) { return t == at::kDouble ? 1e-12 : 1e-6; }

// Reductions: a generated loop adds a row in its own order, ATen in another
// (a vectorized cascade). Reordering a sum of k terms moves it by at most
// about k ulps of the sum of the terms' magnitudes, and in practice (round-off
// errors of either sign) by about sqrt(k) ulps: 2e-6 of the magnitudes' sum
// for k = 1000 in f32, under 1e-14 in f64. Both sides err, so the bound is
// 1e-5 (f32) and 1e-12 (f64) of the sum of the magnitudes of the terms the
// output element reduces. max and min do not depend on order: exact.
double red_rtol(at::ScalarType t) { return t == at::kDouble ? 1e-12 : 1e-5; }

/// The pointwise bound for `want`: rtol·|want| + atol (0 for bool and
/// integer results, which must be exact).
at::Tensor close(const at::Tensor& want) {
  const at::ScalarType t = want.scalar_type();
  if (!at::isFloatingType(t)) return at::zeros({}, at::kDouble);
  return want.to(at::kDouble).abs() * rtol(t) + atol(t);
}

/// A bound of 0: the compiled value must equal eager's.
at::Tensor exact() { return at::zeros({}, at::kDouble); }

/// The reduction bound: red_rtol of the magnitudes (a tensor broadcast to
/// the output: the sum of |term| over what each output element reduces, or
/// the mean of |term| for a mean).
at::Tensor reduced(at::ScalarType t, const at::Tensor& magnitude) { return magnitude.to(at::kDouble) * red_rtol(t); }

/// |x| in double, for magnitudes.
at::Tensor mag(const at::Tensor& x) { return x.to(at::kDouble).abs(); }

/// Why `got` is farther than `bound` (broadcast to `want`'s shape) from
/// `want` somewhere, or "". Sizes and dtypes must be equal, NaNs where eager
/// has them and an infinity where eager has the same one
/// (testing::out_of_bound).
std::string outside(const at::Tensor& got, const at::Tensor& want, const at::Tensor& bound) {
  std::ostringstream os;
  if (!got.defined()) return "the compiled output is undefined";
  if (got.sizes() != want.sizes()) {
    os << "sizes differ: " << got.sizes() << " vs eager's " << want.sizes();
    return os.str();
  }
  if (got.scalar_type() != want.scalar_type()) {
    os << "dtypes differ: " << got.scalar_type() << " vs eager's " << want.scalar_type();
    return os.str();
  }
  if (want.numel() == 0) return "";
  const at::Tensor a = got.cpu().to(at::kDouble), e = want.to(at::kDouble);
  const at::Tensor b = bound.to(at::kDouble).expand_as(e);
  const at::Tensor diff = (a - e).abs();
  const at::Tensor bad = testing::out_of_bound(a, e, b, /*signed_zeros=*/false);
  if (!bad.any().item<bool>()) return "";
  const int64_t first = bad.flatten().nonzero()[0].item<int64_t>();
  os << bad.sum().item<int64_t>() << " element(s) out of bounds; the first, at flat index " << first << ": got "
     << a.flatten()[first].item<double>() << ", eager " << e.flatten()[first].item<double>() << ", bound "
     << b.flatten()[first].item<double>() << "; the largest |got - eager| - bound "
     << (diff - b).nan_to_num(0, 0, 0).max().item<double>();
  return os.str();
}

/// Why `got`'s layout differs from `want`'s (an eager view), or "": equal
/// sizes, and equal strides in every dim of size above 1 (the stride of a
/// size-1 dim never moves to another element, and kernels differ in what
/// they write there).
std::string layout_mismatch(const at::Tensor& got, const at::Tensor& want) {
  bool same = got.sizes() == want.sizes();
  for (int64_t d = 0; same && d < want.dim(); ++d) same = want.size(d) <= 1 || got.stride(d) == want.stride(d);
  if (same) return "";
  std::ostringstream os;
  os << "layout " << got.sizes() << " stride " << got.strides() << " vs eager's " << want.sizes() << " stride "
     << want.strides();
  return os.str();
}

// --- building and checking graphs ----------------------------------------------

/// A graph under construction and the tensors its placeholders take.
struct Builder {
  ir::Graph g;
  std::vector<at::Tensor> inputs;

  /// A placeholder taking `t` (on test_device(), with its strides).
  ir::Value* input(const at::Tensor& t) {
    inputs.push_back(compile_only() ? t : t.to(test_device()));
    return g.add_placeholder("in" + std::to_string(inputs.size() - 1), ir::TensorMeta::of(inputs.back()));
  }
  /// A placeholder taking `t` where it is (a 0-dim CPU tensor: a learning rate).
  ir::Value* host_input(const at::Tensor& t) {
    inputs.push_back(t);
    ir::Value* v = g.add_placeholder("in" + std::to_string(inputs.size() - 1), ir::TensorMeta::of(t));
    host.emplace_back(v, t);
    return v;
  }
  std::vector<std::pair<ir::Value*, at::Tensor>> host;  // placeholders that stay where their tensors are
  ir::Node* node(std::string_view op, Args args) { return g.add_call(op, std::move(args)); }
  ir::Value* call(std::string_view op, Args args) { return node(op, std::move(args))->result(); }

  /// Sets the outputs, derives the metadata, compiles with compile_fx_inner
  /// and runs on `inputs` themselves (a write to an input reaches the
  /// caller's tensor). compile_only(): compiles the graph's CUDA kernels with
  /// NVRTC and returns nothing.
  std::vector<at::Tensor> run(std::vector<ir::Value*> outputs, const inductor::InductorOptions& o = options()) {
    g.set_output(std::move(outputs));
    ir::propagate_meta(g);
    if (compile_only()) {
      // Said once a process, so that the suite's count shows what it left out.
      static const bool said = [] {
        WARN(
            "skipped: no GPU here: the CUDA kernels of the [lowering] and [random] cases are compiled with NVRTC, "
            "not run");
        return true;
      }();
      (void)said;
      crucible::testing::relabel_device(g, test_device());
      for (auto& [v, t] : host) v->set_meta(ir::TensorMeta::of(t));
      REQUIRE(inductor::generate_code(g).cuda);
      for (const std::string& cubin : inductor::compile_cuda(g, "sm_90", o))
        REQUIRE(cubin.compare(0, 4,
                              "\x7f"
                              "ELF") == 0);
      return {};
    }
    ir::CompiledFn fn = inductor::compile_fx_inner(g, inputs, o);
    std::vector<at::Tensor> in = inputs;
    std::vector<at::Tensor> out = fn(in);
    REQUIRE(out.size() == g.outputs().size());
    return out;
  }
};

/// One graph output and what eager says of it.
struct Expect {
  std::string what;
  ir::Value* value;
  at::Tensor want;
  at::Tensor bound;     // |got - want| <= bound, elementwise (broadcast)
  bool layout = false;  // want is an eager view: got must have its sizes and strides too
};

/// A pointwise result: the pointwise bound.
Expect pointwise(std::string what, ir::Value* v, const at::Tensor& want) {
  return {std::move(what), v, want, close(want)};
}
/// A result that eager returns as a view: the pointwise bound and eager's layout.
Expect view_of(std::string what, ir::Value* v, const at::Tensor& want) {
  return {std::move(what), v, want, close(want), true};
}
/// A reduction's result: red_rtol of `magnitude`.
Expect reduction(std::string what, ir::Value* v, const at::Tensor& want, const at::Tensor& magnitude) {
  return {std::move(what), v, want, reduced(want.scalar_type(), magnitude)};
}
/// An exact result (max, min, selections, comparisons).
Expect exactly(std::string what, ir::Value* v, const at::Tensor& want) { return {std::move(what), v, want, exact()}; }

/// Every output of `got` against its expectation (bound, and layout where
/// eager returns a view).
void require_expected(const std::vector<at::Tensor>& got, const std::vector<Expect>& expects) {
  for (size_t i = 0; i < expects.size(); ++i) {
    INFO("output " << i << ": " << expects[i].what);
    const std::string why = outside(got[i], expects[i].want, expects[i].bound);
    INFO(why);
    REQUIRE(why.empty());
    if (expects[i].layout) {
      const std::string layout = layout_mismatch(got[i], expects[i].want);
      INFO(layout);
      REQUIRE(layout.empty());
    }
  }
}

/// Compiles `b` (with `o`) with the expectations' values as outputs, runs it
/// once and checks every output.
void check(Builder& b, const std::vector<Expect>& expects, const inductor::InductorOptions& o = options()) {
  std::vector<ir::Value*> outputs;
  for (const Expect& e : expects) outputs.push_back(e.value);
  const std::vector<at::Tensor> got = b.run(outputs, o);
  if (compile_only()) return;
  require_expected(got, expects);
}

/// On a GPU, `b`'s graph (which check compiled and ran) compiled again in
/// each launch configuration its kernels have (Note [Autotuning] in
/// codegen/cuda.cpp: 4 for row kernels), run, and every output checked as
/// check does: the configurations autotuning picks from are each right.
void check_each_config(Builder& b, const std::vector<Expect>& expects) {
  if (compile_only() || !test_device().is_cuda()) return;
  for (int config = 0; config < 4; ++config) {
    INFO("launch configuration " << config);
    inductor::InductorOptions o = options();
    o.kernel_config = config;
    ir::CompiledFn fn = inductor::compile_fx_inner(b.g, b.inputs, o);
    std::vector<at::Tensor> in = b.inputs;
    require_expected(fn(in), expects);
  }
}

/// Text for a dim list in a case's description.
std::string dims_text(const std::optional<Dims>& dims) {
  if (!dims) return "None";
  std::string s = "[";
  for (size_t i = 0; i < dims->size(); ++i) s += (i ? ", " : "") + std::to_string((*dims)[i]);
  return s + "]";
}

/// A dim-list argument: the list, or None.
ir::Argument dim_arg(const std::optional<Dims>& dims) { return dims ? c10::IValue(*dims) : c10::IValue(); }
/// The same for eager calls.
at::OptionalIntArrayRef dim_ref(const std::optional<Dims>& dims) {
  return dims ? at::OptionalIntArrayRef(at::IntArrayRef(*dims)) : at::OptionalIntArrayRef();
}

/// Number of elements a reduction over `dims` (None or []: all) combines.
int64_t reduced_count(const at::Tensor& x, const std::optional<Dims>& dims) {
  if (!dims || dims->empty()) return x.numel();
  int64_t n = 1;
  for (int64_t d : *dims) n *= x.size(d);
  return n;
}

/// The decomposed softmax over `dim`: amax keepdim, sub, exp, sum keepdim, div.
ir::Value* softmax_rows(Builder& b, ir::Value* x, int64_t dim) {
  ir::Value* m = b.call("aten::amax", {x, Dims{dim}, true});
  ir::Value* e = b.call("aten::exp", {b.call("aten::sub.Tensor", {x, m, c10::Scalar(1)})});
  ir::Value* s = b.call("aten::sum.dim_IntList", {e, Dims{dim}, true});
  return b.call("aten::div.Tensor", {e, s});
}

/// The decomposed log_softmax over `dim`: (x - amax) - log(sum(exp(x - amax))).
ir::Value* log_softmax_rows(Builder& b, ir::Value* x, int64_t dim) {
  ir::Value* m = b.call("aten::amax", {x, Dims{dim}, true});
  ir::Value* d = b.call("aten::sub.Tensor", {x, m, c10::Scalar(1)});
  ir::Value* s = b.call("aten::sum.dim_IntList", {b.call("aten::exp", {d}), Dims{dim}, true});
  return b.call("aten::sub.Tensor", {d, b.call("aten::log", {s}), c10::Scalar(1)});
}

// Softmax: y = e / s with s = sum(e) over the row. The terms of s are
// positive, so the sum of their magnitudes is s itself: s is within red_rtol
// relative of eager's, and so is every y of the row; exp and div add a few
// ulps (rtol).
at::Tensor softmax_bound(const at::Tensor& want) {
  const at::ScalarType t = want.scalar_type();
  return mag(want) * (red_rtol(t) + rtol(t));
}

/// The layer norm of rows as our graphs decompose native_layer_norm:
/// var_mean.dim (correction 0, keepdim) → add.Scalar eps → rsqrt → sub →
/// mul → mul weight → add bias (weight and bias broadcast over the rows).
struct LayerNorm {
  ir::Value* var;
  ir::Value* mean;
  ir::Value* rstd;
  ir::Value* y;
};
LayerNorm layer_norm_rows(Builder& b, ir::Value* x, ir::Value* w, ir::Value* bias, int64_t dim, double eps) {
  ir::Node* vm = b.node("aten::var_mean.dim", {x, Dims{dim}, false, true});  // the zoo's form
  LayerNorm r{vm->result(0), vm->result(1), nullptr, nullptr};
  r.rstd = b.call("aten::rsqrt", {b.call("aten::add.Scalar", {r.var, c10::Scalar(eps), c10::Scalar(1)})});
  ir::Value* xhat = b.call("aten::mul.Tensor", {b.call("aten::sub.Tensor", {x, r.mean, c10::Scalar(1)}), r.rstd});
  ir::Value* yw = w ? b.call("aten::mul.Tensor", {xhat, w}) : xhat;
  r.y = bias ? b.call("aten::add.Tensor", {yw, bias, c10::Scalar(1)}) : yw;
  return r;
}

// Layer norm bounds, from eager's mean and rstd (over the last dim, kept):
// - mean: a reduction, red_rtol of mean(|x|);
// - rstd = (var + eps)^-1/2 moves by half var's relative error (var_rel,
//   per row, given by the caller), plus a few ulps;
// - y = (x - mean)·rstd·w + b moves by |w|·(|xhat|·rstd_rel + δmean·rstd),
//   plus a few ulps of |y| and |b|.
// Both sides err; the bounds' margins (see red_rtol) cover that.
struct LayerNormBounds {
  at::Tensor mean, rstd, y;
};
LayerNormBounds layer_norm_bounds(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias,
                                  const at::Tensor& mean, const at::Tensor& rstd, const at::Tensor& y,
                                  const at::Tensor& var_rel) {
  const at::ScalarType t = x.scalar_type();
  LayerNormBounds r;
  r.mean = reduced(t, mag(x).mean(Dims{-1}, true));
  const at::Tensor rstd_rel = 0.5 * var_rel + rtol(t);
  r.rstd = mag(rstd) * rstd_rel;
  const at::Tensor xhat = (x.to(at::kDouble) - mean.to(at::kDouble)) * rstd.to(at::kDouble);
  at::Tensor wmag = w.defined() ? mag(w) : at::ones({}, at::kDouble);
  at::Tensor bmag = bias.defined() ? mag(bias) : at::zeros({}, at::kDouble);
  r.y = wmag * (xhat.abs() * rstd_rel + r.mean * mag(rstd)) + rtol(t) * (mag(y) + bmag) + atol(t);
  return r;
}

}  // namespace

TEST_CASE("lowering: outside() fails a value that is not eager's infinity or NaN, whatever the bound",
          "[inductor][lowering]") {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  auto t = [](double v) { return at::full({1}, v, at::kDouble); };
  // A bound derived from eager's magnitude is itself inf next to an infinity.
  const at::Tensor wide = t(inf);
  CHECK(outside(t(inf), t(inf), wide).empty());
  CHECK(outside(t(nan), t(nan), wide).empty());
  CHECK_FALSE(outside(t(-inf), t(inf), wide).empty());
  CHECK_FALSE(outside(t(1.0), t(inf), wide).empty());
  CHECK_FALSE(outside(t(inf), t(1.0), wide).empty());
  CHECK_FALSE(outside(t(nan), t(inf), wide).empty());
  CHECK_FALSE(outside(t(1.0), t(nan), wide).empty());
  CHECK(outside(t(1.0), t(1.5), t(0.5)).empty());
  CHECK_FALSE(outside(t(1.0), t(1.5), t(0.25)).empty());
}

// --- broadcasting and views -----------------------------------------------------

TEST_CASE("lowering: non-scalar operands broadcast like ATen", "[inductor][lowering]") {
  for (auto dtype : {at::kFloat, at::kDouble}) {
    CAPTURE(dtype);
    at::Tensor a = at::randn({4, 1, 6}, of(dtype)), b = at::randn({5, 6}, of(dtype));
    at::Tensor c = at::randn({3, 4}, of(dtype)), d = at::randn({4}, of(dtype));
    at::Tensor e = at::randn({2, 3, 4}, of(dtype)), f = at::randn({2, 1, 4}, of(dtype));
    at::Tensor col = at::randn({4, 1}, of(dtype)), row = at::randn({1, 5}, of(dtype));
    Builder g;
    ir::Value *pa = g.input(a), *pb = g.input(b), *pc = g.input(c), *pd = g.input(d);
    ir::Value *pe = g.input(e), *pf = g.input(f), *pcol = g.input(col), *prow = g.input(row);
    ir::Value* ab = g.call("aten::add.Tensor", {pa, pb, c10::Scalar(1)});           // [4, 1, 6] + [5, 6]
    ir::Value* tab = g.call("aten::mul.Tensor", {g.call("aten::tanh", {ab}), pb});  // broadcast again, downstream
    ir::Value* cd = g.call("aten::mul.Tensor", {pc, pd});                           // [3, 4] * [4]
    ir::Value* cdd = g.call("aten::add.Tensor", {cd, pd, c10::Scalar(0.5)});
    ir::Value* ef = g.call("aten::sub.Tensor", {pe, pf, c10::Scalar(1)});         // [2, 3, 4] - [2, 1, 4]
    ir::Value* fe = g.call("aten::sub.Tensor", {pf, pe, c10::Scalar(2)});         // the broadcast operand first
    ir::Value* outer = g.call("aten::add.Tensor", {pcol, prow, c10::Scalar(1)});  // [4, 1] + [1, 5]: both
    ir::Value* outer_exp = g.call("aten::exp", {g.call("aten::mul.Tensor", {outer, prow})});
    check(g, {
                 pointwise("[4,1,6] + [5,6]", ab, a + b),
                 pointwise("tanh([4,1,6] + [5,6]) * [5,6]", tab, at::tanh(a + b) * b),
                 pointwise("[3,4] * [4]", cd, c * d),
                 pointwise("[3,4] * [4] + 0.5 [4]", cdd, at::add(c * d, d, 0.5)),
                 pointwise("[2,3,4] - [2,1,4]", ef, e - f),
                 pointwise("[2,1,4] - 2 [2,3,4]", fe, at::sub(f, e, 2)),
                 pointwise("[4,1] + [1,5]", outer, col + row),
                 pointwise("exp(([4,1] + [1,5]) * [1,5])", outer_exp, at::exp((col + row) * row)),
             });
  }
}

TEST_CASE("lowering: C++ loops run in parallel from ATen's grain size", "[inductor][lowering]") {
  // Below at::internal::GRAIN_SIZE elements ATen's loops run on one thread,
  // and so do the generated ones: the kernel's parallel region is
  // conditional on that same size.
  const at::Tensor x = at::randn({at::internal::GRAIN_SIZE});
  Builder g;
  ir::Value* y = g.call("aten::tanh", {g.input(x)});
  check(g, {pointwise("tanh", y, at::tanh(x))});
  const inductor::GeneratedCode code = inductor::generate_code(g.g);
  if (!code.cuda) CHECK(code.source.find(" >= " + std::to_string(at::internal::GRAIN_SIZE) + ")") != std::string::npos);
}

TEST_CASE("lowering: transposed and permuted operands, and inputs with transposed strides", "[inductor][lowering]") {
  for (auto dtype : {at::kFloat, at::kDouble}) {
    CAPTURE(dtype);
    at::Tensor x = at::randn({5, 3}, of(dtype)), y = at::randn({3, 5}, of(dtype)), row = at::randn({5}, of(dtype));
    at::Tensor p = at::randn({2, 3, 4}, of(dtype)), q = at::randn({4, 3, 2}, of(dtype));
    at::Tensor r = at::randn({3, 4, 2}, of(dtype));
    at::Tensor xt = at::randn({6, 4}, of(dtype)).t();  // its placeholder's metadata has strides [1, 4]
    at::Tensor z = at::randn({4, 6}, of(dtype));
    Builder g;
    ir::Value *px = g.input(x), *py = g.input(y), *prow = g.input(row), *pp = g.input(p), *pq = g.input(q);
    ir::Value *pr = g.input(r), *pxt = g.input(xt), *pz = g.input(z);
    REQUIRE(!g.inputs[6].is_contiguous());
    ir::Value* tx = g.call("aten::t", {px});
    ir::Value* v1 = g.call("aten::mul.Tensor", {tx, py});
    ir::Value* v2 =
        g.call("aten::add.Tensor", {g.call("aten::transpose.int", {pp, int64_t{0}, int64_t{2}}), pq, c10::Scalar(1)});
    ir::Value* v3 = g.call("aten::mul.Tensor", {g.call("aten::permute", {pp, Dims{1, 2, 0}}), pr});
    ir::Value* v4 = g.call("aten::relu", {g.call("aten::add.Tensor", {pxt, pz, c10::Scalar(1)})});
    ir::Value* v5 = g.call("aten::add.Tensor", {tx, prow, c10::Scalar(1)});  // transposed and broadcast
    ir::Value* v6 = g.call("aten::mul.Tensor",
                           {g.call("aten::transpose.int", {g.call("aten::exp", {pp}), int64_t{-1}, int64_t{0}}), pq});
    ir::Value* v7 = g.call("aten::sub.Tensor",
                           {g.call("aten::permute", {pxt, Dims{1, 0}}), g.call("aten::t", {pz}), c10::Scalar(1)});
    check(g, {
                 pointwise("t(x) * y", v1, x.t() * y),
                 pointwise("transpose(p, 0, 2) + q", v2, p.transpose(0, 2) + q),
                 pointwise("permute(p, [1, 2, 0]) * r", v3, p.permute({1, 2, 0}) * r),
                 pointwise("relu(xt + z), xt with transposed strides", v4, at::relu(xt + z)),
                 pointwise("t(x) + row", v5, x.t() + row),
                 pointwise("transpose(exp(p), -1, 0) * q", v6, at::exp(p).transpose(-1, 0) * q),
                 pointwise("permute(xt, [1, 0]) - t(z)", v7, xt.permute({1, 0}) - z.t()),
             });
  }
}

TEST_CASE("lowering: a result laid out channels-last is computed in its memory order", "[inductor][lowering]") {
  // relu of a channels-last [N, C, H, W] tensor is channels-last (as ATen
  // lays it out): its loop counts in memory order (Loop::order), so the
  // element at position o is stored at o and read from o, where counting
  // row-major would stride by C through both.
  const at::Tensor x = at::randn({2, 3, 4, 5}).contiguous(at::MemoryFormat::ChannelsLast);
  const at::Tensor y = at::randn({2, 3, 4, 5});
  Builder g;
  ir::Value *px = g.input(x), *py = g.input(y);
  ir::Value* r = g.call("aten::relu", {px});
  ir::Value* s = g.call("aten::add.Tensor", {r, py, c10::Scalar(1)});  // y read in another order
  check(g, {
               exactly("relu(x), x channels-last", r, at::relu(x)),
               pointwise("relu(x) + y", s, at::relu(x) + y),
           });
  const std::string code = inductor::generate_code(g.g).source;
  INFO(code);
  CHECK(code.find("[o] = ") != std::string::npos);    // relu's store
  CHECK(code.find("_in0[o];") != std::string::npos);  // and its load
}

TEST_CASE("lowering: expanded operands", "[inductor][lowering]") {
  for (auto dtype : {at::kFloat, at::kDouble}) {
    CAPTURE(dtype);
    at::Tensor c = at::randn({3, 1}, of(dtype)), y = at::randn({3, 4}, of(dtype)), v = at::randn({4}, of(dtype));
    at::Tensor z = at::randn({2, 3, 4}, of(dtype)), c1 = at::randn({1, 4}, of(dtype)), w = at::randn({3, 4}, of(dtype));
    at::Tensor s = at::randn({}, of(dtype));
    Builder g;
    ir::Value *pc = g.input(c), *py = g.input(y), *pv = g.input(v), *pz = g.input(z), *pc1 = g.input(c1);
    ir::Value *pw = g.input(w), *ps = g.input(s);
    ir::Value* e1 = g.call("aten::add.Tensor", {g.call("aten::expand", {pc, Dims{3, 4}}), py, c10::Scalar(1)});
    ir::Value* e2 = g.call("aten::mul.Tensor", {g.call("aten::expand", {pv, Dims{2, 3, 4}}), pz});
    ir::Value* e3 = g.call("aten::sub.Tensor", {g.call("aten::expand", {pc1, Dims{3, -1}}), pw, c10::Scalar(1)});
    ir::Value* e4 =
        g.call("aten::mul.Tensor", {g.call("aten::expand", {g.call("aten::sigmoid", {pc}), Dims{3, 4}}), py});
    ir::Value* e5 = g.call("aten::add.Tensor", {g.call("aten::expand", {ps, Dims{3, 4}}), pw, c10::Scalar(1)});
    check(g, {
                 pointwise("expand([3,1], [3,4]) + y", e1, c.expand({3, 4}) + y),
                 pointwise("expand([4], [2,3,4]) * z", e2, v.expand({2, 3, 4}) * z),
                 pointwise("expand([1,4], [3,-1]) - w", e3, c1.expand({3, -1}) - w),
                 pointwise("expand(sigmoid([3,1]), [3,4]) * y", e4, at::sigmoid(c).expand({3, 4}) * y),
                 pointwise("expand(0-dim, [3,4]) + w", e5, s.expand({3, 4}) + w),
             });
  }
}

TEST_CASE("lowering: sliced and selected operands", "[inductor][lowering]") {
  for (auto dtype : {at::kFloat, at::kDouble}) {
    CAPTURE(dtype);
    at::Tensor x = at::randn({6, 5}, of(dtype)), y = at::randn({3, 5}, of(dtype)), z = at::randn({6, 2}, of(dtype));
    at::Tensor w = at::randn({6}, of(dtype)), p = at::randn({2, 3, 4}, of(dtype)), q = at::randn({2, 4}, of(dtype));
    Builder g;
    ir::Value *px = g.input(x), *py = g.input(y), *pz = g.input(z), *pw = g.input(w), *pp = g.input(p);
    ir::Value* pq = g.input(q);
    auto slice = [&](ir::Value* v, int64_t dim, ir::Argument start, ir::Argument end, int64_t step) {
      return g.call("aten::slice.Tensor", {v, dim, std::move(start), std::move(end), step});
    };
    ir::Value* s1 = g.call("aten::mul.Tensor", {slice(px, 0, int64_t{0}, c10::IValue(), 2), py});
    ir::Value* s2 = g.call("aten::add.Tensor", {slice(px, 1, int64_t{1}, kEnd, 2), pz, c10::Scalar(1)});
    ir::Value* s3 = g.call("aten::relu", {slice(px, 0, int64_t{1}, int64_t{5}, 1)});
    ir::Value* s4 =
        g.call("aten::add.Tensor", {g.call("aten::select.int", {px, int64_t{1}, int64_t{2}}), pw, c10::Scalar(1)});
    ir::Value* s5 = g.call("aten::neg", {g.call("aten::select.int", {px, int64_t{0}, int64_t{-1}})});
    ir::Value* s6 = g.call("aten::mul.Tensor", {g.call("aten::select.int", {pp, int64_t{1}, int64_t{1}}), pq});
    ir::Value* s7 =
        g.call("aten::mul.Scalar", {slice(g.call("aten::exp", {px}), 1, int64_t{0}, int64_t{4}, 3), c10::Scalar(2.0)});
    ir::Value* s8 = g.call("aten::add.Tensor", {slice(px, 0, int64_t{-3}, kEnd, 1), py, c10::Scalar(1)});
    check(g, {
                 pointwise("x[0::2] * y", s1, x.slice(0, 0, 6, 2) * y),
                 pointwise("x[:, 1::2] + z", s2, x.slice(1, 1, kEnd, 2) + z),
                 pointwise("relu(x[1:5])", s3, at::relu(x.slice(0, 1, 5))),
                 pointwise("x[:, 2] + w", s4, x.select(1, 2) + w),
                 pointwise("-x[-1]", s5, -x.select(0, -1)),
                 pointwise("p[:, 1] * q", s6, p.select(1, 1) * q),
                 pointwise("exp(x)[:, 0:4:3] * 2", s7, at::exp(x).slice(1, 0, 4, 3) * 2.0),
                 pointwise("x[-3:] + y", s8, x.slice(0, -3, kEnd) + y),
             });
  }
}

TEST_CASE("lowering: view, _unsafe_view and reshape of pointwise results and transposed inputs; unsqueeze, squeeze",
          "[inductor][lowering]") {
  for (auto dtype : {at::kFloat, at::kDouble}) {
    CAPTURE(dtype);
    at::Tensor a = at::randn({4, 6}, of(dtype)), b = at::randn({4, 6}, of(dtype)), c = at::randn({24}, of(dtype));
    at::Tensor v = at::randn({4}, of(dtype)), m = at::randn({3, 4}, of(dtype)), n = at::randn({4, 5}, of(dtype));
    at::Tensor k = at::randn({4, 1}, of(dtype));
    Builder g;
    ir::Value *pa = g.input(a), *pb = g.input(b), *pc = g.input(c), *pv = g.input(v), *pm = g.input(m);
    ir::Value *pn = g.input(n), *pk = g.input(k);
    ir::Value* s = g.call("aten::add.Tensor", {pa, pb, c10::Scalar(1)});
    ir::Value* ta = g.call("aten::t", {pa});
    ir::Value* w1 = g.call("aten::mul.Tensor", {g.call("aten::view", {s, Dims{24}}), pc});
    ir::Value* w2 = g.call("aten::relu", {g.call("aten::_unsafe_view", {s, Dims{3, 8}})});
    ir::Value* w3 = g.call("aten::neg", {g.call("aten::view", {s, Dims{-1, 3}})});
    ir::Value* w4 = g.call("aten::add.Tensor", {g.call("aten::reshape", {ta, Dims{24}}), pc, c10::Scalar(1)});
    ir::Value* w5 = g.call("aten::mul.Scalar", {g.call("aten::reshape", {ta, Dims{3, 2, 4}}), c10::Scalar(3.0)});
    ir::Value* w6 = g.call("aten::add.Tensor", {g.call("aten::unsqueeze", {pv, int64_t{0}}), pm, c10::Scalar(1)});
    ir::Value* w7 = g.call("aten::mul.Tensor", {g.call("aten::unsqueeze", {pv, int64_t{-1}}), pn});
    ir::Value* w8 = g.call("aten::add.Tensor", {g.call("aten::squeeze.dim", {pk, int64_t{1}}), pv, c10::Scalar(1)});
    // view → transpose → reshape (a copy in ATen: the transpose is not viewable as flat) → pointwise
    ir::Value* w9 =
        g.call("aten::mul.Tensor",
               {g.call("aten::reshape", {g.call("aten::t", {g.call("aten::view", {s, Dims{6, 4}})}), Dims{24}}), pc});
    // a view of a reshape of a pointwise result, consumed by another pointwise op
    ir::Value* w10 =
        g.call("aten::sigmoid", {g.call("aten::view", {g.call("aten::reshape", {s, Dims{2, 12}}), Dims{12, 2}})});
    const at::Tensor s_e = a + b;
    check(g, {
                 pointwise("view(a + b, [24]) * c", w1, s_e.view({24}) * c),
                 pointwise("relu(_unsafe_view(a + b, [3, 8]))", w2, at::relu(s_e.view({3, 8}))),
                 pointwise("-view(a + b, [-1, 3])", w3, -s_e.view({-1, 3})),
                 pointwise("reshape(t(a), [24]) + c", w4, a.t().reshape({24}) + c),
                 pointwise("reshape(t(a), [3, 2, 4]) * 3", w5, a.t().reshape({3, 2, 4}) * 3.0),
                 pointwise("unsqueeze(v, 0) + m", w6, v.unsqueeze(0) + m),
                 pointwise("unsqueeze(v, -1) * n", w7, v.unsqueeze(-1) * n),
                 pointwise("squeeze(k, 1) + v", w8, k.squeeze(1) + v),
                 pointwise("reshape(t(view(a + b, [6, 4])), [24]) * c", w9, s_e.view({6, 4}).t().reshape({24}) * c),
                 pointwise("sigmoid(view(reshape(a + b, [2, 12]), [12, 2]))", w10,
                           at::sigmoid(s_e.reshape({2, 12}).view({12, 2}))),
             });
  }
}

TEST_CASE("lowering: outputs that are views have eager's sizes, strides and values", "[inductor][lowering]") {
  for (auto dtype : {at::kFloat, at::kDouble}) {
    CAPTURE(dtype);
    at::Tensor x = at::randn({3, 5}, of(dtype)), p = at::randn({2, 3, 4}, of(dtype));
    Builder g;
    ir::Value *px = g.input(x), *pp = g.input(p);
    ir::Value* x2 = g.call("aten::mul.Scalar", {px, c10::Scalar(2.0)});
    ir::Value* o1 = g.call("aten::t", {x2});
    ir::Value* o2 = g.call("aten::permute", {g.call("aten::exp", {pp}), Dims{2, 0, 1}});
    ir::Value* xs = g.call("aten::sum.dim_IntList", {px, Dims{1}, true});
    ir::Value* o3 = g.call("aten::expand", {xs, Dims{3, 5}});
    ir::Value* o4 =
        g.call("aten::slice.Tensor", {g.call("aten::relu", {px}), int64_t{1}, int64_t{0}, kEnd, int64_t{2}});
    ir::Value* o5 = g.call("aten::select.int", {g.call("aten::neg", {px}), int64_t{1}, int64_t{0}});
    ir::Value* o6 = g.call("aten::transpose.int",
                           {g.call("aten::view", {g.call("aten::mul.Scalar", {pp, c10::Scalar(0.5)}), Dims{6, 4}}),
                            int64_t{0}, int64_t{1}});
    ir::Value* o7 = g.call("aten::t", {px});  // a view of an input
    ir::Value* o8 = g.call("aten::unsqueeze", {g.call("aten::tanh", {px}), int64_t{1}});
    const at::Tensor x2_e = x * 2.0;
    Expect e3{"expand(sum(x, [1], keepdim), [3, 5])", o3, x.sum(Dims{1}, true).expand({3, 5}),
              reduced(dtype, mag(x).sum(Dims{1}, true)), true};
    check(g, {
                 pointwise("x * 2 (the base of the next output)", x2, x2_e),
                 view_of("t(x * 2)", o1, x2_e.t()),
                 view_of("permute(exp(p), [2, 0, 1])", o2, at::exp(p).permute({2, 0, 1})),
                 e3,
                 view_of("relu(x)[:, ::2]", o4, at::relu(x).slice(1, 0, kEnd, 2)),
                 view_of("(-x)[:, 0]", o5, (-x).select(1, 0)),
                 view_of("transpose(view(p * 0.5, [6, 4]), 0, 1)", o6, (p * 0.5).view({6, 4}).transpose(0, 1)),
                 view_of("t(x), x an input", o7, x.t()),
                 view_of("unsqueeze(tanh(x), 1)", o8, at::tanh(x).unsqueeze(1)),
             });
  }
}

// --- reductions -------------------------------------------------------------------

TEST_CASE("lowering: sum.dim_IntList over last, first, middle, several and all dims, keepdim or not",
          "[inductor][lowering][reduction]") {
  const std::vector<std::optional<Dims>> dim_lists = {Dims{2},      Dims{0},       Dims{1}, Dims{0, 2},
                                                      Dims{-1, -3}, Dims{0, 1, 2}, Dims{},  // the empty list: every dim
                                                      std::nullopt};
  for (auto dtype : {at::kFloat, at::kDouble}) {
    CAPTURE(dtype);
    at::Tensor x = at::randn({4, 7, 9}, of(dtype));
    Builder g;
    ir::Value* px = g.input(x);
    std::vector<Expect> expects;
    for (const auto& dims : dim_lists) {
      for (bool keepdim : {false, true}) {
        ir::Value* v = g.call("aten::sum.dim_IntList", {px, dim_arg(dims), keepdim});
        expects.push_back(reduction("sum(x, " + dims_text(dims) + (keepdim ? ", keepdim)" : ")"), v,
                                    at::sum(x, dim_ref(dims), keepdim), at::sum(mag(x), dim_ref(dims), keepdim)));
      }
    }
    check(g, expects);
  }
}

TEST_CASE("lowering: aten::sum, mean.dim and mean", "[inductor][lowering][reduction]") {
  const std::vector<std::pair<std::optional<Dims>, bool>> mean_cases = {
      {Dims{2}, false}, {Dims{0}, true}, {Dims{0, 2}, false}, {Dims{-2}, true}, {Dims{}, false}, {std::nullopt, true}};
  for (auto dtype : {at::kFloat, at::kDouble}) {
    CAPTURE(dtype);
    at::Tensor x = at::randn({4, 7, 9}, of(dtype));
    Builder g;
    ir::Value* px = g.input(x);
    std::vector<Expect> expects;
    expects.push_back(reduction("sum(x)", g.call("aten::sum", {px}), at::sum(x), mag(x).sum()));
    expects.push_back(reduction("mean(x)", g.call("aten::mean", {px}), at::mean(x), mag(x).mean()));
    for (const auto& [dims, keepdim] : mean_cases) {
      ir::Value* v = g.call("aten::mean.dim", {px, dim_arg(dims), keepdim});
      expects.push_back(reduction("mean(x, " + dims_text(dims) + (keepdim ? ", keepdim)" : ")"), v,
                                  at::mean(x, dim_ref(dims), keepdim), at::mean(mag(x), dim_ref(dims), keepdim)));
    }
    check(g, expects);
  }
}

TEST_CASE("lowering: amax and amin propagate NaN like ATen", "[inductor][lowering][reduction]") {
  for (auto dtype : {at::kFloat, at::kDouble}) {
    CAPTURE(dtype);
    at::Tensor x = at::randn({5, 8}, of(dtype));
    // NaN first, last and in the middle of a row (an accumulator started from
    // the first element, or std::max(acc, x), drops some of them); an
    // infinity in a row without NaN.
    x[1][0].fill_(kNaN);
    x[2][7].fill_(kNaN);
    x[3][4].fill_(kNaN);
    x[0][3].fill_(-kInf);
    x[4][5].fill_(kInf);
    at::Tensor y = at::randn({3, 4, 5}, of(dtype));  // no NaN
    Builder g;
    ir::Value *px = g.input(x), *py = g.input(y);
    auto amax = [&](ir::Value* v, Dims dims, bool keepdim) { return g.call("aten::amax", {v, dims, keepdim}); };
    auto amin = [&](ir::Value* v, Dims dims, bool keepdim) { return g.call("aten::amin", {v, dims, keepdim}); };
    // max and min are exact whatever the order: the bound is 0 (NaN where eager has NaN).
    check(g, {
                 exactly("amax(x, [1])", amax(px, {1}, false), at::amax(x, {1})),
                 exactly("amax(x, [1], keepdim)", amax(px, {1}, true), at::amax(x, {1}, true)),
                 exactly("amax(x, [0])", amax(px, {0}, false), at::amax(x, {0})),
                 exactly("amax(x, []) (all dims)", amax(px, {}, false), at::amax(x, at::IntArrayRef{})),
                 exactly("amin(x, [1])", amin(px, {1}, false), at::amin(x, {1})),
                 exactly("amin(x, [0], keepdim)", amin(px, {0}, true), at::amin(x, {0}, true)),
                 exactly("amin(x, [0, 1])", amin(px, {0, 1}, false), at::amin(x, {0, 1})),
                 exactly("amax(y, [0, 2], keepdim)", amax(py, {0, 2}, true), at::amax(y, {0, 2}, true)),
                 exactly("amin(y, [-1])", amin(py, {-1}, false), at::amin(y, {-1})),
                 exactly("amax(y, [], keepdim)", amax(py, {}, true), at::amax(y, at::IntArrayRef{}, true)),
             });
  }
}

TEST_CASE("lowering: reductions of every element of a large tensor, split across threads on the CPU",
          "[inductor][lowering][reduction]") {
  // 300 × 211 elements (not a multiple of the chunk count): the C++
  // kernels fold the elements in chunks and combine the partials in chunk
  // order (Note [Split reductions]); amax sees a NaN in the last chunk
  // only, amin one in the first only, so a partial that drops its NaN shows.
  for (auto dtype : {at::kFloat, at::kDouble}) {
    CAPTURE(dtype);
    at::Tensor x = at::randn({300, 211}, of(dtype));
    at::Tensor with_nan = x.clone();
    with_nan[299][210].fill_(kNaN);
    at::Tensor first_nan = x.clone();
    first_nan[0][0].fill_(kNaN);
    Builder g;
    ir::Value *px = g.input(x), *pn = g.input(with_nan), *pf = g.input(first_nan);
    ir::Value* sum = g.call("aten::sum", {px, c10::IValue()});
    ir::Value* scaled = g.call("aten::mul.Scalar", {sum, c10::Scalar(0.5)});  // an epilogue
    ir::Value* mean = g.call("aten::mean", {px, c10::IValue()});
    check(g, {
                 reduction("sum", sum, x.sum(), mag(x).sum()),
                 reduction("sum * 0.5", scaled, x.sum() * 0.5, mag(x).sum() * 0.5),
                 reduction("mean", mean, x.mean(), mag(x).mean()),
                 exactly("amax, a NaN in the last chunk", g.call("aten::amax", {pn, Dims{}, false}),
                         at::amax(with_nan, at::IntArrayRef{})),
                 exactly("amin, a NaN in the first chunk", g.call("aten::amin", {pf, Dims{}, false}),
                         at::amin(first_nan, at::IntArrayRef{})),
                 exactly("amax", g.call("aten::amax", {px, Dims{}, false}), at::amax(x, at::IntArrayRef{})),
             });
    const inductor::GeneratedCode code = inductor::generate_code(g.g);
    if (!code.cuda) CHECK(code.source.find("part0[") != std::string::npos);
  }
}

TEST_CASE("lowering: reductions of a few long rows, split into chunks, the same bits with any thread count",
          "[inductor][lowering][reduction]") {
  // 3 rows of 40001 elements (Note [Split reductions]): 14 chunks of about
  // 8572 elements, so chunks span two rows and hold part of one row only.
  // A row's partials combine in chunk order: amax's NaN in the last element
  // of row 1 and amin's in the first of row 2 must survive their chunks.
  // The var_mean's variance reads its row's mean, computed between the
  // two. With 1, 2, 3 and 5 threads (a thread folds several chunks, or one)
  // the results are bitwise those of 1 thread: a thread count chosen per
  // call (Note [Threads on a shared machine]) never changes a value.
  for (auto dtype : {at::kFloat, at::kDouble}) {
    const at::Tensor x = at::randn({3, 40001}, of(dtype)) + 2;
    at::Tensor with_nan = x.clone();
    with_nan[1][40000].fill_(kNaN);
    with_nan[2][0].fill_(kNaN);
    const auto [var_e, mean_e] = at::var_mean(x, {1}, 1, true);
    // The variance of a row: sum((x - mean)^2) / (n - 1), each term's
    // error red_rtol of the squares' sum (as the var_mean test bounds it).
    const at::Tensor var_bound = reduced(dtype, (x - mean_e).square().sum(1, true) / 40000) + mag(var_e) * rtol(dtype);
    std::vector<at::Tensor> one_thread;
    for (int threads : {1, 2, 3, 5}) {
      CAPTURE(threads, dtype);
      Builder g;
      ir::Value *px = g.input(x), *pn = g.input(with_nan);
      ir::Value* sum = g.call("aten::sum.dim_IntList", {px, Dims{1}, false});
      ir::Value* scaled = g.call("aten::mul.Scalar", {sum, c10::Scalar(0.5)});  // a per-row epilogue
      ir::Node* vm = g.node("aten::var_mean.correction", {px, Dims{1}, c10::Scalar(1), true});
      const std::vector<Expect> expects = {
          reduction("sum", sum, x.sum(1), mag(x).sum(1)),
          reduction("sum * 0.5", scaled, x.sum(1) * 0.5, mag(x).sum(1) * 0.5),
          reduction("mean", vm->result(1), mean_e, mag(x).mean(1, true)),
          {"var", vm->result(0), var_e, var_bound},
          exactly("amax, NaN in row 1's last element", g.call("aten::amax", {pn, Dims{1}, false}),
                  at::amax(with_nan, 1)),
          exactly("amin, NaN in row 2's first element", g.call("aten::amin", {pn, Dims{1}, false}),
                  at::amin(with_nan, 1)),
      };
      inductor::InductorOptions o = options();
      o.threads = threads;
      std::vector<ir::Value*> outputs;
      for (const Expect& e : expects) outputs.push_back(e.value);
      const std::vector<at::Tensor> got = g.run(outputs, o);
      if (compile_only()) continue;
      require_expected(got, expects);
      const inductor::GeneratedCode code = inductor::generate_code(g.g);
      if (code.cuda) continue;
      CHECK(code.source.find("part0[") != std::string::npos);  // split, not one thread a row
      if (one_thread.empty()) one_thread = got;
      for (size_t i = 0; i < got.size(); ++i) {
        INFO("output " << i << ": " << expects[i].what);
        REQUIRE_EQUAL_TENSORS(got[i], one_thread[i]);
      }
    }
  }
}

TEST_CASE("lowering: var_mean.dim and var_mean.correction", "[inductor][lowering][reduction]") {
  // The zoo's graphs call var_mean.dim(self, dim, unbiased, keepdim): check
  // that this LibTorch has that overload with that argument order.
  const c10::OperatorHandle var_mean = ir::resolve_operator("aten::var_mean.dim");
  const c10::FunctionSchema& schema = var_mean.schema();
  REQUIRE(schema.arguments().size() == 4);
  REQUIRE(schema.arguments()[2].name() == "unbiased");
  REQUIRE(schema.arguments()[3].name() == "keepdim");
  REQUIRE_NOTHROW(ir::resolve_operator("aten::var_mean.correction"));

  struct Case {
    bool correction_overload;       // var_mean.correction, else var_mean.dim
    std::optional<Dims> dims;       // None: all dims
    std::optional<int> correction;  // .dim: 1 for unbiased, 0 for not; .correction: None means 1
    bool keepdim;
  };
  const std::vector<Case> cases = {
      {false, Dims{2}, 0, true},  // the layer norm form
      {false, Dims{2}, 1, false},
      {false, Dims{0, 2}, 1, true},
      {true, Dims{1}, 0, false},
      {true, Dims{-1}, 1, true},
      {true, std::nullopt, std::nullopt, false},
  };
  for (auto dtype : {at::kFloat, at::kDouble}) {
    CAPTURE(dtype);
    at::Tensor x = at::randn({3, 5, 17}, of(dtype));
    const at::Tensor x2 = x.to(at::kDouble).square();
    Builder g;
    ir::Value* px = g.input(x);
    std::vector<Expect> expects;
    for (const Case& c : cases) {
      ir::Node* n = nullptr;
      at::Tensor var_e, mean_e;
      std::string what;
      if (c.correction_overload) {
        const ir::Argument corr = c.correction ? c10::IValue(c10::Scalar(*c.correction)) : c10::IValue();
        n = g.node("aten::var_mean.correction", {px, dim_arg(c.dims), corr, c.keepdim});
        std::optional<at::Scalar> corr_e;
        if (c.correction) corr_e = at::Scalar(*c.correction);
        std::tie(var_e, mean_e) = at::var_mean(x, dim_ref(c.dims), corr_e, c.keepdim);
        what = "var_mean.correction(x, " + dims_text(c.dims) +
               ", correction=" + (c.correction ? std::to_string(*c.correction) : "None") + ")";
      } else {
        n = g.node("aten::var_mean.dim", {px, dim_arg(c.dims), *c.correction == 1, c.keepdim});
        std::tie(var_e, mean_e) = at::var_mean(x, dim_ref(c.dims), *c.correction == 1, c.keepdim);
        what = "var_mean.dim(x, " + dims_text(c.dims) + ", unbiased=" + (*c.correction == 1 ? "True" : "False") + ")";
      }
      if (c.keepdim) what += " keepdim";
      // var: the sum of the squares' magnitudes over (n - correction) bounds
      // the magnitudes of Σ(x - mean)² (two-pass) and of Σx² (one pass);
      // mean: a reduction of x.
      const int64_t count = reduced_count(x, c.dims) - c.correction.value_or(1);
      expects.push_back(
          reduction(what + " var", n->result(0), var_e, at::sum(x2, dim_ref(c.dims), c.keepdim) / double(count)));
      expects.push_back(reduction(what + " mean", n->result(1), mean_e, at::mean(mag(x), dim_ref(c.dims), c.keepdim)));
    }
    check(g, expects);
  }
}

TEST_CASE("lowering: var_mean stays accurate for rows whose mean is large against their spread",
          "[inductor][lowering][reduction]") {
  // Rows of mean 1000 and variance 1 in f32. ATen's var (Welford, double
  // accumulators on CPU) is accurate to f32 rounding. A stable algorithm
  // (Welford, or two passes: x - mean is exact here, the error of the mean
  // only adds n·δmean², about 1e-7 of var) errs by a few ulps per term of
  // var itself, far under 1e-4 of var; the one-pass E[x²] - E[x]² loses
  // about ulp(1e6) = 0.06, 6% of var. So var and rstd are checked to 1e-4
  // relative; mean and y as reductions of magnitude |x| (1000).
  at::Tensor x = 1000.0 + at::randn({16, 256});
  Builder g;
  ir::Value* px = g.input(x);
  LayerNorm ln = layer_norm_rows(g, px, nullptr, nullptr, 1, 1e-5);
  const auto [var_e, mean_e] = at::var_mean(x, Dims{1}, /*unbiased=*/false, /*keepdim=*/true);
  const at::Tensor rstd_e = at::rsqrt(var_e + 1e-5);
  const at::Tensor y_e = (x - mean_e) * rstd_e;
  const at::Tensor var_rel = at::full({}, 1e-4, at::kDouble);
  const LayerNormBounds bounds = layer_norm_bounds(x, at::Tensor(), at::Tensor(), mean_e, rstd_e, y_e, var_rel);
  check(g, {
               {"var", ln.var, var_e, mag(var_e) * var_rel},
               {"mean", ln.mean, mean_e, bounds.mean},
               {"rstd", ln.rstd, rstd_e, bounds.rstd},
               {"y", ln.y, y_e, bounds.y},
           });
}

TEST_CASE("lowering: reductions over transposed, permuted, sliced and expanded inputs",
          "[inductor][lowering][reduction]") {
  for (auto dtype : {at::kFloat, at::kDouble}) {
    CAPTURE(dtype);
    at::Tensor x = at::randn({6, 9}, of(dtype)), p = at::randn({3, 4, 5}, of(dtype)), v = at::randn({9}, of(dtype));
    at::Tensor xt = at::randn({9, 6}, of(dtype)).t();  // a placeholder with strides [1, 6]
    Builder g;
    ir::Value *px = g.input(x), *pp = g.input(p), *pv = g.input(v), *pxt = g.input(xt);
    ir::Value* tx = g.call("aten::t", {px});
    ir::Value* r1 = g.call("aten::sum.dim_IntList", {tx, Dims{1}, false});
    ir::Value* r2 = g.call("aten::amax", {g.call("aten::transpose.int", {pp, int64_t{0}, int64_t{2}}), Dims{0}, true});
    ir::Value* r3 = g.call("aten::mean.dim", {g.call("aten::permute", {pp, Dims{2, 0, 1}}), Dims{1, 2}, false});
    ir::Node* vm = g.node("aten::var_mean.dim", {tx, Dims{1}, false, true});
    ir::Value* r5 = g.call("aten::sum.dim_IntList", {pxt, Dims{0}, false});
    ir::Value* r6 = g.call("aten::sum.dim_IntList", {pxt, Dims{1}, true});
    ir::Value* r7 =
        g.call("aten::sum.dim_IntList",
               {g.call("aten::slice.Tensor", {px, int64_t{1}, int64_t{0}, kEnd, int64_t{2}}), Dims{1}, false});
    ir::Value* r8 = g.call("aten::sum.dim_IntList", {g.call("aten::expand", {pv, Dims{6, 9}}), Dims{0}, false});
    ir::Value* r9 = g.call("aten::amin", {g.call("aten::t", {g.call("aten::exp", {px})}), Dims{0}, false});
    const auto [var_e, mean_e] = at::var_mean(x.t(), Dims{1}, false, true);
    const at::Tensor xs = x.slice(1, 0, kEnd, 2);
    const at::Tensor amin_e = at::exp(x).t().amin(0);
    check(g, {
                 reduction("sum(t(x), [1])", r1, x.t().sum(1), mag(x).t().sum(1)),
                 exactly("amax(transpose(p, 0, 2), [0], keepdim)", r2, p.transpose(0, 2).amax(0, true)),
                 reduction("mean(permute(p, [2, 0, 1]), [1, 2])", r3, p.permute({2, 0, 1}).mean(Dims{1, 2}),
                           mag(p).permute({2, 0, 1}).mean(Dims{1, 2})),
                 reduction("var_mean(t(x), [1]) var", vm->result(0), var_e,
                           x.t().to(at::kDouble).square().mean(Dims{1}, true)),
                 reduction("var_mean(t(x), [1]) mean", vm->result(1), mean_e, mag(x).t().mean(Dims{1}, true)),
                 reduction("sum(xt, [0]), xt with strides [1, 6]", r5, xt.sum(0), mag(xt).sum(0)),
                 reduction("sum(xt, [1], keepdim)", r6, xt.sum(1, true), mag(xt).sum(1, true)),
                 reduction("sum(x[:, ::2], [1])", r7, xs.sum(1), mag(xs).sum(1)),
                 reduction("sum(expand(v, [6, 9]), [0])", r8, v.expand({6, 9}).sum(0), mag(v) * 6),
                 // exp differs by ulps (libm vs Sleef); the min of such values too
                 pointwise("amin(t(exp(x)), [0])", r9, amin_e),
             });
  }
}

// A batch norm's backward sums over N, H and W of an NCHW tensor: the
// kernel walks N outside and H·W inside (Note [Split loops]), also for the
// pointwise stages fused with the sums; its pointwise kernels walk N·C
// outside and H·W inside.
TEST_CASE("lowering: reductions over N, H and W of NCHW tensors, with the batch norm's pointwise stages",
          "[inductor][lowering][reduction]") {
  for (auto dtype : {at::kFloat, at::kDouble}) {
    CAPTURE(dtype);
    at::Tensor x = at::randn({4, 3, 5, 7}, of(dtype)), dy = at::randn({4, 3, 5, 7}, of(dtype));
    at::Tensor mean = at::randn({1, 3, 1, 1}, of(dtype));
    Builder g;
    ir::Value *px = g.input(x), *pdy = g.input(dy), *pmean = g.input(mean);
    const Dims nhw{0, 2, 3};
    ir::Value* centered = g.call("aten::sub.Tensor", {px, pmean});
    ir::Value* s1 = g.call("aten::sum.dim_IntList", {pdy, nhw, true});
    ir::Value* s2 = g.call("aten::sum.dim_IntList", {g.call("aten::mul.Tensor", {pdy, centered}), nhw, true});
    ir::Value* dx = g.call("aten::sub.Tensor", {pdy, g.call("aten::mul.Tensor", {centered, s2})});
    ir::Value* s3 = g.call("aten::sum.dim_IntList", {g.call("aten::exp", {px}), Dims{0, 3}, false});
    const at::Tensor c = x - mean, s2_e = (dy * c).sum(nhw, true);
    check(g, {
                 reduction("sum(dy, [0, 2, 3])", s1, dy.sum(nhw, true), mag(dy).sum(nhw, true)),
                 reduction("sum(dy * (x - mean), [0, 2, 3])", s2, s2_e, (mag(dy) * mag(c)).sum(nhw, true)),
                 // dx's tolerance is that of the sum it multiplies
                 reduction("dy - (x - mean) * s2", dx, dy - c * s2_e, mag(c) * (mag(dy) * mag(c)).sum(nhw, true)),
                 reduction("sum(exp(x), [0, 3])", s3, at::exp(x).sum(Dims{0, 3}), at::exp(x).sum(Dims{0, 3})),
             });
    // The pointwise kernels of a batch norm and of a bias: N·C outer and
    // H·W inner iterations, rows outer and a row's columns inner.
    at::Tensor scale = at::randn({3, 1, 1}, of(dtype)), rows = at::randn({6, 20}, of(dtype));
    at::Tensor bias = at::randn({20}, of(dtype));
    Builder pw;
    ir::Value *qx = pw.input(x), *qmean = pw.input(mean), *qscale = pw.input(scale);
    ir::Value *qrows = pw.input(rows), *qbias = pw.input(bias);
    ir::Value* y = pw.call("aten::mul.Tensor", {pw.call("aten::sub.Tensor", {qx, qmean}), qscale});
    ir::Value* z = pw.call("aten::relu", {pw.call("aten::add.Tensor", {qrows, qbias})});
    check(pw, {
                  pointwise("(x - mean) * scale", y, (x - mean) * scale),
                  pointwise("relu(rows + bias)", z, at::relu(rows + bias)),
              });
  }
}

TEST_CASE("lowering: reductions over 0-size dims, and of 1-element and 0-dim tensors",
          "[inductor][lowering][reduction]") {
  for (auto dtype : {at::kFloat, at::kDouble}) {
    CAPTURE(dtype);
    at::Tensor e = at::randn({3, 0, 4}, of(dtype)), y = at::randn({3, 4}, of(dtype));
    at::Tensor one = at::randn({1}, of(dtype)), one3 = at::randn({1, 1, 1}, of(dtype)), s = at::randn({}, of(dtype));
    at::Tensor v = at::randn({5}, of(dtype));
    Builder g;
    ir::Value *pe = g.input(e), *py = g.input(y), *pone = g.input(one), *pone3 = g.input(one3), *ps = g.input(s);
    ir::Value* pv = g.input(v);
    auto sum = [&](ir::Value* x, Dims dims, bool keepdim) {
      return g.call("aten::sum.dim_IntList", {x, std::move(dims), keepdim});
    };
    ir::Value* z1 = sum(pe, {1}, false);
    ir::Value* z2 = sum(pe, {1}, true);
    ir::Value* z3 = g.call("aten::sum", {pe});
    ir::Value* z4 = g.call("aten::mean.dim", {pe, Dims{1}, false});
    ir::Value* z5 = sum(pe, {0}, false);  // an empty result
    ir::Value* z6 = g.call("aten::add.Tensor", {z1, py, c10::Scalar(1)});
    ir::Value* u1 = sum(pone, {0}, false);
    ir::Value* u2 = g.call("aten::amax", {pone, Dims{0}, true});
    ir::Value* u3 = g.call("aten::mean", {pone});
    ir::Node* u4 = g.node("aten::var_mean.correction", {pone, Dims{0}, c10::IValue(c10::Scalar(0)), false});
    ir::Value* u6 = sum(pone3, {0, 2}, true);
    ir::Value* u7 = sum(ps, {}, false);
    ir::Value* u8 = g.call("aten::amax", {ps, Dims{}, false});
    ir::Value* u9 = sum(ps, {0}, false);  // dim 0 of a 0-dim tensor is the tensor itself, as in ATen
    ir::Value* u10 = g.call("aten::mul.Tensor", {pv, g.call("aten::sum", {pone})});
    const auto [var_e, mean_e] = at::var_mean(one, Dims{0}, at::Scalar(0), false);
    check(
        g,
        {
            // Sums over nothing are exactly 0 (a bound of 0); the mean of nothing is NaN.
            exactly("sum([3,0,4], [1])", z1, e.sum(1)),
            exactly("sum([3,0,4], [1], keepdim)", z2, e.sum(1, true)),
            exactly("sum([3,0,4])", z3, e.sum()),
            exactly("mean([3,0,4], [1]) (NaN)", z4, e.mean(1)),
            exactly("sum([3,0,4], [0]) (empty)", z5, e.sum(0)),
            pointwise("sum([3,0,4], [1]) + y", z6, e.sum(1) + y),
            reduction("sum([1], [0])", u1, one.sum(0), mag(one).sum(0)),
            exactly("amax([1], [0], keepdim)", u2, one.amax(0, true)),
            reduction("mean([1])", u3, one.mean(), mag(one).mean()),
            reduction("var_mean([1], [0], correction=0) var", u4->result(0), var_e, one.to(at::kDouble).square().sum()),
            reduction("var_mean([1], [0], correction=0) mean", u4->result(1), mean_e, mag(one).sum()),
            reduction("sum([1,1,1], [0, 2], keepdim)", u6, one3.sum(Dims{0, 2}, true), mag(one3).sum(Dims{0, 2}, true)),
            reduction("sum(0-dim, [])", u7, at::sum(s, at::OptionalIntArrayRef(at::IntArrayRef{})), mag(s)),
            exactly("amax(0-dim, [])", u8, at::amax(s, at::IntArrayRef{})),
            reduction("sum(0-dim, [0])", u9, s.sum(0), mag(s)),
            {"v * sum([1])", u10, v * one.sum(), close(v * one.sum())},
        });
  }
}

TEST_CASE("lowering: an empty input summed and written back in place (a reduction over nothing, then its write)",
          "[inductor][lowering][reduction]") {
  // The sum's group reduces rows of 0 elements; the write-back, of 0
  // elements too, must not be placed in those rows.
  at::Tensor x = at::randn({0, 3});
  Builder g;
  ir::Value* px = g.input(x);
  ir::Value* y = g.call("aten::add.Scalar", {px, c10::Scalar(1.0), c10::Scalar(1)});
  ir::Value* s = g.call("aten::sum", {y});
  g.call("aten::copy_", {px, y, false});
  check(g, {exactly("sum(x + 1) of [0, 3]", s, at::zeros({}))});
}

TEST_CASE("lowering: softmax rows of an empty batch, whose kernels have no elements",
          "[inductor][lowering][reduction]") {
  // The division reads the row sums through an index that simplifies to a
  // constant (o has no values), a load hoisted before the loop: a kernel of
  // no elements must not run it.
  at::Tensor x = at::randn({0, 3});
  Builder g;
  ir::Value* y = softmax_rows(g, g.input(x), -1);
  check(g, {exactly("softmax([0, 3], -1)", y, at::softmax(x, -1))});
}

// --- fused rows: softmax, log_softmax, layer norm ------------------------------------

TEST_CASE("lowering: decomposed softmax and log_softmax rows match at::softmax and at::log_softmax",
          "[inductor][lowering][reduction]") {
  struct Case {
    Dims sizes;
    int64_t dim;
  };
  // Rows of 20000, longer than a GPU thread block holds in registers, take
  // the max and the sum in one pass there (Note [Online softmax]). On a GPU
  // every launch configuration of the row kernels is checked.
  const std::vector<Case> cases = {{{8, 16, 33}, -1}, {{4, 1000}, -1}, {{8, 16, 33}, 1}, {{4, 20000}, -1}};
  for (auto dtype : {at::kFloat, at::kDouble}) {
    for (const Case& c : cases) {
      CAPTURE(dtype, c.sizes, c.dim);
      at::Tensor x = 3.0 * at::randn(c.sizes, of(dtype));
      // A row of large values: exp without the max subtracted would overflow f32.
      if (c.sizes.size() == 2) x[0].add_(100.0);
      // Masked rows, as attention's and the loss's: -inf before the row's
      // maximum, and a row of -inf only (NaN in eager's softmax).
      if (c.sizes.size() == 2) x[1].slice(0, 0, c.sizes[1] / 2).fill_(-kInf);
      if (c.sizes.size() == 2) x[2].fill_(-kInf);
      Builder g;
      ir::Value* px = g.input(x);
      ir::Value* y = softmax_rows(g, px, c.dim);
      ir::Value* ly = log_softmax_rows(g, px, c.dim);
      const at::Tensor y_e = at::softmax(x, c.dim);
      const at::Tensor ly_e = at::log_softmax(x, c.dim);
      // log_softmax: (x - m) is the same on both sides; log(s) moves by s's
      // relative error, red_rtol (see softmax_bound), as an absolute error.
      const std::vector<Expect> expects = {
          {"softmax", y, y_e, softmax_bound(y_e)},
          {"log_softmax", ly, ly_e, close(ly_e) + red_rtol(dtype)},
      };
      check(g, expects);
      check_each_config(g, expects);
    }
  }
}

TEST_CASE("lowering: decomposed layer norm rows (var_mean) match native_layer_norm, mean and rstd included",
          "[inductor][lowering][reduction]") {
  // Rows of 32, and of 768 (GPT-2's): on a GPU the longer rows' kernel
  // has two block sizes too (Note [Autotuning]).
  for (auto [dtype, n] :
       {std::pair{at::kFloat, int64_t{32}}, std::pair{at::kDouble, int64_t{32}}, std::pair{at::kFloat, int64_t{768}}}) {
    CAPTURE(dtype, n);
    const double eps = 1e-5;
    at::Tensor x = at::randn({4, 8, n}, of(dtype));
    at::Tensor w = at::randn({n}, of(dtype)), b = at::randn({n}, of(dtype));
    Builder g;
    ir::Value *px = g.input(x), *pw = g.input(w), *pb = g.input(b);
    LayerNorm ln = layer_norm_rows(g, px, pw, pb, 2, eps);
    const auto [y_e, mean_e, rstd_e] = at::native_layer_norm(x, {n}, w, b, eps);
    // var's relative error: red_rtol of the squares' magnitudes (as in the
    // var_mean test) over var + eps, from eager's var = rstd^-2 - eps.
    const at::Tensor var_e = rstd_e.to(at::kDouble).pow(-2) - eps;
    const at::Tensor var_rel = red_rtol(dtype) * x.to(at::kDouble).square().mean(Dims{-1}, true) / (var_e + eps);
    const LayerNormBounds bounds = layer_norm_bounds(x, w, b, mean_e, rstd_e, y_e, var_rel);
    REQUIRE(mean_e.sizes() == at::IntArrayRef{4, 8, 1});
    const std::vector<Expect> expects = {
        {"y", ln.y, y_e, bounds.y},
        {"mean", ln.mean, mean_e, bounds.mean},
        {"rstd", ln.rstd, rstd_e, bounds.rstd},
    };
    check(g, expects);
    check_each_config(g, expects);
  }
}

// --- dtypes, comparisons, casts ------------------------------------------------------

TEST_CASE("lowering: 0-dim CPU tensors (a learning rate, a step count) are read by the loops of any device",
          "[inductor][lowering]") {
  // On a GPU they are host scalars, passed to the kernel by value; a 0-dim
  // operand does not promote the result's dtype (f32 * f64 0-dim is f32),
  // and the division by the i64 step is a float division, as in eager.
  for (auto dtype : {at::kFloat, at::kDouble}) {
    CAPTURE(dtype);
    const at::Tensor p = at::randn({37, 5}, of(dtype)), grad = at::randn({37, 5}, of(dtype));
    const at::Tensor lr = at::full({}, 0.125, of(at::kDouble)), step = at::full({}, 3, of(at::kLong));
    Builder b;
    ir::Value *pp = b.input(p), *pg = b.input(grad), *plr = b.host_input(lr), *pstep = b.host_input(step);
    ir::Value* scaled = b.call("aten::div.Tensor", {b.call("aten::mul.Tensor", {pg, plr}), pstep});
    ir::Value* out = b.call("aten::sub.Tensor", {pp, scaled, c10::Scalar(1)});
    check(b, {pointwise("p - grad * lr / step", out, p - grad * lr / step)});
    REQUIRE(inductor::loop_ir(b.g).find("extern") == std::string::npos);  // one loop, no ATen call
  }
}

TEST_CASE("lowering: f32 tensors with 0-dim f64 tensors, pow.Scalar, rsub, erf, clone (an Adam update's ops)",
          "[inductor][lowering]") {
  at::Tensor p = at::randn({7, 5}), grad = at::randn({7, 5});
  at::Tensor beta = at::full({}, 0.9, at::kDouble), lr = at::full({}, 1e-3, at::kDouble);
  at::Tensor step = at::full({}, 3.0);  // f32, as optimizer steps are
  Builder g;
  ir::Value *pp = g.input(p), *pg = g.input(grad), *pbeta = g.input(beta), *plr = g.input(lr), *pstep = g.input(step);
  ir::Value* m1 = g.call("aten::mul.Tensor", {pg, pbeta});
  ir::Value* bc = g.call("aten::rsub.Scalar",
                         {g.call("aten::pow.Scalar", {c10::Scalar(0.9), pstep}), c10::Scalar(1), c10::Scalar(1)});
  ir::Value* d = g.call("aten::div.Tensor", {m1, bc});
  ir::Value* u = g.call("aten::mul.Tensor", {d, plr});
  ir::Value* q = g.call("aten::div.Tensor", {pp, plr});
  ir::Value* er = g.call("aten::erf", {pg});
  ir::Value* rs = g.call("aten::rsub.Scalar", {pg, c10::Scalar(2.0), c10::Scalar(1)});
  ir::Value* cl = g.call("aten::clone", {pp});
  ir::Value* pw = g.call("aten::pow.Scalar", {c10::Scalar(2.0), pg});
  const at::Tensor m1_e = grad * beta;
  const at::Tensor bc_e = at::rsub(at::pow(0.9, step), 1, 1);
  const at::Tensor d_e = m1_e / bc_e;
  // Results keep the f32 tensor's dtype (a 0-dim operand does not promote):
  // outside() checks the dtypes too. Bounds: the pointwise ones.
  REQUIRE(m1_e.scalar_type() == at::kFloat);
  check(g, {
               pointwise("grad * beta (0-dim f64)", m1, m1_e),
               pointwise("1 - 0.9 ** step", bc, bc_e),
               pointwise("grad * beta / (1 - 0.9 ** step)", d, d_e),
               pointwise("... * lr (0-dim f64)", u, d_e * lr),
               pointwise("p / lr (0-dim f64)", q, p / lr),
               pointwise("erf(grad)", er, at::erf(grad)),
               pointwise("rsub(grad, 2)", rs, at::rsub(grad, 2.0, 1)),
               exactly("clone(p)", cl, p.clone()),
               pointwise("2 ** grad", pw, at::pow(2.0, grad)),
           });
}

TEST_CASE("lowering: comparisons to bool, where, masked_fill with a broadcast mask and -inf", "[inductor][lowering]") {
  at::Tensor x = at::randn({4, 6});
  x.masked_fill_(at::rand({4, 6}) < 0.3, 0.0);  // exact zeros for eq and ne
  at::Tensor r = at::randn({6}), y = at::randn({4, 6}), c = at::randn({4, 1}) > 0;
  at::Tensor scores = at::randn({2, 4, 4});
  at::Tensor mask = at::triu(at::ones({4, 4}, at::kBool), 1);  // causal: the diagonal stays, so no row is all -inf
  Builder g;
  ir::Value *px = g.input(x), *pr = g.input(r), *py = g.input(y), *pc = g.input(c), *pscores = g.input(scores);
  ir::Value* pmask = g.input(mask);
  ir::Value* eq = g.call("aten::eq.Scalar", {px, c10::Scalar(0)});
  ir::Value* ne = g.call("aten::ne.Scalar", {px, c10::Scalar(0)});
  ir::Value* gt = g.call("aten::gt.Tensor", {px, pr});  // broadcast
  ir::Value* w1 = g.call("aten::where.self", {gt, px, py});
  ir::Value* w2 = g.call("aten::where.self", {pc, px, pr});  // [4, 1], [4, 6], [6]
  ir::Value* w3 = g.call("aten::where.ScalarOther", {eq, py, c10::Scalar(0.5)});
  ir::Value* mk = g.call("aten::mul.Tensor", {py, ne});  // bool promotes to f32
  ir::Value* mf = g.call("aten::masked_fill.Scalar", {pscores, pmask, c10::Scalar(-kInf)});
  ir::Value* sm = softmax_rows(g, mf, -1);
  const at::Tensor mf_e = scores.masked_fill(mask, -kInf);
  const at::Tensor sm_e = at::softmax(mf_e, -1);
  // Comparisons, selections, masking and a product by 0 or 1 are exact.
  check(g, {
               exactly("x == 0", eq, x == 0),
               exactly("x != 0", ne, x != 0),
               exactly("x > r (broadcast)", gt, x > r),
               exactly("where(x > r, x, y)", w1, at::where(x > r, x, y)),
               exactly("where(c [4,1], x, r [6])", w2, at::where(c, x, r)),
               exactly("where(x == 0, y, 0.5)", w3, at::where(x == 0, y, 0.5)),
               exactly("y * (x != 0)", mk, y * (x != 0)),
               exactly("masked_fill(scores, mask [4,4], -inf)", mf, mf_e),
               {"softmax of the masked scores", sm, sm_e, softmax_bound(sm_e)},
           });
}

TEST_CASE(
    "lowering: pow with the exponents ATen computes otherwise (sqrt, rsqrt, reciprocal, products), at -0 and -inf",
    "[inductor][lowering]") {
  // pow(-inf, 0.5) is inf but ATen's sqrt gives NaN; pow(-0, -0.5) is inf,
  // ATen's rsqrt -inf.
  const at::Tensor x = at::tensor({-kInf, -0.0, 0.0, 0.25, -4.0, 4.0, kInf, kNaN}).to(at::kFloat);
  Builder g;
  ir::Value* px = g.input(x);
  std::vector<Expect> expects;
  for (double e : {0.5, -0.5, -1.0, 2.0, 3.0, -2.0, 1.5}) {
    ir::Value* y = g.call("aten::pow.Tensor_Scalar", {px, c10::Scalar(e)});
    expects.push_back(pointwise("pow(x, " + std::to_string(e) + ")", y, x.pow(e)));
  }
  check(g, expects);
}

TEST_CASE("lowering: comparisons with a scalar of another kind, or of more precision than a half or bf16 tensor",
          "[inductor][lowering]") {
  // ATen compares an i64 tensor with 2.5 as float and a bool one with 2 as
  // i64 (the scalar's higher category promotes), and a half or bf16 tensor
  // with the scalar rounded to its dtype (so 0.1 rounded equals x = 0.1).
  const at::Tensor i = at::arange(-1, 5, at::kLong), flags = at::arange(4).remainder(2).to(at::kBool);
  const at::Tensor h = at::tensor({0.1, 0.2, 0.3}).to(at::kHalf), bf = h.to(at::kBFloat16);
  Builder g;
  ir::Value *pi = g.input(i), *pflags = g.input(flags), *ph = g.input(h), *pbf = g.input(bf);
  check(g, {
               exactly("i < 2.5", g.call("aten::lt.Scalar", {pi, c10::Scalar(2.5)}), i < 2.5),
               exactly("i == 2.5", g.call("aten::eq.Scalar", {pi, c10::Scalar(2.5)}), i == 2.5),
               exactly("flags == 2", g.call("aten::eq.Scalar", {pflags, c10::Scalar(2)}), flags == 2),
               exactly("flags < 0.5", g.call("aten::lt.Scalar", {pflags, c10::Scalar(0.5)}), flags < 0.5),
               exactly("half == 0.1", g.call("aten::eq.Scalar", {ph, c10::Scalar(0.1)}), h == 0.1),
               exactly("half >= 0.3", g.call("aten::ge.Scalar", {ph, c10::Scalar(0.3)}), h >= 0.3),
               exactly("bf16 == 0.1", g.call("aten::eq.Scalar", {pbf, c10::Scalar(0.1)}), bf == 0.1),
               exactly("bf16 > 0.2", g.call("aten::gt.Scalar", {pbf, c10::Scalar(0.2)}), bf > 0.2),
           });
}

TEST_CASE("lowering: integer arange as a function of the index; one-hot rows compared with a target",
          "[inductor][lowering]") {
  // nll_loss_backward's decomposition: -(arange(C) == target[:, None]) * grad,
  // never materializing the arange or the mask.
  const at::Tensor target = at::randint(0, 7, {5}, at::kLong), grad = at::randn({5, 1});
  Builder g;
  ir::Value *pt = g.input(target), *pg = g.input(grad);
  const c10::Device where = compile_only() ? at::Device(at::kCPU) : test_device();
  ir::Value* classes =
      g.call("aten::arange", {c10::Scalar(7), c10::IValue(at::kLong), c10::IValue(), where, c10::IValue()});
  ir::Value* steps = g.call("aten::arange.start_step", {c10::Scalar(3), c10::Scalar(40), c10::Scalar(5),
                                                        c10::IValue(at::kLong), c10::IValue(), where, c10::IValue()});
  ir::Value* hit = g.call("aten::eq.Tensor",
                          {g.call("aten::view", {classes, Dims{1, 7}}), g.call("aten::unsqueeze", {pt, int64_t{1}})});
  ir::Value* one_hot = g.call("aten::neg", {g.call("aten::to.dtype", {hit, at::kFloat, false, false, c10::IValue()})});
  ir::Value* dx = g.call("aten::mul.Tensor", {one_hot, pg});
  const at::Tensor hit_e = at::arange(7, at::kLong).view({1, 7}) == target.unsqueeze(1);
  // Comparisons, casts and a product by -1 or 0 are exact.
  check(g, {
               exactly("arange(7)", classes, at::arange(7, at::kLong)),
               exactly("arange(3, 40, 5)", steps, at::arange(3, 40, 5, at::kLong)),
               exactly("-(arange(7) == target[:, None]) * grad", dx, -hit_e.to(at::kFloat) * grad),
           });
  REQUIRE(inductor::loop_ir(g.g).find("extern") == std::string::npos);
}

TEST_CASE("lowering: int64 constants beyond 2^53, INT64_MAX and INT64_MIN are exact in integer loops",
          "[inductor][lowering]") {
  // Written through a double, 2^53 + 1 lost its last bit and INT64_MAX (a
  // masked_fill's "no index yet" sentinel) became INT64_MIN.
  constexpr int64_t kBig = (int64_t{1} << 53) + 1;
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max(), kMin = std::numeric_limits<int64_t>::min();
  const at::Tensor x = at::tensor({-7, 0, 1, 5}, at::kLong),
                   big = at::tensor(std::vector<int64_t>{kBig, kBig - 1, 0, kBig}, at::kLong);
  Builder g;
  ir::Value *px = g.input(x), *pbig = g.input(big);
  ir::Value* positive = g.call("aten::gt.Scalar", {px, c10::Scalar(0)});
  ir::Value* added = g.call("aten::add.Scalar", {px, c10::Scalar(kBig), c10::Scalar(1)});
  ir::Value* equal = g.call("aten::eq.Scalar", {pbig, c10::Scalar(kBig)});
  ir::Value* to_max = g.call("aten::masked_fill.Scalar", {px, positive, c10::Scalar(kMax)});
  ir::Value* to_min = g.call("aten::masked_fill.Scalar", {px, positive, c10::Scalar(kMin)});
  ir::Value* filled = g.call("aten::full_like", {px, c10::Scalar(kMax - 1), c10::IValue(), c10::IValue(), c10::IValue(),
                                                 c10::IValue(), c10::IValue()});
  check(g, {
               exactly("x + (2^53 + 1)", added, x + kBig),
               exactly("big == 2^53 + 1", equal, big == kBig),
               exactly("x.masked_fill(x > 0, INT64_MAX)", to_max, x.masked_fill(x > 0, kMax)),
               exactly("x.masked_fill(x > 0, INT64_MIN)", to_min, x.masked_fill(x > 0, kMin)),
               exactly("full_like(x, INT64_MAX - 1)", filled, at::full_like(x, kMax - 1)),
           });
  REQUIRE(inductor::loop_ir(g.g).find("extern") == std::string::npos);
}

TEST_CASE("lowering: NaN and infinite constants in bool loops are true, as ATen converts them",
          "[inductor][lowering]") {
  // numeric_limits<bool>::quiet_NaN() and ::infinity() are false.
  const at::Tensor mask = at::tensor({1, 0, 1, 0}) > 0;
  Builder g;
  ir::Value* pm = g.input(mask);
  ir::Value* nan_fill = g.call("aten::full_like", {pm, c10::Scalar(kNaN), c10::IValue(), c10::IValue(), c10::IValue(),
                                                   c10::IValue(), c10::IValue()});
  ir::Value* inf_fill = g.call("aten::masked_fill.Scalar", {pm, g.call("aten::logical_not", {pm}), c10::Scalar(-kInf)});
  check(g, {
               exactly("full_like(mask, nan)", nan_fill, at::full_like(mask, kNaN)),
               exactly("mask.masked_fill(~mask, -inf)", inf_fill, mask.masked_fill(mask.logical_not(), -kInf)),
           });
}

TEST_CASE("lowering: a one-hot selection summed over its line (nll_loss's pick of the target) reads the pick alone",
          "[inductor][lowering]") {
  // Note [One-hot selections]: where(arange(C) == target[:, None], logp, 0)
  // summed over the classes, logp the decomposed log_softmax of the row.
  // Targets outside [0, C) select nothing (0, as eager sums), and nothing is
  // read for them.
  const int64_t C = 1000;
  const at::Tensor x = at::randn({6, C}), target = at::tensor({3, 999, 0, -1, 1000, 517}, at::kLong);
  Builder g;
  ir::Value *px = g.input(x), *pt = g.input(target);
  const c10::Device where = compile_only() ? at::Device(at::kCPU) : test_device();
  ir::Value* classes =
      g.call("aten::arange", {c10::Scalar(C), c10::IValue(at::kLong), c10::IValue(), where, c10::IValue()});
  ir::Value* hit = g.call("aten::eq.Tensor",
                          {g.call("aten::view", {classes, Dims{1, C}}), g.call("aten::unsqueeze", {pt, int64_t{1}})});
  ir::Value* logp = log_softmax_rows(g, px, 1);
  ir::Value* picked = g.call("aten::sum.dim_IntList",
                             {g.call("aten::where.ScalarOther", {hit, logp, c10::Scalar(0.0)}), Dims{1}, false});
  const at::Tensor hit_e = at::arange(C, at::kLong).view({1, C}) == target.unsqueeze(1);
  const at::Tensor logp_e = at::log_softmax(x, 1);
  const at::Tensor want = at::where(hit_e, logp_e, 0).sum(1);
  // The pick is logp at one element, computed as the log_softmax rows are:
  // the row's sum of exponentials within red_rtol of eager's.
  check(g, {reduction("sum(where(one-hot, log_softmax(x), 0), 1)", picked, want, logp_e.abs().amax(1))});
  // The logits are read unmasked by the pass that makes the maximum and the
  // sum of exponentials, and under the one-hot condition by the pick.
  if (!compile_only()) {
    const std::string source = inductor::generate_code(g.g).source;
    INFO(source);
    CHECK(source.find(" ? buf0_in0[") != std::string::npos);
  }
}

TEST_CASE("lowering: constant_pad_nd of a pointwise value, on any sides, fused without reading out of bounds",
          "[inductor][lowering]") {
  // pad_mm's padded gradients (Note [Padding matmuls]): the pad is computed
  // in the producer's loop. Values outside the input are the constant,
  // those inside are the input's: a pad and a copy are exact.
  const at::Tensor x = at::randn({5, 7}), y = at::randn({3, 4, 6}).transpose(1, 2);
  Builder g;
  ir::Value *px = g.input(x), *py = g.input(y);
  ir::Value* e = g.call("aten::exp", {px});
  ir::Value* right = g.call("aten::constant_pad_nd", {e, Dims{0, 3}, c10::Scalar(0)});
  ir::Value* both = g.call("aten::constant_pad_nd", {e, Dims{2, 1, 5, 0}, c10::Scalar(-1.5)});
  ir::Value* whole = g.call("aten::constant_pad_nd", {py, Dims{1, 1, 0, 2, 3, 3}, c10::Scalar(2)});
  const at::Tensor ex = at::exp(x);
  check(g, {
               pointwise("exp(x) padded right by 3", right, at::constant_pad_nd(ex, {0, 3}, 0)),
               pointwise("exp(x) padded on both sides", both, at::constant_pad_nd(ex, {2, 1, 5, 0}, -1.5)),
               exactly("a transposed input padded in 3 dims", whole, at::constant_pad_nd(y, {1, 1, 0, 2, 3, 3}, 2)),
           });
  REQUIRE(inductor::loop_ir(g.g).find("extern") == std::string::npos);
}

TEST_CASE("lowering: cat of pointwise values and transposed inputs along any dim, masked, fused into its readers",
          "[inductor][lowering]") {
  // Note [Masked loads]: each element is read from one input, under a mask;
  // the inputs' producers (exp, a cast) and the cat's readers fuse with it.
  // A cat and a copy are exact; exp and the readers' ops are the pointwise
  // bound's. Sizes are odd so that no input's range is a multiple of a
  // vector's, and the 1-d empty tensor cat skips is among the inputs.
  const at::Tensor a = at::randn({3, 5, 7}), b = at::randn({3, 2, 7}), c = at::randn({3, 7, 6}).transpose(1, 2);
  const at::Tensor d = at::randn({3, 5, 1}, of(at::kDouble)), e = at::randn({0}), f = at::randn({2, 5, 7});
  Builder g;
  ir::Value *pa = g.input(a), *pb = g.input(b), *pc = g.input(c), *pd = g.input(d), *pe = g.input(e);
  ir::Value* pf = g.input(f);
  ir::Value* ea = g.call("aten::exp", {pa});
  using List = std::vector<ir::Value*>;
  ir::Value* middle = g.call("aten::cat", {List{ea, pb, pc, pe}, int64_t{1}});
  ir::Value* doubled = g.call("aten::mul.Scalar", {middle, c10::Scalar(2)});
  ir::Value* last = g.call("aten::cat", {List{pa, ea, pd}, int64_t{-1}});  // f32 and f64: f64
  ir::Value* first = g.call("aten::cat", {List{pf, pa}});
  // Reading one input's range of a cat (read by nothing else) reads that
  // input alone.
  ir::Value* ab = g.call("aten::cat", {List{ea, pb}, int64_t{1}});
  ir::Value* part = g.call("aten::slice.Tensor", {ab, int64_t{1}, int64_t{5}, int64_t{7}, int64_t{1}});
  ir::Value* part_neg = g.call("aten::neg", {part});
  // The GPT's q, k and v gradients: [B, H, T, D] -> [B, T, H·D] each, cat on the last dim.
  const at::Tensor q = at::randn({2, 3, 5, 4}), k = at::randn({2, 3, 5, 4}), v = at::randn({2, 3, 5, 4});
  List heads;
  for (const at::Tensor& t : {q, k, v}) {
    ir::Value* x = g.call("aten::transpose.int", {g.input(t), int64_t{1}, int64_t{2}});
    heads.push_back(g.call("aten::reshape", {x, Dims{2, 5, 12}}));
  }
  ir::Value* qkv = g.call("aten::cat", {heads, int64_t{2}});
  const at::Tensor want_middle = at::cat({at::exp(a), b, c, e}, 1);
  const at::Tensor want_last = at::cat({a, at::exp(a), d}, -1);
  auto merge = [](const at::Tensor& t) { return t.transpose(1, 2).reshape({2, 5, 12}); };
  check(g, {
               pointwise("exp(a), b, a transposed c and an empty tensor along dim 1", middle, want_middle),
               pointwise("their cat doubled", doubled, want_middle * 2),
               // f64 as cat promotes; exp(a) is f32's, so is its bound.
               {"a, exp(a) and an f64 d along dim -1", last, want_last, close(want_last.to(at::kFloat))},
               exactly("f, a along dim 0 (the default)", first, at::cat({f, a})),
               exactly("the negated slice of the cat that is b", part_neg, -b),
               exactly("q, k and v merged by heads and concatenated", qkv, at::cat({merge(q), merge(k), merge(v)}, 2)),
           });
  const std::string ir = inductor::loop_ir(g.g);
  INFO(ir);
  REQUIRE(ir.find("extern") == std::string::npos);
}

TEST_CASE("lowering: cat of i64, of bool compared into it, and of 0-size tensors", "[inductor][lowering]") {
  // Masked loads give 0 where an input is not chosen: integers and bools
  // too. A cat of no elements (a 0-size batch) still has the result's
  // sizes. Exact.
  const at::Tensor i = at::randint(-50, 50, {4, 3}, of(at::kLong)), j = at::randint(-50, 50, {4, 5}, of(at::kLong));
  const at::Tensor x = at::randn({4, 3}), none = at::randn({0, 3}), also_none = at::randn({0, 2});
  Builder g;
  ir::Value *pi = g.input(i), *pj = g.input(j), *px = g.input(x), *pn = g.input(none), *pa = g.input(also_none);
  using List = std::vector<ir::Value*>;
  ir::Value* ints = g.call("aten::cat", {List{pi, pj, pi}, int64_t{1}});
  ir::Value* shifted = g.call("aten::add.Scalar", {ints, c10::Scalar(7), c10::Scalar(1)});
  ir::Value* positive = g.call("aten::gt.Scalar", {px, c10::Scalar(0)});
  ir::Value* bools = g.call("aten::cat", {List{positive, g.call("aten::lt.Scalar", {px, c10::Scalar(0)})}});
  ir::Value* empty = g.call("aten::cat", {List{pn, pa}, int64_t{1}});
  check(g, {
               exactly("i, j, i along dim 1, plus 7", shifted, at::cat({i, j, i}, 1) + 7),
               exactly("x > 0, x < 0 along dim 0", bools, at::cat({x > 0, x < 0})),
               exactly("[0, 3] and [0, 2] along dim 1", empty, at::cat({none, also_none}, 1)),
           });
  const std::string ir = inductor::loop_ir(g.g);
  INFO(ir);
  REQUIRE(ir.find("extern") == std::string::npos);
}

TEST_CASE("lowering: max_pool2d_with_indices and its backward, padded, strided, overlapping, ceil_mode, NaN and ties",
          "[inductor][lowering]") {
  // Note [Max pooling]. The forward selects (values and indices exact);
  // the backward adds at most ceil(k / s)² gradients per element in
  // ATen's order starting from 0, as ATen's kernels do: exact in practice,
  // checked within the pointwise bound (a contraction or another order of
  // two equal maxima's gradients moves a few ulps).
  struct Case {
    std::string what;
    at::Tensor x;
    Dims kernel, stride, padding;
    bool ceil_mode;
  };
  at::manual_seed(11);
  at::Tensor ties = at::randint(0, 3, {2, 3, 9, 10}).to(at::kFloat);  // equal maxima in most windows
  at::Tensor special = at::randn({1, 2, 7, 8});
  special.index_put_({0, 0, 2, 3}, kNaN);
  special.index_put_({0, 1}, -kInf);  // a channel of -inf: every window keeps its first index
  const std::vector<Case> cases = {
      {"ResNet's stem: 3x3, stride 2, padding 1", at::randn({2, 3, 9, 10}), {3, 3}, {2, 2}, {1, 1}, false},
      {"LeNet's 2x2, stride 2", at::randn({2, 3, 8, 8}), {2, 2}, {}, {0, 0}, false},
      {"3x3, stride 1, padding 1", at::randn({2, 2, 6, 5}), {3, 3}, {1, 1}, {1, 1}, false},
      {"3x2, stride (2, 1), padding (1, 0)", at::randn({1, 3, 7, 6}), {3, 2}, {2, 1}, {1, 0}, false},
      {"ceil_mode: a last window past the input", at::randn({2, 3, 8, 8}), {3, 3}, {2, 2}, {0, 0}, true},
      {"channels-last input",
       at::randn({2, 4, 9, 9}).contiguous(at::MemoryFormat::ChannelsLast),
       {3, 3},
       {2, 2},
       {1, 1},
       false},
      {"3-d input (C, H, W)", at::randn({3, 9, 10}), {3, 3}, {2, 2}, {1, 1}, false},
      {"ties", ties, {3, 3}, {2, 2}, {1, 1}, false},
      {"NaN and -inf", special, {3, 3}, {2, 2}, {1, 1}, false},
      {"an empty batch", at::randn({0, 3, 8, 8}), {3, 3}, {2, 2}, {1, 1}, false},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    const Dims dilation = {1, 1};
    const at::Tensor x2 = c.x * 2;
    auto [want, want_idx] = at::max_pool2d_with_indices(x2, c.kernel, c.stride, c.padding, dilation, c.ceil_mode);
    const at::Tensor grad = at::randn(want.sizes());
    const at::Tensor want_dx = at::max_pool2d_with_indices_backward(grad * 2, x2, c.kernel, c.stride, c.padding,
                                                                    dilation, c.ceil_mode, want_idx);
    Builder g;
    ir::Value *px = g.input(c.x), *pg = g.input(grad), *pidx = g.input(want_idx);
    ir::Value* x2v = g.call("aten::mul.Scalar", {px, c10::Scalar(2)});  // a producer fused into the window
    ir::Node* pool =
        g.node("aten::max_pool2d_with_indices", {x2v, c.kernel, c.stride, c.padding, dilation, c.ceil_mode});
    ir::Value* g2 = g.call("aten::mul.Scalar", {pg, c10::Scalar(2)});
    ir::Value* dx = g.call("aten::max_pool2d_with_indices_backward",
                           {g2, x2v, c.kernel, c.stride, c.padding, dilation, c.ceil_mode, pidx});
    check(g, {
                 exactly("values", pool->result(0), want),
                 exactly("indices", pool->result(1), want_idx),
                 pointwise("the backward", dx, want_dx),
             });
    // Lowered; on the CPU the backward is ATen's (Note [Max pooling]).
    const std::string ir = inductor::loop_ir(g.g);
    REQUIRE(ir.find("= aten::max_pool2d_with_indices\n") == std::string::npos);
    REQUIRE((ir.find("= aten::max_pool2d_with_indices_backward\n") == std::string::npos) == test_device().is_cuda());
  }
}

TEST_CASE("lowering: a training step's max-pool indices are kept as int32 between its forward and backward",
          "[inductor][lowering]") {
  // Note [Narrow max-pool indices]: the backward (tagged so, as autograd's
  // nodes are in a training step's graph) gets the indices widened from an
  // int32 copy, with ATen's gradient (as in the test above); indices that
  // the graph returns, or that a forward node reads, stay int64.
  at::manual_seed(12);
  const at::Tensor x = at::randn({2, 3, 9, 10});
  const Dims kernel = {3, 3}, stride = {2, 2}, padding = {1, 1}, dilation = {1, 1};
  auto [want, want_idx] = at::max_pool2d_with_indices(x, kernel, stride, padding, dilation, false);
  const at::Tensor grad = at::randn(want.sizes());
  const at::Tensor want_dx =
      at::max_pool2d_with_indices_backward(grad, x, kernel, stride, padding, dilation, false, want_idx);
  for (const bool returned : {false, true}) {
    INFO((returned ? "indices returned" : "indices read by the backward only"));
    Builder g;
    ir::Value *px = g.input(x), *pg = g.input(grad);
    ir::Node* pool = g.node("aten::max_pool2d_with_indices", {px, kernel, stride, padding, dilation, false});
    ir::Node* backward = g.node("aten::max_pool2d_with_indices_backward",
                                {pg, px, kernel, stride, padding, dilation, false, pool->result(1)});
    backward->add_tag("backward");
    std::vector<Expect> expected = {exactly("values", pool->result(0), want),
                                    pointwise("the backward", backward->result(), want_dx)};
    if (returned) expected.push_back(exactly("indices", pool->result(1), want_idx));
    check(g, expected);
    const std::string ir = inductor::loop_ir(g.g);
    INFO(ir);
    CHECK((ir.find(" : Int[2, 3, 5, 5]") != std::string::npos) == !returned);
  }
}

TEST_CASE("lowering: to.dtype and _to_copy between f32 and f64, functional copy broadcasting its source",
          "[inductor][lowering]") {
  at::Tensor x32 = at::randn({5, 3}), z64 = at::randn({5, 3}, at::kDouble);
  at::Tensor self = at::randn({3, 4}), src = at::randn({4}, at::kDouble);
  Builder g;
  ir::Value *px = g.input(x32), *pz = g.input(z64), *pself = g.input(self), *psrc = g.input(src);
  ir::Value* x64 = g.call("aten::to.dtype", {px, at::kDouble});
  ir::Value* y64 = g.call("aten::mul.Tensor", {x64, pz});
  ir::Value* back = g.call("aten::_to_copy", {y64, at::kFloat});
  ir::Value* e64 = g.call("aten::exp", {g.call("aten::_to_copy", {px, at::kDouble})});
  ir::Value* back2 = g.call("aten::to.dtype", {g.call("aten::add.Tensor", {back, px, c10::Scalar(1)}), at::kDouble});
  ir::Value* cp = g.call("aten::copy", {pself, psrc, false});  // [4] f64 into [3, 4] f32
  ir::Value* cpa = g.call("aten::add.Tensor", {cp, pself, c10::Scalar(1)});
  const at::Tensor y64_e = x32.to(at::kDouble) * z64;
  const at::Tensor back_e = y64_e.to(at::kFloat);
  const at::Tensor cp_e = at::copy(self, src);
  check(g, {
               exactly("to(x32, f64)", x64, x32.to(at::kDouble)),
               pointwise("to(x32, f64) * z64", y64, y64_e),
               pointwise("_to_copy(..., f32)", back, back_e),
               pointwise("exp(_to_copy(x32, f64))", e64, at::exp(x32.to(at::kDouble))),
               pointwise("to(back + x32, f64)", back2, (back_e + x32).to(at::kDouble)),
               exactly("copy(self f32 [3,4], src f64 [4])", cp, cp_e),
               pointwise("copy(self, src) + self", cpa, cp_e + self),
           });
}

// --- schedules -------------------------------------------------------------------------

TEST_CASE("lowering: a pointwise value read by reductions and later pointwise ops, and returned",
          "[inductor][lowering][reduction]") {
  for (auto dtype : {at::kFloat, at::kDouble}) {
    CAPTURE(dtype);
    at::Tensor x = at::randn({6, 10}, of(dtype)), y = at::randn({6, 10}, of(dtype));
    Builder g;
    ir::Value *px = g.input(x), *py = g.input(y);
    ir::Value* p = g.call("aten::mul.Tensor", {px, py});
    ir::Value* s = g.call("aten::sum.dim_IntList", {p, Dims{1}, true});
    ir::Value* q = g.call("aten::sub.Tensor", {p, s, c10::Scalar(1)});
    ir::Value* r = g.call("aten::exp", {g.call("aten::neg", {g.call("aten::abs", {p})})});
    ir::Value* a = g.call("aten::amax", {p, Dims{0}, false});
    const at::Tensor p_e = x * y;
    const at::Tensor s_e = p_e.sum(1, true);
    const at::Tensor q_e = p_e - s_e;
    const at::Tensor s_bound = reduced(dtype, mag(p_e).sum(1, true));
    check(g, {
                 pointwise("p = x * y", p, p_e),
                 {"sum(p, [1], keepdim)", s, s_e, s_bound},
                 {"p - sum(p)", q, q_e, close(q_e) + s_bound},  // s's error passes through the subtraction
                 pointwise("exp(-|p|)", r, at::exp(-p_e.abs())),
                 pointwise("amax(p, [0])", a, p_e.amax(0)),  // p itself may differ by an ulp (computed twice)
             });
  }
}

TEST_CASE("lowering: a value computed before an extern copy_ into its input reads the old input",
          "[inductor][lowering]") {
  // y = x * 2 and s = sum(x) are computed before copy_(x, z) writes x; their
  // only consumers come after it. The outputs must be eager's from the old x,
  // x must hold z afterwards, and a read of copy_'s result (x as written) sees z.
  at::Tensor x = at::randn({4, 5}), z = at::randn({4, 5});
  const at::Tensor old_x = x.clone();
  Builder g;
  ir::Value *px = g.input(x), *pz = g.input(z);
  ir::Value* y = g.call("aten::mul.Scalar", {px, c10::Scalar(2.0)});
  ir::Value* s = g.call("aten::sum.dim_IntList", {px, Dims{1}, true});
  ir::Value* written = g.call("aten::copy_", {px, pz, false});
  ir::Value* out = g.call("aten::add.Scalar", {y, c10::Scalar(1.0), c10::Scalar(1)});
  ir::Value* out2 = g.call("aten::sub.Tensor", {y, s, c10::Scalar(1)});
  ir::Value* out3 = g.call("aten::mul.Scalar", {written, c10::Scalar(3.0)});
  const at::Tensor s_e = old_x.sum(1, true);
  const at::Tensor s_bound = reduced(at::kFloat, mag(old_x).sum(1, true));
  const at::Tensor out2_e = old_x * 2.0 - s_e;
  check(g, {
               pointwise("x * 2 + 1, x read before the copy_", out, old_x * 2.0 + 1.0),
               {"x * 2 - sum(x, [1]), x read before the copy_", out2, out2_e, close(out2_e) + s_bound},
               pointwise("copy_(x, z) * 3", out3, z * 3.0),
           });
  if (!compile_only()) REQUIRE_EQUAL_TENSORS(g.inputs[0].cpu(), z);
}

// --- bf16 and f16 (Note [Reduced-precision loops]) ---------------------------------------

namespace {

/// The unit roundoff of a reduced-precision dtype: half its ulp at 1
/// (bf16 keeps 8 significant bits, f16 11).
double unit_roundoff(at::ScalarType t) { return t == at::kBFloat16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11); }

}  // namespace

TEST_CASE("lowering: bf16 and f16 loops load as float, compute in float and store rounded to nearest even",
          "[inductor][lowering][reduced]") {
  for (auto dtype : {at::kBFloat16, at::kHalf}) {
    CAPTURE(dtype);
    const double u = unit_roundoff(dtype);
    // Casts from f32: ties, values between two of the dtype's, NaN, infinities,
    // overflow (f16's largest finite value is 65504) and subnormals.
    at::Tensor x32 = at::randn({64});
    x32.slice(0, 0, 8).copy_(at::tensor({1.0f + 1.0f / 256, 1.0f + 3.0f / 256, 1.0f + 1.0f / 2048, 1.0f + 3.0f / 2048,
                                         std::nanf(""), INFINITY, -INFINITY, 1e5f}));
    x32.slice(0, 8, 10).copy_(at::tensor({1e-6f, -3e-41f}));
    const at::Tensor x = at::randn({8, 300}).to(dtype), y = at::randn({8, 300}).to(dtype), w = at::randn({300});
    Builder g;
    ir::Value *px32 = g.input(x32), *px = g.input(x), *py = g.input(y), *pw = g.input(w);
    ir::Value* cast = g.call("aten::_to_copy", {px32, dtype});
    // An autocast round trip, inlined into a float product: rounds where it stands.
    ir::Value* trip =
        g.call("aten::mul.Scalar",
               {g.call("aten::_to_copy", {g.call("aten::_to_copy", {px32, dtype}), at::kFloat}), c10::Scalar(2.0)});
    ir::Value* chain =
        g.call("aten::add.Tensor", {g.call("aten::mul.Tensor", {g.call("aten::exp", {px}), py}), px, c10::Scalar(1)});
    ir::Value* mixed = g.call("aten::mul.Tensor", {px, pw});  // bf16 * f32: f32
    ir::Value* sum = g.call("aten::sum.dim_IntList", {px, Dims{1}, true});
    ir::Value* amax = g.call("aten::amax", {px, Dims{1}, false});
    ir::Value* sm = softmax_rows(g, px, 1);
    ir::Value* full = g.call("aten::full_like",
                             {px, c10::Scalar(0.1), dtype, c10::IValue(), c10::IValue(), c10::IValue(), c10::IValue()});
    ir::Value* filled = g.call("aten::add.Tensor", {full, px, c10::Scalar(1)});
    const at::Tensor chain_e = at::exp(x) * y + x;
    const at::Tensor sum_e = x.sum(1, true), sm_e = at::softmax(x, 1);
    // Eager rounds after exp, mul and add, the loop once at its store: each
    // rounding moves a value by at most u of its magnitude, so the two are
    // within 4u of the terms' magnitudes (and f32's ulps, far below that).
    const at::Tensor terms = mag(at::exp(x.to(at::kDouble)) * y.to(at::kDouble)) + mag(x);
    // A sum or softmax: eager and the loop each round a float result once
    // (2u of the result), after float sums in different orders (red_rtol of
    // the magnitudes, see there).
    const at::Tensor sum_bound = 2 * u * mag(sum_e) + reduced(at::kFloat, mag(x).sum(1, true));
    check(g, {
                 exactly("_to_copy(f32 -> " + std::string(c10::toString(dtype)) + ")", cast, x32.to(dtype)),
                 exactly("_to_copy(_to_copy(x, dtype), f32) * 2", trip, x32.to(dtype).to(at::kFloat) * 2),
                 {"exp(x) * y + x", chain, chain_e, 4 * u * terms + 1e-6},
                 pointwise("x * w (f32)", mixed, x * w),
                 {"sum(x, [1])", sum, sum_e, sum_bound},
                 exactly("amax(x, [1])", amax, x.amax(1)),
                 {"softmax(x, 1)", sm, sm_e, 2 * u * mag(sm_e) + softmax_bound(sm_e.to(at::kFloat))},
                 exactly("full_like(x, 0.1) + x: the fill rounds, as eager's tensor holds it", filled,
                         at::full_like(x, 0.1) + x),
             });
    const std::string code = inductor::generate_code(g.g).source;
    REQUIRE(inductor::loop_ir(g.g).find("extern") == std::string::npos);  // every op a loop, no ATen call
    REQUIRE(code.find(dtype == at::kBFloat16 ? "crucible_float_to_bf16" : "crucible_float_to_f16") !=
            std::string::npos);
  }
}

TEST_CASE("lowering: attention rows under bf16 autocast (scaled, masked softmax and its backward), of any length",
          "[inductor][lowering][reduced]") {
  // The rows of GPT-2's attention as autocast traces them: bf16 scores
  // widened, scaled and masked; the softmax in f32, rounded to bf16; its
  // backward (decomposed: y·g − y·Σ y·g) from a bf16 gradient. Rows short
  // enough are held in registers by the CUDA kernels (Note [Persistent
  // rows]: 64, 1000 and 1024 elements), longer ones walked in stages (6000).
  const double u = unit_roundoff(at::kBFloat16);
  for (int64_t n : {64, 1000, 1024, 6000}) {
    CAPTURE(n);
    const at::Tensor scores = (3 * at::randn({2, 3, 8, n})).to(at::kBFloat16);
    const at::Tensor grad = at::randn({2, 3, 8, n}).to(at::kBFloat16);
    // Causal-style: row i keeps its first n/8·(i+1) keys, none all masked.
    const at::Tensor mask = (at::arange(n).unsqueeze(0) < (at::arange(1, 9).unsqueeze(1) * n / 8)).to(at::kFloat);
    const double scale = 0.125;
    Builder g;
    ir::Value *ps = g.input(scores), *pg = g.input(grad), *pm = g.input(mask);
    ir::Value* x = g.call("aten::mul.Scalar", {g.call("aten::_to_copy", {ps, at::kFloat}), c10::Scalar(scale)});
    ir::Value* masked =
        g.call("aten::masked_fill.Scalar", {x, g.call("aten::eq.Scalar", {pm, c10::Scalar(0)}), c10::Scalar(-kInf)});
    ir::Value* y = softmax_rows(g, masked, -1);
    ir::Value* y16 = g.call("aten::_to_copy", {y, at::kBFloat16});
    ir::Value* gy = g.call("aten::mul.Tensor", {g.call("aten::_to_copy", {pg, at::kFloat}), y});
    ir::Value* s = g.call("aten::sum.dim_IntList", {gy, Dims{-1}, true});
    ir::Value* gi = g.call("aten::sub.Tensor", {gy, g.call("aten::mul.Tensor", {y, s}), c10::Scalar(1)});
    ir::Value* gi16 = g.call("aten::_to_copy", {gi, at::kBFloat16});
    const at::Tensor y_e = at::softmax((scores.to(at::kFloat) * scale).masked_fill(mask == 0, -kInf), -1);
    const at::Tensor gy_e = grad.to(at::kFloat) * y_e, s_e = gy_e.sum(-1, true);
    const at::Tensor gi_e = gy_e - y_e * s_e;
    // Each side rounds its f32 result to bf16 once (2u of it, one ulp either
    // way), after a softmax within softmax_bound; the backward's row sum
    // differs by red_rtol of Σ|y·g|, which reaches gi through y, and its
    // products by a few f32 ulps of the terms.
    const at::Tensor gi_bound = 2 * u * mag(gi_e) + mag(y_e) * reduced(at::kFloat, mag(gy_e).sum(-1, true)) +
                                2 * rtol(at::kFloat) * (mag(gy_e) + mag(y_e * s_e)) + softmax_bound(y_e) * mag(grad) +
                                atol(at::kFloat);
    const std::vector<Expect> expects = {
        {"softmax rows, to bf16", y16, y_e.to(at::kBFloat16), 2 * u * mag(y_e) + softmax_bound(y_e)},
        {"their backward, to bf16", gi16, gi_e.to(at::kBFloat16), gi_bound},
    };
    check(g, expects);
    check_each_config(g, expects);
    const inductor::GeneratedCode code = inductor::generate_code(g.g);
    // Rows of up to 4096 keep what later stages read in per-thread rows on
    // the CPU (Note [Kept row values]); on a GPU rows of up to 8192 in
    // register arrays, in the configuration of 1024 threads (Note
    // [Autotuning]).
    const std::string kept = code.cuda ? "_row[" : "keep_";
    CHECK((code.source.find(kept) != std::string::npos) == (n <= (code.cuda ? 8192 : 4096)));
  }
}

TEST_CASE("lowering: pointwise kernels move 16-byte vectors on a GPU and elements from inputs not 16-byte aligned",
          "[inductor][lowering][reduced]") {
  // A GELU over bf16 rows with a float bias (GPT-2's MLP): the CUDA kernel
  // takes 8 consecutive elements a thread (Note [Vectorized pointwise
  // kernels]), the bias read as two float vectors at 8·(oh mod 24) + ol.
  // Run on inputs whose data starts 2 bytes past a 16-byte boundary (a view
  // at storage offset 1), the same kernel moves them element by element.
  const double u = unit_roundoff(at::kBFloat16);
  for (bool aligned : {true, false}) {
    CAPTURE(aligned);
    const at::Tensor x = at::randn({64, 192}).to(at::kBFloat16), bias = at::randn({192});
    Builder g;
    ir::Value *px = g.input(x), *pb = g.input(bias);
    if (!aligned && !compile_only()) {  // the same values, on the device at an odd element
      at::Tensor storage = at::empty({x.numel() + 1}, g.inputs[0].options());
      g.inputs[0] = storage.slice(0, 1).view(x.sizes()).copy_(g.inputs[0]);
    }
    ir::Value* h = g.call("aten::_to_copy", {g.call("aten::add.Tensor", {px, pb, c10::Scalar(1)}), at::kBFloat16});
    ir::Value* hf = g.call("aten::_to_copy", {h, at::kFloat});
    ir::Value* erf = g.call("aten::erf", {g.call("aten::mul.Scalar", {hf, c10::Scalar(M_SQRT1_2)})});
    ir::Value* gelu = g.call("aten::mul.Tensor", {g.call("aten::mul.Scalar", {hf, c10::Scalar(0.5)}),
                                                  g.call("aten::add.Scalar", {erf, c10::Scalar(1), c10::Scalar(1)})});
    ir::Value* out = g.call("aten::_to_copy", {gelu, at::kBFloat16});
    const at::Tensor h_e = (x.to(at::kFloat) + bias).to(at::kBFloat16).to(at::kFloat);
    const at::Tensor gelu_e = h_e * 0.5 * (at::erf(h_e * M_SQRT1_2) + 1);
    // h: each side rounds the same float sum once; the GELU: rounded to
    // bf16 once on each side (2u), after erf within a few f32 ulps (rtol)
    // of the same h.
    check(g, {
                 exactly("x + bias, to bf16", h, h_e.to(at::kBFloat16)),
                 {"GELU, to bf16", out, gelu_e.to(at::kBFloat16),
                  2 * u * mag(gelu_e) + 4 * rtol(at::kFloat) * mag(h_e) + atol(at::kFloat)},
             });
    const inductor::GeneratedCode code = inductor::generate_code(g.g);
    if (code.cuda) {
      INFO(code.source);
      CHECK(code.source.find("crucible_move_vector<8>(v") != std::string::npos);    // a vector load
      CHECK(code.source.find("crucible_move_vector<8>(buf") != std::string::npos);  // and a store
    }
  }
}

TEST_CASE("lowering: column reductions over long ranges (a bias's gradient), split across blocks on a GPU",
          "[inductor][lowering][reduction]") {
  // Summed over the 4096 (or 3000) rows of a [rows, 40] gradient, with an
  // epilogue on the kept indices: the CUDA kernels split the rows across
  // blocks and combine the partials in a fixed order (Note [Split column
  // reductions]); 40 kept indices leave the second tile of 32 half empty.
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    for (int64_t rows : {4096, 3000}) {
      CAPTURE(dtype, rows);
      const at::Tensor x = at::randn({rows, 40}).to(dtype);
      Builder g;
      ir::Value* px = g.input(x);
      ir::Value* sum = g.call("aten::sum.dim_IntList", {px, Dims{0}, false});
      ir::Value* twice = g.call("aten::mul.Scalar", {sum, c10::Scalar(2.0)});
      ir::Value* amax = g.call("aten::amax", {px, Dims{0}, false});
      ir::Value* mean = g.call("aten::mean.dim", {g.call("aten::_to_copy", {px, at::kFloat}), Dims{0}, false});
      const at::Tensor xf = x.to(at::kFloat);
      // bf16 results: each side rounds its float sum once (2u of it).
      const double round = dtype == at::kBFloat16 ? 2 * unit_roundoff(dtype) : 0.0;
      const at::Tensor sum_e = x.sum(0);
      check(g, {
                   {"sum over the rows", sum, sum_e, round * mag(sum_e) + reduced(at::kFloat, mag(xf).sum(0))},
                   {"2 * sum (an epilogue)", twice, sum_e * 2,
                    2 * (round * mag(sum_e) + reduced(at::kFloat, mag(xf).sum(0)))},
                   exactly("amax over the rows", amax, x.amax(0)),
                   reduction("mean over the rows, in f32", mean, xf.mean(0), mag(xf).mean(0)),
               });
    }
  }
}
