#include "conformance/backend.h"

#include "conformance/scenario.h"
#include "engine/core/allocator.h"
#include "engine/core/error.h"
#include "engine/dist/gloo/gloo_process_group.h"
#include "engine/dist/nccl/nccl_process_group.h"
#include "fakes/threaded_process_group.h"
#include "fsdp/config.h"

namespace fsdp::conformance {

const char* LaunchModeName(LaunchMode mode) {
  return mode == LaunchMode::kThreads ? "threads" : "processes";
}

int VisibleGpuCount() { return CudaDeviceCount(); }

void BackendRegistry::Add(Backend backend) {
  FSDP_CHECK(!backend.name.empty(), "a backend needs a name");
  FSDP_CHECK(backends_.count(backend.name) == 0, "backend ", backend.name, " is registered twice");
  const std::string name = backend.name;
  backends_.emplace(name, std::move(backend));
}

Backend& BackendRegistry::Mutable(const std::string& name) {
  Get(name);
  return backends_.at(name);
}

void BackendRegistry::SetThreadedGroups(const std::string& name,
                                        TimedThreadedGroupsFactory factory) {
  Backend& b = Mutable(name);
  FSDP_CHECK(b.mode == LaunchMode::kThreads, "backend ", name,
             " runs ranks as processes; install a ProcessGroupFactory with SetProcessGroup");
  b.threaded_groups = std::move(factory);
}

void BackendRegistry::SetThreadedGroups(const std::string& name, ThreadedGroupsFactory factory) {
  if (!factory) {
    SetThreadedGroups(name, TimedThreadedGroupsFactory());
    return;
  }
  SetThreadedGroups(name, TimedThreadedGroupsFactory(
                              [factory = std::move(factory)](int world, std::chrono::milliseconds) {
                                return factory(world);
                              }));
}

void BackendRegistry::SetProcessGroup(const std::string& name, ProcessGroupFactory factory) {
  Backend& b = Mutable(name);
  FSDP_CHECK(b.mode == LaunchMode::kProcesses, "backend ", name,
             " runs ranks as threads; install a ThreadedGroupsFactory with SetThreadedGroups");
  b.process_group = std::move(factory);
}

const Backend* BackendRegistry::Find(const std::string& name) const {
  auto it = backends_.find(name);
  return it == backends_.end() ? nullptr : &it->second;
}

const Backend& BackendRegistry::Get(const std::string& name) const {
  const Backend* b = Find(name);
  if (b == nullptr) {
    std::string names;
    for (const auto& n : Names()) names += (names.empty() ? "" : ", ") + n;
    FSDP_THROW(ErrorCode::kNotFound, "unknown backend '", name,
               "'; backends: ", names.empty() ? std::string("(none registered)") : names);
  }
  return *b;
}

std::vector<std::string> BackendRegistry::Names() const {
  std::vector<std::string> out;
  for (const auto& [n, b] : backends_) out.push_back(n);
  return out;
}

std::optional<std::string> BackendRegistry::Unavailable(const std::string& name) const {
  const Backend& b = Get(name);
  const bool has_factory = b.mode == LaunchMode::kThreads ? static_cast<bool>(b.threaded_groups)
                                                          : static_cast<bool>(b.process_group);
  if (!has_factory) {
    return "backend " + name + " has no process-group factory in this build";
  }
  // The backend's own reason first: it is more specific than the generic GPU check.
  if (b.unavailable) {
    if (auto why = b.unavailable()) return why;
  }
  if (b.requires_gpu && VisibleGpuCount() == 0) {
    return "backend " + name + " needs a GPU and none is visible";
  }
  return std::nullopt;
}

void RegisterDefaultBackends(BackendRegistry& registry) {
  Backend threaded;
  threaded.name = kBackendThreaded;
  threaded.description = "ranks as threads of one process, in-memory collectives";
  threaded.mode = LaunchMode::kThreads;
  threaded.threaded_groups = [](int world, std::chrono::milliseconds timeout) {
    return fakes::MakeThreadedWorldGroups(world, timeout);
  };
  registry.Add(std::move(threaded));

  Backend gloo;
  gloo.name = kBackendGloo;
  gloo.description = "one process per rank, Gloo over TCP loopback, FileStore rendezvous";
  gloo.mode = LaunchMode::kProcesses;
  gloo.process_group = [](const ProcessGroupSpec& spec) -> std::shared_ptr<dist::ProcessGroup> {
    dist::GlooOptions options;
    options.timeout = spec.timeout;
    return dist::GlooProcessGroup::Create(dist::GlooStore::File(spec.store_dir), spec.rank,
                                          spec.world, options);
  };
  registry.Add(std::move(gloo));

  Backend nccl;
  nccl.name = kBackendNccl;
  nccl.description = "one process per rank, NCCL on CUDA devices";
  nccl.mode = LaunchMode::kProcesses;
  nccl.requires_gpu = true;
  // Rank r runs on cuda:r (the process launcher starts every rank on this host, so the rank
  // is the local rank; NCCL needs a distinct GPU per rank).
  nccl.device = [](int rank) {
    const int count = VisibleGpuCount();
    return Device::CUDA(count > 0 ? rank % count : 0);
  };
  nccl.unavailable = []() -> std::optional<std::string> {
    if (VisibleGpuCount() == 0) return std::string("backend nccl: no CUDA device visible");
    return std::nullopt;
  };
#if FSDP_HAVE_NCCL
  nccl.process_group = [](const ProcessGroupSpec& spec) -> std::shared_ptr<dist::ProcessGroup> {
    const int gpus = VisibleGpuCount();
    if (spec.world > gpus) {
      SkipCase("backend nccl needs one GPU per rank: world " + std::to_string(spec.world) +
               ", " + std::to_string(gpus) + " CUDA device(s) visible");
    }
    dist::NcclOptions options;
    options.timeout = spec.timeout;
    return dist::NcclProcessGroup::Create(dist::GlooStore::File(spec.store_dir), spec.rank,
                                          spec.world, spec.device, options);
  };
#endif
  registry.Add(std::move(nccl));
}

}  // namespace fsdp::conformance
