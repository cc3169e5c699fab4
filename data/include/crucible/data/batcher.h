// Mini-batches over an in-memory dataset, shuffled from a seed.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace crucible::data {

/// One mini-batch: model inputs and the targets the loss compares against.
struct Batch {
  at::Tensor inputs;
  at::Tensor targets;
};

struct BatcherOptions {
  int64_t batch_size = 64;
  bool shuffle = true;
  /// Seeds the shuffle. The order depends only on (seed, epoch), never on
  /// LibTorch's global generator, so eager and compiled runs see the same batches.
  uint64_t seed = 0;
  /// Drop the last, smaller batch when the size does not divide N.
  bool drop_last = false;
};

class Batcher;

/// The batches of one epoch, in that epoch's order.
class Epoch {
 public:
  int64_t size() const { return num_batches_; }
  /// Batch `i` (0 <= i < size()): rows order[i*B .. i*B+B) of the dataset,
  /// inputs [b, ...] and targets [b, ...] with b = B except possibly the last.
  /// Throws DataError when `i` is out of range.
  Batch operator[](int64_t i) const;
  /// The permutation of dataset rows this epoch visits (int64 [N]).
  const at::Tensor& order() const { return order_; }

 private:
  friend class Batcher;
  Epoch(const Batcher& batcher, at::Tensor order, int64_t num_batches)
      : batcher_(&batcher), order_(std::move(order)), num_batches_(num_batches) {}
  const Batcher* batcher_;
  at::Tensor order_;
  int64_t num_batches_;
};

/// Cuts `inputs` [N, ...] and `targets` [N, ...] into batches along dim 0.
/// With shuffle, epoch e visits the rows in a Fisher-Yates permutation drawn
/// from std::mt19937_64 seeded with (seed, e); without, in file order.
class Batcher {
 public:
  /// Throws DataError when the two tensors disagree on N or batch_size < 1.
  Batcher(at::Tensor inputs, at::Tensor targets, BatcherOptions options);

  /// Batches per epoch: ceil(N / B), or floor(N / B) with drop_last.
  int64_t batches_per_epoch() const;
  int64_t num_examples() const { return inputs_.size(0); }
  const BatcherOptions& options() const { return options_; }

  /// The batches of epoch `epoch` (any non-negative number; the same number
  /// gives the same order). The Epoch refers to this Batcher: keep it alive.
  Epoch epoch(int64_t epoch) const;

 private:
  friend class Epoch;
  at::Tensor inputs_;
  at::Tensor targets_;
  BatcherOptions options_;
};

}  // namespace crucible::data
