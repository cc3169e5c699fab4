// Seeded synthetic token batches for language models (the GPT of the zoo).
#pragma once

#include <crucible/data/batcher.h>

#include <cstdint>

namespace crucible::data {

struct SyntheticTokenOptions {
  int64_t vocab_size = 64;
  int64_t block_size = 32;  ///< sequence length T
  int64_t batch_size = 8;
  uint64_t seed = 0;
};

/// Batch number `step` of a seeded, learnable token stream: each row is an
/// arithmetic sequence modulo vocab_size, t_{j+1} = (t_j + d) mod V, with a
/// random start and a random stride d in 1..4, so the next token follows from
/// the previous two and a model's loss can fall well below log(V).
/// inputs: int64 [B, T] = rows[:, :T]; targets: int64 [B, T] = rows[:, 1:],
/// the next token at every position. Draws from a generator seeded with
/// (seed, step), never the global one: the same arguments give the same batch.
/// Throws DataError for a vocab_size < 2 or a non-positive size.
Batch synthetic_token_batch(const SyntheticTokenOptions& options, int64_t step);

}  // namespace crucible::data
