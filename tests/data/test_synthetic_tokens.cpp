// Seeded synthetic token batches: shapes, next-token targets, determinism.
#include <crucible/data/error.h>
#include <crucible/data/synthetic_tokens.h>

#include <ATen/ATen.h>

#include "catch.h"
#include "testing.h"

using namespace crucible::data;

TEST_CASE("synthetic token batches are seeded next-token pairs", "[pipeline][tokens]") {
  SyntheticTokenOptions o{.vocab_size = 64, .block_size = 32, .batch_size = 8, .seed = 3};
  Batch b = synthetic_token_batch(o, 0);
  REQUIRE(b.inputs.sizes() == at::IntArrayRef{8, 32});
  REQUIRE(b.targets.sizes() == at::IntArrayRef{8, 32});
  REQUIRE(b.inputs.scalar_type() == at::kLong);
  REQUIRE(b.inputs.min().item<int64_t>() >= 0);
  REQUIRE(b.inputs.max().item<int64_t>() < 64);
  // Targets are the inputs shifted by one position.
  REQUIRE_EQUAL_TENSORS(b.targets.slice(1, 0, 31), b.inputs.slice(1, 1, 32));
  // Each row steps by a constant stride in 1..4 modulo the vocabulary.
  at::Tensor stride = (b.targets - b.inputs).remainder(64);
  REQUIRE_EQUAL_TENSORS(stride, stride.select(1, 0).unsqueeze(1).expand({8, 32}));
  REQUIRE(stride.min().item<int64_t>() >= 1);
  REQUIRE(stride.max().item<int64_t>() <= 4);

  at::manual_seed(123);  // the global generator plays no part
  REQUIRE_EQUAL_TENSORS(synthetic_token_batch(o, 0).inputs, b.inputs);
  REQUIRE_FALSE(at::equal(synthetic_token_batch(o, 1).inputs, b.inputs));
  o.seed = 4;
  REQUIRE_FALSE(at::equal(synthetic_token_batch(o, 0).inputs, b.inputs));
  o.vocab_size = 1;
  REQUIRE_THROWS_AS(synthetic_token_batch(o, 0), crucible::data::DataError);
}
