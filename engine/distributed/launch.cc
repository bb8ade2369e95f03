#include "engine/distributed/launch.h"

#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <sstream>

#include "engine/distributed/builtin_backends.h"
#include "engine/distributed/store/file_store.h"
#include "engine/distributed/store/hash_store.h"
#include "engine/distributed/store/tcp_store.h"

namespace fsdp::distributed {

std::string LaunchEnvironment::str() const {
  std::ostringstream os;
  os << "rank " << rank << "/" << world_size << " (local " << local_rank << "/" << local_world_size
     << ") from " << source << ", store ";
  if (!store_path.empty()) {
    os << "file://" << store_path;
  } else if (!master_addr.empty()) {
    os << "tcp://" << master_addr << ":" << master_port;
  } else {
    os << "(none)";
  }
  if (backend != "gloo") os << ", backend " << backend;
  return os.str();
}

Device LaunchEnvironment::device() const {
  return BuiltinBackends().Get(backend).DeviceOf(local_rank);
}

EnvLookup ProcessEnvironment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

namespace {

int ParseInt(const std::string& name, const std::string& value, int min_value) {
  errno = 0;
  char* end = nullptr;
  const long v = std::strtol(value.c_str(), &end, 10);
  FSDP_CHECK(errno == 0 && end != value.c_str() && *end == '\0' && v >= min_value && v <= INT_MAX,
             "launch environment: ", name, "='", value, "' is not an integer >= ", min_value);
  return static_cast<int>(v);
}

// The first variable of `names` that is set, with its name.
std::optional<std::pair<std::string, std::string>> First(const EnvLookup& env,
                                                         std::initializer_list<const char*> names) {
  for (const char* n : names) {
    if (auto v = env(n)) return std::make_pair(std::string(n), *v);
  }
  return std::nullopt;
}

}  // namespace

std::chrono::milliseconds ReadStragglerTimeout(const EnvLookup& env) {
  const auto v = env("FSDP_STRAGGLER_TIMEOUT_MS");
  return std::chrono::milliseconds(v ? ParseInt("FSDP_STRAGGLER_TIMEOUT_MS", *v, 0) : 0);
}

LaunchEnvironment ReadLaunchEnvironment(const EnvLookup& env) {
  LaunchEnvironment launch;
  struct Layout {
    const char* source;
    const char* rank;
    const char* world;
    const char* local_rank;
    const char* local_world;
  };
  const Layout layouts[] = {
      {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
      {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
       "OMPI_COMM_WORLD_LOCAL_SIZE"},
      {"pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
      {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
  };
  for (const Layout& l : layouts) {
    auto rank = env(l.rank);
    auto world = env(l.world);
    if (!rank && !world) continue;
    FSDP_CHECK(rank && world, "launch environment (", l.source, "): ", rank ? l.world : l.rank,
               " is not set but ", rank ? l.rank : l.world, " is");
    launch.source = l.source;
    launch.rank = ParseInt(l.rank, *rank, 0);
    launch.world_size = ParseInt(l.world, *world, 1);
    launch.local_rank = launch.rank;
    launch.local_world_size = launch.world_size;
    if (auto v = env(l.local_rank)) launch.local_rank = ParseInt(l.local_rank, *v, 0);
    if (auto v = env(l.local_world)) {
      // Slurm may write "4(x2)"; take the leading count.
      std::string s = *v;
      if (const size_t paren = s.find('('); paren != std::string::npos) s.resize(paren);
      launch.local_world_size = ParseInt(l.local_world, s, 1);
    } else if (env(l.local_rank)) {
      launch.local_world_size = 0;  // unknown: the launcher gave a local rank but no count
    }
    break;
  }
  FSDP_CHECK(launch.rank < launch.world_size, "launch environment (", launch.source, "): rank ",
             launch.rank, " is not below the world size ", launch.world_size);
  if (auto v = env("MASTER_ADDR")) launch.master_addr = *v;
  if (auto v = env("MASTER_PORT")) launch.master_port = ParseInt("MASTER_PORT", *v, 1);
  FSDP_CHECK(launch.master_port < 65536, "launch environment: MASTER_PORT=", launch.master_port,
             " is not a TCP port");
  if (auto v = env("FSDP_STORE_PATH")) launch.store_path = *v;
  if (auto v = First(env, {"GLOO_SOCKET_IFNAME", "FSDP_GLOO_IFACE"})) launch.iface = v->second;
  if (auto v = env("FSDP_PG_TIMEOUT_MS")) {
    launch.timeout = std::chrono::milliseconds(ParseInt("FSDP_PG_TIMEOUT_MS", *v, 1));
  }
  launch.straggler_timeout = ReadStragglerTimeout(env);
  if (auto v = env("FSDP_CHECK_COLLECTIVES")) {
    FSDP_CHECK(*v == "0" || *v == "1", "FSDP_CHECK_COLLECTIVES must be 0 or 1, got '", *v, "'");
    launch.check_collectives = *v == "1";
  }
  if (auto v = env("FSDP_BACKEND")) {
    const BackendRegistry backends = BuiltinBackends();
    const BackendSpec* spec = backends.Find(*v);
    if (spec == nullptr || spec->capabilities.ranks != RankPlacement::kProcesses) {
      std::string names;
      for (const auto& n : backends.Names()) {
        if (backends.Get(n).capabilities.ranks == RankPlacement::kProcesses) {
          names += (names.empty() ? "" : ", ") + n;
        }
      }
      FSDP_THROW(ErrorCode::kInvalidArgument, "launch environment: FSDP_BACKEND='", *v,
                 "' is not a backend whose ranks are processes; use one of: ", names);
    }
    launch.backend = *v;
  }
  if (launch.world_size > 1) {
    FSDP_CHECK(
        !launch.store_path.empty() || (!launch.master_addr.empty() && launch.master_port > 0),
        "launch environment: rank ", launch.rank, " of ", launch.world_size, " (from ",
        launch.source,
        ") needs a rendezvous: set FSDP_STORE_PATH to a fresh shared "
        "directory, or MASTER_ADDR and MASTER_PORT");
  }
  return launch;
}

namespace {

// The rendezvous store for `launch`: a file store, the in-process store for a world of one,
// or the TCP store hosted by rank 0.
std::shared_ptr<Store> MakeLaunchStore(const LaunchEnvironment& launch,
                                           std::chrono::milliseconds timeout) {
  if (!launch.store_path.empty()) return std::make_shared<FileStore>(launch.store_path, timeout);
  if (launch.world_size == 1) return std::make_shared<HashStore>(timeout);
  return std::make_shared<TcpStore>(launch.master_addr, launch.master_port, launch.rank == 0,
                                    timeout);
}

}  // namespace

std::shared_ptr<ProcessGroup> InitProcessGroup(const LaunchEnvironment& launch,
                                               std::chrono::milliseconds timeout) {
  if (launch.timeout) timeout = *launch.timeout;
  const BackendRegistry backends = BuiltinBackends();
  if (auto why = backends.Unavailable(launch.backend, launch.world_size)) {
    FSDP_THROW(ErrorCode::kUnavailable, "InitProcessGroup (", launch.str(), "): ", *why);
  }
  ProcessGroupSpec spec;
  spec.rank = launch.rank;
  spec.world = launch.world_size;
  spec.local_rank = launch.local_rank;
  spec.store = MakeLaunchStore(launch, timeout);
  spec.timeout = timeout;
  spec.device = launch.device();
  spec.network_interface = launch.iface;
  spec.single_host = launch.local_world_size == launch.world_size;
  spec.check_collectives = launch.check_collectives;
  spec.straggler_timeout = launch.straggler_timeout;
  auto world = backends.Get(launch.backend).process_group(spec);
  SetDefaultProcessGroup(world);
  return world;
}

std::unique_ptr<DistributedSession> DistributedSession::FromEnvironment(const EnvLookup& env,
                                                                        uint64_t seed) {
  return Create(ReadLaunchEnvironment(env), seed);
}

std::unique_ptr<DistributedSession> DistributedSession::Create(const LaunchEnvironment& launch,
                                                               uint64_t seed) {
  std::unique_ptr<DistributedSession> session(new DistributedSession(launch, seed));
  session->world_ = InitProcessGroup(launch);
  return session;
}

DistributedSession::DistributedSession(LaunchEnvironment launch, uint64_t seed)
    : launch_(std::move(launch)),
      context_(launch_.rank, launch_.world_size, launch_.device(), seed),
      guard_(context_) {}

DistributedSession::~DistributedSession() {
  SetDefaultProcessGroup(nullptr);
  world_.reset();
}

}  // namespace fsdp::distributed
