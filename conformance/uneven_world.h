// Worlds that tell sharding rules apart. FSDP shards dim 0 as torch.chunk does (chunks of
// c = ceil(n / W) rows, the last ranks short or empty); a common wrong rule is the balanced
// split (the first n % W ranks get one row more than the others). At many worlds and shapes the
// two give the same rows (every world that divides n; every n below W; n % W == W - 1), so a
// suite that runs only there cannot catch the wrong rule. Scenarios use DiscriminatingWorld to
// pick a default world where the rules differ for their own shapes
// (ScenarioInfo::extra_default_worlds). Stateless; thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/nn/module.h"

namespace fsdp::conformance {

// Rows per rank of n rows over `world` ranks under torch.chunk (reference::ChunkLayout) and
// under the balanced split.
std::vector<int64_t> ChunkRowsPerRank(int64_t n, int world);
std::vector<int64_t> BalancedRowsPerRank(int64_t n, int world);
// True when the two splits of n rows over `world` ranks differ (exactly when n >= world and
// n % world is neither 0 nor world - 1).
bool ChunkDiffersFromBalanced(int64_t n, int world);

// The world in [3, max_world] at which the two splits differ for the most of `dim0_sizes`
// (ties: the smallest world); 0 when they differ for none at any world. World 2 never tells
// them apart.
int DiscriminatingWorld(const std::vector<int64_t>& dim0_sizes, int max_world);

// What FSDP shards, for DiscriminatingWorld: dim 0 of every parameter of `module` (FSDP2), and
// the numel of the flat parameter FSDP1 builds for each of `units` (its parameters not claimed
// by an earlier unit), then for `root` (the rest).
std::vector<int64_t> ParameterDim0Sizes(const nn::Module& module);
std::vector<int64_t> FlatParameterNumels(const nn::Module& root,
                                         const std::vector<nn::ModulePtr>& units);

}  // namespace fsdp::conformance
