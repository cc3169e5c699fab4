#include <crucible/ir/error.h>
#include <crucible/ir/graph.h>

#include <ATen/core/enum_tag.h>

#include <algorithm>
#include <cctype>
#include <sstream>
#include <unordered_map>

namespace crucible::ir {

std::string_view to_string(NodeKind kind) {
  switch (kind) {
    case NodeKind::Placeholder:
      return "placeholder";
    case NodeKind::Call:
      return "call";
    case NodeKind::Constant:
      return "constant";
    case NodeKind::Output:
      return "output";
  }
  return "?";
}

// --- operator lookup -----------------------------------------------------------

c10::OperatorHandle resolve_operator(std::string_view op_name) {
  const auto sep = op_name.find("::");
  if (sep == std::string_view::npos)
    throw IrError("operator '" + std::string(op_name) + "': expected a namespaced name such as aten::add.Tensor");
  const auto dot = op_name.find('.', sep + 2);
  std::string name(op_name.substr(0, dot));
  std::string overload = dot == std::string_view::npos ? "" : std::string(op_name.substr(dot + 1));
  if (auto h = c10::Dispatcher::singleton().findSchema({name, overload})) return *h;

  std::ostringstream msg;
  msg << "operator '" << op_name << "' is not registered with the dispatcher";
  std::vector<std::string> overloads;
  for (const auto& n : c10::Dispatcher::singleton().getAllOpNames())
    if (n.name == name) overloads.push_back(n.overload_name.empty() ? name : name + "." + n.overload_name);
  if (!overloads.empty()) {
    std::sort(overloads.begin(), overloads.end());
    msg << "; overloads of " << name << " are:";
    for (const auto& o : overloads) msg << ' ' << o;
  } else {
    msg << "; check the spelling (schema names look like aten::add.Tensor)";
  }
  throw IrError(msg.str());
}

std::string operator_name(const c10::OperatorHandle& op) {
  const auto& n = op.operator_name();
  return n.overload_name.empty() ? n.name : n.name + "." + n.overload_name;
}

// --- Value -----------------------------------------------------------------------

bool Value::is_tensor() const { return type_->kind() == c10::TypeKind::TensorType; }

const TensorMeta& Value::meta() const {
  if (!meta_)
    throw IrError("value %" + name_ + " (" + type_->str() + ") has no TensorMeta" +
                  (is_tensor() ? "; set it with Value::set_meta" : ": it is not a tensor"));
  return *meta_;
}

void Value::replace_all_uses_with(Value* other) {
  if (other == this) return;
  if (other->node_->graph_ != node_->graph_)
    throw IrError("replace_all_uses_with(%" + name_ + ", %" + other->name_ +
                  "): the values belong to different graphs");
  std::vector<Node*> users = users_;
  std::sort(users.begin(), users.end());
  users.erase(std::unique(users.begin(), users.end()), users.end());
  for (Node* u : users) {
    for (Argument& a : u->args_) {
      if (a.is_value()) {
        if (std::get<Value*>(a.data_) == this) a.data_ = other;
      } else if (a.is_value_list()) {
        for (Value*& v : std::get<Argument::ValueList>(a.data_))
          if (v == this) v = other;
      }
    }
  }
  other->users_.insert(other->users_.end(), users_.begin(), users_.end());
  users_.clear();
}

// --- Argument ---------------------------------------------------------------------

std::vector<Value*> Argument::values() const {
  if (is_value()) return {value()};
  if (is_value_list()) {
    std::vector<Value*> r;
    for (Value* v : value_list())
      if (v) r.push_back(v);
    return r;
  }
  return {};
}

// --- Node ---------------------------------------------------------------------

const c10::OperatorHandle& Node::op() const {
  if (!op_)
    throw IrError("node '" + target_ + "' is a " + std::string(to_string(kind_)) + ", not a call: it has no operator");
  return *op_;
}

const c10::FunctionSchema& Node::schema() const { return op().schema(); }

void Node::set_arg(size_t i, Argument a) {
  if (i >= args_.size())
    throw IrError(target_ + ": argument index " + std::to_string(i) + " out of range (" + std::to_string(args_.size()) +
                  " arguments)");
  for (Value* v : a.values())
    if (v->node()->graph() != graph_) throw IrError(target_ + ": argument %" + v->name() + " belongs to another graph");
  drop_uses();
  args_[i] = std::move(a);
  add_uses();
}

std::vector<Value*> Node::inputs() const {
  std::vector<Value*> r;
  for (const Argument& a : args_)
    for (Value* v : a.values()) r.push_back(v);
  return r;
}

std::vector<Value*> Node::written() const {
  std::vector<Value*> r;
  if (!is_mutating()) return r;
  const auto& formals = schema().arguments();
  for (size_t i = 0; i < args_.size() && i < formals.size(); ++i)
    if (formals[i].alias_info() && formals[i].alias_info()->isWrite())
      for (Value* v : args_[i].values()) r.push_back(v);
  return r;
}

bool Node::has_tag(std::string_view tag) const { return std::find(tags_.begin(), tags_.end(), tag) != tags_.end(); }

void Node::add_tag(std::string tag) {
  if (!has_tag(tag)) tags_.push_back(std::move(tag));
}

Node* Node::prev() const {
  if (self_ == graph_->nodes_.begin()) return nullptr;
  return std::prev(self_)->get();
}

Node* Node::next() const {
  auto n = std::next(self_);
  return n == graph_->nodes_.end() ? nullptr : n->get();
}

bool Node::is_mutating() const { return op_ && op_->schema().is_mutable(); }

bool Node::is_nondeterministic() const { return op_ && op_->hasTag(at::Tag::nondeterministic_seeded); }

void Node::add_uses() {
  for (const Argument& a : args_)
    for (Value* v : a.values()) v->users_.push_back(this);
}

void Node::drop_uses() {
  for (const Argument& a : args_)
    for (Value* v : a.values()) {
      auto it = std::find(v->users_.begin(), v->users_.end(), this);
      if (it != v->users_.end()) v->users_.erase(it);
    }
}

// --- Graph ----------------------------------------------------------------------

Graph::Graph() = default;
Graph::~Graph() = default;

Graph::Graph(Graph&& o) noexcept { *this = std::move(o); }

Graph& Graph::operator=(Graph&& o) noexcept {
  nodes_ = std::move(o.nodes_);
  insert_before_ = std::exchange(o.insert_before_, nullptr);
  output_ = std::exchange(o.output_, nullptr);
  signature_ = std::move(o.signature_);
  names_ = std::move(o.names_);
  name_counters_ = std::move(o.name_counters_);
  for (auto& n : nodes_) n->graph_ = this;
  return *this;
}

std::string Graph::unique_name(std::string_view hint) {
  std::string base;
  for (char c : hint) base += (std::isalnum(static_cast<unsigned char>(c)) || c == '_') ? c : '_';
  if (base.empty() || std::isdigit(static_cast<unsigned char>(base[0]))) base = "_" + base;
  if (!names_.count(base)) return base;
  size_t& counter = name_counters_[base];
  std::string candidate;
  do {
    candidate = base + "_" + std::to_string(++counter);
  } while (names_.count(candidate));
  return candidate;
}

void Graph::rename(Value* v, std::string_view name) {
  if (v->name_ == name) return;
  if (names_.count(std::string(name)))
    throw IrError("cannot rename %" + v->name_ + " to %" + std::string(name) + ": the name is taken");
  names_.erase(v->name_);
  v->name_ = std::string(name);
  names_[v->name_] = v;
}

Value* Graph::find_value(std::string_view name) const {
  auto it = names_.find(std::string(name));
  return it == names_.end() ? nullptr : it->second;
}

Value* Graph::add_result(Node* n, c10::TypePtr type, std::string_view name_hint) {
  std::string name = unique_name(name_hint);
  auto v = std::unique_ptr<Value>(new Value(n, n->results_.size(), name, std::move(type)));
  names_[name] = v.get();
  n->results_.push_back(std::move(v));
  return n->results_.back().get();
}

Node* Graph::insert_node(std::unique_ptr<Node> n, bool placeholder) {
  std::list<std::unique_ptr<Node>>::iterator pos;
  if (placeholder) {
    pos = std::find_if(nodes_.begin(), nodes_.end(), [](const auto& m) { return !m->is_placeholder(); });
  } else if (insert_before_) {
    pos = insert_before_->self_;
  } else if (output_) {
    pos = output_->self_;
  } else {
    pos = nodes_.end();
  }
  auto it = nodes_.insert(pos, std::move(n));
  (*it)->self_ = it;
  return it->get();
}

Value* Graph::add_placeholder(std::string_view name, TensorMeta meta, InputSpec spec) {
  Node* n = insert_node(std::unique_ptr<Node>(new Node(this, NodeKind::Placeholder, "placeholder")), true);
  Value* v = add_result(n, c10::TensorType::get(), name);
  v->set_meta(std::move(meta));
  signature_.inputs.push_back(std::move(spec));
  return v;
}

Node* Graph::add_call(std::string_view op_name, std::vector<Argument> args, std::optional<size_t> list_size,
                      std::string_view name_hint) {
  return add_call(resolve_operator(op_name), std::move(args), list_size, name_hint);
}

Node* Graph::add_call(const c10::OperatorHandle& op, std::vector<Argument> args, std::optional<size_t> list_size,
                      std::string_view name_hint) {
  const auto& schema = op.schema();
  const std::string target = operator_name(op);
  const auto& formals = schema.arguments();
  if (args.size() > formals.size())
    throw IrError(target + ": " + std::to_string(args.size()) + " arguments given, the schema takes " +
                  std::to_string(formals.size()) + " (" + toString(schema) + ")");
  for (size_t i = args.size(); i < formals.size(); ++i) {
    if (!formals[i].default_value())
      throw IrError(target + ": argument '" + formals[i].name() + "' (index " + std::to_string(i) +
                    ") is missing and has no default (" + toString(schema) + ")");
    args.emplace_back(*formals[i].default_value());
  }
  for (const Argument& a : args)
    for (Value* v : a.values())
      if (v->node()->graph() != this) throw IrError(target + ": argument %" + v->name() + " belongs to another graph");

  // Result types from the schema; a Tensor[] return expands to list_size tensors.
  std::vector<c10::TypePtr> result_types;
  for (const auto& ret : schema.returns()) {
    if (auto list = ret.type()->cast<c10::ListType>();
        list && list->getElementType()->kind() == c10::TypeKind::TensorType) {
      if (!list_size) throw IrError(target + " returns Tensor[]: pass the number of tensors it returns (list_size)");
      result_types.insert(result_types.end(), *list_size, c10::TensorType::get());
    } else {
      result_types.push_back(ret.type());
    }
  }

  auto node = std::unique_ptr<Node>(new Node(this, NodeKind::Call, target));
  node->op_ = op;
  node->args_ = std::move(args);
  Node* n = insert_node(std::move(node), false);
  std::string hint(name_hint);
  if (hint.empty()) {
    const auto& full = schema.name();
    hint = full.substr(full.find("::") + 2);
  }
  for (auto& t : result_types) add_result(n, t, hint);
  n->add_uses();
  return n;
}

Value* Graph::add_constant(c10::IValue value, std::string_view name_hint) {
  Node* n = insert_node(std::unique_ptr<Node>(new Node(this, NodeKind::Constant, "constant")), false);
  n->constant_ = std::move(value);
  Value* v = add_result(n, n->constant_.isTensor() ? c10::TensorType::get() : n->constant_.type(), name_hint);
  if (n->constant_.isTensor()) v->set_meta(TensorMeta::of(n->constant_.toTensor()));
  return v;
}

void Graph::set_output(std::vector<Value*> outputs) {
  for (Value* v : outputs)
    if (!v || v->node()->graph() != this)
      throw IrError("set_output: an output value is null or belongs to another graph");
  if (!output_) {
    nodes_.push_back(std::unique_ptr<Node>(new Node(this, NodeKind::Output, "output")));
    output_ = nodes_.back().get();
    output_->self_ = std::prev(nodes_.end());
  } else {
    output_->drop_uses();
    output_->args_.clear();
  }
  for (Value* v : outputs) output_->args_.emplace_back(v);
  output_->add_uses();
  signature_.outputs.resize(outputs.size());
}

void Graph::move_before(Node* node, Node* anchor) {
  if (node->graph_ != this || anchor->graph_ != this) throw IrError("move_before: a node belongs to another graph");
  if (!node->is_call() || anchor->is_placeholder())
    throw IrError("move_before: only a call moves, and not before a placeholder (%" +
                  (node->num_results() ? node->result()->name() : node->target_) + ")");
  if (node == anchor) return;
  nodes_.splice(anchor->self_, nodes_, node->self_);  // iterators, hence self_, stay valid
}

void Graph::erase(Node* node) {
  if (node->graph_ != this) throw IrError("erase: the node belongs to another graph");
  for (const auto& r : node->results_)
    if (r->has_users())
      throw IrError("erase: %" + r->name() + " (" + node->target_ + ") still has " + std::to_string(r->users().size()) +
                    " use(s); replace them first");
  if (node->is_placeholder()) {
    size_t idx = 0;
    for (Node* n : nodes()) {
      if (n == node) break;
      if (n->is_placeholder()) ++idx;
    }
    signature_.inputs.erase(signature_.inputs.begin() + static_cast<std::ptrdiff_t>(idx));
  }
  node->drop_uses();
  if (node == output_) {
    output_ = nullptr;
    signature_.outputs.clear();
  }
  if (node == insert_before_) insert_before_ = node->next();
  for (const auto& r : node->results_) names_.erase(r->name());
  nodes_.erase(node->self_);
}

Graph::InsertGuard::InsertGuard(Graph& g, Node* anchor, Where where) : g_(g), saved_(g.insert_before_) {
  if (anchor->graph_ != &g) throw IrError("InsertGuard: the anchor node belongs to another graph");
  g_.insert_before_ = where == Where::Before ? anchor : anchor->next();
}

Graph::InsertGuard::~InsertGuard() { g_.insert_before_ = saved_; }

std::vector<Value*> Graph::placeholders() const {
  std::vector<Value*> r;
  for (Node* n : nodes()) {
    if (!n->is_placeholder()) break;
    r.push_back(n->result());
  }
  return r;
}

std::vector<bool> placeholders_written(const Graph& g) {
  const std::vector<Value*> placeholders = g.placeholders();
  std::unordered_map<const Value*, size_t> index;
  for (size_t i = 0; i < placeholders.size(); ++i) index.emplace(placeholders[i], i);
  std::vector<bool> written(placeholders.size(), false);
  for (const Node* n : g.nodes())
    if (n->is_call())
      for (const Value* v : n->written())
        if (auto it = index.find(v); it != index.end()) written[it->second] = true;
  return written;
}

std::vector<Value*> Graph::outputs() const { return output_ ? output_->inputs() : std::vector<Value*>{}; }

Graph Graph::clone(std::unordered_map<const Value*, Value*>* map) const {
  Graph g;
  std::unordered_map<const Value*, Value*> local;
  auto& m = map ? *map : local;
  auto mapped = [&](Value* v) { return v ? m.at(v) : nullptr; };
  for (Node* src : nodes()) {
    auto node = std::unique_ptr<Node>(new Node(&g, src->kind_, src->target_));
    node->op_ = src->op_;
    node->constant_ = src->constant_;
    node->source_ = src->source_;
    node->tags_ = src->tags_;
    for (const Argument& a : src->args_) {
      if (a.is_value()) {
        node->args_.emplace_back(mapped(a.value()));
      } else if (a.is_value_list()) {
        Argument::ValueList vs;
        for (Value* v : a.value_list()) vs.push_back(mapped(v));
        node->args_.emplace_back(std::move(vs));
      } else {
        node->args_.emplace_back(a.constant());
      }
    }
    g.nodes_.push_back(std::move(node));
    Node* n = g.nodes_.back().get();
    n->self_ = std::prev(g.nodes_.end());
    if (n->is_output()) g.output_ = n;
    for (const auto& r : src->results_) {
      Value* v = g.add_result(n, r->type_, r->name_);
      v->meta_ = r->meta_;
      m[r.get()] = v;
    }
    n->add_uses();
  }
  g.signature_ = signature_;
  g.name_counters_ = name_counters_;
  return g;
}

}  // namespace crucible::ir
