#include <crucible/pipeline/error.h>
#include <crucible/pipeline/instruments.h>

#include <crucible/ir/dot.h>
#include <crucible/ir/graph.h>
#include <crucible/ir/printer.h>
#include <crucible/ir/verifier.h>

#include <spawn.h>
#include <sys/wait.h>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

extern char** environ;

namespace crucible::pipeline {

// --- GraphDumper ------------------------------------------------------------------

namespace {

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  if (!out) throw PipelineError("GraphDumper: cannot write " + path + ": " + std::strerror(errno));
}

// Graphviz's `dot -Tsvg`, run without a shell and stopped after `timeout_s`.
// False when it is not installed, fails or runs too long (the SVG is
// optional; the DOT file holds the same graph).
bool render_svg(const std::string& dot_path, const std::string& svg_path, double timeout_s) {
  std::string arg0 = "dot", arg1 = "-Tsvg", arg2 = "-o";
  std::string out = svg_path, in = dot_path;
  char* argv[] = {arg0.data(), arg1.data(), arg2.data(), out.data(), in.data(), nullptr};
  pid_t pid;
  if (posix_spawnp(&pid, "dot", nullptr, nullptr, argv, environ) != 0) return false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  int status = 0;
  pid_t done = 0;
  while ((done = waitpid(pid, &status, WNOHANG)) == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (done == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    std::filesystem::remove(svg_path);
    return false;
  }
  return done == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

}  // namespace

GraphDumper::GraphDumper(GraphDumpOptions options) : options_(std::move(options)) {
  std::error_code ec;
  std::filesystem::create_directories(options_.dir, ec);
  if (ec) throw PipelineError("GraphDumper: cannot create the dump directory " + options_.dir + ": " + ec.message());
}

void GraphDumper::before_stage(const ir::StageEvent& event) {
  for (const ir::StageGraph& g : event.graphs)
    if (g.graph && !counters_.contains(g.name)) dump(g.name, "input", *g.graph);
}

void GraphDumper::after_stage(const ir::StageEvent& event) {
  if (event.failed) return;
  if (event.cached) {
    for (const ir::StageGraph& g : event.graphs)
      if (g.graph) dump(g.name, std::string(event.stage) + ".cached", *g.graph);
    return;
  }
  if (event.stage == "backend" && options_.code) {
    for (const ir::StageGraph& g : event.graphs) {
      if (!g.graph) continue;
      const std::string base = next_base(g.name, "code");
      for (const runtime::GeneratedFile& f : options_.code(*g.graph)) {
        write_file(base + "." + f.name, f.text);
        files_.push_back(base + "." + f.name);
      }
    }
  }
  if (!event.changed) return;
  for (const ir::StageGraph& g : event.graphs)
    if (g.graph) dump(g.name, event.stage, *g.graph);
}

std::string GraphDumper::next_base(std::string_view graph_name, std::string_view stage) {
  int& n = counters_.try_emplace(std::string(graph_name), 0).first->second;
  char seq[16];
  std::snprintf(seq, sizeof seq, "%02d", n++);
  return options_.dir + "/" + std::string(graph_name) + "." + seq + "." + std::string(stage);
}

void GraphDumper::dump(std::string_view graph_name, std::string_view stage, const ir::Graph& graph) {
  const std::string base = next_base(graph_name, stage);
  if (options_.text) {
    write_file(base + ".txt", ir::to_text(graph));
    files_.push_back(base + ".txt");
  }
  if (options_.dot || options_.svg) {
    write_file(base + ".dot", ir::to_dot(graph));
    if (options_.dot) files_.push_back(base + ".dot");
    if (options_.svg && graph.num_nodes() <= options_.svg_max_nodes &&
        render_svg(base + ".dot", base + ".svg", options_.svg_timeout_s))
      files_.push_back(base + ".svg");
    if (!options_.dot) std::filesystem::remove(base + ".dot");
  }
}

// --- GraphVerifier ----------------------------------------------------------------

void GraphVerifier::after_stage(const ir::StageEvent& event) {
  if (event.failed) return;
  for (const ir::StageGraph& g : event.graphs) {
    if (!g.graph) continue;
    try {
      ir::verify(*g.graph);
    } catch (const ir::IrError& e) {
      throw ir::IrError("graph '" + std::string(g.name) + "' fails verification after stage '" +
                        std::string(event.stage) + "': " + e.what());
    }
  }
}

}  // namespace crucible::pipeline
