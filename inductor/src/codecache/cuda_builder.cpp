#include "codecache/cuda_builder.h"

#include "codecache/cpp_builder.h"
#include "codegen/cuda.h"
#include "runtime/cuda_library.h"

#include <crucible/inductor/error.h>
#include <crucible/runtime/disk_cache.h>

#if CRUCIBLE_HAVE_NVRTC
#include <nvrtc.h>
#endif

#include <algorithm>
#include <atomic>
#include <exception>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace crucible::inductor::detail {

// Note [Parallel NVRTC]
// NVRTC compiles a translation unit on one thread, and a training step's
// kernels make a large one: GPT-2 small's step is about 1 MB of CUDA C++,
// 14 s of NVRTC on this project's 2-core VM, most of the 21 s its cold
// compile took on an H200's 16-core host. So the renderer puts a break
// before each kernel (kCudaUnitBreak), the source splits there into units
// of about kUnitBytes of kernels, each with the prelude in front, and the
// units compile on as many threads as the host has, each cached on its
// own. Each unit becomes a library of its own; a kernel is looked up in
// each in turn. Splitting by size, not by thread count, keeps the units
// (and their cache keys) the same on every machine. NVRTC compiles
// programs on several threads at once: GPT-2's 24 units took 8–9 s on the
// VM's 2 threads.
namespace {
constexpr size_t kUnitBytes = 32 * 1024;
}

std::vector<std::string> cuda_units(const std::string& source) {
  const std::string_view brk = kCudaUnitBreak;
  size_t at = source.find(brk);
  if (at == std::string::npos) return {source};
  const std::string prelude = source.substr(0, at);
  std::vector<std::string> units;
  std::string kernels;
  while (at != std::string::npos) {
    const size_t next = source.find(brk, at + brk.size());
    kernels.append(source, at, next == std::string::npos ? std::string::npos : next - at);
    if (kernels.size() >= kUnitBytes || next == std::string::npos) {
      units.push_back(prelude + kernels);
      kernels.clear();
    }
    at = next;
  }
  return units;
}

std::vector<std::string> compile_cubins(const std::string& source, const std::string& arch,
                                        const InductorOptions& options) {
  const std::vector<std::string> units = cuda_units(source);
  std::vector<std::string> cubins(units.size());
  std::vector<std::exception_ptr> errors(units.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next++; i < units.size(); i = next++) {
      try {
        cubins[i] = compile_cubin(units[i], arch, options);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    }
  };
  const size_t threads = std::min<size_t>(units.size(), std::max(1U, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
  return cubins;
}

#if CRUCIBLE_HAVE_NVRTC

namespace {

void check(nvrtcResult r, const std::string& what) {
  if (r != NVRTC_SUCCESS) throw InductorError("inductor: " + what + " failed: " + nvrtcGetErrorString(r));
}

}  // namespace

std::string compile_cubin(const std::string& source, const std::string& arch, const InductorOptions& options) {
  int major = 0, minor = 0;
  check(nvrtcVersion(&major, &minor), "nvrtcVersion");
  const std::string dir = cache_dir(options);
  const std::string stem =
      dir + "/k" +
      cache_key("nvrtc " + std::to_string(major) + "." + std::to_string(minor) + "\n" + arch + "\n" + source);
  const bool ptx = is_virtual_arch(arch);
  const std::string cu = stem + ".cu", cubin_path = stem + (ptx ? ".ptx" : ".cubin");
  // A cubin is an ELF file, PTX text names its version; anything else (a
  // truncated write from a process that died) is compiled again.
  if (std::string cached = runtime::read_file(cubin_path); ptx ? cached.find(".version") != std::string::npos
                                                               : cached.size() > 4 && cached.compare(0, 4,
                                                                                                     "\x7f"
                                                                                                     "ELF") == 0)
    return cached;
  write_atomically(cu, source);

  nvrtcProgram prog = nullptr;
  check(nvrtcCreateProgram(&prog, source.c_str(), cu.c_str(), 0, nullptr, nullptr), "nvrtcCreateProgram");
  const std::string arch_flag = "--gpu-architecture=" + arch;
  // No fast math: generated code rounds as ATen's CUDA kernels do.
  const char* flags[] = {arch_flag.c_str(), "--std=c++17"};
  const nvrtcResult rc = nvrtcCompileProgram(prog, 2, flags);
  size_t log_size = 0;
  nvrtcGetProgramLogSize(prog, &log_size);
  std::string log(log_size, '\0');
  if (log_size > 0) nvrtcGetProgramLog(prog, log.data());
  if (rc != NVRTC_SUCCESS) {
    nvrtcDestroyProgram(&prog);
    throw InductorError("inductor: NVRTC " + std::to_string(major) + "." + std::to_string(minor) + " (" + arch_flag +
                        ") failed on the generated source " + cu + " (" + nvrtcGetErrorString(rc) + "):\n" + log);
  }
  size_t size = 0;
  std::string cubin;
  try {
    if (ptx) {
      check(nvrtcGetPTXSize(prog, &size), "nvrtcGetPTXSize");
      cubin.resize(size);
      check(nvrtcGetPTX(prog, cubin.data()), "nvrtcGetPTX");
      cubin.resize(cubin.find('\0'));  // the size counts the terminating NUL
    } else {
      check(nvrtcGetCUBINSize(prog, &size), "nvrtcGetCUBINSize");
      cubin.resize(size);
      check(nvrtcGetCUBIN(prog, cubin.data()), "nvrtcGetCUBIN");
    }
  } catch (...) {
    nvrtcDestroyProgram(&prog);
    throw;
  }
  nvrtcDestroyProgram(&prog);
  write_atomically(cubin_path, cubin);
  return cubin;
}

std::string device_arch(int device) {
  const int cc = compute_capability(device);
  int count = 0;
  check(nvrtcGetNumSupportedArchs(&count), "nvrtcGetNumSupportedArchs");
  std::vector<int> archs(static_cast<size_t>(count));
  check(nvrtcGetSupportedArchs(archs.data()), "nvrtcGetSupportedArchs");
  if (std::find(archs.begin(), archs.end(), cc) == archs.end())
    throw InductorError("inductor: CUDA device " + std::to_string(device) + " is sm_" + std::to_string(cc) +
                        ", which this NVRTC cannot compile for; set InductorOptions::cuda_arch to one it knows");
  return "sm_" + std::to_string(cc);
}

#else  // no NVRTC in this build

namespace {
[[noreturn]] void unavailable() {
  throw InductorError(
      "inductor: this build of Crucible has no NVRTC, so CUDA kernels cannot be generated; reconfigure where the CUDA "
      "toolkit is installed (meson option nvrtc_prefix)");
}
}  // namespace

std::string compile_cubin(const std::string&, const std::string&, const InductorOptions&) { unavailable(); }
std::string device_arch(int) { unavailable(); }

#endif

}  // namespace crucible::inductor::detail
