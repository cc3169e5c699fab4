#include <crucible/runtime/metrics.h>

namespace crucible::runtime {

void MetricsLog::record(CompilationMetrics metrics) {
  std::lock_guard lock(mu_);
  if (capacity_ == 0) return;
  while (records_.size() >= capacity_) records_.pop_front();
  records_.push_back(std::move(metrics));
}

void MetricsLog::set_capacity(size_t capacity) {
  std::lock_guard lock(mu_);
  capacity_ = capacity;
  while (records_.size() > capacity_) records_.pop_front();
}

size_t MetricsLog::capacity() const {
  std::lock_guard lock(mu_);
  return capacity_;
}

std::vector<CompilationMetrics> MetricsLog::records() const {
  std::lock_guard lock(mu_);
  return {records_.begin(), records_.end()};
}

size_t MetricsLog::size() const {
  std::lock_guard lock(mu_);
  return records_.size();
}

void MetricsLog::clear() {
  std::lock_guard lock(mu_);
  records_.clear();
}

MetricsLog& default_metrics_log() {
  static MetricsLog log;
  return log;
}

}  // namespace crucible::runtime
