// Files of Crucible's disk caches: the private directory they live in,
// whole-file reads, atomic writes, and the identity of the code that wrote
// an entry (the roles of torch/_inductor/codecache.py's cache_dir and
// write_atomic, and of the source hash torch_key its keys include).
#pragma once

#include <crucible/ir/error.h>

#include <string>
#include <string_view>

namespace crucible::runtime {

/// Thrown when a cache directory cannot be used or an entry not written.
class CacheError : public Error {
 public:
  using Error::Error;
};

/// `dir`, created with mode 0700 if missing; when `dir` is empty, the
/// default $XDG_CACHE_HOME/crucible/<name> (else $HOME/.cache/crucible/<name>),
/// its parents created too. Throws CacheError when it cannot be made, is
/// not a directory, or group or others may write it (another user could
/// then plant entries, which are code or graphs this process would run).
std::string private_cache_dir(const std::string& dir, std::string_view name);

/// The whole file at `path`; "" when it cannot be read.
std::string read_file(const std::string& path);

/// Writes `text` to a temporary name beside `path` (unique to this call)
/// and renames it over `path`, so a concurrent reader sees the old file or
/// the whole new one. Throws CacheError when it cannot.
void write_atomically(const std::string& path, std::string_view text);

/// The GNU build ID (lowercase hex) of the loaded object holding `address`:
/// a hash of the linked binary that Debian's and Ubuntu's toolchains write
/// by default, so a rebuilt library has a new one. "" when that object has
/// none. Reads the loaded program headers; no file is opened.
std::string build_id(const void* address);

/// What identifies the code this process started with: the build IDs of
/// the program and of every shared library loaded with it (the dynamic
/// linker's list when this library was initialized; the name of one that
/// has no build ID). Code loaded later with dlopen is not part of it. A
/// cache whose entries depend on the user's code and on Crucible's (what a
/// function traced to) keys on it, so any rebuild misses.
const std::string& startup_code_identity();

}  // namespace crucible::runtime
