#include "engine/fsdp1/flat_param_layout.h"

#include <algorithm>

#include "engine/core/error.h"
#include "engine/fsdp/shard_layout.h"

namespace fsdp::fsdp1 {

std::vector<std::pair<int64_t, int64_t>> FlatParamLayout::entry_offsets() const {
  std::vector<std::pair<int64_t, int64_t>> out;
  int64_t start = 0;
  for (int64_t numel : numels_with_padding) {
    out.emplace_back(start, start + numel - 1);
    start += numel;
  }
  return out;
}

FlatParamLayout ComputeFlatParamLayout(const std::vector<int64_t>& param_numels,
                                       int64_t aligned_numel, int world_size) {
  FSDP_CHECK(aligned_numel >= 0, "Expects non-negative `aligned_numel` but got ", aligned_numel);
  FSDP_CHECK(world_size >= 1, "FSDP flat parameter: world size must be >= 1, got ", world_size);
  FlatParamLayout layout;
  auto add = [&layout](int64_t numel, bool is_padding) {
    layout.numels_with_padding.push_back(numel);
    layout.is_padding_mask.push_back(is_padding);
    layout.total_numel += numel;
  };
  for (int64_t numel : param_numels) {
    if (aligned_numel > 0) {
      const int64_t numel_to_pad = aligned_numel - (layout.total_numel % aligned_numel);
      if (numel_to_pad > 0 && numel_to_pad < aligned_numel) add(numel_to_pad, true);
    }
    add(numel, false);
  }
  if (aligned_numel > 0) {
    // Divisible by the world size, so that the reduce-scatter input needs no copy.
    const int64_t numel_to_pad = world_size - (layout.total_numel % world_size);
    if (numel_to_pad > 0 && numel_to_pad < world_size) add(numel_to_pad, true);
  }
  return layout;
}

int64_t AlignedNumel(DType dtype) { return 16 / static_cast<int64_t>(ElementSize(dtype)); }

FlatParamShard ComputeFlatParamShard(int64_t total_numel, int rank, int world_size) {
  const fsdp2::ShardInfo info = fsdp2::ComputeShardInfo({total_numel}, rank, world_size);
  FlatParamShard shard;
  shard.padded_numel = info.padded_shard_numel();
  shard.begin = info.row_begin;
  shard.numel = info.sharded_numel();
  shard.numel_padded = shard.padded_numel - shard.numel;
  return shard;
}

std::vector<ShardParamInfo> ComputeShardParamInfos(const FlatParamLayout& layout,
                                                   int64_t unsharded_start_idx,
                                                   int64_t unsharded_end_idx) {
  FSDP_CHECK(unsharded_start_idx >= 0 && unsharded_start_idx <= unsharded_end_idx,
             "unsharded_start_idx: ", unsharded_start_idx,
             " unsharded_end_idx: ", unsharded_end_idx);
  const auto offsets = layout.entry_offsets();
  std::vector<ShardParamInfo> out;
  for (size_t i = 0; i < offsets.size(); ++i) {
    if (layout.is_padding_mask[i]) continue;
    const auto [param_start, param_end] = offsets[i];
    ShardParamInfo info;
    info.in_shard = unsharded_start_idx <= param_end && unsharded_end_idx >= param_start &&
                    param_end >= param_start;
    if (info.in_shard) {
      if (unsharded_start_idx <= param_start) {
        info.intra_param_start_idx = 0;
        info.offset_in_shard = param_start - unsharded_start_idx;
      } else {
        info.intra_param_start_idx = unsharded_start_idx - param_start;
        info.offset_in_shard = 0;
      }
      info.intra_param_end_idx = std::min(param_end, unsharded_end_idx) - param_start;
      info.numel_in_shard = info.intra_param_end_idx - info.intra_param_start_idx + 1;
    }
    out.push_back(info);
  }
  return out;
}

}  // namespace fsdp::fsdp1
