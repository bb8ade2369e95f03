#include "engine/tensor_parallel/placement.h"

#include <sstream>

#include "engine/core/error.h"

namespace fsdp::tensor_parallel {

using distributed::ReduceOp;

Placement Placement::Shard(int64_t dim) { return Placement(Kind::kShard, dim, ReduceOp::kSum); }
Placement Placement::Replicate() { return Placement(Kind::kReplicate, 0, ReduceOp::kSum); }
Placement Placement::Partial(ReduceOp reduce_op) {
  FSDP_CHECK(reduce_op == ReduceOp::kSum || reduce_op == ReduceOp::kAvg, "Partial(",
             distributed::ReduceOpName(reduce_op),
             "): only Partial(sum) and Partial(avg) are supported");
  return Placement(Kind::kPartial, 0, reduce_op);
}

Placement Placement::normalized(int64_t ndim) const {
  if (!is_shard()) return *this;
  FSDP_CHECK(dim_ >= -ndim && dim_ < ndim, str(), " is invalid for a tensor of ", ndim,
             " dims: the shard dim must be in [", -ndim, ", ", ndim, ")");
  return Shard(dim_ < 0 ? dim_ + ndim : dim_);
}

std::string Placement::str() const {
  switch (kind_) {
    case Kind::kShard:
      return "Shard(dim=" + std::to_string(dim_) + ")";
    case Kind::kReplicate:
      return "Replicate()";
    case Kind::kPartial:
      return std::string("Partial(") + (reduce_op_ == ReduceOp::kAvg ? "avg" : "sum") + ")";
  }
  return "?";
}

bool Placement::operator==(const Placement& other) const {
  if (kind_ != other.kind_) return false;
  if (is_shard()) return dim_ == other.dim_;
  if (is_partial()) return reduce_op_ == other.reduce_op_;
  return true;
}

std::string PlacementsStr(const Placements& placements) {
  std::ostringstream out;
  out << "(";
  for (size_t i = 0; i < placements.size(); ++i) out << (i ? ", " : "") << placements[i].str();
  out << ")";
  return out.str();
}

ChunkRange ComputeChunkRange(int64_t size, int64_t num_chunks, int64_t index) {
  FSDP_INTERNAL_ASSERT(num_chunks > 0 && index >= 0 && index < num_chunks);
  ChunkRange range;
  range.chunk = (size + num_chunks - 1) / num_chunks;
  range.offset = std::min(index * range.chunk, size);
  range.length = std::min((index + 1) * range.chunk, size) - range.offset;
  return range;
}

Placements NormalizePlacements(const Placements& placements, const distributed::DeviceMesh& mesh,
                               int64_t ndim, const std::string& what) {
  FSDP_CHECK(static_cast<int>(placements.size()) == mesh.ndim(), what, ": ", placements.size(),
             " placements ", PlacementsStr(placements), " for a ", mesh.ndim(), "-D mesh ",
             mesh.str(), " (one placement per mesh dim)");
  Placements out;
  for (size_t i = 0; i < placements.size(); ++i) {
    const Placement& p = placements[i];
    FSDP_CHECK(!p.is_shard() || (p.dim() >= -ndim && p.dim() < ndim), what, ": ", p.str(),
               " on mesh dim ", i, " is invalid for a tensor of ", ndim, " dims");
    out.push_back(p.normalized(ndim));
    for (size_t j = 0; j < i; ++j) {
      FSDP_CHECK(!(out[j].is_shard() && out[j] == out.back()), what, ": tensor dim ", out[j].dim(),
                 " is sharded over mesh dims ", j, " and ", i, " ", PlacementsStr(placements),
                 "; sharding one tensor dim over several mesh dims is not implemented");
    }
  }
  return out;
}

Shape ComputeLocalShape(const Shape& global_shape, const distributed::DeviceMesh& mesh,
                        const Placements& placements) {
  Shape local = global_shape;
  for (int i = 0; i < mesh.ndim(); ++i) {
    const Placement& p = placements.at(static_cast<size_t>(i));
    if (!p.is_shard()) continue;
    const int64_t d = p.normalized(static_cast<int64_t>(global_shape.size())).dim();
    local[static_cast<size_t>(d)] = ComputeChunkRange(global_shape[static_cast<size_t>(d)],
                                                      mesh.size(i), mesh.get_local_rank(i))
                                        .length;
  }
  return local;
}

}  // namespace fsdp::tensor_parallel
