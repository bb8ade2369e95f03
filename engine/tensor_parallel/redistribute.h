// redistribute_local_tensor (torch/distributed/tensor/_redistribute.py): turns this rank's
// local piece of a tensor of `global_shape` from `current` placements into `target`
// placements on `mesh`, issuing functional collectives (engine/distributed/
// functional_collectives.h, counted by CommDebugMode under "c10d_functional.*"):
//
//   Shard(d)   -> Replicate   all_gather_into_tensor along d (uneven shards padded to
//                             ceil(n/W), then trimmed)
//   Shard(d)   -> Shard(e)    all_gather_into_tensor along d, then the local chunk along e
//                             (PyTorch issues one all_to_all here)
//   Partial    -> Replicate   all_reduce (sum or avg)
//   Partial    -> Shard(d)    reduce_scatter_tensor along d (padded to W * ceil(n/W))
//   Replicate  -> Shard(d)    the local torch.chunk piece along d, no communication
//   Replicate  -> Partial     forward: sum divides by W (_partition_value), avg keeps the
//                             value; with is_backward the value is kept (PyTorch keeps a
//                             replicated gradient instead of partitioning it)
//   Shard      -> Partial     and Partial(a) -> Partial(b): rejected, as in PyTorch
//
// Mesh dims are processed in two passes: every mesh dim that leaves a Shard first (gather),
// then the rest in mesh-dim order, so a tensor dim is never sharded over two mesh dims on the
// way. No autograd: DTensor::redistribute wraps this in a differentiable function.
// Thread-safety: a collective; called from the rank's own thread.
#pragma once

#include "engine/core/tensor.h"
#include "engine/distributed/device_mesh.h"
#include "engine/tensor_parallel/placement.h"

namespace fsdp::tensor_parallel {

// `current` and `target` must be normalized (NormalizePlacements) for `global_shape`.
Tensor redistribute_local_tensor(const Tensor& local, const distributed::DeviceMesh& mesh,
                                 const Placements& current, const Placements& target,
                                 const Shape& global_shape, bool is_backward = false);

}  // namespace fsdp::tensor_parallel
