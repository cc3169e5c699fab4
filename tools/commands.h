// The `crucible` command's subcommands. Each lives in its own file and adds
// itself to the app; main.cpp runs the one the user named.
#pragma once

#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace crucible::tools {

/// `crucible graph FILE [--format text|dot|json] [--run]` (graph_command.cpp).
void add_graph_command(CLI::App& app);
/// `crucible trace --model M [--joint] [--functionalize] [--mode real|fake] [--format F]` (trace_command.cpp).
void add_trace_command(CLI::App& app);
/// `crucible train --model M [--dataset D] [--epochs E | --steps N] [--batch B] [--optimizer O] [--lr X]
/// [--backend B] [--check-eager] [--json]` (train_command.cpp).
void add_train_command(CLI::App& app);
/// `crucible compile --model M [--backend B] [--passes P] --dump-dir D` (compile_command.cpp).
void add_compile_command(CLI::App& app);
/// `crucible export --model M [--backend B] [--batch N] --out DIR` (export_command.cpp).
void add_export_command(CLI::App& app);
/// `crucible launch --nproc N [--master-addr A] [--master-port P] -- COMMAND...` (launch_command.cpp).
void add_launch_command(CLI::App& app);
/// The command line main() was given (argv), for commands that start
/// themselves again (train --nproc).
const std::vector<std::string>& command_line();
void set_command_line(int argc, char** argv);
/// `crucible bench [--model M] [--stage S] [--json FILE] [-- FLAGS]` (bench_command.cpp; built where
/// Google Benchmark is found).
void add_bench_command(CLI::App& app);

}  // namespace crucible::tools
