// The `crucible` command's subcommands. Each lives in its own file and adds
// itself to the app; main.cpp runs the one the user named.
#pragma once

namespace CLI {
class App;
}

namespace crucible::tools {

/// `crucible graph FILE [--format text|dot|json] [--run]` (graph_command.cpp).
void add_graph_command(CLI::App& app);
/// `crucible trace --model M [--joint] [--functionalize] [--mode real|fake] [--format F]` (trace_command.cpp).
void add_trace_command(CLI::App& app);

}  // namespace crucible::tools
