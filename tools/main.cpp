// `crucible`: the command-line face of the pipeline. Subcommands are listed in
// commands.h; errors from any stage are printed to stderr with exit code 1.
#include "commands.h"

#include <crucible/ir/error.h>

#include <c10/util/Exception.h>
#include <CLI/CLI.hpp>

#include <exception>
#include <iostream>

int main(int argc, char** argv) {
  CLI::App app{"crucible: a graph compiler for LibTorch programs", "crucible"};
  app.require_subcommand(1);
  crucible::tools::set_command_line(argc, argv);
  crucible::tools::add_train_command(app);
  crucible::tools::add_compile_command(app);
  crucible::tools::add_export_command(app);
  crucible::tools::add_trace_command(app);
  crucible::tools::add_graph_command(app);
  crucible::tools::add_launch_command(app);
#ifdef CRUCIBLE_HAVE_BENCHMARK
  crucible::tools::add_bench_command(app);
#endif
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const crucible::Error& e) {
    std::cerr << "crucible: " << e.what() << "\n";
    return 1;
  } catch (const c10::Error& e) {
    std::cerr << "crucible: " << e.what_without_backtrace() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "crucible: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
