#include "conformance/driver_session.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>

#include "conformance/process_launcher.h"
#include "engine/core/error.h"

namespace fsdp::conformance {

namespace {

using Clock = std::chrono::steady_clock;

// Between SIGTERM and SIGKILL when stopping the ranks, and how long Close() lets them exit on
// their own after the end of file.
constexpr std::chrono::milliseconds kKillGrace{1000};
// How often Serve() looks for result files while it waits.
constexpr int kPollMs = 2;

// Sends all of `text` on a stream socket without SIGPIPE; false when the peer is gone.
bool SendAll(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::send(fd, text.data() + done, text.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

// Whether the rank at the far end of `fd` has hung up (exited): it never writes to its stdin,
// so anything readable is the end of file.
bool HungUp(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR)) != 0;
}

}  // namespace

DriverSession::DriverSession(std::vector<std::string> command, int size, std::string backend)
    : command_(std::move(command)), size_(size), backend_(std::move(backend)) {
  FSDP_CHECK(!command_.empty() && !command_.front().empty(), "DriverSession needs a program");
  FSDP_CHECK(size_ >= 1, "DriverSession: size must be >= 1, got ", size_);
  dir_ = MakeRunDir();
  std::vector<distributed::RankCommand> commands(static_cast<size_t>(size_));
  control_.assign(static_cast<size_t>(size_), -1);
  rank_ends_.assign(static_cast<size_t>(size_), -1);
  for (int r = 0; r < size_; ++r) {
    int ends[2] = {-1, -1};
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ends) != 0) {
      const std::string why = std::strerror(errno);
      for (int fd : control_) if (fd >= 0) ::close(fd);
      for (int fd : rank_ends_) if (fd >= 0) ::close(fd);
      std::error_code ec;
      std::filesystem::remove_all(dir_, ec);
      FSDP_THROW(ErrorCode::kUnavailable, "driver session: socketpair for rank ", r, ": ", why);
    }
    control_[r] = ends[0];
    rank_ends_[r] = ends[1];
    distributed::RankCommand& c = commands[r];
    c.argv = command_;
    c.argv.push_back(kServeFlag);
    c.search_path = false;  // the program is a path
    c.stdin_fd = ends[1];
    c.out = distributed::OutputSink::File(LogPath(r));
    c.err = distributed::OutputSink::SameAsStdout();
  }
  distributed::LaunchPolicy policy;
  policy.failure_grace = std::chrono::milliseconds(0);  // a rank's exit ends the session
  policy.kill_grace = kKillGrace;
  policy.forward_signals = true;
  policy.stop_requested = [this] {
    started_ = true;  // first polled once every rank was started
    return stop_.load();
  };
  thread_ = std::thread([this, policy, commands = std::move(commands)] {
    distributed::WorldExit exit = distributed::ProcessLauncher(policy).Run(commands);
    exit_ = std::move(exit);
    started_ = true;
    ended_ = true;
  });
  // The ranks hold their ends now (or never will): ours go, so that a rank's exit is a
  // hang-up on the runner's end.
  while (!started_.load()) ::poll(nullptr, 0, 1);
  for (int& fd : rank_ends_) {
    ::close(fd);
    fd = -1;
  }
}

DriverSession::~DriverSession() { Close(); }

std::string DriverSession::LogPath(int rank) const {
  return dir_ + "/rank" + std::to_string(rank) + ".log";
}

void DriverSession::Stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  for (int& fd : control_) {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
  healthy_ = false;
  if (exit_.received_signal != 0) received_signal_ = exit_.received_signal;
}

void DriverSession::Close() {
  if (!thread_.joinable() && control_.empty()) return;
  // End of file on every stdin: the ranks exit on their own; stragglers are stopped.
  for (int fd : control_) {
    if (fd >= 0) ::shutdown(fd, SHUT_WR);
  }
  const auto stop_at = Clock::now() + kKillGrace;
  while (!ended_.load() && Clock::now() < stop_at) ::poll(nullptr, 0, kPollMs);
  Stop();
  control_.clear();
  if (!keep_dir_) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
}

std::vector<RankOutcome> DriverSession::Serve(const LaunchRequest& request,
                                              const std::string& run_dir) {
  FSDP_CHECK(request.scenario != nullptr, "DriverSession: no scenario");
  FSDP_CHECK(request.world >= 1 && request.world <= size_ && request.backend == backend_,
             "DriverSession: a session of ", size_, " ranks on ", backend_,
             " cannot serve a case of world ", request.world, " on ", request.backend);
  const int world = request.world;  // served by the session's ranks 0..world-1
  const Scenario& scenario = *request.scenario;
  const auto start = Clock::now();
  const std::vector<DriverRequest> requests = WriteCaseRequests(
      scenario, request.params, world, backend_, run_dir,
      static_cast<double>(request.timeout.count()) / 1000.0, /*subject=*/"",
      request.inputs.get());
  auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };

  // Hand the case out: one line per rank, the JSON array of its flags.
  for (int r = 0; r < world && healthy(); ++r) {
    const nlohmann::json args = requests[r].ToArgs();
    if (!SendAll(control_[r], args.dump() + "\n")) break;  // seen below as the rank's exit
  }

  std::vector<std::optional<RankOutcome>> got(static_cast<size_t>(world));
  enum class Cause { kNone, kDeadline, kGrace, kRankExited };
  Cause cause = Cause::kNone;
  int first_failed = -1;  // the first rank whose result is an error
  int exited = -1;        // the first rank seen to hang up
  std::optional<Clock::time_point> grace_at;
  const auto deadline = start + request.timeout;
  for (bool last_look = false;;) {
    int pending = 0;
    for (int r = 0; r < world; ++r) {
      if (got[r]) continue;
      if (std::filesystem::exists(requests[r].output)) {
        RankOutcome o = ReadRankResult(requests[r].output, requests[r].tensors_output,
                                       "rank " + std::to_string(r));
        o.seconds = elapsed();
        if (o.status == RankOutcome::Status::kError && first_failed < 0) {
          first_failed = r;
          grace_at = Clock::now() + request.failure_grace;
        }
        got[r] = std::move(o);
      } else {
        ++pending;
      }
    }
    if (pending == 0 || last_look) break;
    for (int r = 0; r < size_ && exited < 0; ++r) {
      if (ended_.load() || HungUp(control_[r])) exited = r;
    }
    const auto now = Clock::now();
    if (exited >= 0) {
      cause = Cause::kRankExited;
      last_look = true;  // a result written just before the exit still counts
      continue;
    }
    if (now >= deadline) {
      cause = Cause::kDeadline;
      break;
    }
    if (grace_at && now >= *grace_at) {
      cause = Cause::kGrace;
      break;
    }
    ::poll(nullptr, 0, kPollMs);
  }

  const bool all_ok = cause == Cause::kNone && first_failed < 0;
  // A rank that asked to end the session (its "end_session") is not reused either.
  const bool end_asked = std::any_of(got.begin(), got.end(), [](const auto& o) {
    return o.has_value() && !o->end_session.empty();
  });
  if (!all_ok || end_asked) Stop();  // the session is over; the ranks still running are stopped
  // The rank whose exit ended the session: the one ProcessLauncher saw fail first, else the
  // one that hung up first.
  int died = -1;
  if (cause == Cause::kRankExited) {
    died = exit_.first_failed >= 0 ? exit_.first_failed : exited;
  }
  const std::string& name = scenario.info.name;
  std::vector<RankOutcome> outcomes(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    const std::string who = "rank " + std::to_string(r);
    const std::string log = LogTail(LogPath(r));
    const distributed::RankExit* rank_exit =
        !all_ok && r < static_cast<int>(exit_.ranks.size()) ? &exit_.ranks[r] : nullptr;
    if (got[r]) {
      outcomes[r] = std::move(*got[r]);
      if (outcomes[r].status == RankOutcome::Status::kError) outcomes[r].message += log;
      continue;
    }
    if (received_signal_ != 0) {
      outcomes[r] = RankOutcome::Failed(
          ErrorCode::kAborted,
          "scenario " + name + " " + who + " stopped: the runner received signal " +
              std::to_string(received_signal_) + " (" + strsignal(received_signal_) + ")",
          elapsed());
    } else if (cause == Cause::kRankExited && r == died) {
      const std::string how = rank_exit != nullptr && rank_exit->pid > 0
                                  ? rank_exit->Describe()
                                  : (rank_exit != nullptr ? rank_exit->spawn_error : "exited");
      outcomes[r] = RankOutcome::Failed(
          ErrorCode::kInternal,
          "the driver session's " + who + " (" + command_.front() + " " + kServeFlag + ") " +
              how + " while serving scenario " + name + ", without writing " +
              requests[r].output + log,
          elapsed());
    } else if (cause == Cause::kRankExited) {
      outcomes[r] = RankOutcome::Failed(
          ErrorCode::kAborted,
          "stopped after the driver session's rank " + std::to_string(died) +
              " ended while serving scenario " + name + log,
          elapsed());
    } else if (cause == Cause::kGrace) {
      outcomes[r] = RankOutcome::Failed(
          ErrorCode::kAborted,
          "killed " + FormatSeconds(request.failure_grace) + " after rank " +
              std::to_string(first_failed) + " failed (blocked in a collective?)" + log,
          elapsed());
    } else {
      outcomes[r] = RankOutcome::Failed(
          ErrorCode::kDeadlineExceeded,
          "scenario " + name + " " + who + " did not finish within " +
              FormatSeconds(request.timeout) + "; killed" + log,
          elapsed());
    }
  }

  if (all_ok) {
    std::error_code ec;
    std::filesystem::remove_all(run_dir, ec);
  } else {
    keep_dir_ = true;
    for (auto& o : outcomes) {
      if (o.status != RankOutcome::Status::kError) continue;
      o.message += "\n    (files kept in " + run_dir + "; the session's logs in " + dir_ + ")";
    }
  }
  return outcomes;
}

}  // namespace fsdp::conformance
