// See process_group.h. The only source that includes c10d's backend
// headers: ProcessGroupGloo.hpp needs Gloo's headers (Debian's libgloo-dev;
// only its declarations are used: the Gloo that runs is the one inside
// libtorch_cpu) and USE_C10D_GLOO, which meson defines for this file.
#include "group_state.h"

#include <crucible/spmd/error.h>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef CRUCIBLE_HAVE_NCCL
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <cstdlib>
#include <limits>
#include <mutex>
#include <optional>
#include <unordered_map>

namespace crucible::spmd {

namespace {

std::mutex registry_mu;
std::unordered_map<std::string, std::shared_ptr<detail::GroupState>>& registry() {
  static std::unordered_map<std::string, std::shared_ptr<detail::GroupState>> groups;
  return groups;
}

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

int64_t env_int(const char* name, int64_t lo, int64_t hi, int64_t fallback) {
  const std::optional<std::string> v = env(name);
  if (!v) return fallback;
  size_t used = 0;
  int64_t x = 0;
  try {
    x = std::stoll(*v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != v->size() || x < lo || x > hi)
    throw SpmdError(std::string("options_from_env: ") + name + "=" + *v + " is not a whole number in [" +
                    std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return x;
}

bool is_loopback(const std::string& addr) { return addr == "localhost" || addr.rfind("127.", 0) == 0 || addr == "::1"; }

std::string where(const ProcessGroupOptions& o) {
  return "rank " + std::to_string(o.rank) + " of " + std::to_string(o.world_size);
}

c10::intrusive_ptr<c10d::Backend> make_gloo(const c10::intrusive_ptr<c10d::Store>& store,
                                            const ProcessGroupOptions& o) {
  auto opts = c10d::ProcessGroupGloo::Options::create(o.timeout);
  if (const auto ifname = env("GLOO_SOCKET_IFNAME"))
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(*ifname));
  else if (is_loopback(o.master_addr))
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  else
    opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, o.rank, o.world_size, opts);
}

c10::intrusive_ptr<c10d::Backend> make_nccl([[maybe_unused]] const c10::intrusive_ptr<c10d::Store>& store,
                                            const ProcessGroupOptions& o) {
#ifdef CRUCIBLE_HAVE_NCCL
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(o.local_rank));
  auto opts = c10d::ProcessGroupNCCL::Options::create();
  opts->timeout = o.timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, o.rank, o.world_size, opts);
#else
  throw SpmdError("init_process_group: backend \"nccl\" asked for (" + where(o) +
                  "), but Crucible was built without NCCL (a CUDA build of LibTorch and nccl.h are needed); use "
                  "backend \"gloo\" with CPU tensors");
#endif
}

}  // namespace

ProcessGroupOptions options_from_env() {
  ProcessGroupOptions o;
  const bool has_rank = env("RANK").has_value(), has_world = env("WORLD_SIZE").has_value();
  if (has_rank != has_world)
    throw SpmdError(std::string("options_from_env: ") + (has_rank ? "RANK" : "WORLD_SIZE") + " is set but " +
                    (has_rank ? "WORLD_SIZE" : "RANK") +
                    " is not; start ranks with `crucible launch --nproc N -- ...` or torchrun, which set both");
  o.world_size = static_cast<int>(env_int("WORLD_SIZE", 1, 1 << 20, 1));
  o.rank = static_cast<int>(env_int("RANK", 0, o.world_size - 1, 0));
  o.local_rank = static_cast<int>(env_int("LOCAL_RANK", 0, 1 << 20, o.rank));
  if (const auto addr = env("MASTER_ADDR")) o.master_addr = *addr;
  o.master_port = static_cast<uint16_t>(env_int("MASTER_PORT", 1, 65535, 29500));
  o.timeout = std::chrono::seconds(env_int("CRUCIBLE_DIST_TIMEOUT_S", 1, 1 << 24, 300));
  return o;
}

ProcessGroup init_process_group(const ProcessGroupOptions& options) {
  ProcessGroupOptions o = options;
  if (o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size)
    throw SpmdError("init_process_group: rank " + std::to_string(o.rank) +
                    " is outside [0, world_size = " + std::to_string(o.world_size) + ")");
  if (o.device != "cpu" && o.device != "cuda")
    throw SpmdError("init_process_group: device \"" + o.device + "\" is neither \"cpu\" nor \"cuda\"");
  std::string backend = o.backend == "auto" ? (o.device == "cuda" ? "nccl" : "gloo") : o.backend;
  if (backend != "gloo" && backend != "nccl")
    throw SpmdError("init_process_group: unknown backend \"" + o.backend + "\"; use \"gloo\", \"nccl\" or \"auto\"");
  if (backend == "nccl" && o.device != "cuda")
    throw SpmdError("init_process_group: backend \"nccl\" reduces CUDA tensors; device is \"" + o.device + "\"");

  auto state = std::make_shared<detail::GroupState>();
  state->options = o;
  state->backend_name = backend;
  try {
    c10d::TCPStoreOptions so;
    so.port = o.master_port;
    so.isServer = o.rank == 0;
    so.numWorkers = static_cast<size_t>(o.world_size);
    so.waitWorkers = true;
    so.timeout = o.timeout;
    auto tcp = c10::make_intrusive<c10d::TCPStore>(o.master_addr, so);
    state->store = c10::make_intrusive<c10d::PrefixStore>("crucible/" + o.name, tcp);
  } catch (const std::exception& e) {
    throw SpmdError("init_process_group: " + where(o) + " cannot reach the store at " + o.master_addr + ":" +
                    std::to_string(o.master_port) + " within " + std::to_string(o.timeout.count() / 1000) +
                    " s (MASTER_ADDR, MASTER_PORT; is rank 0 running, and are all " + std::to_string(o.world_size) +
                    " ranks started?): " + detail::message_of(e));
  }
  try {
    state->backend = backend == "gloo" ? make_gloo(state->store, o) : make_nccl(state->store, o);
  } catch (const SpmdError&) {
    throw;
  } catch (const std::exception& e) {
    throw SpmdError("init_process_group: " + where(o) + " could not form the " + backend +
                    " group: " + detail::message_of(e));
  }
  state->native_avg = backend == "nccl";
  std::lock_guard lock(registry_mu);
  registry()[o.name] = state;
  return ProcessGroup(state);
}

ProcessGroup resolve_process_group(const std::string& name) {
  std::lock_guard lock(registry_mu);
  auto it = registry().find(name);
  if (it == registry().end())
    throw SpmdError("no process group named \"" + name + "\": call spmd::init_process_group first");
  return ProcessGroup(it->second);
}

void destroy_process_group(const std::string& name) {
  std::lock_guard lock(registry_mu);
  registry().erase(name);
}

const std::string& ProcessGroup::name() const { return state_->options.name; }
const std::string& ProcessGroup::backend() const { return state_->backend_name; }
int ProcessGroup::rank() const { return state_->options.rank; }
int ProcessGroup::size() const { return state_->options.world_size; }
std::chrono::milliseconds ProcessGroup::timeout() const { return state_->options.timeout; }

std::string ProcessGroup::describe() const {
  return where(state_->options) + " (" + backend() + ", group '" + name() + "')";
}

void ProcessGroup::broadcast(std::vector<at::Tensor>& tensors, int root) const {
  try {
    for (at::Tensor& t : tensors) {
      std::vector<at::Tensor> one{t};
      c10d::BroadcastOptions o;
      o.rootRank = root;
      o.timeout = timeout();
      state_->backend->broadcast(one, o)->wait(timeout());
    }
  } catch (const std::exception& e) {
    throw SpmdError("broadcast from rank " + std::to_string(root) + " failed on " + describe() + ": " +
                    detail::message_of(e));
  }
}

void ProcessGroup::all_reduce_sum(std::vector<at::Tensor>& tensors) const {
  try {
    for (at::Tensor& t : tensors) {
      std::vector<at::Tensor> one{t};
      c10d::AllreduceOptions o;
      o.timeout = timeout();
      state_->backend->allreduce(one, o)->wait(timeout());
    }
  } catch (const std::exception& e) {
    throw SpmdError("all_reduce failed on " + describe() + ": " + detail::message_of(e));
  }
}

namespace {

// Sets this rank's `value` for the group's next all_gather_string of `key`,
// and returns the prefix of that gather's keys ("<prefix><rank>").
std::string publish(const ProcessGroup& group, const std::string& key, const std::string& value) {
  const std::string base = "gather/" + std::to_string(group.state()->string_gathers++) + "/" + key + "/";
  group.state()->store->set(base + std::to_string(group.rank()), std::vector<uint8_t>(value.begin(), value.end()));
  return base;
}

}  // namespace

void detail::publish_string(const ProcessGroup& group, const std::string& key, const std::string& value) {
  publish(group, key, value);
}

std::vector<std::string> ProcessGroup::all_gather_string(const std::string& key, const std::string& value) const {
  const std::string base = publish(*this, key, value);
  std::vector<std::string> all;
  for (int r = 0; r < size(); ++r) {
    try {
      state_->store->wait({base + std::to_string(r)}, timeout());
      const std::vector<uint8_t> v = state_->store->get(base + std::to_string(r));
      all.emplace_back(v.begin(), v.end());
    } catch (const std::exception& e) {
      throw SpmdError("rank " + std::to_string(r) + " did not publish \"" + key + "\" within " +
                      std::to_string(timeout().count() / 1000) + " s (seen from " + describe() +
                      "): it died, hangs, or runs other code: " + detail::message_of(e));
    }
  }
  return all;
}

}  // namespace crucible::spmd
