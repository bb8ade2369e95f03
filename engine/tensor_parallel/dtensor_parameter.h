// The DTensor view of a module's tensor-parallel parameters. After a parallel style shards a
// parameter, the module's parameter slot holds the local tensor (the leaf that optimizers
// update and that gets .grad), and this registry keeps the DTensor around it (mesh,
// placements, global shape), as PyTorch's nn.Parameter(DTensor) carries both. Stored as a
// module attachment, so it follows the module.
// A wrapper that replaces the module's parameters by views (FSDP1 over a tensor-parallel
// model) re-records the DTensor around each view with RecordDTensorParameter, so the registry
// always describes the tensor the module computes with.
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
// Records `param` as the DTensor of parameter `name` of `module` without touching the slot
// (the slot already holds `param`'s local tensor, or a view of it that a wrapper installed).
void RecordDTensorParameter(nn::Module& module, const std::string& name, const DTensor& param);
// The DTensor of parameter `name` of `module`, or nullopt when it is not tensor-parallel.
std::optional<DTensor> GetDTensorParameter(const nn::Module& module, const std::string& name);

// `setattr(module, name, tensor)` for the tensor a forward reads as `module.name`: the
// parameter slot when `name` is a parameter, else the plain tensor attribute (where FSDP1 with
// use_orig_params=False keeps its views). Used by hooks that swap a parameter for the
// duration of a call and put the previous tensor back afterwards.
void SetParameterOrAttribute(nn::Module& module, const std::string& name, const Tensor& tensor);

}  // namespace fsdp::tensor_parallel
