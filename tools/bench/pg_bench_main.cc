#include "tools/bench/pg_bench_main.h"

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <thread>

#include "engine/core/error.h"
#include "engine/core/rank_context.h"
#include "engine/distributed/backend_registry.h"
#include "engine/distributed/launch.h"
#include "fakes/threaded_backend.h"
#include "fakes/thread_launcher.h"
#include "tools/bench/memcpy_bandwidth.h"
#include "tools/bench/pg_bench_report.h"
#include "tools/bench/pg_bench_sweep.h"
#include "tools/launch/local_launcher.h"

namespace fsdp::bench {

namespace {

constexpr int kDefaultWorld = 2;

std::string HostName() {
  char host[256] = {0};
  if (::gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') return "localhost";
  return host;
}

int HardwareThreads() {
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

// Writes the report: JSON to the --json target, the table to stdout (stderr when the JSON
// goes to stdout). Returns false when the JSON file cannot be written.
bool EmitReport(const PgBenchFacts& facts, const PgBenchOptions& options,
                const PgBenchSweep& sweep) {
  const std::string text = PgBenchText(facts, options, sweep);
  const bool json_to_stdout = options.json_path == "-";
  (json_to_stdout ? std::cerr : std::cout) << text << std::flush;
  if (options.json_path.empty()) return true;
  const std::string json = PgBenchJson(facts, options, sweep).dump(2) + "\n";
  if (json_to_stdout) {
    std::cout << json << std::flush;
    return true;
  }
  std::ofstream out(options.json_path, std::ios::binary | std::ios::trunc);
  out << json;
  if (!out) {
    std::cerr << "pg-bench: cannot write --json " << options.json_path << "\n";
    return false;
  }
  return true;
}

int ExitStatus(const PgBenchOptions& options, const PgBenchSweep& sweep) {
  const int64_t wrong = TotalWrong(sweep.rows);
  if (options.check && wrong > 0) {
    std::cerr << "pg-bench: " << wrong << " wrong elements (see the #wrong column)\n";
    return 1;
  }
  return 0;
}

// A backend whose ranks are threads (--backend threaded): every rank is a thread of this
// process, on the group spec.threaded_world gives it.
int RunThreaded(const distributed::BackendSpec& spec, const PgBenchOptions& options) {
  const int world = options.world.value_or(kDefaultWorld);
  PgBenchFacts facts;
  facts.backend = spec.name;
  facts.world = world;
  facts.processes = 1;
  facts.nproc = HardwareThreads();
  facts.hostname = HostName();
  facts.load_average = ReadLoadAverage();
  facts.memcpy = MeasureMemcpyBandwidth();
  facts.memcpy_all_cores = MeasureMemcpyBandwidth(size_t{64} << 20, 5, facts.nproc);
  std::chrono::milliseconds timeout = std::chrono::seconds(30);
  if (const char* v = std::getenv("FSDP_PG_TIMEOUT_MS")) {
    timeout = std::chrono::milliseconds(std::atoll(v));
    FSDP_CHECK(timeout.count() > 0, "FSDP_PG_TIMEOUT_MS='", v, "' is not a positive integer");
  }
  const std::vector<std::shared_ptr<distributed::ProcessGroup>> groups =
      spec.threaded_world(world, timeout);
  FSDP_CHECK(static_cast<int>(groups.size()) == world, "backend ", spec.name, " made ",
             groups.size(), " groups for a world of ", world);
  // The one thread launcher: rank contexts, default groups, exceptions as rank errors, and
  // peers of a failed rank released at once instead of at the timeout.
  std::vector<std::optional<PgBenchSweep>> sweeps(static_cast<size_t>(world));
  fakes::ThreadLaunchOptions launch;
  launch.world_size = world;
  launch.groups = groups;
  launch.label = "pg-bench";
  const std::vector<fakes::ThreadRankResult> results =
      fakes::LaunchRankThreads(std::move(launch), [&](fakes::ThreadRank& rank) {
        sweeps[static_cast<size_t>(rank.rank)] = RunPgBenchSweep(*rank.pg, options);
        return std::optional<fakes::RankError>();
      });
  bool all_ok = true;
  std::string summary;
  for (const fakes::ThreadRankResult& result : results) {
    all_ok = all_ok && result.ok();
    summary += "rank " + std::to_string(result.rank) + ": " +
               (result.ok() ? "ok" : result.error->what()) + "\n";
  }
  if (!all_ok) {
    std::cerr << "pg-bench: the threaded run failed:\n" << summary;
    return 1;
  }
  const PgBenchSweep& sweep = *sweeps[0];
  if (!EmitReport(facts, options, sweep)) return 2;
  return ExitStatus(options, sweep);
}

// ---- [Backend factory] ----------------------------------------------------------------------
// --backend names a backend of fakes::DefaultBackends() (distributed::BackendRegistry); its
// capabilities say whether its ranks are threads (RunThreaded) or processes. A launched rank's
// process group and what keeps it alive: distributed::DistributedSession builds it from the
// launch environment through the same registry, with the backend --backend names (never
// FSDP_BACKEND's, so that `pg-bench --backend gloo` stays Gloo whatever the environment says).
struct LaunchedRank {
  // The rank's RankContext (installed on this thread) and its world group.
  std::unique_ptr<distributed::DistributedSession> session;
  distributed::ProcessGroup* pg = nullptr;
  Device device = Device::CPU();  // where the benchmark allocates its tensors
};

// Device backends (NCCL): one device per rank, the backend's device for LOCAL_RANK; its
// Work::wait() blocks the host until the collective finished on the device, so the timed
// batches measure completed collectives.
LaunchedRank CreateLaunchedRank(const distributed::BackendSpec& spec,
                                const distributed::LaunchEnvironment& launch) {
  distributed::LaunchEnvironment env = launch;
  env.backend = spec.name;
  LaunchedRank rank;
  rank.session = distributed::DistributedSession::Create(env);
  rank.pg = &rank.session->world();
  rank.device = spec.DeviceOf(env.local_rank);
  return rank;
}
// ---- end of [Backend factory] ----------------------------------------------------------------

// A process backend, this process being one launched rank.
int RunLaunchedRank(const distributed::BackendSpec& spec, const PgBenchOptions& options,
                    const distributed::LaunchEnvironment& launch) {
  FSDP_CHECK(!options.world || *options.world == launch.world_size, "--world ", *options.world,
             " disagrees with the launcher's world size ", launch.world_size, " (", launch.source,
             ")");
  LaunchedRank rank = CreateLaunchedRank(spec, launch);
  distributed::ProcessGroup& pg = *rank.pg;
  PgBenchFacts facts;
  facts.backend = options.backend;
  facts.world = pg.size();
  facts.processes = pg.size();
  facts.nproc = HardwareThreads();
  facts.hostname = HostName();
  facts.load_average = ReadLoadAverage();
  // The memcpy yardstick, measured by rank 0 while the other ranks wait in a barrier.
  pg.barrier();
  if (pg.rank() == 0) {
    facts.memcpy = MeasureMemcpyBandwidth();
    facts.memcpy_all_cores = MeasureMemcpyBandwidth(size_t{64} << 20, 5, facts.nproc);
  }
  pg.barrier();
  const PgBenchSweep sweep = RunPgBenchSweep(pg, options, rank.device);
  if (pg.rank() != 0) return ExitStatus(options, sweep) != 0 ? 1 : 0;
  if (!EmitReport(facts, options, sweep)) return 2;
  return ExitStatus(options, sweep);
}

// A process backend without a launcher: start --world copies of this program as the ranks.
int LaunchSelf(const PgBenchOptions& options, int argc, char** argv) {
  LocalLaunchOptions launch;
  launch.nproc_per_node = options.world.value_or(kDefaultWorld);
  launch.prefix_output = false;  // rank 0 prints the report; errors name their rank
  launch.name = "pg-bench";
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  FSDP_CHECK_CODE(ErrorCode::kUnavailable, !ec, "cannot resolve /proc/self/exe: ", ec.message());
  launch.command.push_back(self.string());
  for (int i = 1; i < argc; ++i) launch.command.emplace_back(argv[i]);
  return RunLocalWorld(launch);
}

}  // namespace

int PgBenchMain(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  PgBenchOptions options;
  try {
    bool help = false;
    options = ParsePgBenchArgs(args, &help);
    if (help) {
      std::cout << PgBenchUsage();
      return 0;
    }
  } catch (const Error& e) {
    std::cerr << e.message() << "\n\n" << PgBenchUsage();
    return 2;
  }
  std::string who;  // "rank R: " once this process is known to be a launched rank
  try {
    const distributed::BackendRegistry backends = fakes::DefaultBackends();
    const distributed::BackendSpec& spec = backends.Get(options.backend);
    if (auto reason = backends.Unavailable(spec.name)) {
      std::cerr << "pg-bench: " + *reason + "\n";
      return 1;
    }
    if (spec.capabilities.ranks == distributed::RankPlacement::kThreads) {
      return RunThreaded(spec, options);
    }
    const distributed::LaunchEnvironment launch = distributed::ReadLaunchEnvironment();
    if (launch.source == "default") return LaunchSelf(options, argc, argv);
    who = "rank " + std::to_string(launch.rank) + ": ";
    return RunLaunchedRank(spec, options, launch);
  } catch (const Error& e) {
    std::cerr << "pg-bench: " + who + e.what() + "\n";  // one write: peers may be killed mid-way
    return e.code() == ErrorCode::kInvalidArgument ? 2 : 1;
  }
}

}  // namespace fsdp::bench
