// See crucible/runtime/package.h.
#include <crucible/runtime/disk_cache.h>
#include <crucible/runtime/package.h>

#include <torch/version.h>

#include <nlohmann/json.hpp>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <cstdio>
#include <exception>

namespace crucible::runtime {

std::string checksum(std::string_view bytes) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(XXH3_64bits(bytes.data(), bytes.size())));
  return hex;
}

void write_manifest(const std::string& dir, const PackageManifest& m) {
  nlohmann::json inputs = nlohmann::json::array();
  for (const PackageInput& in : m.inputs) {
    nlohmann::json i = {{"name", in.name},
                        {"kind", std::string(ir::to_string(in.kind))},
                        {"dtype", std::string(c10::toString(in.dtype))},
                        {"sizes", in.sizes},
                        {"device", in.device.str()}};
    if (in.duplicate_of) i["duplicate_of"] = *in.duplicate_of;
    if (in.value) i["value"] = *in.value;
    inputs.push_back(std::move(i));
  }
  const nlohmann::json j = {{"format", m.format},
                            {"backend", m.backend},
                            {"torch", m.torch_version},
                            {"inputs", std::move(inputs)},
                            {"files", m.files}};
  try {
    write_atomically(dir + "/manifest.json", j.dump(2) + "\n");
  } catch (const CacheError& e) {
    throw PackageError(std::string("package: ") + e.what());
  }
}

PackageManifest read_manifest(const std::string& dir) {
  const std::string path = dir + "/manifest.json";
  const std::string text = read_file(path);
  if (text.empty()) throw PackageError("package: " + path + " is missing or empty: not an exported training step");
  PackageManifest m;
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    m.format = j.at("format").get<std::string>();
    if (m.format != kPackageFormat)
      throw PackageError("package: " + path + " is of format '" + m.format + "'; this loader reads '" + kPackageFormat +
                         "': export the step again with this build");
    m.backend = j.at("backend").get<std::string>();
    m.torch_version = j.at("torch").get<std::string>();
    m.files = j.at("files").get<std::map<std::string, std::string>>();
    for (const nlohmann::json& i : j.at("inputs")) {
      PackageInput in;
      in.name = i.at("name").get<std::string>();
      const std::optional<ir::InputKind> kind = ir::input_kind_from_string(i.at("kind").get<std::string>());
      if (!kind) throw PackageError("package: " + path + ": input " + in.name + " has an unknown kind");
      in.kind = *kind;
      if (i.contains("duplicate_of")) in.duplicate_of = i.at("duplicate_of").get<size_t>();
      in.dtype = c10::ScalarType::Undefined;
      const std::string dtype = i.at("dtype").get<std::string>();
      for (int t = 0; t < static_cast<int>(c10::ScalarType::NumOptions); ++t)
        if (dtype == c10::toString(static_cast<c10::ScalarType>(t))) in.dtype = static_cast<c10::ScalarType>(t);
      if (in.dtype == c10::ScalarType::Undefined)
        throw PackageError("package: " + path + ": input " + in.name + " has an unknown dtype " + dtype);
      in.sizes = i.at("sizes").get<std::vector<int64_t>>();
      in.device = c10::Device(i.at("device").get<std::string>());
      if (i.contains("value")) in.value = i.at("value").get<double>();
      m.inputs.push_back(std::move(in));
    }
  } catch (const PackageError&) {
    throw;
  } catch (const std::exception& e) {
    throw PackageError("package: " + path + " is malformed: " + e.what());
  }
  if (m.torch_version != TORCH_VERSION)
    throw PackageError("package: " + path + " was written with LibTorch " + m.torch_version + "; this process runs " +
                       TORCH_VERSION + ": export the step again with this build");
  for (const auto& [name, sum] : m.files)
    if (!name.ends_with(".pt")) read_package_file(dir, m, name);
  return m;
}

std::string read_package_file(const std::string& dir, const PackageManifest& manifest, const std::string& name) {
  const std::string file = dir + "/" + name;
  const auto it = manifest.files.find(name);
  if (it == manifest.files.end()) throw PackageError("package: " + dir + "/manifest.json does not list " + name);
  std::string bytes = read_file(file);
  if (bytes.empty()) throw PackageError("package: " + file + " is missing or empty");
  if (checksum(bytes) != it->second)
    throw PackageError("package: " + file + " fails its checksum (corrupt or altered): export the step again");
  return bytes;
}

}  // namespace crucible::runtime
