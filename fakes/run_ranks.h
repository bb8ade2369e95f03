// RunRanks: runs a function on N ranks as threads of this process (PyTorch's
// MultiThreadedTestCase / FSDPTestMultiThread harness) and returns every rank's outcome.
//
//   auto results = fakes::RunRanks(4, [](fakes::RankEnv& env) {
//     Tensor t = Tensor::full({2}, env.rank);
//     env.pg->all_reduce(t);
//     return t.to_doubles();
//   });
//   ASSERT_TRUE(results.all_ok()) << results.summary();
//   results[3].value  // std::optional<std::vector<double>>
//
// Each rank thread gets its own RankContext (rank, world size, device, seed; installed with
// RankContextGuard), its world ThreadedProcessGroup (also the rank's default group,
// distributed::GetDefaultProcessGroup()), and runs fn(RankEnv&) or fn(int rank). A rank whose fn
// throws is reported with the error's code and what(); it also aborts the world, so peers
// blocked in a collective fail promptly with kAborted. RunRanks never hangs on a collective:
// every wait has the deadline `timeout`. A rank stuck outside collectives (user code) cannot
// be interrupted; if no rank makes progress for `stall_limit`, RunRanks prints every rank's
// flight recorder to stderr and aborts the process rather than hang. Rank threads are named
// "fsdp-rank-N" for debuggers; FSDP_RUN_RANKS_TIMEOUT_MS, when set, replaces `timeout` (and
// the derived stall limit) so that stepping through one rank in gdb does not time out the
// others (docs/process_groups.md, "Debugging fake ranks under gdb").
//
// RunRanks is a thin user of LaunchRankThreads (thread_launcher.h), with no deadline (every
// rank thread is joined) and the stall watchdog.
//
// Ownership: RunRanks owns the threads, contexts and world for the call; results are values.
// Thread-safety: fn runs concurrently on every rank; RunRanks itself may be called from any
// thread (also nested inside a rank, though that is rarely useful).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "engine/core/device.h"
#include "engine/core/error.h"
#include "engine/core/rank_context.h"
#include "engine/distributed/process_group.h"
#include "fakes/threaded_process_group.h"

namespace fsdp::fakes {

struct RunRanksOptions {
  // Deadline of every collective wait. Default: 30 s.
  std::chrono::milliseconds timeout = std::chrono::seconds(30);
  // Seed of every rank's Generator (one process RNG seed, as in PyTorch's threaded tests).
  // Default: 0.
  uint64_t seed = 0;
  // When true, rank r's generator is seeded with seed + r. Default: false.
  bool seed_by_rank = false;
  // The RankContext device of every rank. Default: CPU.
  Device device = Device::CPU();
  // No-progress limit before RunRanks dumps the flight recorders and aborts the process;
  // zero means 2 * timeout + 10 s. Default: 0.
  std::chrono::milliseconds stall_limit = std::chrono::milliseconds(0);
};

// What a rank function gets.
struct RankEnv {
  int rank = 0;
  int world_size = 1;
  std::shared_ptr<distributed::ProcessGroup> pg;  // the world group (also the default group)
  RankContext* context = nullptr;          // this rank's context (current on this thread)
  ThreadedWorld* world = nullptr;          // the shared world (for Report(), Abort())
};

// One rank's outcome: a value when fn returned, an error code and message when it threw.
template <typename T>
struct RankResult {
  int rank = 0;
  std::optional<T> value;         // set when fn returned
  std::optional<ErrorCode> code;  // set when fn threw (kInternal for non-fsdp exceptions)
  std::string message;            // the exception's what(): "<CodeName>: <message>"
  bool ok() const { return !code.has_value(); }
  // "rank 2: ok" or "rank 2: DeadlineExceeded: ...".
  std::string str() const {
    return "rank " + std::to_string(rank) + ": " + (ok() ? "ok" : message);
  }
};

template <typename T>
class RunResult : public std::vector<RankResult<T>> {
 public:
  using std::vector<RankResult<T>>::vector;
  bool all_ok() const {
    for (const auto& r : *this) {
      if (!r.ok()) return false;
    }
    return true;
  }
  // One line per rank.
  std::string summary() const {
    std::string s;
    for (const auto& r : *this) s += r.str() + "\n";
    return s;
  }
  // Values of all ranks (every rank must be ok()).
  std::vector<T> values() const {
    std::vector<T> out;
    for (const auto& r : *this) {
      FSDP_CHECK_CODE(ErrorCode::kFailedPrecondition, r.ok(), "RunResult::values: ", r.str());
      out.push_back(*r.value);
    }
    return out;
  }
};

namespace internal {
// Runs `fn` on every rank; returns per-rank status (value unset).
RunResult<std::monostate> RunRanksImpl(int world_size, const std::function<void(RankEnv&)>& fn,
                                       const RunRanksOptions& options);
}  // namespace internal

// fn: R(RankEnv&) or R(int rank). Returns RunResult<R>, or RunResult<std::monostate> for void.
template <typename Fn>
auto RunRanks(int world_size, Fn&& fn, const RunRanksOptions& options = {}) {
  constexpr bool kTakesEnv = std::is_invocable_v<Fn&, RankEnv&>;
  static_assert(kTakesEnv || std::is_invocable_v<Fn&, int>,
                "RunRanks: fn must be callable as fn(RankEnv&) or fn(int rank)");
  using R = typename std::conditional_t<kTakesEnv, std::invoke_result<Fn&, RankEnv&>,
                                        std::invoke_result<Fn&, int>>::type;
  using T = std::conditional_t<std::is_void_v<R>, std::monostate, R>;
  std::vector<std::optional<T>> values(static_cast<size_t>(std::max(world_size, 0)));
  auto status = internal::RunRanksImpl(
      world_size,
      [&](RankEnv& env) {
        auto call = [&]() -> decltype(auto) {
          if constexpr (kTakesEnv) {
            return fn(env);
          } else {
            return fn(env.rank);
          }
        };
        if constexpr (std::is_void_v<R>) {
          call();
          values[env.rank].emplace();
        } else {
          values[env.rank].emplace(call());
        }
      },
      options);
  RunResult<T> result(status.size());
  for (size_t r = 0; r < status.size(); ++r) {
    result[r].rank = status[r].rank;
    result[r].code = status[r].code;
    result[r].message = status[r].message;
    if (status[r].ok()) result[r].value = std::move(values[r]);
  }
  return result;
}

}  // namespace fsdp::fakes
