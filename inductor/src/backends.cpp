// The inductor's entries in runtime's backend registry, registered when this
// library is loaded (Note [Backends register themselves] in
// runtime/backend_registry.h).
#include <crucible/inductor/compile_fx.h>
#include <crucible/inductor/package.h>
#include <crucible/runtime/backend_registry.h>

namespace crucible::inductor {
namespace {

runtime::BackendInfo inductor_backend(bool cuda_graphs) {
  runtime::BackendInfo info;
  info.name = cuda_graphs ? "inductor-cudagraphs" : "inductor";
  info.description = cuda_graphs
                         ? "inductor, with each compiled graph captured as a CUDA graph and replayed (torch.compile's "
                           "mode=\"reduce-overhead\"); graphs on the CPU run as with inductor"
                         : "lowers to a loop-level IR and fuses pointwise ops and reductions into generated kernels "
                           "(C++/OpenMP on the CPU, CUDA through NVRTC on a GPU); other ops run as ATen extern kernels";
  info.compile = [cuda_graphs](const ir::Graph& g, const std::vector<at::Tensor>& example_inputs) {
    InductorOptions options = InductorOptions::from_environment();
    options.cuda_graphs = options.cuda_graphs || cuda_graphs;
    return compile_fx_inner(g, example_inputs, options);
  };
  info.generated_code = [](const ir::Graph& g) {
    std::vector<runtime::GeneratedFile> files{{"loops.txt", loop_ir(g)}};
    GeneratedCode code = generate_code(g);
    if (!code.source.empty()) files.push_back({code.cuda ? "kernels.cu" : "kernels.cpp", code.source});
    return files;
  };
  info.plan_memory = [](const ir::Graph& g) { return plan_memory(g, InductorOptions::from_environment()); };
  info.estimated_ms = [](const ir::Graph& g) { return estimated_ms(g, InductorOptions::from_environment()); };
  info.write_compiled = [cuda_graphs](const ir::Graph& g, const std::string& dir,
                                      const std::vector<std::string>& cuda_archs) {
    InductorOptions options = InductorOptions::from_environment();
    options.cuda_graphs = options.cuda_graphs || cuda_graphs;
    return write_compiled(g, dir, options, cuda_archs);
  };
  // Above the interpreter: a Builder's default, and compile_train_step's,
  // is the fast backend where this library is linked, as torch.compile's
  // default is inductor; "inductor-cudagraphs" ranks below "inductor",
  // whose graphs need no capture to run.
  info.rank = cuda_graphs ? 1 : 2;
  info.cuda_graphs = cuda_graphs;
  info.cache_dir = InductorOptions::from_environment().cache_dir;
  info.decompositions = "core";
  // Attention written out becomes scaled_dot_product_attention where its
  // fused kernel is a flash one (bf16 or f16, or any dtype on a CPU), which
  // keeps no [B, H, T, S] probabilities (GPT-2 small, bf16, batch 8, on an
  // H200: 27.0 to 22.3 ms a step, 10.6 to 6.3 GiB; float32, batch 1, on a
  // CPU: 3.3 to 2.9 GiB at the same speed; bench/results/memory.md).
  info.pre_grad_passes = {"fuse_flash_attention"};
  return info;
}

const bool registered = [] {
  runtime::BackendRegistry::register_builtin([] { return inductor_backend(false); });
  runtime::BackendRegistry::register_builtin([] { return inductor_backend(true); });
  return true;
}();

}  // namespace
}  // namespace crucible::inductor
