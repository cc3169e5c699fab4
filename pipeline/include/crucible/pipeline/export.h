// A compiled training step written as a package that trains without the
// compiler: crucible::load_train_step (loader/) reads it with LibTorch and
// Crucible's run-time libraries only. PyTorch's AOTInductor packages
// inference (torch._inductor.aoti_compile_and_package); this packages the
// whole step: forward, backward and optimizer update.
#pragma once

#include <crucible/pipeline/train_step.h>

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace crucible::pipeline {

// Note [Exported training step]
// A package is a directory:
//  - manifest.json: the format, the backend, LibTorch's version, each
//    placeholder of the step's graph (kind, name, dtype, sizes, device:
//    the guards a loaded step checks its tensors against), and a checksum
//    of every other file (runtime/package.h);
//  - graph.txt: the step's graph, as the backend compiled it (Note [Train
//    step graph]), in the text form;
//  - the backend's files (BackendInfo::write_compiled; the inductor's:
//    its graph, schedule, and kernels: a library for the CPU, cubins for
//    each GPU architecture asked for), none for the interpreter;
//  - with ExportOptions::state, module.pt: the module's parameters and
//    buffers (Parameter and Buffer placeholders), state.pt: the optimizer
//    state (State placeholders), and lifted.pt where the step reads
//    tensors from outside the module (Lifted placeholders: Note [Lifted
//    tensors] in tracer/make_fx.h), as they were at export (torch::save);
//    without, their layout alone (the manifest), and the value of each
//    one-element state (a learning rate, a step count);
//  - example_batch.pt: the batch the step was compiled for.
// A loader given a module binds its own parameters and buffers by name, as
// the step binds them in the process; without one it trains module.pt's.
// A lifted tensor is read from outside the module at every call in the
// process (another module's weights, a tensor the loss captured); a loader
// binds the tensors it is given for them by name, else lifted.pt's values.
// The optimizer state starts from state.pt, else from zeros as a fresh
// optimizer's does (TrainStep::optimizer_state). A GPU step's package also
// holds its CUDA-graph policy and the autotuning choices made on the
// exporting GPU (Note [Packaged cubins] in
// inductor/src/runtime/load_compiled.cpp). The tensor files are most of a
// package (GPT-2 small's weights and Adam state: 1.5 GB), so a loader
// reads, and checksums, only those it binds.

struct ExportOptions {
  /// Write module.pt and state.pt (above): a package that trains on its
  /// own. Off: the layout only, for loaders that bind a module of theirs.
  bool state = true;
  /// A GPU step's architectures ("sm_80", "sm_90", ...): the package holds
  /// its kernels built for each, and loads on GPUs of these. A virtual
  /// architecture ("compute_90") adds PTX, which loads on GPUs of that
  /// architecture and every newer one (the driver compiles it at load).
  /// Empty: the exporting GPU's (InductorOptions::cuda_arch where set).
  /// Unused for a CPU step.
  std::vector<std::string> cuda_archs;
};

/// Writes `step`, compiled for `example_batch` (compiled here without
/// running a step where it was not: TrainStep::compile), as a package in
/// `dir` (created where missing; the package's files in it are replaced).
/// Neither the module nor the optimizer state changes. A GPU step runs once
/// on copies of its inputs first, so that the package carries its kernels'
/// autotuning choices (Note [Tuned before export] in src/export.cpp): the
/// export needs that memory again for a while. Static sizes: the
/// loaded step takes batches of `example_batch`'s sizes. Throws
/// PipelineError when the step's backend writes no package files of its
/// own and is not the interpreter (a user backend), or when `dir` cannot
/// be made; the backend's errors (inductor: an architecture NVRTC does not
/// know), ir::IrError for a graph the text form cannot hold,
/// runtime::PackageError when a file cannot be written, and what
/// TrainStep::compile throws.
void export_train_step(const TrainStep& step, const std::vector<at::Tensor>& example_batch, const std::string& dir,
                       const ExportOptions& options = {});

}  // namespace crucible::pipeline
