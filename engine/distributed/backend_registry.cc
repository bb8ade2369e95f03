#include "engine/distributed/backend_registry.h"

#include <algorithm>

#include "engine/core/allocator.h"
#include "engine/core/error.h"

namespace fsdp::distributed {

const char* RankPlacementName(RankPlacement placement) {
  return placement == RankPlacement::kThreads ? "threads" : "processes";
}

bool BackendCapabilities::Supports(CollectiveOp op) const {
  return std::find(collectives.begin(), collectives.end(), op) != collectives.end();
}

std::string BackendCapabilities::str() const {
  std::string s = std::string(RankPlacementName(ranks)) + ", " +
                  (device == DeviceType::kCPU ? "cpu" : "cuda");
  if (collectives == AllCollectiveOps()) return s;
  s += ", collectives";
  for (CollectiveOp op : collectives) s += std::string(" ") + CollectiveOpName(op);
  return s;
}

Device BackendSpec::DeviceOf(int local_rank) const {
  if (capabilities.device == DeviceType::kCPU) return Device::CPU();
  const int count = CudaDeviceCount();
  return Device::CUDA(count > 0 ? local_rank % count : local_rank);
}

bool BackendSpec::has_factory() const {
  return capabilities.ranks == RankPlacement::kThreads ? static_cast<bool>(threaded_world)
                                                       : static_cast<bool>(process_group);
}

void BackendRegistry::Register(BackendSpec spec) {
  FSDP_CHECK(!spec.name.empty(), "BackendRegistry::Register: a backend needs a name");
  FSDP_CHECK(backends_.count(spec.name) == 0, "BackendRegistry::Register: backend '", spec.name,
             "' is registered twice");
  const bool threads = spec.capabilities.ranks == RankPlacement::kThreads;
  FSDP_CHECK(threads ? !spec.process_group : !spec.threaded_world, "backend '", spec.name,
             "' runs ranks as ", RankPlacementName(spec.capabilities.ranks), " but has a ",
             threads ? "ProcessGroupFactory" : "ThreadedWorldFactory");
  const std::string name = spec.name;
  backends_.emplace(name, std::move(spec));
}

BackendSpec& BackendRegistry::Mutable(const std::string& name) {
  Get(name);
  return backends_.at(name);
}

void BackendRegistry::SetThreadedWorld(const std::string& name, ThreadedWorldFactory factory) {
  BackendSpec& b = Mutable(name);
  FSDP_CHECK(b.capabilities.ranks == RankPlacement::kThreads, "backend '", name,
             "' runs ranks as processes; install a ProcessGroupFactory with SetProcessGroup");
  b.threaded_world = std::move(factory);
}

void BackendRegistry::SetProcessGroup(const std::string& name, ProcessGroupFactory factory) {
  BackendSpec& b = Mutable(name);
  FSDP_CHECK(b.capabilities.ranks == RankPlacement::kProcesses, "backend '", name,
             "' runs ranks as threads; install a ThreadedWorldFactory with SetThreadedWorld");
  b.process_group = std::move(factory);
}

const BackendSpec* BackendRegistry::Find(const std::string& name) const {
  auto it = backends_.find(name);
  return it == backends_.end() ? nullptr : &it->second;
}

const BackendSpec& BackendRegistry::Get(const std::string& name) const {
  const BackendSpec* b = Find(name);
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

std::optional<std::string> BackendRegistry::Unavailable(const std::string& name, int world) const {
  const BackendSpec& b = Get(name);
  if (!b.has_factory()) return "backend " + name + " has no process-group factory in this build";
  // The backend's own reason first: it is more specific than the generic device check.
  if (b.unavailable) {
    if (auto why = b.unavailable(world)) return why;
  }
  if (b.capabilities.device == DeviceType::kCUDA && CudaDeviceCount() == 0) {
    return "backend " + name + ": no CUDA device visible";
  }
  return std::nullopt;
}

}  // namespace fsdp::distributed
