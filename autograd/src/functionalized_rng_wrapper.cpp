#include <crucible/autograd/error.h>
#include <crucible/autograd/functionalized_rng_wrapper.h>

#include "trace_call.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <ATen/core/PhiloxRNGEngine.h>
#include <c10/core/DefaultDtype.h>
#include <torch/library.h>

#include <mutex>

namespace crucible::autograd {

namespace detail {

// What the decompositions of the running trace draw from.
struct PhiloxTraceState {
  at::Tensor seed, offset;  // the traced rng_seed / rng_offset placeholders
  int64_t draws = 0;        // random ops met so far in this trace
  int64_t draws_per_call = 0;
};

}  // namespace detail

at::Tensor philox_rand(c10::IntArrayRef size, const at::Tensor& seed, const at::Tensor& offset, c10::ScalarType dtype,
                       c10::Device device, bool normal) {
  const auto s = static_cast<uint64_t>(seed.item<int64_t>());
  const auto o = static_cast<uint64_t>(offset.item<int64_t>());
  at::Tensor out = at::empty(size, at::TensorOptions().dtype(at::kFloat));
  float* data = out.data_ptr<float>();
  at::parallel_for(0, out.numel(), 4096, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      at::philox_engine engine(s, static_cast<uint64_t>(i), o);
      // 24 random bits to a float in [0, 1), as at::uniform_real_distribution does.
      data[i] = normal ? engine.randn(10) : static_cast<float>(engine() >> 8) * (1.0f / 16777216.0f);
    }
  });
  return out.to(at::TensorOptions().dtype(dtype).device(device));
}

TORCH_LIBRARY_FRAGMENT(crucible, m) {
  m.def(
      "philox_rand(int[] size, Tensor seed, Tensor offset, ScalarType dtype, Device device, bool normal=False) "
      "-> Tensor");
}

TORCH_LIBRARY_IMPL(crucible, CompositeExplicitAutograd, m) { m.impl("philox_rand", &philox_rand); }

namespace {

using detail::PhiloxTraceState;
using Stack = std::vector<c10::IValue>;

// One Philox draw of the current trace: crucible::philox_rand at offset + k.
at::Tensor draw(PhiloxTraceState& st, c10::IntArrayRef size, c10::ScalarType dtype, c10::Device device, bool normal) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("crucible::philox_rand", "")
                             .typed<at::Tensor(c10::IntArrayRef, const at::Tensor&, const at::Tensor&, c10::ScalarType,
                                               c10::Device, bool)>();
  const at::Tensor offset = at::add(st.offset, st.draws++);
  return op.call(size, st.seed, offset, dtype, device, normal);
}

c10::ScalarType dtype_or(const c10::IValue& v, c10::ScalarType fallback) {
  return v.isNone() ? fallback : v.toScalarType();
}

c10::Device device_or(const c10::IValue& v, c10::Device fallback) { return v.isNone() ? fallback : v.toDevice(); }

tracer::DecompositionTable philox_decompositions(const std::shared_ptr<PhiloxTraceState>& st) {
  tracer::DecompositionTable t;
  t["aten::bernoulli.p"] = [st](const c10::OperatorHandle&, Stack& s) {
    const at::Tensor self = s[0].toTensor();
    const double p = s[1].toDouble();
    const at::Tensor u = draw(*st, self.sizes(), at::kFloat, self.device(), false);
    s.clear();
    s.emplace_back(at::lt(u, p).to(self.scalar_type()));
  };
  t["aten::bernoulli"] = [st](const c10::OperatorHandle&, Stack& s) {
    const at::Tensor self = s[0].toTensor();
    const at::Tensor u = draw(*st, self.sizes(), self.scalar_type(), self.device(), false);
    s.clear();
    s.emplace_back(at::lt(u, self).to(self.scalar_type()));
  };
  t["aten::native_dropout"] = [st](const c10::OperatorHandle&, Stack& s) {
    const at::Tensor input = s[0].toTensor();
    const double p = s[1].toDouble();
    const bool train = s[2].isNone() || s[2].toBool();
    s.clear();
    if (!train) {
      s.emplace_back(input.clone());
      s.emplace_back(at::ones_like(input, input.options().dtype(at::kBool)));
      return;
    }
    const at::Tensor mask = at::lt(draw(*st, input.sizes(), at::kFloat, input.device(), false), 1.0 - p);
    const double scale = p < 1.0 ? 1.0 / (1.0 - p) : 0.0;
    s.emplace_back(input * mask * scale);
    s.emplace_back(mask);
  };
  auto factory = [st](bool normal) {
    return [st, normal](const c10::OperatorHandle&, Stack& s) {
      const std::vector<int64_t> size = s[0].toIntVector();
      const c10::ScalarType dtype = dtype_or(s[1], c10::get_default_dtype_as_scalartype());
      const c10::Device device = device_or(s[3], c10::kCPU);
      s.clear();
      s.emplace_back(draw(*st, size, dtype, device, normal));
    };
  };
  t["aten::rand"] = factory(false);
  t["aten::randn"] = factory(true);
  auto like = [st](bool normal) {
    return [st, normal](const c10::OperatorHandle&, Stack& s) {
      const at::Tensor self = s[0].toTensor();
      const c10::ScalarType dtype = dtype_or(s[1], self.scalar_type());
      const c10::Device device = device_or(s[3], self.device());
      s.clear();
      s.emplace_back(draw(*st, self.sizes(), dtype, device, normal));
    };
  };
  t["aten::rand_like"] = like(false);
  t["aten::randn_like"] = like(true);
  t["aten::uniform"] = [st](const c10::OperatorHandle&, Stack& s) {
    const at::Tensor self = s[0].toTensor();
    const double from = s[1].toDouble(), to = s[2].toDouble();
    const at::Tensor u = draw(*st, self.sizes(), self.scalar_type(), self.device(), false);
    s.clear();
    s.emplace_back(u * (to - from) + from);
  };
  t["aten::normal_functional"] = [st](const c10::OperatorHandle&, Stack& s) {
    const at::Tensor self = s[0].toTensor();
    const double mean = s[1].toDouble(), std = s[2].toDouble();
    const at::Tensor n = draw(*st, self.sizes(), self.scalar_type(), self.device(), true);
    s.clear();
    s.emplace_back(n * std + mean);
  };
  return t;
}

// The seed and offset of one call; see Note [Functionalized RNG].
std::pair<int64_t, int64_t> seed_and_offset(c10::Device device, int64_t draws) {
  at::Generator gen = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  if (device.is_cpu()) return {static_cast<int64_t>(at::check_generator<at::CPUGeneratorImpl>(gen)->random64()), 0};
  const uint64_t seed = gen.current_seed(), offset = gen.get_offset();
  gen.set_offset(offset + 4 * static_cast<uint64_t>(draws));
  return {static_cast<int64_t>(seed), static_cast<int64_t>(offset)};
}

}  // namespace

FunctionalizedRngRuntimeWrapper::FunctionalizedRngRuntimeWrapper()
    : state_(std::make_shared<detail::PhiloxTraceState>()) {}

void FunctionalizedRngRuntimeWrapper::pre_compile(AotRequest& request) {
  device_ = c10::Device(c10::kCPU);
  for (const at::Tensor& t : request.flat_args)
    if (t.defined() && !t.device().is_cpu()) {
      device_ = t.device();
      break;
    }
  request.flat_fn = [inner = std::move(request.flat_fn), st = state_](const std::vector<at::Tensor>& args) {
    st->seed = detail::unwrap_functional(args[args.size() - 2]);
    st->offset = detail::unwrap_functional(args[args.size() - 1]);
    st->draws = 0;
    std::vector<at::Tensor> outs = inner(std::vector<at::Tensor>(args.begin(), args.end() - 2));
    st->draws_per_call = st->draws;
    st->seed = st->offset = at::Tensor();
    return outs;
  };
  request.flat_args.push_back(at::scalar_tensor(0, at::kLong));
  request.flat_args.push_back(at::scalar_tensor(0, at::kLong));
  // The caller's own entries win, as in the seed.
  for (auto& [name, fn] : philox_decompositions(state_)) request.config.decompositions.emplace(name, std::move(fn));
  request.fw_metadata.input_info.resize(request.flat_args.size());
  request.fw_metadata.is_rng_op_functionalized = true;
}

ir::CompiledFn FunctionalizedRngRuntimeWrapper::post_compile(ir::CompiledFn compiled, const AotRequest& request) {
  (void)request;
  return [st = state_, device = device_, compiled = std::move(compiled)](std::vector<at::Tensor>& args) {
    const auto [seed, offset] = seed_and_offset(device, st->draws_per_call);
    args.push_back(at::scalar_tensor(seed, at::kLong));
    args.push_back(at::scalar_tensor(offset, at::kLong));
    return compiled(args);
  };
}

void check_no_unfunctionalized_rng(const ir::Graph& graph) {
  for (const ir::Node* n : graph.nodes())
    if (n->is_call() && n->is_nondeterministic())
      throw AotError("functionalize_rng_ops: " + n->target() +
                     " draws random numbers and has no Philox form (see Note [Functionalized RNG] for the ops "
                     "that have one); turn AotConfig::functionalize_rng_ops off for this function");
}

}  // namespace crucible::autograd
