#include "tools/bench/pg_bench_main.h"

#include <unistd.h>

#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <thread>

#include "conformance/process_launcher.h"
#include "engine/core/allocator.h"
#include "engine/core/error.h"
#include "engine/distributed/launch.h"
#include "fakes/run_ranks.h"
#include "fsdp/config.h"
#include "tools/bench/local_launcher.h"
#include "tools/bench/memcpy_bandwidth.h"
#include "tools/bench/pg_bench_report.h"
#include "tools/bench/pg_bench_sweep.h"

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

// --backend threaded: every rank is a thread of this process.
int RunThreaded(const PgBenchOptions& options) {
  const int world = options.world.value_or(kDefaultWorld);
  PgBenchFacts facts;
  facts.backend = "threaded";
  facts.world = world;
  facts.processes = 1;
  facts.nproc = HardwareThreads();
  facts.hostname = HostName();
  facts.load_average = ReadLoadAverage();
  facts.memcpy = MeasureMemcpyBandwidth();
  fakes::RunRanksOptions run_options;
  if (const char* v = std::getenv("FSDP_PG_TIMEOUT_MS")) {
    run_options.timeout = std::chrono::milliseconds(std::atoll(v));
    FSDP_CHECK(run_options.timeout.count() > 0, "FSDP_PG_TIMEOUT_MS='", v,
               "' is not a positive integer");
  }
  auto results = fakes::RunRanks(
      world, [&](fakes::RankEnv& env) { return RunPgBenchSweep(*env.pg, options); }, run_options);
  if (!results.all_ok()) {
    std::cerr << "pg-bench: the threaded run failed:\n" << results.summary();
    return 1;
  }
  const PgBenchSweep& sweep = *results[0].value;
  if (!EmitReport(facts, options, sweep)) return 2;
  return ExitStatus(options, sweep);
}

// ---- [Backend factory] ----------------------------------------------------------------------
// A launched rank's process group and what keeps it alive. This is the one place that maps
// --backend to a process group for ranks started by a launcher (gloo, nccl); a new backend adds
// a branch to CreateLaunchedRank and nothing else.
struct LaunchedRank {
  // The rank's RankContext (installed on this thread) and its world group.
  std::unique_ptr<distributed::DistributedSession> session;
  distributed::ProcessGroup* pg = nullptr;
  Device device = Device::CPU();  // where the benchmark allocates its tensors
};

// Why `backend` cannot run in this build; nullopt when it can.
std::optional<std::string> BackendUnavailable(const std::string& backend) {
  if (backend == "gloo") return std::nullopt;
  if (backend == "nccl") {
#if FSDP_HAVE_NCCL
    if (CudaDeviceCount() == 0) return "backend nccl: no CUDA device visible";
    return std::nullopt;
#else
    return "backend nccl: not built (FSDP_HAVE_NCCL is 0: CUDA or NCCL was not found at "
           "configure time)";
#endif
  }
  return "unknown backend '" + backend + "'";
}

// The session of `launch` with the backend --backend names (never FSDP_BACKEND's, so that
// `pg-bench --backend gloo` stays Gloo whatever the environment says). NCCL: one GPU per
// rank, cuda:LOCAL_RANK; its Work::wait() blocks the host until the collective finished on
// the device, so the timed batches measure completed collectives.
LaunchedRank CreateLaunchedRank(const std::string& backend, const distributed::LaunchEnvironment& launch) {
  if (auto reason = BackendUnavailable(backend)) FSDP_THROW(ErrorCode::kUnavailable, *reason);
  distributed::LaunchEnvironment env = launch;
  env.backend = backend;
  LaunchedRank rank;
  rank.session = distributed::DistributedSession::Create(env);
  rank.pg = &rank.session->world();
  rank.device = backend == "nccl" ? env.device() : Device::CPU();
  return rank;
}
// ---- end of [Backend factory] ----------------------------------------------------------------

// A process backend, this process being one launched rank.
int RunLaunchedRank(const PgBenchOptions& options, const distributed::LaunchEnvironment& launch) {
  FSDP_CHECK(!options.world || *options.world == launch.world_size, "--world ", *options.world,
             " disagrees with the launcher's world size ", launch.world_size, " (", launch.source,
             ")");
  LaunchedRank rank = CreateLaunchedRank(options.backend, launch);
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
  if (pg.rank() == 0) facts.memcpy = MeasureMemcpyBandwidth();
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
  launch.command.push_back(conformance::SelfExecutable());
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
    if (options.backend == "threaded") return RunThreaded(options);
    if (auto reason = BackendUnavailable(options.backend)) {
      std::cerr << "pg-bench: " + *reason + "\n";
      return 1;
    }
    const distributed::LaunchEnvironment launch = distributed::ReadLaunchEnvironment();
    if (launch.source == "default") return LaunchSelf(options, argc, argv);
    who = "rank " + std::to_string(launch.rank) + ": ";
    return RunLaunchedRank(options, launch);
  } catch (const Error& e) {
    std::cerr << "pg-bench: " + who + e.what() + "\n";  // one write: peers may be killed mid-way
    return e.code() == ErrorCode::kInvalidArgument ? 2 : 1;
  }
}

}  // namespace fsdp::bench
