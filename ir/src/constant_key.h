// Equality and hashing of constant arguments by value, for CSE and the pass
// manager's change check.
#pragma once

#include <ATen/core/ivalue.h>

#include <cstddef>

namespace crucible::ir::detail {

/// True when two constants are the same value of the same kind: 1 and 1.0 differ
/// (they promote differently), doubles compare bitwise (0.0 and -0.0 differ,
/// NaN equals NaN). Tensors and kinds not listed in the source compare by identity.
bool same_constant(const c10::IValue& a, const c10::IValue& b);
/// A hash consistent with same_constant.
size_t hash_constant(const c10::IValue& v);

/// Mixes `v` into the running hash `seed` (boost::hash_combine's recipe).
inline void hash_mix(size_t& seed, size_t v) { seed ^= v + 0x9e3779b97f4a7c15ULL + (seed << 6) + (seed >> 2); }

}  // namespace crucible::ir::detail
