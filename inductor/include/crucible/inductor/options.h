// Options of the C++ code generator, as a value (no global config): the
// counterpart of the settings torch/_inductor/config.py holds for the CPU
// backend (cpp.cxx, cpp.threads, cache_dir, fallback, trace.output_code).
#pragma once

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
  std::vector<std::string> flags = {"-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-fno-trapping-math"};
  /// OpenMP threads of generated kernels; 0 leaves OpenMP's default.
  int threads = 0;
  /// Where generated sources and compiled libraries are kept. Empty: the
  /// default, $XDG_CACHE_HOME/crucible/inductor (else ~/.cache/crucible/inductor).
  /// Created with mode 0700; a directory group or others can write is refused.
  std::string cache_dir;
  /// When the C++ compiler fails (or the library does not load), run the
  /// graph on the interpreter instead of throwing.
  bool fallback_to_eager = false;
  /// Print each generated translation unit to stderr.
  bool print_generated_code = false;
};

}  // namespace crucible::inductor
