#include "fakes/threaded_backend.h"

#include "engine/distributed/builtin_backends.h"
#include "fakes/threaded_process_group.h"

namespace fsdp::fakes {

distributed::BackendSpec ThreadedBackend() {
  distributed::BackendSpec spec;
  spec.name = "threaded";
  spec.description = "ranks as threads of one process, in-memory collectives";
  spec.capabilities.ranks = distributed::RankPlacement::kThreads;
  spec.capabilities.device = DeviceType::kCPU;
  spec.threaded_world = [](int world, std::chrono::milliseconds timeout) {
    return MakeThreadedWorldGroups(world, timeout);
  };
  return spec;
}

distributed::BackendRegistry DefaultBackends() {
  distributed::BackendRegistry registry = distributed::BuiltinBackends();
  registry.Register(ThreadedBackend());
  return registry;
}

}  // namespace fsdp::fakes
