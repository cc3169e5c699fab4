// fuse_attention (a pre-grad pass): attention written out, in the spellings
// at::matmul, the scale and the mask give it, traced and rewritten to
// scaled_dot_product_attention, against eager LibTorch; what must be left
// alone is.
#include <crucible/ir/fuse_attention.h>
#include <crucible/ir/interpreter.h>
#include <crucible/ir/parser.h>
#include <crucible/ir/printer.h>
#include <crucible/ir/verifier.h>
#include <crucible/tracer/make_fx.h>

#include <ATen/ATen.h>

#include <cmath>
#include <limits>
#include <regex>
#include <string>
#include <vector>

#include "catch.h"
#include "testing.h"

using namespace crucible;

namespace {

// In float64 the fused kernel's other summation order stays ~1e-15
// relative; a wrong scale, mask or transpose is off by the values' scale.
constexpr double kRtol = 1e-12, kAtol = 1e-13;

enum class Scale { Mul, Div, None };
enum class Mask { Fill, Add, None };

constexpr double kInf = std::numeric_limits<double>::infinity();

// q, k, v: [B, H, T, E]; mask: [1, 1, T, T] (1 keep, 0 drop: the causal
// mask nanoGPT keeps in a buffer). `heads_view`: q, k and v are views
// of one [B, T, 3, H, E] projection (the at::matmul operands are then
// copied), else contiguous tensors (viewed).
std::vector<at::Tensor> inputs(bool heads_view) {
  at::manual_seed(1);
  const int64_t b = 2, h = 3, t = 5, e = 4;
  std::vector<at::Tensor> in;
  if (heads_view) {
    auto parts = at::randn({b, t, 3, h, e}, at::kDouble).permute({2, 0, 3, 1, 4}).unbind(0);
    in.assign(parts.begin(), parts.end());
  } else {
    for (int i = 0; i < 3; ++i) in.push_back(at::randn({b, h, t, e}, at::kDouble));
  }
  in.push_back(at::ones({t, t}, at::kDouble).tril().view({1, 1, t, t}));
  return in;
}

at::Tensor written_out(const std::vector<at::Tensor>& in, Scale s, Mask m) {
  at::Tensor att = at::matmul(in[0], in[1].transpose(-2, -1));
  if (s == Scale::Mul) att = att * 0.5;
  if (s == Scale::Div) att = att / 2.0;
  if (m == Mask::Fill) att = att.masked_fill(in[3] == 0, -kInf);
  if (m == Mask::Add) att = att + (1.0 - in[3]) * -1e4;
  return at::matmul(at::softmax(att, -1), in[2]);
}

size_t count(const ir::Graph& g, const std::string& target) {
  size_t n = 0;
  for (const ir::Node* node : g.nodes())
    if (node->is_call() && node->target() == target) ++n;
  return n;
}

}  // namespace

TEST_CASE("fuse_attention: attention written out becomes scaled_dot_product_attention, in every spelling",
          "[pipeline][fuse_attention]") {
  for (bool heads_view : {true, false})
    for (Scale s : {Scale::Mul, Scale::Div, Scale::None})
      for (Mask m : {Mask::Fill, Mask::Add, Mask::None}) {
        INFO("heads view " << heads_view << ", scale " << static_cast<int>(s) << ", mask " << static_cast<int>(m));
        const std::vector<at::Tensor> in = inputs(heads_view);
        auto fn = [s, m](const std::vector<at::Tensor>& x) { return std::vector<at::Tensor>{written_out(x, s, m)}; };
        tracer::TraceResult r = tracer::make_fx(fn, in);
        REQUIRE(count(r.graph, "aten::_softmax") == 1);
        // float64: bf16 and f16 alone leave it; the inductor's default
        // fuses it on a CPU, whose flash kernel takes float64 too.
        ir::Graph reduced = r.graph.clone();
        CHECK(ir::fuse_reduced_precision_attention(reduced) == 0);
        ir::Graph flash = r.graph.clone();
        CHECK(ir::fuse_flash_attention(flash) == 1);
        REQUIRE(ir::fuse_attention(r.graph) == 1);
        REQUIRE_NOTHROW(ir::verify(r.graph, ir::VerifyOptions{.check_meta = true}));
        CHECK(count(r.graph, "aten::scaled_dot_product_attention") == 1);
        CHECK(count(r.graph, "aten::_softmax") == 0);
        CHECK(count(r.graph, "aten::bmm") == 0);
        const at::Tensor got = ir::Interpreter(r.graph)(in).at(0);
        const at::Tensor expected = written_out(in, s, m);
        REQUIRE(got.is_contiguous());
        REQUIRE_CLOSE(got, expected, kRtol, kAtol);
      }
}

// fuse_flash_attention, the inductor's default, fuses where the fused op
// runs a flash kernel: bf16 and f16 anywhere, every dtype on a CPU; float32
// on a GPU (the memory-efficient kernel, slower) stays written out. The
// same graph, its tensors said to be on a GPU (the text form's @cuda:0; no
// GPU is needed to rewrite it).
TEST_CASE("fuse_flash_attention: every dtype on a CPU, bf16 and f16 alone on a GPU", "[pipeline][fuse_attention]") {
  std::vector<at::Tensor> in = inputs(true);
  for (auto& t : in) t = t.to(at::kFloat);
  auto fn = [](const std::vector<at::Tensor>& x) {
    return std::vector<at::Tensor>{written_out(x, Scale::Mul, Mask::Fill)};
  };
  const tracer::TraceResult r = tracer::make_fx(fn, in);
  ir::Graph on_cpu = r.graph.clone();
  CHECK(ir::fuse_flash_attention(on_cpu) == 1);
  // Every tensor type "f32[...]" (or "b8[...]") gets "@cuda:0".
  auto on_gpu = [&](const std::string& dtype) {
    const std::string text =
        std::regex_replace(ir::to_text(r.graph), std::regex(R"(\b(f32|b8)(\[[^\]]*\]))"), "$1$2 @cuda:0");
    return ir::parse(std::regex_replace(text, std::regex(R"(\bf32\[)"), dtype + "["));
  };
  ir::Graph f32_gpu = on_gpu("f32");
  CHECK(ir::fuse_flash_attention(f32_gpu) == 0);
  CHECK(ir::fuse_attention(f32_gpu) == 1);  // what the pass leaves, fuse_attention would take
  ir::Graph bf16_gpu = on_gpu("bf16");
  CHECK(ir::fuse_flash_attention(bf16_gpu) == 1);
}

TEST_CASE("fuse_attention: leaves alone dropout, finite fills, other softmax dimensions and probabilities read twice",
          "[pipeline][fuse_attention]") {
  const std::vector<at::Tensor> in = inputs(true);
  const std::vector<std::pair<std::string, tracer::TensorFn>> cases = {
      {"dropout on the probabilities",
       [](const std::vector<at::Tensor>& x) {
         at::Tensor p = at::softmax(at::matmul(x[0], x[1].transpose(-2, -1)) * 0.5, -1);
         return std::vector<at::Tensor>{at::matmul(at::dropout(p, 0.1, true), x[2])};
       }},
      {"a finite fill",
       [](const std::vector<at::Tensor>& x) {
         at::Tensor att = (at::matmul(x[0], x[1].transpose(-2, -1)) * 0.5).masked_fill(x[3] == 0, -1e9);
         return std::vector<at::Tensor>{at::matmul(at::softmax(att, -1), x[2])};
       }},
      {"softmax over the queries",
       [](const std::vector<at::Tensor>& x) {
         at::Tensor p = at::softmax(at::matmul(x[0], x[1].transpose(-2, -1)) * 0.5, 2);
         return std::vector<at::Tensor>{at::matmul(p, x[2])};
       }},
      {"the probabilities returned too",
       [](const std::vector<at::Tensor>& x) {
         at::Tensor p = at::softmax(at::matmul(x[0], x[1].transpose(-2, -1)) * 0.5, -1);
         return std::vector<at::Tensor>{at::matmul(p, x[2]), p};
       }},
      {"k not transposed (q @ k over equal T and E)",
       [](const std::vector<at::Tensor>& x) {
         at::Tensor k = x[1].narrow(2, 0, 4);  // [B, H, 4, 4]: q @ k is shaped like q @ k^T
         at::Tensor p = at::softmax(at::matmul(x[0], k) * 0.5, -1);
         return std::vector<at::Tensor>{at::matmul(p, x[2].narrow(2, 0, 4))};
       }},
  };
  for (const auto& [name, fn] : cases) {
    INFO(name);
    tracer::TraceResult r = tracer::make_fx(fn, in);
    REQUIRE(ir::fuse_attention(r.graph) == 0);
  }
}

TEST_CASE("fuse_attention: a row whose keys are all masked", "[pipeline][fuse_attention]") {
  // Eager's masked_fill(-inf) then softmax gives NaN there; what the fused
  // kernel gives is pinned here (the header says it), so that a change shows.
  std::vector<at::Tensor> in = inputs(false);
  in[3] = in[3].clone();
  in[3].select(2, 1).zero_();  // query 1 sees no key
  auto fn = [](const std::vector<at::Tensor>& x) {
    return std::vector<at::Tensor>{written_out(x, Scale::Mul, Mask::Fill)};
  };
  tracer::TraceResult r = tracer::make_fx(fn, in);
  REQUIRE(ir::fuse_attention(r.graph) == 1);
  const at::Tensor got = ir::Interpreter(r.graph)(in).at(0);
  const at::Tensor expected = written_out(in, Scale::Mul, Mask::Fill);
  REQUIRE(expected.select(2, 1).isnan().all().item<bool>());
  INFO("fused row: " << got.select(2, 1).flatten().slice(0, 0, 4));
  CHECK(got.select(2, 1).isnan().all().item<bool>());
  // The other rows agree.
  REQUIRE_CLOSE(got.select(2, 0), expected.select(2, 0), kRtol, kAtol);
  REQUIRE_CLOSE(got.narrow(2, 2, 3), expected.narrow(2, 2, 3), kRtol, kAtol);
  // Backward, the NaN reaches every element of v's gradient (and so every
  // parameter that made v) on both sides. (k's differs: eager's
  // masked_fill backward zeroes the NaN row's score gradients, the fused
  // backward spreads them; either way the parameters end NaN.)
  auto with_grad = [&in] {
    std::vector<at::Tensor> x = in;
    for (size_t i = 0; i < 3; ++i) x[i] = x[i].detach().requires_grad_();
    return x;
  };
  std::vector<at::Tensor> fused_in = with_grad(), eager_in = with_grad();
  ir::Interpreter(r.graph)(fused_in).at(0).sum().backward();
  written_out(eager_in, Scale::Mul, Mask::Fill).sum().backward();
  CHECK(eager_in[2].grad().isnan().all().item<bool>());
  CHECK(fused_in[2].grad().isnan().all().item<bool>());
}

TEST_CASE("fuse_attention: bf16 attention whose softmax runs in float32 between casts, as CUDA autocast records it",
          "[pipeline][fuse_attention]") {
  std::vector<at::Tensor> in = inputs(true);
  for (size_t i = 0; i < 3; ++i) in[i] = in[i].to(at::kBFloat16);
  // Autocast's fp32 policy for softmax casts the bf16 scores up, naming the
  // layout and device (_to_copy(dtype=f32, layout=strided, device=...));
  // at::matmul casts the probabilities back down, naming the dtype alone.
  // Both spellings of the first cast.
  const bool names_device = GENERATE(false, true);
  INFO((names_device ? "the upcast names layout and device" : "the upcast names the dtype"));
  auto fn = [names_device](const std::vector<at::Tensor>& x) {
    at::Tensor att = (at::matmul(x[0], x[1].transpose(-2, -1)) * 0.5).masked_fill(x[3] == 0, -kInf);
    at::Tensor up = names_device ? att.to(att.options().dtype(at::kFloat)) : att.to(at::kFloat);
    at::Tensor p = at::softmax(up, -1).to(at::kBFloat16);
    return std::vector<at::Tensor>{at::matmul(p, x[2])};
  };
  tracer::TraceResult r = tracer::make_fx(fn, in);
  // The inductor's default, bf16 and f16 attention alone, fuses it too.
  ir::Graph reduced = r.graph.clone();
  CHECK(ir::fuse_reduced_precision_attention(reduced) == 1);
  REQUIRE(ir::fuse_attention(r.graph) == 1);
  REQUIRE_NOTHROW(ir::verify(r.graph, ir::VerifyOptions{.check_meta = true}));
  CHECK(count(r.graph, "aten::_softmax") == 0);
  CHECK(count(r.graph, "aten::_to_copy") == 0);
  const at::Tensor got = ir::Interpreter(r.graph)(in).at(0);
  const at::Tensor expected = fn(in)[0];
  REQUIRE(got.scalar_type() == at::kBFloat16);
  // The written-out form rounds the scores (|s| < 8 here) and the
  // probabilities to bf16 (2^-9 relative each) where the fused kernel keeps
  // them in float32, and both round the output: within 2^-9 (1 + 8 + 1)
  // of max |v|, under 2^-5.
  const double bound = std::ldexp(1.0, -5) * in[2].abs().max().item<double>();
  REQUIRE_CLOSE(got.to(at::kFloat), expected.to(at::kFloat), 0.0, bound);
  // Probabilities cast down through another dtype: left alone.
  auto half_cast = [](const std::vector<at::Tensor>& x) {
    at::Tensor att = at::matmul(x[0], x[1].transpose(-2, -1)) * 0.5;
    at::Tensor p = at::softmax(att.to(at::kFloat), -1).to(at::kHalf).to(at::kBFloat16);
    return std::vector<at::Tensor>{at::matmul(p, x[2])};
  };
  tracer::TraceResult other = tracer::make_fx(half_cast, in);
  CHECK(ir::fuse_attention(other.graph) == 0);
}
