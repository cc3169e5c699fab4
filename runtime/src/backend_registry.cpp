// See Note [Backends register themselves] in backend_registry.h.
#include <crucible/ir/interpreter.h>
#include <crucible/runtime/backend_registry.h>
#include <crucible/runtime/error.h>

#include <mutex>

namespace crucible::runtime {
namespace {

struct Registered {
  std::mutex mu;
  std::vector<std::function<BackendInfo()>> factories;
};

// Function-local: libraries register from their static initializers, which
// may run before this file's.
Registered& registered() {
  static Registered r;
  return r;
}

}  // namespace

BackendRegistry BackendRegistry::builtin() {
  BackendRegistry r;
  r.add({.name = "interpreter",
         .description = "runs the graph node by node through the dispatcher (the reference backend)",
         .compile = ir::interpret});
  Registered& reg = registered();
  std::lock_guard lock(reg.mu);
  for (const auto& make : reg.factories) r.add(make());
  return r;
}

void BackendRegistry::register_builtin(std::function<BackendInfo()> make) {
  Registered& reg = registered();
  std::lock_guard lock(reg.mu);
  reg.factories.push_back(std::move(make));
}

void BackendRegistry::add(BackendInfo backend) {
  if (!backend.compile)
    throw WrapperError("BackendRegistry::add: backend '" + backend.name + "' has no compile function");
  if (backends_.contains(backend.name))
    throw WrapperError("BackendRegistry::add: a backend named '" + backend.name +
                       "' is registered already; pick another name");
  std::string name = backend.name;
  backends_.emplace(std::move(name), std::move(backend));
}

const BackendInfo& BackendRegistry::get(std::string_view name) const {
  if (auto it = backends_.find(name); it != backends_.end()) return it->second;
  std::string known;
  for (const auto& [n, b] : backends_) known += (known.empty() ? "" : ", ") + n;
  throw WrapperError("unknown backend '" + std::string(name) + "'; the registered backends are " +
                     (known.empty() ? std::string("none") : known) +
                     " (the inductor's register themselves when the program links crucible-inductor)");
}

bool BackendRegistry::contains(std::string_view name) const { return backends_.find(name) != backends_.end(); }

std::vector<std::string> BackendRegistry::names() const {
  std::vector<std::string> out;
  for (const auto& [n, b] : backends_) out.push_back(n);
  return out;
}

const BackendInfo& BackendRegistry::best() const {
  const BackendInfo* best = nullptr;
  for (const auto& [n, b] : backends_)
    if (!best || b.rank > best->rank) best = &b;
  if (!best) throw WrapperError("BackendRegistry::best: no backend is registered");
  return *best;
}

}  // namespace crucible::runtime
