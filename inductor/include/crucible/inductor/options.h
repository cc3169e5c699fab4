// Options of the C++ code generator, as a value (no global config): the
// counterpart of the settings torch/_inductor/config.py holds for the CPU
// backend (cpp.cxx, cpp.threads, cache_dir, fallback, trace.output_code).
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace crucible::inductor {

struct InductorOptions {
  /// The C++ compiler run on generated code (looked up on PATH).
  std::string compiler = "g++";
  /// Flags for generated code; the shared-library flags (-shared -fPIC) and
  /// the output name are added by inductor.
  /// -fno-math-errno and -fno-trapping-math let sqrt, selects and the
  /// generated exp/erf vectorize; neither changes a result (only errno and
  /// the floating-point exception flags, which ATen does not promise).
  /// On x86, -mprefer-vector-width=512 lets a CPU with AVX-512 use its
  /// full vectors, as ATen's AVX-512 kernels do, where GCC's -march=native
  /// stays at 256 bits: a softmax row kernel, bound by its exp, ran 1.3x
  /// faster on an AVX-512 CPU. A CPU without AVX-512 ignores the preference.
  std::vector<std::string> flags = {"-O3",
                                    "-march=native",
                                    "-fopenmp",
                                    "-fno-math-errno",
                                    "-fno-trapping-math",
#if defined(__x86_64__)
                                    "-mprefer-vector-width=512"
#endif
  };
  /// OpenMP threads of generated kernels; 0 leaves OpenMP's default.
  int threads = 0;
  /// On the CPU, with `threads` 0: each compiled graph times its calls and
  /// runs them with the calling thread's OpenMP maximum, or a halving of it
  /// down to 1 where fewer threads run faster, as on a machine other
  /// processes keep busy (Note [Threads on a shared machine] in
  /// src/runtime/threads.cpp). Results do not depend on the count the
  /// generated kernels run with; ATen's extern kernels may round
  /// otherwise with another count, so a run that needs the same bits every
  /// time sets `threads` or turns this off.
  bool adapt_threads = true;
  /// On the CPU: once a graph of the same structure as an earlier one
  /// comes with other sizes (a new sequence length, a smaller last batch),
  /// the placeholder dimensions that changed become symbols that the
  /// generated kernels take as arguments, so that later sizes reuse the
  /// kernels compiled for the first of them instead of compiling their
  /// own (torch._dynamo's automatic_dynamic_shapes; Note [Dynamic sizes]
  /// in src/dynamic_sizes.cpp). Each size is still traced and lowered on
  /// its own. Off: every size is a literal of the kernels.
  bool automatic_dynamic_shapes = true;
  /// Where generated sources and compiled libraries are kept. Empty: the
  /// default, $XDG_CACHE_HOME/crucible/inductor (else ~/.cache/crucible/inductor).
  /// Created with mode 0700; a directory group or others can write is refused.
  std::string cache_dir;
  /// The GPU architecture NVRTC compiles CUDA kernels for ("sm_90");
  /// empty: the device's own compute capability.
  std::string cuda_arch;
  /// When the C++ compiler or NVRTC fails (or the code does not load), run
  /// the graph on the interpreter instead of throwing.
  bool fallback_to_eager = false;
  /// Print each generated translation unit to stderr.
  bool print_generated_code = false;
  /// Time every step of each call (generated and extern kernels; CUDA
  /// events on a GPU) and print to stderr, when the compiled function is
  /// destroyed, the steps that took longest, in ms per call, the first call
  /// (the warm-up) left out when later ones ran (Note [Per-step profile] in
  /// src/runtime/profile.cpp). Slows the calls down. Also prints, once
  /// compiled, the compile's phases in ms (passes and cache lookup;
  /// lowering, fusion and rendering; NVRTC or the C++ compiler; loading;
  /// the run-time plan).
  bool profile = false;
  /// Capture each compiled CUDA graph's calls as a CUDA graph and replay it
  /// (torch.compile's mode="reduce-overhead"; Note [CUDA graphs] in
  /// src/runtime/cuda_graphs.cpp): one launch a call instead of one per
  /// kernel. The first call runs as usual (warm-up), the second captures;
  /// inputs that are module or optimizer state stay where they are, the
  /// others are copied into buffers of the graph's. A graph that cannot be captured
  /// (it computes on the CPU, reads a CPU tensor, syncs with the host) runs
  /// without, with a warning saying why. Graphs on the CPU ignore it.
  bool cuda_graphs = false;
  /// Which launch configuration CUDA kernels rendered in several run
  /// (Note [Autotuning] in src/codegen/cuda.cpp; torch/_inductor's
  /// autotuning of a reduction's Triton configs). -1: each is timed in every
  /// configuration at its first run, on that run's inputs, and the fastest
  /// kept; the choice is stored in the cache directory under the kernel's
  /// text and the device's name, so later processes take it without timing.
  /// No kernel is timed while its stream captures a CUDA graph (it then runs
  /// its first configuration), nor one that writes a graph input in place.
  /// k >= 0: every such kernel runs its k-th configuration (its last where
  /// it has fewer), untimed: for tests of each configuration and for
  /// comparing them by hand.
  int kernel_config = -1;
  /// Rewrite graphs with 2-D convolutions to channels-last (Note
  /// [Channels-last convolutions] in src/fx_passes/layout_opt.cpp) when
  /// their loops run on the CPU too; on a GPU the rewrite always runs.
  /// What the rewrite changes is where values live, never a value or the
  /// strides of an output the caller sees (Note [Eager's strides at the
  /// outputs]), so with it a CPU run shows what a GPU run computes:
  /// torch/_inductor's force_layout_optimization, for tests without a GPU.
  bool force_layout_optimization = false;
  /// Place the buffers of a call whose lifetimes the plan knows (generated
  /// kernels' outputs, matmul results) at offsets in a few arenas, each
  /// one allocation a call, planned at compile time where that peaks no
  /// higher than giving each buffer its own tensor (Note [Arena] in
  /// src/runtime/memory_plan.cpp; torch/_inductor's memory_planning, XLA's
  /// buffer assignment). Off: each buffer is allocated on its own, or takes
  /// a dead one's memory. Unset: on for graphs that run on the CPU, off for
  /// a GPU's, where the caching allocator already reuses blocks and the
  /// arenas' large blocks reserved more for GPT-2 under CUDA graphs (+12%)
  /// though less for ResNet-18 (-21%; bench/results/memory.md).
  std::optional<bool> memory_planning;

  /// The defaults, with the debugging switches taken from the environment
  /// as torch/_inductor/config.py takes its own: CRUCIBLE_INDUCTOR_PROFILE=1
  /// (profile), CRUCIBLE_INDUCTOR_PRINT_CODE=1 (print_generated_code),
  /// CRUCIBLE_INDUCTOR_CUDA_GRAPHS=1 (cuda_graphs),
  /// CRUCIBLE_INDUCTOR_CACHE_DIR (cache_dir),
  /// CRUCIBLE_INDUCTOR_KERNEL_CONFIG=k (kernel_config),
  /// CRUCIBLE_INDUCTOR_FORCE_LAYOUT_OPT=1 (force_layout_optimization),
  /// CRUCIBLE_INDUCTOR_ADAPT_THREADS=0 (adapt_threads off),
  /// CRUCIBLE_INDUCTOR_AUTOMATIC_DYNAMIC_SHAPES=0 (automatic_dynamic_shapes
  /// off), CRUCIBLE_INDUCTOR_MEMORY_PLANNING=0 or 1 (memory_planning). What
  /// the `inductor` backend of the pipeline's registry compiles with.
  /// Throws nothing.
  static InductorOptions from_environment();
};

}  // namespace crucible::inductor
