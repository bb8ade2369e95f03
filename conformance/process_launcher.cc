#include "conformance/process_launcher.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "conformance/driver_protocol.h"
#include "engine/core/error.h"

extern char** environ;

namespace fsdp::conformance {

namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

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

// The last `max_lines` lines of a log file (at most 4 KiB of it), indented; "" when empty.
std::string LogTail(const std::string& path, int max_lines = 15) {
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

std::string DescribeExit(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return std::string("was killed by signal ") + std::to_string(WTERMSIG(status)) + " (" +
           strsignal(WTERMSIG(status)) + ")";
  }
  return "ended with wait status " + std::to_string(status);
}

// One child process of a case.
struct Child {
  pid_t pid = -1;
  bool running = false;
  int wait_status = 0;
  bool killed = false;
  Clock::time_point started;
  double seconds = 0;
  std::string result_path;
  std::string log_path;
  std::string spawn_error;  // non-empty when the spawn itself failed
};

pid_t Spawn(const std::vector<std::string>& argv, const std::string& log_path, std::string* error) {
  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&actions);
  posix_spawnattr_init(&attr);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);  // own process group: stragglers die with children
  std::vector<char*> cargv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, cargv[0], &actions, &attr, cargv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    *error = "cannot start " + argv[0] + ": " + std::strerror(rc);
    return -1;
  }
  return pid;
}

}  // namespace

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
  const std::string store_dir = run_dir + "/store";
  FSDP_CHECK_CODE(ErrorCode::kUnavailable, ::mkdir(store_dir.c_str(), 0700) == 0, "cannot create ",
                  store_dir, ": ", std::strerror(errno));

  std::vector<Child> children(world);
  for (int r = 0; r < world; ++r) {
    Child& c = children[r];
    const std::string stem = run_dir + "/rank" + std::to_string(r);
    c.result_path = stem + ".result.json";
    c.log_path = stem + ".log";
    DriverRequest dr;
    dr.scenario = scenario.info.name;
    dr.params = request.params.values();
    dr.rank = r;
    dr.world = world;
    dr.backend = request.backend;
    dr.store_dir = store_dir;
    dr.output = c.result_path;
    dr.request_file = stem + ".request.json";
    dr.timeout_s = static_cast<double>(request.timeout.count()) / 1000.0;
    dr.subject = subject_;
    nlohmann::json request_json = dr.ToJson();
    request_json["description"] = scenario.info.description;
    request_json["seed_test"] = scenario.info.seed_test;
    WriteFileAtomically(dr.request_file, request_json.dump(2) + "\n");

    std::vector<std::string> argv = command_;
    for (auto& a : dr.ToArgs()) argv.push_back(std::move(a));
    c.started = Clock::now();
    c.pid = Spawn(argv, c.log_path, &c.spawn_error);
    c.running = c.pid > 0;
  }

  // Wait for every child, with the deadline and the grace period after a first failure.
  const auto deadline = start + request.timeout;
  bool any_failed = false;
  int first_failed = -1;
  Clock::time_point first_failure;
  for (int r = 0; r < world; ++r) {
    if (!children[r].spawn_error.empty() && !any_failed) {
      any_failed = true;
      first_failed = r;
      first_failure = Clock::now();
    }
  }
  auto running = [&] {
    int n = 0;
    for (const auto& c : children) n += c.running ? 1 : 0;
    return n;
  };
  while (running() > 0) {
    for (int r = 0; r < world; ++r) {
      Child& c = children[r];
      if (!c.running) continue;
      int status = 0;
      const pid_t got = ::waitpid(c.pid, &status, WNOHANG);
      if (got == c.pid) {
        c.running = false;
        c.wait_status = status;
        c.seconds = SecondsSince(c.started);
        const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        if (!ok && !any_failed) {
          any_failed = true;
          first_failed = r;
          first_failure = Clock::now();
        }
      }
    }
    if (running() == 0) break;
    auto until = deadline;
    if (any_failed) until = std::min(until, first_failure + request.failure_grace);
    if (Clock::now() >= until) {
      for (auto& c : children) {
        if (!c.running) continue;
        if (::kill(-c.pid, SIGKILL) != 0) ::kill(c.pid, SIGKILL);
        ::waitpid(c.pid, &c.wait_status, 0);
        c.running = false;
        c.killed = true;
        c.seconds = SecondsSince(c.started);
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }

  std::vector<RankOutcome> outcomes(world);
  bool all_ok = true;
  for (int r = 0; r < world; ++r) {
    Child& c = children[r];
    const std::string who = "rank " + std::to_string(r);
    if (!c.spawn_error.empty()) {
      outcomes[r] = RankOutcome::Failed(ErrorCode::kUnavailable, c.spawn_error, 0);
    } else if (c.killed) {
      if (any_failed && first_failed != r) {
        outcomes[r] =
            RankOutcome::Failed(ErrorCode::kAborted,
                                "killed " + FormatSeconds(request.failure_grace) + " after rank " +
                                    std::to_string(first_failed) +
                                    " failed (blocked in a collective?)" + LogTail(c.log_path),
                                c.seconds);
      } else {
        outcomes[r] = RankOutcome::Failed(
            ErrorCode::kDeadlineExceeded,
            "scenario " + scenario.info.name + " " + who + " did not finish within " +
                FormatSeconds(request.timeout) + "; killed" + LogTail(c.log_path),
            c.seconds);
      }
    } else {
      std::ifstream in(c.result_path, std::ios::binary);
      if (!in) {
        outcomes[r] =
            RankOutcome::Failed(ErrorCode::kInternal,
                                command_.front() + " " + DescribeExit(c.wait_status) +
                                    " without writing " + c.result_path + LogTail(c.log_path),
                                c.seconds);
      } else {
        RankOutcome parsed;
        try {
          nlohmann::json result = nlohmann::json::parse(in);
          parsed = ParseResult(result, who + " result " + c.result_path);
        } catch (const nlohmann::json::exception& e) {
          parsed = RankOutcome::Failed(
              ErrorCode::kDataLoss,
              who + " wrote unreadable JSON to " + c.result_path + ": " + e.what(), 0);
        } catch (const Error& e) {
          parsed = RankOutcome::Failed(e.code(), e.message(), 0);
        }
        const bool exit_ok = WIFEXITED(c.wait_status) && WEXITSTATUS(c.wait_status) == 0;
        if (parsed.status == RankOutcome::Status::kError) {
          parsed.message += LogTail(c.log_path);
        } else if (!exit_ok) {
          parsed = RankOutcome::Failed(ErrorCode::kInternal,
                                       command_.front() + " " + DescribeExit(c.wait_status) +
                                           " after writing a result" + LogTail(c.log_path),
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
    for (auto& o : outcomes) {
      if (o.status == RankOutcome::Status::kError)
        o.message += "\n    (files kept in " + run_dir + ")";
    }
  }
  return outcomes;
}

}  // namespace fsdp::conformance
