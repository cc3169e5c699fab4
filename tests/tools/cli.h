// Runs the `crucible` command built alongside the tests (its path comes from
// the CRUCIBLE_CLI environment variable that meson sets) and captures what it
// printed and its exit status.
#pragma once

#include <sys/wait.h>
#include <unistd.h>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

namespace crucible::testing {

struct CliResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

/// Runs `crucible ARGS` (ARGS as the shell splits them) and returns its exit
/// code, stdout and stderr.
inline CliResult run_cli(const std::string& args) {
  const char* cli = std::getenv("CRUCIBLE_CLI");
  if (!cli) throw std::runtime_error("CRUCIBLE_CLI is not set: run the tests through meson test");
  char err_path[] = "/tmp/crucible_cli_err_XXXXXX";
  const int fd = mkstemp(err_path);
  if (fd < 0) throw std::runtime_error("mkstemp failed");
  close(fd);
  const std::string cmd = std::string(cli) + " " + args + " 2>" + err_path;
  CliResult r;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) throw std::runtime_error("cannot run " + cmd);
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream err(err_path);
  std::ostringstream es;
  es << err.rdbuf();
  r.err = es.str();
  std::remove(err_path);
  return r;
}

/// Writes `text` to a fresh temporary file and returns its path.
inline std::string write_temp(const std::string& text, const std::string& suffix = ".txt") {
  static int counter = 0;
  const std::string path = "/tmp/crucible_test_" + std::to_string(getpid()) + "_" + std::to_string(counter++) + suffix;
  std::ofstream(path) << text;
  return path;
}

}  // namespace crucible::testing
