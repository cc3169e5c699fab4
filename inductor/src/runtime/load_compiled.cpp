// load_compiled (crucible/inductor/package.h): a compiled graph read back
// from the files write_compiled wrote, run by the run-time plan, with no
// code generator and no compiler (no NVRTC either).
#include <crucible/inductor/error.h>
#include <crucible/inductor/package.h>

#include "codecache/cpp_builder.h"
#include "codecache/schedule_entry.h"
#include "runtime/cuda_graphs.h"
#include "runtime/cuda_library.h"
#include "runtime/kernel_runner.h"
#include "runtime/memory_plan.h"
#include "runtime/plan.h"
#include "runtime/threads.h"

#include <crucible/ir/parser.h>
#include <crucible/runtime/disk_cache.h>

#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <nlohmann/json.hpp>

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace crucible::inductor {

namespace {

// Note [Packaged cubins]
// A package holds the generated CUDA source's units (Note [Parallel
// NVRTC]) built for each architecture write_compiled was asked for (the
// exporting GPU's by default): NVRTC compiles for any of them without that
// GPU. A real architecture's cubins ("sm_90") run only on GPUs of that
// architecture; a virtual one's PTX ("compute_90") is compiled by the
// driver when it is loaded, for any GPU of that architecture or a newer
// one (CUDA's forward compatibility, at a load that takes longer). So the
// loader takes its device's cubins where the package has them, else the
// PTX of the newest virtual architecture the device runs, else names what
// the package has. The autotuning choices the exporting process made (Note
// [Autotuning]) travel too, with the device they were timed on: a loaded
// step on a GPU of the same name and size launches what the process
// launched (the same bits) and times nothing at its first step; on
// another GPU it times its own.

// The architecture among `archs` whose code runs on a GPU of compute
// capability `cc`: its own cubins, else the newest PTX not newer than it;
// nullopt where there is none.
std::optional<std::string> loadable_arch(const std::vector<std::string>& archs, int cc) {
  const std::string own = "sm_" + std::to_string(cc);
  if (std::find(archs.begin(), archs.end(), own) != archs.end()) return own;
  std::optional<std::string> best;
  int best_cc = -1;
  for (const std::string& a : archs) {
    if (!detail::is_virtual_arch(a)) continue;
    const int v = std::atoi(a.c_str() + std::string_view("compute_").size());
    if (v <= cc && v > best_cc) best = a, best_cc = v;
  }
  return best;
}

void load_cubins(detail::Plan& plan, const nlohmann::json& cuda, const std::string& dir,
                 const InductorOptions& options) {
  if (!c10::impl::hasDeviceGuardImpl(c10::kCUDA))
    throw InductorError("inductor: load_compiled: the package in " + dir + " runs on " + plan.device.str() +
                        ", and this LibTorch has no CUDA");
  const int index = plan.device.index() < 0 ? 0 : plan.device.index();
  const std::vector<std::string> archs = cuda.value("archs", std::vector<std::string>{});
  const int cc = detail::compute_capability(index);
  const std::optional<std::string> arch = loadable_arch(archs, cc);
  if (!arch) {
    std::string have;
    for (const std::string& a : archs) have += (have.empty() ? "" : ", ") + a;
    const std::string own = "sm_" + std::to_string(cc);
    throw InductorError("inductor: load_compiled: the package in " + dir + " holds kernels for " +
                        (have.empty() ? std::string("no architecture") : have) + "; CUDA device " +
                        std::to_string(index) + " is " + own + ": export it again with " + own +
                        " among its CUDA architectures (crucible export --cuda-arch " + own +
                        "), or with the PTX of one at or below it (--cuda-arch compute_" + std::to_string(cc) +
                        ") for this GPU and newer ones");
  }
  std::vector<std::string> cubins;
  for (size_t u = 0; u < cuda.value("units", size_t{0}); ++u) {
    const std::string name = detail::packaged_cubin(*arch, u);
    cubins.push_back(runtime::read_file(dir + "/" + name));
    if (cubins.back().empty())
      throw InductorError("inductor: load_compiled: " + dir + "/" + name + " is missing or empty");
  }
  const c10::DeviceGuard guard(plan.device);
  plan.cuda = std::make_shared<detail::CudaLibrary>(cubins, index);
  plan.cache_dir = detail::cache_dir(options);
  plan.tuning_device = plan.cuda->identity();
  const nlohmann::json tuned = cuda.value("tuned", nlohmann::json::object());  // items() refers to it
  if (cuda.value("tuned_on", "") == plan.tuning_device)
    for (const auto& [key, chosen] : tuned.items()) plan.tuned.emplace(key, chosen.get<int>());
}

// The package file `name` in `dir`; throws where it is missing or empty.
std::string read(const std::string& dir, const std::string& name) {
  std::string text = runtime::read_file(dir + "/" + name);
  if (text.empty()) throw InductorError("inductor: load_compiled: " + dir + "/" + name + " is missing or empty");
  return text;
}

// load_compiled once inductor.json has parsed as `info`.
ir::CompiledFn load(const std::string& dir, const nlohmann::json& info, const InductorOptions& options) {
  const std::string codegen = info.value("codegen", "");
  if (codegen != detail::kCodegenVersion)
    throw InductorError("inductor: load_compiled: the package in " + dir + " was written by code generator '" +
                        codegen + "'; this runtime reads '" + detail::kCodegenVersion +
                        "': export it again with this build");
  // Note [Kernels built for this CPU]: a library built with -march=native
  // may use instructions another CPU lacks (SIGILL at the first call).
  if (const std::string cpu = info.value("cpu", ""); !cpu.empty() && cpu != detail::host_cpu())
    throw InductorError("inductor: load_compiled: the kernels in " + dir +
                        " were built for another CPU (-march=native); export the package on a machine of this "
                        "CPU, or with InductorOptions::flags that do not say -march=native");
  auto plan = std::make_shared<detail::Plan>();
  plan->graph = std::make_shared<ir::Graph>(ir::parse(read(dir, "inductor_graph.txt")));
  std::optional<detail::CompiledSchedule> s =
      detail::parse_schedule_entry(read(dir, "inductor_schedule.entry"), detail::kPackageKey, *plan->graph);
  if (!s)
    throw InductorError("inductor: load_compiled: " + dir +
                        "/inductor_schedule.entry does not parse or does not fit inductor_graph.txt");
  plan->device = s->device;
  if (info.value("device", "") != plan->device.str())
    throw InductorError("inductor: load_compiled: " + dir +
                        "/inductor.json and inductor_schedule.entry disagree on the device");
  plan->size_symbols = info.value("size_symbols", std::vector<int64_t>{});
  if (info.value("kernels", false) && plan->device.is_cuda()) {
    load_cubins(*plan, info.value("cuda", nlohmann::json::object()), dir, options);
  } else if (info.value("kernels", false)) {
    const std::string path = dir + "/inductor_kernels.so";
    plan->library = detail::open_library(path);
    if (!plan->library) throw InductorError("inductor: load_compiled: cannot load " + path + ": " + ::dlerror());
  }
  detail::make_plan(*plan, *s, options);
  plan->threads = detail::thread_tuner(plan->device, options);
  // As compile_fx_inner's: the package keeps the policy it was compiled with.
  return detail::with_cuda_graphs([plan](std::vector<at::Tensor>& inputs) { return detail::run_plan(*plan, inputs); },
                                  *plan->graph, plan->device, info.value("cuda_graphs", false), options.profile);
}

}  // namespace

ir::CompiledFn load_compiled(const std::string& dir, const InductorOptions& options) {
  const std::string text = read(dir, "inductor.json");
  try {
    return load(dir, nlohmann::json::parse(text), options);
  } catch (const nlohmann::json::exception& e) {  // checksummed by the manifest: written by another build
    throw InductorError("inductor: load_compiled: " + dir +
                        "/inductor.json does not parse or is malformed: " + e.what());
  }
}

}  // namespace crucible::inductor
