// Crucible's meta functions (convolution, its backward, batch norm and its
// backward, which have no Meta kernel in LibTorch's C++) give what the ops
// themselves give on CPU stand-ins, over a grid of shapes, strides, groups,
// transposition and output masks; outside what they cover they decline and
// the stand-ins serve.
#include <crucible/ir/graph.h>
#include <crucible/ir/meta_call.h>

#include <ATen/ATen.h>

#include "catch.h"

using namespace crucible::ir;

namespace {

at::Tensor meta(std::vector<int64_t> sizes, at::ScalarType dtype = at::kFloat,
                at::MemoryFormat format = at::MemoryFormat::Contiguous) {
  return at::empty(sizes, at::TensorOptions().dtype(dtype).device(at::kMeta).memory_format(format));
}

std::string describe(const c10::IValue& v) {
  if (!v.isTensor() || !v.toTensor().defined()) return "undefined";
  return to_string(TensorMeta::of(v.toTensor()));
}

// Runs `op` on `args` through call_on_meta and on CPU stand-ins; requires the
// same results and returns the path call_on_meta took.
MetaPath compare(const std::string& op_name, const std::vector<c10::IValue>& args) {
  const c10::OperatorHandle op = resolve_operator(op_name);
  torch::jit::Stack derived(args.begin(), args.end()), reference(args.begin(), args.end());
  const MetaPath path = call_on_meta(op, derived);
  call_on_cpu_stand_ins(op, reference);
  REQUIRE(derived.size() == reference.size());
  for (size_t i = 0; i < derived.size(); ++i) {
    INFO(op_name << " result " << i << ": derived " << describe(derived[i]) << ", stand-ins "
                 << describe(reference[i]));
    const bool defined = derived[i].isTensor() && derived[i].toTensor().defined();
    REQUIRE(defined == (reference[i].isTensor() && reference[i].toTensor().defined()));
    if (defined)
      REQUIRE(meta_equivalent(TensorMeta::of(derived[i].toTensor()), TensorMeta::of(reference[i].toTensor())));
  }
  return path;
}

using Ints = std::vector<int64_t>;

c10::List<bool> bools(const std::vector<bool>& mask) {
  c10::List<bool> l;
  for (bool b : mask) l.push_back(b);
  return l;
}

}  // namespace

TEST_CASE("meta functions: convolution and its backward, 1-D to 3-D, grouped, strided, dilated, transposed",
          "[ir][meta][meta_functions]") {
  struct Case {
    Ints input, weight;
    Ints stride, padding, dilation, output_padding;
    bool transposed;
    int64_t groups;
  };
  const std::vector<Case> cases = {
      {{2, 3, 9}, {4, 3, 3}, {1}, {0}, {1}, {0}, false, 1},
      {{2, 4, 9}, {6, 2, 3}, {2}, {1}, {2}, {0}, false, 2},
      {{2, 3, 8, 7}, {5, 3, 3, 3}, {1, 1}, {1, 1}, {1, 1}, {0, 0}, false, 1},
      {{1, 4, 10, 9}, {4, 1, 3, 2}, {2, 1}, {0, 1}, {1, 2}, {0, 0}, false, 4},  // depthwise
      {{2, 3, 8, 8}, {4, 3, 1, 1}, {2}, {0}, {1}, {0}, false, 1},               // one value for every dimension
      {{2, 2, 5, 6, 4}, {3, 2, 2, 3, 1}, {1, 2, 1}, {1, 0, 0}, {1, 1, 1}, {0, 0, 0}, false, 1},
      {{2, 3, 5, 5}, {3, 4, 3, 3}, {2, 2}, {1, 1}, {1, 1}, {1, 0}, true, 1},  // transposed: weight [C_in, C_out/g, ...]
      {{2, 4, 6}, {4, 3, 2}, {3}, {0}, {2}, {1}, true, 2},
      {{0, 3, 8, 8}, {4, 3, 3, 3}, {1, 1}, {0, 0}, {1, 1}, {0, 0}, false, 1},  // an empty batch
  };
  for (const Case& c : cases) {
    INFO("input " << c10::IntArrayRef(c.input) << " weight " << c10::IntArrayRef(c.weight)
                  << (c.transposed ? " transposed" : ""));
    const at::Tensor input = meta(c.input), weight = meta(c.weight);
    // LibTorch's convolution and its backward run on meta tensors for an
    // empty batch (the Empty backend); the rest needs the meta functions.
    const MetaPath expected = c.input[0] == 0 ? MetaPath::Kernel : MetaPath::Function;
    for (const bool with_bias : {false, true}) {
      const int64_t out_channels = c.transposed ? c.weight[1] * c.groups : c.weight[0];
      const c10::IValue bias = with_bias ? c10::IValue(meta({out_channels})) : c10::IValue();
      REQUIRE(compare("aten::convolution", {input, weight, bias, c.stride, c.padding, c.dilation, c.transposed,
                                            c.output_padding, c.groups}) == expected);
    }
    // The backward, from a gradient of the forward's output shape.
    torch::jit::Stack fwd{input,      weight,       c10::IValue(),    c.stride, c.padding,
                          c.dilation, c.transposed, c.output_padding, c.groups};
    call_on_meta(resolve_operator("aten::convolution"), fwd);
    const at::Tensor grad = meta(fwd[0].toTensor().sizes().vec());
    for (const std::vector<bool>& mask :
         std::vector<std::vector<bool>>{{true, true, true}, {false, true, true}, {true, false, false}}) {
      INFO("output_mask " << mask[0] << mask[1] << mask[2]);
      const int64_t out_channels = grad.size(1);
      REQUIRE(compare("aten::convolution_backward",
                      {grad, input, weight, c10::IValue(Ints{out_channels}), c.stride, c.padding, c.dilation,
                       c.transposed, c.output_padding, c.groups, bools(mask)}) == expected);
    }
  }
  // Channels-last input or weight: channels-last results (oneDNN's rule on
  // the CPU stand-ins, cuDNN's on a GPU); a layout that is neither is left
  // to the stand-ins.
  const at::Tensor cl = meta({2, 3, 8, 8}, at::kFloat, at::MemoryFormat::ChannelsLast);
  const at::Tensor w = meta({4, 3, 3, 3}), w_cl = meta({4, 3, 3, 3}, at::kFloat, at::MemoryFormat::ChannelsLast);
  for (const auto& [in, weight] : std::vector<std::pair<at::Tensor, at::Tensor>>{{cl, w}, {meta({2, 3, 8, 8}), w_cl}}) {
    REQUIRE(compare("aten::convolution", {in, weight, c10::IValue(), Ints{1, 1}, Ints{1, 1}, Ints{1, 1}, false,
                                          Ints{0, 0}, int64_t{1}}) == MetaPath::Function);
    const at::Tensor grad = meta({2, 4, 8, 8}, at::kFloat, at::MemoryFormat::ChannelsLast);
    REQUIRE(compare("aten::convolution_backward",
                    {grad, in, weight, c10::IValue(Ints{4}), Ints{1, 1}, Ints{1, 1}, Ints{1, 1}, false, Ints{0, 0},
                     int64_t{1}, bools({true, true, true})}) == MetaPath::Function);
  }
  const at::Tensor strided = meta({2, 3, 8, 16}).slice(3, 0, 16, 2);
  REQUIRE(compare("aten::convolution", {strided, w, c10::IValue(), Ints{1, 1}, Ints{1, 1}, Ints{1, 1}, false,
                                        Ints{0, 0}, int64_t{1}}) == MetaPath::StandIns);
}

TEST_CASE("meta functions: batch norm and its backward, training and eval, with and without affine parameters",
          "[ir][meta][meta_functions]") {
  for (const at::ScalarType dtype : {at::kFloat, at::kDouble})
    for (const Ints& sizes : std::vector<Ints>{{4, 3}, {2, 3, 5}, {2, 3, 4, 5}, {2, 3, 2, 3, 4}})
      for (const bool training : {true, false})
        for (const bool affine : {true, false}) {
          INFO(c10::toString(dtype) << " " << c10::IntArrayRef(sizes) << (training ? " training" : " eval")
                                    << (affine ? " affine" : ""));
          const at::Tensor input = meta(sizes, dtype);
          const int64_t c = sizes[1];
          const c10::IValue weight = affine ? c10::IValue(meta({c}, dtype)) : c10::IValue();
          const c10::IValue bias = affine ? c10::IValue(meta({c}, dtype)) : c10::IValue();
          const at::Tensor running_mean = meta({c}, dtype), running_var = meta({c}, dtype);
          REQUIRE(compare("aten::native_batch_norm",
                          {input, weight, bias, running_mean, running_var, training, 0.1, 1e-5}) == MetaPath::Function);
          const at::Tensor save = meta({c}, dtype);
          for (const std::vector<bool>& mask :
               std::vector<std::vector<bool>>{{true, true, true}, {true, false, false}, {false, true, true}}) {
            INFO("output_mask " << mask[0] << mask[1] << mask[2]);
            REQUIRE(compare("aten::native_batch_norm_backward",
                            {meta(sizes, dtype), input, weight, running_mean, running_var, save, save, training, 1e-5,
                             bools(mask)}) == MetaPath::Function);
          }
        }
  // bfloat16: the statistics' dtype is the kernel's choice; the stand-ins say which.
  const at::Tensor bf = meta({2, 3, 4}, at::kBFloat16);
  REQUIRE(compare("aten::native_batch_norm", {bf, c10::IValue(), c10::IValue(), c10::IValue(), c10::IValue(), true, 0.1,
                                              1e-5}) == MetaPath::StandIns);
}

TEST_CASE("meta: an op that returns nothing and writes nothing (an assertion) is not run on stand-ins", "[ir][meta]") {
  // On zero-filled stand-ins _assert_async would see `false` and throw; it has
  // no metadata to compute, so nothing runs and its argument is popped.
  torch::jit::Stack stack{meta({}, at::kBool)};
  REQUIRE(call_on_meta(resolve_operator("aten::_assert_async"), stack) == MetaPath::Nothing);
  REQUIRE(stack.empty());
  // An op that writes its argument still runs: its result is that argument.
  torch::jit::Stack write{meta({3}), 1.0, 1};
  REQUIRE(call_on_meta(resolve_operator("aten::add_.Scalar"), write) != MetaPath::Nothing);
  REQUIRE(write.size() == 1);
}

TEST_CASE("meta functions: cuDNN's batch norm and its backward keep their input's layout",
          "[ir][meta][meta_functions]") {
  // No CPU kernel to compare with (cuDNN only): checked against what ATen's
  // cudnn kernels allocate (the input's suggested layout, [C] statistics in
  // training). crucible::cudnn_batch_norm_functional shares the function;
  // the GPU train-step tests run it.
  for (const auto format : {at::MemoryFormat::Contiguous, at::MemoryFormat::ChannelsLast}) {
    const at::Tensor input = meta({2, 3, 4, 5}, at::kFloat, format), c = meta({3});
    torch::jit::Stack stack{input, c, c, c, c, true, 0.1, 1e-5};
    REQUIRE(call_on_meta(resolve_operator("aten::cudnn_batch_norm"), stack) == MetaPath::Function);
    REQUIRE(stack.size() == 4);
    CHECK(stack[0].toTensor().is_contiguous(format));
    CHECK(stack[0].toTensor().sizes() == input.sizes());
    CHECK(stack[1].toTensor().sizes() == c10::IntArrayRef{3});
    CHECK(stack[2].toTensor().sizes() == c10::IntArrayRef{3});
    torch::jit::Stack back{input, input, c, c, c, c, c, 1e-5, stack[3]};
    REQUIRE(call_on_meta(resolve_operator("aten::cudnn_batch_norm_backward"), back) == MetaPath::Function);
    CHECK(back[0].toTensor().is_contiguous(format));
    CHECK(back[1].toTensor().sizes() == c10::IntArrayRef{3});
  }
}

TEST_CASE("meta functions: the CUDA batch-norm statistics and backward sums give [C] float statistics",
          "[ir][meta][meta_functions]") {
  // CUDA kernels only, as ATen's allocate them: the statistics in the
  // input's op-math type, the sums like the mean, gradients only when asked.
  // The CUDA tracer tests run the kernels and compare their values.
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    const at::Tensor input = meta({2, 3, 4, 5}, dtype), w = meta({3});
    torch::jit::Stack stats{input, 1e-5};
    REQUIRE(call_on_meta(resolve_operator("aten::batch_norm_stats"), stats) == MetaPath::Function);
    REQUIRE(stats.size() == 2);
    for (const c10::IValue& s : stats) {
      CHECK(s.toTensor().sizes() == c10::IntArrayRef{3});
      CHECK(s.toTensor().scalar_type() == at::kFloat);
    }
    const at::Tensor mean = stats[0].toTensor();
    for (const bool weight_g : {false, true}) {
      torch::jit::Stack back{input, input, mean, mean, w, true, weight_g, weight_g};
      REQUIRE(call_on_meta(resolve_operator("aten::batch_norm_backward_reduce"), back) == MetaPath::Function);
      REQUIRE(back.size() == 4);
      CHECK(back[0].toTensor().sizes() == c10::IntArrayRef{3});
      CHECK(back[1].toTensor().scalar_type() == at::kFloat);
      CHECK_FALSE(back[0].toTensor().is_same(back[1].toTensor()));  // results of their own, not aliases
      if (weight_g) CHECK_FALSE(back[2].toTensor().is_same(back[3].toTensor()));
      CHECK(back[2].toTensor().defined() == weight_g);
      CHECK(back[3].toTensor().defined() == weight_g);
    }
  }
}

TEST_CASE("meta functions: var_mean over dims, kept or not, of contiguous and transposed inputs",
          "[ir][meta][meta_functions]") {
  for (const at::ScalarType dtype : {at::kFloat, at::kDouble, at::kBFloat16})
    for (const bool transposed : {false, true})
      for (const bool keepdim : {false, true})
        for (const c10::IValue& dims : std::vector<c10::IValue>{c10::IValue(), Ints{}, Ints{-1}, Ints{0, 2}, Ints{1}}) {
          INFO(c10::toString(dtype) << (transposed ? " transposed" : "") << (keepdim ? " keepdim" : "") << " dims "
                                    << (dims.isNone() ? std::string("None") : c10::str(dims.toIntVector())));
          const at::Tensor x = transposed ? meta({5, 3, 4}, dtype).transpose(0, 2) : meta({4, 3, 5}, dtype);
          REQUIRE(compare("aten::var_mean.dim", {x, dims, true, keepdim}) == MetaPath::Function);
          REQUIRE(compare("aten::var_mean.correction", {x, dims, at::Scalar(0), keepdim}) == MetaPath::Function);
        }
  // A 0-dim input reduced over dim 0 or -1, as ATen allows.
  REQUIRE(compare("aten::var_mean.dim", {meta({}), Ints{-1}, true, false}) == MetaPath::Function);
}

TEST_CASE("meta functions: embedding of 1-D and 2-D indices, long and int", "[ir][meta][meta_functions]") {
  for (const at::ScalarType index : {at::kLong, at::kInt})
    for (const Ints& sizes : std::vector<Ints>{{7}, {2, 5}, {0}}) {
      INFO(c10::toString(index) << " indices " << c10::IntArrayRef(sizes));
      REQUIRE(compare("aten::embedding", {meta({10, 6}), meta(sizes, index), -1, false, false}) == MetaPath::Function);
    }
}

TEST_CASE("meta functions: where broadcasts, promotes and keeps ATen's stride order", "[ir][meta][meta_functions]") {
  const at::Tensor mask = meta({1, 1, 4, 4}, at::kBool);
  const at::Tensor scores = meta({2, 3, 4, 4});
  const at::Tensor permuted = meta({2, 4, 3, 4}).transpose(1, 2);  // [2, 3, 4, 4] in another order
  const at::Tensor channels_last = meta({2, 3, 4, 4}, at::kFloat, at::MemoryFormat::ChannelsLast);
  for (const at::Tensor& x : {scores, permuted, channels_last}) {
    INFO("strides " << x.strides());
    REQUIRE(compare("aten::where.self", {mask, x, meta({2, 3, 4, 4})}) == MetaPath::Function);
    REQUIRE(compare("aten::where.self", {mask, meta({4}, at::kDouble), x}) == MetaPath::Function);  // promoted
    REQUIRE(compare("aten::where.self", {meta({2, 3, 4, 4}, at::kBool), x, meta({}, at::kLong)}) == MetaPath::Function);
    REQUIRE(compare("aten::where.ScalarOther", {mask, x, at::Scalar(-std::numeric_limits<double>::infinity())}) ==
            MetaPath::Function);
    REQUIRE(compare("aten::where.ScalarOther", {mask, x, at::Scalar(int64_t{0})}) == MetaPath::Function);
    REQUIRE(compare("aten::where.ScalarSelf", {mask, at::Scalar(1.5), x}) == MetaPath::Function);
  }
  // Integer tensors with a float scalar: the scalar's category wins, at the default dtype.
  REQUIRE(compare("aten::where.ScalarOther", {mask, meta({4, 4}, at::kLong), at::Scalar(0.5)}) == MetaPath::Function);
  // A byte condition (deprecated in ATen, still taken).
  REQUIRE(compare("aten::where.self", {meta({4, 4}, at::kByte), meta({4, 4}), meta({4, 4})}) == MetaPath::Function);
}

TEST_CASE("meta functions: layer norm and its backward, with and without affine parameters; embedding's backward",
          "[ir][meta][meta_functions]") {
  for (const at::ScalarType dtype : {at::kFloat, at::kDouble})
    for (const Ints& normalized : std::vector<Ints>{{5}, {4, 5}})
      for (const bool affine : {true, false}) {
        INFO(c10::toString(dtype) << " normalized " << c10::IntArrayRef(normalized) << (affine ? " affine" : ""));
        const at::Tensor input = meta({2, 3, 4, 5}, dtype);
        const c10::IValue weight = affine ? c10::IValue(meta(normalized, dtype)) : c10::IValue();
        const c10::IValue bias = affine ? c10::IValue(meta(normalized, dtype)) : c10::IValue();
        REQUIRE(compare("aten::native_layer_norm", {input, normalized, weight, bias, 1e-5}) == MetaPath::Function);
        // A transposed input is normalized as a contiguous copy.
        const at::Tensor transposed = meta({2, 3, 5, 4}, dtype).transpose(2, 3);
        REQUIRE(compare("aten::native_layer_norm", {transposed, Ints{5}, c10::IValue(), c10::IValue(), 1e-5}) ==
                MetaPath::Function);
        Ints stats = {2, 3, 4, 5};
        for (size_t i = 0; i < normalized.size(); ++i) stats[3 - i] = 1;
        const at::Tensor mean = meta(stats, dtype);
        for (const std::vector<bool>& mask : std::vector<std::vector<bool>>{{true, true, true}, {true, false, false}}) {
          if (!affine && mask[1]) continue;  // no parameter, no gradient of it (ATen fails; declined)
          INFO("output_mask " << mask[0] << mask[1] << mask[2]);
          REQUIRE(compare("aten::native_layer_norm_backward", {meta({2, 3, 4, 5}, dtype), input, normalized, mean, mean,
                                                               weight, bias, bools(mask)}) == MetaPath::Function);
        }
      }
  REQUIRE(compare("aten::embedding_dense_backward", {meta({2, 7, 6}), meta({2, 7}, at::kLong), 10, -1, false}) ==
          MetaPath::Function);
}

// Note [Attention kernels' metadata]: the CUDA attention kernels have no CPU
// kernel to compare with here, so the expected strides are what the H200's
// kernels returned for these inputs (python3 bench/probe_attention.py, in
// bench/results/fake_mode.md); the CUDA tracer test compares fake-mode
// traces with real ones on the GPU. Inputs outside what the probe covered
// are declined (a TraceMode::Auto trace then runs in real mode).
TEST_CASE("meta functions: the CUDA attention kernels give the probe's layouts and decline the rest",
          "[ir][meta][meta_functions]") {
  constexpr int64_t B = 2, H = 4, L = 96, S = 80, E = 64;
  const Ints heads_major_q{L * H * E, L * E, E, 1}, sequence_major_q{L * H * E, E, H * E, 1};
  const Ints heads_major_k{S * H * E, S * E, E, 1}, sequence_major_k{S * H * E, E, H * E, 1};
  auto inputs = [&](bool sequence_major) {
    auto one = [&](int64_t n) {
      return sequence_major ? meta({B, n, H, E}, at::kBFloat16).transpose(1, 2) : meta({B, H, n, E}, at::kBFloat16);
    };
    return std::vector<at::Tensor>{one(L), one(S), one(S)};
  };
  auto run = [](const std::string& name, std::vector<c10::IValue> args) {
    torch::jit::Stack stack(args.begin(), args.end());
    INFO(name);
    REQUIRE(call_on_meta(resolve_operator(name), stack) == MetaPath::Function);
    return stack;
  };
  auto strides = [](const c10::IValue& v) { return v.toTensor().strides().vec(); };
  for (const bool sequence_major : {false, true}) {
    INFO((sequence_major ? "sequence-major" : "heads-major"));
    const std::vector<at::Tensor> qkv = inputs(sequence_major);
    const at::Tensor &q = qkv[0], &k = qkv[1], &v = qkv[2];
    const Ints& q_strides = sequence_major ? sequence_major_q : heads_major_q;
    const Ints& k_strides = sequence_major ? sequence_major_k : heads_major_k;

    torch::jit::Stack flash =
        run("aten::_scaled_dot_product_flash_attention", {q, k, v, 0.1, false, false, c10::IValue()});
    REQUIRE(flash.size() == 9);
    CHECK(strides(flash[0]) == q_strides);
    CHECK(describe(flash[1]) == describe(meta({B, H, L})));
    CHECK(flash[4].toInt() == L);
    CHECK(flash[5].toInt() == S);
    CHECK(flash[6].toTensor().scalar_type() == at::kUInt64);
    CHECK(flash[6].toTensor().sizes().vec() == Ints{2});
    CHECK(flash[8].toTensor().sizes().vec() == Ints{0});
    const at::Tensor grad_out = at::empty_like(flash[0].toTensor());
    torch::jit::Stack flash_bwd = run("aten::_scaled_dot_product_flash_attention_backward",
                                      {grad_out, q, k, v, flash[0], flash[1], flash[2], flash[3], flash[4], flash[5],
                                       0.1, false, flash[6], flash[7], c10::IValue()});
    CHECK(strides(flash_bwd[0]) == q_strides);
    CHECK(strides(flash_bwd[1]) == k_strides);

    torch::jit::Stack cudnn = run("aten::_scaled_dot_product_cudnn_attention",
                                  {q, k, v, c10::IValue(), true, 0.1, false, false, c10::IValue()});
    CHECK(strides(cudnn[0]) == q_strides);
    CHECK(describe(cudnn[1]) == describe(meta({B, H, L, 1})));
    CHECK(cudnn[6].toTensor().scalar_type() == at::kLong);
    CHECK_FALSE(cudnn[8].toTensor().defined());

    // Memory-efficient: sequence-major whatever the inputs' layout, the seed
    // and offset on the CPU.
    torch::jit::Stack efficient =
        run("aten::_scaled_dot_product_efficient_attention", {q, k, v, c10::IValue(), true, 0.1, false, c10::IValue()});
    CHECK(strides(efficient[0]) == sequence_major_q);
    CHECK(describe(efficient[1]) == describe(meta({B, H, L})));
    CHECK(efficient[2].toTensor().device().is_cpu());
    const at::Tensor bias = meta({B, H, L, S}, at::kBFloat16);
    torch::jit::Stack efficient_bwd = run("aten::_scaled_dot_product_efficient_attention_backward",
                                          {grad_out, q, k, v, bias, efficient[0], efficient[1], efficient[2],
                                           efficient[3], 0.1, bools({true, true, true, true}), false, c10::IValue()});
    CHECK(strides(efficient_bwd[0]) == sequence_major_q);
    CHECK(strides(efficient_bwd[1]) == sequence_major_k);
    CHECK(strides(efficient_bwd[3]) == Ints{H * L * S, L * S, S, 1});
  }
  // Thirds of one projection, views of a larger buffer: flash's and cuDNN's
  // results laid out densely in the inputs' order of strides (sequence-major
  // here, as empty_like makes them on the GPU); the memory-efficient
  // backward, which may pack the thirds' gradients into one buffer, and an
  // input reaching an element twice are declined (so a CPU stand-in is
  // tried, and the op has no CPU kernel).
  const at::Tensor qkv = meta({B, L, 3 * H * E}, at::kBFloat16);
  auto third = [&](int64_t i) { return qkv.narrow(2, i * H * E, H * E).view({B, L, H, E}).transpose(1, 2); };
  const at::Tensor q = third(0), k = third(1), v = third(2);
  torch::jit::Stack flash =
      run("aten::_scaled_dot_product_flash_attention", {q, k, v, 0.0, true, false, c10::IValue()});
  CHECK(strides(flash[0]) == sequence_major_q);
  torch::jit::Stack cudnn_bwd =
      run("aten::_scaled_dot_product_cudnn_attention_backward",
          {flash[0], q, k, v, flash[0], meta({B, H, L, 1}), meta({}, at::kLong), meta({}, at::kLong), at::Tensor(),
           at::Tensor(), at::Tensor(), L, L, 0.0, true, c10::IValue()});
  for (size_t i = 0; i < 3; ++i) CHECK(strides(cudnn_bwd[i]) == sequence_major_q);
  torch::jit::Stack efficient =
      run("aten::_scaled_dot_product_efficient_attention", {q, k, v, c10::IValue(), true, 0.0, true, c10::IValue()});
  torch::jit::Stack packed{efficient[0],
                           q,
                           k,
                           v,
                           c10::IValue(),
                           efficient[0],
                           efficient[1],
                           efficient[2],
                           efficient[3],
                           0.0,
                           bools({true, true, true, false}),
                           true,
                           c10::IValue()};
  CHECK_THROWS(call_on_meta(resolve_operator("aten::_scaled_dot_product_efficient_attention_backward"), packed));
  const at::Tensor overlapping = meta({B, H, 1, E}, at::kBFloat16).expand({B, H, L, E});
  torch::jit::Stack twice{overlapping, overlapping, overlapping, 0.0, false, false, c10::IValue()};
  CHECK_THROWS(call_on_meta(resolve_operator("aten::_scaled_dot_product_flash_attention"), twice));
}
