// The C++ prelude: what every generated C++ translation unit holds after
// its #includes (<omp.h>, <cmath>, <cstdint>, <cstring>, <limits>,
// <memory>): the exp and erf the loop bodies call, and their division
// (Note [Division] in codegen/preludes/cuda.h). Embedded at build time
// (codegen/preludes/embed.py): everything after the first empty line, byte
// for byte, so this comment is not part of it.
//
// Note [Vectorizable exp and erf]
// libm's expf and erff are calls the vectorizer cannot widen (glibc offers
// vector variants only under -ffast-math), and softmax, log_softmax and
// GELU's forward and backward spend most of their time in them; ATen uses
// SLEEF's vector versions. The generated code therefore carries its own
// float exp (Cody-Waite range reduction, Cephes' degree-6 polynomial, the
// scale built from the exponent bits: within 1 ulp of libm over the whole
// float range, inf and 0 where libm gives them, NaN kept) and float erf
// (the rational minimax approximation on [-4, 4] that Eigen and XLA use for
// float, a few ulp), free of branches and of selects GCC cannot if-convert,
// so that with -fno-trapping-math `omp simd` loops vectorize them (5-7x
// libm's scalar calls on this machine). Doubles keep libm.

// Note [Run-time divisors]
// A kernel over size symbols (Note [Size symbols] in loop_ir/size_expr.h)
// divides its flat index by sizes known only at run time, and a hardware
// 64-bit division costs tens of cycles per element where a literal
// divisor costs a multiplication: a permuting copy ran 1.8x slower. Where
// the index and the divisor fit 32 bits (the renderer checks both ranges)
// the division is a multiplication by the divisor's 64-bit inverse
// M = floor((2^64 - 1) / d) + 1, exact for every such pair (Lemire, Kaser
// and Kurz, "Faster remainder by direct computation", 2019). M depends on
// the divisor alone, which does not change inside a loop, so the compiler
// computes it once outside it.
static inline int64_t crucible_div(int64_t x, int64_t d) {
  const uint64_t m = UINT64_MAX / static_cast<uint64_t>(d) + 1;
  return static_cast<int64_t>((static_cast<unsigned __int128>(m) * static_cast<uint64_t>(x)) >> 64);
}

static inline int64_t crucible_mod(int64_t x, int64_t d) {
  const uint64_t m = UINT64_MAX / static_cast<uint64_t>(d) + 1;
  const uint64_t low = m * static_cast<uint64_t>(x);
  return static_cast<int64_t>((static_cast<unsigned __int128>(low) * static_cast<uint64_t>(d)) >> 64);
}

static inline float crucible_exp(float x) {
  // Clamped where exp over- or underflows anyway (89 -> inf, -104 -> 0
  // through the scale below); a NaN passes the clamp and the last term.
  const float xc = x < -104.0f ? -104.0f : (x > 89.0f ? 89.0f : x);
  const float z = xc * 1.44269504088896341f;
  const int32_t ki = static_cast<int32_t>(z + (z < 0.0f ? -0.5f : 0.5f));
  const float k = static_cast<float>(ki);
  float r = xc - k * 0.693359375f;
  r = r - k * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  // 2^k as two factors, so that k = 128 and k = -150 stay representable.
  const int32_t k1 = ki >> 1;
  const int32_t b1 = (k1 + 127) << 23, b2 = (ki - k1 + 127) << 23;
  float s1, s2;
  __builtin_memcpy(&s1, &b1, 4);
  __builtin_memcpy(&s2, &b2, 4);
  return y * s1 * s2 + (xc - xc);
}
static inline double crucible_exp(double x) { return std::exp(x); }
static inline float crucible_erf(float x) {
  const float xc = x < -4.0f ? -4.0f : (x > 4.0f ? 4.0f : x);
  const float x2 = xc * xc;
  float p = -2.72614225801306e-10f;
  p = p * x2 + 2.77068142495902e-08f;
  p = p * x2 + -2.10102402082508e-06f;
  p = p * x2 + -5.69250639462346e-05f;
  p = p * x2 + -7.34990630326855e-04f;
  p = p * x2 + -2.95459980854025e-03f;
  p = p * x2 + -1.60960333262415e-02f;
  float q = -1.45660718464996e-05f;
  q = q * x2 + -2.13374055278905e-04f;
  q = q * x2 + -1.68282697438203e-03f;
  q = q * x2 + -7.37332916720468e-03f;
  q = q * x2 + -1.42647390514189e-02f;
  return xc * p / q;
}
static inline double crucible_erf(double x) { return std::erf(x); }
// Note [Division] (cuda_codegen.cpp): IEEE here, as ATen's CPU kernels.
static inline float crucible_div(float a, float b) { return a / b; }
static inline double crucible_div(double a, double b) { return a / b; }
