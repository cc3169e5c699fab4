// Private: a compiled graph's schedule as text and back (Note [Graph cache
// entries]), what the whole-graph cache stores (codecache/graph_cache.h)
// and an exported package holds (crucible/inductor/package.h). On the
// run-time side: reading an entry needs no code generator.
#pragma once

#include "schedule.h"

#include <crucible/ir/graph.h>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace crucible::inductor::detail {

/// A buffer a generated kernel takes, as the run-time plan binds it: the
/// graph Value it reads or defines (null: scratch memory of the kernel's
/// own), and the layout the code was generated for.
struct KernelOperand {
  const ir::Value* value = nullptr;
  bool written = false;
  bool input = false;  // a graph input (a write to it is in place)
  bool host_scalar = false;
  std::vector<int64_t> sizes, strides;
  c10::ScalarType dtype = c10::kFloat;
};

struct KernelPlan {
  std::string name, fuses;
  Launch launch;
  std::vector<KernelOperand> operands;
  std::vector<KernelConfig> configs;  // KernelSignature::configs
  std::string tuning_key;
};

/// What compile_fx_inner runs a graph with: the steps in order (extern
/// nodes of the graph, or generated kernels), the kernels' signatures, the
/// translation unit, and the device its kernels run on.
struct CompiledSchedule {
  c10::Device device = c10::kCPU;
  std::string source;
  std::vector<Schedule::Step> steps;
  std::vector<KernelPlan> kernels;
};

/// The key of the schedule entry in an exported package (package.h): the
/// package's checksums, not a cache key, vouch for it.
inline constexpr const char* kPackageKey = "package";

/// The entry text of `s`, whose nodes and values are `graph`'s, under
/// `key`. Throws InductorError when `s` names a node or value outside
/// `graph`.
std::string schedule_entry(const std::string& key, const CompiledSchedule& s, const ir::Graph& graph);

/// The schedule an entry text holds, with its nodes and values resolved in
/// `graph` by position. nullopt when the text does not parse, is of
/// another code generator version or key, is truncated, or does not fit
/// `graph`.
std::optional<CompiledSchedule> parse_schedule_entry(const std::string& text, const std::string& key,
                                                     const ir::Graph& graph);

}  // namespace crucible::inductor::detail
