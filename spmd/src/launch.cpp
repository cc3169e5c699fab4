// See launch.h.
#include <crucible/spmd/error.h>
#include <crucible/spmd/launch.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iostream>
#include <thread>

extern char** environ;

namespace crucible::spmd {

namespace {

int status_code(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

}  // namespace

uint16_t free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw SpmdError(std::string("free_port: socket() failed: ") + std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int err = errno;
    ::close(fd);
    throw SpmdError(std::string("free_port: cannot bind a socket: ") + std::strerror(err));
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

int launch(const LaunchOptions& options) {
  if (options.nproc < 1) throw SpmdError("launch: --nproc must be at least 1, not " + std::to_string(options.nproc));
  if (options.nnodes < 1) throw SpmdError("launch: --nnodes must be at least 1, not " + std::to_string(options.nnodes));
  if (options.node_rank < 0 || options.node_rank >= options.nnodes)
    throw SpmdError("launch: --node-rank " + std::to_string(options.node_rank) +
                    " is outside [0, --nnodes = " + std::to_string(options.nnodes) + ")");
  if (options.nnodes > 1 && options.master_port == 0)
    throw SpmdError("launch: " + std::to_string(options.nnodes) +
                    " nodes must agree on the store's port: give every node the same --master-port (and node 0's "
                    "address as --master-addr)");
  if (options.command.empty()) throw SpmdError("launch: no command to run (crucible launch --nproc N -- command ...)");
  const uint16_t port = options.master_port != 0 ? options.master_port : free_port();
  const int world = options.nnodes * options.nproc, first_rank = options.node_rank * options.nproc;

  std::vector<std::string> base;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    bool ours = false;
    for (const char* k : {"RANK=", "LOCAL_RANK=", "WORLD_SIZE=", "LOCAL_WORLD_SIZE=", "GROUP_RANK=",
                          "GROUP_WORLD_SIZE=", "MASTER_ADDR=", "MASTER_PORT="})
      ours = ours || kv.rfind(k, 0) == 0;
    if (!ours) base.push_back(kv);
  }
  base.insert(base.end(), options.env.begin(), options.env.end());
  // As torchrun: several ranks on one machine each get one OpenMP thread
  // unless told otherwise. Each rank's intra-op pool would otherwise take
  // every core, and the ranks' threads spinning after their parallel
  // regions take the cores the others launch GPU work from (ResNet-18's
  // 4-GPU step: 9.63 ms, 9.37 with one thread a rank).
  const bool omp_set =
      std::any_of(base.begin(), base.end(), [](const std::string& kv) { return kv.rfind("OMP_NUM_THREADS=", 0) == 0; });
  if (options.nproc > 1 && !omp_set) {
    base.emplace_back("OMP_NUM_THREADS=1");
    std::cerr << "launch: OMP_NUM_THREADS=1 for each rank (set it to use more threads a rank)\n";
  }
  std::vector<char*> argv;
  for (const std::string& a : options.command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);

  std::vector<pid_t> pids;
  auto stop_all = [&](int sig) {
    for (pid_t p : pids)
      if (p > 0) ::kill(p, sig);
  };
  for (int r = 0; r < options.nproc; ++r) {
    std::vector<std::string> env = base;
    for (const auto& [k, v] : {std::pair<const char*, std::string>{"RANK", std::to_string(first_rank + r)},
                               {"LOCAL_RANK", std::to_string(r)},
                               {"WORLD_SIZE", std::to_string(world)},
                               {"LOCAL_WORLD_SIZE", std::to_string(options.nproc)},
                               {"GROUP_RANK", std::to_string(options.node_rank)},
                               {"GROUP_WORLD_SIZE", std::to_string(options.nnodes)},
                               {"MASTER_ADDR", options.master_addr},
                               {"MASTER_PORT", std::to_string(port)}})
      env.push_back(std::string(k) + "=" + v);
    std::vector<char*> envp;
    for (std::string& kv : env) envp.push_back(kv.data());
    envp.push_back(nullptr);
    pid_t pid = 0;
    const int err = ::posix_spawnp(&pid, argv[0], nullptr, nullptr, argv.data(), envp.data());
    if (err != 0) {
      stop_all(SIGKILL);
      for (pid_t p : pids) ::waitpid(p, nullptr, 0);
      throw SpmdError("launch: cannot start rank " + std::to_string(first_rank + r) + " (`" + options.command[0] +
                      "`): " + std::strerror(err));
    }
    pids.push_back(pid);
  }

  int result = 0;
  size_t running = pids.size();
  std::chrono::steady_clock::time_point term_at{}, kill_at{};
  bool stopping = false, termed = false;
  while (running > 0) {
    int status = 0;
    const pid_t done = ::waitpid(-1, &status, stopping ? WNOHANG : 0);
    if (done == 0) {  // stopping, and some rank still runs
      const auto now = std::chrono::steady_clock::now();
      if (now >= kill_at)
        stop_all(SIGKILL);
      else if (now >= term_at && !termed)
        stop_all(SIGTERM), termed = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    if (done < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (size_t r = 0; r < pids.size(); ++r) {
      if (pids[r] != done) continue;
      pids[r] = -1;
      --running;
      const int code = status_code(status);
      if (code == 0) continue;
      std::cerr << "launch: rank " << first_rank + static_cast<int>(r) << " exited with " << code
                << (stopping ? "\n" : "; stopping the other ranks\n");
      if (!stopping) {
        result = code;
        stopping = true;
        term_at = std::chrono::steady_clock::now() + options.grace;
        kill_at = term_at + options.grace;
      }
    }
  }
  return result;
}

}  // namespace crucible::spmd
