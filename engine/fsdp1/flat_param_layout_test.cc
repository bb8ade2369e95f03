// The arithmetic of FSDP1's flat parameter (flat_param_layout.h): alignment padding,
// torch.chunk shards of the 1-D flat parameter, and which part of each original parameter a
// shard holds. Expected values come from element-by-element walks of the same rules.
#include "engine/fsdp1/flat_param_layout.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace fsdp::fsdp1 {
namespace {

// torch.chunk(N elements, W): chunk size ceil(N / W); chunk r starts at r * size.
std::pair<int64_t, int64_t> TorchChunk(int64_t total, int rank, int world) {
  int64_t size = 0;
  while (size * world < total) ++size;  // ceil without division
  const int64_t begin = std::min(total, size * rank);
  const int64_t end = std::min(total, size * (rank + 1));
  return {begin, end - begin};
}

TEST(Fsdp1FlatParamLayout, UnalignedLayoutIsTheConcatenation) {
  const std::vector<int64_t> numels = {6, 3, 17};
  const FlatParamLayout layout = ComputeFlatParamLayout(numels, /*aligned_numel=*/0, 4);
  EXPECT_EQ(layout.numels_with_padding, numels);
  EXPECT_EQ(layout.is_padding_mask, std::vector<bool>(numels.size(), false));
  int64_t total = 0;
  for (int64_t n : numels) total += n;
  EXPECT_EQ(layout.total_numel, total);
}

TEST(Fsdp1FlatParamLayout, AlignedLayoutPadsEachParameterStartAndTheWorldSize) {
  for (int world : {1, 2, 3, 4, 8}) {
    for (int64_t aligned : {int64_t{2}, int64_t{4}, int64_t{8}}) {
      const std::vector<int64_t> numels = {5, 3, 6, 1, 8};
      const FlatParamLayout layout = ComputeFlatParamLayout(numels, aligned, world);
      // Walk the entries: every parameter starts at a multiple of `aligned`, padding entries
      // are shorter than `aligned` (or, last, than the world size) and the total divides W.
      int64_t offset = 0;
      size_t param = 0;
      for (size_t i = 0; i < layout.numels_with_padding.size(); ++i) {
        const int64_t n = layout.numels_with_padding[i];
        if (layout.is_padding_mask[i]) {
          EXPECT_GT(n, 0);
          EXPECT_LT(n, i + 1 == layout.numels_with_padding.size() ? std::max<int64_t>(aligned, world)
                                                                  : aligned);
        } else {
          EXPECT_EQ(offset % aligned, 0) << "parameter " << param << " world " << world;
          EXPECT_EQ(n, numels.at(param++));
        }
        offset += n;
      }
      EXPECT_EQ(param, numels.size());
      EXPECT_EQ(offset, layout.total_numel);
      EXPECT_EQ(layout.total_numel % world, 0);
      // Minimal: removing any padding breaks alignment (each pad is the smallest that works).
      int64_t minimal = 0;
      for (int64_t n : numels) minimal = (minimal + aligned - 1) / aligned * aligned + n;
      minimal = (minimal + world - 1) / world * world;
      EXPECT_EQ(layout.total_numel, minimal) << "aligned " << aligned << " world " << world;
    }
  }
}

TEST(Fsdp1FlatParamLayout, AlignedNumelIsSixteenBytes) {
  for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    EXPECT_EQ(AlignedNumel(dtype) * static_cast<int64_t>(ElementSize(dtype)), 16);
  }
}

TEST(Fsdp1FlatParamLayout, ShardsFollowTorchChunkWithEndPadding) {
  for (int64_t total : {1, 5, 6, 7, 9, 16, 17, 455}) {
    for (int world : {1, 2, 3, 4, 8}) {
      int64_t covered = 0;
      for (int rank = 0; rank < world; ++rank) {
        const FlatParamShard shard = ComputeFlatParamShard(total, rank, world);
        const auto [begin, numel] = TorchChunk(total, rank, world);
        EXPECT_EQ(shard.begin, begin) << total << " over " << world << " rank " << rank;
        EXPECT_EQ(shard.numel, numel) << total << " over " << world << " rank " << rank;
        EXPECT_EQ(shard.padded_numel, TorchChunk(total, 0, world).second);
        EXPECT_EQ(shard.numel + shard.numel_padded, shard.padded_numel);
        EXPECT_EQ(shard.unsharded_start_idx(rank), shard.padded_numel * rank);
        covered += shard.numel;
      }
      EXPECT_EQ(covered, total);
    }
  }
}

TEST(Fsdp1FlatParamLayout, ShardParamInfosMatchAnElementWalk) {
  const std::vector<int64_t> numels = {5, 3, 6, 1, 8};
  for (int64_t aligned : {int64_t{0}, int64_t{4}}) {
    const FlatParamLayout layout = ComputeFlatParamLayout(numels, aligned, 4);
    const auto offsets = layout.entry_offsets();
    for (int world : {2, 3, 4}) {
      for (int rank = 0; rank < world; ++rank) {
        const FlatParamShard shard = ComputeFlatParamShard(layout.total_numel, rank, world);
        const int64_t start = shard.unsharded_start_idx(rank);
        const int64_t end = shard.unsharded_end_idx(rank);
        const std::vector<ShardParamInfo> infos = ComputeShardParamInfos(layout, start, end);
        ASSERT_EQ(infos.size(), numels.size());
        size_t param = 0;
        for (size_t entry = 0; entry < offsets.size(); ++entry) {
          if (layout.is_padding_mask[entry]) continue;
          const ShardParamInfo& info = infos[param++];
          // Walk the parameter's elements and collect those in [start, end].
          int64_t first = -1;
          int64_t last = -1;
          for (int64_t e = offsets[entry].first; e <= offsets[entry].second; ++e) {
            if (e < start || e > end) continue;
            if (first < 0) first = e;
            last = e;
          }
          EXPECT_EQ(info.in_shard, first >= 0) << "entry " << entry << " rank " << rank;
          if (first < 0) continue;
          EXPECT_EQ(info.offset_in_shard, first - start);
          EXPECT_EQ(info.intra_param_start_idx, first - offsets[entry].first);
          EXPECT_EQ(info.intra_param_end_idx, last - offsets[entry].first);
          EXPECT_EQ(info.numel_in_shard, last - first + 1);
        }
      }
    }
  }
}

}  // namespace
}  // namespace fsdp::fsdp1
