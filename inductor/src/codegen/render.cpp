// The ops handler both renderers write loop bodies with (CBody), and the
// assembly of a row group's pieces: see codegen/render.h.
#include "codegen/render.h"

#include <cctype>

namespace crucible::inductor::detail {

Val CBody::load(int b, const std::vector<Expr>& index) {
  const Buffer& buf = p_.buffers[b];
  std::string T = ctype_of(buf.dtype);
  if (buf.host_scalar) return {arg(b), 0};  // a kernel parameter, by value
  // A value made once per outer index is read back as its local, also
  // where it reaches memory too: on a GPU other threads of the block may
  // not see that store yet.
  if (auto it = locals_.find(b); it != locals_.end() && info_.produced.contains(b)) return it->second;
  if (info_.produced.contains(b) && !info_.external.contains(b)) {
    const Loop& l = p_.loops[buf.loop];
    if (stage_of(l, g_) == Stage::Inner) {
      Expr flat = iteration_position(p_, b, index);
      Expr at = mod(flat, g_.inner_size);
      // The thread's own element of a persistent row: still in a register.
      if (auto it = row_locals_.find(b); it != row_locals_.end() && at.str() == row_element_) return it->second;
      return guarded(scratch(b) + "[" + at.str() + "]", level_of(at), T, /*memory=*/false);
    }
    return locals_.at(b);
  }
  // A buffer this group writes is read back no earlier than the outer
  // iteration that wrote it.
  Expr storage = dot(index, spelled_strides(buf));
  int level = std::max(level_of(storage), info_.produced.contains(b) ? 1 : 0);
  // A mask that may change within a vector makes the load one element's.
  const Val* m = mask();
  if (level == 2 && width_ > 1 && !(m && m->level == 2)) {
    if (std::optional<Expr> base = vector_base(storage)) {
      const std::string key = "vector " + (m ? m->name + " " : "") + arg(b) + "[" + base->str() + "]";
      const int vlevel = std::max({level_of(*base), info_.produced.contains(b) ? 1 : 0, m ? m->level : 0});
      auto [it, fresh] = cache_[vlevel].emplace(key, "v" + std::to_string(counter_));
      if (fresh) {
        ++counter_;
        // Masked: the whole vector or none of it, zeros then.
        vector_lines(vlevel) += vector_decl(b, it->second, m != nullptr) + (m ? "if (" + m->name + ") " : "") +
                                "crucible_move_vector<" + std::to_string(width_) + ">(" + it->second + ", " + arg(b) +
                                " + " + base->str() + ", crucible_aligned);\n";
      }
      return compute(from_storage(buf.dtype, it->second + "[" + lane_ + "]"), 2, T);
    }
  }
  return guarded(from_storage(buf.dtype, arg(b) + "[" + storage.str() + "]"), level, T);
}

std::string CBody::store(int b, const Expr& at, const std::string& value) {
  if (width_ > 1 && level_of(at) == 2) {
    if (std::optional<Expr> base = vector_base(at)) {
      const std::string name = "s" + std::to_string(counter_++);
      vector_lines(std::max(level_of(*base), 1)) += vector_decl(b, name);
      after_ += "crucible_move_vector<" + std::to_string(width_) + ">(" + arg(b) + " + " + base->str() + ", " + name +
                ", crucible_aligned);\n";
      return name + "[" + lane_ + "] = " + to_storage(p_.buffers[b].dtype, value) + ";\n";
    }
  }
  return arg(b) + "[" + at.str() + "] = " + to_storage(p_.buffers[b].dtype, value) + ";\n";
}

Val CBody::compute(const std::string& expr, int level, const std::string& ctype) {
  auto& cache = cache_[level];
  if (auto it = cache.find(expr); it != cache.end()) return {it->second, level};
  std::string name = "t" + std::to_string(counter_++);
  cache.emplace(expr, name);
  lines_[level] += "const " + ctype + " " + name + " = " + expr + ";\n";
  if (level == 2) defs_.push_back({name, ctype, expr, loads_.contains(expr)});
  return {name, level};
}

void CBody::stored(int b) {
  auto it = arg_names_.find(b);
  if (it == arg_names_.end()) return;
  // Anywhere in the text: a load may be wrapped in a conversion.
  const std::string prefix = it->second + "[";
  for (auto& cache : cache_)
    std::erase_if(cache, [&](const auto& kv) { return kv.first.find(prefix) != std::string::npos; });
}

std::string CBody::take(int level) {
  std::string s = std::move(lines_[level]);
  lines_[level].clear();
  if (level == 2 && !keep_inner_) cache_[2].clear();
  return s;
}

std::string CBody::take_inner() {
  std::string s = take(1) + take(2);
  cache_[1].clear();
  return s;
}

const std::string& CBody::arg(int b) {
  if (auto it = arg_names_.find(b); it != arg_names_.end()) return it->second;
  args.push_back(b);
  return arg_names_.emplace(b, p_.buffers[b].name).first->second;
}

std::string CBody::scratch(int b) {
  scratch_.insert(b);
  return "row_" + p_.buffers[b].name;
}

Val CBody::guarded(const std::string& access, int level, const std::string& T, bool memory) {
  std::string expr = access;
  if (const Val* m = mask()) {
    expr = "(" + m->name + " ? " + access + " : " + T + "(0))";
    level = std::max(level, m->level);
  }
  if (memory && level == 2) loads_.insert(expr);
  return compute(expr, level, T);
}

std::optional<Expr> CBody::vector_base(const Expr& at) const {
  if (mod(at, width_).str() != lane_) return std::nullopt;
  Expr base = at + Expr::var(lane_, width_) * -1;
  if (base.uses(lane_)) return std::nullopt;
  return base;
}

std::string CBody::vector_decl(int b, const std::string& name, bool zeroed) {
  const std::string& a = arg(b);
  if (std::find(vector_args_.begin(), vector_args_.end(), a) == vector_args_.end()) vector_args_.push_back(a);
  return "__align__(16) " + storage_ctype_of(p_.buffers[b].dtype) + " " + name + "[" + std::to_string(width_) + "]" +
         (zeroed ? " = {}" : "") + ";\n";
}

std::string indent(const std::string& text, int spaces) {
  std::string pad(spaces, ' '), out;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    if (end > start) out += pad + text.substr(start, end - start);
    out += "\n";
    start = end + 1;
  }
  return out;
}

std::string substitute(const std::string& finalize, const std::string& acc) {
  std::string out;
  for (char c : finalize) out += c == '$' ? acc : std::string(1, c);
  return out;
}

std::string column_epilogue(CBody& body, const Program& p, const Group& g, const GroupInfo& info, const std::string& T,
                            const std::string& value) {
  const Loop& red = p.loops[g.loops.front()];
  const std::string red_name = "red_" + p.buffers[red.buffer].name;
  std::string epilogue = "const " + T + " " + red_name + " = " + value + ";\n";
  const Expr o = Expr::var("o", g.outer);
  if (info.external.contains(red.buffer)) epilogue += body.store(red.buffer, store_offset(p, red, o), red_name);
  body.set_local(red.buffer, red_name);
  for (size_t k = 1; k < g.loops.size(); ++k) {
    const Loop& l = p.loops[g.loops[k]];
    Val e = body_value(body, l, g.outer_size, g.inner_size);
    epilogue += body.take_inner();
    if (info.external.contains(l.buffer)) epilogue += body.store(l.buffer, store_offset(p, l, o), e.name);
    body.set_local(l.buffer, e.name);
  }
  return epilogue;
}

namespace {
// Whether `text` names `name` as a whole identifier.
bool mentions(const std::string& text, const std::string& name) {
  auto word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  for (size_t at = text.find(name); at != std::string::npos; at = text.find(name, at + 1)) {
    const size_t after = at + name.size();
    if ((at == 0 || !word(text[at - 1])) && (after == text.size() || !word(text[after]))) return true;
  }
  return false;
}
}  // namespace

std::vector<std::vector<bool>> read_later(const std::vector<RowPiece>& pieces) {
  std::vector<std::vector<bool>> kept(pieces.size());
  for (size_t i = 0; i < pieces.size(); ++i) {
    kept[i].resize(pieces[i].defs.size());
    for (size_t d = 0; d < pieces[i].defs.size(); ++d)
      for (size_t k = i + 1; k < pieces.size() && !kept[i][d]; ++k)
        kept[i][d] = pieces[k].over_row && mentions(pieces[k].text, pieces[i].defs[d].name);
  }
  return kept;
}

std::vector<CBody::Def> kept_defs(const std::vector<RowPiece>& pieces, const std::vector<std::vector<bool>>& kept) {
  std::vector<CBody::Def> defs;
  for (size_t i = 0; i < pieces.size(); ++i)
    for (size_t d = 0; d < pieces[i].defs.size(); ++d)
      if (kept[i][d]) defs.push_back(pieces[i].defs[d]);
  return defs;
}

std::string with_kept_values(const std::vector<RowPiece>& pieces, const std::vector<std::vector<bool>>& kept, size_t k,
                             const std::function<KeptSlot(const CBody::Def&)>& slot) {
  std::string text;
  for (size_t i = 0; i < k; ++i)
    for (size_t d = 0; d < pieces[i].defs.size(); ++d) {
      const CBody::Def& def = pieces[i].defs[d];
      if (kept[i][d] && mentions(pieces[k].text, def.name))
        text += "const " + def.ctype + " " + def.name + " = " + slot(def).read + ";\n";
    }
  text += pieces[k].text;
  for (size_t d = 0; d < pieces[k].defs.size(); ++d) {
    const CBody::Def& def = pieces[k].defs[d];
    if (!kept[k][d]) continue;
    const std::string write = slot(def).write;
    if (!write.empty()) text += write + " = " + def.name + ";\n";
  }
  return text;
}

}  // namespace crucible::inductor::detail
