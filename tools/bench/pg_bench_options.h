// pg-bench's command line (nccl-tests' flags where they exist; docs/pg_bench.md):
//
//   pg-bench [-b MIN] [-e MAX] [-f FACTOR | -i STEP] [-n ITERS] [-w WARMUP] [-c 0|1]
//            [-d DTYPE] [-o COLLECTIVE|all] [-r REDOP] [--backend threaded|gloo|nccl]
//            [--world N] [--json PATH|-]
//
// Unlike nccl-tests, where each collective is its own binary and -o picks the reduce op,
// pg-bench runs any collective: -o picks it and -r the reduce op.
// Thread-safety: value types and stateless functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/core/dtype.h"
#include "engine/distributed/reduce_op.h"
#include "tools/bench/bus_bandwidth.h"
#include "tools/bench/collectives/registry.h"

namespace fsdp::bench {

struct PgBenchOptions {
  int64_t min_bytes = int64_t{32} << 20;  // -b. Default: 32M (nccl-tests' default)
  int64_t max_bytes = int64_t{32} << 20;  // -e. Default: 32M
  int64_t step_bytes = int64_t{1} << 20;  // -i, used when factor <= 1. Default: 1M
  int64_t factor = 1;                     // -f. Default: 1 (step by -i)
  int iters = 20;                         // -n. Default: 20
  int warmup_iters = 5;                   // -w. Default: 5
  bool check = true;                      // -c. Default: 1
  DType dtype = DType::kFloat32;          // -d. Default: float
  // -o. Default: all (every registered collective, collectives/registry.h).
  std::vector<const CollectiveDescriptor*> collectives = AllCollectives();
  distributed::ReduceOp redop = distributed::ReduceOp::kSum;  // -r. Default: sum
  // --backend: a backend of fakes::DefaultBackends(). Default: threaded
  std::string backend = "threaded";
  // --world: ranks (threaded: threads; gloo: processes to start when not launched by a
  // launcher, and a consistency check when launched). Default: none (2 when pg-bench starts
  // the ranks itself; the launcher's WORLD_SIZE otherwise).
  std::optional<int> world;
  std::string json_path;  // --json PATH or "-" (stdout). Default: "" (no JSON)
};

std::string PgBenchUsage();

// Parses the arguments after the program name. Throws InvalidArgument naming the flag on an
// unknown flag, a missing or malformed value, or an unsupported dtype/reduce-op combination.
// `*help` is set on -h/--help (nothing else is checked then).
PgBenchOptions ParsePgBenchArgs(const std::vector<std::string>& args, bool* help = nullptr);

}  // namespace fsdp::bench
