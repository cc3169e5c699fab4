#include <crucible/ir/cse.h>
#include <crucible/ir/dce.h>
#include <crucible/ir/error.h>
#include <crucible/ir/fold_view_chains.h>
#include <crucible/ir/fuse_addmm.h>
#include <crucible/ir/fuse_attention.h>
#include <crucible/ir/fuse_linear_cross_entropy.h>
#include <crucible/ir/pass_manager.h>
#include <crucible/ir/propagate_meta.h>
#include <crucible/ir/verifier.h>

#include "constant_key.h"

namespace crucible::ir {

namespace {

using detail::hash_mix;

size_t hash_str(std::string_view s) { return std::hash<std::string_view>{}(s); }

void hash_meta(size_t& h, const TensorMeta& m) {
  for (int64_t s : m.sizes) hash_mix(h, static_cast<size_t>(s));
  hash_mix(h, m.sizes.size());
  for (int64_t s : m.strides) hash_mix(h, static_cast<size_t>(s));
  hash_mix(h, static_cast<size_t>(m.storage_offset));
  hash_mix(h, static_cast<size_t>(m.dtype));
  hash_mix(h, std::hash<c10::Device>{}(m.device));
  hash_mix(h, m.requires_grad);
}

// A structural fingerprint of everything the text form shows: node kinds,
// targets, arguments, constants, result names, types and metadata, sources,
// tags and the signature. Equal graphs hash equal; a pass that changes any
// of it changes the hash (but for collisions, which a 64-bit hash makes
// negligible for "did this pass do anything").
size_t fingerprint(const Graph& g) {
  size_t h = g.num_nodes();
  for (const Node* n : g.nodes()) {
    hash_mix(h, static_cast<size_t>(n->kind()));
    hash_mix(h, hash_str(n->target()));
    for (const Argument& a : n->args()) {
      if (a.is_value()) {
        hash_mix(h, hash_str(a.value()->name()));
      } else if (a.is_value_list()) {
        hash_mix(h, a.value_list().size());
        for (const Value* v : a.value_list()) hash_mix(h, v ? hash_str(v->name()) : 0);
      } else {
        hash_mix(h, detail::hash_constant(a.constant()));
      }
    }
    if (n->is_constant()) hash_mix(h, detail::hash_constant(n->constant_value()));
    for (const auto& r : n->results()) {
      hash_mix(h, hash_str(r->name()));
      hash_mix(h, static_cast<size_t>(r->type()->kind()));
      if (r->has_meta()) hash_meta(h, r->meta());
    }
    hash_mix(h, hash_str(n->source()));
    for (const auto& t : n->tags()) hash_mix(h, hash_str(t));
  }
  for (const InputSpec& s : g.signature().inputs) {
    hash_mix(h, static_cast<size_t>(s.kind));
    hash_mix(h, hash_str(s.target));
    hash_mix(h, s.duplicate_of ? *s.duplicate_of + 1 : 0);
  }
  for (const OutputSpec& s : g.signature().outputs) {
    hash_mix(h, static_cast<size_t>(s.kind));
    hash_mix(h, s.input_index ? *s.input_index + 1 : 0);
  }
  return h;
}

}  // namespace

// --- the manager ------------------------------------------------------------------

PassManager::PassManager(std::vector<Pass> passes, PassManagerOptions options)
    : passes_(std::move(passes)), options_(std::move(options)) {}

void PassManager::run(Graph& graph) const {
  const bool verifying = options_.verify || options_.verify_meta;
  const VerifyOptions checks{.check_meta = options_.verify_meta};
  if (verifying) {
    try {
      verify(graph, checks);
    } catch (const IrError& e) {
      throw IrError(std::string("pass manager: the input graph is invalid, before any pass ran: ") + e.what());
    }
  }
  const auto& instruments = options_.instruments;
  // The fingerprint tells the instruments whether a pass changed the graph,
  // and spares a graph the pass left as it was a second verification: a
  // fingerprint costs a fraction of a verification (MLIR's pass manager
  // skips its verifier after a pass that preserved all analyses, for the
  // same reason).
  const bool fingerprinting = verifying || !instruments.empty();
  for (const Pass& pass : passes_) {
    const StageEvent event{.stage = pass.name, .graphs = {{options_.graph_name, &graph}}, .pass = true};
    if (!should_run(instruments, event)) continue;
    const size_t before = fingerprinting ? fingerprint(graph) : 0;
    StageScope scope(instruments, event);
    try {
      pass.run(graph);
    } catch (const std::exception& e) {
      throw IrError("pass '" + pass.name + "' failed: " + e.what());
    }
    const bool changed = fingerprinting && fingerprint(graph) != before;
    if (!instruments.empty()) {
      StageEvent after{.stage = pass.name, .graphs = {{options_.graph_name, &graph}}, .pass = true};
      after.changed = changed;
      scope.done(std::move(after));
    }
    if (verifying && changed) {
      try {
        verify(graph, checks);
      } catch (const IrError& e) {
        throw IrError("pass '" + pass.name + "' left an invalid graph: " + e.what());
      }
    }
  }
}

// --- the registry -----------------------------------------------------------------

PassRegistry PassRegistry::builtin() {
  PassRegistry r;
  r.add({"dce", [](Graph& g) { eliminate_dead_code(g); }});
  r.add({"cse", [](Graph& g) { eliminate_common_subexpressions(g); }});
  r.add({"propagate_meta", [](Graph& g) { propagate_meta(g); }});
  r.add({"fuse_addmm", [](Graph& g) { fuse_addmm(g); }});
  r.add({"fuse_attention", [](Graph& g) { fuse_attention(g); }});
  r.add({"fuse_reduced_precision_attention", [](Graph& g) { fuse_reduced_precision_attention(g); }});
  r.add({"fuse_flash_attention", [](Graph& g) { fuse_flash_attention(g); }});
  r.add({"fuse_linear_cross_entropy", [](Graph& g) { fuse_linear_cross_entropy(g); }});
  r.add({"fold_view_chains", [](Graph& g) { fold_view_chains(g); }});
  return r;
}

void PassRegistry::add(Pass pass) {
  if (passes_.count(pass.name)) throw IrError("pass registry: a pass named '" + pass.name + "' is already registered");
  std::string name = pass.name;
  passes_.emplace(std::move(name), std::move(pass));
}

const Pass& PassRegistry::get(std::string_view name) const {
  if (auto it = passes_.find(name); it != passes_.end()) return it->second;
  std::string known;
  for (const auto& [n, _] : passes_) known += (known.empty() ? "" : ", ") + n;
  throw IrError("unknown pass '" + std::string(name) + "'; registered passes: " + known);
}

std::vector<Pass> PassRegistry::passes(const std::vector<std::string>& names) const {
  std::vector<Pass> r;
  for (const auto& n : names) r.push_back(get(n));
  return r;
}

std::vector<std::string> PassRegistry::names() const {
  std::vector<std::string> r;
  for (const auto& [n, _] : passes_) r.push_back(n);
  return r;
}

}  // namespace crucible::ir
