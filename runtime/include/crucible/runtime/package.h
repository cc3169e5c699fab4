// The manifest of an exported training step (pipeline::export_train_step,
// crucible::load_train_step): what the package's graph takes, which
// backend's files run it, and a checksum of every file, so that a corrupt
// or altered package is refused before anything of it runs.
#pragma once

#include <crucible/ir/error.h>
#include <crucible/ir/signature.h>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace crucible::runtime {

/// Thrown for a package that cannot be read: missing, malformed, of
/// another format or Crucible build, or whose files fail their checksums.
class PackageError : public Error {
 public:
  using Error::Error;
};

/// The format manifest.json declares; another is refused.
inline constexpr const char* kPackageFormat = "crucible-train-step-1";

/// One placeholder of the package's graph, in order: its kind and name
/// (ir::InputSpec), the placeholder it duplicates (a tied parameter), and
/// the metadata the loader checks a tensor bound to it against.
struct PackageInput {
  std::string name;
  ir::InputKind kind = ir::InputKind::UserInput;
  std::optional<size_t> duplicate_of;
  c10::ScalarType dtype = c10::kFloat;
  std::vector<int64_t> sizes;
  c10::Device device = c10::kCPU;
  /// A one-element State input's value at export (a learning rate, a step
  /// count), for a package without state.pt.
  std::optional<double> value;
};

struct PackageManifest {
  std::string format = kPackageFormat;
  /// The backend whose files run the graph (runtime::BackendInfo::name);
  /// "interpreter": graph.txt runs as it is.
  std::string backend;
  /// LibTorch's version (TORCH_VERSION) the package was written with.
  std::string torch_version;
  std::vector<PackageInput> inputs;
  /// Every other file of the package, by name, with its checksum().
  std::map<std::string, std::string> files;
};

/// 16 hex digits: XXH3-64 of `bytes`.
std::string checksum(std::string_view bytes);

/// Writes `manifest` to `dir`/manifest.json (atomically). Throws
/// PackageError when it cannot be written.
void write_manifest(const std::string& dir, const PackageManifest& manifest);

/// Reads `dir`/manifest.json and checks every file it lists against its
/// checksum, except the tensor files (*.pt: weights and optimizer state,
/// the bulk of a package), which read_package_file checks as they are read.
/// Throws PackageError naming the file and the fault: the manifest missing
/// or malformed, another format or LibTorch version, a file missing, or one
/// whose checksum differs (corrupt or altered).
PackageManifest read_manifest(const std::string& dir);

/// The bytes of `name` in the package, checked against the manifest's
/// checksum. Throws PackageError when the manifest does not list it, or it
/// is missing or fails its checksum.
std::string read_package_file(const std::string& dir, const PackageManifest& manifest, const std::string& name);

}  // namespace crucible::runtime
