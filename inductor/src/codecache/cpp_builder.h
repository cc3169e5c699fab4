// Private: the compiled-kernel cache and the C++ compiler driver.
#pragma once

#include <crucible/inductor/options.h>

#include <memory>
#include <string>

namespace crucible::inductor::detail {

/// The cache directory of `options` (see InductorOptions::cache_dir),
/// runtime::private_cache_dir's, with its CacheError as InductorError.
std::string cache_dir(const InductorOptions& options);

/// Bumped when generated code or its calling convention changes: part of
/// every cache key.
inline constexpr const char* kCodegenVersion = "crucible-inductor-3";

/// 16 hex digits hashing `identity` (what makes an artifact: source,
/// compiler, flags) with kCodegenVersion: the stem of a cache entry.
std::string cache_key(const std::string& identity);

/// runtime::write_atomically, with its CacheError as InductorError.
void write_atomically(const std::string& path, const std::string& text);

/// A loaded shared library; dlclose'd when the last owner goes.
using Library = std::shared_ptr<void>;

/// Compiles `source` into a shared library and loads it, through the cache:
/// the key hashes the source, compiler, flags and Crucible's version (and,
/// where a flag says -march=native, the host CPU's model and features), and a
/// library already built under that key is loaded without running the
/// compiler. Source and library are written to temporary names and renamed,
/// so concurrent compilers never see half a file; a library that does not
/// load is rebuilt once. Throws InductorError naming the source file and
/// quoting the compiler when it fails.
/// `built`, where given, receives the library's path in the cache.
Library compile_and_load(const std::string& source, const InductorOptions& options, std::string* built = nullptr);

/// Loads the shared library at `path` (dlopen, RTLD_NOW | RTLD_LOCAL);
/// null when it does not load (dlerror() says why).
Library open_library(const std::string& path);

/// The host CPU's identity and features (Note [Kernels built for this
/// CPU] in cpp_builder.cpp): what a library built with -march=native
/// depends on.
const std::string& host_cpu();

/// Whether `options.flags` build for the host's CPU (-march=native).
bool builds_for_host_cpu(const InductorOptions& options);

/// The address of `symbol` in `lib`. Throws InductorError if absent.
void* symbol(const Library& lib, const std::string& name);

}  // namespace crucible::inductor::detail
