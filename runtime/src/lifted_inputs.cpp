#include <crucible/runtime/error.h>
#include <crucible/runtime/lifted_inputs.h>

namespace crucible::runtime {

LiftedInputs::LiftedInputs(const std::vector<at::Tensor>& tensors, std::vector<std::string> names)
    : names_(std::move(names)) {
  if (names_.size() != tensors.size())
    throw WrapperError("LiftedInputs: " + std::to_string(tensors.size()) + " tensors but " +
                       std::to_string(names_.size()) + " names");
  tensors_.reserve(tensors.size());
  for (size_t k = 0; k < tensors.size(); ++k) {
    if (!tensors[k].defined()) throw WrapperError("LiftedInputs: " + name(k) + " is an undefined tensor");
    tensors_.emplace_back(tensors[k].getIntrusivePtr());
  }
}

std::string LiftedInputs::name(size_t k) const {
  return names_.at(k).empty() ? "lifted tensor " + std::to_string(k) : "lifted tensor '" + names_[k] + "'";
}

bool LiftedInputs::append_to(std::vector<at::Tensor>& args) const {
  const size_t n = args.size();
  args.reserve(n + tensors_.size());
  for (const WeakTensor& w : tensors_) {
    auto strong = w.lock();
    if (!strong) {
      args.resize(n);
      return false;
    }
    args.emplace_back(std::move(strong));
  }
  return true;
}

std::string LiftedInputs::freed() const {
  for (size_t k = 0; k < tensors_.size(); ++k)
    if (tensors_[k].expired())
      return name(k) + " was freed (the function now reads another tensor, or its owner is gone)";
  return "";
}

}  // namespace crucible::runtime
