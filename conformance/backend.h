// Backends: how the ranks of a case are launched and how each gets its world process group.
//
//   kThreads    all ranks are threads of this process (ThreadedLauncher); one factory call
//               builds the world's groups, one per rank ("threaded").
//   kProcesses  every rank is a process (ProcessLauncher re-executes this binary as
//               `__worker`); each worker calls the factory with its rank and a fresh store
//               directory for rendezvous ("gloo", "nccl").
//
// A backend whose factory is not registered, or that needs a GPU where none is visible, is
// unavailable: its scenarios are SKIPPED with the reason. RegisterDefaultBackends declares
// threaded, gloo and nccl with the factories this build has; SetThreadedGroups /
// SetProcessGroup install or replace one (e.g. a test's own groups, or NcclProcessGroup).
//
// Ownership: the registry owns its entries. Thread-safety: fill before use; const member
// functions may then be called concurrently; factories must be thread-safe.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/core/device.h"
#include "engine/dist/process_group.h"

namespace fsdp::conformance {

enum class LaunchMode { kThreads, kProcesses };
const char* LaunchModeName(LaunchMode mode);  // "threads", "processes"

// Builds the world's groups for ranks-as-threads: element r is rank r's group. The timed form
// also gets the deadline that collective waits should use (a little shorter than the case's,
// so that a hang is reported by the process group, with its details, before the launcher
// gives up on the rank).
using ThreadedGroupsFactory =
    std::function<std::vector<std::shared_ptr<dist::ProcessGroup>>(int world)>;
using TimedThreadedGroupsFactory = std::function<std::vector<std::shared_ptr<dist::ProcessGroup>>(
    int world, std::chrono::milliseconds collective_timeout)>;

// What a worker process knows when it builds its world group.
struct ProcessGroupSpec {
  int rank = 0;
  int world = 1;
  std::string store_dir;  // empty, fresh per case, shared by the case's ranks (a FileStore)
  std::chrono::milliseconds timeout{300000};  // Default: 300 s; the case's deadline
  Device device;                              // the rank's device
};
using ProcessGroupFactory =
    std::function<std::shared_ptr<dist::ProcessGroup>(const ProcessGroupSpec& spec)>;

struct Backend {
  std::string name;                            // "threaded", "gloo", "nccl"
  std::string description;                     // one line for `fsdp-conform list`
  LaunchMode mode = LaunchMode::kThreads;      // Default: threads
  bool requires_gpu = false;                   // Default: false
  TimedThreadedGroupsFactory threaded_groups;  // kThreads; unset: unavailable
  ProcessGroupFactory process_group;           // kProcesses; unset: unavailable
  // Rank r's device. Default (unset): the CPU.
  std::function<Device(int rank)> device;
  // Extra availability test (e.g. a library missing at run time); nullopt: available.
  std::function<std::optional<std::string>()> unavailable;

  Device DeviceOf(int rank) const { return device ? device(rank) : Device::CPU(); }
};

class BackendRegistry {
 public:
  // Adds a backend; a second with the same name is an error (use the setters to complete one).
  void Add(Backend backend);
  // Installs the factory of a declared backend (replacing an earlier one); an empty factory
  // uninstalls it, which makes the backend unavailable.
  void SetThreadedGroups(const std::string& name, TimedThreadedGroupsFactory factory);
  void SetThreadedGroups(const std::string& name, ThreadedGroupsFactory factory);
  void SetProcessGroup(const std::string& name, ProcessGroupFactory factory);

  const Backend* Find(const std::string& name) const;
  // NotFound listing the registered backends when absent.
  const Backend& Get(const std::string& name) const;
  std::vector<std::string> Names() const;

  // nullopt when `name` can run here; otherwise the reason (no factory, no GPU, ...).
  std::optional<std::string> Unavailable(const std::string& name) const;

 private:
  Backend& Mutable(const std::string& name);
  std::map<std::string, Backend> backends_;
};

// Declares threaded (threads: fakes::ThreadedProcessGroup), gloo (processes:
// dist::GlooProcessGroup over a FileStore in the case's store directory) and nccl (processes,
// one GPU per rank: dist::NcclProcessGroup on cuda:<rank>, its unique id exchanged through a
// FileStore in the case's store directory; the factory exists only in builds with NCCL, and
// the backend is unavailable with "no CUDA device visible" when there is no GPU; a world
// larger than the visible GPU count is skipped).
void RegisterDefaultBackends(BackendRegistry& registry);

// Number of visible CUDA devices (0 in CPU-only builds).
int VisibleGpuCount();

}  // namespace fsdp::conformance
