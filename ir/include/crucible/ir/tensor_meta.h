// TensorMeta: what a graph knows about a tensor Value without holding its data.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace at {
class TensorBase;
}

namespace crucible::ir {

/// The metadata of a tensor Value, as PyTorch's FX keeps in `node.meta["val"]`
/// (a FakeTensor) and `TensorMetadata` (torch/fx/passes/shape_prop.py).
/// Sizes and strides are in elements; storage_offset is in elements.
struct TensorMeta {
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  int64_t storage_offset = 0;
  c10::ScalarType dtype = c10::ScalarType::Float;
  c10::Device device = c10::Device(c10::kCPU);
  bool requires_grad = false;

  /// The metadata of a real (or meta) tensor. Throws ir::IrError if `t` is undefined.
  static TensorMeta of(const at::TensorBase& t);
  /// Contiguous metadata for `sizes` (row-major strides, offset 0).
  static TensorMeta contiguous(std::vector<int64_t> sizes, c10::ScalarType dtype = c10::ScalarType::Float,
                               c10::Device device = c10::Device(c10::kCPU));

  /// Number of elements (product of sizes; 1 for a 0-dim tensor).
  int64_t numel() const;
  /// True when strides are the row-major strides of sizes (size-1 dims ignored, as in c10).
  bool is_contiguous() const;
  /// Bytes the elements occupy (numel × element size), not the storage size.
  int64_t nbytes() const;

  bool operator==(const TensorMeta&) const = default;
};

/// True when `a` and `b` describe the same tensor as far as any kernel can
/// tell: equal sizes, dtype, device and storage offset, and equal strides in
/// every dimension of size above 1 (for a tensor with elements). The stride
/// of a size-1 dimension, or any stride of an empty tensor, never moves to
/// another element, and kernels differ on what they write there (c10's
/// is_contiguous ignores them too; torch._prims_common's
/// check_significant_strides compares the same). requires_grad is ignored.
bool meta_equivalent(const TensorMeta& a, const TensorMeta& b);

/// Row-major strides of `sizes`, in elements.
std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& sizes);

/// Short dtype names used by the text form: f32, f64, f16, bf16, i64, i32, i16,
/// i8, u8, b8, c64, c128. Throws ir::IrError for a dtype without one.
std::string_view dtype_short_name(c10::ScalarType dtype);
/// Inverse of dtype_short_name; nullopt for an unknown name.
std::optional<c10::ScalarType> dtype_from_short_name(std::string_view name);

/// "f32[8, 16]" with " stride=[1, 8]", " offset=3", " @cuda:0", " grad" appended
/// where they differ from contiguous / 0 / cpu / false: the text form's tensor type.
std::string to_string(const TensorMeta& meta);

}  // namespace crucible::ir
