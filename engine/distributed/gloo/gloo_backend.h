// The gloo backend's registration: GlooProcessGroup for ranks that are processes on the CPU,
// rendezvous through the spec's Store (BackendRegistry, backend_registry.h).
// Thread-safety: the returned factory is thread-safe.
#pragma once

#include "engine/distributed/backend_registry.h"

namespace fsdp::distributed {

// name "gloo"; processes; cpu; every collective.
BackendSpec GlooBackend();

}  // namespace fsdp::distributed
