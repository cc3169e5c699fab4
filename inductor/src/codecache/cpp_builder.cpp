#include "codecache/cpp_builder.h"

#include <crucible/inductor/error.h>
#include <crucible/runtime/disk_cache.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <string_view>

namespace crucible::inductor::detail {

namespace {

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += (c == '\'') ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

}  // namespace

Library open_library(const std::string& path) {
  void* h = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) return nullptr;
  return Library(h, [](void* p) { ::dlclose(p); });
}

// Note [Kernels built for this CPU]
// With -march=native (the default flags) what the compiler makes depends on
// the host's CPU as well as on its flags: a cache directory shared by
// machines of other CPUs (a home directory on NFS) would hand one a library
// of instructions it lacks, which dies of SIGILL when called. Where a flag
// says native, the kernel's key also holds the CPU's identity and features
// as /proc/cpuinfo gives them for its first processor (torch/_inductor's C++
// code cache keys on the vector ISA it picked, likewise).
const std::string& host_cpu() {
  static const std::string id = [] {
    static constexpr std::string_view kFields[] = {"vendor_id",   "cpu family", "model",           "stepping",
                                                   "flags",       "Features",   "CPU implementer", "CPU architecture",
                                                   "CPU variant", "CPU part"};
    std::ifstream in("/proc/cpuinfo");
    std::string id, line;
    while (std::getline(in, line) && !line.empty())  // the first processor's block
      for (std::string_view f : kFields)
        if (line.rfind(f, 0) == 0) id += line + "\n";
    return id;
  }();
  return id;
}

void write_atomically(const std::string& path, const std::string& text) {
  try {
    runtime::write_atomically(path, text);
  } catch (const runtime::CacheError& e) {
    throw InductorError(std::string("inductor: ") + e.what());
  }
}

std::string cache_key(const std::string& identity) {
  const std::string text = std::string(kCodegenVersion) + "\n" + identity;
  char key[17];
  std::snprintf(key, sizeof key, "%016llx", static_cast<unsigned long long>(XXH3_64bits(text.data(), text.size())));
  return key;
}

std::string cache_dir(const InductorOptions& options) {
  try {
    return runtime::private_cache_dir(options.cache_dir, "inductor");
  } catch (const runtime::CacheError& e) {
    throw InductorError(std::string("inductor: ") + e.what() + " (InductorOptions::cache_dir)");
  }
}

bool builds_for_host_cpu(const InductorOptions& options) {
  return std::any_of(options.flags.begin(), options.flags.end(),
                     [](const std::string& f) { return f.find("native") != std::string::npos; });
}

Library compile_and_load(const std::string& source, const InductorOptions& options, std::string* built) {
  std::string dir = cache_dir(options);
  std::string flags;
  for (const std::string& f : options.flags) flags += " " + quote(f);
  const std::string cpu = builds_for_host_cpu(options) ? host_cpu() : "";
  std::string stem = dir + "/k" + cache_key(options.compiler + "\n" + flags + "\n" + cpu + source);
  std::string src = stem + ".cpp", so = stem + ".so";

  if (built) *built = so;
  if (::access(so.c_str(), R_OK) == 0) {
    if (Library lib = open_library(so)) return lib;
    std::remove(so.c_str());  // a truncated or corrupt entry: rebuild it
  }
  write_atomically(src, source);
  std::string tmp_so = so + ".tmp." + std::to_string(::getpid());
  std::string log = stem + ".log." + std::to_string(::getpid());
  std::string cmd = quote(options.compiler) + flags + " -shared -fPIC -o " + quote(tmp_so) + " " + quote(src) + " > " +
                    quote(log) + " 2>&1";
  int rc = std::system(cmd.c_str());
  std::string message = runtime::read_file(log);
  std::remove(log.c_str());
  if (rc != 0) {
    std::remove(tmp_so.c_str());
    throw InductorError("inductor: the C++ compiler (" + options.compiler + ") failed on the generated source " + src +
                        " (exit status " + std::to_string(rc) + "):\n" + message);
  }
  if (std::rename(tmp_so.c_str(), so.c_str()) != 0)
    throw InductorError("inductor: cannot rename " + tmp_so + " to " + so + ": " + std::strerror(errno));
  Library lib = open_library(so);
  if (!lib) throw InductorError("inductor: cannot load " + so + " built from " + src + ": " + ::dlerror());
  return lib;
}

void* symbol(const Library& lib, const std::string& name) {
  void* p = ::dlsym(lib.get(), name.c_str());
  if (!p) throw InductorError("inductor: the generated library has no symbol " + name);
  return p;
}

}  // namespace crucible::inductor::detail
