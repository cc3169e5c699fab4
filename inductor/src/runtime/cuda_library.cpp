// See runtime/cuda_library.h.
#include "runtime/cuda_library.h"

#include <crucible/inductor/error.h>

#if CRUCIBLE_HAVE_CUDA_DRIVER
#include <cuda.h>
#endif

#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

namespace crucible::inductor::detail {

#if CRUCIBLE_HAVE_CUDA_DRIVER

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

int compute_capability(int device) {
  return attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device) * 10 +
         attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device);
}

std::string device_identity(int device) {
  const Driver& d = driver();
  CUdevice dev = 0;
  check(d.device_get(&dev, device), "cuDeviceGet");
  std::array<char, 256> name{};
  check(d.device_get_name(name.data(), static_cast<int>(name.size()) - 1, dev), "cuDeviceGetName");
  return std::string(name.data()) + ", " + std::to_string(attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device)) +
         " SMs";
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

std::string CudaLibrary::identity() const { return device_identity(device_); }

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

#else  // no cuda.h in this build

namespace {
[[noreturn]] void unavailable() {
  throw InductorError(
      "inductor: this build of Crucible has no CUDA driver header (cuda.h), so CUDA kernels cannot be loaded; "
      "reconfigure where the CUDA toolkit is installed (meson option nvrtc_prefix)");
}
}  // namespace

int compute_capability(int) { unavailable(); }
std::string device_identity(int) { unavailable(); }
CudaLibrary::CudaLibrary(const std::vector<std::string>&, int) { unavailable(); }
CudaLibrary::~CudaLibrary() = default;
void* CudaLibrary::kernel(const std::string&) const { unavailable(); }
void CudaLibrary::launch(void*, const std::string&, const Launch&, void*, void**) const { unavailable(); }
std::string CudaLibrary::identity() const { unavailable(); }
int64_t CudaLibrary::blocks(const Launch&) const { unavailable(); }
bool CudaLibrary::capturing(void*) const { unavailable(); }

#endif

}  // namespace crucible::inductor::detail
