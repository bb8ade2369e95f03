// BackendRegistry: the one place that maps a process-group backend's name to its factory and
// its capabilities, like torch.distributed's Backend.register_backend(name, func, devices=...)
// (torch/distributed/distributed_c10d.py). Everything that picks a backend by name asks a
// registry: the launch library (FSDP_BACKEND, init_process_group.h), the conformance runner
// (--backend) and pg-bench. A new backend is one folder with its ProcessGroup and one
// `<name>_backend.cc` returning its BackendSpec, registered once (BuiltinBackends, builtin_backends.h, for the
// engine's own, fakes::DefaultBackends for the threaded fake, Register for anyone else's).
//
//   BackendRegistry backends = BuiltinBackends();           // gloo, nccl
//   const BackendSpec& gloo = backends.Get("gloo");
//   auto pg = gloo.process_group({.rank = r, .world = n, .store = store});
//
// Capabilities say what a backend can serve: whether its ranks are threads of one process or
// processes, the device its ranks' tensors live on, and the collectives it implements.
// Callers that need something (the conformance scenarios: ranks as threads, a CPU, ...)
// compare requirements with capabilities and never list backend names.
//
// Ownership: a registry owns its specs (value type; copies are independent).
// Thread-safety: fill before use; const member functions may then be called concurrently;
// factories must be thread-safe.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/core/device.h"
#include "engine/distributed/collective_info.h"
#include "engine/distributed/process_group.h"
#include "engine/distributed/store/store.h"

namespace fsdp::distributed {

// Where a backend's ranks live.
enum class RankPlacement { kThreads, kProcesses };
// "threads", "processes".
const char* RankPlacementName(RankPlacement placement);

struct BackendCapabilities {
  // Default: processes (one process per rank).
  RankPlacement ranks = RankPlacement::kProcesses;
  // The device every rank's tensors live on. Default: the CPU.
  DeviceType device = DeviceType::kCPU;
  // The collectives the backend implements. Default: every ProcessGroup collective.
  std::vector<CollectiveOp> collectives = AllCollectiveOps();
  // Its process groups honour ProcessGroupSpec::straggler_timeout. Default: false.
  bool straggler_check = false;

  bool Supports(CollectiveOp op) const;
  // "processes, cpu" for listings; ", collectives allreduce_ barrier" appended when the
  // backend implements only some.
  std::string str() const;
};

// What one rank process needs to build its world group.
struct ProcessGroupSpec {
  int rank = 0;        // Default: 0
  int world = 1;       // Default: 1
  int local_rank = 0;  // Default: 0 (the rank on its host; picks the GPU)
  std::shared_ptr<Store> store;  // required: the world's rendezvous store, shared by its ranks
  // Deadline of rendezvous and of every collective. Default: 30 s.
  std::chrono::milliseconds timeout = std::chrono::seconds(30);
  Device device;                  // the rank's device. Default: the CPU
  std::string network_interface;  // Default: "" (the backend's choice; GLOO_SOCKET_IFNAME)
  // All ranks run on this host (bind the loopback address). Default: true.
  bool single_host = true;
  // Exchange every collective's fingerprint before running it, so that ranks
  // issuing different collectives all fail naming both sides instead of hanging
  // or computing garbage (gloo: GlooOptions::check_collectives). Default:
  // false.
  bool check_collectives = false;
  // How long a rank waits for every member to reach a collective before failing with an
  // error naming the ranks that did not (gloo: GlooOptions::straggler_timeout); 0: off.
  // Default: 0.
  std::chrono::milliseconds straggler_timeout{0};
};

// Builds the groups of a world whose ranks are threads: element r is rank r's group.
using ThreadedWorldFactory = std::function<std::vector<std::shared_ptr<ProcessGroup>>(
    int world, std::chrono::milliseconds timeout)>;
// Builds one rank's world group in a rank process (rendezvous through spec.store).
using ProcessGroupFactory =
    std::function<std::shared_ptr<ProcessGroup>(const ProcessGroupSpec& spec)>;

struct BackendSpec {
  std::string name;         // "gloo", "nccl", "threaded", ...
  std::string description;  // one line, for listings
  BackendCapabilities capabilities;
  ThreadedWorldFactory threaded_world;  // set for RankPlacement::kThreads backends
  ProcessGroupFactory process_group;    // set for RankPlacement::kProcesses backends
  // Why a world of `world` ranks cannot run here (no device, too few devices, a library
  // missing at run time); nullopt when it can. Default: unset (always can).
  std::function<std::optional<std::string>(int world)> unavailable;

  // The device of the rank with `local_rank`: the CPU, or cuda:(local_rank % visible devices).
  Device DeviceOf(int local_rank) const;
  bool has_factory() const;
};

class BackendRegistry {
 public:
  // Adds a backend; InvalidArgument when the name is empty or already registered, or when the
  // factory does not match capabilities.ranks.
  void Register(BackendSpec spec);
  // Replaces the factory of a registered backend (e.g. a test's own groups); an empty factory
  // makes the backend unavailable. InvalidArgument when the placement does not match.
  void SetThreadedWorld(const std::string& name, ThreadedWorldFactory factory);
  void SetProcessGroup(const std::string& name, ProcessGroupFactory factory);

  const BackendSpec* Find(const std::string& name) const;
  // NotFound listing the registered backends when absent.
  const BackendSpec& Get(const std::string& name) const;
  std::vector<std::string> Names() const;
  // nullopt when `name` can run a world of `world` ranks here; otherwise the reason (no
  // factory in this build, no GPU, ...). NotFound for an unknown name.
  std::optional<std::string> Unavailable(const std::string& name, int world = 1) const;

 private:
  BackendSpec& Mutable(const std::string& name);
  std::map<std::string, BackendSpec> backends_;
};

}  // namespace fsdp::distributed
