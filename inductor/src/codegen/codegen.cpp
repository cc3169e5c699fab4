// The code generator's driver: see codegen/codegen.h.
#include "codegen/codegen.h"

#include "codecache/cpp_builder.h"
#include "codegen/cpp.h"
#include "codegen/cuda.h"
#include "codegen/preludes.h"
#include "lowering/lowering.h"
#include "scheduler.h"

#include <algorithm>
#include <cctype>
#include <unordered_map>
#include <unordered_set>
#include <utility>

namespace crucible::inductor::detail {

namespace {

// The most kernels one combined launch takes (its parameters stay far
// below CUDA's limit on a kernel's parameter bytes).
constexpr size_t kMaxCombined = 24;

// Note [Identical kernels]
// A transformer's layers fuse into the same kernels over other buffers:
// GPT-2 small's training step (core decompositions) renders 320 CUDA
// kernels of 38 distinct bodies. As TorchInductor names a kernel by its
// source and defines each source once (the wrapper's src_to_kernel), a
// kernel whose text equals an earlier one's up to its name and its
// buffers' names is not rendered again: its signature takes the earlier
// kernel's name, and the source keeps only its comment, saying whose code
// it runs. Buffers are passed by position, and the text spells out every
// size, stride, dtype and constant, so equal text is the same computation
// on the arguments given. NVRTC and the C++ compiler then see each body
// once.
//
// `text` with the kernel's names (its own and its variants', Note
// [Autotuning] in codegen/cuda.cpp) and every buffer name of `p` in it
// replaced by a position (buffers numbered in order of first appearance),
// so that two kernels compare equal exactly when they differ only there.
// Buffer names are "buf<index>_<value>" (Lowerer::add_buffer), and derived
// identifiers (red_<buffer>, row_<buffer>) contain them whole: a
// left-to-right scan that replaces the full name found at each "buf<digits>_"
// consumes each name once.
std::string canonical_kernel_text(const Program& p, const std::string& text, const std::vector<std::string>& names) {
  std::string out;
  out.reserve(text.size());
  std::unordered_map<size_t, size_t> position;
  auto ident = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  auto name_at = [&](size_t i) -> size_t {  // which of `names` starts at i, as a whole identifier
    if (i > 0 && ident(text[i - 1])) return names.size();
    for (size_t k = 0; k < names.size(); ++k) {
      const std::string& name = names[k];
      if (text.compare(i, name.size(), name) == 0 && (i + name.size() == text.size() || !ident(text[i + name.size()])))
        return k;
    }
    return names.size();
  };
  for (size_t i = 0; i < text.size();) {
    if (const size_t k = name_at(i); k < names.size()) {
      out += "\x01K" + std::to_string(k) + "\x01";
      i += names[k].size();
      continue;
    }
    if (text.compare(i, 3, "buf") == 0) {
      size_t j = i + 3, index = 0;
      while (j < text.size() && std::isdigit(static_cast<unsigned char>(text[j])))
        index = index * 10 + (text[j++] - '0');
      if (j > i + 3 && j < text.size() && text[j] == '_' && index < p.buffers.size() &&
          text.compare(i, p.buffers[index].name.size(), p.buffers[index].name) == 0) {
        out += "\x01B" + std::to_string(position.emplace(index, position.size()).first->second) + "\x01";
        i += p.buffers[index].name.size();
        continue;
      }
    }
    out += text[i++];
  }
  return out;
}

}  // namespace

Schedule compile_schedule(const ir::Graph& graph, int threads, const SizeTable& sizes) {
  const SizeScope scope(sizes);
  Schedule s;
  s.program = lower(graph);
  Program& p = s.program;
  Fusion fusion = fuse(p, graph);
  s.groups = std::move(fusion.groups);
  s.steps = std::move(fusion.steps);
  std::vector<GroupInfo>& info = fusion.info;

  // What each group's comment says it fuses.
  auto fuses = [&](size_t gi) {
    std::vector<const ir::Node*> nodes;
    for (int li : s.groups[gi].loops)
      for (const ir::Node* n : p.loops[li].nodes)
        if (std::find(nodes.begin(), nodes.end(), n) == nodes.end()) nodes.push_back(n);
    std::string text;
    for (size_t i = 0; i < nodes.size(); ++i) {
      if (i == 16) {
        text += " ... (" + std::to_string(nodes.size() - 16) + " more)";
        break;
      }
      text += std::string(i ? " " : "") + "%" + nodes[i]->result()->name() + " (" + nodes[i]->target() + ")";
    }
    return text;
  };
  auto shape = [&](const Group& g) {
    return g.tiled ? "outer " + g.outer_size.str() + " × inner " + g.inner_size.str()
                   : g.outer_size.str() + " elements";
  };
  // Note [Identical kernels]: canonical text -> the kernel defined with it.
  // Its names (the kernel's and its variants'), in order.
  std::unordered_map<std::string, std::vector<std::string>> defined;
  auto emit = [&](KernelSignature sig, const std::string& comment, const std::string& body) {
    std::vector<std::string> names = {sig.name};
    for (const KernelConfig& c : sig.configs)
      if (std::find(names.begin(), names.end(), c.name) == names.end()) names.push_back(c.name);
    const std::string canonical = canonical_kernel_text(p, body, names);
    if (!sig.configs.empty()) sig.tuning_key = cache_key(canonical);
    auto [it, fresh] = defined.try_emplace(canonical, names);
    if (fresh) {
      s.source += std::string(p.device.is_cuda() ? kCudaUnitBreak : "") + comment + body + "\n";
    } else {
      // The same text defines the same variants, in the same order.
      const std::vector<std::string>& first = it->second;
      s.source += comment + "//   runs " + first.front() + "'s code (Note [Identical kernels])\n";
      sig.name = first.front();
      for (KernelConfig& c : sig.configs)
        c.name = first[static_cast<size_t>(std::find(names.begin(), names.end(), c.name) - names.begin())];
    }
    s.kernels.push_back(std::move(sig));
  };
  auto render = [&](size_t gi) {
    KernelSignature sig;
    sig.name = "kernel_" + std::to_string(gi);
    sig.fuses = fuses(gi);
    const Group& g = s.groups[gi];
    std::string body = p.device.is_cuda() ? render_cuda_group(p, g, info[gi], sig.name, sig)
                                          : render_cpp_group(p, g, info[gi], sig.name, threads, sig);
    // A group of no elements (an empty batch) computes nothing, and its
    // loop-invariant loads, hoisted before its loops, would read buffers
    // that hold no elements: its kernel does nothing.
    if (g.outer == 0 && !p.device.is_cuda()) body = "extern \"C\" void " + sig.name + "(void* const*) {}\n";
    const std::string comment = "// " + sig.name + " (" + shape(g) + ") fuses: " + sig.fuses + "\n";
    emit(std::move(sig), comment, body);
  };
  if (!p.device.is_cuda()) {
    for (size_t gi = 0; gi < s.groups.size(); ++gi) render(gi);
  } else {
    // Note [Combined launches]: consecutive pointwise kernels that do not
    // depend on each other (an optimizer's per-parameter updates) are
    // launched as one, each taking its own range of blocks.
    std::vector<Schedule::Step> steps;
    std::vector<size_t> run;
    std::unordered_set<int> run_reads, run_writes;
    auto flush = [&] {
      if (run.size() == 1) render(run.front());
      if (run.size() > 1) {
        KernelSignature sig;
        sig.name = "combined_" + std::to_string(run.front());
        std::string comment = "// " + sig.name + " launches kernel_" + std::to_string(run.front()) + " to kernel_" +
                              std::to_string(run.back()) + " as one:\n";
        std::vector<const Group*> groups;
        std::vector<GroupInfo*> infos;
        for (size_t gi : run) {
          groups.push_back(&s.groups[gi]);
          infos.push_back(&info[gi]);
          comment += "//   kernel_" + std::to_string(gi) + " (" + shape(s.groups[gi]) + "): " + fuses(gi) + "\n";
          sig.fuses += std::string(sig.fuses.empty() ? "" : " | ") + fuses(gi);
        }
        const std::string body = render_cuda_combined(p, groups, infos, sig.name, sig);
        emit(std::move(sig), comment, body);
      }
      if (!run.empty()) steps.push_back({nullptr, static_cast<int>(s.kernels.size()) - 1});
      run.clear();
      run_reads.clear();
      run_writes.clear();
    };
    for (const Schedule::Step& st : s.steps) {
      if (st.extern_node) {
        flush();
        steps.push_back(st);
        continue;
      }
      const size_t gi = static_cast<size_t>(st.kernel);
      const Group& g = s.groups[gi];
      std::unordered_set<int> reads, writes(info[gi].produced.begin(), info[gi].produced.end());
      for (int li : g.loops)
        for (const Read& r : reads_of(p, p.loops[li], g.outer_size, g.inner_size)) reads.insert(r.buffer);
      bool independent = !g.tiled && run.size() < kMaxCombined;
      for (int b : reads) independent = independent && !run_writes.contains(b);
      for (int b : writes) independent = independent && !run_writes.contains(b) && !run_reads.contains(b);
      if (!independent) flush();
      run.push_back(gi);
      run_reads.insert(reads.begin(), reads.end());
      run_writes.insert(writes.begin(), writes.end());
      if (g.tiled) flush();
    }
    flush();
    s.steps = std::move(steps);
  }
  const bool bf16 = s.source.find("crucible_bf16_") != std::string::npos;
  const bool f16 = s.source.find("crucible_f16_") != std::string::npos;
  if (!s.source.empty() && p.device.is_cuda())
    s.source =
        "// Generated by crucible inductor: one CUDA kernel per fused group over raw\n"
        "// pointers (no ATen), compiled with NVRTC.\n" +
        std::string(preludes::cuda) + (bf16 || f16 ? preludes::cuda_reduced_precision : "") + "\n" + s.source;
  else if (!s.source.empty())
    s.source =
        "// Generated by crucible inductor: one function per fused kernel over raw\n"
        "// pointers (no ATen); b[i] is the i-th buffer of the kernel's signature.\n"
        "#include <omp.h>\n\n"
        "#include <cmath>\n#include <cstdint>\n#include <cstring>\n#include <limits>\n#include <memory>\n\n" +
        std::string(preludes::cpu) + (bf16 ? preludes::cpu_bf16 : "") + (f16 ? preludes::cpu_f16 : "") + "\n" +
        s.source;
  return s;
}

}  // namespace crucible::inductor::detail
