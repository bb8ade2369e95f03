// parallelize_module(module, device_mesh, parallelize_plan), like
// torch.distributed.tensor.parallel.parallelize_module: applies each plan entry's
// ParallelStyle to the submodule its FQN names ("mlp.net1"; "" is `module` itself), in plan
// order, over a 1-D device mesh (the TP mesh, e.g. mesh_2d["tp"]).
// Errors (InvalidArgument, nothing applied): a mesh that is not 1-D, a plan FQN that names
// no submodule (the message lists the module's FQNs), a style on a module it does not
// support. Wildcards in FQNs are not implemented.
// Ownership: the module keeps the styles' hooks; the plan may be dropped afterwards.
// Thread-safety: call on the module's rank thread (collective over the mesh: parameters are
// distributed with distribute_tensor).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/distributed/device_mesh.h"
#include "engine/nn/module.h"
#include "engine/tensor_parallel/parallel_style.h"

namespace fsdp::tensor_parallel {

// FQN -> style, in application order (a Python dict keeps insertion order).
using ParallelizePlan = std::vector<std::pair<std::string, std::shared_ptr<ParallelStyle>>>;

nn::Module& parallelize_module(nn::Module& module,
                               const std::shared_ptr<distributed::DeviceMesh>& device_mesh,
                               const ParallelizePlan& parallelize_plan);

}  // namespace fsdp::tensor_parallel
