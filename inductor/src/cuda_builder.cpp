#include "cuda_builder.h"

#include "cpp_builder.h"

#include <crucible/inductor/error.h>

#if CRUCIBLE_HAVE_NVRTC
#include <cuda.h>
#include <nvrtc.h>
#endif

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <vector>

namespace crucible::inductor::detail {

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
    if (d.error.empty() && d.init(0) != CUDA_SUCCESS) d.error = "cuInit failed: no usable GPU";
    return d;
  }();
  if (!d.error.empty()) throw InductorError("inductor: " + d.error);
  return d;
}

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
  if (std::string cached = read_all(cubin_path); cached.size() > 4 && cached.compare(0, 4,
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

CudaLibrary::CudaLibrary(const std::string& cubin, int device) : device_(device) {
  const Driver& d = driver();
  ensure_context(device);
  CUlibrary lib = nullptr;
  check(d.library_load_data(&lib, cubin.data(), nullptr, nullptr, 0, nullptr, nullptr, 0), "loading a generated cubin");
  library_ = lib;
  // Enough resident blocks to fill the device a few times over; grid-stride
  // loops in every kernel cover the rest.
  max_blocks_ = int64_t{32} * attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device);
}

CudaLibrary::~CudaLibrary() {
  if (library_) driver().library_unload(static_cast<CUlibrary>(library_));
}

void* CudaLibrary::kernel(const std::string& name) const {
  CUkernel k = nullptr;
  check(driver().library_get_kernel(&k, static_cast<CUlibrary>(library_), name.c_str()),
        "looking up the generated kernel " + name);
  return k;
}

void CudaLibrary::launch(void* kernel, const std::string& name, const Launch& l, void* stream, void** args) const {
  if (l.units <= 0) return;
  ensure_context(device_);  // a thread whose runtime calls have not made one current
  const int64_t needed = (l.units + l.per_block - 1) / l.per_block;
  const int64_t blocks = l.exact ? needed : std::min(max_blocks_, needed);
  // A CUkernel launches as a CUfunction in the current context.
  check(driver().launch_kernel(reinterpret_cast<CUfunction>(kernel), static_cast<unsigned>(blocks), 1, 1,
                               static_cast<unsigned>(l.block), 1, 1, static_cast<unsigned>(l.shared_bytes),
                               static_cast<CUstream>(stream), args, nullptr),
        "launching the generated kernel " + name);
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
CudaLibrary::CudaLibrary(const std::string&, int) { unavailable(); }
CudaLibrary::~CudaLibrary() = default;
void* CudaLibrary::kernel(const std::string&) const { unavailable(); }
void CudaLibrary::launch(void*, const std::string&, const Launch&, void*, void**) const { unavailable(); }

#endif

}  // namespace crucible::inductor::detail
