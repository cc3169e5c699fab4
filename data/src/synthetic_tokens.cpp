#include <crucible/data/error.h>
#include <crucible/data/synthetic_tokens.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

namespace crucible::data {

Batch synthetic_token_batch(const SyntheticTokenOptions& o, int64_t step) {
  if (o.vocab_size < 2 || o.block_size < 1 || o.batch_size < 1)
    throw DataError("synthetic_token_batch: vocab_size (" + std::to_string(o.vocab_size) + ") must be >= 2, " +
                    "block_size (" + std::to_string(o.block_size) + ") and batch_size (" +
                    std::to_string(o.batch_size) + ") >= 1");
  // A splitmix-style mix so that nearby (seed, step) pairs give unrelated streams.
  uint64_t z = o.seed + 0x9e3779b97f4a7c15ULL * (static_cast<uint64_t>(step) + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(z ^ (z >> 31));

  const int64_t b = o.batch_size, t = o.block_size;
  at::Tensor start = at::randint(0, o.vocab_size, {b, 1}, gen, at::kLong);
  at::Tensor stride = at::randint(1, 5, {b, 1}, gen, at::kLong);
  at::Tensor rows = (start + stride * at::arange(t + 1, at::kLong)).remainder_(o.vocab_size);
  return {rows.slice(1, 0, t).contiguous(), rows.slice(1, 1, t + 1).contiguous()};
}

}  // namespace crucible::data
