// FaultInjectingProcessGroup: a decorator that delays, fails, drops or corrupts chosen
// collectives on chosen ranks, to test that failures surface as clear errors on every rank
// (and that checks catch silent corruption). Faults live in a FaultPlan shared by all ranks;
// each fault counts, per rank, the collectives that match its filters (rank, op, group) and
// fires on the k-th one.
//
// Ownership: the plan is shared (shared_ptr) by every decorator using it; subgroups created
// through the decorator share the plan.
// Thread-safety: FaultPlan is synchronised; the decorator is used by its rank's thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/core/error.h"
#include "engine/distributed/collective_info.h"
#include "fakes/process_group_wrapper.h"

namespace fsdp::fakes {

struct Fault {
  enum class Kind {
    kDelay,    // sleep `delay`, then run the collective
    kFail,     // throw Error(code, message) instead of joining the collective
    kDrop,     // return a completed Work without joining: the rank "never arrives"
    kCorrupt,  // run the collective, then add `corrupt_delta` to every output element
  };
  Kind kind = Kind::kFail;                   // Default: kFail
  int rank = -1;                             // Default: -1 (every rank); else a global rank
  uint64_t collective = 1;                   // Default: 1; fires on the k-th match (1-based)
  std::optional<distributed::CollectiveOp> op;      // Default: any op
  std::string group;                         // Default: "" (any group); else a group name
  std::chrono::milliseconds delay{0};        // kDelay. Default: 0
  ErrorCode code = ErrorCode::kUnavailable;  // kFail. Default: kUnavailable
  std::string message = "injected fault";    // kFail. Default: "injected fault"
  double corrupt_delta = 1.0;                // kCorrupt. Default: 1.0

  static Fault Delay(int rank, uint64_t collective, std::chrono::milliseconds delay);
  static Fault Fail(int rank, uint64_t collective, ErrorCode code = ErrorCode::kUnavailable,
                    std::string message = "injected fault");
  static Fault Drop(int rank, uint64_t collective);
  static Fault Corrupt(int rank, uint64_t collective, double delta = 1.0);
};

class FaultPlan {
 public:
  void Add(Fault fault);
  // The faults that fire for this collective on its rank (advances the per-rank counters).
  std::vector<Fault> Match(const distributed::CollectiveInfo& info);
  // How many faults fired so far.
  int fired() const;

 private:
  mutable std::mutex mu_;
  std::vector<Fault> faults_;
  std::map<std::pair<size_t, int>, uint64_t> counts_;  // (fault index, global rank) -> matches
  int fired_ = 0;
};

class FaultInjectingProcessGroup final : public ProcessGroupWrapper {
 public:
  FaultInjectingProcessGroup(std::shared_ptr<distributed::ProcessGroup> inner,
                             std::shared_ptr<FaultPlan> plan);
  const std::shared_ptr<FaultPlan>& plan() const { return plan_; }

 protected:
  std::shared_ptr<distributed::ProcessGroup> Wrap(std::shared_ptr<distributed::ProcessGroup> inner) override;
  std::shared_ptr<distributed::Work> Intercept(const distributed::CollectiveInfo& info,
                                        const std::vector<Tensor>& outputs,
                                        const Forward& forward) override;

 private:
  std::shared_ptr<FaultPlan> plan_;
};

}  // namespace fsdp::fakes
