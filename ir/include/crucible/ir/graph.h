// Graph, Node, Value: Crucible's IR. A graph is a flat list of ATen-level
// calls in topological order, the C++ counterpart of torch.fx.Graph as
// make_fx produces it (placeholder / call_function / output nodes), with
// constants as nodes of their own and metadata on every tensor Value.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include <crucible/ir/signature.h>
#include <crucible/ir/tensor_meta.h>

#include <cstddef>
#include <iterator>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <variant>
#include <vector>

namespace crucible::ir {

class Graph;
class Node;

/// What a node is. Mirrors FX's op kinds: placeholder, call_function, output;
/// `Constant` stands for FX's get_attr of a tensor constant (a node that
/// produces a tensor with no inputs) so graphs stay self-contained.
enum class NodeKind : uint8_t { Placeholder, Call, Constant, Output };

std::string_view to_string(NodeKind kind);

/// A result of a Node. Tensor Values carry TensorMeta; others (int, float,
/// bool, Scalar results such as aten::sym_size's) carry only their type.
class Value {
 public:
  Value(const Value&) = delete;
  Value& operator=(const Value&) = delete;

  /// Unique within the graph, without the leading '%'.
  const std::string& name() const { return name_; }
  Node* node() const { return node_; }
  /// Position among node()->results().
  size_t index() const { return index_; }
  /// The c10 type (TensorType, IntType, FloatType, BoolType, NumberType, ...).
  const c10::TypePtr& type() const { return type_; }
  /// True for Tensor-typed Values.
  bool is_tensor() const;
  bool has_meta() const { return meta_.has_value(); }

  /// The tensor metadata. Throws IrError if this Value has none (not a
  /// tensor, or a tensor whose meta was never set).
  const TensorMeta& meta() const;
  void set_meta(TensorMeta meta) { meta_ = std::move(meta); }
  /// Drops the metadata (a result that is no longer computed).
  void clear_meta() { meta_.reset(); }

  /// Nodes whose arguments mention this Value, once per mention, in no
  /// particular order.
  const std::vector<Node*>& users() const { return users_; }
  bool has_users() const { return !users_.empty(); }

  /// Rewrites every argument that mentions this Value to mention `other`
  /// instead (FX's Node.replace_all_uses_with). `other` must belong to the
  /// same graph.
  void replace_all_uses_with(Value* other);

 private:
  friend class Node;
  friend class Graph;
  Value(Node* node, size_t index, std::string name, c10::TypePtr type)
      : node_(node), index_(index), name_(std::move(name)), type_(std::move(type)) {}

  Node* node_;
  size_t index_;
  std::string name_;
  c10::TypePtr type_;
  std::optional<TensorMeta> meta_;
  std::vector<Node*> users_;
};

/// One argument of a node, in schema order: a Value, a list of Values (for
/// Tensor[] and Tensor?[] arguments; nullptr stands for None in Tensor?[]), or
/// a constant of any kind an ATen schema takes (Scalar, int, int[], float,
/// bool, None, ScalarType, Layout, MemoryFormat, Device, str, ...), held as
/// a c10::IValue exactly as the boxed calling convention pushes it.
class Argument {
 public:
  using ValueList = std::vector<Value*>;

  Argument(Value* v) : data_(v) {}                  // NOLINT(google-explicit-constructor)
  Argument(ValueList vs) : data_(std::move(vs)) {}  // NOLINT(google-explicit-constructor)
  /// Any constant c10::IValue can hold: `int64_t{2}`, `1e-5`, `true`,
  /// `std::vector<int64_t>{6}`, `c10::IValue()` (None), `at::kFloat`, ...
  template <typename T,
            typename = std::enable_if_t<std::is_constructible_v<c10::IValue, T&&> &&
                                        !std::is_convertible_v<T&&, Value*> && !std::is_convertible_v<T&&, ValueList>>>
  Argument(T&& c) : data_(c10::IValue(std::forward<T>(c))) {}  // NOLINT(google-explicit-constructor)

  bool is_value() const { return std::holds_alternative<Value*>(data_); }
  bool is_value_list() const { return std::holds_alternative<ValueList>(data_); }
  bool is_constant() const { return std::holds_alternative<c10::IValue>(data_); }

  Value* value() const { return std::get<Value*>(data_); }
  const ValueList& value_list() const { return std::get<ValueList>(data_); }
  const c10::IValue& constant() const { return std::get<c10::IValue>(data_); }

  /// Every Value this argument mentions (nullptr entries skipped).
  std::vector<Value*> values() const;

 private:
  friend class Node;
  friend class Value;
  friend class Graph;
  std::variant<Value*, ValueList, c10::IValue> data_;
};

/// A node of the graph. Call nodes name an operator by its schema name
/// (`aten::add.Tensor`, `crucible::all_reduce`), resolved to a
/// c10::OperatorHandle, and hold one Argument per schema argument.
class Node {
 public:
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  NodeKind kind() const { return kind_; }
  bool is_placeholder() const { return kind_ == NodeKind::Placeholder; }
  bool is_call() const { return kind_ == NodeKind::Call; }
  bool is_constant() const { return kind_ == NodeKind::Constant; }
  bool is_output() const { return kind_ == NodeKind::Output; }
  Graph* graph() const { return graph_; }

  /// Call nodes: "ns::name" or "ns::name.overload" ("aten::add.Tensor").
  /// Other kinds: "placeholder", "constant", "output".
  const std::string& target() const { return target_; }
  /// Call nodes only: the resolved operator and its schema. Throw IrError otherwise.
  const c10::OperatorHandle& op() const;
  const c10::FunctionSchema& schema() const;

  /// Arguments: for Call nodes one per schema argument in schema order; for
  /// the Output node one Value per graph output; empty otherwise.
  const std::vector<Argument>& args() const { return args_; }
  const Argument& arg(size_t i) const { return args_.at(i); }
  /// Replaces argument i, keeping use lists right.
  void set_arg(size_t i, Argument a);
  /// Every Value this node reads, in argument order (with repeats).
  std::vector<Value*> inputs() const;

  /// Results, in schema-return order; a Tensor[] return contributes one
  /// Value per element.
  const std::vector<std::unique_ptr<Value>>& results() const { return results_; }
  Value* result(size_t i = 0) const { return results_.at(i).get(); }
  size_t num_results() const { return results_.size(); }

  /// Constant nodes: the tensor (or scalar) they produce.
  const c10::IValue& constant_value() const { return constant_; }

  /// Where the op came from (free text, e.g. "Linear(fc1).forward"), and free-form
  /// tags ("backward", "recomputable", ...), as FX keeps in node.meta.
  const std::string& source() const { return source_; }
  void set_source(std::string s) { source_ = std::move(s); }
  const std::vector<std::string>& tags() const { return tags_; }
  bool has_tag(std::string_view tag) const;
  void add_tag(std::string tag);

  /// Neighbours in graph order; nullptr at the ends.
  Node* prev() const;
  Node* next() const;

  /// True when the schema marks any argument as written (`Tensor(a!)`): in-place
  /// and out= ops, copy_, optimizer foreach ops.
  bool is_mutating() const;
  /// The Values this call writes in place: those passed where its schema
  /// marks the argument written (`Tensor(a!)`, each element of a
  /// `Tensor(a!)[]`), in argument order; empty for a functional call.
  std::vector<Value*> written() const;
  /// True for ops whose result depends on RNG state (dropout, rand*, bernoulli, ...).
  bool is_nondeterministic() const;

 private:
  friend class Graph;
  friend class Value;
  Node(Graph* g, NodeKind kind, std::string target) : graph_(g), kind_(kind), target_(std::move(target)) {}
  void add_uses();
  void drop_uses();

  Graph* graph_;
  NodeKind kind_;
  std::string target_;
  std::optional<c10::OperatorHandle> op_;
  std::vector<Argument> args_;
  std::vector<std::unique_ptr<Value>> results_;
  c10::IValue constant_;
  std::string source_;
  std::vector<std::string> tags_;
  std::list<std::unique_ptr<Node>>::iterator self_;
};

/// A graph: placeholders first, then constants and calls in topological
/// order, one output node last (once set_output was called).
///
/// New nodes go to the insertion point: before the output node by default;
/// InsertGuard moves it (FX's graph.inserting_before / inserting_after).
class Graph {
 public:
  Graph();
  ~Graph();
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  Graph(Graph&&) noexcept;
  Graph& operator=(Graph&&) noexcept;

  /// A deep copy; values keep their names. `map`, if given, receives old → new Values.
  Graph clone(std::unordered_map<const Value*, Value*>* map = nullptr) const;

  // --- building --------------------------------------------------------------

  /// Appends a tensor placeholder after the existing placeholders and records
  /// `spec` for it in the signature. Returns its Value.
  Value* add_placeholder(std::string_view name, TensorMeta meta, InputSpec spec = {});

  /// Adds a call to `op_name` ("aten::mm", "aten::add.Tensor") at the insertion
  /// point. `args` are the schema's arguments in order; trailing ones left out
  /// take the schema's defaults. `list_size` is the element count of a
  /// Tensor[] return (required if the schema has one). Result types come from
  /// the schema; tensor results need set_meta (the tracer and parser do that).
  /// Throws IrError if the operator is unknown, an argument is missing, or a
  /// Value belongs to another graph.
  Node* add_call(std::string_view op_name, std::vector<Argument> args, std::optional<size_t> list_size = {},
                 std::string_view name_hint = {});
  /// Same, with an operator already resolved.
  Node* add_call(const c10::OperatorHandle& op, std::vector<Argument> args, std::optional<size_t> list_size = {},
                 std::string_view name_hint = {});

  /// Adds a constant node producing `value` (a tensor: its meta is recorded).
  Value* add_constant(c10::IValue value, std::string_view name_hint = "_tensor_constant");

  /// Sets the graph outputs (creates or replaces the output node, always last)
  /// and resizes the signature's output specs, keeping existing ones.
  void set_output(std::vector<Value*> outputs);

  /// Erases a node whose results have no users. Throws IrError otherwise.
  void erase(Node* node);
  /// Moves a call node to just before `anchor` (a node of this graph, not a
  /// placeholder), keeping its results and their uses: schedules it
  /// elsewhere. The caller keeps the order valid (inputs before, users
  /// after; the verifier checks it). Throws IrError for a node of another
  /// graph or one that is not a call.
  void move_before(Node* node, Node* anchor);

  /// RAII: new nodes go before (or after) `anchor` while the guard lives.
  class InsertGuard {
   public:
    enum class Where { Before, After };
    InsertGuard(Graph& g, Node* anchor, Where where = Where::Before);
    ~InsertGuard();
    InsertGuard(const InsertGuard&) = delete;
    InsertGuard& operator=(const InsertGuard&) = delete;

   private:
    Graph& g_;
    Node* saved_;
  };

  // --- reading ---------------------------------------------------------------

  /// Iterates nodes in graph order as Node*.
  class NodeRange {
   public:
    using Base = std::list<std::unique_ptr<Node>>::const_iterator;
    class iterator {
     public:
      using iterator_category = std::bidirectional_iterator_tag;
      using value_type = Node*;
      using difference_type = std::ptrdiff_t;
      using pointer = Node**;
      using reference = Node*;
      iterator() = default;
      explicit iterator(Base it) : it_(it) {}
      Node* operator*() const { return it_->get(); }
      iterator& operator++() {
        ++it_;
        return *this;
      }
      iterator operator++(int) {
        auto t = *this;
        ++it_;
        return t;
      }
      iterator& operator--() {
        --it_;
        return *this;
      }
      bool operator==(const iterator& o) const { return it_ == o.it_; }

     private:
      Base it_;
    };
    NodeRange(Base b, Base e) : b_(b), e_(e) {}
    iterator begin() const { return iterator(b_); }
    iterator end() const { return iterator(e_); }

   private:
    Base b_, e_;
  };
  NodeRange nodes() const { return NodeRange(nodes_.begin(), nodes_.end()); }
  size_t num_nodes() const { return nodes_.size(); }

  /// Placeholder Values in order.
  std::vector<Value*> placeholders() const;
  /// The output node, or nullptr before set_output.
  Node* output_node() const { return output_; }
  /// The Values the output node returns (empty before set_output).
  std::vector<Value*> outputs() const;

  /// Looks a Value up by name (without '%'); nullptr if absent.
  Value* find_value(std::string_view name) const;

  GraphSignature& signature() { return signature_; }
  const GraphSignature& signature() const { return signature_; }

  /// A name not yet used in this graph, derived from `hint` the way FX does
  /// ("add", "add_1", ...). Hints are sanitized to [A-Za-z0-9_.].
  std::string unique_name(std::string_view hint);
  /// Renames a Value (the new name must be free). Used by the parser.
  void rename(Value* v, std::string_view name);

 private:
  friend class Value;
  friend class Node;
  Node* insert_node(std::unique_ptr<Node> n, bool placeholder);
  Value* add_result(Node* n, c10::TypePtr type, std::string_view name_hint);

  std::list<std::unique_ptr<Node>> nodes_;
  Node* insert_before_ = nullptr;  // nullptr: before the output node (or at the end)
  Node* output_ = nullptr;
  GraphSignature signature_;
  std::unordered_map<std::string, Value*> names_;
  std::unordered_map<std::string, size_t> name_counters_;
};

/// Whether each placeholder of `g` is written in place by some call (the
/// trailing copy_ nodes of a functional graph that keeps its input
/// mutations, an optimizer's in-place update), in placeholder order.
std::vector<bool> placeholders_written(const Graph& g);

/// Resolves "aten::add.Tensor" (or "aten::mm", empty overload) in the c10
/// dispatcher. Throws IrError naming the operator, with a hint when only the
/// overload is wrong.
c10::OperatorHandle resolve_operator(std::string_view op_name);

/// The full name of an operator as the text form prints it ("aten::add.Tensor").
std::string operator_name(const c10::OperatorHandle& op);

}  // namespace crucible::ir
