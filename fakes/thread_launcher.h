// LaunchRankThreads: the one launcher that runs a world's ranks as threads of this process.
// fakes::RunRanks (run_ranks.h) and conformance::ThreadedLauncher are thin users of it.
//
//   ThreadLaunchOptions options;
//   options.world_size = 4;
//   options.groups = MakeThreadedWorldGroups(4, timeout);   // or empty: no groups
//   options.timeout = std::chrono::seconds(60);
//   options.failure_grace = std::chrono::seconds(5);
//   auto results = LaunchRankThreads(std::move(options), [](ThreadRank& r) {
//     r.pg->barrier();
//     return std::optional<RankError>();  // ok; or throw, or return an error
//   });
//
// Per rank it starts one thread named "fsdp-rank-N", gives it its own RankContext (rank, world
// size, device_of(r), seed_of(r); installed with RankContextGuard) and installs groups[r] as
// the thread's default process group (distributed::GetDefaultProcessGroup), then runs the
// body. A body ends ok (returns nullopt), failed (returns a RankError, or throws: the exception
// becomes RankError::FromException, fsdp::Error keeping its code). When groups[r] is a
// fakes::ThreadedProcessGroup the launcher also keeps its ThreadedWorld informed
// (AttachRankContext, then MarkRankReturned or MarkRankFailed), so that peers blocked in a
// collective with a failed rank fail at once with kAborted.
//
// The launcher then waits for every rank, until `timeout` after the start or, once a rank
// failed, until `failure_grace` after the first failure. Finished threads are joined; a thread
// still running then cannot be killed: it is detached (it keeps the launch's shared state
// alive, so it never touches freed memory) and its rank is reported kAborted (after a failure)
// or kDeadlineExceeded. With the defaults (no deadline, no grace limit) every thread is joined.
// `watchdog`, when set, is called while waiting (RunRanks' stall detector lives there).
//
// Ownership: the launch owns threads, contexts and groups (shared with detached threads);
// results are values. The body is copied and shared by every rank thread; what it captures by
// reference must outlive the launch when threads may be detached (finite deadline or grace).
// Thread-safety: the body runs concurrently on every rank; LaunchRankThreads may be called
// from any thread, concurrently with other launches.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/core/device.h"
#include "engine/core/error.h"
#include "engine/core/rank_context.h"
#include "engine/distributed/process_group.h"

namespace fsdp::fakes {

// How a rank failed: an error code and a message (without the code name).
struct RankError {
  ErrorCode code = ErrorCode::kInternal;
  std::string message;
  // "<CodeName>: <message>", as fsdp::Error::what().
  std::string what() const;
  // The one exception -> error mapping of the launchers: fsdp::Error keeps its code and
  // message; any other std::exception is kInternal "uncaught exception: <what()>"; anything
  // else is kInternal "uncaught non-standard exception".
  static RankError FromException(std::exception_ptr error);
};

// What a rank body gets.
struct ThreadRank {
  int rank = 0;
  int world_size = 1;
  std::shared_ptr<distributed::ProcessGroup> pg;  // groups[rank] (the default group); may be null
  RankContext* context = nullptr;                 // this rank's context (current on this thread)
};

// One rank's end.
struct ThreadRankResult {
  int rank = 0;
  std::optional<RankError> error;  // unset: the body returned ok
  bool detached = false;           // still running at the end of the wait; thread detached
  double seconds = 0;              // the body's wall time (detached: time since the launch)
  bool ok() const { return !error.has_value(); }
};

struct ThreadLaunchOptions {
  int world_size = 1;
  // Element r is rank r's group (and default group); empty: no rank gets a group.
  std::vector<std::shared_ptr<distributed::ProcessGroup>> groups;
  // Rank r's RankContext device and generator seed. Default: CPU, seed 0.
  std::function<Device(int rank)> device_of;
  std::function<uint64_t(int rank)> seed_of;
  // Deadline of the whole launch: ranks still running `timeout` after the start are detached
  // and reported kDeadlineExceeded. Default: none (wait for every rank).
  std::chrono::milliseconds timeout = std::chrono::milliseconds::max();
  // Once a rank failed, ranks still running this long after the first failure are detached
  // and reported kAborted. Default: none.
  std::chrono::milliseconds failure_grace = std::chrono::milliseconds::max();
  // Names the launch in kDeadlineExceeded messages ("<label> rank 2 did not finish ...").
  std::string label = "launch";
  // Called while not every rank finished, first at once, then at the time it returns (or when
  // a rank finishes, if earlier). It may abort the process (a stall watchdog). Default: none.
  std::function<std::chrono::steady_clock::time_point()> watchdog;
};

// The body: returns nullopt when the rank succeeded, or its error (it may also throw).
using RankBody = std::function<std::optional<RankError>(ThreadRank&)>;

// Runs `body` on options.world_size rank threads; returns exactly world_size results, element
// r for rank r. The launch takes the groups: the caller keeps no handle unless it copied one.
std::vector<ThreadRankResult> LaunchRankThreads(ThreadLaunchOptions options, RankBody body);

}  // namespace fsdp::fakes
