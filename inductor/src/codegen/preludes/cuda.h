// The CUDA prelude: what every generated CUDA translation unit starts with.
// NVRTC compiles without a standard library: the integer types, the std::
// math functions and numeric limits the loop bodies name (Note
// [Lowering]'s table writes them for the C++ renderer) are supplied here,
// as CUDA's own device functions (ATen's CUDA kernels call the same ones),
// with the block-wide reductions and vector moves the kernels call.
// Embedded at build time (codegen/preludes/embed.py): everything after the
// first empty line, byte for byte, so this comment is not part of it.
//
// Note [Division]
// The lowering table writes every division as crucible_div(a, b). The C++
// prelude divides as C++ does (IEEE, as ATen's CPU kernels). The CUDA
// prelude divides floats with PTX's div.full.f32, at most 2 ulp from the
// rounded quotient over the whole float range: what Triton's `/` lowers to
// in the kernels torch.compile generates (triton-lang/triton#10661). `/`
// in CUDA C is div.rn.f32, a dozen instructions and a slow path, and a
// softmax divides every element of its rows: with div.full, GPT-2's
// attention softmax rows under bf16 autocast went from 0.30 to 0.19 ms a
// layer (forward) and from 0.44 to 0.27 ms (backward, which recomputes the
// forward's quotient) on an H100 (CRUCIBLE_INDUCTOR_PROFILE). Doubles keep
// IEEE division.

typedef long long int64_t;
typedef int int32_t;
typedef unsigned short uint16_t;
namespace std {
template <class T> struct numeric_limits;
template <> struct numeric_limits<float> {
  static __device__ __forceinline__ float infinity() { return __int_as_float(0x7f800000); }
  static __device__ __forceinline__ float quiet_NaN() { return __int_as_float(0x7fc00000); }
  static __device__ __forceinline__ float lowest() { return -3.402823466e+38f; }
  static __device__ __forceinline__ float max() { return 3.402823466e+38f; }
};
template <> struct numeric_limits<double> {
  static __device__ __forceinline__ double infinity() { return __longlong_as_double(0x7ff0000000000000ll); }
  static __device__ __forceinline__ double quiet_NaN() { return __longlong_as_double(0x7ff8000000000000ll); }
  static __device__ __forceinline__ double lowest() { return -1.7976931348623157e+308; }
  static __device__ __forceinline__ double max() { return 1.7976931348623157e+308; }
};
template <> struct numeric_limits<int64_t> {
  static __device__ __forceinline__ int64_t lowest() { return -9223372036854775807ll - 1; }
  static __device__ __forceinline__ int64_t max() { return 9223372036854775807ll; }
};
template <> struct numeric_limits<int32_t> {
  static __device__ __forceinline__ int32_t lowest() { return -2147483647 - 1; }
  static __device__ __forceinline__ int32_t max() { return 2147483647; }
};
template <> struct numeric_limits<bool> {
  static __device__ __forceinline__ bool lowest() { return false; }
  static __device__ __forceinline__ bool max() { return true; }
};
#define CRUCIBLE_MATH(name, f32, f64) \
  __device__ __forceinline__ float name(float x) { return ::f32(x); } \
  __device__ __forceinline__ double name(double x) { return ::f64(x); }
CRUCIBLE_MATH(expm1, expm1f, expm1)
CRUCIBLE_MATH(log, logf, log)
CRUCIBLE_MATH(log1p, log1pf, log1p)
CRUCIBLE_MATH(sqrt, sqrtf, sqrt)
CRUCIBLE_MATH(tanh, tanhf, tanh)
CRUCIBLE_MATH(sin, sinf, sin)
CRUCIBLE_MATH(cos, cosf, cos)
CRUCIBLE_MATH(floor, floorf, floor)
CRUCIBLE_MATH(ceil, ceilf, ceil)
CRUCIBLE_MATH(abs, fabsf, fabs)
#undef CRUCIBLE_MATH
__device__ __forceinline__ float pow(float x, float y) { return ::powf(x, y); }
__device__ __forceinline__ double pow(double x, double y) { return ::pow(x, y); }
}  // namespace std
__device__ __forceinline__ float crucible_exp(float x) { return ::expf(x); }
__device__ __forceinline__ double crucible_exp(double x) { return ::exp(x); }
__device__ __forceinline__ float crucible_erf(float x) { return ::erff(x); }
__device__ __forceinline__ double crucible_erf(double x) { return ::erf(x); }
// Note [Division]: float division as Triton's, double division IEEE.
__device__ __forceinline__ float crucible_div(float a, float b) {
  float q;
  asm("div.full.f32 %0, %1, %2;" : "=f"(q) : "f"(a), "f"(b));
  return q;
}
__device__ __forceinline__ double crucible_div(double a, double b) { return a / b; }
// Initial values of max and min: infinities for floating types, the
// extreme values for integers.
template <class T> __device__ __forceinline__ T crucible_lowest() { return std::numeric_limits<T>::lowest(); }
template <class T> __device__ __forceinline__ T crucible_highest() { return std::numeric_limits<T>::max(); }
template <> __device__ __forceinline__ float crucible_lowest<float>() { return -std::numeric_limits<float>::infinity(); }
template <> __device__ __forceinline__ float crucible_highest<float>() { return std::numeric_limits<float>::infinity(); }
template <> __device__ __forceinline__ double crucible_lowest<double>() { return -std::numeric_limits<double>::infinity(); }
template <> __device__ __forceinline__ double crucible_highest<double>() { return std::numeric_limits<double>::infinity(); }
// Combiners; max and min keep a NaN from either side, as ATen's do.
struct CrucibleSum {
  template <class T> __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};
struct CrucibleMax {
  template <class T> __device__ __forceinline__ T operator()(T a, T b) const { return (a != a || a > b) ? a : b; }
};
struct CrucibleMin {
  template <class T> __device__ __forceinline__ T operator()(T a, T b) const { return (a != a || a < b) ? a : b; }
};
// Every thread's `v` combined over the block (blockDim.x a multiple of 32),
// in a fixed order; every thread gets the result.
template <class T, class F> __device__ __forceinline__ T crucible_block_reduce(T v, F f) {
  __shared__ T partial[32];
  for (int d = 16; d > 0; d >>= 1) v = f(v, __shfl_xor_sync(0xffffffffu, v, d));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  __syncthreads();  // the previous reduction of this type has read `partial`
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = partial[0];
  for (int w = 1; w < warps; ++w) v = f(v, partial[w]);
  return v;
}
// A running maximum m and sum s of exp(x - m) (Note [Online softmax] in
// cuda_codegen.cpp), rescaled when m grows: one exp an element unless it
// does; the pair of another part of the row combined in. An infinite or
// NaN m leaves s as it is: the kernel then makes the sum NaN.
template <class T> __device__ __forceinline__ void crucible_online_add(T& m, T& s, T x) {
  if (x != x || x > m) {
    if (x - x == T(0)) s = s * crucible_exp(m - x) + T(1);
    m = x;
  } else if (m - m == T(0)) {
    s += crucible_exp(x - m);
  }
}
template <class T> __device__ __forceinline__ void crucible_online_combine(T& m, T& s, T m2, T s2) {
  const T nm = CrucibleMax()(m, m2);
  if (nm - nm == T(0)) s = s * crucible_exp(m - nm) + s2 * crucible_exp(m2 - nm);
  m = nm;
}
// crucible_block_reduce for the pair: every thread gets the row's (m, s).
template <class T> __device__ __forceinline__ void crucible_block_reduce_online(T& m, T& s) {
  __shared__ T partial_m[32], partial_s[32];
  for (int d = 16; d > 0; d >>= 1) {
    const T m2 = __shfl_xor_sync(0xffffffffu, m, d), s2 = __shfl_xor_sync(0xffffffffu, s, d);
    crucible_online_combine(m, s, m2, s2);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) {
    partial_m[warp] = m;
    partial_s[warp] = s;
  }
  __syncthreads();
  m = partial_m[0];
  s = partial_s[0];
  for (int w = 1; w < warps; ++w) crucible_online_combine(m, s, partial_m[w], partial_s[w]);
}
// A vector of V elements from `from` to `to`, both 16-byte aligned when
// `aligned` (Note [Vectorized pointwise kernels]): a vector load into a
// register array, or a store from one; moved in 16-byte pieces (8-byte for
// a vector of 8 bytes), else element by element.
template <int V, class S> __device__ __forceinline__ void crucible_move_vector(S* to, const S* from, bool aligned) {
  constexpr int kBytes = V * static_cast<int>(sizeof(S));
  if (kBytes % 16 == 0 && aligned) {
#pragma unroll
    for (int k = 0; k < kBytes / 16; ++k) reinterpret_cast<uint4*>(to)[k] = reinterpret_cast<const uint4*>(from)[k];
  } else if (kBytes == 8 && aligned) {
    *reinterpret_cast<uint2*>(to) = *reinterpret_cast<const uint2*>(from);
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) to[j] = from[j];
  }
}
