#include "conformance/threaded_launcher.h"

#include <pthread.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <thread>

#include "engine/core/rank_context.h"
#include "fakes/threaded_process_group.h"

namespace fsdp::conformance {

namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// What the launcher and one rank thread share. Owned jointly, so that a detached (hung) rank
// thread never touches freed memory.
struct RankSlot {
  RankSlot(int rank, int world, Device device) : context(rank, world, device) {}
  RankContext context;
  RankEnv env;
  std::shared_ptr<const Subject> subject;
  const Scenario* scenario = nullptr;
  std::shared_ptr<fakes::ThreadedWorld> world;  // set for fakes::ThreadedProcessGroup groups
  RankOutcome outcome;
  bool done = false;  // guarded by Completion::mu
};

// Completion signalling shared by the rank threads and the launcher.
struct Completion {
  std::mutex mu;
  std::condition_variable cv;
  int finished = 0;
  bool any_failed = false;
  Clock::time_point first_failure;
};

std::string Seconds(std::chrono::milliseconds ms) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3g s", static_cast<double>(ms.count()) / 1000.0);
  return buf;
}

}  // namespace

RankOutcome RunGuarded(const std::function<nlohmann::json()>& body) {
  const auto start = Clock::now();
  try {
    nlohmann::json obs = body();
    return RankOutcome::Ok(std::move(obs), SecondsSince(start));
  } catch (const CaseSkipped& e) {
    return RankOutcome::Skipped(e.reason(), SecondsSince(start));
  } catch (const Error& e) {
    return RankOutcome::Failed(e.code(), e.message(), SecondsSince(start));
  } catch (const nlohmann::json::exception& e) {
    return RankOutcome::Failed(ErrorCode::kInternal, std::string("JSON error: ") + e.what(),
                               SecondsSince(start));
  } catch (const std::exception& e) {
    return RankOutcome::Failed(ErrorCode::kInternal, std::string("uncaught exception: ") + e.what(),
                               SecondsSince(start));
  } catch (...) {
    return RankOutcome::Failed(ErrorCode::kInternal, "uncaught non-standard exception",
                               SecondsSince(start));
  }
}

ThreadedLauncher::ThreadedLauncher(distributed::BackendSpec backend,
                                   std::shared_ptr<const Subject> subject)
    : backend_(std::move(backend)), subject_(std::move(subject)) {
  FSDP_CHECK(subject_ != nullptr, "ThreadedLauncher needs a subject");
  FSDP_CHECK(backend_.capabilities.ranks == distributed::RankPlacement::kThreads,
             "ThreadedLauncher: backend ", backend_.name, " runs ranks as processes");
}

std::vector<RankOutcome> ThreadedLauncher::Launch(const LaunchRequest& request) {
  FSDP_CHECK(request.scenario != nullptr, "ThreadedLauncher: no scenario");
  const int world = request.world;
  FSDP_CHECK(world >= 1, "ThreadedLauncher: world must be >= 1, got ", world);
  const std::string& name = request.scenario->info.name;
  const auto start = Clock::now();

  // The world's groups. A factory failure is every rank's failure.
  std::vector<std::shared_ptr<distributed::ProcessGroup>> groups;
  if (backend_.threaded_world) {
    const auto collective_timeout =
        std::max(std::chrono::milliseconds(1), request.timeout * 9 / 10);
    RankOutcome made = RunGuarded([&] {
      groups = backend_.threaded_world(world, collective_timeout);
      FSDP_CHECK_CODE(ErrorCode::kInternal, static_cast<int>(groups.size()) == world, "the '",
                      request.backend, "' group factory returned ", groups.size(),
                      " groups for world ", world);
      for (int r = 0; r < world; ++r) {
        FSDP_CHECK_CODE(ErrorCode::kInternal,
                        groups[r] && groups[r]->rank() == r && groups[r]->size() == world, "the '",
                        request.backend, "' group factory returned a bad group for rank ", r,
                        " of ", world);
      }
      return nlohmann::json();
    });
    if (made.status != RankOutcome::Status::kOk) {
      made.message = "creating the world group: " + made.message;
      return std::vector<RankOutcome>(world, made);
    }
  } else {
    FSDP_CHECK_CODE(ErrorCode::kUnavailable, world == 1, "scenario ", name, ": backend '",
                    request.backend,
                    "' has no process-group factory, so it can run one rank "
                    "only, not ",
                    world);
    groups.resize(1);
  }

  auto completion = std::make_shared<Completion>();
  // Every rank thread shares all slots: the fake's world reads any rank's context in its
  // reports, so no context may die while a (possibly detached) rank thread still runs.
  auto all_slots = std::make_shared<std::vector<std::shared_ptr<RankSlot>>>();
  std::vector<std::shared_ptr<RankSlot>>& slots = *all_slots;
  std::vector<std::thread> threads;
  slots.reserve(world);
  threads.reserve(world);
  for (int r = 0; r < world; ++r) {
    const Device device = backend_.DeviceOf(r);
    auto slot = std::make_shared<RankSlot>(r, world, device);
    slot->env.scenario = name;
    slot->env.rank = r;
    slot->env.world = world;
    slot->env.params = request.params;
    slot->env.backend = request.backend;
    slot->env.device = device;
    slot->env.pg = groups[r];
    slot->subject = subject_;
    slot->scenario = request.scenario;
    // The fake's world learns about rank ends, so that peers of a failed rank fail promptly.
    auto* threaded = dynamic_cast<fakes::ThreadedProcessGroup*>(groups[r].get());
    if (threaded != nullptr) threaded->world().AttachRankContext(r, &slot->context);
    slot->world = threaded != nullptr ? threaded->world().shared_from_this() : nullptr;
    slots.push_back(slot);
  }
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([all_slots, r, completion] {
      const std::shared_ptr<RankSlot>& slot = (*all_slots)[r];
      pthread_setname_np(pthread_self(), ("fsdp-rank-" + std::to_string(slot->env.rank)).c_str());
      RankOutcome outcome;
      {
        RankContextGuard guard(slot->context);
        distributed::SetDefaultProcessGroup(slot->env.pg);
        outcome = RunGuarded([&] { return slot->subject->RunRank(*slot->scenario, slot->env); });
        if (slot->world) {
          if (outcome.status == RankOutcome::Status::kError) {
            slot->world->MarkRankFailed(
                slot->env.rank, std::string(ErrorCodeName(outcome.code)) + ": " + outcome.message);
          } else {
            slot->world->MarkRankReturned(slot->env.rank);
          }
        }
        distributed::SetDefaultProcessGroup(nullptr);
      }
      slot->env.pg.reset();  // release the group before reporting completion
      std::lock_guard<std::mutex> lock(completion->mu);
      slot->outcome = std::move(outcome);
      slot->done = true;
      ++completion->finished;
      if (slot->outcome.status == RankOutcome::Status::kError && !completion->any_failed) {
        completion->any_failed = true;
        completion->first_failure = Clock::now();
      }
      completion->cv.notify_all();
    });
  }
  groups.clear();

  const auto deadline = start + request.timeout;
  std::vector<RankOutcome> outcomes(world);
  {
    std::unique_lock<std::mutex> lock(completion->mu);
    while (completion->finished < world) {
      auto until = deadline;
      if (completion->any_failed) {
        until = std::min(until, completion->first_failure + request.failure_grace);
      }
      if (Clock::now() >= until) break;
      completion->cv.wait_until(lock, until);
    }
    int first_failed = -1;
    for (int r = 0; r < world; ++r) {
      if (slots[r]->done && slots[r]->outcome.status == RankOutcome::Status::kError &&
          first_failed < 0) {
        first_failed = r;
      }
    }
    for (int r = 0; r < world; ++r) {
      if (slots[r]->done) {
        outcomes[r] = slots[r]->outcome;
      } else if (first_failed >= 0) {
        outcomes[r] = RankOutcome::Failed(ErrorCode::kAborted,
                                          "still running " + Seconds(request.failure_grace) +
                                              " after rank " + std::to_string(first_failed) +
                                              " failed (blocked in a collective?); thread "
                                              "detached",
                                          SecondsSince(start));
      } else {
        outcomes[r] = RankOutcome::Failed(ErrorCode::kDeadlineExceeded,
                                          "scenario " + name + " rank " + std::to_string(r) +
                                              " did not finish within " + Seconds(request.timeout) +
                                              " (hung? thread detached)",
                                          SecondsSince(start));
      }
    }
  }
  for (int r = 0; r < world; ++r) {
    bool done;
    {
      std::lock_guard<std::mutex> lock(completion->mu);
      done = slots[r]->done;
    }
    if (done) {
      threads[r].join();
    } else {
      threads[r].detach();
    }
  }
  return outcomes;
}

}  // namespace fsdp::conformance
