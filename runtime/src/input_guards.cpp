#include <crucible/runtime/input_guards.h>

#include <ATen/autocast_mode.h>

#include <algorithm>
#include <sstream>

namespace crucible::runtime {

namespace {

const void* storage_key(const at::Tensor& t) {
  return t.defined() && t.has_storage() ? static_cast<const void*>(t.storage().unsafeGetStorageImpl()) : nullptr;
}

// Per argument: the first argument sharing its storage and the first that
// is the same tensor (itself when none), and whether any other shares it.
struct Aliasing {
  c10::SmallVector<int32_t, 32> storage_of, same_as;
  c10::SmallVector<bool, 32> aliased;
};

void compute_aliasing(const std::vector<at::Tensor>& args, Aliasing& a) {
  const size_t n = args.size();
  a.storage_of.assign(n, -1);
  a.same_as.assign(n, -1);
  a.aliased.assign(n, false);
  c10::SmallVector<std::pair<const void*, int32_t>, 32> keys;
  for (size_t i = 0; i < n; ++i)
    if (const void* k = storage_key(args[i])) keys.emplace_back(k, static_cast<int32_t>(i));
  std::sort(keys.begin(), keys.end());
  for (size_t b = 0; b < keys.size();) {
    size_t e = b + 1;
    while (e < keys.size() && keys[e].first == keys[b].first) ++e;
    if (e - b > 1) {
      for (size_t x = b; x < e; ++x) {
        const int32_t i = keys[x].second;
        a.aliased[i] = true;
        if (x > b) a.storage_of[i] = keys[b].second;
        for (size_t y = b; y < x && a.same_as[i] < 0; ++y)
          if (args[keys[y].second].is_same(args[i])) a.same_as[i] = keys[y].second;
      }
    }
    b = e;
  }
}

template <typename T>
std::string list(c10::ArrayRef<T> v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

}  // namespace

InputGuards::Autocast InputGuards::Autocast::current() {
  Autocast a;
  a.cpu = at::autocast::is_autocast_enabled(at::kCPU);
  a.cuda = at::autocast::is_autocast_enabled(at::kCUDA);
  if (a.cpu) a.cpu_dtype = at::autocast::get_autocast_dtype(at::kCPU);
  if (a.cuda) a.cuda_dtype = at::autocast::get_autocast_dtype(at::kCUDA);
  return a;
}

InputGuards::InputGuards(const std::vector<at::Tensor>& args, bool grad_enabled, std::vector<bool> extra)
    : grad_enabled_(grad_enabled), autocast_(Autocast::current()), extra_(std::move(extra)) {
  Aliasing a;
  compute_aliasing(args, a);
  entries_.resize(args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    Entry& e = entries_[i];
    const at::Tensor& t = args[i];
    e.defined = t.defined();
    if (!e.defined) continue;
    e.sizes.assign(t.sizes().begin(), t.sizes().end());
    e.strides.assign(t.strides().begin(), t.strides().end());
    e.dtype = t.scalar_type();
    e.device = t.device();
    e.requires_grad = t.requires_grad();
    e.same_as = a.same_as[i];
    e.storage_of = a.storage_of[i];
    e.aliased = a.aliased[i];
    if (e.aliased) {
      e.storage_offset = t.storage_offset();
      e.storage_nbytes = static_cast<int64_t>(t.storage().nbytes());
    }
  }
}

bool InputGuards::check(const std::vector<at::Tensor>& args, bool grad_enabled, const std::vector<bool>& extra) const {
  if (grad_enabled != grad_enabled_ || args.size() != entries_.size() || extra != extra_) return false;
  if (!(Autocast::current() == autocast_)) return false;
  for (size_t i = 0; i < args.size(); ++i) {
    const Entry& e = entries_[i];
    const at::Tensor& t = args[i];
    if (t.defined() != e.defined) return false;
    if (!e.defined) continue;
    if (t.scalar_type() != e.dtype || t.device() != e.device || t.requires_grad() != e.requires_grad ||
        t.sizes() != c10::IntArrayRef(e.sizes) || t.strides() != c10::IntArrayRef(e.strides))
      return false;
  }
  // The aliasing between arguments (one sort of their storages).
  Aliasing a;
  compute_aliasing(args, a);
  for (size_t i = 0; i < args.size(); ++i) {
    const Entry& e = entries_[i];
    if (a.aliased[i] != e.aliased) return false;
    if (!e.aliased) continue;
    const at::Tensor& t = args[i];
    if (a.storage_of[i] != e.storage_of || a.same_as[i] != e.same_as || t.storage_offset() != e.storage_offset ||
        static_cast<int64_t>(t.storage().nbytes()) != e.storage_nbytes)
      return false;
  }
  return true;
}

InputGuards::Mismatch InputGuards::first_difference(const std::vector<at::Tensor>& args, bool grad_enabled,
                                                    const std::vector<bool>& extra) const {
  if (grad_enabled != grad_enabled_)
    return {0, std::string("grad mode ") + (grad_enabled ? "on" : "off") + " (compiled with it " +
                   (grad_enabled_ ? "on" : "off") + ")"};
  if (args.size() != entries_.size())
    return {0, std::to_string(args.size()) + " inputs (compiled for " + std::to_string(entries_.size()) + ")"};
  if (extra != extra_) return {0, "module training flags changed (train()/eval())"};
  if (const Autocast now = Autocast::current(); !(now == autocast_)) {
    auto describe = [](bool on, c10::ScalarType dtype) {
      return on ? std::string("on (") + c10::toString(dtype) + ")" : std::string("off");
    };
    return {0, "autocast cpu " + describe(now.cpu, now.cpu_dtype) + ", cuda " + describe(now.cuda, now.cuda_dtype) +
                   " (compiled with cpu " + describe(autocast_.cpu, autocast_.cpu_dtype) + ", cuda " +
                   describe(autocast_.cuda, autocast_.cuda_dtype) + ")"};
  }
  for (size_t i = 0; i < args.size(); ++i) {
    const Entry& e = entries_[i];
    const at::Tensor& t = args[i];
    const std::string in = "input " + std::to_string(i) + ": ";
    if (t.defined() != e.defined)
      return {i, in + (t.defined() ? "defined" : "undefined") + " (compiled for the opposite)"};
    if (!e.defined) continue;
    if (t.sizes() != c10::IntArrayRef(e.sizes))
      return {i, in + "sizes " + list(t.sizes()) + " (compiled for " + list(c10::IntArrayRef(e.sizes)) + ")"};
    if (t.strides() != c10::IntArrayRef(e.strides))
      return {i, in + "strides " + list(t.strides()) + " (compiled for " + list(c10::IntArrayRef(e.strides)) + ")"};
    if (t.scalar_type() != e.dtype)
      return {i, in + "dtype " + c10::toString(t.scalar_type()) + " (compiled for " + c10::toString(e.dtype) + ")"};
    if (t.device() != e.device)
      return {i, in + "device " + t.device().str() + " (compiled for " + e.device.str() + ")"};
    if (t.requires_grad() != e.requires_grad)
      return {i, in + "requires_grad " + (t.requires_grad() ? "true" : "false") + " (compiled for " +
                     (e.requires_grad ? "true" : "false") + ")"};
  }
  Aliasing a;
  compute_aliasing(args, a);
  for (size_t i = 0; i < args.size(); ++i) {
    const Entry& e = entries_[i];
    const at::Tensor& t = args[i];
    const std::string in = "input " + std::to_string(i) + ": ";
    if (a.aliased[i] != e.aliased || a.storage_of[i] != e.storage_of || a.same_as[i] != e.same_as)
      return {args.size(), in + "shares storage with other inputs differently than when compiled"};
    if (e.aliased &&
        (t.storage_offset() != e.storage_offset || static_cast<int64_t>(t.storage().nbytes()) != e.storage_nbytes))
      return {args.size(), in + "storage offset or storage size changed (it shares storage with another input)"};
  }
  return {args.size(), ""};
}

}  // namespace crucible::runtime
