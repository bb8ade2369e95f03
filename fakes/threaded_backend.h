// The threaded backend's registration: a world of fakes::ThreadedProcessGroup, every rank a
// thread of this process on the CPU (BackendRegistry, engine/distributed/backend_registry.h),
// and DefaultBackends(): the engine's built-in backends plus this one, the registry that the
// conformance suite and pg-bench start from.
// Thread-safety: the returned factory is thread-safe; each call returns a fresh registry.
#pragma once

#include "engine/distributed/backend_registry.h"

namespace fsdp::fakes {

// name "threaded"; threads; cpu; every collective.
distributed::BackendSpec ThreadedBackend();

// distributed::BuiltinBackends() (gloo, nccl) plus ThreadedBackend().
distributed::BackendRegistry DefaultBackends();

}  // namespace fsdp::fakes
