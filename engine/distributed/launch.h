// Launching a world of processes: reads the rank layout from the environment the way torchrun
// sets it (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), falling
// back to Open MPI (OMPI_COMM_WORLD_*), MPICH/PMI (PMI_RANK, PMI_SIZE, MPI_LOCALRANKID) and
// Slurm (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID), so binaries also run under mpirun and
// srun. Rendezvous goes through a file store when FSDP_STORE_PATH names a directory (fresh per
// run, shared by all ranks), otherwise through a TCP store hosted by rank 0 at
// MASTER_ADDR:MASTER_PORT. GLOO_SOCKET_IFNAME (or FSDP_GLOO_IFACE) picks the network
// interface; otherwise ranks bind 127.0.0.1 when all ranks are on one host and the host name
// when not. FSDP_PG_TIMEOUT_MS overrides the collective deadline;
// FSDP_STRAGGLER_TIMEOUT_MS names ranks that do not reach a collective within that time. FSDP_BACKEND picks the
// world's backend by name from BuiltinBackends() (builtin_backends.h): "gloo" (the default) or
// "nccl" (NcclProcessGroup on cuda:LOCAL_RANK, the unique id exchanged through the same store;
// needs a build with NCCL and one GPU per local rank); the session's RankContext device is the
// backend's device for LOCAL_RANK.
//
//   int main() {
//     auto session = fsdp::distributed::DistributedSession::FromEnvironment();
//     auto& pg = session->world();   // also the default process group of this rank
//     ...
//   }
//
// Ownership: a DistributedSession owns the rank's RankContext (installed on the creating
// thread for the session's lifetime) and the world group.
// Thread-safety: create and destroy a session on the same thread.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "engine/core/rank_context.h"
#include "engine/distributed/process_group.h"

namespace fsdp::distributed {

struct LaunchEnvironment {
  int rank = 0;              // Default: 0
  int world_size = 1;        // Default: 1
  int local_rank = 0;        // Default: 0
  int local_world_size = 1;  // Default: 1 (the world size when the launcher does not say)
  std::string master_addr;   // Default: "" (MASTER_ADDR)
  int master_port = 0;       // Default: 0 (MASTER_PORT)
  std::string store_path;    // Default: "" (FSDP_STORE_PATH)
  std::string iface;         // Default: "" (GLOO_SOCKET_IFNAME / FSDP_GLOO_IFACE)
  std::optional<std::chrono::milliseconds> timeout;  // Default: none (FSDP_PG_TIMEOUT_MS)
  // Cross-check every collective's fingerprint across the ranks before it runs
  // (a mismatch is a DataLoss error naming both sides on every rank). Default:
  // false (FSDP_CHECK_COLLECTIVES = 1 or 0).
  bool check_collectives = false;
  // How long a rank waits for every member to reach a collective before failing with an error
  // naming the ranks that did not (ProcessGroupSpec::straggler_timeout). Default: 0, off
  // (FSDP_STRAGGLER_TIMEOUT_MS, milliseconds; 0 is off).
  std::chrono::milliseconds straggler_timeout{0};
  std::string backend = "gloo";  // Default: "gloo" (FSDP_BACKEND: a process backend's name)
  // Which variables supplied the layout: "torchrun", "openmpi", "pmi", "slurm" or "default".
  std::string source = "default";

  // "rank 1/4 (local 1/4) from torchrun, store tcp://host:29500" (", backend nccl" appended
  // when the backend is not gloo).
  std::string str() const;
  // The rank's device: the backend's device for local_rank (the CPU for gloo, cuda:local_rank
  // for nccl).
  Device device() const;
};

// Looks up an environment variable; nullopt when unset.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;
// The process environment (getenv).
EnvLookup ProcessEnvironment();

// FSDP_STRAGGLER_TIMEOUT_MS (milliseconds, 0: off); 0 when unset. Throws InvalidArgument
// naming the variable when it is not a non-negative integer.
std::chrono::milliseconds ReadStragglerTimeout(const EnvLookup& env = ProcessEnvironment());

// Parses the launch variables; throws InvalidArgument naming the variable when one is
// malformed or inconsistent.
LaunchEnvironment ReadLaunchEnvironment(const EnvLookup& env = ProcessEnvironment());

// Creates the world's group for `launch` with the backend named launch.backend (the store per
// the rules above; rank 0 hosts the TCP store) and installs it as the calling rank's default
// group. launch.timeout, when set, overrides `timeout`. Throws Unavailable with the reason
// when the backend cannot run here (no NCCL in this build, no CUDA device visible, ...).
std::shared_ptr<ProcessGroup> InitProcessGroup(
    const LaunchEnvironment& launch, std::chrono::milliseconds timeout = std::chrono::seconds(30));

// A rank's whole distributed setup: its RankContext (rank, world size, seed) installed on the
// calling thread, and its world group (the default group).
class DistributedSession {
 public:
  static std::unique_ptr<DistributedSession> FromEnvironment(
      const EnvLookup& env = ProcessEnvironment(), uint64_t seed = 0);
  static std::unique_ptr<DistributedSession> Create(const LaunchEnvironment& launch,
                                                    uint64_t seed = 0);
  ~DistributedSession();
  DistributedSession(const DistributedSession&) = delete;
  DistributedSession& operator=(const DistributedSession&) = delete;

  const LaunchEnvironment& launch() const { return launch_; }
  ProcessGroup& world() const { return *world_; }
  const std::shared_ptr<ProcessGroup>& world_ptr() const { return world_; }
  RankContext& context() { return context_; }

 private:
  DistributedSession(LaunchEnvironment launch, uint64_t seed);

  LaunchEnvironment launch_;
  RankContext context_;
  RankContextGuard guard_;
  std::shared_ptr<ProcessGroup> world_;
};

}  // namespace fsdp::distributed
