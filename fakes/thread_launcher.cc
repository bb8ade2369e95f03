#include "fakes/thread_launcher.h"

#include <pthread.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <system_error>
#include <thread>

#include "fakes/threaded_process_group.h"

namespace fsdp::fakes {

namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string Seconds(std::chrono::milliseconds ms) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3g s", static_cast<double>(ms.count()) / 1000.0);
  return buf;
}

// `from + d`, or time_point::max() when `d` is "none" (too long to add without overflow).
Clock::time_point After(Clock::time_point from, std::chrono::milliseconds d) {
  if (d >= std::chrono::hours(24 * 365 * 100)) return Clock::time_point::max();
  return from + d;
}

// One rank's state, shared by the launcher and every rank thread.
struct Slot {
  Slot(int rank, int world_size, Device device, uint64_t seed)
      : context(rank, world_size, device, seed) {}
  RankContext context;
  std::shared_ptr<distributed::ProcessGroup> pg;  // touched by the rank thread only once started
  std::shared_ptr<ThreadedWorld> world;           // set for fakes::ThreadedProcessGroup groups
  // Guarded by Launch::mu.
  bool done = false;
  std::optional<RankError> error;
  double seconds = 0;
};

// What the launcher and the rank threads share. Owned jointly, so that a detached (hung) rank
// thread never touches freed memory; every thread holds all slots, because the fake's world
// reads any rank's context in its reports.
struct Launch {
  RankBody body;
  int world_size = 1;
  std::vector<std::unique_ptr<Slot>> slots;
  std::mutex mu;
  std::condition_variable cv;
  int finished = 0;         // guarded by mu
  int first_failed = -1;    // guarded by mu
  Clock::time_point first_failure;  // guarded by mu
};

// Records rank r's end (`error` unset: it returned) and wakes the launcher.
void FinishRank(Launch& launch, int r, std::optional<RankError> error, double seconds) {
  Slot& slot = *launch.slots[r];
  std::lock_guard<std::mutex> lock(launch.mu);
  slot.done = true;
  slot.seconds = seconds;
  if (error && launch.first_failed < 0) {
    launch.first_failed = r;
    launch.first_failure = Clock::now();
  }
  slot.error = std::move(error);
  ++launch.finished;
  launch.cv.notify_all();
}

void RunRankThread(const std::shared_ptr<Launch>& launch, int r) {
  // "fsdp-rank-N" in `info threads` (names are at most 15 characters).
  pthread_setname_np(pthread_self(), ("fsdp-rank-" + std::to_string(r)).c_str());
  Slot& slot = *launch->slots[r];
  const auto start = Clock::now();
  std::optional<RankError> error;
  {
    RankContextGuard guard(slot.context);
    ThreadRank rank;
    rank.rank = r;
    rank.world_size = launch->world_size;
    rank.pg = slot.pg;
    rank.context = &slot.context;
    distributed::SetDefaultProcessGroup(slot.pg);
    try {
      error = launch->body(rank);
    } catch (...) {
      error = RankError::FromException(std::current_exception());
    }
    if (slot.world) {
      if (error) {
        slot.world->MarkRankFailed(r, error->what());
      } else {
        slot.world->MarkRankReturned(r);
      }
    }
    // Drops this rank's handles (and anything the body stored in the default group slot).
    distributed::SetDefaultProcessGroup(nullptr);
  }
  slot.pg.reset();  // release the group before reporting completion
  FinishRank(*launch, r, std::move(error), SecondsSince(start));
}

}  // namespace

std::string RankError::what() const { return std::string(ErrorCodeName(code)) + ": " + message; }

RankError RankError::FromException(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    return {e.code(), e.message()};
  } catch (const std::exception& e) {
    return {ErrorCode::kInternal, std::string("uncaught exception: ") + e.what()};
  } catch (...) {
    return {ErrorCode::kInternal, "uncaught non-standard exception"};
  }
}

std::vector<ThreadRankResult> LaunchRankThreads(ThreadLaunchOptions options, RankBody body) {
  const int world_size = options.world_size;
  FSDP_CHECK(world_size >= 1, "LaunchRankThreads: world size must be >= 1, got ", world_size);
  FSDP_CHECK(options.groups.empty() || static_cast<int>(options.groups.size()) == world_size,
             "LaunchRankThreads: ", options.groups.size(), " groups for world ", world_size);
  FSDP_CHECK(body != nullptr, "LaunchRankThreads: no rank body");
  const auto start = Clock::now();

  auto launch = std::make_shared<Launch>();
  launch->body = std::move(body);
  launch->world_size = world_size;
  launch->slots.reserve(static_cast<size_t>(world_size));
  for (int r = 0; r < world_size; ++r) {
    const Device device = options.device_of ? options.device_of(r) : Device::CPU();
    const uint64_t seed = options.seed_of ? options.seed_of(r) : 0;
    auto slot = std::make_unique<Slot>(r, world_size, device, seed);
    if (!options.groups.empty()) slot->pg = std::move(options.groups[r]);
    // The fake's world learns about rank ends, so that peers of a failed rank fail promptly.
    if (auto* threaded = dynamic_cast<ThreadedProcessGroup*>(slot->pg.get())) {
      threaded->world().AttachRankContext(r, &slot->context);
      slot->world = threaded->world().shared_from_this();
    }
    launch->slots.push_back(std::move(slot));
  }

  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(world_size));
  for (int r = 0; r < world_size; ++r) {
    try {
      threads.emplace_back([launch, r] { RunRankThread(launch, r); });
    } catch (const std::system_error& e) {
      // No thread for ranks r.. (the process's thread limit): each fails as if it had thrown at
      // once, so the started ranks' collectives with them fail promptly instead of hanging.
      for (int q = r; q < world_size; ++q) {
        Slot& slot = *launch->slots[q];
        const RankError error{ErrorCode::kUnavailable,
                              "cannot start a thread for rank " + std::to_string(q) + " of " +
                                  std::to_string(world_size) + ": " + e.what()};
        if (slot.world) slot.world->MarkRankFailed(q, error.what());
        slot.pg.reset();
        FinishRank(*launch, q, error, 0);
      }
      break;
    }
  }

  const auto deadline = After(start, options.timeout);
  std::vector<ThreadRankResult> results(static_cast<size_t>(world_size));
  {
    std::unique_lock<std::mutex> lock(launch->mu);
    auto next_watch = Clock::time_point::min();
    while (launch->finished < world_size) {
      auto until = deadline;
      if (launch->first_failed >= 0) {
        until = std::min(until, After(launch->first_failure, options.failure_grace));
      }
      const auto now = Clock::now();
      if (now >= until) break;
      if (options.watchdog) {
        if (now >= next_watch) {
          lock.unlock();
          next_watch = options.watchdog();
          lock.lock();
          continue;
        }
        until = std::min(until, next_watch);
      }
      if (until == Clock::time_point::max()) {
        launch->cv.wait(lock);
      } else {
        launch->cv.wait_until(lock, until);
      }
    }
    for (int r = 0; r < world_size; ++r) {
      const Slot& slot = *launch->slots[r];
      ThreadRankResult& out = results[r];
      out.rank = r;
      if (slot.done) {
        out.error = slot.error;
        out.seconds = slot.seconds;
        continue;
      }
      out.detached = true;
      out.seconds = SecondsSince(start);
      if (launch->first_failed >= 0) {
        out.error = RankError{ErrorCode::kAborted,
                              "still running " + Seconds(options.failure_grace) + " after rank " +
                                  std::to_string(launch->first_failed) +
                                  " failed (blocked in a collective?); thread detached"};
      } else {
        out.error = RankError{ErrorCode::kDeadlineExceeded,
                              options.label + " rank " + std::to_string(r) +
                                  " did not finish within " + Seconds(options.timeout) +
                                  " (hung? thread detached)"};
      }
    }
  }
  for (int r = 0; r < world_size; ++r) {
    bool done;
    {
      std::lock_guard<std::mutex> lock(launch->mu);
      done = launch->slots[r]->done;
    }
    if (static_cast<size_t>(r) >= threads.size()) continue;  // never started
    if (done) {
      threads[r].join();
    } else {
      threads[r].detach();
    }
  }
  return results;
}

}  // namespace fsdp::fakes
