// The pass manager: runs a list of named graph passes, verifying the graph
// between them, with instruments around each pass for timing and dumps
// (TVM's PassContext instruments, MLIR's verify-each and print-after-change;
// instrument.h).
#pragma once

#include <crucible/ir/graph.h>
#include <crucible/ir/instrument.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace crucible::ir {

/// A named graph-to-graph rewrite. Passes are plain functions: timing,
/// dumping and verification are added around them by the PassManager.
struct Pass {
  std::string name;
  std::function<void(Graph&)> run;
};

struct PassManagerOptions {
  /// Verify (verifier.h) the graph before the first pass and after each one
  /// that changed it (a structural fingerprint differs).
  bool verify = true;
  /// Around each pass: a stage named after the pass, the graph under
  /// `graph_name` before and after (Note [Compilation stages]); `changed`
  /// says whether the pass changed it (a structural fingerprint differs).
  Instruments instruments{};
  std::string graph_name = "graph";
  /// Also check the metadata against the ops (VerifyOptions::check_meta)
  /// before the first pass and after each one that changed the graph,
  /// whatever `verify` says: a pass that leaves wrong metadata is named. Off
  /// by default: it runs every call on meta tensors each time.
  bool verify_meta = false;
};

/// Runs passes in order over a graph.
class PassManager {
 public:
  explicit PassManager(std::vector<Pass> passes, PassManagerOptions options = {});
  /// Runs every pass (unless an instrument's should_run says no). Throws
  /// IrError if the graph fails verification on entry, naming the pass after
  /// which it fails verification, or naming the pass that threw.
  void run(Graph& graph) const;
  const std::vector<Pass>& passes() const { return passes_; }

 private:
  std::vector<Pass> passes_;
  PassManagerOptions options_;
};

/// Passes by name, so pass lists can be data (a CLI flag, a config file).
class PassRegistry {
 public:
  /// A registry holding Crucible's passes: "dce" (dce.h), "cse" (cse.h),
  /// "propagate_meta" (propagate_meta.h), "fuse_addmm" (fuse_addmm.h),
  /// "fuse_attention" (fuse_attention.h, a pre-grad pass),
  /// "fuse_linear_cross_entropy" (fuse_linear_cross_entropy.h, a pre-grad
  /// pass) and "fold_view_chains" (fold_view_chains.h).
  static PassRegistry builtin();
  /// Adds a pass; throws IrError if its name is taken.
  void add(Pass pass);
  /// The pass called `name`; throws IrError listing the known names otherwise.
  const Pass& get(std::string_view name) const;
  /// The passes called `names`, in that order (for PassManager).
  std::vector<Pass> passes(const std::vector<std::string>& names) const;
  /// Every registered name, sorted.
  std::vector<std::string> names() const;

 private:
  std::map<std::string, Pass, std::less<>> passes_;
};

}  // namespace crucible::ir
