// The CUDA prelude's conversions between float and the 16-bit patterns of
// bf16 and f16 (Note [Reduced-precision loops] in loop_ir/loop_ir.cpp),
// after the CUDA prelude in a translation unit that names them. Embedded at
// build time (codegen/preludes/embed.py): everything after the first empty
// line.

// bf16 widened exactly and rounded to nearest even as c10::BFloat16
// converts on the device: from sm_80 by the PTX conversion (__float2bfloat16,
// a NaN becomes the canonical NaN), before it in software (a NaN stays a
// quiet NaN); f16 through the PTX conversions.
__device__ __forceinline__ float crucible_bf16_to_float(uint16_t h) {
  return __uint_as_float(static_cast<unsigned>(h) << 16);
}
__device__ __forceinline__ uint16_t crucible_float_to_bf16(float f) {
#if __CUDA_ARCH__ >= 800
  uint16_t h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
#else
  const unsigned u = __float_as_uint(f);
  return f != f ? static_cast<uint16_t>(0x7fc0) : static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
#endif
}
__device__ __forceinline__ float crucible_f16_to_float(uint16_t h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
__device__ __forceinline__ uint16_t crucible_float_to_f16(float f) {
  uint16_t h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}
