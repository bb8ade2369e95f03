#include "engine/tensor_parallel/redistribute.h"

#include <vector>

#include "engine/core/error.h"
#include "engine/distributed/functional_collectives.h"
#include "engine/ops/elementwise.h"
#include "engine/ops/shape_ops.h"

namespace fsdp::tensor_parallel {
namespace {

using distributed::DeviceMesh;
using distributed::ProcessGroup;
using distributed::ReduceOp;
using distributed::ReduceOptions;
namespace funcol = distributed::funcol;
namespace kernels = ops::kernels;

// Swaps dims 0 and `dim` (its own inverse); a copy, or x itself for dim 0.
Tensor SwapToFront(const Tensor& x, int64_t dim) {
  return dim == 0 ? x : kernels::Transpose(x, 0, dim);
}

// `x` with dim `dim` zero-padded at the end to `size` elements.
Tensor PadDim(const Tensor& x, int64_t dim, int64_t size) {
  const int64_t have = x.size(dim);
  if (have == size) return x;
  Shape pad_shape = x.sizes();
  pad_shape[static_cast<size_t>(dim)] = size - have;
  return kernels::Cat({x, Tensor::zeros(pad_shape, x.dtype(), x.device())}, dim);
}

// The torch.chunk piece of `full` along `dim` owned by `index` of `num_chunks` (a copy).
Tensor LocalChunk(const Tensor& full, int64_t dim, int64_t num_chunks, int64_t index) {
  const ChunkRange range = ComputeChunkRange(full.size(dim), num_chunks, index);
  return kernels::Narrow(full, dim, range.offset, range.length);
}

// Shard(dim) -> Replicate over `group`: the full `size` elements along `dim`.
Tensor GatherDim(const Tensor& local, int64_t dim, int64_t size, ProcessGroup& group) {
  const int64_t chunk = ComputeChunkRange(size, group.size(), 0).chunk;
  Tensor gathered = funcol::all_gather_tensor(SwapToFront(PadDim(local, dim, chunk), dim), group);
  return SwapToFront(kernels::Narrow(gathered, 0, 0, size), dim);
}

// Partial -> Shard(dim) over `group` of a tensor whose full dim `dim` is local here.
Tensor ReduceScatterDim(const Tensor& partial, int64_t dim, ReduceOp op, ProcessGroup& group,
                        int64_t index) {
  const int64_t size = partial.size(dim);
  const ChunkRange range = ComputeChunkRange(size, group.size(), index);
  Tensor padded = PadDim(partial, dim, range.chunk * group.size());
  Tensor scattered =
      funcol::reduce_scatter_tensor(SwapToFront(padded, dim), ReduceOptions{op, 1.0}, group);
  return SwapToFront(kernels::Narrow(scattered, 0, 0, range.length), dim);
}

[[noreturn]] void Unsupported(const Placement& from, const Placement& to, int mesh_dim) {
  FSDP_THROW(ErrorCode::kInvalidArgument, "redistribute from ", from.str(), " to ", to.str(),
             " on mesh dim ", mesh_dim, " is not supported");
}

}  // namespace

Tensor redistribute_local_tensor(const Tensor& local, const DeviceMesh& mesh,
                                 const Placements& current, const Placements& target,
                                 const Shape& global_shape, bool is_backward) {
  FSDP_INTERNAL_ASSERT(static_cast<int>(current.size()) == mesh.ndim() &&
                       static_cast<int>(target.size()) == mesh.ndim());
  Tensor out = local;
  Placements now = current;
  // Pass 1: every mesh dim that leaves a Shard gathers first.
  for (int i = 0; i < mesh.ndim(); ++i) {
    const Placement& from = now[static_cast<size_t>(i)];
    const Placement& to = target[static_cast<size_t>(i)];
    if (from == to || !from.is_shard()) continue;
    if (to.is_partial()) Unsupported(from, to, i);
    out = GatherDim(out, from.dim(), global_shape[static_cast<size_t>(from.dim())],
                    *mesh.get_group(i));
    now[static_cast<size_t>(i)] = Placement::Replicate();
  }
  // Pass 2: Partial and Replicate sources, in mesh-dim order.
  for (int i = 0; i < mesh.ndim(); ++i) {
    const Placement& from = now[static_cast<size_t>(i)];
    const Placement& to = target[static_cast<size_t>(i)];
    if (from == to) continue;
    ProcessGroup& group = *mesh.get_group(i);
    const int64_t index = mesh.get_local_rank(i);
    if (from.is_partial()) {
      if (to.is_replicate()) {
        out = funcol::all_reduce(out, ReduceOptions{from.reduce_op(), 1.0}, group);
      } else if (to.is_shard()) {
        out = ReduceScatterDim(out, to.dim(), from.reduce_op(), group, index);
      } else {
        Unsupported(from, to, i);
      }
    } else if (to.is_shard()) {  // Replicate -> Shard
      out = LocalChunk(out, to.dim(), group.size(), index);
    } else if (to.is_partial()) {  // Replicate -> Partial
      if (!is_backward && to.reduce_op() == ReduceOp::kSum) {
        out = kernels::DivScalar(out, static_cast<double>(group.size()));
      }
    }
    now[static_cast<size_t>(i)] = to;
  }
  return out;
}

}  // namespace fsdp::tensor_parallel
