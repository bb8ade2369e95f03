#include "engine/dist/launch.h"

#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <sstream>

#include "engine/dist/nccl/nccl_process_group.h"
#include "fsdp/config.h"

namespace fsdp::dist {

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
  return backend == "nccl" ? Device::CUDA(local_rank) : Device::CPU();
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
  if (auto v = env("FSDP_BACKEND")) {
    FSDP_CHECK(*v == "gloo" || *v == "nccl", "launch environment: FSDP_BACKEND='", *v,
               "' is not a backend; use gloo or nccl");
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
std::shared_ptr<GlooStore> MakeLaunchStore(const LaunchEnvironment& launch,
                                           std::chrono::milliseconds timeout) {
  if (!launch.store_path.empty()) return GlooStore::File(launch.store_path);
  if (launch.world_size == 1) return GlooStore::InProcess();
  return GlooStore::Tcp(launch.master_addr, launch.master_port, launch.rank == 0, timeout);
}

}  // namespace

std::shared_ptr<ProcessGroup> InitNcclProcessGroup(const LaunchEnvironment& launch,
                                                   std::chrono::milliseconds timeout) {
  if (launch.timeout) timeout = *launch.timeout;
#if FSDP_HAVE_NCCL
  NcclOptions options;
  options.timeout = timeout;
  auto world = NcclProcessGroup::Create(MakeLaunchStore(launch, timeout), launch.rank,
                                        launch.world_size, Device::CUDA(launch.local_rank),
                                        options);
  SetDefaultProcessGroup(world);
  return world;
#else
  (void)timeout;
  FSDP_THROW(ErrorCode::kUnavailable, "InitNcclProcessGroup (", launch.str(),
             "): this build has no NCCL (FSDP_HAVE_NCCL is 0: configured without CUDA, with "
             "FSDP_ENABLE_CUDA=OFF, or NCCL was not found)");
#endif
}

std::shared_ptr<ProcessGroup> InitProcessGroup(const LaunchEnvironment& launch,
                                               GlooOptions options) {
  if (launch.backend == "nccl") return InitNcclProcessGroup(launch, options.timeout);
  if (launch.timeout) options.timeout = *launch.timeout;
  if (!launch.iface.empty()) {
    options.iface = launch.iface;
  } else if (launch.local_world_size != launch.world_size) {
    // Ranks on several hosts: advertise this host's name instead of the loopback address.
    char host[256] = {0};
    if (::gethostname(host, sizeof(host) - 1) == 0 && host[0] != '\0') options.hostname = host;
  }
  auto world = GlooProcessGroup::Create(MakeLaunchStore(launch, options.timeout), launch.rank,
                                        launch.world_size, options);
  SetDefaultProcessGroup(world);
  return world;
}

std::unique_ptr<DistributedSession> DistributedSession::FromEnvironment(const EnvLookup& env,
                                                                        GlooOptions options,
                                                                        uint64_t seed) {
  return Create(ReadLaunchEnvironment(env), std::move(options), seed);
}

std::unique_ptr<DistributedSession> DistributedSession::Create(const LaunchEnvironment& launch,
                                                               GlooOptions options, uint64_t seed) {
  std::unique_ptr<DistributedSession> session(new DistributedSession(launch, seed));
  session->world_ = InitProcessGroup(launch, std::move(options));
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

}  // namespace fsdp::dist
