// The tensors a compiled graph reads from outside its caller's arguments:
// lifted inputs, held weakly (Note [Lifted tensors] in tracer/make_fx.h).
// TorchDynamo reads such free tensors from their source at every call; a
// C++ closure has no source to read again, so a compilation keeps the
// tensor object itself and guards on it: while it lives, every call reads
// its current value; once it is freed (the variable that held it was given
// another tensor, the module that owned it destroyed), the compilation no
// longer applies and the function is compiled again.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include <cstddef>
#include <string>
#include <vector>

namespace crucible::runtime {

class LiftedInputs {
 public:
  LiftedInputs() = default;
  /// Holds each of `tensors` weakly under the name at the same index of
  /// `names` ("" reads "lifted tensor <k>" in messages). Throws
  /// WrapperError when the sizes differ or a tensor is undefined.
  LiftedInputs(const std::vector<at::Tensor>& tensors, std::vector<std::string> names);

  bool empty() const { return tensors_.empty(); }
  size_t size() const { return tensors_.size(); }
  /// The name of lifted tensor k, for messages.
  std::string name(size_t k) const;

  /// Appends every lifted tensor, in order, to `args` (the compiled graph's
  /// calling convention: the caller's arguments, then the lifted tensors).
  /// Returns false and leaves `args` as it was when one has been freed.
  bool append_to(std::vector<at::Tensor>& args) const;
  /// Why append_to fails ("lifted tensor 'd.fc.weight' was freed ..."), or
  /// "" when every lifted tensor lives.
  std::string freed() const;

 private:
  using WeakTensor = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;
  std::vector<WeakTensor> tensors_;
  std::vector<std::string> names_;
};

}  // namespace crucible::runtime
