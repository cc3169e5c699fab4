#include "dynamic_sizes.h"

#include <crucible/ir/hash.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace crucible::inductor::detail {

// Note [Dynamic sizes]
// A training loop over text or images meets many sizes: sequences padded
// to their batch's longest, a smaller last batch. Each is a new graph
// (the autograd cache keys on sizes), and each used to cost a C++ compile
// of all its kernels, which is nearly all of a compile on the CPU (1.1 s of
// 1.14 s for a small GPT's training step). torch.compile answers with
// symbolic tracing: a size that changed is traced again as a symbol, once.
// A C++ program cannot be traced that way: it reads sizes as int64_t
// (x.size(1)), computes with them where no tracer sees, and may branch on
// them, and ATen's C++ meta kernels need concrete sizes. So every size is
// still traced, partitioned and lowered concretely, which sees every branch
// the program takes; what becomes symbolic is the kernels' text:
//  - A graph is recognized among the graphs seen before by its structure,
//    ir::graph_hash without sizes. The placeholder dimensions whose sizes
//    differ between graphs of one structure are dynamic from then on
//    (torch's automatic_dynamic_shapes); each distinct size among them at
//    the graph being compiled is a symbol s0, s1, ... (equal sizes share
//    one, as torch's duck sizing does), except 0 and 1, which stay
//    literals (torch specializes them too).
//  - Each size, stride and element count of every tensor of the graph is
//    fitted as c·s0^a·s1^b·... (each exponent at most 2, the lowest
//    degree that fits) to its values in this graph and in the earlier
//    graphs of the structure (up to kKept of them), at the symbols' values
//    in each: a sequence's [B, T, 64] activations give 64·s0 (a stride)
//    and 64·s1·s0 (their count). The SizeTable (loop_ir/size_expr.h)
//    keeps each tensor's fitted sizes and strides (its layout): its
//    buffer's and its views' index arithmetic, the extents of the loop
//    that writes it and of the reductions over it read them there, so a
//    length of 64 and a width of 64 keep their own spellings. It also maps
//    each size's and count's value to its fit, for the integers no tensor
//    names (a split loop's factor); a value two fits claim, and a value
//    nothing fits, is a literal there.
//  - Generated C++ kernels take the symbols' values as an argument, which
//    the run-time plan passes (Plan::size_symbols), so the text of a
//    graph at one sequence length is the text at the next, and the kernel
//    cache, keyed by the text, hands back the library built for the first.
// No fit needs to be right for the result to be: each graph's text is
// rendered from its own lowering, with sizes that evaluate to its own
// values (Note [Size symbols]), and is run only with those values. A wrong
// or missing fit only makes the text differ, which costs a compile. CUDA
// kernels keep literal sizes for now (their launches would need the
// symbols too).
namespace {

// The graphs of one structure kept for fitting: the first and the
// latest ones, up to this many.
constexpr size_t kKept = 8;

// What a graph's tensors measure: per Value in graph order (every node's
// results), its sizes and strides (none for a Value without a tensor),
// and each placeholder's sizes.
struct Measures {
  std::vector<std::vector<int64_t>> sizes, strides;
  std::vector<std::vector<int64_t>> inputs;
};

// Every node's results, in graph order: the Values Measures index.
std::vector<const ir::Value*> values_of(const ir::Graph& g) {
  std::vector<const ir::Value*> out;
  for (const ir::Node* n : g.nodes())
    for (size_t r = 0; r < n->num_results(); ++r) out.push_back(n->result(r));
  return out;
}

Measures measure(const ir::Graph& g, const std::vector<const ir::Value*>& values) {
  Measures m;
  for (const ir::Value* v : values) {
    m.sizes.push_back(v->has_meta() ? v->meta().sizes : std::vector<int64_t>{});
    m.strides.push_back(v->has_meta() ? v->meta().strides : std::vector<int64_t>{});
  }
  for (const ir::Value* p : g.placeholders())
    m.inputs.push_back(p->has_meta() ? p->meta().sizes : std::vector<int64_t>{});
  return m;
}

// The same tensors of the same ranks: what graphs of one structure have.
bool same_ranks(const Measures& a, const Measures& b) {
  auto ranks = [](const std::vector<std::vector<int64_t>>& x, const std::vector<std::vector<int64_t>>& y) {
    return x.size() == y.size() &&
           std::equal(x.begin(), x.end(), y.begin(), [](const auto& p, const auto& q) { return p.size() == q.size(); });
  };
  return ranks(a.sizes, b.sizes) && ranks(a.strides, b.strides) && ranks(a.inputs, b.inputs);
}

struct Structure {
  std::vector<Measures> graphs;                 // the first, then the latest
  std::set<std::pair<size_t, size_t>> dynamic;  // (placeholder, dimension)
};

// Exponent vectors over `n` symbols, each exponent at most 2 and their sum
// at most 3, lowest sum first.
std::vector<std::vector<int>> exponents(size_t n) {
  std::vector<std::vector<int>> out;
  std::vector<int> e(n, 0);
  for (int degree = 0; degree <= 3; ++degree) {
    auto place = [&](auto&& self, size_t k, int left) -> void {
      if (k == n) {
        if (left == 0) out.push_back(e);
        return;
      }
      for (int x = 0; x <= std::min(left, 2); ++x) {
        e[k] = x;
        self(self, k + 1, left - x);
      }
      e[k] = 0;
    };
    place(place, 0, degree);
  }
  return out;
}

// Fits values to monomials over the symbols (Note [Dynamic sizes]).
class Fitter {
 public:
  // values[g][k]: symbol k's value in graph g, the graph being compiled last.
  explicit Fitter(std::vector<std::vector<int64_t>> values)
      : values_(std::move(values)), exponents_(exponents(values_.back().size())) {}

  // The lowest-degree monomial taking xs[g] in each graph g (the graph
  // being compiled last); nullopt when none does.
  std::optional<SizeExpr> fit(const std::vector<int64_t>& xs) {
    auto [it, fresh] = memo_.emplace(xs, std::nullopt);
    if (!fresh) return it->second;
    for (const std::vector<int>& e : exponents_) {
      // The coefficient, from the graph being compiled.
      const int64_t p = power(values_.back(), e);
      if (p == 0 || xs.back() % p != 0) continue;
      const int64_t c = xs.back() / p;
      bool fits = true;
      for (size_t g = 0; g + 1 < xs.size() && fits; ++g) fits = c * power(values_[g], e) == xs[g];
      if (!fits) continue;
      SizeExpr s = c;
      for (size_t k = 0; k < e.size(); ++k)
        for (int x = 0; x < e[k]; ++x) s = s * SizeExpr::symbol(static_cast<int>(k), values_.back()[k]);
      it->second = s;
      break;
    }
    return it->second;
  }

 private:
  static int64_t power(const std::vector<int64_t>& values, const std::vector<int>& e) {
    int64_t p = 1;
    for (size_t k = 0; k < e.size(); ++k)
      for (int x = 0; x < e[k]; ++x) p *= values[k];
    return p;
  }

  std::vector<std::vector<int64_t>> values_;
  std::vector<std::vector<int>> exponents_;
  std::map<std::vector<int64_t>, std::optional<SizeExpr>> memo_;
};

}  // namespace

SizeTable dynamic_sizes(const ir::Graph& graph) {
  static std::mutex mu;
  static std::map<std::string, Structure> seen;
  std::string key;
  try {
    key = ir::graph_hash(graph, ir::HashOptions{.sizes = false}).hex();
  } catch (const std::exception&) {
    return {};
  }
  const std::vector<const ir::Value*> at = values_of(graph);
  Measures now = measure(graph, at);
  std::lock_guard<std::mutex> lock(mu);
  Structure& s = seen[key];
  if (!s.graphs.empty() && !same_ranks(s.graphs.front(), now)) return {};  // a hash collision of structures
  for (const Measures& g : s.graphs)
    for (size_t i = 0; i < now.inputs.size(); ++i)
      for (size_t d = 0; d < now.inputs[i].size(); ++d)
        if (g.inputs[i][d] != now.inputs[i][d]) s.dynamic.insert({i, d});
  // The symbols: the distinct sizes of the dynamic dimensions here, each
  // with the dimension that stands for it in the other graphs.
  std::vector<std::pair<size_t, size_t>> symbol_dims;
  std::map<int64_t, size_t> symbol_of;
  for (const auto& [i, d] : s.dynamic) {
    const int64_t v = now.inputs[i][d];
    if (v > 1 && symbol_of.emplace(v, symbol_dims.size()).second) symbol_dims.push_back({i, d});
  }
  // Remembered once the table is made: the first graph, then the latest.
  auto remember = [&] {
    if (s.graphs.size() == kKept) s.graphs.erase(s.graphs.begin() + 1);
    s.graphs.push_back(std::move(now));
  };
  SizeTable table;
  if (symbol_dims.empty()) {
    remember();
    return table;
  }
  // The graphs fitted to: those remembered, then this one.
  std::vector<const Measures*> graphs;
  for (const Measures& g : s.graphs) graphs.push_back(&g);
  graphs.push_back(&now);
  std::vector<std::vector<int64_t>> values;
  for (const Measures* g : graphs) {
    values.emplace_back();
    for (const auto& [i, d] : symbol_dims) values.back().push_back(g->inputs[i][d]);
  }
  for (size_t k = 0; k < symbol_dims.size(); ++k) {
    table.symbol_values.push_back(values.back()[k]);
    table.add(SizeExpr::symbol(static_cast<int>(k), values.back()[k]));
  }
  Fitter fitter(std::move(values));
  std::vector<int64_t> xs(graphs.size());
  // The fit of what `value_in` reads of each graph, else the literal.
  auto fit = [&](auto&& value_in) {
    for (size_t g = 0; g < graphs.size(); ++g) xs[g] = value_in(*graphs[g]);
    const std::optional<SizeExpr> f = fitter.fit(xs);
    return f ? *f : SizeExpr(xs.back());
  };
  for (size_t v = 0; v < now.sizes.size(); ++v) {
    const size_t rank = now.sizes[v].size();
    SpelledLayout layout;
    for (size_t d = 0; d < rank; ++d) {
      layout.sizes.push_back(fit([&](const Measures& g) { return g.sizes[v][d]; }));
      layout.strides.push_back(fit([&](const Measures& g) { return g.strides[v][d]; }));
      table.add(layout.sizes.back());
    }
    // The extent a loop over the whole tensor counts.
    table.add(fit([&](const Measures& g) {
      int64_t n = 1;
      for (int64_t x : g.sizes[v]) n *= x;
      return n;
    }));
    if (rank > 0) table.add_layout(at[v], v, std::move(layout));
  }
  remember();
  return table;
}

}  // namespace crucible::inductor::detail
