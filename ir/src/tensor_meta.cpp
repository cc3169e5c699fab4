#include <crucible/ir/error.h>
#include <crucible/ir/tensor_meta.h>

#include <ATen/core/TensorBase.h>

#include <array>
#include <sstream>
#include <utility>

namespace crucible::ir {

TensorMeta TensorMeta::of(const at::TensorBase& t) {
  if (!t.defined()) throw IrError("TensorMeta::of: the tensor is undefined");
  TensorMeta m;
  m.sizes = t.sizes().vec();
  m.strides = t.strides().vec();
  m.storage_offset = t.storage_offset();
  m.dtype = t.scalar_type();
  m.device = t.device();
  m.requires_grad = t.requires_grad();
  return m;
}

TensorMeta TensorMeta::contiguous(std::vector<int64_t> sizes, c10::ScalarType dtype, c10::Device device) {
  TensorMeta m;
  m.strides = contiguous_strides(sizes);
  m.sizes = std::move(sizes);
  m.dtype = dtype;
  m.device = device;
  return m;
}

int64_t TensorMeta::numel() const {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

bool TensorMeta::is_contiguous() const {
  if (strides.size() != sizes.size()) return false;
  int64_t expected = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    if (sizes[i] == 1) continue;  // c10 ignores the stride of size-1 dims
    if (sizes[i] == 0) return true;
    if (strides[i] != expected) return false;
    expected *= sizes[i];
  }
  return true;
}

int64_t TensorMeta::nbytes() const { return numel() * static_cast<int64_t>(c10::elementSize(dtype)); }

bool meta_equivalent(const TensorMeta& a, const TensorMeta& b) {
  if (a.sizes != b.sizes || a.dtype != b.dtype || a.device != b.device || a.storage_offset != b.storage_offset ||
      a.strides.size() != b.strides.size())
    return false;
  if (a.numel() == 0) return true;
  for (size_t d = 0; d < a.sizes.size(); ++d)
    if (a.sizes[d] > 1 && a.strides[d] != b.strides[d]) return false;
  return true;
}

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> strides(sizes.size());
  int64_t s = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    strides[i] = s;
    s *= std::max<int64_t>(sizes[i], 1);
  }
  return strides;
}

namespace {
constexpr std::array<std::pair<c10::ScalarType, std::string_view>, 17> kDtypeNames{{
    {c10::ScalarType::Float, "f32"},
    {c10::ScalarType::Double, "f64"},
    {c10::ScalarType::Half, "f16"},
    {c10::ScalarType::BFloat16, "bf16"},
    {c10::ScalarType::Long, "i64"},
    {c10::ScalarType::Int, "i32"},
    {c10::ScalarType::Short, "i16"},
    {c10::ScalarType::Char, "i8"},
    {c10::ScalarType::Byte, "u8"},
    {c10::ScalarType::UInt16, "u16"},
    {c10::ScalarType::UInt32, "u32"},
    {c10::ScalarType::UInt64, "u64"},  // flash attention's RNG state
    {c10::ScalarType::Bool, "b8"},
    {c10::ScalarType::ComplexFloat, "c64"},
    {c10::ScalarType::ComplexDouble, "c128"},
    {c10::ScalarType::Float8_e4m3fn, "f8e4m3fn"},
    {c10::ScalarType::Float8_e5m2, "f8e5m2"},
}};
}  // namespace

std::string_view dtype_short_name(c10::ScalarType dtype) {
  for (const auto& [t, name] : kDtypeNames)
    if (t == dtype) return name;
  throw IrError(std::string("dtype ") + c10::toString(dtype) + " has no name in Crucible's text form");
}

std::optional<c10::ScalarType> dtype_from_short_name(std::string_view name) {
  for (const auto& [t, n] : kDtypeNames)
    if (n == name) return t;
  return std::nullopt;
}

namespace {
void print_ints(std::ostringstream& os, const std::vector<int64_t>& v) {
  os << '[';
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << ']';
}
}  // namespace

std::string to_string(const TensorMeta& meta) {
  std::ostringstream os;
  os << dtype_short_name(meta.dtype);
  print_ints(os, meta.sizes);
  if (meta.strides != contiguous_strides(meta.sizes)) {
    os << " stride=";
    print_ints(os, meta.strides);
  }
  if (meta.storage_offset != 0) os << " offset=" << meta.storage_offset;
  if (meta.device != c10::Device(c10::kCPU)) os << " @" << meta.device.str();
  if (meta.requires_grad) os << " grad";
  return os.str();
}

}  // namespace crucible::ir
