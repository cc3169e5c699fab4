// `crucible graph FILE [--format text|dot|json] [--run] [--seed N]`: read a
// graph (the text form, or the JSON form when the file starts with '{'),
// verify it, print it in the chosen format; with --run, interpret it on
// seeded random inputs and print each output's type and checksums (an
// output whose sizes or dtype differ from its declared type is an error).
#include "commands.h"

#include <crucible/ir/dot.h>
#include <crucible/ir/error.h>
#include <crucible/ir/interpreter.h>
#include <crucible/ir/json.h>
#include <crucible/ir/parser.h>
#include <crucible/ir/printer.h>
#include <crucible/ir/verifier.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>

namespace crucible::tools {
namespace {

struct GraphCommandOptions {
  std::string file;
  std::string format = "text";
  bool run = false;
  uint64_t seed = 0;
};

ir::Graph read_graph(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ir::IrError("cannot open " + path + ": check the path");
  std::ostringstream text;
  text << in.rdbuf();
  const std::string s = text.str();
  const size_t first = s.find_first_not_of(" \t\r\n");
  try {
    return first != std::string::npos && s[first] == '{' ? ir::from_json(s) : ir::parse(s);
  } catch (const ir::IrError& e) {
    throw ir::IrError(path + ": " + e.what());
  }
}

// A random tensor of `meta` (sizes, strides, offset, dtype, device): floating
// and complex dtypes from N(0, 1), integers uniform in [0, 4) (valid indices
// for small tables), bools fair coin flips; drawn from `gen`.
at::Tensor random_input(const ir::TensorMeta& meta, at::Generator& gen) {
  int64_t storage = meta.storage_offset + 1;
  for (size_t d = 0; d < meta.sizes.size(); ++d) {
    if (meta.sizes[d] == 0) storage = 0;
    if (storage) storage += (meta.sizes[d] - 1) * meta.strides[d];
  }
  const auto cpu = at::TensorOptions().dtype(meta.dtype);
  at::Tensor flat;
  if (at::isFloatingType(meta.dtype) || at::isComplexType(meta.dtype))
    flat = at::randn({storage}, gen, cpu);
  else if (meta.dtype == at::kBool)
    flat = at::randint(0, 2, {storage}, gen, cpu);
  else
    flat = at::randint(0, 4, {storage}, gen, cpu);
  return flat.to(meta.device).as_strided(meta.sizes, meta.strides, meta.storage_offset);
}

void run_graph(const ir::Graph& g, uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  std::vector<at::Tensor> inputs;
  for (const ir::Value* p : g.placeholders()) inputs.push_back(random_input(p->meta(), gen));
  const ir::Interpreter interpreter(g);
  const std::vector<at::Tensor> outputs = interpreter.run(inputs);
  const std::vector<ir::Value*> values = g.outputs();
  for (size_t i = 0; i < outputs.size(); ++i) {
    const at::Tensor& t = outputs[i];
    // The text form's types are claims; a kernel that disagrees means the graph is wrong.
    const ir::TensorMeta& declared = values[i]->meta();
    if (declared.sizes != t.sizes().vec() || declared.dtype != t.scalar_type())
      throw ir::IrError("output %" + values[i]->name() + " is declared " + ir::to_string(declared) +
                        " but its kernel computed " + ir::to_string(ir::TensorMeta::of(t)) +
                        ": fix the declared type in the graph");
    char line[160];
    if (t.is_complex() || !t.numel()) {
      std::snprintf(line, sizeof line, "numel=%lld", static_cast<long long>(t.numel()));
    } else {
      const at::Tensor d = t.detach().cpu().to(at::kDouble);
      std::snprintf(line, sizeof line, "sum=%.9g abs_sum=%.9g", d.sum().item<double>(), d.abs().sum().item<double>());
    }
    std::cout << "%" << values[i]->name() << " : " << ir::to_string(ir::TensorMeta::of(t)) << "  " << line << "\n";
  }
}

void run_graph_command(const GraphCommandOptions& o) {
  const ir::Graph g = read_graph(o.file);
  ir::verify(g);
  if (o.format == "text")
    ir::print(g, std::cout);
  else if (o.format == "dot")
    ir::to_dot(g, std::cout);
  else
    std::cout << ir::to_json(g, 2) << "\n";
  if (o.run) run_graph(g, o.seed);
}

}  // namespace

void add_graph_command(CLI::App& app) {
  auto opts = std::make_shared<GraphCommandOptions>();
  CLI::App* cmd = app.add_subcommand("graph", "read, verify and print a graph; --run interprets it on random inputs");
  cmd->add_option("file", opts->file, "a graph in the text form (or its JSON form)")->required();
  cmd->add_option("--format", opts->format, "output format")->check(CLI::IsMember({"text", "dot", "json"}));
  cmd->add_flag("--run", opts->run,
                "interpret the graph on seeded random inputs (floats N(0,1), integers in [0,4), bools) and print "
                "each output's type, sum and absolute sum");
  cmd->add_option("--seed", opts->seed, "seed of the random inputs");
  cmd->callback([opts] { run_graph_command(*opts); });
}

}  // namespace crucible::tools
