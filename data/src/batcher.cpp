#include <crucible/data/batcher.h>
#include <crucible/data/error.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <random>

namespace crucible::data {

Batcher::Batcher(at::Tensor inputs, at::Tensor targets, BatcherOptions options)
    : inputs_(std::move(inputs)), targets_(std::move(targets)), options_(options) {
  if (!inputs_.defined() || !targets_.defined() || inputs_.dim() == 0 || targets_.dim() == 0)
    throw DataError("Batcher: inputs and targets must be defined tensors with a batch dimension");
  if (inputs_.size(0) != targets_.size(0))
    throw DataError("Batcher: inputs hold " + std::to_string(inputs_.size(0)) + " examples but targets hold " +
                    std::to_string(targets_.size(0)) + "; both need the same size along dim 0");
  if (options_.batch_size < 1)
    throw DataError("Batcher: batch_size is " + std::to_string(options_.batch_size) + "; it must be at least 1");
}

int64_t Batcher::batches_per_epoch() const {
  const int64_t n = num_examples(), b = options_.batch_size;
  return options_.drop_last ? n / b : (n + b - 1) / b;
}

Epoch Batcher::epoch(int64_t epoch) const {
  const int64_t n = num_examples();
  at::Tensor order = at::arange(n, at::kLong);
  if (options_.shuffle) {
    // Our own Fisher-Yates over mt19937_64 (whose output the standard fixes),
    // not std::shuffle or a distribution, whose results differ between
    // standard libraries. The modulo bias (< n / 2^64) is immaterial here.
    std::seed_seq seq{static_cast<uint32_t>(options_.seed), static_cast<uint32_t>(options_.seed >> 32),
                      static_cast<uint32_t>(epoch), static_cast<uint32_t>(static_cast<uint64_t>(epoch) >> 32)};
    std::mt19937_64 rng(seq);
    auto* o = order.data_ptr<int64_t>();
    for (int64_t i = n - 1; i > 0; --i) std::swap(o[i], o[rng() % static_cast<uint64_t>(i + 1)]);
  }
  return Epoch(*this, std::move(order), batches_per_epoch());
}

Batch Epoch::operator[](int64_t i) const {
  if (i < 0 || i >= num_batches_)
    throw DataError("Epoch: batch " + std::to_string(i) + " is out of range; this epoch has " +
                    std::to_string(num_batches_) + " batches");
  const int64_t b = batcher_->options_.batch_size;
  const int64_t start = i * b, end = std::min(start + b, order_.size(0));
  at::Tensor rows = order_.slice(0, start, end);
  return {batcher_->inputs_.index_select(0, rows), batcher_->targets_.index_select(0, rows)};
}

}  // namespace crucible::data
