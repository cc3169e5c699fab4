// The C++ prelude's f16 conversions (Note [Reduced-precision loops] in
// loop_ir/loop_ir.cpp), in a translation unit that names them: through the
// compiler's _Float16 (IEEE binary16). Embedded at build time
// (codegen/preludes/embed.py): everything after the first empty line.

static inline float crucible_f16_to_float(uint16_t h) {
  _Float16 x;
  std::memcpy(&x, &h, sizeof x);
  return static_cast<float>(x);
}
static inline uint16_t crucible_float_to_f16(float f) {
  const _Float16 x = static_cast<_Float16>(f);
  uint16_t h;
  std::memcpy(&h, &x, sizeof h);
  return h;
}
