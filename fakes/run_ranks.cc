#include "fakes/run_ranks.h"

#include <pthread.h>

#include <cstdio>
#include <cstdlib>
#include <thread>

namespace fsdp::fakes::internal {

RunResult<std::monostate> RunRanksImpl(int world_size, const std::function<void(RankEnv&)>& fn,
                                       const RunRanksOptions& options) {
  FSDP_CHECK(world_size >= 1, "RunRanks: world size must be >= 1, got ", world_size);
  std::chrono::milliseconds timeout = options.timeout;
  std::chrono::milliseconds stall_limit = options.stall_limit;
  // Debugging aid (docs/process_groups.md): long deadlines while stepping in a debugger.
  if (const char* env = std::getenv("FSDP_RUN_RANKS_TIMEOUT_MS")) {
    const long long ms = std::atoll(env);
    FSDP_CHECK(ms > 0, "FSDP_RUN_RANKS_TIMEOUT_MS='", env, "' is not a positive integer");
    timeout = std::chrono::milliseconds(ms);
    stall_limit = std::chrono::milliseconds(0);
  }
  auto world = ThreadedWorld::Create(world_size, timeout);
  std::vector<std::unique_ptr<RankContext>> contexts;
  contexts.reserve(static_cast<size_t>(world_size));
  for (int r = 0; r < world_size; ++r) {
    const uint64_t seed = options.seed + (options.seed_by_rank ? static_cast<uint64_t>(r) : 0);
    contexts.push_back(std::make_unique<RankContext>(r, world_size, options.device, seed));
    world->AttachRankContext(r, contexts.back().get());
  }
  RunResult<std::monostate> result(static_cast<size_t>(world_size));

  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(world_size));
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] {
      // "fsdp-rank-N" in `info threads` (names are at most 15 characters).
      pthread_setname_np(pthread_self(), ("fsdp-rank-" + std::to_string(r)).c_str());
      RankContextGuard guard(*contexts[r]);
      auto& out = result[r];
      out.rank = r;
      try {
        RankEnv env;
        env.rank = r;
        env.world_size = world_size;
        env.pg = world->CreateWorldGroup(r);
        env.context = contexts[r].get();
        env.world = world.get();
        distributed::SetDefaultProcessGroup(env.pg);
        fn(env);
        out.value.emplace();
      } catch (const Error& e) {
        out.code = e.code();
        out.message = e.what();
      } catch (const std::exception& e) {
        out.code = ErrorCode::kInternal;
        out.message = std::string("non-fsdp exception: ") + e.what();
      } catch (...) {
        out.code = ErrorCode::kInternal;
        out.message = "unknown exception (not derived from std::exception)";
      }
      if (out.code) {
        world->MarkRankFailed(r, out.message);
      } else {
        world->MarkRankReturned(r);
      }
      // Drops this rank's handles (and anything fn stored in the default group slot).
      distributed::SetDefaultProcessGroup(nullptr);
    });
  }

  // Stall watchdog: a rank stuck outside collectives cannot be interrupted; rather than hang,
  // report and abort once nothing has progressed for stall_limit.
  if (stall_limit.count() <= 0) stall_limit = 2 * timeout + std::chrono::milliseconds(10000);
  while (!world->WaitAllFinished(world->last_progress() + stall_limit)) {
    if (std::chrono::steady_clock::now() - world->last_progress() >= stall_limit) {
      std::fprintf(stderr,
                   "fsdp::fakes::RunRanks: no rank made progress for %lld ms and not every rank "
                   "finished; aborting the process instead of hanging.\n%s",
                   static_cast<long long>(stall_limit.count()), world->Report().c_str());
      std::fflush(stderr);
      std::abort();
    }
  }
  for (auto& t : threads) t.join();
  return result;
}

}  // namespace fsdp::fakes::internal
