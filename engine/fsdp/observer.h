// FSDP events as first-class observations (architecture: "Events are first-class"): the
// Observer interface receives `unshard`, `reshard`, `pre_backward` and `post_backward` with
// (module FQN, TrainingState) exactly as PyTorch's event tests record them by patching
// FSDPParamGroup (test_fully_shard_comm.py `_get_unshard_with_record` and friends):
//
//  * unshard:       FSDPParamGroup.unshard() was called and is not a no-op, i.e. no all-gather
//                   result is pending and the group is not UNSHARDED (so an all-gather is
//                   issued). State = the group's TrainingState at the call (a prefetch shows
//                   the temporary FORWARD / PRE_BACKWARD state).
//  * reshard:       FSDPParamGroup.reshard() was called and is not the post-forward no-op
//                   (FORWARD with reshard-after-forward off, which includes the root).
//  * pre_backward:  the group's pre-backward ran (not the guarded repeat), after the state
//                   became PRE_BACKWARD and before its unshard (no PyTorch test records it).
//  * post_backward: after FSDPParamGroup.post_backward() ran; state = POST_BACKWARD.
// The root module's FQN is "". See docs/fsdp.md, [Note: FSDP events].
//
// Observers are installed per rank (RankContext slot): ScopedObserver adds one for its
// lifetime on the calling rank. RecordingObserver keeps every event in order.
// Ownership: the registry holds raw pointers; the installer keeps the observer alive while
// installed. Thread-safety: a rank's observers are called on that rank's thread;
// RecordingObserver is synchronised so other threads may read it after the rank finished.
#pragma once

#include <cstdint>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "engine/fsdp/training_state.h"

namespace fsdp::fsdp2 {

enum class EventKind : uint8_t { kUnshard, kReshard, kPreBackward, kPostBackward };

// "unshard", "reshard", "pre_backward", "post_backward".
const char* EventKindName(EventKind kind);

// One recorded event: ("unshard", "layers.0", FORWARD).
struct FsdpEvent {
  EventKind kind = EventKind::kUnshard;
  std::string fqn;
  TrainingState state = TrainingState::kIdle;

  bool operator==(const FsdpEvent& other) const {
    return kind == other.kind && fqn == other.fqn && state == other.state;
  }
  // "('unshard', 'layers.0', FORWARD)", as the Python tuple prints.
  std::string str() const;
};

// "[('unshard', '', FORWARD), ...]".
std::string EventsStr(const std::vector<FsdpEvent>& events);

class Observer {
 public:
  virtual ~Observer() = default;
  virtual void unshard(const std::string& fqn, TrainingState state) {}
  virtual void reshard(const std::string& fqn, TrainingState state) {}
  virtual void pre_backward(const std::string& fqn, TrainingState state) {}
  virtual void post_backward(const std::string& fqn, TrainingState state) {}
};

// Records every event in order.
class RecordingObserver : public Observer {
 public:
  void unshard(const std::string& fqn, TrainingState state) override;
  void reshard(const std::string& fqn, TrainingState state) override;
  void pre_backward(const std::string& fqn, TrainingState state) override;
  void post_backward(const std::string& fqn, TrainingState state) override;

  // All events, or only those of the given kinds (e.g. {kUnshard, kPostBackward}, what the
  // seeds' backward-prefetch tests record).
  std::vector<FsdpEvent> events() const;
  std::vector<FsdpEvent> events(const std::set<EventKind>& kinds) const;
  void clear();

 private:
  void Add(EventKind kind, const std::string& fqn, TrainingState state);
  mutable std::mutex mu_;
  std::vector<FsdpEvent> events_;
};

// Installs `observer` on the calling rank for the guard's lifetime.
class ScopedObserver {
 public:
  explicit ScopedObserver(Observer& observer);
  ~ScopedObserver();
  ScopedObserver(const ScopedObserver&) = delete;
  ScopedObserver& operator=(const ScopedObserver&) = delete;

 private:
  Observer* observer_;
};

// Explicit (un)installation on the calling rank.
void AddObserver(Observer* observer);
void RemoveObserver(Observer* observer);

namespace internal {
// Called by FsdpParamGroup: forwards the event to every observer of the calling rank.
void NotifyObservers(EventKind kind, const std::string& fqn, TrainingState state);
}  // namespace internal

}  // namespace fsdp::fsdp2
