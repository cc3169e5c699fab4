// See Note [Min-cut partition].
#include <crucible/partitioner/error.h>
#include <crucible/partitioner/min_cut_partition.h>

#include <crucible/ir/effects.h>

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
#include <limits>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace crucible::partitioner {

namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();

bool compute_intensive(std::string_view op) {
  static const std::unordered_set<std::string_view> ops = {"aten::mm",
                                                           "aten::addmm",
                                                           "aten::bmm",
                                                           "aten::baddbmm",
                                                           "aten::matmul",
                                                           "aten::convolution",
                                                           "aten::convolution_backward",
                                                           "aten::_convolution",
                                                           "aten::cudnn_convolution",
                                                           "aten::_scaled_dot_product_flash_attention",
                                                           "aten::_scaled_dot_product_efficient_attention",
                                                           "aten::_scaled_dot_product_cudnn_attention",
                                                           "aten::_scaled_dot_product_attention_math"};
  return ops.count(op) > 0;
}

bool cheap(const ir::Node& n) {
  static const std::unordered_set<std::string_view> ops = {
      "aten::sum",           "aten::mean",   "aten::amax",       "aten::amin",       "aten::cat",
      "aten::expand",        "aten::clone",  "aten::_to_copy",   "aten::where",      "aten::full",
      "aten::full_like",     "aten::zeros",  "aten::zeros_like", "aten::ones",       "aten::ones_like",
      "aten::scalar_tensor", "aten::arange", "aten::empty",      "aten::empty_like", "aten::lift_fresh_copy",
      "aten::alias"};
  if (n.op().hasTag(at::Tag::pointwise)) return true;
  const auto& returns = n.schema().returns();
  if (!returns.empty() && returns[0].alias_info() && !returns[0].alias_info()->isWrite()) return true;  // a view
  return ops.count(n.schema().name()) > 0;
}

// Whether the backward may recompute `n`; see Note [Min-cut partition].
bool recomputable(const ir::Node& n, const MinCutOptions& options) {
  if (!n.is_call()) return true;  // constants
  if (ir::has_side_effects(n)) return false;
  if (options.ban_compute_intensive && compute_intensive(n.schema().name())) return false;
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
  if (compute_intensive(n.schema().name())) return 64 * bytes;
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

}  // namespace

PartitionResult min_cut_rematerialization_partition(const ir::Graph& joint, size_t num_fwd_outputs,
                                                    const MinCutOptions& options, MinCutReport* report) {
  constexpr std::string_view kWho = "min_cut_rematerialization_partition";
  // The default partition checks the joint graph against its contract; a
  // graph it refuses is refused here with the same message.
  (void)detail::split(joint, num_fwd_outputs, nullptr, kWho);

  std::unordered_map<const ir::Value*, size_t> index;
  std::vector<const ir::Value*> values;
  for (const ir::Node* n : joint.nodes())
    for (size_t r = 0; r < n->num_results(); ++r) {
      index.emplace(n->result(r), values.size());
      values.push_back(n->result(r));
    }
  const ir::GraphSignature& sig = joint.signature();
  const std::vector<ir::Value*> placeholders = joint.placeholders();
  std::unordered_set<const ir::Node*> tangents;
  for (size_t i = 0; i < placeholders.size() && i < sig.inputs.size(); ++i)
    if (sig.inputs[i].kind == ir::InputKind::Tangent) tangents.insert(placeholders[i]->node());

  // Values that depend on a tangent: they exist only in the backward.
  std::vector<bool> backward(values.size(), false);
  for (const ir::Node* n : joint.nodes()) {
    bool b = tangents.count(n) > 0;
    for (const ir::Value* in : n->inputs()) b = b || backward[index.at(in)];
    for (size_t r = 0; r < n->num_results(); ++r) backward[index.at(n->result(r))] = b;
  }

  // Uses from a forward value to the first backward use (0: a backward node
  // reads it), for max_recompute_distance; in reverse graph order.
  constexpr size_t kFar = std::numeric_limits<size_t>::max();
  std::vector<size_t> distance(values.size(), kFar);
  std::vector<const ir::Node*> nodes;
  for (const ir::Node* n : joint.nodes()) nodes.push_back(n);
  for (auto it = nodes.rbegin(); it != nodes.rend(); ++it)
    for (size_t r = 0; r < (*it)->num_results(); ++r) {
      const ir::Value* v = (*it)->result(r);
      size_t& d = distance[index.at(v)];
      for (const ir::Node* user : v->users()) {
        if (!user->is_call() || user->num_results() == 0) continue;
        if (backward[index.at(user->result(0))]) {
          d = 0;
          break;
        }
        for (size_t k = 0; k < user->num_results(); ++k)
          if (const size_t du = distance[index.at(user->result(k))]; du != kFar) d = std::min(d, du + 1);
      }
    }

  for (size_t i = 0; i < values.size(); ++i)
    if (!backward[i] && values[i]->is_tensor() && !values[i]->has_meta())
      throw PartitionError(std::string(kWho) + ": %" + values[i]->name() +
                           " has no metadata, so what saving it costs is unknown; run the propagate_meta pass first");

  // The values the heuristics keep in the forward, and among them those the
  // memory budget may let the backward recompute (Note [Memory budget]).
  // A node that reads an input the function mutates runs in the forward
  // only: the runtime writes the input's new value after the forward, so the
  // backward would read the new value (autograd's version check refuses it).
  std::unordered_set<const ir::Value*> mutated;
  for (const ir::OutputSpec& spec : sig.outputs)
    if (spec.kind == ir::OutputKind::MutatedInput && spec.input_index && *spec.input_index < placeholders.size())
      mutated.insert(placeholders[*spec.input_index]);
  std::vector<bool> banned(values.size(), false);
  std::vector<size_t> candidates;  // value indices, one per node (its first result)
  for (size_t i = 0; i < values.size(); ++i) {
    if (backward[i]) continue;
    const ir::Node* n = values[i]->node();
    const bool far = distance[i] != kFar && distance[i] > options.max_recompute_distance;
    bool reads_mutated = false;
    for (const ir::Value* in : n->inputs()) reads_mutated = reads_mutated || mutated.count(in) > 0;
    banned[i] = n->is_placeholder() || reads_mutated || !recomputable(*n, options) || far;
    if (banned[i] && n->is_call() && !reads_mutated && !ir::has_side_effects(*n) && values[i] == n->result(0))
      candidates.push_back(i);
  }

  // The minimum cut of the network of Note [Min-cut partition] with the
  // values of `ban` fed by the source: the values it saves and their bytes.
  auto min_cut = [&](const std::vector<bool>& ban, double* bytes) {
    const size_t source = 2 * values.size(), sink = source + 1;
    Network net(sink + 1);
    auto in = [](size_t i) { return 2 * i; };
    auto out = [](size_t i) { return 2 * i + 1; };
    for (size_t i = 0; i < values.size(); ++i) {
      const ir::Value* v = values[i];
      if (backward[i]) {
        net.add(in(i), out(i), kInfinity);
        net.add(in(i), sink, kInfinity);
      } else {
        net.add(in(i), out(i), v->is_tensor() ? static_cast<double>(v->meta().nbytes()) : kInfinity);
        if (ban[i]) net.add(source, in(i), kInfinity);
      }
      for (const ir::Node* user : v->users())
        if (user->is_call())
          for (size_t k = 0; k < user->num_results(); ++k) net.add(out(i), in(index.at(user->result(k))), kInfinity);
    }
    *bytes = net.max_flow(source, sink);
    std::unordered_set<const ir::Value*> saved;
    for (size_t i = 0; i < values.size(); ++i)
      if (!backward[i] && net.source_side(in(i)) && !net.source_side(out(i))) saved.insert(values[i]);
    return saved;
  };
  double flow = 0;
  std::unordered_set<const ir::Value*> saved = min_cut(banned, &flow);
  if (options.memory_budget < 1.0 && !candidates.empty()) {
    // See Note [Memory budget].
    std::stable_sort(candidates.begin(), candidates.end(), [&](size_t a, size_t b) {
      return recompute_cost(*values[a]->node()) < recompute_cost(*values[b]->node());
    });
    auto unbanned = [&](size_t k) {
      std::vector<bool> ban = banned;
      for (size_t c = 0; c < k; ++c)
        for (const auto& r : values[candidates[c]]->node()->results()) ban[index.at(r.get())] = false;
      return ban;
    };
    double least = 0;
    (void)min_cut(unbanned(candidates.size()), &least);
    const double target = least + std::max(0.0, options.memory_budget) * (flow - least);
    size_t lo = 0, hi = candidates.size();  // the fewest unbanned candidates whose cut fits the target
    while (lo < hi) {
      const size_t mid = (lo + hi) / 2;
      double bytes = 0;
      (void)min_cut(unbanned(mid), &bytes);
      if (bytes <= target)
        hi = mid;
      else
        lo = mid + 1;
    }
    saved = min_cut(unbanned(lo), &flow);
  }
  PartitionResult result = detail::split(joint, num_fwd_outputs, &saved, kWho);
  if (report) {
    report->saved.clear();
    report->recomputed.clear();
    for (const std::string& name : result.saved_values) report->saved.insert(name);
    for (const ir::Node* n : result.backward.nodes())
      if (n->is_call())
        for (size_t r = 0; r < n->num_results(); ++r)
          if (result.forward.find_value(n->result(r)->name())) report->recomputed.insert(n->result(r)->name());
    report->saved_bytes = flow;
  }
  return result;
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
