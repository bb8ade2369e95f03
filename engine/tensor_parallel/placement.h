// Placements of a DTensor along one mesh dimension, like torch.distributed.tensor's
// Shard(dim), Replicate() and Partial(reduce_op) (placement_types.py), and the torch.chunk
// arithmetic of uneven shards: along a mesh dimension of size W, a tensor dimension of size n
// is cut into chunks of c = ceil(n / W) elements; mesh index r holds [min(r*c, n),
// min((r+1)*c, n)), so trailing ranks may hold fewer or zero elements.
// Ownership: values. Thread-safety: immutable values and pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/core/tensor.h"
#include "engine/distributed/device_mesh.h"
#include "engine/distributed/reduce_op.h"

namespace fsdp::tensor_parallel {

class Placement {
 public:
  enum class Kind { kShard, kReplicate, kPartial };

  static Placement Shard(int64_t dim);
  static Placement Replicate();
  // Partial(reduce_op="sum"); kSum and kAvg are supported.
  static Placement Partial(distributed::ReduceOp reduce_op = distributed::ReduceOp::kSum);

  Kind kind() const { return kind_; }
  bool is_shard() const { return kind_ == Kind::kShard; }
  // is_shard(dim): Shard on exactly `dim` (both already normalized by the caller).
  bool is_shard(int64_t dim) const { return is_shard() && dim_ == dim; }
  bool is_replicate() const { return kind_ == Kind::kReplicate; }
  bool is_partial() const { return kind_ == Kind::kPartial; }
  // The tensor dim of a Shard (may be negative until normalized); 0 for the other kinds.
  int64_t dim() const { return dim_; }
  distributed::ReduceOp reduce_op() const { return reduce_op_; }
  // A Shard with its dim made non-negative for a tensor of `ndim` dims; other kinds unchanged.
  // Throws when the dim is outside [-ndim, ndim).
  Placement normalized(int64_t ndim) const;

  // "Shard(dim=0)", "Replicate()", "Partial(sum)", as PyTorch prints them.
  std::string str() const;
  bool operator==(const Placement& other) const;
  bool operator!=(const Placement& other) const { return !(*this == other); }

 private:
  Placement(Kind kind, int64_t dim, distributed::ReduceOp reduce_op)
      : kind_(kind), dim_(dim), reduce_op_(reduce_op) {}
  Kind kind_;
  int64_t dim_;
  distributed::ReduceOp reduce_op_;
};

using Placements = std::vector<Placement>;

// "(Shard(dim=0), Replicate())".
std::string PlacementsStr(const Placements& placements);

// The torch.chunk piece of a dimension of `size` owned by mesh index `index` of `num_chunks`.
struct ChunkRange {
  int64_t chunk = 0;   // c = ceil(size / num_chunks): the padded piece size
  int64_t offset = 0;  // first element owned (clamped to size)
  int64_t length = 0;  // elements owned; 0 for trailing empty pieces
};
ChunkRange ComputeChunkRange(int64_t size, int64_t num_chunks, int64_t index);

// Checks `placements` against `mesh` and a tensor of `ndim` dims and returns them normalized:
// one placement per mesh dim, Shard dims inside the tensor, no tensor dim sharded over two
// mesh dims (not implemented), Partial only with sum or avg. `what` names the tensor in errors.
Placements NormalizePlacements(const Placements& placements, const distributed::DeviceMesh& mesh,
                               int64_t ndim, const std::string& what);

// This rank's local shape of a tensor of `global_shape` (compute_local_shape): each Shard(d)
// on mesh dim i narrows dim d to this rank's ComputeChunkRange along mesh dim i.
Shape ComputeLocalShape(const Shape& global_shape, const distributed::DeviceMesh& mesh,
                        const Placements& placements);

}  // namespace fsdp::tensor_parallel
