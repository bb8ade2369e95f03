// pg-bench's output: a header with the machine facts and the memcpy yardstick, one
// nccl-tests-style table per collective (plus its average bus bandwidth), and the same as
// JSON. The column set is in docs/pg_bench.md.
// Thread-safety: stateless functions.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tools/bench/memcpy_bandwidth.h"
#include "tools/bench/pg_bench_options.h"
#include "tools/bench/pg_bench_sweep.h"
#include "tools/bench/table.h"

namespace fsdp::bench {

// What the run measured on: backend, ranks and the host.
struct PgBenchFacts {
  std::string backend;  // "threaded", "gloo", ...
  int world = 1;        // ranks
  int processes = 1;    // processes the ranks run in (1 for threaded)
  int nproc = 1;        // the host's hardware threads (std::thread::hardware_concurrency)
  std::string hostname;
  // 1-minute load average of the host when the run started (/proc/loadavg); negative when
  // unknown. Other work on the host skews every figure; the report says how busy it was.
  double load_average = -1;
  MemcpyBandwidth memcpy;  // measured on rank 0's host, one thread
  // Measured on rank 0's host with one thread per hardware thread: the limit of a process
  // whose ranks are threads (the threaded backend).
  MemcpyBandwidth memcpy_all_cores;
};

// The host's 1-minute load average from /proc/loadavg; -1 when it cannot be read.
double ReadLoadAverage();

// The rows of `collective` from `rows` as a table (columns: size, count, type, redop, root,
// time, algbw, busbw, #wrong, busbw/memcpy, proc-busbw/memcpyN). busbw/memcpy divides by the
// one-thread memcpy figure; proc-busbw/memcpyN divides the process's bus bytes per second
// (busbw × the ranks each process holds, `ranks_per_process`) by the all-core memcpy figure:
// the fraction of the host's copy bandwidth a process of thread ranks reaches.
Table PgBenchTable(const std::vector<PgBenchRow>& rows, const CollectiveDescriptor& collective,
                   double memcpy_gbps, double memcpy_all_cores_gbps = 0,
                   int ranks_per_process = 1);
// Mean busbw of the rows of `collective` (nccl-tests' "Avg bus bandwidth"); 0 when none.
double AverageBusBandwidth(const std::vector<PgBenchRow>& rows,
                           const CollectiveDescriptor& collective);
// Total #wrong over every row (0 without -c 1).
int64_t TotalWrong(const std::vector<PgBenchRow>& rows);

// The text report (header, per-collective tables, skipped sizes, summary line).
std::string PgBenchText(const PgBenchFacts& facts, const PgBenchOptions& options,
                        const PgBenchSweep& sweep);
// {"tool", "backend", "world", "processes", "nproc", "hostname", "load_average", "memcpy": {...},
//  "options": {...}, "results": [{"collective", "avg_busbw_gbps", "rows": [...]}],
//  "skipped": [...], "wrong": N}
nlohmann::json PgBenchJson(const PgBenchFacts& facts, const PgBenchOptions& options,
                           const PgBenchSweep& sweep);

}  // namespace fsdp::bench
