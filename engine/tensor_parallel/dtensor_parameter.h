// The DTensor view of a module's tensor-parallel parameters. After a parallel style shards a
// parameter, the module's parameter slot holds the local tensor (the leaf that optimizers
// update and that gets .grad), and this registry keeps the DTensor around it (mesh,
// placements, global shape), as PyTorch's nn.Parameter(DTensor) carries both. Stored as a
// module attachment, so it follows the module.
// Ownership: the module owns the registry (shared with copies of the attachment).
// Thread-safety: none; used by the module's rank thread.
#pragma once

#include <optional>
#include <string>

#include "engine/nn/module.h"
#include "engine/tensor_parallel/dtensor.h"

namespace fsdp::tensor_parallel {

// Puts `param.local_tensor()` (a leaf) into parameter slot `name` of `module` and records `param`.
void RegisterDTensorParameter(nn::Module& module, const std::string& name, const DTensor& param);
// The DTensor of parameter `name` of `module`, or nullopt when it is not tensor-parallel.
std::optional<DTensor> GetDTensorParameter(const nn::Module& module, const std::string& name);

}  // namespace fsdp::tensor_parallel
