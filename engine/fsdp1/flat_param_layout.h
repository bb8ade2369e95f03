// Pure arithmetic of FSDP1's flat parameter (PyTorch's _flat_param.py; docs/fsdp1.md, "Flat
// parameter layout"):
//
//  * the unsharded flat parameter is the concatenation of its original parameters, flattened,
//    in flattening order; with use_orig_params, alignment padding is inserted before a
//    parameter whose start is not a multiple of `aligned_numel` (16 bytes of the forward dtype)
//    and a last padding entry makes the total a multiple of the world size;
//  * each rank's shard is its torch.chunk chunk of that 1-D tensor (chunk size ceil(N / W);
//    trailing ranks may get less or nothing), zero-padded at the end to the chunk size
//    (`_get_shard`, `_shard_numel_padded`);
//  * which part of each original parameter a rank's shard holds (`_ShardParamInfo`).
// No tensors, no state: every function is a value computation. Thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/core/dtype.h"

namespace fsdp::fsdp1 {

// The entries of an unsharded flat parameter: original parameters and padding.
struct FlatParamLayout {
  std::vector<int64_t> numels_with_padding;  // per entry (`_numels_with_padding`)
  std::vector<bool> is_padding_mask;         // per entry (`_is_padding_mask`)
  int64_t total_numel = 0;                   // the unpadded unsharded numel (padding entries in)

  // [start, end] (end inclusive) of every entry in the flat parameter
  // (`_get_flat_param_offsets`).
  std::vector<std::pair<int64_t, int64_t>> entry_offsets() const;
};

// `_init_flat_param_and_metadata`'s layout for parameters of `param_numels` (flattening
// order). `aligned_numel` 0 means no alignment (use_orig_params=False).
FlatParamLayout ComputeFlatParamLayout(const std::vector<int64_t>& param_numels,
                                       int64_t aligned_numel, int world_size);

// `_get_aligned_numel`: elements of `dtype` in 16 bytes.
int64_t AlignedNumel(DType dtype);

// One rank's shard of a flat parameter of `total_numel` elements (`_get_shard`).
struct FlatParamShard {
  int64_t padded_numel = 0;    // chunk size ceil(N / W): every rank's shard numel
  int64_t begin = 0;           // first element of the flat parameter owned by this rank
  int64_t numel = 0;           // elements owned (0 for a rank past the last chunk)
  int64_t numel_padded = 0;    // padded_numel - numel (`_shard_numel_padded`)
  // The interval [start, end] of the padded unsharded flat parameter this rank's shard covers
  // (what `shard()` passes to `_init_shard_metadata`).
  int64_t unsharded_start_idx(int rank) const { return padded_numel * rank; }
  int64_t unsharded_end_idx(int rank) const { return padded_numel * (rank + 1) - 1; }
};

FlatParamShard ComputeFlatParamShard(int64_t total_numel, int rank, int world_size);

// The part of one original parameter held by a rank's shard (`_ShardParamInfo`).
struct ShardParamInfo {
  bool in_shard = false;
  int64_t offset_in_shard = 0;        // where it starts in the sharded flat parameter
  int64_t numel_in_shard = 0;
  int64_t intra_param_start_idx = 0;  // first element of the parameter in the shard
  int64_t intra_param_end_idx = 0;    // last element (inclusive)
};

// `_get_shard_metadata`: one entry per original parameter (padding entries skipped) for the
// shard covering [unsharded_start_idx, unsharded_end_idx] (inclusive).
std::vector<ShardParamInfo> ComputeShardParamInfos(const FlatParamLayout& layout,
                                                   int64_t unsharded_start_idx,
                                                   int64_t unsharded_end_idx);

}  // namespace fsdp::fsdp1
