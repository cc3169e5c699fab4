#include <crucible/ir/error.h>
#include <crucible/ir/hash.h>

#include "describe.h"
#include "literal.h"

#include <ATen/ATen.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <bit>
#include <cstdio>
#include <cstring>
#include <string_view>
#include <unordered_map>

namespace crucible::ir {

namespace {

using detail::Literal;

// Bumped whenever the encoding below changes; see Note [Graph hash].
constexpr std::string_view kEncoding = "crucible.graph_hash/1";

// Tags that keep concatenations of fields unambiguous.
enum class Tag : uint8_t { Node = 1, Result, Arg, Value, ValueList, Constant, TensorData, Tags, Inputs, Outputs };

// Streams the encoding into XXH3-128: integers as 8 little-endian bytes,
// strings and lists length-prefixed. Fields are gathered in a buffer and
// hashed a block at a time (an XXH3 update per 8-byte field would cost more
// than the rest of the encoding).
class Encoder {
 public:
  Encoder() { XXH3_128bits_reset(&state_); }

  void u64(uint64_t v) {
    if (used_ + 8 > kBlock) flush();
    if constexpr (std::endian::native == std::endian::little) {
      std::memcpy(block_ + used_, &v, 8);
      used_ += 8;
    } else {
      for (int i = 0; i < 8; ++i) block_[used_++] = static_cast<unsigned char>(v >> (8 * i));
    }
  }
  void i64(int64_t v) { u64(static_cast<uint64_t>(v)); }
  void tag(Tag t) { u64(static_cast<uint64_t>(t)); }
  void str(std::string_view s) {
    u64(s.size());
    bytes(s.data(), s.size());
  }
  void ints(const std::vector<int64_t>& v) {
    u64(v.size());
    for (int64_t x : v) i64(x);
  }
  void bytes(const void* p, size_t n) {
    if (used_ + n > kBlock) flush();
    if (n > kBlock) {
      XXH3_128bits_update(&state_, p, n);
      return;
    }
    std::memcpy(block_ + used_, p, n);
    used_ += n;
  }

  GraphHash digest() {
    flush();
    const XXH128_hash_t h = XXH3_128bits_digest(&state_);
    return GraphHash{h.high64, h.low64};
  }

 private:
  static constexpr size_t kBlock = 4096;
  void flush() {
    XXH3_128bits_update(&state_, block_, used_);
    used_ = 0;
  }
  XXH3_state_t state_;
  unsigned char block_[kBlock];
  size_t used_ = 0;
};

// `ints` off: an integer counts by its kind alone (HashOptions::sizes).
void encode(Encoder& e, const Literal& l, bool ints) {
  e.u64(static_cast<uint64_t>(l.kind));
  switch (l.kind) {
    case Literal::Kind::None:
      break;
    case Literal::Kind::Bool:
      e.u64(l.b);
      break;
    case Literal::Kind::Int:
      if (ints) e.i64(l.i);
      break;
    case Literal::Kind::Float:
      e.u64(std::bit_cast<uint64_t>(l.f));
      e.u64(l.single);
      break;
    case Literal::Kind::String:
    case Literal::Kind::Name:
    case Literal::Kind::Value:
      e.str(l.s);
      break;  // no Value literal reaches here (see Hasher::arg)
    case Literal::Kind::List:
      e.u64(l.items.size());
      for (const Literal& item : l.items) encode(e, item, ints);
      break;
  }
}

// The device as hashed: with its index, or its type alone (HashOptions).
c10::Device hashed(const c10::Device& d, const HashOptions& o) { return o.device_index ? d : c10::Device(d.type()); }

void encode(Encoder& e, const TensorMeta& m, const HashOptions& o) {
  if (o.sizes) {
    e.ints(m.sizes);
    e.ints(m.strides);
    e.i64(m.storage_offset);
  } else {
    e.u64(m.sizes.size());
  }
  e.str(c10::toString(m.dtype));
  e.str(hashed(m.device, o).str());
  e.u64(m.requires_grad);
}

class Hasher {
 public:
  Hasher(const Graph& g, const HashOptions& o) : g_(g), o_(o) {}

  GraphHash run() {
    e_.str(kEncoding);
    for (const Node* n : g_.nodes()) {
      try {
        node(n);
      } catch (const IrError& err) {
        throw IrError("graph_hash: " + detail::describe(n) + ": " + err.what());
      }
    }
    signature();
    return e_.digest();
  }

 private:
  void value(const Value* v) {
    auto it = index_.find(v);
    if (it == index_.end()) throw IrError("argument %" + v->name() + " is not defined before its use");
    e_.u64(it->second);
  }

  void arg(const Argument& a, const c10::Argument& formal) {
    e_.tag(Tag::Arg);
    if (a.is_value()) {
      e_.tag(Tag::Value);
      value(a.value());
    } else if (a.is_value_list()) {
      e_.tag(Tag::ValueList);
      e_.u64(a.value_list().size());
      for (const Value* v : a.value_list()) {
        e_.u64(v != nullptr);
        if (v) value(v);
      }
    } else {
      e_.tag(Tag::Constant);
      try {
        const c10::IValue& c = a.constant();
        encode(e_, detail::literal_of(c.isDevice() ? c10::IValue(hashed(c.toDevice(), o_)) : c, formal.real_type()),
               o_.sizes);
      } catch (const IrError& err) {
        throw IrError("argument '" + formal.name() + "': " + err.what());
      }
    }
  }

  void constant(const Node* n) {
    const c10::IValue& c = n->constant_value();
    if (!c.isTensor()) {
      e_.tag(Tag::Constant);
      encode(e_, detail::literal_of(c, n->result()->type()), o_.sizes);
      return;
    }
    e_.tag(Tag::TensorData);
    const at::Tensor& t = c.toTensor();
    encode(e_, TensorMeta::of(t), o_);
    if (t.is_meta()) {
      e_.u64(0);
      return;
    }
    const at::Tensor data = t.detach().cpu().resolve_conj().resolve_neg().contiguous();
    e_.u64(data.nbytes());
    e_.bytes(data.const_data_ptr(), data.nbytes());
  }

  void node(const Node* n) {
    e_.tag(Tag::Node);
    e_.u64(static_cast<uint64_t>(n->kind()));
    switch (n->kind()) {
      case NodeKind::Placeholder:
        break;  // its InputSpec is hashed with the signature
      case NodeKind::Call: {
        e_.str(n->target());
        const auto& formals = n->schema().arguments();
        e_.u64(n->args().size());
        for (size_t i = 0; i < n->args().size(); ++i) arg(n->arg(i), formals[i]);
        break;
      }
      case NodeKind::Constant:
        constant(n);
        break;
      case NodeKind::Output:
        e_.u64(n->args().size());
        for (const Argument& a : n->args()) value(a.value());
        break;
    }
    e_.u64(n->num_results());
    for (const auto& r : n->results()) {
      e_.tag(Tag::Result);
      e_.str(r->is_tensor() ? std::string("Tensor") : r->type()->str());
      e_.u64(r->has_meta());
      if (r->has_meta()) encode(e_, r->meta(), o_);
      index_.emplace(r.get(), index_.size());
    }
    e_.tag(Tag::Tags);
    e_.u64(n->tags().size());
    for (const std::string& t : n->tags()) e_.str(t);
  }

  void signature() {
    const GraphSignature& sig = g_.signature();
    const size_t num_placeholders = g_.placeholders().size();
    auto placeholder_index = [&](const std::optional<size_t>& i) {
      if (i && *i >= num_placeholders)
        throw IrError("graph_hash: the signature refers to placeholder " + std::to_string(*i) + ", the graph has " +
                      std::to_string(num_placeholders));
      e_.i64(i ? static_cast<int64_t>(*i) : -1);
    };
    e_.tag(Tag::Inputs);
    e_.u64(sig.inputs.size());
    for (const InputSpec& in : sig.inputs) {
      e_.str(to_string(in.kind));
      e_.str(in.target);
      placeholder_index(in.duplicate_of);
    }
    e_.tag(Tag::Outputs);
    e_.u64(sig.outputs.size());
    for (const OutputSpec& out : sig.outputs) {
      e_.str(to_string(out.kind));
      placeholder_index(out.input_index);
    }
  }

  const Graph& g_;
  const HashOptions& o_;
  Encoder e_;
  std::unordered_map<const Value*, uint64_t> index_;
};

}  // namespace

std::string GraphHash::hex() const {
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(high),
                static_cast<unsigned long long>(low));
  return std::string(buf, 32);
}

GraphHash graph_hash(const Graph& graph, const HashOptions& options) { return Hasher(graph, options).run(); }

}  // namespace crucible::ir
