// An inductor-compiled graph as files, and back: the backend's part of an
// exported training step (pipeline::export_train_step, crucible::
// load_train_step). The writer needs the code generator (crucible-
// inductor); the reader needs none (crucible-inductor-runtime), nor a
// compiler or NVRTC: it loads the kernels the writer built.
#pragma once

#include <crucible/inductor/options.h>
#include <crucible/ir/backend.h>
#include <crucible/ir/graph.h>

#include <string>
#include <vector>

namespace crucible::inductor {

/// Writes what compile_fx_inner makes of `graph` with `options` into the
/// existing directory `dir`, and returns the names of the files written:
///  - inductor_graph.txt: the graph it lowers (its passes applied), in the
///    text form (ir/parser.h);
///  - inductor_schedule.entry: its schedule (Note [Graph cache entries] in
///    src/codecache/schedule_entry.cpp);
///  - the generated kernels, where there are any, built (or found in the
///    kernel caches) as compile_fx_inner builds them: for a CPU graph,
///    inductor_kernels.so; for a GPU graph, inductor_<arch>_<unit>.cubin,
///    the cubins of each architecture in `cuda_archs` ("sm_90"; empty:
///    options.cuda_arch, else the graph's GPU's), and
///    inductor_compute_<N>_<unit>.ptx for a virtual one ("compute_90":
///    PTX, which the driver compiles at load for GPUs of that architecture
///    and newer ones), which NVRTC builds without that GPU (Note [Packaged
///    cubins] in src/runtime/load_compiled.cpp);
///  - inductor.json: the code generator's version, the device, whether
///    calls run as CUDA graphs (options.cuda_graphs), the values of the
///    size symbols the kernels take (Note [Dynamic sizes]), the CPU the
///    library is built for where the flags say -march=native, and for a
///    GPU graph its architectures and the autotuning choices this process
///    stored for its GPU (Note [Autotuning]).
/// Throws InductorError for a graph without an output node, a GPU graph
/// with no `cuda_archs` and no GPU to name its architecture, or a file
/// that cannot be written; ir::IrError for what the text form cannot hold
/// (ir/printer.h); and what lowering, the C++ compiler and NVRTC throw.
std::vector<std::string> write_compiled(const ir::Graph& graph, const std::string& dir,
                                        const InductorOptions& options = {},
                                        const std::vector<std::string>& cuda_archs = {});

/// The callable that write_compiled's files in `dir` make: the schedule
/// and kernels compile_fx_inner made for that graph, run by the same
/// run-time plan (with `options`' memory planning and threads), behind a
/// CUDA graph where the package says so, on inputs of the graph's
/// placeholders' metadata. Generates no code and runs no compiler (no
/// NVRTC: a GPU graph loads its architecture's cubins). Throws
/// InductorError naming the file and the fault: a file missing or
/// unreadable, a package of another code generator version, a library
/// built for another CPU (-march=native), a GPU package with neither this
/// GPU's cubins nor PTX it can run (the message names the architectures
/// it has), a GPU
/// package where LibTorch has no CUDA, or a schedule that does not fit the
/// graph; the parser's ir::ParseError for a graph that does not read back.
ir::CompiledFn load_compiled(const std::string& dir, const InductorOptions& options = {});

}  // namespace crucible::inductor
