#include "engine/distributed/collective_watchdog.h"

#include <algorithm>
#include <sstream>

#include "engine/core/error.h"

namespace fsdp::distributed {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

milliseconds MillisecondsSince(Clock::time_point t) {
  return std::chrono::duration_cast<milliseconds>(Clock::now() - t);
}

}  // namespace

CollectiveWatchdog::CollectiveWatchdog(std::shared_ptr<Store> store, int rank,
                                       std::vector<int> global_ranks, milliseconds timeout,
                                       AbortFn abort)
    : store_(std::move(store)),
      rank_(rank),
      global_ranks_(std::move(global_ranks)),
      timeout_(timeout),
      interval_(std::clamp<milliseconds>(timeout / 10, milliseconds(10), milliseconds(1000))),
      stale_after_(std::max<milliseconds>(timeout / 2, milliseconds(1000))),
      abort_(std::move(abort)) {
  FSDP_CHECK(store_ != nullptr, "CollectiveWatchdog: null store");
  FSDP_CHECK(timeout_.count() > 0, "CollectiveWatchdog: the straggler timeout must be positive");
  FSDP_CHECK(rank_ >= 0 && rank_ < static_cast<int>(global_ranks_.size()),
             "CollectiveWatchdog: rank ", rank_, " out of range for group size ",
             global_ranks_.size());
  FSDP_CHECK(abort_ != nullptr, "CollectiveWatchdog: null abort function");
  thread_ = std::thread([this] { Run(); });
}

CollectiveWatchdog::~CollectiveWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

std::string CollectiveWatchdog::HeartbeatKey(int rank) {
  return "heartbeat/" + std::to_string(rank);
}

std::string CollectiveWatchdog::HungKey(uint64_t sequence_number) {
  return "hung/" + std::to_string(sequence_number);
}

void CollectiveWatchdog::Started(const CollectiveInfo& info) {
  std::lock_guard<std::mutex> lock(mu_);
  in_flight_ = info;
  started_ = Clock::now();
}

void CollectiveWatchdog::Finished() {
  std::lock_guard<std::mutex> lock(mu_);
  if (in_flight_) last_completed_ = std::move(in_flight_);
  in_flight_.reset();
}

std::optional<std::string> CollectiveWatchdog::aborted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return aborted_;
}

std::optional<std::string> CollectiveWatchdog::HangReport(uint64_t sequence_number) {
  try {
    return store_->try_get(HungKey(sequence_number));
  } catch (const Error&) {  // the store is gone too: there is no report to read
    return std::nullopt;
  }
}

void CollectiveWatchdog::Run() {
  uint64_t beat = 0;
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    lock.unlock();
    try {
      Tick(++beat);
    } catch (const Error&) {
      // The store is unreachable (its host ended): the group's own timeout still applies, and
      // the next tick tries again.
    }
    lock.lock();
    wake_.wait_for(lock, interval_, [this] { return stopping_; });
  }
}

void CollectiveWatchdog::Tick(uint64_t beat) {
  std::optional<CollectiveInfo> info;
  Clock::time_point since;
  std::string state;
  bool already_aborted = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    info = in_flight_;
    since = started_;
    state = info              ? "in " + info->str()
            : last_completed_ ? "completed " + last_completed_->str()
                              : "before its first collective";
    already_aborted = aborted_.has_value();
  }
  store_->set(HeartbeatKey(rank_), std::to_string(beat) + " " + state);
  if (!info || already_aborted) return;
  const milliseconds in_flight = MillisecondsSince(since);
  if (in_flight < timeout_ / 2) return;

  if (auto report = HangReport(info->sequence_number)) {  // a peer named the stuck rank
    Abort(info->sequence_number, *report);
    return;
  }
  // Sample the members' heartbeats for this collective; a sample that differs from the last one
  // means the member's watchdog ran in between.
  if (sampled_sequence_ != info->sequence_number) {
    sampled_sequence_ = info->sequence_number;
    peers_.clear();
  }
  const auto now = Clock::now();
  for (int r = 0; r < static_cast<int>(global_ranks_.size()); ++r) {
    if (r == rank_) continue;
    std::optional<std::string> value = store_->try_get(HeartbeatKey(r));
    auto [it, first] = peers_.try_emplace(r, Peer{value, now});
    if (!first && it->second.beat != value) it->second = Peer{value, now};
  }
  if (in_flight < timeout_) return;
  std::vector<int> stuck;
  for (const auto& [r, peer] : peers_) {
    if (now - peer.changed_at >= stale_after_) stuck.push_back(r);
  }
  if (stuck.empty()) return;  // every member is alive: the collective keeps its own deadline
  const std::string report = Report(*info, since, stuck);
  // Peers blocked elsewhere in the collective read this when their transfers fail (the abort
  // closes this rank's connections), and their own watchdogs adopt it.
  store_->set(HungKey(info->sequence_number), report);
  Abort(info->sequence_number, report);
}

std::string CollectiveWatchdog::Report(const CollectiveInfo& info, Clock::time_point since,
                                       const std::vector<int>& stuck) {
  std::ostringstream os;
  os << "rank " << rank_ << " (global rank " << global_ranks_[static_cast<size_t>(rank_)]
     << ") has been in " << CollectiveOpName(info.op) << " #" << info.sequence_number
     << " on group " << info.group_name << " for " << MillisecondsSince(since).count()
     << " ms (straggler timeout " << timeout_.count() << " ms), which every member reached; "
     << stuck.size() << " rank(s) hang inside it, not responding (no heartbeat for "
     << stale_after_.count() << " ms):";
  for (int r : stuck) {
    const std::optional<std::string>& beat = peers_.at(r).beat;
    std::string last = "no heartbeat ever";
    if (beat) {
      const auto space = beat->find(' ');
      last = "last heartbeat: " + (space == std::string::npos ? *beat : beat->substr(space + 1));
    }
    os << "\n    rank " << r << " (global rank " << global_ranks_[static_cast<size_t>(r)]
       << "): " << last;
  }
  return os.str();
}

void CollectiveWatchdog::Abort(uint64_t sequence_number, const std::string& report) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Nothing to abort when that collective completed meanwhile (the next one is judged anew).
    if (aborted_ || !in_flight_ || in_flight_->sequence_number != sequence_number) return;
    aborted_ = report;
  }
  abort_(report);
}

}  // namespace fsdp::distributed
