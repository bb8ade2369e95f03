// CommDebugMode: a scoped, per-rank recorder of collectives, like
// torch.distributed.tensor.debug.CommDebugMode.
//
// While a CommDebugMode is active on a rank, every collective that rank issues through a
// ProcessGroup (any backend) is counted by op key, with its payload bytes, under the current
// module FQN and phase. Keys are PyTorch's: "c10d._allgather_base_",
// "c10d._reduce_scatter_base_", "c10d.allreduce_", "c10d.broadcast_", "c10d.allgather_" for
// process-group calls (barrier is not counted, as in PyTorch), and
// "c10d_functional.all_gather_into_tensor", "c10d_functional.reduce_scatter_tensor",
// "c10d_functional.all_reduce" for functional collectives (tensor-parallel redistributions;
// see FunctionalCollectiveGuard and engine/distributed/functional_collectives.h). get_count accepts a
// key or a bare op name ("_allgather_base_", "all_reduce"); bare names are unique across both
// families.
//
// Modes nest: every active mode of the rank records each collective. Construction enters
// (clearing counts); exit() or destruction leaves; enter() re-enters and clears, like Python's
// `with comm_mode:` used several times.
//
// Module and phase attribution: FSDP (and any caller) sets the current module and phase with
// CommPhaseGuard(fqn, phase). A collective is counted under the innermost guard's module and
// phase, and also under every enclosing guard's module, every module that enclosed that FQN
// the first time it ran forward (so backward collectives reach the forward parents, as
// PyTorch's module tracker does), and "Global". Without a guard: module "Global", phase
// "forward".
//
// Ownership: a CommDebugMode is owned by its creator and registers itself with the rank that
// created it (RankContext::Current() at enter()); it must be exited or destroyed on that
// rank's thread. Guards are stack objects of the rank thread.
// Thread-safety: the getters may be called from any thread (counts are synchronised).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "engine/distributed/collective_info.h"

namespace fsdp {
class RankContext;
}

namespace fsdp::distributed {

enum class CommPhase { kForward, kBackward };
const char* CommPhaseName(CommPhase phase);  // "forward", "backward"

// The module key used when no module is current, as PyTorch's tracker names the root.
inline constexpr const char* kGlobalModule = "Global";

struct CommRecord {
  std::string op;          // CommDebugMode key, e.g. "c10d._allgather_base_"
  std::string module_fqn;  // innermost module, kGlobalModule when none
  CommPhase phase = CommPhase::kForward;
  CollectiveInfo info;
};

class CommDebugMode {
 public:
  // op key -> count
  using Counts = std::map<std::string, int64_t>;
  // module FQN -> "forward"/"backward" -> op key -> count
  using ModuleCounts = std::map<std::string, std::map<std::string, Counts>>;

  CommDebugMode();  // enters on the current rank
  ~CommDebugMode();
  CommDebugMode(const CommDebugMode&) = delete;
  CommDebugMode& operator=(const CommDebugMode&) = delete;

  // Clears all counts and starts recording on the current rank (no-op re-entry is an error).
  void enter();
  // Stops recording; counts stay readable.
  void exit();
  bool active() const;

  Counts get_comm_counts() const;
  // Counts of one phase (the "Global" module's forward or backward counts).
  Counts get_comm_counts(CommPhase phase) const;
  int64_t get_total_counts() const;
  // Count of one op by key ("c10d.allreduce_") or bare name ("allreduce_"); 0 when absent.
  int64_t get_count(std::string_view op) const;
  ModuleCounts get_comm_module_counts() const;
  // op key -> total payload bytes (see CollectiveInfo::payload_bytes).
  Counts get_comm_bytes() const;
  // Every recorded collective in issue order.
  std::vector<CommRecord> records() const;
  // A text table: per module, per phase, op counts (like generate_comm_debug_tracing_table
  // at noise level 0).
  std::string str() const;

 private:
  friend void RecordToActiveCommModes(const CommRecord& record,
                                      const std::vector<std::string>& modules);
  void Record(const CommRecord& record, const std::vector<std::string>& modules);

  mutable std::mutex mu_;
  RankContext* context_ = nullptr;  // the rank this mode is registered with while active
  Counts counts_;
  Counts bytes_;
  ModuleCounts module_counts_;
  std::vector<CommRecord> records_;
};

// Enters module `module_fqn` (empty: keep the enclosing module, set only the phase) and phase
// on the calling rank until ExitCommModule(depth) with the depth it returns: CommPhaseGuard for a
// scope that opens in one call and closes in another (FSDP's pre-forward and post-forward hooks
// bracket a module's forward, as PyTorch's module tracker's forward hooks do). The first
// forward entry of a module records the modules enclosing it (its forward parents).
size_t EnterCommModule(std::string module_fqn, CommPhase phase);
// Leaves the frame EnterCommModule returned `depth` for, and any frame opened inside it.
void ExitCommModule(size_t depth);

// Sets the current module FQN and phase of the calling rank for its lifetime (nests). An empty
// FQN keeps the enclosing module and only sets the phase.
class CommPhaseGuard {
 public:
  CommPhaseGuard(std::string module_fqn, CommPhase phase);
  explicit CommPhaseGuard(CommPhase phase) : CommPhaseGuard("", phase) {}
  ~CommPhaseGuard();
  CommPhaseGuard(const CommPhaseGuard&) = delete;
  CommPhaseGuard& operator=(const CommPhaseGuard&) = delete;

 private:
  size_t depth_;
};

// While alive, the first ProcessGroup collective the calling rank issues is recorded under the
// functional-collective key of `op` instead of its c10d key, and any further ProcessGroup call
// inside the guard is not recorded (one functional collective = one count, as in PyTorch).
// Used by tensor-parallel redistributions (engine/distributed/functional_collectives.h).
class FunctionalCollectiveGuard {
 public:
  explicit FunctionalCollectiveGuard(FunctionalCollective op);
  ~FunctionalCollectiveGuard();
  FunctionalCollectiveGuard(const FunctionalCollectiveGuard&) = delete;
  FunctionalCollectiveGuard& operator=(const FunctionalCollectiveGuard&) = delete;

 private:
  bool previous_active_;
  FunctionalCollective previous_op_;
  bool previous_consumed_;
};

// The calling rank's current module ("Global" when none) and phase.
std::string CurrentCommModule();
CommPhase CurrentCommPhase();

// Called by the ProcessGroup front for each outermost collective: records `info` to every
// active CommDebugMode of the calling rank (when the op is counted). Not for other callers.
void RecordCollectiveToCommModes(const CollectiveInfo& info);

}  // namespace fsdp::distributed
