// One rank's part of a pg-bench run: for every selected collective (a CollectiveDescriptor,
// collective_descriptor.h: the sweep itself knows no collective) and every size of the
// sweep, optionally a check pass (the descriptor's exact check data, one collective, wrong
// elements counted by the descriptor and summed over ranks), then `warmup_iters` untimed and
// `iters` timed collectives.
//
// Timing: every rank enters a barrier, then times the `iters` collectives as one batch with
// std::chrono::steady_clock; the row's time is the mean per iteration, and the maximum of it
// over ranks (an all_reduce MAX), so every rank returns the same rows. The timed iterations
// run on zero-filled buffers: an in-place reduction summing check data again and again would
// grow it to inf (or overflow int64), which some kernels handle at a different speed.
//
// Every rank of `pg` must call RunPgBenchSweep with the same options.
// Thread-safety: uses `pg` from the calling rank's thread only (ProcessGroup's rule).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/core/device.h"
#include "engine/distributed/process_group.h"
#include "tools/bench/bus_bandwidth.h"
#include "tools/bench/collective_descriptor.h"
#include "tools/bench/pg_bench_options.h"

namespace fsdp::bench {

struct PgBenchRow {
  const CollectiveDescriptor* collective = nullptr;  // one of AllCollectives()
  CollectiveCounts counts;  // size (bytes) and count of the row
  DType dtype = DType::kFloat32;
  std::optional<distributed::ReduceOp> redop;  // set for reductions
  int root = -1;                        // the collective's root, -1 for none
  double time_us = 0;                   // mean per iteration, max over ranks
  double algbw_gbps = 0;
  double busbw_gbps = 0;
  std::optional<int64_t> wrong;  // summed over ranks; unset without -c 1
};

struct PgBenchSweep {
  std::vector<PgBenchRow> rows;
  // Sizes that could not run (too small to give every rank an element), one line each.
  std::vector<std::string> skipped;
};

// Runs the sweep on this rank; tensors are allocated on `device`.
PgBenchSweep RunPgBenchSweep(distributed::ProcessGroup& pg, const PgBenchOptions& options,
                             Device device = Device::CPU());

}  // namespace fsdp::bench
