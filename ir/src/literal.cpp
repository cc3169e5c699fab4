#include "literal.h"

#include <crucible/ir/error.h>

#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <array>
#include <charconv>
#include <cmath>
#include <utility>

namespace crucible::ir::detail {

namespace {

// Python's spellings (torch.strided, torch.channels_last, ...), in enum order.
constexpr std::array<std::string_view, 8> kLayouts{"strided",    "sparse_coo", "sparse_csr", "mkldnn",
                                                   "sparse_csc", "sparse_bsr", "sparse_bsc", "jagged"};
constexpr std::array<std::string_view, 4> kMemoryFormats{"contiguous_format", "preserve_format", "channels_last",
                                                         "channels_last_3d"};

template <size_t N>
Literal enum_name(const std::array<std::string_view, N>& names, int64_t v) {
  if (v >= 0 && static_cast<size_t>(v) < N) return Literal::of(Literal::Kind::Name, std::string(names[v]));
  return Literal::of_int(v);
}

template <size_t N>
std::optional<int64_t> enum_value(const std::array<std::string_view, N>& names, std::string_view s) {
  for (size_t i = 0; i < N; ++i)
    if (names[i] == s) return static_cast<int64_t>(i);
  return std::nullopt;
}

c10::TypePtr strip_optional(const c10::TypePtr& t) {
  if (auto o = t->cast<c10::OptionalType>()) return o->getElementType();
  return t;
}

[[noreturn]] void mismatch(const Literal& l, const std::string& expected) {
  throw BuildError("expected " + expected + ", got " + describe(l), l.line, l.column);
}

bool is_word(const Literal& l) { return l.kind == Literal::Kind::Name || l.kind == Literal::Kind::String; }

// The JSON form writes non-finite floats as the strings "nan", "inf", "-inf".
std::optional<double> non_finite(const Literal& l) {
  if (l.kind != Literal::Kind::String) return std::nullopt;
  if (l.s == "nan") return std::nan("");
  if (l.s == "inf") return HUGE_VAL;
  if (l.s == "-inf") return -HUGE_VAL;
  return std::nullopt;
}

double as_double(const Literal& l) {
  if (l.kind == Literal::Kind::Float) return l.f;
  if (l.kind == Literal::Kind::Int) return static_cast<double>(l.i);
  if (auto v = non_finite(l)) return *v;
  mismatch(l, "a float");
}

int64_t as_int(const Literal& l) {
  if (l.kind != Literal::Kind::Int) mismatch(l, "an int");
  return l.i;
}

bool as_bool(const Literal& l) {
  if (l.kind != Literal::Kind::Bool) mismatch(l, "True or False");
  return l.b;
}

const std::vector<Literal>& as_list(const Literal& l, const c10::TypePtr& type) {
  if (l.kind != Literal::Kind::List) mismatch(l, "a list (" + type->str() + ")");
  return l.items;
}

Value* lookup(const Literal& l, const Graph& g) {
  Value* v = g.find_value(l.s);
  if (!v) throw BuildError("undefined value %" + l.s, l.line, l.column);
  return v;
}

}  // namespace

std::string describe(const Literal& l) {
  switch (l.kind) {
    case Literal::Kind::None:
      return "None";
    case Literal::Kind::Bool:
      return l.b ? "True" : "False";
    case Literal::Kind::Int:
      return "int " + std::to_string(l.i);
    case Literal::Kind::Float: {
      std::string s = "float ";
      append_float(s, l.f, l.single);
      return s;
    }
    case Literal::Kind::String:
      return "string \"" + l.s + "\"";
    case Literal::Kind::Name:
      return "'" + l.s + "'";
    case Literal::Kind::Value:
      return "value %" + l.s;
    case Literal::Kind::List:
      return "a list";
  }
  return "?";
}

bool is_tensor_slot(const c10::TypePtr& type) {
  auto t = strip_optional(type);
  if (auto list = t->cast<c10::ListType>()) t = strip_optional(list->getElementType());
  return t->kind() == c10::TypeKind::TensorType;
}

// --- constants ----------------------------------------------------------------

Literal literal_of(const c10::IValue& v, const c10::TypePtr& type) {
  const auto t = strip_optional(type);
  // An undefined tensor is how ATen passes None for a Tensor argument that
  // is not optional (flash attention's backward takes cum_seq_q so).
  if (v.isNone() || (v.isTensor() && !v.toTensor().defined())) return Literal::none();
  if (v.isBool()) return Literal::of_bool(v.toBool());
  if (v.isInt()) {
    const int64_t i = v.toInt();
    switch (t->kind()) {
      case c10::TypeKind::ScalarTypeType:
        if (i >= 0 && i < static_cast<int64_t>(c10::ScalarType::NumOptions)) {
          try {
            return Literal::of(Literal::Kind::Name, std::string(dtype_short_name(static_cast<c10::ScalarType>(i))));
          } catch (const IrError&) {  // a dtype without a short name prints as its number
          }
        }
        return Literal::of_int(i);
      case c10::TypeKind::LayoutType:
        return enum_name(kLayouts, i);
      case c10::TypeKind::MemoryFormatType:
        return enum_name(kMemoryFormats, i);
      default:
        return Literal::of_int(i);
    }
  }
  if (v.isSymInt()) {
    if (auto i = v.toSymInt().maybe_as_int()) return Literal::of_int(*i);
    throw IrError("a symbolic int has no text form; only concrete ints print");
  }
  if (v.isDouble()) return Literal::of_float(v.toDouble());
  if (v.isString()) return Literal::of(Literal::Kind::String, v.toStringRef());
  if (v.isDevice()) return Literal::of(Literal::Kind::Name, v.toDevice().str());
  if (v.isList()) {
    const auto list = t->cast<c10::ListType>();
    const c10::TypePtr elem = list ? list->getElementType() : c10::AnyType::get();
    Literal l;
    l.kind = Literal::Kind::List;
    for (const c10::IValue& e : v.toListRef()) l.items.push_back(literal_of(e, elem));
    return l;
  }
  throw IrError("a constant of type " + v.type()->str() + " has no text form" +
                (v.isTensor() ? "; add tensors to the graph with Graph::add_constant" : ""));
}

c10::IValue ivalue_of(const Literal& l, const c10::TypePtr& type) {
  c10::TypePtr t = type;
  if (auto o = type->cast<c10::OptionalType>()) {
    if (l.kind == Literal::Kind::None) return {};
    t = o->getElementType();
  }
  switch (t->kind()) {
    case c10::TypeKind::NoneType:
      if (l.kind != Literal::Kind::None) mismatch(l, "None");
      return {};
    case c10::TypeKind::IntType:
    case c10::TypeKind::SymIntType:
      return as_int(l);
    case c10::TypeKind::FloatType:
      return as_double(l);
    case c10::TypeKind::BoolType:
      return as_bool(l);
    case c10::TypeKind::NumberType:
      if (l.kind == Literal::Kind::Int) return l.i;
      if (l.kind == Literal::Kind::Bool) return l.b;
      if (l.kind == Literal::Kind::Float || non_finite(l)) return as_double(l);
      mismatch(l, "a Scalar (int, float or bool)");
    case c10::TypeKind::StringType:
      if (l.kind != Literal::Kind::String) mismatch(l, "a string");
      return l.s;
    case c10::TypeKind::ScalarTypeType:
      if (l.kind == Literal::Kind::Int) return l.i;
      if (is_word(l))
        if (auto d = dtype_from_short_name(l.s)) return *d;
      mismatch(l, "a dtype (f32, f64, f16, bf16, i64, i32, i16, i8, u8, b8, ...)");
    case c10::TypeKind::LayoutType:
      if (l.kind == Literal::Kind::Int) return l.i;
      if (is_word(l))
        if (auto v = enum_value(kLayouts, l.s)) return *v;
      mismatch(l, "a layout (strided, sparse_coo, sparse_csr, ...)");
    case c10::TypeKind::MemoryFormatType:
      if (l.kind == Literal::Kind::Int) return l.i;
      if (is_word(l))
        if (auto v = enum_value(kMemoryFormats, l.s)) return *v;
      mismatch(l, "a memory format (contiguous_format, preserve_format, channels_last, channels_last_3d)");
    case c10::TypeKind::DeviceObjType:
      if (!is_word(l)) mismatch(l, "a device (cpu, cuda:0, ...)");
      try {
        return c10::Device(l.s);
      } catch (const c10::Error&) {
        mismatch(l, "a device (cpu, cuda:0, ...)");
      }
    case c10::TypeKind::ListType: {
      const auto& items = as_list(l, t);
      const auto elem = t->castRaw<c10::ListType>()->getElementType();
      switch (elem->kind()) {
        case c10::TypeKind::IntType:
        case c10::TypeKind::SymIntType: {
          c10::List<int64_t> r;
          for (const auto& e : items) r.push_back(as_int(e));
          return r;
        }
        case c10::TypeKind::FloatType: {
          c10::List<double> r;
          for (const auto& e : items) r.push_back(as_double(e));
          return r;
        }
        case c10::TypeKind::BoolType: {
          c10::List<bool> r;
          for (const auto& e : items) r.push_back(as_bool(e));
          return r;
        }
        default: {
          c10::impl::GenericList r(elem);
          for (const auto& e : items) r.push_back(ivalue_of(e, elem));
          return r;
        }
      }
    }
    default:
      throw BuildError("constants of type " + type->str() + " have no text form", l.line, l.column);
  }
}

c10::TypePtr constant_type(std::string_view name) {
  static const std::array<c10::TypePtr, 10> types{
      c10::IntType::get(),       c10::FloatType::get(),     c10::BoolType::get(),    c10::StringType::get(),
      c10::DeviceObjType::get(), c10::NoneType::get(),      c10::ListType::ofInts(), c10::ListType::ofFloats(),
      c10::ListType::ofBools(),  c10::ListType::ofStrings()};
  for (const auto& t : types)
    if (t->str() == name) return t;
  return nullptr;
}

// --- arguments ------------------------------------------------------------------

Literal literal_of(const Argument& a, const c10::Argument& formal) {
  if (a.is_value()) return Literal::of(Literal::Kind::Value, a.value()->name());
  if (a.is_value_list()) {
    Literal l;
    l.kind = Literal::Kind::List;
    for (Value* v : a.value_list())
      l.items.push_back(v ? Literal::of(Literal::Kind::Value, v->name()) : Literal::none());
    return l;
  }
  try {
    return literal_of(a.constant(), formal.real_type());
  } catch (const IrError& e) {
    throw IrError("argument '" + formal.name() + "': " + e.what());
  }
}

Argument argument_of(const Literal& l, const c10::Argument& formal, const Graph& g) {
  const auto& type = formal.type();
  try {
    if (!is_tensor_slot(type)) {
      // A Value may stand for a whole non-tensor argument (an int a sym_size produced).
      if (l.kind == Literal::Kind::Value) return lookup(l, g);
      return ivalue_of(l, formal.real_type());
    }
    const bool optional = type->kind() == c10::TypeKind::OptionalType;
    if (l.kind == Literal::Kind::None && optional) return c10::IValue();
    const auto list = strip_optional(type)->cast<c10::ListType>();
    if (!list && l.kind == Literal::Kind::None) return c10::IValue(at::Tensor());  // see literal_of
    if (!list) {
      if (l.kind != Literal::Kind::Value)
        mismatch(l, std::string("a tensor value (%name)") + (optional ? " or None" : ""));
      return lookup(l, g);
    }
    const bool optional_items = list->getElementType()->kind() == c10::TypeKind::OptionalType;
    Argument::ValueList vs;
    vs.reserve(as_list(l, type).size());
    for (const Literal& e : l.items) {
      if (e.kind == Literal::Kind::None && optional_items) {
        vs.push_back(nullptr);
      } else {
        if (e.kind != Literal::Kind::Value)
          mismatch(e, std::string("a tensor value (%name)") + (optional_items ? " or None" : ""));
        vs.push_back(lookup(e, g));
      }
    }
    return vs;
  } catch (const BuildError& e) {
    throw BuildError("argument '" + formal.name() + "' (" + formal.real_type()->str() + "): " + e.what(), e.line,
                     e.column);
  }
}

// --- tensor constants -----------------------------------------------------------

Literal tensor_data(const at::Tensor& t) {
  const auto dtype = t.scalar_type();
  at::Tensor c = t.detach().cpu().contiguous();
  Literal l;
  l.kind = Literal::Kind::List;
  l.items.reserve(c.numel());
  if (dtype == at::kBool) {
    const bool* p = c.data_ptr<bool>();
    for (int64_t k = 0; k < c.numel(); ++k) l.items.push_back(Literal::of_bool(p[k]));
  } else if (c10::isIntegralType(dtype, /*includeBool=*/false)) {
    c = c.to(at::kLong);
    const int64_t* p = c.data_ptr<int64_t>();
    for (int64_t k = 0; k < c.numel(); ++k) l.items.push_back(Literal::of_int(p[k]));
  } else if (dtype == at::kDouble) {
    const double* p = c.data_ptr<double>();
    for (int64_t k = 0; k < c.numel(); ++k) l.items.push_back(Literal::of_float(p[k]));
  } else if (c10::isFloatingType(dtype)) {  // float32 and narrower: exact as float32
    c = c.to(at::kFloat);
    const float* p = c.data_ptr<float>();
    for (int64_t k = 0; k < c.numel(); ++k) {
      l.items.push_back(Literal::of_float(p[k]));
      l.items.back().single = true;
    }
  } else {
    throw IrError(std::string("tensor constants of dtype ") + c10::toString(dtype) + " have no text form");
  }
  return l;
}

namespace {
float read_single(const Literal& e) {
  if (e.kind == Literal::Kind::Float && !e.s.empty()) {
    // Read the text as float32 directly: text -> double -> float may round twice.
    float v = 0;
    auto r = std::from_chars(e.s.data(), e.s.data() + e.s.size(), v);
    if (r.ec == std::errc()) return v;
  }
  return static_cast<float>(as_double(e));
}

template <typename T, typename F>
at::Tensor fill(const std::vector<Literal>& items, c10::ScalarType dtype, F read) {
  at::Tensor t = at::empty({static_cast<int64_t>(items.size())}, at::TensorOptions().dtype(dtype));
  T* p = t.data_ptr<T>();
  for (const Literal& e : items) *p++ = read(e);
  return t;
}
}  // namespace

at::Tensor make_tensor(const Literal& data, const TensorMeta& meta) {
  const auto options = at::TensorOptions().dtype(meta.dtype);
  at::Tensor src;
  if (data.kind == Literal::Kind::None) {
    if (!meta.device.is_meta())
      throw BuildError("a tensor constant needs its data (only meta tensors go without)", data.line, data.column);
  } else {
    const auto& items = data.items;
    if (data.kind != Literal::Kind::List) mismatch(data, "the tensor's data as a list");
    if (static_cast<int64_t>(items.size()) != meta.numel())
      throw BuildError("the tensor constant has " + std::to_string(meta.numel()) + " elements, the data lists " +
                           std::to_string(items.size()),
                       data.line, data.column);
    if (meta.dtype == at::kBool) {
      src = fill<bool>(items, at::kBool, as_bool);
    } else if (c10::isIntegralType(meta.dtype, false)) {
      src = fill<int64_t>(items, at::kLong, as_int).to(meta.dtype);
    } else if (meta.dtype == at::kDouble) {
      src = fill<double>(items, at::kDouble, as_double);
    } else if (c10::isFloatingType(meta.dtype)) {
      src = fill<float>(items, at::kFloat, read_single).to(meta.dtype);
    } else {
      throw BuildError(std::string("tensor constants of dtype ") + c10::toString(meta.dtype) + " have no text form",
                       data.line, data.column);
    }
  }
  // Lay the elements out with the recorded strides and offset: scatter them
  // into a zeroed storage at the positions the strides give (overlapping
  // strides such as an expand's 0 are fine), then view it.
  int64_t storage = meta.storage_offset + (meta.numel() > 0 ? 1 : 0);
  for (size_t d = 0; d < meta.sizes.size(); ++d)
    if (meta.sizes[d] > 0) storage += (meta.sizes[d] - 1) * meta.strides.at(d);
  at::Tensor base;
  if (!src.defined()) {
    base = at::empty({storage}, options.device(meta.device));
  } else {
    base = at::zeros({storage}, options);
    const at::Tensor positions = at::arange(storage, at::TensorOptions().dtype(at::kLong))
                                     .as_strided(meta.sizes, meta.strides, meta.storage_offset);
    c10::List<std::optional<at::Tensor>> index;
    index.push_back(positions.reshape({-1}));
    base.index_put_(index, src);
    try {
      base = base.to(meta.device);
    } catch (const c10::Error& e) {
      throw BuildError("cannot place the tensor constant on " + meta.device.str() + ": " + e.what_without_backtrace(),
                       data.line, data.column);
    }
  }
  at::Tensor t = base.as_strided(meta.sizes, meta.strides, meta.storage_offset);
  if (meta.requires_grad) t.requires_grad_(true);
  return t;
}

void append_float(std::string& out, double v, bool single) {
  if (std::isnan(v)) {
    out += "nan";
    return;
  }
  if (std::isinf(v)) {
    out += v < 0 ? "-inf" : "inf";
    return;
  }
  char buf[64];
  auto r =
      single ? std::to_chars(buf, buf + sizeof buf, static_cast<float>(v)) : std::to_chars(buf, buf + sizeof buf, v);
  const std::string_view s(buf, r.ptr - buf);
  out += s;
  if (s.find_first_of(".e") == std::string_view::npos) out += ".0";
}

}  // namespace crucible::ir::detail
