// AllGatherDoubles: every rank's vector of doubles on every rank, over a process group (one
// all_gather_into_tensor of float64), for fsdp-bench's process backends, whose ranks report
// their timings to rank 0 this way.
// Ownership: values. Thread-safety: a collective; called by every rank of `pg`, each with a
// vector of the same length.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/core/tensor.h"
#include "engine/distributed/process_group.h"

namespace fsdp::bench {

// result[r] is rank r's `mine`.
inline std::vector<std::vector<double>> AllGatherDoubles(distributed::ProcessGroup& pg,
                                                         const std::vector<double>& mine) {
  const int64_t n = static_cast<int64_t>(mine.size());
  const Tensor input = Tensor::from_doubles(mine, {n}, DType::kFloat64);
  const Tensor output = Tensor::empty({n * pg.size()}, DType::kFloat64);
  pg.all_gather_into_tensor(output, input)->wait();
  const std::vector<double> flat = output.to_doubles();
  std::vector<std::vector<double>> all;
  for (int r = 0; r < pg.size(); ++r) {
    all.emplace_back(flat.begin() + r * n, flat.begin() + (r + 1) * n);
  }
  return all;
}

}  // namespace fsdp::bench
