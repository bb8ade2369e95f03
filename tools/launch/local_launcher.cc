#include "tools/bench/local_launcher.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <set>

#include "engine/core/error.h"

extern char** environ;

namespace fsdp::bench {

namespace {

using Clock = std::chrono::steady_clock;

int ParseIntFlag(const std::string& flag, const std::string& value, long min_value,
                 long max_value) {
  errno = 0;
  char* end = nullptr;
  const long v = std::strtol(value.c_str(), &end, 10);
  FSDP_CHECK(errno == 0 && !value.empty() && *end == '\0' && v >= min_value && v <= max_value, flag,
             ": '", value, "' is not an integer in [", min_value, ", ", max_value, "]");
  return static_cast<int>(v);
}

// "--nproc_per_node" -> "--nproc-per-node".
std::string CanonicalFlag(std::string flag) {
  for (size_t i = 2; i < flag.size(); ++i) {
    if (flag[i] == '_') flag[i] = '-';
  }
  return flag;
}

void WriteAll(int fd, const char* data, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, data, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return;  // the reader went away; nothing sensible to do with the output
    }
    data += w;
    n -= static_cast<size_t>(w);
  }
}

void WriteAll(int fd, const std::string& s) { WriteAll(fd, s.data(), s.size()); }

// A free TCP port on the loopback interface (bound once, then released).
int FreeLocalPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 29500;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  int port = 29500;
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

std::string MakeTempStoreDir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string templ = std::string(tmp && *tmp ? tmp : "/tmp") + "/fsdp-launch.XXXXXX";
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  FSDP_CHECK_CODE(ErrorCode::kUnavailable, ::mkdtemp(buf.data()) != nullptr,
                  "fsdp-launch: cannot create a store directory from ", templ, ": ",
                  std::strerror(errno));
  return std::string(buf.data());
}

std::string DescribeStatus(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return "was killed by signal " + std::to_string(WTERMSIG(status)) + " (" +
           strsignal(WTERMSIG(status)) + ")";
  }
  return "ended with wait status " + std::to_string(status);
}

int ExitCodeOf(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

// Signals received by the launcher while it runs a world (0: none).
volatile sig_atomic_t g_received_signal = 0;
void OnSignal(int sig) { g_received_signal = sig; }

// Installs the forwarding handlers (SIGINT, SIGTERM; SIGPIPE ignored) for a run and restores
// the previous ones.
class SignalForwarding {
 public:
  SignalForwarding() {
    g_received_signal = 0;
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
    ::sigaction(SIGINT, &old_int_, nullptr);
    ::sigaction(SIGTERM, &old_term_, nullptr);
    ::sigaction(SIGPIPE, &old_pipe_, nullptr);
  }
  SignalForwarding(const SignalForwarding&) = delete;
  SignalForwarding& operator=(const SignalForwarding&) = delete;

 private:
  struct sigaction old_int_ {};
  struct sigaction old_term_ {};
  struct sigaction old_pipe_ {};
};

// One output stream of a child, split into lines for prefixing.
struct OutputPipe {
  int fd = -1;     // read end; -1 once closed
  int target = 1;  // where complete lines go
  std::string partial;
};

struct ChildProcess {
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
  int status = 0;
  bool signalled_by_us = false;
  std::string spawn_error;
  OutputPipe out, err;
};

// Reads what is available from `pipe`; writes complete lines with `prefix`. At EOF the rest
// is written with a newline and the pipe is closed.
void Pump(OutputPipe& pipe, const std::string& prefix) {
  char buf[65536];
  const ssize_t n = ::read(pipe.fd, buf, sizeof(buf));
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (n <= 0) {
    if (!pipe.partial.empty()) WriteAll(pipe.target, prefix + pipe.partial + "\n");
    pipe.partial.clear();
    ::close(pipe.fd);
    pipe.fd = -1;
    return;
  }
  pipe.partial.append(buf, static_cast<size_t>(n));
  size_t start = 0;
  std::string lines;
  for (size_t nl; (nl = pipe.partial.find('\n', start)) != std::string::npos; start = nl + 1) {
    lines += prefix;
    lines.append(pipe.partial, start, nl + 1 - start);
  }
  pipe.partial.erase(0, start);
  if (!lines.empty()) WriteAll(pipe.target, lines);
}

// Builds "NAME=value" entries: the launcher's environment with `overrides` replacing or
// adding variables.
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

}  // namespace

std::string LocalLaunchUsage() {
  return R"(usage: fsdp-launch --nproc-per-node N [options] [--] PROGRAM [ARGS...]

Starts N local processes of PROGRAM with torchrun's launch variables (RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT; FSDP_STORE_PATH for a
file-store rendezvous), which fsdp::distributed::DistributedSession::FromEnvironment reads.

options (torchrun's underscore spellings such as --nproc_per_node also work):
  --nproc-per-node N   processes on this node (required)
  --nnodes M           nodes in the world (default 1)
  --node-rank K        this node's rank in [0, M) (default 0)
  --master-addr A      rendezvous host (default 127.0.0.1)
  --master-port P      rendezvous TCP port (rank 0 hosts the store)
  --store-path DIR     file-store rendezvous in DIR (fresh per run, shared by all nodes)
                       With neither --master-port nor --store-path (one node only), a fresh
                       temporary store directory is made and removed afterwards.
  --standalone         accepted for torchrun compatibility (the one-node default)
  --timeout-ms T       stop every rank after T ms and exit 124 (default: no limit)
  --grace-ms T         SIGTERM-to-SIGKILL grace when stopping ranks (default 5000)
  --no-prefix          pass output through unprefixed (default: "[rank R] " per line)
  -h, --help           this text

Exit status: 0 when every rank exits 0; otherwise the first failed rank's exit status
(128 + N when it was killed by signal N), 124 on timeout, 2 on a usage error.
)";
}

LocalLaunchOptions ParseLocalLaunchArgs(const std::vector<std::string>& args, bool* help) {
  LocalLaunchOptions o;
  bool nproc_given = false;
  if (help) *help = false;
  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg.empty() || arg[0] != '-') break;  // the program starts here (torchrun style)
    if (arg == "-h" || arg == "--help") {
      if (help) *help = true;
      return o;
    }
    std::string flag = arg;
    std::optional<std::string> inline_value;
    if (const auto eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      flag = arg.substr(0, eq);
      inline_value = arg.substr(eq + 1);
    }
    flag = CanonicalFlag(flag);
    auto value = [&]() -> std::string {
      if (inline_value) return *inline_value;
      FSDP_CHECK(i + 1 < args.size(), "fsdp-launch: ", flag, " needs a value");
      return args[++i];
    };
    auto no_value = [&] { FSDP_CHECK(!inline_value, "fsdp-launch: ", flag, " takes no value"); };
    if (flag == "--nproc-per-node") {
      o.nproc_per_node = ParseIntFlag(flag, value(), 1, 4096);
      nproc_given = true;
    } else if (flag == "--nnodes") {
      o.nnodes = ParseIntFlag(flag, value(), 1, 1 << 20);
    } else if (flag == "--node-rank") {
      o.node_rank = ParseIntFlag(flag, value(), 0, 1 << 20);
    } else if (flag == "--master-addr") {
      o.master_addr = value();
      FSDP_CHECK(!o.master_addr.empty(), "fsdp-launch: --master-addr is empty");
    } else if (flag == "--master-port") {
      o.master_port = ParseIntFlag(flag, value(), 1, 65535);
    } else if (flag == "--store-path") {
      o.store_path = value();
      FSDP_CHECK(!o.store_path.empty(), "fsdp-launch: --store-path is empty");
    } else if (flag == "--timeout-ms") {
      o.timeout = std::chrono::milliseconds(ParseIntFlag(flag, value(), 0, INT_MAX));
    } else if (flag == "--grace-ms") {
      o.grace = std::chrono::milliseconds(ParseIntFlag(flag, value(), 0, INT_MAX));
    } else if (flag == "--no-prefix") {
      no_value();
      o.prefix_output = false;
    } else if (flag == "--standalone") {
      no_value();
    } else {
      FSDP_THROW(ErrorCode::kInvalidArgument, "fsdp-launch: unknown flag '", arg,
                 "' (see fsdp-launch --help)");
    }
  }
  o.command.assign(args.begin() + static_cast<std::ptrdiff_t>(std::min(i, args.size())),
                   args.end());
  FSDP_CHECK(nproc_given, "fsdp-launch: --nproc-per-node is required");
  FSDP_CHECK(!o.command.empty(), "fsdp-launch: no program to run (fsdp-launch --nproc-per-node ",
             o.nproc_per_node, " -- PROGRAM ARGS...)");
  FSDP_CHECK(o.node_rank < o.nnodes, "fsdp-launch: --node-rank ", o.node_rank,
             " is not below --nnodes ", o.nnodes);
  FSDP_CHECK(o.nnodes == 1 || o.master_port > 0 || !o.store_path.empty(), "fsdp-launch: --nnodes ",
             o.nnodes,
             " needs a shared rendezvous: --master-addr and --master-port, or --store-path on a "
             "shared filesystem");
  FSDP_CHECK(o.nnodes == 1 || o.master_port == 0 || !o.master_addr.empty(),
             "fsdp-launch: --nnodes ", o.nnodes,
             " with --master-port needs --master-addr (node 0's address)");
  FSDP_CHECK(static_cast<long long>(o.nnodes) * o.nproc_per_node <= INT_MAX,
             "fsdp-launch: --nnodes x --nproc-per-node is too large");
  return o;
}

std::vector<std::pair<std::string, std::string>> ChildLaunchVariables(
    const LocalLaunchOptions& options, int local_rank, const std::string& master_addr,
    int master_port, const std::string& store_path) {
  FSDP_CHECK(local_rank >= 0 && local_rank < options.nproc_per_node,
             "ChildLaunchVariables: local rank ", local_rank, " is not in [0, ",
             options.nproc_per_node, ")");
  const int rank = options.node_rank * options.nproc_per_node + local_rank;
  std::vector<std::pair<std::string, std::string>> vars = {
      {"RANK", std::to_string(rank)},
      {"WORLD_SIZE", std::to_string(options.nnodes * options.nproc_per_node)},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"LOCAL_WORLD_SIZE", std::to_string(options.nproc_per_node)},
      {"GROUP_RANK", std::to_string(options.node_rank)},
      {"MASTER_ADDR", master_addr},
      {"MASTER_PORT", std::to_string(master_port)},
  };
  if (!store_path.empty()) vars.emplace_back("FSDP_STORE_PATH", store_path);
  return vars;
}

int RunLocalWorld(const LocalLaunchOptions& options, const LaunchIo& io) {
  FSDP_CHECK(options.nproc_per_node >= 1, "fsdp-launch: --nproc-per-node must be >= 1");
  FSDP_CHECK(!options.command.empty(), "fsdp-launch: no program to run");

  // Rendezvous.
  std::string store_path = options.store_path;
  bool remove_store = false;
  if (store_path.empty() && options.master_port == 0) {
    FSDP_CHECK(options.nnodes == 1, "fsdp-launch: --nnodes ", options.nnodes,
               " needs --master-port or --store-path");
    store_path = MakeTempStoreDir();
    remove_store = true;
  }
  const std::string master_addr = options.master_addr.empty() ? "127.0.0.1" : options.master_addr;
  const int master_port = options.master_port > 0 ? options.master_port : FreeLocalPort();

  SignalForwarding forwarding;
  const int n = options.nproc_per_node;
  std::vector<ChildProcess> children(static_cast<size_t>(n));
  std::vector<char*> argv;
  for (const auto& a : options.command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);

  for (int local = 0; local < n; ++local) {
    ChildProcess& c = children[static_cast<size_t>(local)];
    c.rank = options.node_rank * n + local;
    const auto env_strings = ChildEnvironment(
        ChildLaunchVariables(options, local, master_addr, master_port, store_path));
    std::vector<char*> envp;
    for (const auto& e : env_strings) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);

    posix_spawn_file_actions_t actions;
    posix_spawnattr_t attr;
    posix_spawn_file_actions_init(&actions);
    posix_spawnattr_init(&attr);
    if (local != 0) posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    int out_pipe[2] = {-1, -1}, err_pipe[2] = {-1, -1};
    if (options.prefix_output) {
      FSDP_CHECK_CODE(ErrorCode::kUnavailable,
                      ::pipe2(out_pipe, O_CLOEXEC) == 0 && ::pipe2(err_pipe, O_CLOEXEC) == 0,
                      "fsdp-launch: pipe: ", std::strerror(errno));
      posix_spawn_file_actions_adddup2(&actions, out_pipe[1], 1);
      posix_spawn_file_actions_adddup2(&actions, err_pipe[1], 2);
    } else {
      if (io.out_fd != 1) posix_spawn_file_actions_adddup2(&actions, io.out_fd, 1);
      if (io.err_fd != 2) posix_spawn_file_actions_adddup2(&actions, io.err_fd, 2);
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
    const int rc = posix_spawnp(&c.pid, argv[0], &actions, &attr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
    if (options.prefix_output) {
      ::close(out_pipe[1]);
      ::close(err_pipe[1]);
      c.out = {out_pipe[0], io.out_fd, ""};
      c.err = {err_pipe[0], io.err_fd, ""};
    }
    if (rc != 0) {
      c.spawn_error = "cannot start " + options.command[0] + ": " + std::strerror(rc);
      c.status = 127 << 8;  // as a shell reports "command not found"
      c.pid = -1;
      if (c.out.fd >= 0) ::close(c.out.fd);
      if (c.err.fd >= 0) ::close(c.err.fd);
      c.out.fd = c.err.fd = -1;
    } else {
      c.running = true;
    }
  }

  const auto start = Clock::now();
  std::optional<Clock::time_point> kill_at;  // SIGKILL stragglers at this time
  int exit_code = 0;
  int failed_rank = -1;
  std::string cause;  // why the run is being stopped
  auto stop_all = [&](int sig, const std::string& why) {
    if (kill_at) return;
    cause = why;
    kill_at = Clock::now() + options.grace;
    for (auto& c : children) {
      if (!c.running) continue;
      c.signalled_by_us = true;
      if (::kill(-c.pid, sig) != 0) ::kill(c.pid, sig);
    }
  };
  for (auto& c : children) {
    if (!c.spawn_error.empty() && failed_rank < 0) {
      failed_rank = c.rank;
      exit_code = 127;
      WriteAll(io.err_fd,
               options.name + ": rank " + std::to_string(c.rank) + ": " + c.spawn_error + "\n");
      stop_all(SIGTERM, "rank " + std::to_string(c.rank) + " could not start");
    }
  }

  auto running = [&] {
    int k = 0;
    for (const auto& c : children) k += c.running ? 1 : 0;
    return k;
  };
  auto prefix_of = [&](const ChildProcess& c) { return "[rank " + std::to_string(c.rank) + "] "; };
  // Moves output along for up to `wait_ms`; returns false when no pipe is open.
  auto pump_output = [&](int wait_ms) {
    std::vector<pollfd> fds;
    std::vector<std::pair<OutputPipe*, const ChildProcess*>> owners;
    for (auto& c : children) {
      for (OutputPipe* p : {&c.out, &c.err}) {
        if (p->fd < 0) continue;
        fds.push_back({p->fd, POLLIN, 0});
        owners.emplace_back(p, &c);
      }
    }
    if (fds.empty()) {
      if (wait_ms > 0) ::poll(nullptr, 0, wait_ms);
      return false;
    }
    const int ready = ::poll(fds.data(), fds.size(), wait_ms);
    if (ready <= 0) return true;
    for (size_t k = 0; k < fds.size(); ++k) {
      if (fds[k].revents & (POLLIN | POLLHUP | POLLERR)) {
        Pump(*owners[k].first, prefix_of(*owners[k].second));
      }
    }
    return true;
  };

  while (running() > 0) {
    pump_output(10);
    for (auto& c : children) {
      if (!c.running) continue;
      int status = 0;
      const pid_t got = ::waitpid(c.pid, &status, WNOHANG);
      if (got != c.pid) continue;
      c.running = false;
      c.status = status;
      const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (!ok && !c.signalled_by_us && failed_rank < 0) {
        failed_rank = c.rank;
        exit_code = ExitCodeOf(status);
        WriteAll(io.err_fd, options.name + ": rank " + std::to_string(c.rank) + " (pid " +
                                std::to_string(c.pid) + ") " + DescribeStatus(status) +
                                (running() > 0 ? "; stopping the other ranks" : "") + "\n");
        stop_all(SIGTERM, "rank " + std::to_string(c.rank) + " failed");
      }
    }
    if (g_received_signal != 0 && !kill_at) {
      const int sig = g_received_signal;
      exit_code = 128 + sig;
      WriteAll(io.err_fd,
               options.name + ": received " + strsignal(sig) + "; forwarding it to every rank\n");
      stop_all(sig, options.name + " received " + strsignal(sig));
    }
    if (options.timeout.count() > 0 && !kill_at && Clock::now() - start >= options.timeout) {
      exit_code = 124;
      WriteAll(io.err_fd, options.name + ": the run exceeded --timeout-ms " +
                              std::to_string(options.timeout.count()) + "; stopping every rank\n");
      stop_all(SIGTERM, "timeout");
    }
    if (kill_at && Clock::now() >= *kill_at) {
      for (auto& c : children) {
        if (!c.running) continue;
        if (::kill(-c.pid, SIGKILL) != 0) ::kill(c.pid, SIGKILL);
      }
      kill_at = Clock::now() + std::chrono::hours(24);  // SIGKILL once
    }
  }
  // Drain what the ranks wrote last (bounded: a leftover grandchild may hold a pipe open).
  const auto drain_until = Clock::now() + std::chrono::seconds(2);
  while (pump_output(10) && Clock::now() < drain_until) {
  }
  for (auto& c : children) {
    for (OutputPipe* p : {&c.out, &c.err}) {
      if (p->fd < 0) continue;
      if (!p->partial.empty()) WriteAll(p->target, prefix_of(c) + p->partial + "\n");
      ::close(p->fd);
      p->fd = -1;
    }
  }

  if (exit_code != 0) {
    for (const auto& c : children) {
      if (c.rank == failed_rank || !c.spawn_error.empty()) continue;
      const bool ok = WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0;
      if (ok && !c.signalled_by_us) continue;
      WriteAll(io.err_fd, options.name + ": rank " + std::to_string(c.rank) + " " +
                              DescribeStatus(c.status) +
                              (c.signalled_by_us ? " (stopped: " + cause + ")" : "") + "\n");
    }
  }
  if (remove_store) {
    std::error_code ec;
    std::filesystem::remove_all(store_path, ec);
  }
  return exit_code;
}

}  // namespace fsdp::bench
