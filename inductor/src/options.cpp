// InductorOptions::from_environment: the environment's
// CRUCIBLE_INDUCTOR_* variables as options (options.h).
#include <crucible/inductor/options.h>

#include <cstdlib>
#include <string_view>

namespace crucible::inductor {

InductorOptions InductorOptions::from_environment() {
  InductorOptions o;
  auto on = [](const char* name) {
    const char* v = std::getenv(name);
    return v && *v && std::string_view(v) != "0";
  };
  o.profile = on("CRUCIBLE_INDUCTOR_PROFILE");
  o.print_generated_code = on("CRUCIBLE_INDUCTOR_PRINT_CODE");
  o.cuda_graphs = on("CRUCIBLE_INDUCTOR_CUDA_GRAPHS");
  if (const char* dir = std::getenv("CRUCIBLE_INDUCTOR_CACHE_DIR")) o.cache_dir = dir;
  if (const char* k = std::getenv("CRUCIBLE_INDUCTOR_KERNEL_CONFIG"); k && *k) o.kernel_config = std::atoi(k);
  o.force_layout_optimization = on("CRUCIBLE_INDUCTOR_FORCE_LAYOUT_OPT");
  if (const char* a = std::getenv("CRUCIBLE_INDUCTOR_ADAPT_THREADS"); a && *a)
    o.adapt_threads = on("CRUCIBLE_INDUCTOR_ADAPT_THREADS");
  if (const char* a = std::getenv("CRUCIBLE_INDUCTOR_AUTOMATIC_DYNAMIC_SHAPES"); a && *a)
    o.automatic_dynamic_shapes = on("CRUCIBLE_INDUCTOR_AUTOMATIC_DYNAMIC_SHAPES");
  if (const char* a = std::getenv("CRUCIBLE_INDUCTOR_MEMORY_PLANNING"); a && *a)
    o.memory_planning = on("CRUCIBLE_INDUCTOR_MEMORY_PLANNING");
  return o;
}

}  // namespace crucible::inductor
