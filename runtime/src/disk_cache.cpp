#include <crucible/runtime/disk_cache.h>

#include <elf.h>
#include <link.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

namespace crucible::runtime {

namespace {

void make_dir(const std::string& path) {
  if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST)
    throw CacheError("cannot create the cache directory " + path + ": " + std::strerror(errno));
}

// The GNU build-ID note among `info`'s program headers, in hex ("" if none).
std::string build_id_note(const dl_phdr_info* info) {
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_NOTE) continue;
    const char* p = reinterpret_cast<const char*>(info->dlpi_addr + ph.p_vaddr);
    const char* end = p + ph.p_memsz;
    while (p + sizeof(ElfW(Nhdr)) <= end) {
      const auto* note = reinterpret_cast<const ElfW(Nhdr)*>(p);
      const char* name = p + sizeof(ElfW(Nhdr));
      const char* desc = name + ((note->n_namesz + 3) & ~3u);
      if (note->n_type == NT_GNU_BUILD_ID && note->n_namesz == 4 && std::memcmp(name, "GNU", 4) == 0) {
        std::string id;
        for (uint32_t b = 0; b < note->n_descsz; ++b) {
          char byte[3];
          std::snprintf(byte, sizeof byte, "%02x", static_cast<unsigned char>(desc[b]));
          id += byte;
        }
        return id;
      }
      p = desc + ((note->n_descsz + 3) & ~3u);
    }
  }
  return {};
}

struct ObjectSearch {
  const void* address;
  std::string build_id;
};

int find_object(dl_phdr_info* info, size_t, void* data) {
  auto* search = static_cast<ObjectSearch*>(data);
  const auto address = reinterpret_cast<ElfW(Addr)>(search->address);
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    const ElfW(Addr) begin = info->dlpi_addr + ph.p_vaddr;
    if (ph.p_type == PT_LOAD && address >= begin && address < begin + ph.p_memsz) {
      search->build_id = build_id_note(info);
      return 1;
    }
  }
  return 0;
}

int add_object(dl_phdr_info* info, size_t, void* data) {
  const std::string_view name = info->dlpi_name ? info->dlpi_name : "";
  // The kernel's vDSO changes with the kernel, not with anyone's code.
  if (name.find("linux-vdso") != std::string_view::npos) return 0;
  const std::string id = build_id_note(info);
  *static_cast<std::string*>(data) += (id.empty() ? std::string(name) : id) + "\n";
  return 0;
}

// Taken while this library is initialized: the dynamic linker has loaded
// the program and all its libraries by then, and nothing dlopen'ed since.
const std::string startup_identity = [] {
  std::string ids;
  ::dl_iterate_phdr(add_object, &ids);
  return ids;
}();

}  // namespace

std::string private_cache_dir(const std::string& dir, std::string_view name) {
  std::string path = dir;
  if (path.empty()) {
    const char* xdg = std::getenv("XDG_CACHE_HOME");
    const char* home = std::getenv("HOME");
    const std::string base = (xdg && *xdg) ? xdg : std::string(home ? home : "/tmp") + "/.cache";
    make_dir(base);
    make_dir(base + "/crucible");
    path = base + "/crucible/" + std::string(name);
  }
  make_dir(path);
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw CacheError("the cache directory " + path + " is not a directory");
  if (st.st_mode & (S_IWGRP | S_IWOTH))
    throw CacheError("the cache directory " + path +
                     " is writable by group or others, so another user could plant code in it; chmod 700 it or "
                     "choose another directory");
  return path;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void write_atomically(const std::string& path, std::string_view text) {
  // Unique to this process and call: threads may write the same entry too.
  static std::atomic<uint64_t> writes{0};
  const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(writes++);
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f.write(text.data(), static_cast<std::streamsize>(text.size()));
    if (!f) throw CacheError("cannot write " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    throw CacheError("cannot rename " + tmp + " to " + path + ": " + std::strerror(errno));
}

std::string build_id(const void* address) {
  ObjectSearch search{address, {}};
  ::dl_iterate_phdr(find_object, &search);
  return search.build_id;
}

const std::string& startup_code_identity() { return startup_identity; }

}  // namespace crucible::runtime
