// The nccl backend's registration: NcclProcessGroup for ranks that are processes with one CUDA
// device each, the unique id exchanged through the spec's Store (BackendRegistry,
// backend_registry.h). Compiled in every build; in builds without NCCL the spec has no
// factory, so the backend is listed and reported unavailable with the reason.
// Thread-safety: the returned factory is thread-safe.
#pragma once

#include "engine/distributed/backend_registry.h"

namespace fsdp::distributed {

// name "nccl"; processes; cuda (rank on cuda:local_rank); every collective.
BackendSpec NcclBackend();

}  // namespace fsdp::distributed
