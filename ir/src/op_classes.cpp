#include <crucible/ir/op_classes.h>

#include <unordered_set>
#include <vector>

namespace crucible::ir {

// Note [Op classes]
// Each class is listed once, here, and read by every pass that asks
// (inductor's lowering and CUDA graphs, the min-cut partitioner, the
// tracer), as PyTorch reads torch.Tag and the partitioner's op lists. Where
// two passes need different sets, the sets are two classes, each named for
// what its members share: IndexView (views inductor has an index map for)
// is narrower than what the min-cut partitioner counts as a view (any op
// whose schema returns an alias, read from the schema); RowMajorView is the
// part of IndexView that keeps element order. Each class matches ops the
// way its passes named them before the table: by overload where an overload
// differs in kind (view.dtype is a view of another dtype, squeeze.dimname a
// named-tensor one), by operator where every overload is alike (every mm
// is compute-intensive, every fill_ overwrites its argument).

namespace {

struct Entry {
  OpClass op_class;
  bool every_overload;  // names are operators; else overloads
  std::unordered_set<std::string_view> names;
};

const std::vector<Entry>& table() {
  static const std::vector<Entry> t = {
      {OpClass::IndexView,
       false,
       {"aten::view", "aten::_unsafe_view", "aten::reshape", "aten::expand", "aten::permute", "aten::transpose.int",
        "aten::t", "aten::unsqueeze", "aten::squeeze.dim", "aten::squeeze.dims", "aten::squeeze", "aten::slice.Tensor",
        "aten::select.int", "aten::split.Tensor", "aten::split_with_sizes", "aten::unbind.int", "aten::alias",
        "aten::detach", "aten::lift_fresh"}},
      {OpClass::RowMajorView, false, {"aten::view", "aten::_unsafe_view", "aten::reshape", "aten::unsqueeze"}},
      {OpClass::ComputeIntensive,
       true,
       {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::convolution",
        "aten::convolution_backward", "aten::_convolution", "aten::cudnn_convolution",
        "aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_efficient_attention",
        "aten::_scaled_dot_product_cudnn_attention", "aten::_scaled_dot_product_attention_math"}},
      {OpClass::CheapToRecompute,
       true,
       {"aten::sum",           "aten::mean",           "aten::amax",       "aten::amin",       "aten::cat",
        "aten::expand",        "aten::clone",          "aten::_to_copy",   "aten::where",      "aten::full",
        "aten::full_like",     "aten::zeros",          "aten::zeros_like", "aten::ones",       "aten::ones_like",
        "aten::scalar_tensor", "aten::arange",         "aten::empty",      "aten::empty_like", "aten::lift_fresh_copy",
        "aten::alias",         "crucible::philox_rand"}},
      {OpClass::HostSync,
       false,
       {"aten::_local_scalar_dense", "aten::item", "aten::nonzero", "aten::masked_select", "aten::unique",
        "aten::_unique", "aten::_unique2", "aten::unique_consecutive", "aten::unique_dim", "aten::equal",
        "crucible::assert_equal", "aten::is_nonzero"}},
      {OpClass::OverwritesSelf,
       true,
       {"aten::fill_", "aten::zero_", "aten::copy_", "aten::normal_", "aten::uniform_", "aten::random_",
        "aten::bernoulli_", "aten::exponential_", "aten::geometric_", "aten::log_normal_", "aten::cauchy_"}},
  };
  return t;
}

// "ns::name" of "ns::name.overload".
std::string_view operator_of(std::string_view target) {
  const size_t ns = target.find("::");
  return target.substr(0, target.find('.', ns == std::string_view::npos ? 0 : ns));
}

}  // namespace

bool is_op_class(std::string_view target, OpClass c) {
  for (const Entry& e : table())
    if (e.op_class == c) return e.names.contains(e.every_overload ? operator_of(target) : target);
  return false;
}

}  // namespace crucible::ir
