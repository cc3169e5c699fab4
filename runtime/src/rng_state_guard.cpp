#include <crucible/runtime/rng_state_guard.h>

#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>

#include <mutex>

namespace crucible::runtime {

RngStateGuard::RngStateGuard() {
  std::vector<at::Generator> generators{at::detail::getDefaultCPUGenerator()};
  // CUDA generators exist only where LibTorch's CUDA half is loaded and a
  // device is present; getCUDAHooks() answers without CUDA headers.
  if (at::detail::getCUDAHooks().hasCUDA()) {
    const int n = at::detail::getCUDAHooks().getNumGPUs();
    for (int i = 0; i < n; ++i)
      generators.push_back(
          at::globalContext().defaultGenerator(c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(i))));
  }
  for (at::Generator& g : generators) {
    std::lock_guard<std::mutex> lock(g.mutex());
    saved_.emplace_back(g, g.get_state());
  }
}

RngStateGuard::~RngStateGuard() {
  for (auto& [g, state] : saved_) {
    std::lock_guard<std::mutex> lock(g.mutex());
    g.set_state(state);
  }
}

}  // namespace crucible::runtime
