#include "conformance/process_launcher.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "conformance/driver_protocol.h"
#include "conformance/flight_recorder_file.h"
#include "conformance/interrupt.h"
#include "conformance/observations.h"
#include "engine/core/error.h"
#include "engine/distributed/launch/process_launcher.h"
#include "engine/serialization/atomic_file.h"
#include "engine/serialization/safetensors.h"

namespace fsdp::conformance {

namespace {

using Clock = std::chrono::steady_clock;

// Between SIGTERM and SIGKILL when stopping a case's ranks.
constexpr std::chrono::milliseconds kKillGrace{1000};

}  // namespace

std::string FormatSeconds(std::chrono::milliseconds ms) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3g s", static_cast<double>(ms.count()) / 1000.0);
  return buf;
}

std::string MakeRunDir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string templ = std::string(tmp && *tmp ? tmp : "/tmp") + "/fsdp-conform.XXXXXX";
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  FSDP_CHECK_CODE(ErrorCode::kUnavailable, ::mkdtemp(buf.data()) != nullptr,
                  "cannot create a run directory from ", templ, ": ", std::strerror(errno));
  return std::string(buf.data());
}

std::string LogTail(const std::string& path, int max_lines) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  const std::streamoff from = size > 4096 ? size - 4096 : 0;
  in.seekg(from);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> lines;
  std::istringstream ss(text);
  for (std::string line; std::getline(ss, line);) lines.push_back(line);
  if (from > 0 && !lines.empty()) lines.erase(lines.begin());  // partial first line
  const size_t first = lines.size() > static_cast<size_t>(max_lines) ? lines.size() - max_lines : 0;
  std::string out;
  for (size_t i = first; i < lines.size(); ++i) out += "\n    | " + lines[i];
  return out;
}

std::string SelfExecutable() {
  std::error_code ec;
  auto path = std::filesystem::read_symlink("/proc/self/exe", ec);
  FSDP_CHECK_CODE(ErrorCode::kUnavailable, !ec, "cannot resolve /proc/self/exe: ", ec.message());
  return path.string();
}

ProcessLauncher::ProcessLauncher(std::vector<std::string> command, std::string subject)
    : command_(std::move(command)), subject_(std::move(subject)) {
  FSDP_CHECK(!command_.empty() && !command_.front().empty(),
             "ProcessLauncher needs a program to run");
}

std::vector<RankOutcome> ProcessLauncher::Launch(const LaunchRequest& request) {
  FSDP_CHECK(request.scenario != nullptr, "ProcessLauncher: no scenario");
  const int world = request.world;
  FSDP_CHECK(world >= 1, "ProcessLauncher: world must be >= 1, got ", world);
  const Scenario& scenario = *request.scenario;
  const auto start = Clock::now();

  const std::string run_dir = MakeRunDir();
  const std::vector<DriverRequest> requests = WriteCaseRequests(
      scenario, request.params, world, request.backend, run_dir,
      static_cast<double>(request.timeout.count()) / 1000.0, subject_, request.inputs.get());

  std::vector<distributed::RankCommand> commands(static_cast<size_t>(world));
  std::vector<std::string> tensor_paths(static_cast<size_t>(world));
  std::vector<std::string> result_paths(static_cast<size_t>(world));
  std::vector<std::string> log_paths(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    const DriverRequest& dr = requests[static_cast<size_t>(r)];
    result_paths[r] = dr.output;
    tensor_paths[r] = dr.tensors_output;
    log_paths[r] = run_dir + "/rank" + std::to_string(r) + ".log";
    distributed::RankCommand& command = commands[r];
    command.argv = command_;
    command.search_path = false;  // the program is a path
    for (auto& a : dr.ToArgs()) command.argv.push_back(std::move(a));
    command.env.emplace_back("FSDP_CHECK_COLLECTIVES", request.check_collectives ? "1" : "0");
    command.env.emplace_back(
        "FSDP_STRAGGLER_TIMEOUT_MS",
        std::to_string(StragglerTimeoutOf(request.timeout, request.world).count()));
    command.out = distributed::OutputSink::File(log_paths[r]);
    command.err = distributed::OutputSink::SameAsStdout();
  }

  // Wait for every child, with the deadline and the grace period after a first failure.
  distributed::LaunchPolicy policy;
  policy.deadline = std::max(request.timeout - std::chrono::duration_cast<std::chrono::milliseconds>(
                                                   Clock::now() - start),
                             std::chrono::milliseconds(1));
  policy.failure_grace = request.failure_grace;
  policy.kill_grace = kKillGrace;
  policy.forward_signals = true;
  const distributed::WorldExit exits = distributed::ProcessLauncher(policy).Run(commands);
  const int first_failed = exits.first_failed;

  std::vector<RankOutcome> outcomes(world);
  bool all_ok = true;
  for (int r = 0; r < world; ++r) {
    const distributed::RankExit& c = exits.ranks[r];
    const std::string& log_path = log_paths[r];
    const std::string& result_path = result_paths[r];
    const std::string who = "rank " + std::to_string(r);
    if (!c.spawn_error.empty()) {
      outcomes[r] = RankOutcome::Failed(ErrorCode::kUnavailable, c.spawn_error, 0);
    } else if (c.stopped) {
      if (exits.received_signal != 0) {
        outcomes[r] = RankOutcome::Failed(
            ErrorCode::kAborted,
            "interrupted: fsdp-conform received signal " + std::to_string(exits.received_signal) +
                " (" + ::strsignal(exits.received_signal) + ") " +
                FormatSeconds(std::chrono::milliseconds(static_cast<int64_t>(c.seconds * 1000))) +
                " into this case and stopped " + who + LogTail(log_path),
            c.seconds);
      } else if (first_failed >= 0 && first_failed != r) {
        outcomes[r] =
            RankOutcome::Failed(ErrorCode::kAborted,
                                "killed " + FormatSeconds(request.failure_grace) + " after rank " +
                                    std::to_string(first_failed) +
                                    " failed (blocked in a collective?)" + LogTail(log_path),
                                c.seconds);
      } else {
        outcomes[r] = RankOutcome::Failed(
            ErrorCode::kDeadlineExceeded,
            "scenario " + scenario.info.name + " " + who + " did not finish within " +
                FormatSeconds(request.timeout) + "; killed" + LogTail(log_path),
            c.seconds);
      }
    } else {
      if (!std::filesystem::exists(result_path)) {
        outcomes[r] =
            RankOutcome::Failed(ErrorCode::kInternal,
                                command_.front() + " " + c.Describe() +
                                    " without writing " + result_path + LogTail(log_path),
                                c.seconds);
      } else {
        RankOutcome parsed = ReadRankResult(result_path, tensor_paths[r], who);
        const bool exit_ok = c.ok();
        if (parsed.status == RankOutcome::Status::kError) {
          parsed.message += LogTail(log_path);
        } else if (!exit_ok) {
          parsed = RankOutcome::Failed(ErrorCode::kInternal,
                                       command_.front() + " " + c.Describe() +
                                           " after writing a result" + LogTail(log_path),
                                       0);
        }
        parsed.seconds = c.seconds;
        outcomes[r] = std::move(parsed);
      }
    }
    if (outcomes[r].status == RankOutcome::Status::kError) all_ok = false;
  }

  if (all_ok) {
    std::error_code ec;
    std::filesystem::remove_all(run_dir, ec);
  } else {
    for (int r = 0; r < world; ++r) {
      RankOutcome& o = outcomes[r];
      if (o.status != RankOutcome::Status::kError) continue;
      const std::string recorder = FlightRecorderFile::PathFor(run_dir, r);
      if (std::filesystem::exists(recorder)) {
        o.message += "\n    (its last collectives: " + recorder + ")";
      }
      o.message += "\n    (files kept in " + run_dir + ")";
    }
  }
  // The runner was interrupted: the ranks were stopped; the run ends after this case.
  if (exits.received_signal != 0) RunInterrupt::Note(exits.received_signal);
  return outcomes;
}

}  // namespace fsdp::conformance
