// Lowering of reductions (sum, mean, amax, amin, var_mean): a loop over
// kept × reduced indices whose operand inlines its producers.
#include "lowering/lowerer.h"
#include "lowering/pointwise_table.h"

#include <algorithm>
#include <cstdio>
#include <unordered_set>

namespace crucible::inductor::detail {

bool Lowerer::reduction_ok(const ir::Node* n) const {
  static const std::unordered_set<std::string> names = {"aten::sum.dim_IntList",
                                                        "aten::sum",
                                                        "aten::mean.dim",
                                                        "aten::mean",
                                                        "aten::amax",
                                                        "aten::amin",
                                                        "aten::var_mean.dim",
                                                        "aten::var_mean.correction"};
  if (!names.contains(n->target()) || !n->arg(0).is_value() || !loop_tensor(n->arg(0).value())) return false;
  c10::ScalarType in = n->arg(0).value()->meta().dtype;
  if (!is_float(in)) return false;
  for (const auto& r : n->results())
    if (r->meta().dtype != in) return false;
  for (size_t i = 1; i < n->args().size(); ++i)
    if (!n->arg(i).is_constant()) return false;
  // sum/mean's dtype= argument: only None or the input's own dtype.
  const std::string& t = n->target();
  size_t dtype_arg = t == "aten::sum" || t == "aten::mean"                   ? 1
                     : t == "aten::sum.dim_IntList" || t == "aten::mean.dim" ? 3
                                                                             : 0;
  if (dtype_arg && dtype_arg < n->args().size() && !n->arg(dtype_arg).constant().isNone()) return false;
  return true;
}

std::vector<int64_t> Lowerer::reduced_dims(const ir::Node* n, size_t rank) const {
  const std::string& t = n->target();
  std::vector<int64_t> dims;
  bool all = true;
  if (t != "aten::sum" && t != "aten::mean") {
    const c10::IValue& d = n->arg(1).constant();
    if (d.isIntList() && !d.toIntVector().empty()) {
      all = false;
      for (int64_t x : d.toIntVector()) dims.push_back(wrap_dim(x, rank));
    } else if (d.isInt()) {
      all = false;
      dims.push_back(wrap_dim(d.toInt(), rank));
    }
  }
  if (all)
    for (size_t i = 0; i < rank; ++i) dims.push_back(static_cast<int64_t>(i));
  std::sort(dims.begin(), dims.end());
  dims.erase(std::unique(dims.begin(), dims.end()), dims.end());
  return dims;
}

// The loop of m when `sum` reduces exp(x - m) with m = amax(x) over the
// same dims, kept (a softmax's decomposition): Loop::online_max; else -1.
int Lowerer::softmax_max_loop(const ir::Node* sum) const {
  auto node_of = [](const ir::Argument& a, const char* target) -> const ir::Node* {
    if (!a.is_value() || !a.value()->node()->is_call() || a.value()->node()->target() != target) return nullptr;
    return a.value()->node();
  };
  const ir::Node* e = node_of(sum->arg(0), "aten::exp");
  const ir::Node* d = e ? node_of(e->arg(0), "aten::sub.Tensor") : nullptr;
  const ir::Node* m = d ? node_of(d->arg(1), "aten::amax") : nullptr;
  auto is_one = [](const ir::Argument& a) {
    return a.is_constant() && ((a.constant().isInt() && a.constant().toInt() == 1) ||
                               (a.constant().isDouble() && a.constant().toDouble() == 1.0));
  };
  if (!m || m->args().size() < 3 || d->args().size() < 3 || !d->arg(0).is_value() || !m->arg(0).is_value() ||
      d->arg(0).value() != m->arg(0).value() || !is_one(d->arg(2)) || !m->arg(2).is_constant() ||
      !m->arg(2).constant().isBool() || !m->arg(2).constant().toBool())
    return -1;
  const size_t rank = sum->arg(0).value()->meta().sizes.size();
  if (m->arg(0).value()->meta().sizes.size() != rank || reduced_dims(sum, rank) != reduced_dims(m, rank)) return -1;
  auto b = p_.buffer_of.find(m->result());
  if (b == p_.buffer_of.end()) return -1;
  const int loop = p_.buffers[b->second].loop;
  return loop >= 0 && p_.loops[loop].reduction && p_.loops[loop].rtype == ReductionType::Max ? loop : -1;
}

void Lowerer::lower_reduction(const ir::Node* n) {
  const std::string& t = n->target();
  const ir::Value* xv = n->arg(0).value();
  Lazy x = lazy_.at(xv);
  const std::vector<int64_t>& xs = x.sizes;
  std::vector<int64_t> dims = reduced_dims(n, xs.size());
  std::vector<bool> reduced(xs.size(), false);
  std::vector<int64_t> rsizes;
  std::vector<SizeExpr> rsize_exprs;  // spelled as the operand's sizes are (Note [Dynamic sizes])
  const std::vector<SizeExpr> xs_spelled = spelled_sizes(xv, xs);
  for (int64_t d : dims)
    if (d < static_cast<int64_t>(xs.size())) {
      reduced[d] = true;
      rsizes.push_back(xs[d]);
      rsize_exprs.push_back(xs_spelled[d]);
    }
  bool keepdim = false;
  if (t == "aten::sum.dim_IntList" || t == "aten::mean.dim" || t == "aten::amax" || t == "aten::amin")
    keepdim = n->arg(2).constant().toBool();
  else if (t == "aten::var_mean.dim")
    keepdim = n->arg(3).constant().toBool();
  else if (t == "aten::var_mean.correction")
    keepdim = n->arg(3).constant().toBool();
  // The operand at (kept index, reduced index): kept index in the
  // result's sizes, with keepdim's size-1 dims skipped.
  auto operand = [x, reduced, keepdim](Body& b, const std::vector<Expr>& index, const std::vector<Expr>& rindex) {
    std::vector<Expr> in(reduced.size());
    size_t k = 0, j = 0;
    for (size_t d = 0; d < reduced.size(); ++d) {
      if (reduced[d]) {
        in[d] = rindex[j++];
        if (keepdim) ++k;
      } else {
        in[d] = index[k++];
      }
    }
    return x.fn(b, in);
  };
  SizeExpr count = 1;
  for (const SizeExpr& s : rsize_exprs) count = count * s;
  std::string T = ctype_of(x.dtype);
  bool column = false;
  {
    const ir::TensorMeta& m = xv->meta();
    int64_t fastest = -1;
    for (size_t d = 0; d < m.sizes.size(); ++d)
      if (m.sizes[d] > 1 && (fastest < 0 || m.strides[d] < m.strides[fastest])) fastest = static_cast<int64_t>(d);
    bool reduces = false;
    for (size_t d = 0; d < xs.size(); ++d) reduces = reduces || (reduced[d] && xs[d] > 1);
    column = fastest >= 0 && !reduced[fastest] && reduces;
  }
  auto add_loop = [&](const ir::Value* v, ReductionType type, ReduceFn fn, std::string finalize) {
    int id = add_buffer(v, Buffer::Computed);
    Loop loop;
    loop.buffer = id;
    loop.sizes = v->meta().sizes;
    loop.reduction = true;
    loop.rsizes = rsizes;
    loop.rsize_exprs = rsize_exprs;
    loop.rtype = type;
    loop.rfn = std::move(fn);
    loop.finalize = std::move(finalize);
    loop.column = column;
    loop.nodes = x.nodes;
    loop.nodes.push_back(n);
    p_.buffers[id].loop = static_cast<int>(p_.loops.size());
    p_.items.push_back({nullptr, static_cast<int>(p_.loops.size())});
    p_.loops.push_back(std::move(loop));
  };
  std::string mean = "$ / " + T + "(" + count.str() + ")";
  if (t == "aten::sum.dim_IntList" || t == "aten::sum") {
    add_loop(n->result(), ReductionType::Sum, operand, "");
    p_.loops.back().online_max = softmax_max_loop(n);
  } else if (t == "aten::mean.dim" || t == "aten::mean") {
    add_loop(n->result(), ReductionType::Sum, operand, mean);
  } else if (t == "aten::amax" || t == "aten::amin") {
    add_loop(n->result(), t == "aten::amax" ? ReductionType::Max : ReductionType::Min, operand, "");
  } else {
    // var_mean: the mean, then Σ(x - mean)² over count - correction
    // (ATen's Welford gives the same values up to rounding).
    double correction = 1;
    if (t == "aten::var_mean.dim") {
      correction = n->arg(2).constant().toBool() ? 1 : 0;
    } else {
      const c10::IValue& c = n->arg(2).constant();
      correction = c.isNone() ? 1 : c.isDouble() ? c.toDouble() : c.isInt() ? c.toInt() : c.toScalar().toDouble();
    }
    const ir::Value* var = n->result(0);
    const ir::Value* mv = n->result(1);
    add_loop(mv, ReductionType::Sum, operand, mean);
    int mean_buffer = p_.buffer_of.at(mv);
    auto squared = [operand, mean_buffer, T](Body& b, const std::vector<Expr>& index, const std::vector<Expr>& rindex) {
      Val xv2 = operand(b, index, rindex);
      Val m = b.load(mean_buffer, index);
      Val d = b.compute("(" + xv2.name + " - " + m.name + ")", std::max(xv2.level, m.level), T);
      return b.compute("(" + d.name + " * " + d.name + ")", d.level, T);
    };
    char corr[64];
    std::snprintf(corr, sizeof corr, "%.17g", correction);
    std::string div;
    if (count.is_constant()) {
      char literal[64];
      std::snprintf(literal, sizeof literal, "%.17g", std::max(0.0, static_cast<double>(count.value()) - correction));
      div = literal;
    } else {  // a count over size symbols: clamped where the kernel runs
      const std::string c = "double(" + count.str() + ")";
      div = "(" + c + " > " + corr + " ? " + c + " - " + corr + " : 0.0)";
    }
    add_loop(var, ReductionType::Sum, squared, "$ / " + T + "(" + div + ")");
  }
}

}  // namespace crucible::inductor::detail
