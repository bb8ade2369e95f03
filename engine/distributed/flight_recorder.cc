#include "engine/distributed/flight_recorder.h"

#include <sstream>

#include "engine/core/rank_context.h"

namespace fsdp::distributed {

const char* FlightRecorderEntry::StateName(State state) {
  switch (state) {
    case State::kScheduled:
      return "scheduled";
    case State::kCompleted:
      return "completed";
    case State::kFailed:
      return "failed";
  }
  return "unknown";
}

std::string FlightRecorderEntry::str() const {
  std::ostringstream os;
  os << "#" << id << " " << info.str() << " [" << StateName(state);
  if (state == State::kFailed && !error.empty()) {
    // The first line of the error is enough in a report.
    os << ": " << error.substr(0, error.find('\n'));
  }
  os << "]";
  return os.str();
}

uint64_t FlightRecorder::RecordIssued(const CollectiveInfo& info) {
  std::lock_guard<std::mutex> lock(mu_);
  FlightRecorderEntry entry;
  entry.id = next_id_++;
  entry.info = info;
  entry.issued_at = std::chrono::steady_clock::now();
  entries_.push_back(std::move(entry));
  while (entries_.size() > capacity_) entries_.pop_front();
  return entries_.back().id;
}

FlightRecorderEntry* FlightRecorder::Find(uint64_t id) {
  for (auto it = entries_.rbegin(); it != entries_.rend(); ++it) {
    if (it->id == id) return &*it;
  }
  return nullptr;
}

void FlightRecorder::RecordCompleted(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto* e = Find(id)) e->state = FlightRecorderEntry::State::kCompleted;
}

void FlightRecorder::RecordFailed(uint64_t id, const std::string& error) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto* e = Find(id)) {
    e->state = FlightRecorderEntry::State::kFailed;
    e->error = error;
  }
}

std::vector<FlightRecorderEntry> FlightRecorder::Last(size_t n) const {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t k = std::min(n, entries_.size());
  return std::vector<FlightRecorderEntry>(entries_.end() - static_cast<std::ptrdiff_t>(k),
                                          entries_.end());
}

uint64_t FlightRecorder::issued_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return next_id_ - 1;
}

std::string FlightRecorder::Dump(size_t n, const std::string& indent) const {
  const auto entries = Last(n);
  if (entries.empty()) return indent + "(none)\n";
  std::ostringstream os;
  for (const auto& e : entries) os << indent << e.str() << "\n";
  return os.str();
}

void FlightRecorder::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  entries_.clear();
}

namespace {
// RankContext slots hold default-constructed values; this one shares its recorder.
struct FlightRecorderSlot {
  std::shared_ptr<FlightRecorder> recorder = std::make_shared<FlightRecorder>();
};
}  // namespace

FlightRecorder& CurrentFlightRecorder() {
  return *RankContext::Current().slot<FlightRecorderSlot>().recorder;
}

std::shared_ptr<FlightRecorder> FlightRecorderOf(RankContext& context) {
  return context.slot<FlightRecorderSlot>().recorder;
}

}  // namespace fsdp::distributed
