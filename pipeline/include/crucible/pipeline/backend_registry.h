// Backends by name, so that the CLI and configuration name them as data
// ("interpreter" today; inductor's backends register here when they exist,
// and every command that takes --backend offers them with no change).
#pragma once

#include <crucible/ir/backend.h>

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace crucible::pipeline {

/// A source file a backend generates for a graph: name and contents.
struct GeneratedFile {
  std::string name;  ///< e.g. "kernel.cpp"
  std::string text;
};

/// The source files a backend generates for a graph.
using CodeGenerator = std::function<std::vector<GeneratedFile>(const ir::Graph& graph)>;

/// One registered backend.
struct BackendInfo {
  std::string name;
  /// One line for --help listings.
  std::string description;
  ir::Backend compile;
  /// The code the backend generates for a graph (from its placeholders'
  /// metadata), for dumps (GraphDumpOptions::code, `crucible compile
  /// --dump-dir`). Empty for backends that generate none, such as the
  /// interpreter, which runs the graph as it is.
  CodeGenerator generated_code;
  /// best() picks the registered backend of the highest rank: the fastest
  /// that works on this build.
  int rank = 0;
  /// The backend captures CUDA graphs (torch.compile's mode
  /// "reduce-overhead"): a training step compiled for it keeps its step
  /// counts and learning rate on the device (TrainStepOptions::capturable).
  bool cuda_graphs = false;
  /// The backend's disk cache directory, in the form
  /// autograd::AotConfig::disk_cache_dir takes ("" for the default): a
  /// Builder's compilations keep the graphs AOTAutograd traces there too
  /// (Note [AOT trace cache]). Unset: the backend keeps nothing on disk,
  /// and neither does AOTAutograd.
  std::optional<std::string> cache_dir;
};

/// Backends by name (BackendInfo, sorted by name), as
/// torch/_dynamo/backends/registry.py keeps them: add() is register_backend,
/// get() lookup_backend, names() list_backends. builtin() builds a new
/// registry of Crucible's backends at each call, so adding to one changes no
/// other; callers with backends of their own fill a registry of theirs and
/// pass it to Builder::backend (then counted as user code, Note [Builder
/// compiler key]). A plain value with no mutex: concurrent const calls are
/// safe; add() must not overlap other calls on the same registry.
class BackendRegistry {
 public:
  /// Crucible's backends: "interpreter" (ir::interpret, rank 0). A backend
  /// library adds its entries to this function; see backend_registry.cpp.
  static BackendRegistry builtin();
  /// Adds a backend; throws PipelineError if the name is taken or
  /// `compile` is empty.
  void add(BackendInfo backend);
  /// The backend called `name`; throws PipelineError listing the known names.
  const BackendInfo& get(std::string_view name) const;
  /// Whether a backend called `name` is registered (get() without the throw).
  bool contains(std::string_view name) const;
  /// Every name, sorted.
  std::vector<std::string> names() const;
  /// The backend of the highest rank (the first by name among equals).
  /// Throws PipelineError when the registry is empty.
  const BackendInfo& best() const;

 private:
  std::map<std::string, BackendInfo, std::less<>> backends_;
};

}  // namespace crucible::pipeline
