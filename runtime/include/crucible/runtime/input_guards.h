// The guards of a compilation: what it assumed about its arguments and the
// call (see Note [AOT cache guards] in autograd/aot_function.h), checked
// before a compiled graph runs, as TorchDynamo's guards are.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/SmallVector.h>

#include <cstdint>
#include <string>
#include <vector>

namespace crucible::runtime {

/// What one compilation assumed about its flat arguments and the call:
/// per argument whether it is defined, its sizes, strides, dtype, device and
/// requires_grad, which earlier argument it is (the same tensor) or shares
/// storage with, and for arguments that share storage their storage offsets
/// and storage sizes; grad mode; autocast (on or off, and its dtype, on the
/// CPU and on CUDA: the graph holds the casts the trace saw, see Note
/// [Autocast in compiled graphs]); and an `extra` key of the caller's (a
/// module's training flags).
class InputGuards {
 public:
  InputGuards(const std::vector<at::Tensor>& args, bool grad_enabled, std::vector<bool> extra = {});

  /// True when `args` and the call meet every guard. Allocates nothing for
  /// up to 32 arguments.
  bool check(const std::vector<at::Tensor>& args, bool grad_enabled, const std::vector<bool>& extra) const;

  /// The first guard `args` fail, e.g. "input 0: sizes [7, 3] (compiled for
  /// [4, 3])" ("" when all pass), and how many leading arguments met all
  /// their own guards before it (0 when grad mode, the argument count or
  /// `extra` differ): the compilation with the most is the closest one.
  struct Mismatch {
    size_t matched = 0;
    std::string reason;
  };
  Mismatch first_difference(const std::vector<at::Tensor>& args, bool grad_enabled,
                            const std::vector<bool>& extra) const;

 private:
  struct Entry {
    bool defined = false;
    c10::SmallVector<int64_t, 5> sizes, strides;
    c10::ScalarType dtype = c10::ScalarType::Undefined;
    c10::Device device = c10::Device(c10::kCPU);
    bool requires_grad = false;
    int32_t same_as = -1;     // earlier argument that is the same tensor
    int32_t storage_of = -1;  // earlier argument sharing its storage
    bool aliased = false;     // shares storage with another argument
    int64_t storage_offset = 0;
    int64_t storage_nbytes = 0;
  };
  struct Autocast {
    bool cpu = false, cuda = false;
    c10::ScalarType cpu_dtype = c10::ScalarType::Undefined, cuda_dtype = c10::ScalarType::Undefined;
    static Autocast current();
    bool operator==(const Autocast&) const = default;
  };
  bool grad_enabled_;
  Autocast autocast_;
  std::vector<bool> extra_;
  std::vector<Entry> entries_;
};

}  // namespace crucible::runtime
