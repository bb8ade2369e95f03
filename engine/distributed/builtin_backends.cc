#include "engine/distributed/builtin_backends.h"

#include "engine/distributed/gloo/gloo_backend.h"
#include "engine/distributed/nccl/nccl_backend.h"

namespace fsdp::distributed {

BackendRegistry BuiltinBackends() {
  BackendRegistry registry;
  registry.Register(GlooBackend());
  registry.Register(NcclBackend());
  return registry;
}

}  // namespace fsdp::distributed
