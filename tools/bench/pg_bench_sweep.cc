#include "tools/bench/pg_bench_sweep.h"

#include <chrono>

#include "engine/core/error.h"
#include "tools/bench/byte_size.h"

namespace fsdp::bench {

namespace {

using Clock = std::chrono::steady_clock;

// Host copy for filling/verifying device tensors (a no-op view on the CPU).
Tensor OnHost(const Tensor& t) { return t.device().is_cpu() ? t : t.to(Device::CPU()); }

}  // namespace

PgBenchSweep RunPgBenchSweep(distributed::ProcessGroup& pg, const PgBenchOptions& options, Device device) {
  const int world = pg.size();
  const int rank = pg.rank();
  PgBenchSweep sweep;
  const auto sizes =
      SizeSweep(options.min_bytes, options.max_bytes, options.factor, options.step_bytes);
  for (const CollectiveDescriptor* collective : options.collectives) {
    const CollectiveDescriptor& op = *collective;
    for (int64_t requested : sizes) {
      const CollectiveCounts counts = ComputeCounts(op, requested, options.dtype, world);
      if (counts.per_rank_numel == 0) {
        sweep.skipped.push_back(std::string(op.name) + " " + FormatByteSize(requested) +
                                ": too small for " + std::to_string(world) + " ranks of " +
                                NcclTypeName(options.dtype) + " (skipped)");
        continue;
      }
      CollectiveBuffers buffers = AllocateBuffers(op, counts, options.dtype, device);
      PgBenchRow row;
      row.collective = &op;
      row.counts = counts;
      row.dtype = options.dtype;
      if (op.reduces) row.redop = options.redop;
      row.root = op.root;

      if (options.check) {
        Tensor host_in = OnHost(buffers.input);
        FillCheckInput(op, host_in, counts, rank, world);
        if (!host_in.is_same(buffers.input)) buffers.input.copy_(host_in);
        RunCollective(op, pg, buffers, options.redop);
        const int64_t wrong =
            CountWrongElements(op, options.redop, OnHost(buffers.output), counts, rank, world);
        Tensor total = Tensor::full({1}, static_cast<double>(wrong), DType::kInt64, device);
        pg.all_reduce(total, distributed::Sum())->wait();
        row.wrong = static_cast<int64_t>(OnHost(total).item());
        buffers.input.zero_();
        if (!buffers.output.is_same(buffers.input)) buffers.output.zero_();
      }

      for (int i = 0; i < options.warmup_iters; ++i) RunCollective(op, pg, buffers, options.redop);
      pg.barrier();
      const auto t0 = Clock::now();
      for (int i = 0; i < options.iters; ++i) RunCollective(op, pg, buffers, options.redop);
      const auto t1 = Clock::now();
      const double mean_us =
          std::chrono::duration<double, std::micro>(t1 - t0).count() / options.iters;
      Tensor slowest = Tensor::full({1}, mean_us, DType::kFloat64, device);
      pg.all_reduce(slowest, distributed::Max())->wait();
      row.time_us = OnHost(slowest).item();
      row.algbw_gbps = AlgBandwidthGBps(counts.bytes, row.time_us * 1e-6);
      row.busbw_gbps = row.algbw_gbps * BusBandwidthFactor(op, world);
      sweep.rows.push_back(row);
    }
  }
  return sweep;
}

}  // namespace fsdp::bench
