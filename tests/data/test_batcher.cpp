// Seeded batching: reproducible orders, true permutations, drop_last.
#include <crucible/data/batcher.h>
#include <crucible/data/error.h>
#include <crucible/data/fashion_mnist.h>

#include <ATen/ATen.h>

#include "catch.h"
#include "data_dir.h"
#include "testing.h"

using namespace crucible::data;

TEST_CASE("batches cover the data in a seeded order", "[pipeline][batcher]") {
  const int64_t n = 103;
  at::Tensor x = at::arange(n * 2, at::kFloat).view({n, 2});
  at::Tensor y = at::arange(n, at::kLong);
  Batcher b(x, y, {.batch_size = 10, .shuffle = true, .seed = 7});
  REQUIRE(b.batches_per_epoch() == 11);
  Epoch e = b.epoch(0);
  REQUIRE(e.size() == 11);
  // A permutation of 0..n-1, and every batch is exactly those rows.
  REQUIRE_EQUAL_TENSORS(std::get<0>(e.order().sort()), at::arange(n, at::kLong));
  REQUIRE_FALSE(at::equal(e.order(), at::arange(n, at::kLong)));
  std::vector<at::Tensor> seen;
  for (int64_t i = 0; i < e.size(); ++i) {
    Batch batch = e[i];
    at::Tensor rows = e.order().slice(0, i * 10, std::min<int64_t>(i * 10 + 10, n));
    REQUIRE_EQUAL_TENSORS(batch.inputs, x.index_select(0, rows));
    REQUIRE_EQUAL_TENSORS(batch.targets, rows);
    seen.push_back(batch.targets);
  }
  REQUIRE(e[10].inputs.size(0) == 3);
  REQUIRE_EQUAL_TENSORS(std::get<0>(at::cat(seen).sort()), at::arange(n, at::kLong));
  REQUIRE_THROWS_AS(e[11], crucible::data::DataError);

  // The same (seed, epoch) gives the same order whatever the global generator does.
  at::manual_seed(1);
  at::Tensor again = Batcher(x, y, {.batch_size = 10, .seed = 7}).epoch(0).order();
  at::manual_seed(2);
  at::randn({100});
  REQUIRE_EQUAL_TENSORS(again, e.order());
  REQUIRE_EQUAL_TENSORS(Batcher(x, y, {.batch_size = 10, .seed = 7}).epoch(0).order(), e.order());
  REQUIRE_FALSE(at::equal(b.epoch(1).order(), e.order()));
  REQUIRE_FALSE(at::equal(Batcher(x, y, {.batch_size = 10, .seed = 8}).epoch(0).order(), e.order()));

  Batcher dropping(x, y, {.batch_size = 10, .seed = 7, .drop_last = true});
  REQUIRE(dropping.batches_per_epoch() == 10);
  REQUIRE(dropping.epoch(0)[9].inputs.size(0) == 10);

  Batcher ordered(x, y, {.batch_size = 10, .shuffle = false});
  REQUIRE_EQUAL_TENSORS(ordered.epoch(3).order(), at::arange(n, at::kLong));
}

TEST_CASE("shuffling Fashion-MNIST is reproducible from the seed", "[pipeline][batcher][data]") {
  FashionMnist train = load_fashion_mnist(Split::Train, fashion_mnist_test_dir());
  Batcher a(train.images, train.labels, {.batch_size = 64, .seed = 42});
  Batcher same(train.images, train.labels, {.batch_size = 64, .seed = 42});
  Batcher other(train.images, train.labels, {.batch_size = 64, .seed = 43});
  REQUIRE(a.batches_per_epoch() == 938);  // ceil(60000 / 64)
  REQUIRE(Batcher(train.images, train.labels, {.batch_size = 64, .drop_last = true}).batches_per_epoch() == 937);
  Batch first = a.epoch(0)[0];
  REQUIRE(first.inputs.sizes() == at::IntArrayRef{64, 1, 28, 28});
  REQUIRE_EQUAL_TENSORS(first.inputs, same.epoch(0)[0].inputs);
  REQUIRE_EQUAL_TENSORS(first.targets, same.epoch(0)[0].targets);
  REQUIRE_FALSE(at::equal(first.targets, other.epoch(0)[0].targets));
  REQUIRE(a.epoch(0)[937].inputs.size(0) == 60000 - 937 * 64);
}

TEST_CASE("the batcher refuses mismatched tensors and empty batches", "[pipeline][batcher][errors]") {
  REQUIRE_THROWS_WITH(Batcher(at::zeros({5, 2}), at::zeros({4}), {}), CRUCIBLE_HAS_SUBSTR("5 examples"));
  REQUIRE_THROWS_WITH(Batcher(at::zeros({5, 2}), at::zeros({5}), {.batch_size = 0}),
                      CRUCIBLE_HAS_SUBSTR("batch_size is 0"));
}
