#include "reference/sharding.h"

#include <algorithm>
#include <stdexcept>

namespace fsdp::reference {
namespace {

void CheckRank(int rank, int world_size) {
  if (rank < 0 || rank >= world_size) {
    throw std::invalid_argument("rank " + std::to_string(rank) + " outside a group of " +
                                std::to_string(world_size));
  }
}

}  // namespace

int64_t ChunkLayout::RowOffset(int rank) const {
  return std::min<int64_t>(static_cast<int64_t>(rank) * chunk_rows, dim0);
}

int64_t ChunkLayout::RowsOnRank(int rank) const {
  const int64_t end = std::min<int64_t>((static_cast<int64_t>(rank) + 1) * chunk_rows, dim0);
  return end - RowOffset(rank);
}

int ChunkLayout::NonEmptyShards() const {
  int n = 0;
  for (int r = 0; r < world_size; ++r) n += RowsOnRank(r) > 0 ? 1 : 0;
  return n;
}

ChunkLayout MakeChunkLayout(int64_t dim0, int world_size) {
  if (dim0 < 0) throw std::invalid_argument("MakeChunkLayout: negative dim0");
  if (world_size <= 0) throw std::invalid_argument("MakeChunkLayout: world_size must be positive");
  ChunkLayout l;
  l.dim0 = dim0;
  l.world_size = world_size;
  l.chunk_rows = (dim0 + world_size - 1) / world_size;  // ceil(dim0 / W)
  return l;
}

template <typename T>
BasicRefTensor<T> ShardOf(const BasicRefTensor<T>& full, int rank, int world_size, int64_t dim) {
  if (full.ndim() == 0) throw std::invalid_argument("ShardOf: FSDP does not shard 0-d tensors");
  if (dim < 0 || dim >= full.ndim()) {
    throw std::invalid_argument("ShardOf: dim " + std::to_string(dim) + " outside a " +
                                std::to_string(full.ndim()) + "-d tensor");
  }
  const ChunkLayout l = MakeChunkLayout(full.shape[static_cast<size_t>(dim)], world_size);
  CheckRank(rank, world_size);
  const int64_t begin = l.RowOffset(rank);
  const int64_t rows = l.RowsOnRank(rank);
  if (dim == 0) return SliceRows(full, begin, begin + rows);
  // Row-major: `outer` blocks of [size(dim), inner]; keep [begin, begin + rows) of each.
  int64_t outer = 1;
  int64_t inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= full.shape[static_cast<size_t>(d)];
  for (int64_t d = dim + 1; d < full.ndim(); ++d) inner *= full.shape[static_cast<size_t>(d)];
  Shape shape = full.shape;
  shape[static_cast<size_t>(dim)] = rows;
  BasicRefTensor<T> out(shape);
  const int64_t size = full.shape[static_cast<size_t>(dim)];
  for (int64_t o = 0; o < outer; ++o) {
    std::copy_n(full.data.begin() + (o * size + begin) * inner, rows * inner,
                out.data.begin() + o * rows * inner);
  }
  return out;
}

template <typename T>
BasicRefTensor<T> PaddedShardOf(const BasicRefTensor<T>& full, int rank, int world_size) {
  const BasicRefTensor<T> shard = ShardOf(full, rank, world_size);
  Shape shape = full.shape;
  shape[0] = MakeChunkLayout(full.shape[0], world_size).chunk_rows;
  BasicRefTensor<T> padded(shape);  // zeros
  std::copy(shard.data.begin(), shard.data.end(), padded.data.begin());
  return padded;
}

template <typename T>
TensorMap<T> ShardsOf(const TensorMap<T>& full, int rank, int world_size, const ShardDims& dims) {
  TensorMap<T> out;
  for (const auto& [name, t] : full) {
    const auto dim = dims.find(name);
    out.emplace(name, ShardOf(t, rank, world_size, dim == dims.end() ? 0 : dim->second));
  }
  return out;
}

template <typename T>
TensorMap<T> PaddedShardsOf(const TensorMap<T>& full, int rank, int world_size) {
  TensorMap<T> out;
  for (const auto& [name, t] : full) out.emplace(name, PaddedShardOf(t, rank, world_size));
  return out;
}

template <typename T>
std::vector<TensorMap<T>> ShardsOnAllRanks(const TensorMap<T>& full, int world_size,
                                           const ShardDims& dims) {
  std::vector<TensorMap<T>> out;
  for (int r = 0; r < world_size; ++r) out.push_back(ShardsOf(full, r, world_size, dims));
  return out;
}

template <typename T>
std::vector<TensorMap<T>> PaddedShardsOnAllRanks(const TensorMap<T>& full, int world_size) {
  std::vector<TensorMap<T>> out;
  for (int r = 0; r < world_size; ++r) out.push_back(PaddedShardsOf(full, r, world_size));
  return out;
}

template <typename T>
TensorMap<T> UnshardFromShards(const std::vector<TensorMap<T>>& shards) {
  if (shards.empty()) throw std::invalid_argument("UnshardFromShards: no ranks");
  TensorMap<T> out;
  for (const auto& [name, t0] : shards[0]) {
    std::vector<BasicRefTensor<T>> parts;
    for (const TensorMap<T>& rank_map : shards) {
      auto it = rank_map.find(name);
      if (it == rank_map.end()) {
        throw std::invalid_argument("UnshardFromShards: '" + name + "' missing on a rank");
      }
      parts.push_back(it->second);
    }
    out.emplace(name, ConcatRows(parts));
  }
  return out;
}

template <typename T>
BasicRefTensor<T> FlatShardOf(const TensorMap<T>& full, const std::vector<std::string>& order,
                              int rank, int world_size, bool padded) {
  std::vector<T> flat;
  for (const std::string& name : order) {
    auto it = full.find(name);
    if (it == full.end()) throw std::invalid_argument("FlatShardOf: no tensor '" + name + "'");
    flat.insert(flat.end(), it->second.data.begin(), it->second.data.end());
  }
  const int64_t numel = static_cast<int64_t>(flat.size());
  const BasicRefTensor<T> flat_t({numel}, std::move(flat));
  return padded ? PaddedShardOf(flat_t, rank, world_size) : ShardOf(flat_t, rank, world_size);
}

#define FSDP_REFERENCE_INSTANTIATE(T)                                                             \
  template BasicRefTensor<T> ShardOf<T>(const BasicRefTensor<T>&, int, int, int64_t);             \
  template BasicRefTensor<T> PaddedShardOf<T>(const BasicRefTensor<T>&, int, int);                \
  template TensorMap<T> ShardsOf<T>(const TensorMap<T>&, int, int, const ShardDims&);             \
  template TensorMap<T> PaddedShardsOf<T>(const TensorMap<T>&, int, int);                         \
  template std::vector<TensorMap<T>> ShardsOnAllRanks<T>(const TensorMap<T>&, int,                \
                                                         const ShardDims&);                      \
  template std::vector<TensorMap<T>> PaddedShardsOnAllRanks<T>(const TensorMap<T>&, int);         \
  template TensorMap<T> UnshardFromShards<T>(const std::vector<TensorMap<T>>&);                   \
  template BasicRefTensor<T> FlatShardOf<T>(const TensorMap<T>&, const std::vector<std::string>&, \
                                            int, int, bool);

FSDP_REFERENCE_INSTANTIATE(float)
FSDP_REFERENCE_INSTANTIATE(double)
#undef FSDP_REFERENCE_INSTANTIATE

}  // namespace fsdp::reference
