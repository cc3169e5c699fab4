// See memory.h.
#include <crucible/runtime/memory.h>

#include <ATen/DeviceAccelerator.h>

#include <fstream>
#include <string>

namespace crucible::runtime {
namespace {

bool on_accelerator(c10::Device device) { return device.type() != c10::kCPU && device.type() != c10::kMeta; }

c10::DeviceIndex index_of(c10::Device device) {
  return device.has_index() ? device.index() : at::accelerator::getDeviceIndex();
}

}  // namespace

MemoryPeaks memory_peaks(c10::Device device) {
  MemoryPeaks peaks;
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmHWM:", 0) == 0) peaks.rss_bytes = std::stoll(line.substr(6)) * 1024;  // kB
  if (on_accelerator(device) && at::accelerator::isAccelerator(device.type())) {
    const auto stats = at::accelerator::getDeviceStats(index_of(device));
    const size_t all = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    peaks.device_allocated_bytes = stats.allocated_bytes[all].peak;
    peaks.device_reserved_bytes = stats.reserved_bytes[all].peak;
  }
  return peaks;
}

void reset_memory_peaks(c10::Device device) {
  std::ofstream("/proc/self/clear_refs") << "5";  // VmHWM back to the resident size now
  if (on_accelerator(device) && at::accelerator::isAccelerator(device.type()))
    at::accelerator::resetPeakStats(index_of(device));
}

}  // namespace crucible::runtime
