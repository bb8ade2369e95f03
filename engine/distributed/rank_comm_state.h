// RankCommState: the per-rank bookkeeping behind CommDebugMode, CommPhaseGuard,
// FunctionalCollectiveGuard and the ProcessGroup front's nesting depth. Internal to
// engine/dist (other units use the guards and CommDebugMode).
//
// Ownership: one per rank, in the rank's RankContext slot.
// Thread-safety: only the rank's own thread touches it (modes read their own counts under
// their own mutex).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "engine/distributed/collective_info.h"
#include "engine/distributed/comm_debug_mode.h"

namespace fsdp::distributed::internal {

struct RankCommState {
  struct Frame {
    std::string module_fqn;  // empty: phase-only frame
    CommPhase phase;
  };
  std::vector<CommDebugMode*> modes;  // active modes, outermost first
  std::vector<Frame> frames;          // CommPhaseGuard stack
  // FQN -> the modules that enclosed it the first time it ran forward.
  std::map<std::string, std::vector<std::string>> forward_parents;
  // FunctionalCollectiveGuard state.
  bool functional_active = false;
  FunctionalCollective functional_op = FunctionalCollective::kAllReduce;
  bool functional_consumed = false;
  // Depth of ProcessGroup front calls on this rank (> 1 inside a decorator's forwarding).
  int front_depth = 0;
};

RankCommState& CurrentRankCommState();

}  // namespace fsdp::distributed::internal
