// Functional collectives (torch.distributed._functional_collectives): out-of-place
// collectives that return a new tensor, used by tensor-parallel redistributions. Each call is
// one ProcessGroup collective recorded by CommDebugMode under its functional key
// ("c10d_functional.all_gather_into_tensor", ...), not under the c10d key. They carry no
// autograd history (the tensor-parallel layer wraps them in differentiable functions).
// Gather/scatter happen along dim 0 (callers move other dims to the front first).
// Thread-safety: called from the rank's own thread, like any collective.
#pragma once

#include "engine/core/tensor.h"
#include "engine/distributed/process_group.h"

namespace fsdp::distributed::funcol {

// [d0, ...] -> [size * d0, ...], rank-major.
Tensor all_gather_tensor(const Tensor& input, ProcessGroup& group);
// [size * d, ...] -> [d, ...]; size(0) must be divisible by the group size.
Tensor reduce_scatter_tensor(const Tensor& input, ReduceOptions options, ProcessGroup& group);
Tensor all_reduce(const Tensor& input, ReduceOptions options, ProcessGroup& group);
// A copy of group rank `root`'s input on every rank.
Tensor broadcast(const Tensor& input, int root, ProcessGroup& group);

}  // namespace fsdp::distributed::funcol
