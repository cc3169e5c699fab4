#include "codecache/cuda_builder.h"

#include "codecache/cpp_builder.h"
#include "codegen/cuda.h"

#include <crucible/inductor/error.h>
#include <crucible/runtime/disk_cache.h>

#if CRUCIBLE_HAVE_NVRTC
#include <cuda.h>
#include <nvrtc.h>
#endif

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <exception>
#include <limits>
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

// The driver API functions Crucible calls, from libcuda.so.1.
struct Driver {
  decltype(&::cuInit) init = nullptr;
  decltype(&::cuGetErrorString) error_string = nullptr;
  decltype(&::cuDeviceGet) device_get = nullptr;
  decltype(&::cuDeviceGetAttribute) device_attribute = nullptr;
  decltype(&::cuDevicePrimaryCtxRetain) primary_ctx_retain = nullptr;
  decltype(&::cuCtxGetCurrent) ctx_get_current = nullptr;
  decltype(&::cuCtxSetCurrent) ctx_set_current = nullptr;
  decltype(&::cuLibraryLoadData) library_load_data = nullptr;
  decltype(&::cuLibraryUnload) library_unload = nullptr;
  decltype(&::cuLibraryGetKernel) library_get_kernel = nullptr;
  decltype(&::cuLaunchKernel) launch_kernel = nullptr;
  decltype(&::cuStreamIsCapturing) stream_is_capturing = nullptr;
  decltype(&::cuDeviceGetName) device_get_name = nullptr;
  std::string error;  // why the driver is unusable; empty when it is
};

const Driver& driver() {
  static const Driver d = [] {
    Driver d;
    void* h = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      d.error = std::string("the CUDA driver (libcuda.so.1) cannot be loaded: ") + ::dlerror();
      return d;
    }
    auto get = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(h, name));
      if (!fn && d.error.empty()) d.error = std::string("the CUDA driver has no ") + name + " (it predates CUDA 12)";
    };
    get(d.init, "cuInit");
    get(d.error_string, "cuGetErrorString");
    get(d.device_get, "cuDeviceGet");
    get(d.device_attribute, "cuDeviceGetAttribute");
    get(d.primary_ctx_retain, "cuDevicePrimaryCtxRetain");
    get(d.ctx_get_current, "cuCtxGetCurrent");
    get(d.ctx_set_current, "cuCtxSetCurrent");
    get(d.library_load_data, "cuLibraryLoadData");
    get(d.library_unload, "cuLibraryUnload");
    get(d.library_get_kernel, "cuLibraryGetKernel");
    get(d.launch_kernel, "cuLaunchKernel");
    get(d.stream_is_capturing, "cuStreamIsCapturing");
    get(d.device_get_name, "cuDeviceGetName");
    if (d.error.empty() && d.init(0) != CUDA_SUCCESS) d.error = "cuInit failed: no usable GPU";
    return d;
  }();
  if (!d.error.empty()) throw InductorError("inductor: " + d.error);
  return d;
}

// The most blocks of a capped grid (Launch::exact unset), per multiprocessor.
constexpr int64_t kBlocksPerSM = 32;

void check(CUresult r, const std::string& what) {
  if (r == CUDA_SUCCESS) return;
  const char* s = nullptr;
  driver().error_string(r, &s);
  throw InductorError("inductor: " + what + " failed: " + (s ? s : "CUDA error " + std::to_string(r)));
}

void check(nvrtcResult r, const std::string& what) {
  if (r != NVRTC_SUCCESS) throw InductorError("inductor: " + what + " failed: " + nvrtcGetErrorString(r));
}

// The device's primary context (the one ATen's runtime calls use) made
// current where no context is: a thread that has not touched the device.
void ensure_context(int device) {
  const Driver& d = driver();
  CUcontext current = nullptr;
  check(d.ctx_get_current(&current), "cuCtxGetCurrent");
  if (current) return;
  CUdevice dev = 0;
  check(d.device_get(&dev, device), "cuDeviceGet");
  CUcontext primary = nullptr;
  check(d.primary_ctx_retain(&primary, dev), "cuDevicePrimaryCtxRetain");
  check(d.ctx_set_current(primary), "cuCtxSetCurrent");
}

int attribute(CUdevice_attribute a, int device) {
  const Driver& d = driver();
  CUdevice dev = 0;
  check(d.device_get(&dev, device), "cuDeviceGet");
  int v = 0;
  check(d.device_attribute(&v, a, dev), "cuDeviceGetAttribute");
  return v;
}

}  // namespace

bool have_nvrtc() { return true; }

std::string compile_cubin(const std::string& source, const std::string& arch, const InductorOptions& options) {
  int major = 0, minor = 0;
  check(nvrtcVersion(&major, &minor), "nvrtcVersion");
  const std::string dir = cache_dir(options);
  const std::string stem =
      dir + "/k" +
      cache_key("nvrtc " + std::to_string(major) + "." + std::to_string(minor) + "\n" + arch + "\n" + source);
  const std::string cu = stem + ".cu", cubin_path = stem + ".cubin";
  // A cubin is an ELF file; anything else (a truncated write from a
  // process that died) is compiled again.
  if (std::string cached = runtime::read_file(cubin_path); cached.size() > 4 && cached.compare(0, 4,
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
    check(nvrtcGetCUBINSize(prog, &size), "nvrtcGetCUBINSize");
    cubin.resize(size);
    check(nvrtcGetCUBIN(prog, cubin.data()), "nvrtcGetCUBIN");
  } catch (...) {
    nvrtcDestroyProgram(&prog);
    throw;
  }
  nvrtcDestroyProgram(&prog);
  write_atomically(cubin_path, cubin);
  return cubin;
}

std::string device_arch(int device) {
  const int cc = attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device) * 10 +
                 attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device);
  int count = 0;
  check(nvrtcGetNumSupportedArchs(&count), "nvrtcGetNumSupportedArchs");
  std::vector<int> archs(static_cast<size_t>(count));
  check(nvrtcGetSupportedArchs(archs.data()), "nvrtcGetSupportedArchs");
  if (std::find(archs.begin(), archs.end(), cc) == archs.end())
    throw InductorError("inductor: CUDA device " + std::to_string(device) + " is sm_" + std::to_string(cc) +
                        ", which this NVRTC cannot compile for; set InductorOptions::cuda_arch to one it knows");
  return "sm_" + std::to_string(cc);
}

CudaLibrary::CudaLibrary(const std::vector<std::string>& cubins, int device) : device_(device) {
  const Driver& d = driver();
  ensure_context(device);
  for (const std::string& cubin : cubins) {
    CUlibrary lib = nullptr;
    const CUresult r = d.library_load_data(&lib, cubin.data(), nullptr, nullptr, 0, nullptr, nullptr, 0);
    if (r != CUDA_SUCCESS) {
      for (void* l : libraries_) d.library_unload(static_cast<CUlibrary>(l));
      check(r, "loading a generated cubin");
    }
    libraries_.push_back(lib);
  }
  // Enough resident blocks to fill the device a few times over; grid-stride
  // loops in every kernel cover the rest.
  max_blocks_ = kBlocksPerSM * attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device);
}

CudaLibrary::~CudaLibrary() {
  for (void* l : libraries_) driver().library_unload(static_cast<CUlibrary>(l));
}

void* CudaLibrary::kernel(const std::string& name) const {
  CUresult last = CUDA_ERROR_NOT_FOUND;
  for (void* l : libraries_) {
    CUkernel k = nullptr;
    last = driver().library_get_kernel(&k, static_cast<CUlibrary>(l), name.c_str());
    if (last == CUDA_SUCCESS) return k;
  }
  check(last, "looking up the generated kernel " + name);
  return nullptr;
}

std::string CudaLibrary::identity() const {
  const Driver& d = driver();
  CUdevice dev = 0;
  check(d.device_get(&dev, device_), "cuDeviceGet");
  std::array<char, 256> name{};
  check(d.device_get_name(name.data(), static_cast<int>(name.size()) - 1, dev), "cuDeviceGetName");
  return std::string(name.data()) + ", " + std::to_string(max_blocks_ / kBlocksPerSM) + " SMs";
}

int64_t CudaLibrary::blocks(const Launch& l) const {
  const int64_t needed = (l.units + l.per_block - 1) / l.per_block;
  // An exact grid stays within CUDA's 2^31 - 1 blocks: row kernels loop
  // over what it leaves, and combined launches take far fewer.
  return l.exact ? std::min<int64_t>(needed, std::numeric_limits<int32_t>::max()) : std::min(max_blocks_, needed);
}

void CudaLibrary::launch(void* kernel, const std::string& name, const Launch& l, void* stream, void** args) const {
  if (l.units <= 0) return;
  ensure_context(device_);  // a thread whose runtime calls have not made one current
  // A CUkernel launches as a CUfunction in the current context.
  check(driver().launch_kernel(reinterpret_cast<CUfunction>(kernel), static_cast<unsigned>(blocks(l)), 1, 1,
                               static_cast<unsigned>(l.block), 1, 1, static_cast<unsigned>(l.shared_bytes),
                               static_cast<CUstream>(stream), args, nullptr),
        "launching the generated kernel " + name);
}

bool CudaLibrary::capturing(void* stream) const {
  ensure_context(device_);
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  check(driver().stream_is_capturing(static_cast<CUstream>(stream), &status), "cuStreamIsCapturing");
  return status != CU_STREAM_CAPTURE_STATUS_NONE;
}

#else  // no NVRTC in this build

namespace {
[[noreturn]] void unavailable() {
  throw InductorError(
      "inductor: this build of Crucible has no NVRTC, so CUDA kernels cannot be generated; reconfigure where the CUDA "
      "toolkit is installed (meson option nvrtc_prefix)");
}
}  // namespace

bool have_nvrtc() { return false; }
std::string compile_cubin(const std::string&, const std::string&, const InductorOptions&) { unavailable(); }
std::string device_arch(int) { unavailable(); }
CudaLibrary::CudaLibrary(const std::vector<std::string>&, int) { unavailable(); }
CudaLibrary::~CudaLibrary() = default;
void* CudaLibrary::kernel(const std::string&) const { unavailable(); }
void CudaLibrary::launch(void*, const std::string&, const Launch&, void*, void**) const { unavailable(); }
std::string CudaLibrary::identity() const { unavailable(); }
int64_t CudaLibrary::blocks(const Launch&) const { unavailable(); }
bool CudaLibrary::capturing(void*) const { unavailable(); }

#endif

}  // namespace crucible::inductor::detail
