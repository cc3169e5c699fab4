// An inductor-compiled graph as files, and back: the backend's part of an
// exported training step (pipeline::export_train_step, crucible::
// load_train_step). The writer needs the code generator (crucible-
// inductor); the reader needs none (crucible-inductor-runtime), nor a
// compiler: it loads the kernels the writer built.
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
///  - inductor_kernels.so: the generated C++ kernels, built (or found in
///    the kernel cache) as compile_fx_inner builds them, where there are any;
///  - inductor.json: the code generator's version, the device, the values
///    of the size symbols the kernels take (Note [Dynamic sizes]), and the
///    CPU the library is built for where the flags say -march=native.
/// CPU graphs only: throws InductorError for a graph whose kernels run on
/// a GPU (cubins are not packaged yet). Throws InductorError for a graph
/// without an output node or a file that cannot be written, ir::IrError
/// for what the text form cannot hold (ir/printer.h), and what lowering
/// and the C++ compiler throw.
std::vector<std::string> write_compiled(const ir::Graph& graph, const std::string& dir,
                                        const InductorOptions& options = {});

/// The callable that write_compiled's files in `dir` make: the schedule
/// and kernels compile_fx_inner made for that graph, run by the same
/// run-time plan (with `options`' memory planning and threads), on inputs
/// of the graph's placeholders' metadata. Generates no code and runs no
/// compiler. Throws InductorError naming the file and the fault: a file
/// missing or unreadable, a package of another code generator version or
/// device, a library built for another CPU (-march=native), or a schedule
/// that does not fit the graph; the parser's ir::ParseError for a graph
/// that does not read back.
ir::CompiledFn load_compiled(const std::string& dir, const InductorOptions& options = {});

}  // namespace crucible::inductor
