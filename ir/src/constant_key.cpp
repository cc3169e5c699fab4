#include "constant_key.h"

#include <bit>
#include <functional>
#include <string_view>

namespace crucible::ir::detail {

namespace {

bool same_double(double a, double b) { return std::bit_cast<uint64_t>(a) == std::bit_cast<uint64_t>(b); }

template <typename T, typename Eq>
bool same_list(const c10::List<T>& a, const c10::List<T>& b, Eq eq) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!eq(a.get(i), b.get(i))) return false;
  return true;
}

}  // namespace

bool same_constant(const c10::IValue& a, const c10::IValue& b) {
  if (a.isNone() || b.isNone()) return a.isNone() && b.isNone();
  if (a.isInt()) return b.isInt() && a.toInt() == b.toInt();
  if (a.isDouble()) return b.isDouble() && same_double(a.toDouble(), b.toDouble());
  if (a.isBool()) return b.isBool() && a.toBool() == b.toBool();
  if (a.isString()) return b.isString() && a.toStringRef() == b.toStringRef();
  if (a.isDevice()) return b.isDevice() && a.toDevice() == b.toDevice();
  if (a.isIntList()) return b.isIntList() && a.toIntList() == b.toIntList();
  if (a.isBoolList()) return b.isBoolList() && a.toBoolList() == b.toBoolList();
  if (a.isDoubleList()) return b.isDoubleList() && same_list(a.toDoubleList(), b.toDoubleList(), same_double);
  return a.isSameIdentity(b);
}

size_t hash_constant(const c10::IValue& v) {
  // The kind first (same order as same_constant), then the value.
  size_t h = 0;
  if (v.isNone())
    hash_mix(h, 1);
  else if (v.isInt())
    hash_mix(h, std::hash<int64_t>{}(v.toInt()));
  else if (v.isDouble())
    hash_mix(h, std::hash<uint64_t>{}(std::bit_cast<uint64_t>(v.toDouble())));
  else if (v.isBool())
    hash_mix(h, 2 + v.toBool());
  else if (v.isString())
    hash_mix(h, std::hash<std::string_view>{}(v.toStringRef()));
  else if (v.isDevice())
    hash_mix(h, std::hash<c10::Device>{}(v.toDevice()));
  else if (v.isIntList())
    for (int64_t x : v.toIntList()) hash_mix(h, std::hash<int64_t>{}(x));
  else if (v.isBoolList())
    for (bool x : v.toBoolList()) hash_mix(h, 4 + x);
  else if (v.isDoubleList())
    for (double x : v.toDoubleList()) hash_mix(h, std::bit_cast<uint64_t>(x));
  else if (v.isPtrType())
    hash_mix(h, std::hash<const void*>{}(v.internalToPointer()));
  return h;
}

}  // namespace crucible::ir::detail
