#include "engine/distributed/nccl/nccl_backend.h"

#include "engine/core/allocator.h"
#include "fsdp/config.h"
#if FSDP_HAVE_NCCL
#include "engine/distributed/nccl/nccl_process_group.h"
#endif

namespace fsdp::distributed {

BackendSpec NcclBackend() {
  BackendSpec spec;
  spec.name = "nccl";
  spec.description = "one process per rank, NCCL on CUDA devices (one GPU per rank)";
  spec.capabilities.ranks = RankPlacement::kProcesses;
  spec.capabilities.device = DeviceType::kCUDA;
  spec.unavailable = [](int world) -> std::optional<std::string> {
    const int gpus = CudaDeviceCount();
    if (gpus == 0) return std::string("backend nccl: no CUDA device visible");
    if (world > gpus) {
      return "backend nccl needs one GPU per rank: world " + std::to_string(world) + ", " +
             std::to_string(gpus) + " CUDA device(s) visible";
    }
    return std::nullopt;
  };
#if FSDP_HAVE_NCCL
  spec.process_group = [](const ProcessGroupSpec& s) -> std::shared_ptr<ProcessGroup> {
    NcclOptions options;
    options.timeout = s.timeout;
    return NcclProcessGroup::Create(s.store, s.rank, s.world, s.device, options);
  };
#endif
  return spec;
}

}  // namespace fsdp::distributed
