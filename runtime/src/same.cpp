#include <crucible/runtime/error.h>
#include <crucible/runtime/same.h>

#include <ATen/ATen.h>

#include <cmath>
#include <sstream>

namespace crucible::runtime {

namespace {

double rmse(const at::Tensor& a, const at::Tensor& b) {
  return at::sqrt(at::mean(at::square(a.to(at::kDouble) - b.to(at::kDouble)))).item<double>();
}

SameResult fail(std::string reason) { return SameResult{false, std::move(reason)}; }

}  // namespace

SameResult same(const at::Tensor& ref, const at::Tensor& res, const SameOptions& options, const at::Tensor& fp64_ref) {
  if (!ref.defined() || !res.defined()) {
    if (ref.defined() == res.defined()) return {};
    return fail(ref.defined() ? "result is undefined but the reference is not"
                              : "reference is undefined but the result is not");
  }
  std::ostringstream os;
  if (ref.sizes() != res.sizes()) {
    os << "sizes differ: reference " << ref.sizes() << ", result " << res.sizes();
    return fail(os.str());
  }
  if (options.exact_dtype && ref.scalar_type() != res.scalar_type()) {
    os << "dtypes differ: reference " << ref.scalar_type() << ", result " << res.scalar_type();
    return fail(os.str());
  }
  const at::Tensor a = ref.detach().cpu(), b = res.detach().cpu();
  const double tol = options.tol;
  if (a.scalar_type() == at::kBool || b.scalar_type() == at::kBool) {
    if (at::equal(a, b.to(a.scalar_type()))) return {};
    return fail("bool tensors differ");
  }
  if (options.cos_similarity) {
    const auto x = a.flatten().to(at::kFloat), y = b.flatten().to(at::kFloat);
    if (at::allclose(x, y, tol, tol, /*equal_nan=*/true)) return {};
    const double sim = at::cosine_similarity(x, y, 0, 1e-6).item<double>();
    if (sim >= 0.99) return {};
    os << "cosine similarity " << sim << " < 0.99";
    return fail(os.str());
  }
  const at::Tensor ac = options.exact_dtype ? a : a.to(b.scalar_type());
  if (at::allclose(ac, b, tol, tol, options.equal_nan)) return {};
  // See Note [same() with an fp64 reference].
  if (fp64_ref.defined() && fp64_ref.scalar_type() == at::kDouble) {
    const at::Tensor f = fp64_ref.detach().cpu();
    const double ref_error = rmse(f, ac);
    const double res_error = rmse(f, b);
    const bool noisy = f.numel() < 1000 || (ac.dim() == 4 && ac.size(-1) == 1 && ac.size(-2) == 1) || tol >= 2e-2;
    const double multiplier = noisy ? 3.0 : 2.0;
    if (res_error <= multiplier * ref_error + tol / 10.0) return {};
    os << "rmse against fp64: result " << res_error << ", reference " << ref_error << " (allowed " << multiplier
       << " x reference + " << tol / 10.0 << ")";
    if (std::isnan(ref_error)) os << "; the reference has NaNs: run it in higher precision";
    os << ", sizes " << b.sizes();
    return fail(os.str());
  }
  const auto diff = (ac.to(at::kDouble) - b.to(at::kDouble)).abs();
  os << "not allclose within tol=" << tol << ": max |diff| " << diff.nan_to_num(0).max().item<double>();
  if (!options.equal_nan && (ac.isnan().any().item<bool>() || b.isnan().any().item<bool>()))
    os << " (NaNs present; equal_nan is off)";
  return fail(os.str());
}

SameResult same(const std::vector<at::Tensor>& ref, const std::vector<at::Tensor>& res, const SameOptions& options,
                const std::vector<at::Tensor>& fp64_ref) {
  if (!fp64_ref.empty() && fp64_ref.size() != ref.size())
    throw WrapperError("same: fp64_ref has " + std::to_string(fp64_ref.size()) + " tensors but ref has " +
                       std::to_string(ref.size()) + "; pass one per element or none");
  if (ref.size() != res.size())
    return fail("length mismatch: reference has " + std::to_string(ref.size()) + " tensors, result " +
                std::to_string(res.size()));
  for (size_t i = 0; i < ref.size(); ++i) {
    SameResult r = same(ref[i], res[i], options, fp64_ref.empty() ? at::Tensor() : fp64_ref[i]);
    if (!r) return fail("element " + std::to_string(i) + ": " + r.reason);
  }
  return {};
}

}  // namespace crucible::runtime
