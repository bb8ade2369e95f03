#include "engine/distributed/gloo/gloo_backend.h"

#include <unistd.h>

#include "engine/distributed/gloo/gloo_process_group.h"

namespace fsdp::distributed {

BackendSpec GlooBackend() {
  BackendSpec spec;
  spec.name = "gloo";
  spec.description = "one process per rank, Gloo over TCP (loopback on one host)";
  spec.capabilities.ranks = RankPlacement::kProcesses;
  spec.capabilities.device = DeviceType::kCPU;
  spec.capabilities.straggler_check = true;
  spec.process_group = [](const ProcessGroupSpec& s) -> std::shared_ptr<ProcessGroup> {
    GlooOptions options;
    options.timeout = s.timeout;
    options.check_collectives = s.check_collectives;
    options.straggler_timeout = s.straggler_timeout;
    if (!s.network_interface.empty()) {
      options.iface = s.network_interface;
    } else if (!s.single_host) {
      // Ranks on several hosts: advertise this host's name instead of the loopback address.
      char host[256] = {0};
      if (::gethostname(host, sizeof(host) - 1) == 0 && host[0] != '\0') options.hostname = host;
    }
    return GlooProcessGroup::Create(s.store, s.rank, s.world, options);
  };
  return spec;
}

}  // namespace fsdp::distributed
