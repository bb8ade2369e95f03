// FlightRecorder: the last collectives a rank issued, with their state, in the spirit of
// PyTorch's NCCL flight recorder. The ProcessGroup front records every collective (on every
// backend) before the backend runs it and marks it completed or failed afterwards. Deadline
// and abort reports print the recorders of the ranks involved ("rank 3 last issued
// allreduce_ #4 on group 0 ... completed").
//
// Ownership: one per rank, held (shared) by the rank's RankContext and by whoever reports on
// it (FlightRecorderOf()).
// Thread-safety: fully synchronised; other ranks' threads read it to build reports.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/distributed/collective_info.h"

namespace fsdp {
class RankContext;
}

namespace fsdp::distributed {

struct FlightRecorderEntry {
  enum class State { kScheduled, kCompleted, kFailed };
  uint64_t id = 0;  // per rank, 1-based, in issue order
  CollectiveInfo info;
  State state = State::kScheduled;
  std::string error;  // kFailed: the error's what()
  std::chrono::steady_clock::time_point issued_at;

  static const char* StateName(State state);  // "scheduled", "completed", "failed"
  // "#12 allreduce_ #3 on group 0 (rank 1/4, global rank 1): float32 in [4] SUM [completed]"
  std::string str() const;
};

class FlightRecorder {
 public:
  static constexpr size_t kDefaultCapacity = 64;
  explicit FlightRecorder(size_t capacity = kDefaultCapacity) : capacity_(capacity) {}

  uint64_t RecordIssued(const CollectiveInfo& info);
  void RecordCompleted(uint64_t id);
  void RecordFailed(uint64_t id, const std::string& error);

  // The last `n` entries, oldest first.
  std::vector<FlightRecorderEntry> Last(size_t n) const;
  // How many collectives were issued in total (including evicted ones).
  uint64_t issued_count() const;
  // The last `n` entries, one per line, each prefixed by `indent`; "(none)" when empty.
  std::string Dump(size_t n, const std::string& indent = "  ") const;
  void Clear();

 private:
  FlightRecorderEntry* Find(uint64_t id);

  mutable std::mutex mu_;
  size_t capacity_;
  uint64_t next_id_ = 1;
  std::deque<FlightRecorderEntry> entries_;
};

// The calling rank's recorder (in RankContext::Current()).
FlightRecorder& CurrentFlightRecorder();
// The recorder of `context`, shared so that reports may outlive the context.
std::shared_ptr<FlightRecorder> FlightRecorderOf(RankContext& context);

}  // namespace fsdp::distributed
