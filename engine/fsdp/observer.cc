#include "engine/fsdp/observer.h"

#include <algorithm>
#include <sstream>

#include "engine/core/error.h"
#include "engine/core/rank_context.h"

namespace fsdp::fsdp2 {
namespace {

// The calling rank's observers, in installation order.
struct ObserverRegistry {
  std::vector<Observer*> observers;
};

ObserverRegistry& Registry() { return RankContext::Current().slot<ObserverRegistry>(); }

}  // namespace

const char* EventKindName(EventKind kind) {
  switch (kind) {
    case EventKind::kUnshard: return "unshard";
    case EventKind::kReshard: return "reshard";
    case EventKind::kPreBackward: return "pre_backward";
    case EventKind::kPostBackward: return "post_backward";
  }
  return "unknown";
}

std::string FsdpEvent::str() const {
  std::ostringstream os;
  os << "('" << EventKindName(kind) << "', '" << fqn << "', " << TrainingStateName(state) << ")";
  return os.str();
}

std::string EventsStr(const std::vector<FsdpEvent>& events) {
  std::string out = "[";
  for (size_t i = 0; i < events.size(); ++i) {
    if (i > 0) out += ", ";
    out += events[i].str();
  }
  return out + "]";
}

void RecordingObserver::unshard(const std::string& fqn, TrainingState state) {
  Add(EventKind::kUnshard, fqn, state);
}
void RecordingObserver::reshard(const std::string& fqn, TrainingState state) {
  Add(EventKind::kReshard, fqn, state);
}
void RecordingObserver::pre_backward(const std::string& fqn, TrainingState state) {
  Add(EventKind::kPreBackward, fqn, state);
}
void RecordingObserver::post_backward(const std::string& fqn, TrainingState state) {
  Add(EventKind::kPostBackward, fqn, state);
}

void RecordingObserver::Add(EventKind kind, const std::string& fqn, TrainingState state) {
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back({kind, fqn, state});
}

std::vector<FsdpEvent> RecordingObserver::events() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_;
}

std::vector<FsdpEvent> RecordingObserver::events(const std::set<EventKind>& kinds) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<FsdpEvent> out;
  for (const FsdpEvent& e : events_) {
    if (kinds.count(e.kind)) out.push_back(e);
  }
  return out;
}

void RecordingObserver::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  events_.clear();
}

ScopedObserver::ScopedObserver(Observer& observer) : observer_(&observer) {
  AddObserver(observer_);
}

ScopedObserver::~ScopedObserver() { RemoveObserver(observer_); }

void AddObserver(Observer* observer) {
  FSDP_CHECK(observer != nullptr, "fsdp2::AddObserver: null observer");
  Registry().observers.push_back(observer);
}

void RemoveObserver(Observer* observer) {
  auto& observers = Registry().observers;
  auto it = std::find(observers.begin(), observers.end(), observer);
  if (it != observers.end()) observers.erase(it);
}

namespace internal {

void NotifyObservers(EventKind kind, const std::string& fqn, TrainingState state) {
  // A copy: an observer may install or remove observers.
  const std::vector<Observer*> observers = Registry().observers;
  for (Observer* o : observers) {
    switch (kind) {
      case EventKind::kUnshard: o->unshard(fqn, state); break;
      case EventKind::kReshard: o->reshard(fqn, state); break;
      case EventKind::kPreBackward: o->pre_backward(fqn, state); break;
      case EventKind::kPostBackward: o->post_backward(fqn, state); break;
    }
  }
}

}  // namespace internal
}  // namespace fsdp::fsdp2
