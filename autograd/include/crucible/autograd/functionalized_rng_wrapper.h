// FunctionalizedRngRuntimeWrapper: random ops as functions of a seed and an
// offset that are inputs of the graph (runtime_wrappers.py's
// FunctionalizedRngRuntimeWrapper, with torch/_prims/rng_prims.py's
// philox_rand and the rng decompositions of aot_autograd.py).
#pragma once

#include <crucible/autograd/aot_request.h>
#include <crucible/ir/graph.h>

#include <c10/core/Device.h>

#include <memory>

namespace crucible::autograd {

// Note [Functionalized RNG]
// A random op in a graph draws from the device's generator when it runs. That
// is right for the forward (Note [RNG during compilation]), but a partitioner
// that recomputes a random op in the backward instead of saving its result,
// or a CUDA graph replayed later, would draw different numbers. With
// AotConfig::functionalize_rng_ops the random ops are rewritten while
// tracing into crucible::philox_rand(size, seed, offset + k, ...), a pure
// function of two int64 inputs the graph gains at the end of its calling
// convention (InputKind::State "rng_seed", "rng_offset"): the k-th random op
// of the graph reads Philox block `offset + k` of the stream `seed` (element i
// on subsequence i). The same seed and offset give the same numbers wherever
// the op runs, so forward, backward and recomputation agree; the partition
// saves seed and offset like any primal the backward reads.
// Per call the wrapper takes them from the generator of the device the
// inputs live on:
//  - CUDA: the generator's current seed and Philox offset; the offset then
//    advances by 4 per random op of the graph (CUDA offsets count 32-bit
//    draws in multiples of 4), so later eager random ops draw fresh numbers;
//  - CPU (mt19937 has no offset): one 64-bit draw from the default CPU
//    generator is the seed, the offset is 0.
// The numbers differ from eager's (Philox instead of the device's own
// sampler), as they do in the seed; with the option off (the default) the
// compiled forward draws exactly eager's numbers. Rewritten: bernoulli (p
// and tensor forms), native_dropout, rand, rand_like, randn, randn_like,
// uniform, normal_functional. Any other random op left in a graph is an
// AotError naming it.

namespace detail {
struct PhiloxTraceState;
}

/// Note [Functionalized RNG]; installed by the dispatcher when
/// AotConfig::functionalize_rng_ops is set. pre_compile appends the seed and
/// offset arguments, the Philox decompositions and
/// fw_metadata.is_rng_op_functionalized; the wrapped callable appends the
/// generator's seed and offset to each call's arguments and advances the
/// generator.
class FunctionalizedRngRuntimeWrapper : public AotWrapper {
 public:
  FunctionalizedRngRuntimeWrapper();
  std::string_view name() const override { return "FunctionalizedRngRuntimeWrapper"; }
  void pre_compile(AotRequest& request) override;
  ir::CompiledFn post_compile(ir::CompiledFn compiled, const AotRequest& request) override;

 private:
  std::shared_ptr<detail::PhiloxTraceState> state_;
  c10::Device device_{c10::kCPU};
};

/// Throws AotError naming the first random op (at::Tag::nondeterministic_seeded)
/// of `graph`: for graphs traced with functionalized RNG, which must have none.
void check_no_unfunctionalized_rng(const ir::Graph& graph);

/// The draw behind crucible::philox_rand: a tensor of `size`, `dtype` and
/// `device` whose element i is Philox4x32-10 (at::philox_engine) on seed
/// `seed`, subsequence i, block `offset`, mapped to U[0, 1) or, with
/// `normal`, N(0, 1) by Box-Muller. `seed` and `offset` must be one-element
/// int64 tensors; they are read on the host with .item() (a CUDA one
/// synchronizes). `dtype` must be a floating type: the draw is computed as
/// float32 on the CPU and converted to `dtype` on `device` with .to(), which
/// is not checked (an integral dtype truncates the values). Throws
/// c10::Error, not AotError: from .item() when `seed` or `offset` does not
/// hold exactly one element, for a negative size, or when `device` is not
/// available.
at::Tensor philox_rand(c10::IntArrayRef size, const at::Tensor& seed, const at::Tensor& offset, c10::ScalarType dtype,
                       c10::Device device, bool normal);

}  // namespace crucible::autograd
