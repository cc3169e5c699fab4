// load_compiled (crucible/inductor/package.h): a compiled graph read back
// from the files write_compiled wrote, run by the run-time plan, with no
// code generator.
#include <crucible/inductor/error.h>
#include <crucible/inductor/package.h>

#include "codecache/cpp_builder.h"
#include "codecache/schedule_entry.h"
#include "runtime/kernel_runner.h"
#include "runtime/memory_plan.h"
#include "runtime/plan.h"
#include "runtime/threads.h"

#include <crucible/ir/parser.h>
#include <crucible/runtime/disk_cache.h>

#include <nlohmann/json.hpp>

#include <dlfcn.h>

#include <memory>
#include <string>
#include <vector>

namespace crucible::inductor {

ir::CompiledFn load_compiled(const std::string& dir, const InductorOptions& options) {
  auto read = [&](const std::string& name) {
    std::string text = runtime::read_file(dir + "/" + name);
    if (text.empty()) throw InductorError("inductor: load_compiled: " + dir + "/" + name + " is missing or empty");
    return text;
  };
  nlohmann::json info;
  try {
    info = nlohmann::json::parse(read("inductor.json"));
  } catch (const nlohmann::json::exception& e) {
    throw InductorError("inductor: load_compiled: " + dir + "/inductor.json does not parse: " + e.what());
  }
  const std::string codegen = info.value("codegen", "");
  if (codegen != detail::kCodegenVersion)
    throw InductorError("inductor: load_compiled: the package in " + dir + " was written by code generator '" +
                        codegen + "'; this runtime reads '" + detail::kCodegenVersion +
                        "': export it again with this build");
  if (info.value("device", "") != "cpu")
    throw InductorError("inductor: load_compiled: the package in " + dir + " runs on " + info.value("device", "?") +
                        "; this runtime loads CPU packages only");
  // Note [Kernels built for this CPU]: a library built with -march=native
  // may use instructions another CPU lacks (SIGILL at the first call).
  if (const std::string cpu = info.value("cpu", ""); !cpu.empty() && cpu != detail::host_cpu())
    throw InductorError("inductor: load_compiled: the kernels in " + dir +
                        " were built for another CPU (-march=native); export the package on a machine of this "
                        "CPU, or with InductorOptions::flags that do not say -march=native");

  auto plan = std::make_shared<detail::Plan>();
  plan->graph = std::make_shared<ir::Graph>(ir::parse(read("inductor_graph.txt")));
  std::optional<detail::CompiledSchedule> s =
      detail::parse_schedule_entry(read("inductor_schedule.entry"), detail::kPackageKey, *plan->graph);
  if (!s)
    throw InductorError("inductor: load_compiled: " + dir +
                        "/inductor_schedule.entry does not parse or does not fit inductor_graph.txt");
  plan->device = s->device;
  plan->size_symbols = info.value("size_symbols", std::vector<int64_t>{});
  if (info.value("kernels", false)) {
    const std::string path = dir + "/inductor_kernels.so";
    plan->library = detail::open_library(path);
    if (!plan->library) throw InductorError("inductor: load_compiled: cannot load " + path + ": " + ::dlerror());
  }
  detail::make_plan(*plan, *s, options);
  plan->threads = detail::thread_tuner(plan->device, options);
  return [plan](std::vector<at::Tensor>& inputs) { return detail::run_plan(*plan, inputs); };
}

}  // namespace crucible::inductor
