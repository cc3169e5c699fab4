#include "cpp_builder.h"

#include <crucible/inductor/error.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

namespace crucible::inductor::detail {

namespace {

void make_dir(const std::string& path) {
  if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST)
    throw InductorError("inductor: cannot create the cache directory " + path + ": " + std::strerror(errno) +
                        "; set InductorOptions::cache_dir to a writable directory");
}

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += (c == '\'') ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

Library open_library(const std::string& path) {
  void* h = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) return nullptr;
  return Library(h, [](void* p) { ::dlclose(p); });
}

}  // namespace

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void write_atomically(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f << text;
    if (!f) throw InductorError("inductor: cannot write " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    throw InductorError("inductor: cannot rename " + tmp + " to " + path + ": " + std::strerror(errno));
}

std::string cache_key(const std::string& identity) {
  const std::string text = std::string(kCodegenVersion) + "\n" + identity;
  char key[17];
  std::snprintf(key, sizeof key, "%016llx", static_cast<unsigned long long>(XXH3_64bits(text.data(), text.size())));
  return key;
}

std::string cache_dir(const InductorOptions& options) {
  std::string dir = options.cache_dir;
  if (dir.empty()) {
    const char* xdg = std::getenv("XDG_CACHE_HOME");
    const char* home = std::getenv("HOME");
    std::string base = (xdg && *xdg) ? xdg : std::string(home ? home : "/tmp") + "/.cache";
    make_dir(base);
    make_dir(base + "/crucible");
    dir = base + "/crucible/inductor";
  }
  make_dir(dir);
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw InductorError("inductor: the cache directory " + dir + " is not a directory");
  if (st.st_mode & (S_IWGRP | S_IWOTH))
    throw InductorError("inductor: the cache directory " + dir +
                        " is writable by group or others, so another user could plant code in it; "
                        "chmod 700 it or set InductorOptions::cache_dir");
  return dir;
}

Library compile_and_load(const std::string& source, const InductorOptions& options) {
  std::string dir = cache_dir(options);
  std::string flags;
  for (const std::string& f : options.flags) flags += " " + quote(f);
  std::string stem = dir + "/k" + cache_key(options.compiler + "\n" + flags + "\n" + source);
  std::string src = stem + ".cpp", so = stem + ".so";

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
  std::string message = read_all(log);
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
