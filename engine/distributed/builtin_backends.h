// BuiltinBackends: the registry of the engine's own process backends, each registered by its
// folder's `<name>_backend.cc`: gloo (processes, CPU) and nccl (processes, one CUDA device per
// rank; listed without a factory in builds without NCCL). The threaded fake is added by
// fakes::DefaultBackends (fakes/threaded_backend.h). Adding an engine backend: its folder,
// its `<name>_backend.cc`, and one Register line in builtin_backends.cc.
// Thread-safety: returns a fresh registry per call.
#pragma once

#include "engine/distributed/backend_registry.h"

namespace fsdp::distributed {

BackendRegistry BuiltinBackends();

}  // namespace fsdp::distributed
