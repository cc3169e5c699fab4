// See Note [Min-cut partition].
#include <crucible/partitioner/error.h>
#include <crucible/partitioner/min_cut_partition.h>

#include <crucible/ir/aliasing.h>
#include <crucible/ir/effects.h>
#include <crucible/ir/op_classes.h>

#include "split.h"

#include <ATen/core/enum_tag.h>
// GCC 12 and 13 report a boost::optional inside Boost.Graph's edge iterator
// as maybe uninitialized once the max-flow is inlined: a false positive in
// the library's code, silenced for its headers only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <boost/graph/adjacency_list.hpp>
#include <boost/graph/boykov_kolmogorov_max_flow.hpp>
#pragma GCC diagnostic pop

#include <algorithm>
#include <cmath>
#include <exception>
#include <functional>
#include <limits>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace crucible::partitioner {

namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();

bool is_view(const ir::Node& n) {
  if (!n.is_call()) return false;
  const auto& returns = n.schema().returns();
  return !returns.empty() && returns[0].alias_info() && !returns[0].alias_info()->isWrite();
}

bool cheap(const ir::Node& n) {
  if (n.op().hasTag(at::Tag::pointwise) || is_view(n)) return true;
  return ir::is_op_class(n.target(), ir::OpClass::CheapToRecompute);
}

// Whether the backward may recompute `n`; see Note [Min-cut partition].
bool recomputable(const ir::Node& n, const MinCutOptions& options) {
  if (!n.is_call()) return true;  // constants
  if (ir::has_side_effects(n)) return false;
  if (options.ban_compute_intensive && ir::is_op_class(n.target(), ir::OpClass::ComputeIntensive)) return false;
  return !options.only_recompute_cheap_ops || cheap(n);
}

// What recomputing a node costs, estimated by op class and bytes: its
// results' bytes, times 64 for a compute-intensive op (a matmul or
// convolution does many FLOPs per byte it writes), times 4 for other ops
// that are not cheap (softmax, normalizations: a few passes over the data).
double recompute_cost(const ir::Node& n) {
  double bytes = 0;
  for (const auto& r : n.results())
    if (r->is_tensor() && r->has_meta()) bytes += static_cast<double>(r->meta().nbytes());
  if (ir::is_op_class(n.target(), ir::OpClass::ComputeIntensive)) return 64 * bytes;
  return cheap(n) ? bytes : 4 * bytes;
}

using Traits = boost::adjacency_list_traits<boost::vecS, boost::vecS, boost::directedS>;
using FlowGraph = boost::adjacency_list<
    boost::vecS, boost::vecS, boost::directedS,
    boost::property<
        boost::vertex_index_t, long,
        boost::property<boost::vertex_color_t, boost::default_color_type,
                        boost::property<boost::vertex_distance_t, long,
                                        boost::property<boost::vertex_predecessor_t, Traits::edge_descriptor>>>>,
    boost::property<boost::edge_capacity_t, double,
                    boost::property<boost::edge_residual_capacity_t, double,
                                    boost::property<boost::edge_reverse_t, Traits::edge_descriptor>>>>;

// A flow network with paired reverse edges, as boykov_kolmogorov_max_flow needs.
class Network {
 public:
  explicit Network(size_t vertices) : g_(vertices) {}
  void add(size_t from, size_t to, double capacity) {
    auto e = boost::add_edge(from, to, g_).first;
    auto r = boost::add_edge(to, from, g_).first;
    boost::put(boost::edge_capacity, g_, e, capacity);
    boost::put(boost::edge_capacity, g_, r, 0.0);
    boost::put(boost::edge_reverse, g_, e, r);
    boost::put(boost::edge_reverse, g_, r, e);
  }
  // The max flow from `s` to `t`; afterwards source_side(v) says which side
  // of the minimum cut v is on.
  double max_flow(size_t s, size_t t) { return boost::boykov_kolmogorov_max_flow(g_, s, t); }
  bool source_side(size_t v) const {
    return boost::get(boost::vertex_color, g_, v) == boost::color_traits<boost::default_color_type>::black();
  }

 private:
  FlowGraph g_;
};

// Every result of `g`, in graph order, and its position.
struct Values {
  explicit Values(const ir::Graph& g) {
    for (const ir::Node* n : g.nodes())
      for (size_t r = 0; r < n->num_results(); ++r) {
        index.emplace(n->result(r), list.size());
        list.push_back(n->result(r));
      }
  }
  std::unordered_map<const ir::Value*, size_t> index;
  std::vector<const ir::Value*> list;
};

// Values that depend on one of `roots`' results: they exist only in the backward.
std::vector<bool> depending_on(const ir::Graph& g, const Values& v, const std::unordered_set<const ir::Node*>& roots) {
  std::vector<bool> backward(v.list.size(), false);
  for (const ir::Node* n : g.nodes()) {
    bool b = roots.count(n) > 0;
    for (const ir::Value* in : n->inputs()) b = b || backward[v.index.at(in)];
    for (size_t r = 0; r < n->num_results(); ++r) backward[v.index.at(n->result(r))] = b;
  }
  return backward;
}

// A backward reader of `value` (through views) that no backend fuses with
// its producer (a matmul, a convolution, attention): there the value is
// materialized again, so recomputing it saves no memory and costs a kernel
// (is_materialized_backwards in the seed's partitioner).
bool materialized_backwards(const ir::Value* value, const std::vector<bool>& backward, const Values& v) {
  std::vector<const ir::Value*> stack{value};
  while (!stack.empty()) {
    const ir::Value* cur = stack.back();
    stack.pop_back();
    for (const ir::Node* user : cur->users()) {
      if (!user->is_call() || user->num_results() == 0) continue;
      if (backward[v.index.at(user->result(0))] && ir::is_op_class(user->target(), ir::OpClass::ComputeIntensive))
        return true;
      if (is_view(*user)) stack.push_back(user->result(0));
    }
  }
  return false;
}

struct Cut {
  std::unordered_set<const ir::Value*> saved;
  double bytes = 0;  // the cut's capacity; infinite when no finite cut exists
  // Why the heuristics keep a forward value in the forward (banned values,
  // by their first result; those the memory budget let go are absent).
  std::unordered_map<const ir::Value*, std::string> banned_because;
};

// Why a forward value may not be recomputed (the first heuristic that
// applies; Note [Min-cut partition]), or "" when it may.
std::string ban_reason(const ir::Node& n, bool reads_mutated, bool far, bool materialized,
                       const MinCutOptions& options) {
  if (n.is_placeholder()) return "an input of the function";
  if (reads_mutated) return "reads an input the function mutates";
  if (!n.is_call()) return "";
  const std::string op(n.schema().name());
  if (ir::has_side_effects(n)) return op + " has side effects (random draws, writes or collectives)";
  if (options.ban_compute_intensive && ir::is_op_class(op, ir::OpClass::ComputeIntensive))
    return op + " is compute-intensive";
  if (options.only_recompute_cheap_ops && !cheap(n)) return op + " is not a cheap op";
  if (far) return "more than max_recompute_distance uses from the backward";
  if (materialized) return "a compute-intensive backward op reads it (ban_materialized_backwards)";
  return "";
}

// The cut of Note [Min-cut partition] and Note [Memory budget] over the
// values of `v`: `backward` those that exist only in the backward, `free`
// those that cost nothing to keep (their capacity is 0), `mutated` the
// inputs the function writes.
Cut choose_saved(const ir::Graph& g, const Values& v, const std::vector<bool>& backward, const std::vector<bool>& free,
                 const std::unordered_set<const ir::Value*>& mutated, const MinCutOptions& options,
                 std::string_view who) {
  const std::vector<const ir::Value*>& values = v.list;
  // Uses from a forward value to the first backward use (0: a backward node
  // reads it), for max_recompute_distance; in reverse graph order.
  constexpr size_t kFar = std::numeric_limits<size_t>::max();
  std::vector<size_t> distance(values.size(), kFar);
  std::vector<const ir::Node*> nodes;
  for (const ir::Node* n : g.nodes()) nodes.push_back(n);
  for (auto it = nodes.rbegin(); it != nodes.rend(); ++it)
    for (size_t r = 0; r < (*it)->num_results(); ++r) {
      const ir::Value* value = (*it)->result(r);
      size_t& d = distance[v.index.at(value)];
      for (const ir::Node* user : value->users()) {
        if (!user->is_call() || user->num_results() == 0) continue;
        if (backward[v.index.at(user->result(0))]) {
          d = 0;
          break;
        }
        for (size_t k = 0; k < user->num_results(); ++k)
          if (const size_t du = distance[v.index.at(user->result(k))]; du != kFar) d = std::min(d, du + 1);
      }
    }

  // A result no one reads may have none (one an op did not compute, as
  // ATen's cuDNN attention leaves cum_seq_q undefined): saving it costs nothing.
  for (size_t i = 0; i < values.size(); ++i)
    if (!backward[i] && !free[i] && values[i]->is_tensor() && !values[i]->has_meta() && values[i]->has_users())
      throw PartitionError(std::string(who) + ": %" + values[i]->name() +
                           " has no metadata, so what saving it costs is unknown; run the propagate_meta pass first");

  // The values the heuristics keep in the forward, and among them those the
  // memory budget may let the backward recompute (Note [Memory budget]).
  // A node that reads an input the function mutates runs in the forward
  // only: the runtime writes the input's new value after the forward, so the
  // backward would read the new value (autograd's version check refuses it).
  std::vector<bool> banned(values.size(), false);
  std::unordered_map<const ir::Value*, std::string> reasons;
  std::vector<size_t> candidates;  // value indices, one per node (its first result)
  for (size_t i = 0; i < values.size(); ++i) {
    if (backward[i]) continue;
    const ir::Node* n = values[i]->node();
    const bool far = distance[i] != kFar && distance[i] > options.max_recompute_distance;
    bool reads_mutated = false;
    for (const ir::Value* in : n->inputs()) reads_mutated = reads_mutated || mutated.count(in) > 0;
    const bool materialized = options.ban_materialized_backwards && materialized_backwards(values[i], backward, v);
    banned[i] = n->is_placeholder() || reads_mutated || !recomputable(*n, options) || far || materialized;
    if (banned[i]) reasons.emplace(values[i], ban_reason(*n, reads_mutated, far, materialized, options));
    if (banned[i] && n->is_call() && !reads_mutated && !ir::has_side_effects(*n) && values[i] == n->result(0))
      candidates.push_back(i);
  }

  // The minimum cut of the network of Note [Min-cut partition] with the
  // values of `ban` fed by the source.
  auto min_cut = [&](const std::vector<bool>& ban) {
    const size_t source = 2 * values.size(), sink = source + 1;
    Network net(sink + 1);
    auto in = [](size_t i) { return 2 * i; };
    auto out = [](size_t i) { return 2 * i + 1; };
    for (size_t i = 0; i < values.size(); ++i) {
      const ir::Value* value = values[i];
      if (backward[i]) {
        net.add(in(i), out(i), kInfinity);
        net.add(in(i), sink, kInfinity);
      } else {
        const double keep = free[i] || (value->is_tensor() && !value->has_meta()) ? 0.0  // unread (above)
                            : value->is_tensor() ? static_cast<double>(value->meta().nbytes())
                                                 : kInfinity;
        net.add(in(i), out(i), keep);
        if (ban[i]) net.add(source, in(i), kInfinity);
      }
      for (const ir::Node* user : value->users())
        if (user->is_call())
          for (size_t k = 0; k < user->num_results(); ++k) net.add(out(i), in(v.index.at(user->result(k))), kInfinity);
    }
    Cut cut;
    cut.bytes = net.max_flow(source, sink);
    for (size_t i = 0; i < values.size(); ++i)
      if (!backward[i] && net.source_side(in(i)) && !net.source_side(out(i))) cut.saved.insert(values[i]);
    return cut;
  };
  Cut cut = min_cut(banned);
  std::vector<bool> final_ban = banned;
  if (options.memory_budget < 1.0 && !candidates.empty()) {
    // See Note [Memory budget].
    std::stable_sort(candidates.begin(), candidates.end(), [&](size_t a, size_t b) {
      return recompute_cost(*values[a]->node()) < recompute_cost(*values[b]->node());
    });
    auto unbanned = [&](size_t k) {
      std::vector<bool> ban = banned;
      for (size_t c = 0; c < k; ++c)
        for (const auto& r : values[candidates[c]]->node()->results()) ban[v.index.at(r.get())] = false;
      return ban;
    };
    const double least = min_cut(unbanned(candidates.size())).bytes;
    const double target = least + std::max(0.0, options.memory_budget) * (cut.bytes - least);
    size_t lo = 0, hi = candidates.size();  // the fewest unbanned candidates whose cut fits the target
    while (lo < hi) {
      const size_t mid = (lo + hi) / 2;
      if (min_cut(unbanned(mid)).bytes <= target)
        hi = mid;
      else
        lo = mid + 1;
    }
    final_ban = unbanned(lo);
    cut = min_cut(final_ban);
  }
  for (const auto& [value, reason] : reasons)
    if (final_ban[v.index.at(value)]) cut.banned_because.emplace(value, reason);
  return cut;
}

}  // namespace

PartitionResult min_cut_rematerialization_partition(const ir::Graph& joint, size_t num_fwd_outputs,
                                                    const MinCutOptions& options, MinCutReport* report) {
  constexpr std::string_view kWho = "min_cut_rematerialization_partition";
  // The default partition checks the joint graph against its contract; a
  // graph it refuses is refused here with the same message.
  (void)detail::split(joint, num_fwd_outputs, nullptr, kWho);

  const Values values(joint);
  const ir::GraphSignature& sig = joint.signature();
  const std::vector<ir::Value*> placeholders = joint.placeholders();
  std::unordered_set<const ir::Node*> tangents;
  for (size_t i = 0; i < placeholders.size() && i < sig.inputs.size(); ++i)
    if (sig.inputs[i].kind == ir::InputKind::Tangent) tangents.insert(placeholders[i]->node());
  std::unordered_set<const ir::Value*> mutated;
  for (const ir::OutputSpec& spec : sig.outputs)
    if (spec.kind == ir::OutputKind::MutatedInput && spec.input_index && *spec.input_index < placeholders.size())
      mutated.insert(placeholders[*spec.input_index]);
  const Cut cut = choose_saved(joint, values, depending_on(joint, values, tangents),
                               std::vector<bool>(values.list.size(), false), mutated, options, kWho);
  PartitionResult result = detail::split(joint, num_fwd_outputs, &cut.saved, kWho);
  if (report) {
    *report = MinCutReport{};
    for (const std::string& name : result.saved_values) {
      report->saved.insert(name);
      const ir::Value* value = joint.find_value(name);
      auto banned = value ? cut.banned_because.find(value) : cut.banned_because.end();
      report->why[name] = banned != cut.banned_because.end() && !banned->second.empty()
                              ? "kept in the forward: " + banned->second
                              : "the cut: fewer bytes than what it would be recomputed from";
    }
    for (const ir::Node* n : result.backward.nodes())
      if (n->is_call())
        for (size_t r = 0; r < n->num_results(); ++r)
          if (result.forward.find_value(n->result(r)->name())) {
            report->recomputed.insert(n->result(r)->name());
            report->why[n->result(r)->name()] = "recomputed in the backward: " + std::string(n->schema().name()) +
                                                " is cheap and its inputs are saved or recomputed";
          }
    report->saved_bytes = cut.bytes;
  }
  return result;
}

std::string to_text(const MinCutReport& report) {
  std::string out = "saved " + std::to_string(report.saved.size()) + " values (" +
                    std::to_string(static_cast<int64_t>(report.saved_bytes)) + " bytes); recomputed " +
                    std::to_string(report.recomputed.size()) + "\n";
  for (bool saved : {true, false})
    for (const auto& [name, why] : report.why)
      if (report.saved.count(name) == static_cast<size_t>(saved))
        out += (saved ? "saved      %" : "recomputed %") + name + ": " + why + "\n";
  return out;
}

RematReport rematerialize(ir::Graph& graph, const MinCutOptions& options) {
  constexpr std::string_view kWho = "rematerialize";
  RematReport report;
  const Values values(graph);
  // Everything from the first node autograd ran on: what is made there is
  // not alive before the backward starts, whatever it depends on (the
  // update's bias corrections, made from step counts).
  std::vector<bool> backward(values.list.size(), false);
  bool started = false;
  for (const ir::Node* n : graph.nodes()) {
    started = started || n->has_tag("backward");
    for (size_t r = 0; r < n->num_results(); ++r) backward[values.index.at(n->result(r))] = started;
  }
  if (!started) return report;  // no backward region
  // What the caller holds anyway costs nothing to keep: the placeholders,
  // the constants and views of them.
  std::vector<bool> free(values.list.size(), false);
  std::unordered_set<const ir::Value*> mutated;
  for (const ir::Node* n : graph.nodes()) {
    const std::vector<ir::Value*> inputs = n->inputs();
    bool held = n->is_placeholder() || n->is_constant() ||
                (is_view(*n) && !inputs.empty() && free[values.index.at(inputs.front())]);
    for (size_t r = 0; r < n->num_results(); ++r) free[values.index.at(n->result(r))] = held;
    if (n->is_call() && n->is_mutating())
      for (const ir::Value* in : inputs)
        if (in->node()->is_placeholder()) mutated.insert(in);
  }
  for (size_t i = 0; i < values.list.size(); ++i) {
    const ir::Value* v = values.list[i];
    if (backward[i] || free[i] || !v->is_tensor()) continue;
    for (const ir::Node* user : v->users())
      if (user->num_results() > 0 && backward[values.index.at(user->result(0))]) {
        if (!v->has_meta())
          throw PartitionError(std::string(kWho) + ": %" + v->name() +
                               " has no metadata, so what keeping it costs is unknown; run the propagate_meta pass "
                               "first");
        report.kept_bytes_before += static_cast<double>(v->meta().nbytes());
        break;
      }
  }
  const Cut cut = choose_saved(graph, values, backward, free, mutated, options, kWho);
  report.kept_bytes_after = report.kept_bytes_before;
  if (!std::isfinite(cut.bytes) || cut.bytes >= report.kept_bytes_before) return report;

  // A forward value the backward reads is kept (or free), or made again from
  // kept values. Reaching a side effect or a read of an input the graph
  // writes (which no budget lets the cut recompute) would mean the cut is
  // not what Note [Min-cut partition] promises: then nothing changes.
  auto kept = [&](const ir::Value* v) {
    const size_t i = values.index.at(v);
    return backward[i] || free[i] || cut.saved.count(v) > 0;
  };
  std::unordered_set<const ir::Node*> needed;  // the nodes the backward makes again
  std::vector<const ir::Node*> stack;
  for (const ir::Node* n : graph.nodes())
    if (n->num_results() > 0 && backward[values.index.at(n->result(0))])
      for (const ir::Value* in : n->inputs())
        if (!kept(in) && needed.insert(in->node()).second) stack.push_back(in->node());
  while (!stack.empty()) {
    const ir::Node* n = stack.back();
    stack.pop_back();
    if (!n->is_call() || ir::has_side_effects(*n)) return report;
    for (const ir::Value* in : n->inputs())
      if (mutated.count(in))
        return report;
      else if (!kept(in) && needed.insert(in->node()).second)
        stack.push_back(in->node());
  }

  // Copies go in front of the first backward node that needs them, in graph
  // order; every backward reader then reads the copy.
  detail::ValueMap copy;  // forward value -> its copy (or itself, when kept)
  std::vector<ir::Node*> order;
  for (ir::Node* n : graph.nodes()) order.push_back(n);
  std::function<void(const ir::Node*)> make = [&](const ir::Node* n) {
    for (const ir::Value* in : n->inputs()) {
      if (copy.count(in)) continue;
      if (needed.count(in->node()))
        make(in->node());
      else
        copy[in] = const_cast<ir::Value*>(in);
    }
    detail::copy_node(n, graph, copy, /*keep_names=*/false);
    ++report.recomputed_nodes;
  };
  for (ir::Node* n : order) {
    if (n->num_results() == 0 || !backward[values.index.at(n->result(0))]) continue;
    for (size_t a = 0; a < n->args().size(); ++a) {
      const ir::Argument& arg = n->arg(a);
      bool touched = false;
      for (const ir::Value* in : arg.values()) {
        if (!needed.count(in->node())) continue;
        touched = true;
        if (!copy.count(in)) {
          const ir::Graph::InsertGuard guard(graph, n);
          make(in->node());
        }
      }
      if (!touched) continue;
      if (arg.is_value()) {
        n->set_arg(a, copy.at(arg.value()));
      } else {
        ir::Argument::ValueList list;
        for (ir::Value* v : arg.value_list()) list.push_back(v && needed.count(v->node()) ? copy.at(v) : v);
        n->set_arg(a, std::move(list));
      }
    }
  }
  report.kept_bytes_after = cut.bytes;
  return report;
}

double estimated_peak_bytes(const ir::Graph& g) {
  // The last node reading each storage (through its views); the graph's
  // outputs are read at the end.
  std::unordered_map<const ir::Value*, size_t> last;
  size_t position = 0;
  for (const ir::Node* n : g.nodes()) {
    for (const ir::Value* in : n->inputs()) last[ir::storage_root(in)] = position;
    ++position;
  }
  for (const ir::Value* out : g.outputs()) last[ir::storage_root(out)] = position;
  std::vector<std::vector<double>> freed(position + 1);  // bytes freed after each node
  double live = 0, peak = 0;
  position = 0;
  for (const ir::Node* n : g.nodes()) {
    if (n->is_call())
      for (size_t r = 0; r < n->num_results(); ++r) {
        const ir::Value* v = n->result(r);
        if (!v->is_tensor() || !v->has_meta() || ir::storage_root(v) != v) continue;
        const double bytes = static_cast<double>(v->meta().nbytes());
        live += bytes;
        const auto it = last.find(v);
        freed[it == last.end() ? position : it->second].push_back(bytes);
      }
    peak = std::max(peak, live);
    for (double bytes : freed[position]) live -= bytes;
    ++position;
  }
  return peak;
}

ir::Pass remat_pass(const MinCutOptions& options) {
  return {"remat", [options](ir::Graph& g) {
            // Only a training step's graph (it returns a loss): an AOT
            // backward graph begins with what its partition recomputes,
            // which the cut would only move.
            const auto& outputs = g.signature().outputs;
            if (std::none_of(outputs.begin(), outputs.end(),
                             [](const ir::OutputSpec& o) { return o.kind == ir::OutputKind::Loss; }))
              return;
            // See Note [Rematerialization in one graph]: kept where it
            // lowers the peak, at a cost the caller accepts.
            ir::Graph rewritten = g.clone();
            if (rematerialize(rewritten, options).recomputed_nodes == 0 ||
                estimated_peak_bytes(rewritten) >= estimated_peak_bytes(g))
              return;
            if (options.estimated_ms) {
              double before = 0, after = 0;
              try {
                before = options.estimated_ms(g);
                after = options.estimated_ms(rewritten);
              } catch (const std::exception&) {
                return;  // a graph the model cannot weigh (the backend cannot lower it) is left as it was
              }
              if (after > before * (1 + options.max_slowdown)) return;
            }
            g = std::move(rewritten);
          }};
}

double saved_bytes(const PartitionResult& partition) {
  double bytes = 0;
  const std::vector<ir::Value*> outputs = partition.forward.outputs();
  const auto& specs = partition.forward.signature().outputs;
  for (size_t i = 0; i < outputs.size() && i < specs.size(); ++i)
    if (specs[i].kind == ir::OutputKind::SavedValue && outputs[i]->has_meta())
      bytes += static_cast<double>(outputs[i]->meta().nbytes());
  return bytes;
}

}  // namespace crucible::partitioner
