#include "tools/launch/local_launcher.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <set>
#include <string>

#include "engine/core/error.h"
#include "engine/core/fd_io.h"
#include "engine/distributed/launch/process_launcher.h"

namespace fsdp::bench {

namespace {

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

}  // namespace

std::string LocalLaunchUsage() {
  return R"(usage: fsdp-launch --nproc-per-node N [options] [--] PROGRAM [ARGS...]

Starts N local processes of PROGRAM with torchrun's launch variables (RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT; FSDP_STORE_PATH for a
file-store rendezvous), which fsdp::distributed::DistributedSession::FromEnvironment reads.
Ranks never outlive fsdp-launch: when it ends in any way (SIGKILL included) they are stopped.

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
  --check-collectives  set FSDP_CHECK_COLLECTIVES=1: every collective's fingerprint (op,
                       sizes, dtype, reduce op, root, sequence number) is compared across
                       the ranks before it runs; a mismatch fails every rank, naming both sides
  -h, --help           this text

Exit status: 0 when every rank exits 0; otherwise the first failed rank's exit status
(128 + N when it was killed by signal N), 124 on timeout, 2 on a usage error.
)";
}

LocalLaunchOptions ParseLocalLaunchArgs(const std::vector<std::string>& args, bool* help) {
  LocalLaunchOptions o;
  bool nproc_given = false;
  std::set<std::string> seen_flags;  // every option at most once
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
    FSDP_CHECK(seen_flags.insert(flag).second, "fsdp-launch: ", flag,
               " is given twice (give each option once)");
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
    } else if (flag == "--check-collectives") {
      no_value();
      o.check_collectives = true;
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
  if (options.check_collectives) vars.emplace_back("FSDP_CHECK_COLLECTIVES", "1");
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

  const int n = options.nproc_per_node;
  std::vector<distributed::RankCommand> commands(static_cast<size_t>(n));
  for (int local = 0; local < n; ++local) {
    distributed::RankCommand& c = commands[static_cast<size_t>(local)];
    const std::string prefix = "[rank " + std::to_string(options.node_rank * n + local) + "] ";
    c.argv = options.command;
    c.env = ChildLaunchVariables(options, local, master_addr, master_port, store_path);
    c.inherit_stdin = local == 0;
    c.out = options.prefix_output ? distributed::OutputSink::PrefixLines(prefix, io.out_fd)
                                  : distributed::OutputSink::Inherit(io.out_fd);
    c.err = options.prefix_output ? distributed::OutputSink::PrefixLines(prefix, io.err_fd)
                                  : distributed::OutputSink::Inherit(io.err_fd);
  }
  auto rank_of = [&](int index) { return options.node_rank * n + index; };

  distributed::LaunchPolicy policy;
  policy.deadline = options.timeout;
  policy.failure_grace = std::chrono::milliseconds(0);  // stop the others at once
  policy.kill_grace = options.grace;
  policy.forward_signals = true;
  distributed::ProcessLauncher launcher(policy);
  std::string cause;  // why the run is being stopped
  launcher.set_on_stop([&](const distributed::StopEvent& event,
                           const distributed::WorldExit& world) {
    switch (event.reason) {
      case distributed::StopReason::kRankFailed: {
        const distributed::RankExit& e = world.ranks[static_cast<size_t>(event.rank)];
        const std::string rank = std::to_string(rank_of(event.rank));
        if (!e.spawn_error.empty()) {
          WriteAllToFd(io.err_fd, options.name + ": rank " + rank + ": " + e.spawn_error + "\n");
          cause = "rank " + rank + " could not start";
        } else {
          WriteAllToFd(io.err_fd, options.name + ": rank " + rank + " (pid " + std::to_string(e.pid) +
                                  ") " + e.Describe() +
                                  (event.others_running ? "; stopping the other ranks" : "") +
                                  "\n");
          cause = "rank " + rank + " failed";
        }
        break;
      }
      case distributed::StopReason::kSignal:
        WriteAllToFd(io.err_fd, options.name + ": received " + strsignal(event.signal) +
                                "; forwarding it to every rank\n");
        cause = options.name + " received " + strsignal(event.signal);
        break;
      case distributed::StopReason::kDeadline:
        WriteAllToFd(io.err_fd, options.name + ": the run exceeded --timeout-ms " +
                                std::to_string(options.timeout.count()) + "; stopping every rank\n");
        cause = "timeout";
        break;
      case distributed::StopReason::kNone:
      case distributed::StopReason::kRequested:  // no stop_requested here
        break;
    }
  });
  const distributed::WorldExit world = launcher.Run(commands);

  int exit_code = 0;
  switch (world.stop_reason) {
    case distributed::StopReason::kRankFailed:
      exit_code = world.ranks[static_cast<size_t>(world.first_failed)].exit_code();
      break;
    case distributed::StopReason::kSignal:
      exit_code = 128 + world.received_signal;
      break;
    case distributed::StopReason::kDeadline:
      exit_code = 124;
      break;
    case distributed::StopReason::kNone:
    case distributed::StopReason::kRequested:  // no stop_requested here
      break;
  }
  if (exit_code != 0) {
    for (int i = 0; i < n; ++i) {
      const distributed::RankExit& e = world.ranks[static_cast<size_t>(i)];
      if (i == world.first_failed || !e.spawn_error.empty()) continue;
      if (e.ok() && !e.stopped) continue;
      WriteAllToFd(io.err_fd, options.name + ": rank " + std::to_string(rank_of(i)) + " " +
                              e.Describe() + (e.stopped ? " (stopped: " + cause + ")" : "") +
                              "\n");
    }
  }
  if (remove_store) {
    std::error_code ec;
    std::filesystem::remove_all(store_path, ec);
  }
  return exit_code;
}

}  // namespace fsdp::bench
