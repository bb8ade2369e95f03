#include "conformance/uneven_world.h"

#include <set>

#include "engine/core/error.h"
#include "reference/sharding.h"

namespace fsdp::conformance {

std::vector<int64_t> ChunkRowsPerRank(int64_t n, int world) {
  const reference::ChunkLayout layout = reference::MakeChunkLayout(n, world);
  std::vector<int64_t> rows;
  for (int r = 0; r < world; ++r) rows.push_back(layout.RowsOnRank(r));
  return rows;
}

std::vector<int64_t> BalancedRowsPerRank(int64_t n, int world) {
  FSDP_CHECK(n >= 0 && world >= 1, "cannot split ", n, " rows over ", world, " ranks");
  std::vector<int64_t> rows;
  for (int r = 0; r < world; ++r) rows.push_back(n / world + (r < n % world ? 1 : 0));
  return rows;
}

bool ChunkDiffersFromBalanced(int64_t n, int world) {
  return ChunkRowsPerRank(n, world) != BalancedRowsPerRank(n, world);
}

int DiscriminatingWorld(const std::vector<int64_t>& dim0_sizes, int max_world) {
  int best_world = 0;
  size_t best_count = 0;
  for (int world = 3; world <= max_world; ++world) {
    size_t count = 0;
    for (int64_t n : dim0_sizes) count += ChunkDiffersFromBalanced(n, world) ? 1 : 0;
    if (count > best_count) {
      best_count = count;
      best_world = world;
    }
  }
  return best_world;
}

std::vector<int64_t> ParameterDim0Sizes(const nn::Module& module) {
  std::vector<int64_t> sizes;
  for (const auto& [fqn, param] : module.named_parameters()) {
    sizes.push_back(param.dim() == 0 ? 1 : param.size(0));
  }
  return sizes;
}

std::vector<int64_t> FlatParameterNumels(const nn::Module& root,
                                         const std::vector<nn::ModulePtr>& units) {
  std::set<const void*> claimed;
  std::vector<int64_t> numels;
  auto claim = [&](const nn::Module& module) {
    int64_t numel = 0;
    for (const auto& [fqn, param] : module.named_parameters()) {
      if (claimed.insert(param.impl()).second) numel += param.numel();
    }
    if (numel > 0) numels.push_back(numel);
  };
  for (const nn::ModulePtr& unit : units) claim(*unit);
  claim(root);
  return numels;
}

}  // namespace fsdp::conformance
