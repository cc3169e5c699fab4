#include <crucible/ir/flop_count.h>

#include <functional>
#include <numeric>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace crucible::ir {
namespace {

using Sizes = std::vector<int64_t>;

std::optional<Sizes> sizes_of(const Node& n, size_t arg) {
  if (arg >= n.args().size() || !n.arg(arg).is_value()) return std::nullopt;
  const Value* v = n.arg(arg).value();
  if (!v->has_meta()) return std::nullopt;
  return v->meta().sizes;
}

std::optional<Sizes> result_sizes(const Node& n, size_t k) {
  if (k >= n.num_results() || !n.result(k)->has_meta()) return std::nullopt;
  return n.result(k)->meta().sizes;
}

int64_t product(const Sizes& s, size_t from = 0) {
  return std::accumulate(s.begin() + static_cast<std::ptrdiff_t>(std::min(from, s.size())), s.end(), int64_t{1},
                         std::multiplies<>());
}

// a [.., M, K] @ b [.., K, N], batched over a's leading dimensions.
int64_t matmul(const Sizes& a, const Sizes& b) {
  if (a.size() < 2 || b.size() < 2) return 0;
  return 2 * product(a) * b.back();
}

// torch/utils/flop_counter.py's conv_flop_count: the spatial sizes of the
// larger side (the output, or the input of a transposed convolution) times
// the filter, per batch element and pair of channels of the weight.
int64_t conv(const Sizes& x, const Sizes& w, const Sizes& out, bool transposed) {
  if (x.size() < 3 || w.size() < 3 || out.size() < 3) return 0;
  return 2 * product(transposed ? x : out, 2) * product(w, 2) * x[0] * w[0] * w[1];
}

Sizes swap01(Sizes s) {
  if (s.size() >= 2) std::swap(s[0], s[1]);
  return s;
}

// Attention over q [B, H, L, E], k [B, H, S, E], v [B, H, S, Ev]: Q K^T and
// P V forward; their four gradients' matmuls backward.
int64_t attention(const Sizes& q, const Sizes& k, const Sizes& v, bool backward) {
  if (q.size() != 4 || k.size() != 4 || v.size() != 4) return 0;
  const int64_t pairs = q[0] * q[1] * q[2] * k[2];
  return (backward ? 4 : 2) * pairs * (q[3] + v[3]);
}

using Formula = std::function<int64_t(const Node&)>;

Formula args_matmul(size_t a, size_t b) {
  return [a, b](const Node& n) {
    const auto x = sizes_of(n, a), y = sizes_of(n, b);
    return x && y ? matmul(*x, *y) : 0;
  };
}

Formula sdpa(size_t first, bool backward) {
  return [first, backward](const Node& n) {
    const auto q = sizes_of(n, first), k = sizes_of(n, first + 1), v = sizes_of(n, first + 2);
    return q && k && v ? attention(*q, *k, *v, backward) : 0;
  };
}

const std::unordered_map<std::string_view, Formula>& formulas() {
  static const std::unordered_map<std::string_view, Formula> table = {
      {"aten::mm", args_matmul(0, 1)},
      {"aten::addmm", args_matmul(1, 2)},
      {"aten::bmm", args_matmul(0, 1)},
      {"aten::baddbmm", args_matmul(1, 2)},
      {"aten::convolution",
       [](const Node& n) {
         const auto x = sizes_of(n, 0), w = sizes_of(n, 1), out = result_sizes(n, 0);
         const bool transposed = n.arg(6).is_constant() && n.arg(6).constant().toBool();
         return x && w && out ? conv(*x, *w, *out, transposed) : 0;
       }},
      // (grad_output, input, weight, bias_sizes, stride, padding, dilation,
      // transposed, output_padding, groups, output_mask)
      {"aten::convolution_backward",
       [](const Node& n) -> int64_t {
         const auto grad = sizes_of(n, 0), x = sizes_of(n, 1), w = sizes_of(n, 2);
         if (!grad || !x || !w || !n.arg(7).is_constant() || !n.arg(10).is_constant()) return 0;
         const bool transposed = n.arg(7).constant().toBool();
         const std::vector<bool> mask = n.arg(10).constant().toBoolList().vec();
         int64_t flops = 0;
         if (mask.at(0))
           if (const auto grad_input = result_sizes(n, 0)) flops += conv(*grad, *w, *grad_input, !transposed);
         if (mask.at(1))
           if (const auto grad_weight = result_sizes(n, 1))
             flops += transposed ? conv(swap01(*grad), swap01(*x), swap01(*grad_weight), false)
                                 : conv(swap01(*x), swap01(*grad), swap01(*grad_weight), false);
         return flops;
       }},
      {"aten::_scaled_dot_product_flash_attention", sdpa(0, false)},
      {"aten::_scaled_dot_product_efficient_attention", sdpa(0, false)},
      {"aten::_scaled_dot_product_cudnn_attention", sdpa(0, false)},
      {"aten::_scaled_dot_product_flash_attention_for_cpu", sdpa(0, false)},
      {"aten::_scaled_dot_product_flash_attention_backward", sdpa(1, true)},
      {"aten::_scaled_dot_product_efficient_attention_backward", sdpa(1, true)},
      {"aten::_scaled_dot_product_cudnn_attention_backward", sdpa(1, true)},
      {"aten::_scaled_dot_product_flash_attention_for_cpu_backward", sdpa(1, true)},
  };
  return table;
}

// The target without its overload ("aten::addmm.default" -> "aten::addmm").
std::string_view op_of(const std::string& target) {
  const std::string_view t = target;
  const size_t dot = t.find('.', t.find("::"));
  return dot == std::string_view::npos ? t : t.substr(0, dot);
}

}  // namespace

int64_t count_flops(const Node& n) {
  if (!n.is_call()) return 0;
  const auto it = formulas().find(op_of(n.target()));
  return it == formulas().end() ? 0 : it->second(n);
}

FlopCount count_flops(const Graph& graph) {
  FlopCount count;
  for (const Node* n : graph.nodes()) {
    const int64_t flops = count_flops(*n);
    if (flops == 0) continue;
    count.total += flops;
    count.by_op[std::string(op_of(n->target()))] += flops;
  }
  return count;
}

}  // namespace crucible::ir
