// The C++ prelude's bf16 conversions (Note [Reduced-precision loops] in
// loop_ir/loop_ir.cpp), in a translation unit that names them: bf16 as its
// bit pattern, widened exactly and rounded to nearest even, a NaN kept a
// quiet NaN, as c10::BFloat16 converts; branch-free, so loops vectorize.
// Embedded at build time (codegen/preludes/embed.py): everything after the
// first empty line.

static inline float crucible_bf16_to_float(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
static inline uint16_t crucible_float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>(f != f ? 0x7fc0u : rounded);
}
