#include "fakes/run_ranks.h"

#include <cstdio>
#include <cstdlib>

#include "fakes/thread_launcher.h"

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
  if (stall_limit.count() <= 0) stall_limit = 2 * timeout + std::chrono::milliseconds(10000);
  auto world = ThreadedWorld::Create(world_size, timeout);

  ThreadLaunchOptions launch;
  launch.world_size = world_size;
  for (int r = 0; r < world_size; ++r) launch.groups.push_back(world->CreateWorldGroup(r));
  launch.device_of = [&](int) { return options.device; };
  launch.seed_of = [&](int r) {
    return options.seed + (options.seed_by_rank ? static_cast<uint64_t>(r) : 0);
  };
  // No deadline: every rank is joined. Stall watchdog instead: a rank stuck outside
  // collectives cannot be interrupted; rather than hang, report and abort once nothing has
  // progressed for stall_limit.
  launch.watchdog = [&] {
    const auto last = world->last_progress();
    if (std::chrono::steady_clock::now() - last >= stall_limit) {
      std::fprintf(stderr,
                   "fsdp::fakes::RunRanks: no rank made progress for %lld ms and not every rank "
                   "finished; aborting the process instead of hanging.\n%s",
                   static_cast<long long>(stall_limit.count()), world->Report().c_str());
      std::fflush(stderr);
      std::abort();
    }
    return last + stall_limit;
  };
  ThreadedWorld* world_ptr = world.get();
  const auto ranks = LaunchRankThreads(
      std::move(launch), [&fn, world_ptr](ThreadRank& rank) -> std::optional<RankError> {
        RankEnv env;
        env.rank = rank.rank;
        env.world_size = rank.world_size;
        env.pg = rank.pg;
        env.context = rank.context;
        env.world = world_ptr;
        fn(env);
        return std::nullopt;
      });

  RunResult<std::monostate> result(static_cast<size_t>(world_size));
  for (const ThreadRankResult& r : ranks) {
    auto& out = result[r.rank];
    out.rank = r.rank;
    if (r.ok()) {
      out.value.emplace();
    } else {
      out.code = r.error->code;
      out.message = r.error->what();
    }
  }
  return result;
}

}  // namespace fsdp::fakes::internal
