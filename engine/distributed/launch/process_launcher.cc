#include "engine/distributed/launch/process_launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <set>

#include "engine/core/error.h"
#include "engine/core/fd_io.h"
#include "engine/distributed/launch/launcher_death_watch.h"

extern char** environ;

namespace fsdp::distributed {

namespace {

using Clock = std::chrono::steady_clock;


// Signals received by the launcher while it runs a world (0: none).
volatile sig_atomic_t g_received_signal = 0;
void OnSignal(int sig) { g_received_signal = sig; }

// Installs the forwarding handlers (SIGINT, SIGTERM; SIGPIPE ignored) for a run and restores
// the previous ones.
class SignalForwarding {
 public:
  explicit SignalForwarding(bool enabled) : enabled_(enabled) {
    g_received_signal = 0;
    if (!enabled_) return;
    struct sigaction sa {};
    sa.sa_handler = OnSignal;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGINT, &sa, &old_int_);
    ::sigaction(SIGTERM, &sa, &old_term_);
    // A closed reader of our output (`fsdp-launch ... | head`) must not kill the launcher
    // and orphan the ranks; writes then fail and the output is dropped.
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    ::sigaction(SIGPIPE, &ignore, &old_pipe_);
  }
  ~SignalForwarding() {
    if (!enabled_) return;
    ::sigaction(SIGINT, &old_int_, nullptr);
    ::sigaction(SIGTERM, &old_term_, nullptr);
    ::sigaction(SIGPIPE, &old_pipe_, nullptr);
  }
  SignalForwarding(const SignalForwarding&) = delete;
  SignalForwarding& operator=(const SignalForwarding&) = delete;

 private:
  bool enabled_;
  struct sigaction old_int_ {};
  struct sigaction old_term_ {};
  struct sigaction old_pipe_ {};
};

// One prefixed output stream of a child, split into lines.
struct OutputPipe {
  int fd = -1;     // read end; -1 once closed
  int target = 1;  // where complete lines go
  std::string prefix;
  std::string partial;
};

// Reads what is available from `pipe`; writes complete lines with the prefix. At EOF the rest
// is written with a newline and the pipe is closed.
void Pump(OutputPipe& pipe) {
  char buf[65536];
  const ssize_t n = ::read(pipe.fd, buf, sizeof(buf));
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (n <= 0) {
    if (!pipe.partial.empty()) WriteAllToFd(pipe.target, pipe.prefix + pipe.partial + "\n");
    pipe.partial.clear();
    ::close(pipe.fd);
    pipe.fd = -1;
    return;
  }
  pipe.partial.append(buf, static_cast<size_t>(n));
  size_t start = 0;
  std::string lines;
  for (size_t nl; (nl = pipe.partial.find('\n', start)) != std::string::npos; start = nl + 1) {
    lines += pipe.prefix;
    lines.append(pipe.partial, start, nl + 1 - start);
  }
  pipe.partial.erase(0, start);
  if (!lines.empty()) WriteAllToFd(pipe.target, lines);
}

// "NAME=value" entries: the launcher's environment with `overrides` replacing or adding.
std::vector<std::string> ChildEnvironment(
    const std::vector<std::pair<std::string, std::string>>& overrides) {
  std::set<std::string> names;
  for (const auto& [k, v] : overrides) names.insert(k);
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string entry(*e);
    const auto eq = entry.find('=');
    if (eq != std::string::npos && names.count(entry.substr(0, eq))) continue;
    env.push_back(entry);
  }
  for (const auto& [k, v] : overrides) env.push_back(k + "=" + v);
  return env;
}

struct Child {
  bool running = false;
  Clock::time_point started;
  OutputPipe out, err;
};

// Sets up one stream (`fd` 1 or 2) of a child per `sink`; for kPrefixLines returns the read
// end's pipe in `pipe`.
void AddSink(posix_spawn_file_actions_t* actions, int fd, const OutputSink& sink,
             OutputPipe* pipe, std::vector<int>* to_close) {
  switch (sink.kind) {
    case OutputSink::Kind::kInherit:
      if (sink.fd >= 0 && sink.fd != fd) posix_spawn_file_actions_adddup2(actions, sink.fd, fd);
      break;
    case OutputSink::Kind::kFile:
      posix_spawn_file_actions_addopen(actions, fd, sink.path.c_str(),
                                       O_WRONLY | O_CREAT | O_TRUNC, 0644);
      break;
    case OutputSink::Kind::kSameAsStdout:
      FSDP_CHECK(fd == 2, "ProcessLauncher: only stderr can go where stdout goes");
      posix_spawn_file_actions_adddup2(actions, 1, 2);
      break;
    case OutputSink::Kind::kPrefixLines: {
      int p[2] = {-1, -1};
      FSDP_CHECK_CODE(ErrorCode::kUnavailable, ::pipe2(p, O_CLOEXEC) == 0,
                      "ProcessLauncher: pipe: ", std::strerror(errno));
      posix_spawn_file_actions_adddup2(actions, p[1], fd);
      to_close->push_back(p[1]);
      pipe->fd = p[0];
      pipe->target = sink.fd >= 0 ? sink.fd : fd;
      pipe->prefix = sink.prefix;
      break;
    }
  }
}

void SignalGroup(pid_t pid, int sig) {
  if (::kill(-pid, sig) != 0) ::kill(pid, sig);
}

}  // namespace

bool RankExit::ok() const {
  return spawn_error.empty() && WIFEXITED(wait_status) &&
         WEXITSTATUS(wait_status) == 0;
}

int RankExit::exit_code() const {
  if (!spawn_error.empty()) return 127;
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return 1;
}

std::string RankExit::Describe() const {
  if (!spawn_error.empty()) return spawn_error;
  if (WIFEXITED(wait_status)) return "exited with status " + std::to_string(WEXITSTATUS(wait_status));
  if (WIFSIGNALED(wait_status)) {
    return "was killed by signal " + std::to_string(WTERMSIG(wait_status)) + " (" +
           strsignal(WTERMSIG(wait_status)) + ")";
  }
  return "ended with wait status " + std::to_string(wait_status);
}

bool WorldExit::ok() const {
  if (first_failed >= 0 || stop_reason != StopReason::kNone) return false;
  for (const auto& r : ranks) {
    if (!r.ok()) return false;
  }
  return true;
}

ProcessLauncher::ProcessLauncher(LaunchPolicy policy) : policy_(policy) {}

WorldExit ProcessLauncher::Run(const std::vector<RankCommand>& commands) const {
  FSDP_CHECK(!commands.empty(), "ProcessLauncher: no rank to run");
  for (const auto& c : commands) {
    FSDP_CHECK(!c.argv.empty() && !c.argv.front().empty(), "ProcessLauncher: a rank has no program");
    FSDP_CHECK(c.out.kind != OutputSink::Kind::kSameAsStdout,
               "ProcessLauncher: stdout cannot go where stdout goes");
  }
  SignalForwarding forwarding(policy_.forward_signals);
  // The ranks are stopped even if this process dies before they end (SIGKILL included).
  LauncherDeathWatch death_watch(policy_.kill_grace);
  const size_t n = commands.size();
  WorldExit world;
  world.ranks.resize(n);
  std::vector<Child> children(n);
  const auto start = Clock::now();

  for (size_t r = 0; r < n; ++r) {
    const RankCommand& cmd = commands[r];
    Child& c = children[r];
    RankExit& e = world.ranks[r];
    auto env = cmd.env;
    if (death_watch.active()) {
      env.emplace_back(LauncherDeathWatch::kEnvironmentVariable, death_watch.environment_value());
    }
    const auto env_strings = ChildEnvironment(env);
    std::vector<char*> envp;
    for (const auto& s : env_strings) envp.push_back(const_cast<char*>(s.c_str()));
    envp.push_back(nullptr);
    std::vector<char*> argv;
    for (const auto& a : cmd.argv) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);

    posix_spawn_file_actions_t actions;
    posix_spawnattr_t attr;
    posix_spawn_file_actions_init(&actions);
    posix_spawnattr_init(&attr);
    if (cmd.stdin_fd >= 0) {
      posix_spawn_file_actions_adddup2(&actions, cmd.stdin_fd, 0);
    } else if (!cmd.inherit_stdin) {
      posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    }
    std::vector<int> to_close;
    std::string sink_error;
    try {
      AddSink(&actions, 1, cmd.out, &c.out, &to_close);
      AddSink(&actions, 2, cmd.err, &c.err, &to_close);
    } catch (const Error& error) {
      sink_error = error.message();  // reported as this rank's spawn error
    }
    // Own process group: a rank's children are stopped with it.
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF);
    posix_spawnattr_setpgroup(&attr, 0);
    sigset_t defaults;
    sigemptyset(&defaults);
    sigaddset(&defaults, SIGINT);
    sigaddset(&defaults, SIGTERM);
    sigaddset(&defaults, SIGPIPE);
    posix_spawnattr_setsigdefault(&attr, &defaults);
    c.started = Clock::now();
    const int rc = sink_error.empty()
                       ? (cmd.search_path ? posix_spawnp : posix_spawn)(
                             &e.pid, argv[0], &actions, &attr, argv.data(), envp.data())
                       : EIO;
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
    for (int fd : to_close) ::close(fd);
    if (rc != 0) {
      e.spawn_error = "cannot start " + cmd.argv[0] + ": " +
                      (sink_error.empty() ? std::string(std::strerror(rc)) : sink_error);
      e.wait_status = 127 << 8;  // as a shell reports "command not found"
      e.pid = -1;
      for (OutputPipe* p : {&c.out, &c.err}) {
        if (p->fd >= 0) ::close(p->fd);
        p->fd = -1;
      }
    } else {
      c.running = true;
      death_watch.Watch(e.pid);  // the rank leads its own process group
    }
  }

  bool decided = false;                       // on_stop was called
  std::optional<Clock::time_point> stop_at;   // stop the running ranks at this time
  std::optional<Clock::time_point> kill_at;   // SIGKILL stragglers at this time
  bool killed = false;
  int stop_signal = SIGTERM;
  auto running = [&] {
    size_t k = 0;
    for (const auto& c : children) k += c.running ? 1 : 0;
    return k;
  };
  auto decide = [&](StopReason reason, int rank, int sig) {
    if (decided) return;
    decided = true;
    StopEvent event;
    event.reason = reason;
    event.rank = rank;
    event.signal = sig;
    event.others_running = running() > 0;
    if (on_stop_) on_stop_(event, world);
  };
  auto stop_all = [&](int sig) {
    if (kill_at) return;
    kill_at = Clock::now() + policy_.kill_grace;
    for (size_t r = 0; r < n; ++r) {
      if (!children[r].running) continue;
      world.ranks[r].stopped = true;
      SignalGroup(world.ranks[r].pid, sig);
    }
  };
  auto fail = [&](size_t r) {
    if (world.first_failed >= 0) return;
    world.first_failed = static_cast<int>(r);
    if (world.stop_reason == StopReason::kNone) world.stop_reason = StopReason::kRankFailed;
    decide(StopReason::kRankFailed, static_cast<int>(r), 0);
    stop_at = Clock::now() + policy_.failure_grace;
    if (policy_.deadline.count() > 0) stop_at = std::min(*stop_at, start + policy_.deadline);
  };
  for (size_t r = 0; r < n; ++r) {
    if (!world.ranks[r].spawn_error.empty()) fail(r);
  }

  // Moves output along for up to `wait_ms`; returns false when no pipe is open.
  auto pump_output = [&](int wait_ms) {
    std::vector<pollfd> fds;
    std::vector<OutputPipe*> owners;
    for (auto& c : children) {
      for (OutputPipe* p : {&c.out, &c.err}) {
        if (p->fd < 0) continue;
        fds.push_back({p->fd, POLLIN, 0});
        owners.push_back(p);
      }
    }
    if (fds.empty()) {
      if (wait_ms > 0) ::poll(nullptr, 0, wait_ms);
      return false;
    }
    const int ready = ::poll(fds.data(), fds.size(), wait_ms);
    if (ready <= 0) return true;
    for (size_t k = 0; k < fds.size(); ++k) {
      if (fds[k].revents & (POLLIN | POLLHUP | POLLERR)) Pump(*owners[k]);
    }
    return true;
  };

  while (running() > 0) {
    pump_output(5);
    for (size_t r = 0; r < n; ++r) {
      Child& c = children[r];
      if (!c.running) continue;
      RankExit& e = world.ranks[r];
      int status = 0;
      if (::waitpid(e.pid, &status, WNOHANG) != e.pid) continue;
      c.running = false;
      e.wait_status = status;
      e.seconds = std::chrono::duration<double>(Clock::now() - c.started).count();
      const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (!ok && !e.stopped) fail(r);
    }
    if (running() == 0) break;
    if (policy_.forward_signals && g_received_signal != 0 && !kill_at) {
      const int sig = g_received_signal;
      world.received_signal = sig;
      if (world.stop_reason == StopReason::kNone) world.stop_reason = StopReason::kSignal;
      decide(StopReason::kSignal, -1, sig);
      stop_signal = sig;
      stop_at = Clock::now();
    }
    if (!stop_at && policy_.deadline.count() > 0 && Clock::now() - start >= policy_.deadline) {
      world.stop_reason = StopReason::kDeadline;
      decide(StopReason::kDeadline, -1, 0);
      stop_at = Clock::now();
    }
    if (!stop_at && policy_.stop_requested && policy_.stop_requested()) {
      world.stop_reason = StopReason::kRequested;
      decide(StopReason::kRequested, -1, 0);
      stop_at = Clock::now();
    }
    if (stop_at && Clock::now() >= *stop_at) stop_all(stop_signal);
    if (kill_at && !killed && Clock::now() >= *kill_at) {
      for (size_t r = 0; r < n; ++r) {
        if (children[r].running) SignalGroup(world.ranks[r].pid, SIGKILL);
      }
      killed = true;
    }
  }
  // Drain what the ranks wrote last (bounded: a leftover grandchild may hold a pipe open).
  const auto drain_until = Clock::now() + std::chrono::seconds(2);
  while (pump_output(10) && Clock::now() < drain_until) {
  }
  for (auto& c : children) {
    for (OutputPipe* p : {&c.out, &c.err}) {
      if (p->fd < 0) continue;
      if (!p->partial.empty()) WriteAllToFd(p->target, p->prefix + p->partial + "\n");
      ::close(p->fd);
      p->fd = -1;
    }
  }
  return world;
}

}  // namespace fsdp::distributed
