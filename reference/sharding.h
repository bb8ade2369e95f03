// The oracle's own torch.chunk sharding arithmetic (docs/fsdp-behaviour.md, "Dim-0 sharding",
// which also covers FSDP1's flat-parameter shard), written
// independently of engine/: which rows of a parameter (or gradient) each rank of an FSDP group
// must hold.
//
// For dim-0 size d0 over W ranks: chunk height c = ceil(d0 / W); rank r owns rows
// [min(r·c, d0), min((r+1)·c, d0)). Trailing ranks can be EMPTY even when d0 >= W (6 rows over
// 4 ranks: 2, 2, 2, 0). The unpadded shard keeps the other dims ([0, *rest] when empty); the padded
// shard is always [c, *rest], zero-filled below the owned rows. FSDP1's flat parameter uses the
// same rule on the 1-d concatenation of a module's flattened parameters. FSDP2's
// shard_placement_fn may shard a parameter on another dim d (Shard(d)): the same rule along d
// (ShardOf's `dim`; FSDP2 requires size(d) % W == 0 there, so every piece is full).
//
// Thread-safety: pure functions. Ownership: values.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "reference/tensor.h"

namespace fsdp::reference {

// The dim-0 layout of one tensor over a group.
struct ChunkLayout {
  int64_t dim0 = 0;        // rows of the full tensor
  int world_size = 1;      // W
  int64_t chunk_rows = 0;  // c = ceil(dim0 / W): rows of every padded shard

  // Rows rank r owns (0 for trailing ranks past the last chunk).
  int64_t RowsOnRank(int rank) const;
  // First row rank r owns (dim0 for an empty shard).
  int64_t RowOffset(int rank) const;
  // c * W.
  int64_t PaddedDim0() const { return chunk_rows * world_size; }
  // How many ranks own at least one row (torch.chunk's chunk count).
  int NonEmptyShards() const;
};

// Throws std::invalid_argument for dim0 < 0 or world_size <= 0.
ChunkLayout MakeChunkLayout(int64_t dim0, int world_size);

// Rank r's rows of `full` along dim 0 (shape [rows_r, *rest]), or with `dim` its
// torch.chunk(full, W, dim)[r] piece (the other dims kept). Throws for a 0-d tensor (FSDP
// rejects scalar parameters), a dim outside the tensor or a bad rank.
template <typename T>
BasicRefTensor<T> ShardOf(const BasicRefTensor<T>& full, int rank, int world_size,
                          int64_t dim = 0);

// The shard dim of each tensor by name (FSDP2's shard_placement_fn); an absent name is dim 0.
using ShardDims = std::map<std::string, int64_t>;

// Rank r's padded shard: [c, *rest], its rows on top, zeros below.
template <typename T>
BasicRefTensor<T> PaddedShardOf(const BasicRefTensor<T>& full, int rank, int world_size);

// ShardOf / PaddedShardOf for every tensor of a map (parameters, or gradients: absent gradients
// stay absent) on one rank.
template <typename T>
TensorMap<T> ShardsOf(const TensorMap<T>& full, int rank, int world_size,
                      const ShardDims& dims = {});
template <typename T>
TensorMap<T> PaddedShardsOf(const TensorMap<T>& full, int rank, int world_size);

// ShardsOf / PaddedShardsOf for ranks 0..W-1.
template <typename T>
std::vector<TensorMap<T>> ShardsOnAllRanks(const TensorMap<T>& full, int world_size,
                                           const ShardDims& dims = {});
template <typename T>
std::vector<TensorMap<T>> PaddedShardsOnAllRanks(const TensorMap<T>& full, int world_size);

// The inverse of ShardsOnAllRanks: per-rank unpadded shards concatenated along dim 0.
template <typename T>
TensorMap<T> UnshardFromShards(const std::vector<TensorMap<T>>& shards);

// FSDP1 flat parameter: the tensors named by `order` (in that order) flattened and concatenated,
// chunked over W ranks with the rule above. Rank r's unpadded 1-d shard; `padded` appends zeros
// to the chunk size c (FSDP1's _shard_numel_padded). Throws on a missing name.
template <typename T>
BasicRefTensor<T> FlatShardOf(const TensorMap<T>& full, const std::vector<std::string>& order,
                              int rank, int world_size, bool padded = false);

}  // namespace fsdp::reference
