#include "engine/distributed/straggler_monitor.h"

#include <algorithm>
#include <sstream>

#include "engine/core/error.h"

namespace fsdp::distributed {

namespace {
// How often a waiting rank looks for a peer's failure report while it waits for arrivals.
constexpr std::chrono::milliseconds kPollInterval{50};
}  // namespace

StragglerMonitor::StragglerMonitor(std::shared_ptr<Store> store, int rank,
                                   std::vector<int> global_ranks,
                                   std::chrono::milliseconds timeout)
    : store_(std::move(store)),
      rank_(rank),
      global_ranks_(std::move(global_ranks)),
      timeout_(timeout) {
  FSDP_CHECK(store_ != nullptr, "StragglerMonitor: null store");
  FSDP_CHECK(timeout_.count() > 0, "StragglerMonitor: the straggler timeout must be positive");
  FSDP_CHECK(rank_ >= 0 && rank_ < static_cast<int>(global_ranks_.size()),
             "StragglerMonitor: rank ", rank_, " out of range for group size ",
             global_ranks_.size());
}

std::string StragglerMonitor::ArriveKey(uint64_t sequence_number, int rank) {
  return "arrive/" + std::to_string(sequence_number) + "/" + std::to_string(rank);
}

std::string StragglerMonitor::FailedKey(uint64_t sequence_number) {
  return "failed/" + std::to_string(sequence_number);
}

std::string StragglerMonitor::LeftKey(int rank) { return "left/" + std::to_string(rank); }

void StragglerMonitor::Leave() noexcept {
  try {
    store_->set(LeftKey(rank_), last_arrived_.empty() ? "no collective" : last_arrived_);
  } catch (...) {  // the store's host is gone: nobody is left to wait either
  }
}

std::string StragglerMonitor::DescribeMissing(uint64_t sequence_number, int rank) {
  std::ostringstream os;
  os << "rank " << rank << " (global rank " << global_ranks_[static_cast<size_t>(rank)]
     << "): ";
  if (auto left = store_->try_get(LeftKey(rank))) {
    os << "left the group without reaching it (its group was destroyed) after " << *left;
    return os.str();
  }
  const std::optional<std::string> previous =
      sequence_number > 1 ? store_->try_get(ArriveKey(sequence_number - 1, rank)) : std::nullopt;
  if (previous) {
    os << "last completed collective " << *previous;
  } else {
    os << "completed no collective on this group";
  }
  return os.str();
}

void StragglerMonitor::Arrive(const CollectiveInfo& info) {
  const uint64_t seq = info.sequence_number;
  store_->set(ArriveKey(seq, rank_), info.str());
  last_arrived_ = info.str();
  const int size = static_cast<int>(global_ranks_.size());
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) {
    if (r != rank_) keys.push_back(ArriveKey(seq, r));
  }
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + timeout_;
  while (true) {
    const auto now = std::chrono::steady_clock::now();
    const auto slice = std::min<std::chrono::milliseconds>(
        kPollInterval, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now));
    const bool arrived = store_->wait_for(keys, std::max(slice, std::chrono::milliseconds(0)));
    if (auto report = store_->try_get(FailedKey(seq))) {
      FSDP_THROW(ErrorCode::kDeadlineExceeded, "[", info.str(), "] a peer gave up waiting for ",
                 "this collective: ", *report);
    }
    if (arrived) return;
    std::vector<int> missing;
    bool any_left = false;
    for (int r = 0; r < size; ++r) {
      if (r == rank_ || store_->try_get(ArriveKey(seq, r))) continue;
      missing.push_back(r);
      any_left = any_left || store_->try_get(LeftKey(r)).has_value();
    }
    if (missing.empty()) continue;  // the last ones arrived just now
    if (!any_left && std::chrono::steady_clock::now() < deadline) continue;
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - start);
    std::ostringstream report;
    report << "rank " << rank_ << " (global rank " << global_ranks_[static_cast<size_t>(rank_)]
           << ") waited " << waited.count() << " ms (straggler timeout " << timeout_.count()
           << " ms) at " << CollectiveOpName(info.op) << " #" << seq << " on group "
           << info.group_name << " for " << missing.size() << " rank(s) that did not reach it:";
    for (int r : missing) report << "\n    " << DescribeMissing(seq, r);
    // Later arrivals fail at once with this report instead of entering a collective whose other
    // members gave up (set before failing, so that either they see it or this rank saw them).
    store_->set(FailedKey(seq), report.str());
    FSDP_THROW(ErrorCode::kDeadlineExceeded, "[", info.str(), "] ", report.str());
  }
}

}  // namespace fsdp::distributed
