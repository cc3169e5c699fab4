// Backends by name, so that the CLI, the Builder and configuration name them
// as data. Each backend library registers its own backends when it is
// loaded (Note [Backends register themselves]); every command that takes
// --backend then offers them with no change.
#pragma once

#include <crucible/ir/backend.h>
#include <crucible/runtime/memory.h>

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace crucible::runtime {

/// A source file a backend generates for a graph: name and contents.
struct GeneratedFile {
  std::string name;  ///< e.g. "kernel.cpp"
  std::string text;
};

/// The source files a backend generates for a graph.
using CodeGenerator = std::function<std::vector<GeneratedFile>(const ir::Graph& graph)>;

/// One registered backend. Every field has a default, so an entry names
/// only what it has.
struct BackendInfo {
  std::string name{};
  /// One line for --help listings.
  std::string description{};
  ir::Backend compile{};
  /// The code the backend generates for a graph (from its placeholders'
  /// metadata), for dumps (GraphDumpOptions::code, `crucible compile
  /// --dump-dir`). Empty for backends that generate none, such as the
  /// interpreter, which runs the graph as it is.
  CodeGenerator generated_code{};
  /// The memory one call of the graph the backend compiles holds by its
  /// plan (PlannedMemory), for `crucible compile` and the benches. Empty
  /// for backends without one.
  std::function<PlannedMemory(const ir::Graph& graph)> plan_memory{};
  /// One call's time in ms by a cost model of the backend's (the
  /// inductor's roofline estimate), for comparing two graphs of one
  /// computation. Empty for backends without one.
  std::function<double(const ir::Graph& graph)> estimated_ms{};
  /// Writes the backend's compiled form of `graph` into the existing
  /// directory `dir` for an exported training step (pipeline::
  /// export_train_step) and returns the names of the files written, which
  /// crucible::load_train_step reads back without the compiler (the
  /// inductor's: inductor::write_compiled). `cuda_archs` ("sm_90", ...)
  /// are the GPU architectures to build a GPU graph's kernels for; empty:
  /// the backend's choice. Empty for backends that write none: a package
  /// of theirs holds the graph alone, which the loader runs with the
  /// interpreter.
  std::function<std::vector<std::string>(const ir::Graph& graph, const std::string& dir,
                                         const std::vector<std::string>& cuda_archs)>
      write_compiled{};
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
  std::optional<std::string> cache_dir{};
  /// The pre-grad passes (ir::PassRegistry names) a Builder runs with the
  /// backend unless told otherwise (Builder::pre_grad_passes): the
  /// inductor's "fuse_flash_attention", as torch.compile's
  /// inductor replaces written-out attention by default. Empty: none, and
  /// no pre-grad trace.
  std::vector<std::string> pre_grad_passes{};
  /// The decompositions the backend lowers from, by name: "core" for
  /// tracer::core_aten_decompositions() (as torch/_inductor lowers from its
  /// decomposition table), "" for none. A Builder traces with them unless
  /// told otherwise (Builder::decompositions).
  std::string decompositions{};
};

// Note [Backends register themselves]
// torch/_dynamo/backends/registry.py finds a backend by name wherever it is
// defined. Here a backend library registers a factory of its entries with
// register_builtin() from a static initializer, so it runs when the library
// is loaded, and builtin() lists them beside the interpreter. The pipeline
// thus names "inductor" without linking it: a program that wants it links
// crucible-inductor, whose dependency loads it even where no symbol of it
// is named (--no-as-needed, as LibTorch's CUDA half registers its kernels),
// and a Builder's default, best(), is then the inductor. The factory runs at
// each builtin(), so an entry reads the environment when a registry is made
// (the inductor's cache directory), not when the library was loaded.

/// Backends by name (BackendInfo, sorted by name), as
/// torch/_dynamo/backends/registry.py keeps them: add() is register_backend,
/// get() lookup_backend, names() list_backends. builtin() builds a new
/// registry of the registered backends at each call, so adding to one
/// changes no other; callers with backends of their own fill a registry of
/// theirs and pass it to pipeline::Builder::backend (then counted as user
/// code, Note [Builder compiler key]). A plain value with no mutex:
/// concurrent const calls are safe; add() must not overlap other calls on
/// the same registry.
class BackendRegistry {
 public:
  /// The interpreter ("interpreter": ir::interpret, rank 0, the reference)
  /// and every backend registered with register_builtin() so far (Note
  /// [Backends register themselves]).
  static BackendRegistry builtin();
  /// Makes every later builtin() registry hold make()'s entry: how a
  /// backend library registers itself, from a static initializer. Safe from
  /// any thread. Registering a name twice makes builtin() throw.
  static void register_builtin(std::function<BackendInfo()> make);
  /// Adds a backend; throws WrapperError if the name is taken or `compile`
  /// is empty.
  void add(BackendInfo backend);
  /// The backend called `name`; throws WrapperError listing the known names.
  const BackendInfo& get(std::string_view name) const;
  /// Whether a backend called `name` is registered (get() without the throw).
  bool contains(std::string_view name) const;
  /// Every name, sorted.
  std::vector<std::string> names() const;
  /// The backend of the highest rank (the first by name among equals).
  /// Throws WrapperError when the registry is empty.
  const BackendInfo& best() const;

 private:
  std::map<std::string, BackendInfo, std::less<>> backends_;
};

}  // namespace crucible::runtime
