// Private: the text generated translation units start with. Each prelude
// is a real header in codegen/preludes/, embedded at build time by
// codegen/preludes/embed.py (codegen/meson.build), so it reads, and
// diffs, as the code it is.
#pragma once

namespace crucible::inductor::detail::preludes {

/// C++: float exp and erf the vectorizer can widen (Note [Vectorizable exp
/// and erf]) and the division the lowering table writes (Note [Division]);
/// after the #includes of every generated C++ translation unit.
extern const char cpu[];
/// C++: the bf16 conversions, where a translation unit names them.
extern const char cpu_bf16[];
/// C++: the f16 conversions, where a translation unit names them.
extern const char cpu_f16[];
/// CUDA: what NVRTC needs beyond the loop bodies (integer types, std::
/// math and numeric limits, division, block-wide reductions, vector
/// moves); what every generated CUDA translation unit starts with.
extern const char cuda[];
/// CUDA: the bf16 and f16 conversions, where a translation unit names them.
extern const char cuda_reduced_precision[];

}  // namespace crucible::inductor::detail::preludes
