// The runtime wrappers used alone: what their pre_compile decides and what
// their post_compile checks.
#include <crucible/autograd/collect_metadata.h>
#include <crucible/autograd/debug_assert_wrapper.h>
#include <crucible/autograd/dedupe_wrapper.h>
#include <crucible/autograd/error.h>
#include <crucible/autograd/synthetic_base_wrapper.h>

#include <ATen/ATen.h>

#include "catch.h"
#include "testing.h"

using namespace crucible;
using Tensors = std::vector<at::Tensor>;

namespace {

autograd::AotRequest request_for(tracer::TensorFn fn, const Tensors& args) {
  autograd::AotRequest r;
  r.flat_fn = std::move(fn);
  r.trace = [](const tracer::TensorFn& body, const Tensors& a, const tracer::TraceOptions& o) {
    return tracer::make_fx(body, a, o);
  };
  r.flat_args = args;
  r.compile_id = "test";
  r.fw_metadata = autograd::collect_metadata(r, /*is_train=*/false);
  return r;
}

Tensors add_fn(const Tensors& in) { return {in[0] + in[1]}; }

Tensors write_first_fn(const Tensors& in) {
  in[0].mul_(2);
  return {in[0] + in[1]};
}

}  // namespace

TEST_CASE("DebugAssertWrapper: an input compiled as not requiring grad that now does is an error",
          "[autograd][wrapper]") {
  const auto x = at::randn({3}), w = at::randn({3}).requires_grad_();
  autograd::AotRequest r = request_for(add_fn, {x, w});
  autograd::DebugAssertWrapper check;
  check.pre_compile(r);
  ir::CompiledFn fn = check.post_compile([](Tensors& args) { return add_fn(args); }, r);
  Tensors ok{x, w};
  REQUIRE_EQUAL_TENSORS(fn(ok)[0].detach(), (x + w).detach());
  Tensors bad{x.clone().requires_grad_(), w};
  REQUIRE_THROWS_WITH(fn(bad),
                      CRUCIBLE_HAS_SUBSTR("input 0 requires grad, but it did not when the function was compiled"));
}

TEST_CASE("AOTDedupeWrapper: duplicates stay when unwritten, are removed when one is written", "[autograd][wrapper]") {
  const auto x = at::randn({4});
  {
    autograd::AotRequest r = request_for(add_fn, {x, x});
    autograd::AOTDedupeWrapper dedupe;
    dedupe.pre_compile(r);
    REQUIRE(r.flat_args.size() == 2);  // strategy 1: distinct traced copies suffice
    REQUIRE(dedupe.keep_arg_mask() == std::vector<bool>{true, true});
  }
  autograd::AotRequest r = request_for(write_first_fn, {x, x});
  REQUIRE(r.fw_metadata.input_info[0].mutates_data);
  autograd::AOTDedupeWrapper dedupe;
  dedupe.pre_compile(r);
  REQUIRE(dedupe.keep_arg_mask() == std::vector<bool>{true, false});
  REQUIRE(r.flat_args.size() == 1);
  REQUIRE(r.fw_metadata.input_info.size() == 1);
  // At run time the wrapper drops the duplicate before the inner callable.
  size_t seen = 0;
  ir::CompiledFn fn = dedupe.post_compile(
      [&seen](Tensors& args) {
        seen = args.size();
        return Tensors{args[0]};
      },
      r);
  Tensors args{x, x};
  fn(args);
  REQUIRE(seen == 1);
}

TEST_CASE("AOTSyntheticBaseWrapper: merges a written input with the inputs sharing its storage",
          "[autograd][wrapper]") {
  const auto storage = at::randn({8});
  const auto other = at::randn({4});
  autograd::AotRequest r = request_for(
      [](const Tensors& in) {
        in[1].add_(1);
        return Tensors{in[0].sum() + in[1].sum() + in[2].sum()};
      },
      {storage.slice(0, 0, 4), storage.slice(0, 2, 6), other});
  autograd::AOTSyntheticBaseWrapper wrapper;
  wrapper.pre_compile(r);
  REQUIRE(wrapper.groups().size() == 1);
  REQUIRE(wrapper.groups()[0].members == std::vector<size_t>{0, 1});
  REQUIRE_FALSE(wrapper.groups()[0].differentiable);
  // The merged calling convention: the base over the whole storage, then the others.
  REQUIRE(r.flat_args.size() == 2);
  REQUIRE(r.flat_args[0].sizes() == at::IntArrayRef({8}));
  REQUIRE(r.flat_args[1].is_same(other));
  REQUIRE(r.fw_metadata.input_info[0].mutates_data);
  REQUIRE_FALSE(r.fw_metadata.input_info[1].mutates_data);
}
