// fsdp-bench: FSDP peak-memory and step-time benchmark of the threaded engine (docs/benchmarks.md).
//
// For a seed model (the Transformer of ModelArgs, or MLPStack) fully sharded per block + root
// (as parity/fsdp does it) on W thread ranks of one process, for every W of --worlds:
//
//   Table 1 (memory, per rank): the peak parameter + gradient bytes of one training step
//     (forward, backward, optimizer step, zero_grad), measured from the FSDP state at every
//     FSDP event and gradient hook (tools/fsdp_bench/param_grad_meter.h), against the closed-form
//     bound sharded bytes + the two largest unsharded groups; plus the allocator's peak of
//     everything the rank allocated during that step, for context. A row over the bound is
//     printed as WARN and makes the exit status 1.
//   Table 2 (step time): the median wall time of the engine's step at world W (the same global
//     batch split across ranks; the slowest rank's time per step) against the oracle's step
//     (reference/, double precision, the data-parallel step on the whole global batch, one thread).
//   Table 4 (FSDP1 memory, per rank): the same model under FullyShardedDataParallel (the same
//     instances: the blocks nested, the root; tools/fsdp_bench/flat_param_meter.h), one row per
//     sharding strategy (HYBRID_SHARD where the world has a (replicate, shard) mesh) and one
//     for FULL_SHARD with the measured step's micro-batch inside no_sync(), each against its
//     closed-form bound from the flat parameters' sizes. Over the bound: WARN, exit status 1.
//   Table 3 (all-gather): per FSDP group, the median time of FSDP's whole all-gather path
//     (unshard: copy-in, all-gather, copy-out; then reshard) against the process group's bare
//     all_gather_into_tensor of the same bytes, timed in alternation in the same run.
//
// Usage: fsdp-bench [--model transformer|mlp_stack[,..]] [--worlds 1,2,4,8 | 1-8] [--n-layers N]
//        [--dim N] [--n-heads N] [--vocab-size N] [--seq-len N] [--mlp-dim N] [--batch N]
//        [--iters N] [--warmup N] [--lr X] [--dtype float32|float64] [--seed N]
//        [--tables memory,time,comm,fsdp1] [--json PATH]
// Output: aligned text tables and --json, both through tools/bench/table.h (bench::Table).
// Exit status: 0 ok; 1 when a row exceeds the bound or a rank failed; 2 on bad arguments.
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "conformance/fsdp1_params.h"
#include "conformance/model_zoo.h"
#include "conformance/params.h"
#include "conformance/sharded_parity.h"
#include "engine/core/error.h"
#include "engine/core/rank_context.h"
#include "engine/fsdp/fully_shard.h"
#include "engine/distributed/device_mesh.h"
#include "engine/fsdp/observer.h"
#include "engine/fsdp1/fully_sharded_data_parallel.h"
#include "engine/fsdp1/wrap_policy.h"
#include "engine/nn/layers.h"
#include "fakes/run_ranks.h"
#include "reference/data_parallel.h"
#include "tools/bench/table.h"
#include "tools/fsdp_bench/flat_param_meter.h"
#include "tools/fsdp_bench/param_grad_meter.h"

namespace fsdp::bench {
namespace {

using conformance::CaseParams;
using conformance::OptimConfig;
using conformance::ZooModel;

// ---- Configuration -------------------------------------------------------------------------

struct BenchConfig {
  std::vector<std::string> models = {"transformer"};
  std::vector<int> worlds = {1, 2, 3, 4, 5, 6, 7, 8};
  int64_t n_layers = 4;
  int64_t dim = 64;
  int64_t n_heads = 4;
  int64_t vocab_size = 64;
  int64_t seq_len = 32;
  int64_t mlp_dim = 64;
  int64_t batch = 8;  // global batch (rows), split across the ranks
  int iters = 5;
  int warmup = 1;
  double lr = 1e-5;  // SGD learning rate (momentum 0.9)
  DType dtype = DType::kFloat32;
  uint64_t seed = 0;
  bool memory_table = true;
  bool time_table = true;
  bool comm_table = true;
  bool fsdp1_table = true;
  std::string json_path;
};

const char* kUsage =
    "usage: fsdp-bench [options]\n"
    "  --model NAMES      transformer, mlp_stack or both comma-separated (default transformer)\n"
    "  --worlds LIST      world sizes: 1,2,4,8 or a range 1-8 (default 1-8)\n"
    "  --n-layers N       Transformer ModelArgs.n_layers (default 4)\n"
    "  --dim N            Transformer ModelArgs.dim (default 64)\n"
    "  --n-heads N        Transformer ModelArgs.n_heads (default 4)\n"
    "  --vocab-size N     Transformer ModelArgs.vocab_size (default 64)\n"
    "  --seq-len N        tokens per row; also ModelArgs.max_seq_len (default 32)\n"
    "  --mlp-dim N        MLPStack mlp_dim (default 64)\n"
    "  --batch N          global batch rows, split across the ranks (default 8)\n"
    "  --iters N          timed steps per world, median reported (default 5)\n"
    "  --warmup N         untimed steps before them (default 1)\n"
    "  --lr X             SGD learning rate, momentum 0.9 (default 1e-5; at the zoo's 3e-4 the\n"
    "                     summed logits of an [8, 32] token batch diverge within 20 steps)\n"
    "  --dtype D          engine parameter dtype float32|float64 (default float32)\n"
    "  --seed N           weights and inputs seed (default 0)\n"
    "  --tables LIST      memory,time,comm,fsdp1 (default all four)\n"
    "  --json PATH        also write the results as JSON to PATH\n";

std::vector<std::string> SplitCommas(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(item);
  return out;
}

int64_t ParsePositive(const std::string& flag, const std::string& text) {
  const std::optional<int64_t> v = conformance::ParseInt(text);
  FSDP_CHECK(v.has_value() && *v >= 1, flag, " needs a positive integer, got '", text, "'");
  return *v;
}

std::vector<int> ParseWorlds(const std::string& text) {
  std::vector<int> worlds;
  auto add = [&](int64_t w) {
    FSDP_CHECK(w >= 1 && w <= 64, "--worlds: world size ", w, " outside [1, 64]");
    worlds.push_back(static_cast<int>(w));
  };
  for (const std::string& item : SplitCommas(text)) {
    const size_t dash = item.find('-');
    if (dash != std::string::npos && dash > 0) {
      const int64_t lo = ParsePositive("--worlds", item.substr(0, dash));
      const int64_t hi = ParsePositive("--worlds", item.substr(dash + 1));
      FSDP_CHECK(lo <= hi, "--worlds: empty range '", item, "'");
      for (int64_t w = lo; w <= hi; ++w) add(w);
    } else {
      add(ParsePositive("--worlds", item));
    }
  }
  FSDP_CHECK(!worlds.empty(), "--worlds: no world size in '", text, "'");
  return worlds;
}

BenchConfig ParseArgs(int argc, char** argv) {
  BenchConfig c;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    std::string value;
    const size_t eq = flag.find('=');
    if (flag == "-h" || flag == "--help") {
      std::cout << kUsage;
      std::exit(0);
    }
    if (eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
    } else {
      FSDP_CHECK(i + 1 < argc, flag, " needs a value\n", kUsage);
      value = argv[++i];
    }
    if (flag == "--model" || flag == "--models") {
      c.models = SplitCommas(value);
      for (const std::string& m : c.models) {
        FSDP_CHECK(m == "transformer" || m == "mlp_stack", "--model: unknown model '", m,
                   "' (choose transformer or mlp_stack)");
      }
    } else if (flag == "--worlds") {
      c.worlds = ParseWorlds(value);
    } else if (flag == "--n-layers") {
      c.n_layers = ParsePositive(flag, value);
    } else if (flag == "--dim") {
      c.dim = ParsePositive(flag, value);
    } else if (flag == "--n-heads") {
      c.n_heads = ParsePositive(flag, value);
    } else if (flag == "--vocab-size") {
      c.vocab_size = ParsePositive(flag, value);
    } else if (flag == "--seq-len") {
      c.seq_len = ParsePositive(flag, value);
    } else if (flag == "--mlp-dim") {
      c.mlp_dim = ParsePositive(flag, value);
    } else if (flag == "--batch") {
      c.batch = ParsePositive(flag, value);
    } else if (flag == "--iters") {
      c.iters = static_cast<int>(ParsePositive(flag, value));
    } else if (flag == "--warmup") {
      const std::optional<int64_t> v = conformance::ParseInt(value);
      FSDP_CHECK(v.has_value() && *v >= 0, "--warmup needs an integer >= 0, got '", value, "'");
      c.warmup = static_cast<int>(*v);
    } else if (flag == "--lr") {
      const std::optional<double> v = conformance::ParseDouble(value);
      FSDP_CHECK(v.has_value() && *v > 0, "--lr needs a positive number, got '", value, "'");
      c.lr = *v;
    } else if (flag == "--dtype") {
      c.dtype = ParseDType(value);
      FSDP_CHECK(c.dtype == DType::kFloat32 || c.dtype == DType::kFloat64,
                 "--dtype: choose float32 or float64, got '", value, "'");
    } else if (flag == "--seed") {
      const std::optional<int64_t> v = conformance::ParseInt(value);
      FSDP_CHECK(v.has_value() && *v >= 0, "--seed needs an integer >= 0, got '", value, "'");
      c.seed = static_cast<uint64_t>(*v);
    } else if (flag == "--tables") {
      c.memory_table = c.time_table = c.comm_table = c.fsdp1_table = false;
      for (const std::string& t : SplitCommas(value)) {
        FSDP_CHECK(t == "memory" || t == "time" || t == "comm" || t == "fsdp1",
                   "--tables: unknown table '", t, "' (choose memory, time, comm, fsdp1)");
        (t == "memory" ? c.memory_table
         : t == "time" ? c.time_table
         : t == "comm" ? c.comm_table
                       : c.fsdp1_table) = true;
      }
    } else if (flag == "--json") {
      c.json_path = value;
    } else {
      FSDP_THROW(ErrorCode::kInvalidArgument, "unknown flag '", flag, "'\n", kUsage);
    }
  }
  FSDP_CHECK(c.dim % c.n_heads == 0, "--dim ", c.dim, " must be divisible by --n-heads ",
             c.n_heads);
  for (int w : c.worlds) {
    FSDP_CHECK(c.batch >= w, "--batch ", c.batch, " must be >= every world size (got world ", w,
               "): every rank needs at least one row");
  }
  return c;
}

// CPUs this process may run on (what `nproc` prints).
int Nproc() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  return static_cast<int>(std::thread::hardware_concurrency());
}

// ---- Model ---------------------------------------------------------------------------------

CaseParams ZooParams(const BenchConfig& c, const std::string& model) {
  CaseParams p;
  p.set("batch", std::to_string(c.batch));
  if (model == "transformer") {
    p.set("n_layers", std::to_string(c.n_layers));
    p.set("vocab_size", std::to_string(c.vocab_size));
    p.set("max_seq_len", std::to_string(c.seq_len));
    p.set("seq_len", std::to_string(c.seq_len));
    p.set("dim", std::to_string(c.dim));
    p.set("n_heads", std::to_string(c.n_heads));
  } else {
    p.set("mlp_dim", std::to_string(c.mlp_dim));
  }
  return p;
}

// SGD with momentum 0.9 at --lr.
OptimConfig BenchOptim(const BenchConfig& c) {
  OptimConfig o;
  o.kind = "sgd";
  o.lr = c.lr;
  o.momentum = 0.9;
  return o;
}

// torch.tensor_split rows of a global batch of `rows`: rank r gets [begin, begin + count).
std::pair<int64_t, int64_t> RankRows(int64_t rows, int rank, int world) {
  const int64_t base = rows / world;
  const int64_t extra = rows % world;
  const int64_t begin = rank * base + std::min<int64_t>(rank, extra);
  return {begin, base + (rank < extra ? 1 : 0)};
}

// "8", or "2-3" when the split is uneven.
std::string RowsPerRank(int64_t rows, int world) {
  const int64_t lo = rows / world;
  const int64_t hi = lo + (rows % world != 0 ? 1 : 0);
  return lo == hi ? std::to_string(lo) : std::to_string(lo) + "-" + std::to_string(hi);
}

double Median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double MsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// ---- One world -----------------------------------------------------------------------------

// One FSDP group's all-gather path against the bare collective (Table 3).
struct AllGatherTiming {
  std::string group;
  int64_t bytes = 0;  // this rank's all-gather input
  double fsdp_ms = 0;
  double bare_ms = 0;
};

// What one rank reports.
struct RankReport {
  ParamGradBound bound;
  ParamGradBytes peak;          // the largest parameter + gradient sample of the measured step
  int64_t peak_comm_buffers = 0;
  int64_t num_samples = 0;
  int64_t allocator_peak = 0;   // allocator peak during the measured step (everything)
  int64_t allocator_start = 0;  // allocator current bytes when the measured step began
  std::vector<double> step_ms;  // timed steps
  double last_loss = 0;
  std::vector<AllGatherTiming> all_gathers;
};

// Per FSDP group of `module` (sharded, idle): the median over --iters of the group's unshard +
// reshard and of pg.all_gather_into_tensor on buffers of the same per-rank size and dtype,
// alternating, each after a barrier.
std::vector<AllGatherTiming> TimeAllGathers(const BenchConfig& c, const nn::ModulePtr& module,
                                            distributed::ProcessGroup& pg) {
  std::vector<AllGatherTiming> out;
  for (fsdp2::FsdpParamGroup* group : FsdpGroupsOf(module)) {
    int64_t numel = 0;
    DType dtype = c.dtype;
    for (const auto& p : group->fsdp_params()) {
      numel += p->sharded_param_data().numel();
      dtype = p->sharded_param_data().dtype();
    }
    const Tensor input = Tensor::zeros({numel}, dtype);
    const Tensor output = Tensor::zeros({numel * pg.size()}, dtype);
    std::vector<double> fsdp_ms;
    std::vector<double> bare_ms;
    for (int i = 0; i < c.warmup + c.iters; ++i) {
      pg.barrier();
      auto t0 = std::chrono::steady_clock::now();
      group->unshard(/*async_op=*/false);
      group->wait_for_unshard();
      group->reshard();
      const double fsdp = MsSince(t0);
      pg.barrier();
      t0 = std::chrono::steady_clock::now();
      pg.all_gather_into_tensor(output, input);
      const double bare = MsSince(t0);
      if (i >= c.warmup) {
        fsdp_ms.push_back(fsdp);
        bare_ms.push_back(bare);
      }
    }
    const std::string fqn = group->module_fqn();
    out.push_back({fqn.empty() ? "(root)" : fqn, numel * static_cast<int64_t>(ElementSize(dtype)),
                   Median(fsdp_ms), Median(bare_ms)});
  }
  return out;
}

// Rank `env.rank`'s run: build + shard, one priming step (lazy init, first unshard, optimizer
// state), the memory step with the meter installed (step 1), then warmup + timed steps.
RankReport RunRank(const BenchConfig& c, const ZooModel& model, const OptimConfig& optim,
                   fakes::RankEnv& env) {
  RankReport report;
  nn::ModulePtr module = model.BuildEngineWithWeights(c.seed, c.dtype);
  fsdp2::FullyShardOptions options;
  options.process_group = env.pg;
  conformance::ShardChildrenThenRoot(module, options);  // as parity/fsdp shards
  auto optimizer = conformance::MakeEngineOptimizer(optim, module->named_parameters());
  const auto [row_begin, row_count] = RankRows(c.batch, env.rank, env.world_size);
  const int64_t num_steps = 2 + c.warmup + c.iters;
  std::vector<Tensor> inputs;
  for (int64_t k = 0; k < num_steps; ++k) {
    inputs.push_back(
        model.MakeInput(c.seed, k, c.dtype, c.batch).ToEngine().narrow(0, row_begin, row_count));
  }
  auto step = [&](int64_t k, ParamGradMeter* meter) {
    auto sample = [&](const char* where) {
      if (meter != nullptr) meter->Sample(where);
    };
    Tensor loss = ZooModel::Loss(model.Forward(*module, inputs[k]), model.LossAt(k));
    sample("after forward");
    loss.backward();
    sample("after backward");
    optimizer->step();
    sample("after optimizer step");
    optimizer->zero_grad(/*set_to_none=*/true);
    sample("after zero_grad");
    report.last_loss = loss.item();
  };
  step(0, nullptr);

  MemoryStats& stats = RankContext::Current().memory_stats(Device::CPU());
  {
    ParamGradMeter meter(module);
    report.bound = ClosedFormBound(meter.groups(), env.world_size);
    meter.Install();
    fsdp2::ScopedObserver observe(meter);
    stats.ResetPeak();
    report.allocator_start = stats.current_bytes();
    meter.Sample("step start");
    step(1, &meter);
    report.allocator_peak = stats.peak_bytes();
    report.peak = meter.peak();
    report.peak_comm_buffers = meter.peak_comm_buffers();
    report.num_samples = meter.num_samples();
  }

  if (c.time_table) {
    for (int i = 0; i < c.warmup + c.iters; ++i) {
      env.pg->barrier();
      const auto t0 = std::chrono::steady_clock::now();
      step(2 + i, nullptr);
      const double ms = MsSince(t0);
      if (i >= c.warmup) report.step_ms.push_back(ms);
    }
  }
  if (c.comm_table) report.all_gathers = TimeAllGathers(c, module, *env.pg);
  return report;
}

// One Table 4 row: a sharding strategy, measured in a plain step or with the measured step's
// first micro-batch inside no_sync().
struct Fsdp1Row {
  fsdp1::ShardingStrategy strategy = fsdp1::ShardingStrategy::kFullShard;
  bool in_no_sync = false;

  std::string Name() const {
    return std::string(fsdp1::ShardingStrategyName(strategy)) + (in_no_sync ? " in no_sync()" : "");
  }
};

// The rows a world can serve: every strategy (hybrid ones on HybridMeshShapeFor(world)), then
// FULL_SHARD in no_sync().
std::vector<Fsdp1Row> Fsdp1Rows(int world) {
  std::vector<Fsdp1Row> rows;
  for (auto s : {fsdp1::ShardingStrategy::kFullShard, fsdp1::ShardingStrategy::kShardGradOp,
                 fsdp1::ShardingStrategy::kNoShard, fsdp1::ShardingStrategy::kHybridShard}) {
    if (fsdp1::IsHybridStrategy(s) && !conformance::HybridMeshShapeFor(world)) continue;
    rows.push_back({s, false});
  }
  rows.push_back({fsdp1::ShardingStrategy::kFullShard, true});
  return rows;
}

struct Fsdp1RankReport {
  FlatParamBound bound;
  ParamGradBytes peak;
  int64_t num_samples = 0;
};

// Rank `env.rank`'s Table 4 row: wrap (the blocks nested as parity/fsdp1 does, then the root),
// one priming step, then the measured step with the meter installed: with `in_no_sync`, a
// micro-batch inside no_sync() followed by a synced one, then the optimizer step.
Fsdp1RankReport RunFsdp1Rank(const BenchConfig& c, const ZooModel& model, const OptimConfig& optim,
                             const Fsdp1Row& row, fakes::RankEnv& env) {
  nn::ModulePtr module = model.BuildEngineWithWeights(c.seed, c.dtype);
  std::set<const nn::Module*> nested;
  for (const nn::ModulePtr& child : conformance::ChildrenToShard(module)) nested.insert(child.get());
  fsdp1::FullyShardedDataParallelOptions options;
  options.sharding_strategy = row.strategy;
  if (fsdp1::IsHybridStrategy(row.strategy)) {
    const auto shape = conformance::HybridMeshShapeFor(env.world_size);
    options.device_mesh = distributed::DeviceMesh::Init(env.pg, "cpu",
                                                        {shape->replicate, shape->shard},
                                                        {"replicate", "shard"});
  } else {
    options.process_group = env.pg;
  }
  options.auto_wrap_policy = std::make_shared<fsdp1::LambdaAutoWrapPolicy>(
      [nested](const nn::Module& m) { return nested.count(&m) > 0; });
  auto fsdp_model = std::make_shared<fsdp1::FullyShardedDataParallel>(module, options);
  auto optimizer = conformance::MakeEngineOptimizer(optim, fsdp_model->named_parameters());
  // Named copies, not a structured binding: a lambda may not capture one (clang, the asan build).
  const auto rows = RankRows(c.batch, env.rank, env.world_size);
  const auto row_begin = rows.first;
  const auto row_count = rows.second;
  auto input = [&](int64_t k) {
    return model.MakeInput(c.seed, k, c.dtype, c.batch).ToEngine().narrow(0, row_begin, row_count);
  };
  FlatParamMeter* meter = nullptr;
  auto sample = [&](const std::string& where) {
    if (meter != nullptr) meter->Sample(where);
  };
  auto forward_backward = [&](int64_t k, const std::string& label) {
    Tensor loss = ZooModel::Loss(model.Forward(*fsdp_model, input(k)), model.LossAt(k));
    sample("after forward" + label);
    loss.backward();
    sample("after backward" + label);
  };
  auto step = [&]() {
    optimizer->step();
    sample("after optimizer step");
    optimizer->zero_grad(/*set_to_none=*/true);
    sample("after zero_grad");
  };
  forward_backward(0, "");
  step();

  Fsdp1RankReport report;
  FlatParamMeter m(*fsdp_model);
  report.bound = Fsdp1ClosedFormBound(m.flat_params(), row.strategy, row.in_no_sync);
  meter = &m;
  {
    fsdp2::ScopedObserver observe(m);
    m.Sample("step start");
    if (row.in_no_sync) {
      fsdp1::NoSync no_sync = fsdp_model->no_sync();
      forward_backward(1, " (no_sync)");
    }
    forward_backward(row.in_no_sync ? 2 : 1, "");
    step();
  }
  report.peak = m.peak();
  report.num_samples = m.num_samples();
  return report;
}

// The oracle's step times: the data-parallel step of reference/ on the whole global batch,
// one rank, from the same weights and inputs; warmup + iters steps, the timed ones returned.
std::vector<double> OracleStepMs(const BenchConfig& c, const ZooModel& model,
                                 const OptimConfig& optim) {
  auto optimizer = conformance::MakeOracleOptimizer(optim);
  reference::TensorMap<double> params = model.MakeParameters(c.seed, c.dtype);
  const reference::TensorMap<double> buffers = model.MakeBuffers(c.seed, c.dtype);
  std::vector<double> times;
  for (int i = 0; i < c.warmup + c.iters; ++i) {
    const int64_t k = 2 + i;
    reference::TrainingStep<double> s;
    s.rank_inputs = {model.MakeInput(c.seed, k, c.dtype, c.batch).oracle};
    s.loss = model.LossAt(k);
    s.set_to_none = true;
    const auto t0 = std::chrono::steady_clock::now();
    auto records = reference::RunDataParallelTraining<double>(model.oracle(), params, buffers,
                                                              {s}, optimizer.get());
    const double ms = MsSince(t0);
    params = std::move(records.back().params);
    if (i >= c.warmup) times.push_back(ms);
  }
  return times;
}

// ---- Tables --------------------------------------------------------------------------------

Table MemoryTable() {
  return Table({{"world", "world"},
                {"rank", "rank"},
                {"sharded_bytes", "sharded", "(B)"},
                {"bound_bytes", "bound", "(B)"},
                {"measured_peak_bytes", "measured", "(B)"},
                {"peak_over_bound", "meas/bound", "", 3},
                {"comm_kept_bytes", "comm kept", "(B)"},
                {"allocator_peak_bytes", "alloc peak", "(B)"},
                {"status", "status", "", 2, true},
                {"peak_at", "peak at", "", 2, true}});
}

Table TimeTable() {
  return Table({{"world", "world"},
                {"rows_per_rank", "rows/rank"},
                {"engine_step_ms", "engine step", "(ms)", 3},
                {"engine_min_ms", "engine min", "(ms)", 3},
                {"oracle_step_ms", "oracle step", "(ms)", 3},
                {"engine_over_oracle", "engine/oracle", "", 3},
                {"engine_over_world1", "vs world 1", "", 3}});
}

Table Fsdp1MemoryTable() {
  return Table({{"world", "world"},
                {"rank", "rank"},
                {"row", "row", "", 2, true},
                {"sharded_bytes", "sharded", "(B)"},
                {"bound_bytes", "bound", "(B)"},
                {"measured_peak_bytes", "measured", "(B)"},
                {"peak_over_bound", "meas/bound", "", 3},
                {"status", "status", "", 2, true},
                {"peak_at", "peak at", "", 2, true}});
}

Table AllGatherTable() {
  return Table({{"world", "world"},
                {"group", "group", "", 2, true},
                {"bytes_per_rank", "bytes/rank", "(B)"},
                {"fsdp_all_gather_ms", "fsdp path", "(ms)", 4},
                {"bare_all_gather_ms", "bare AG", "(ms)", 4},
                {"fsdp_over_bare", "fsdp/bare", "", 3}});
}

int64_t NumParameters(const ZooModel& model) {
  int64_t n = 0;
  for (const reference::TensorSpec& s : model.oracle().ParameterSpecs()) {
    int64_t numel = 1;
    for (int64_t d : s.shape) numel *= d;
    n += numel;
  }
  return n;
}

std::string Describe(const BenchConfig& c, const std::string& model) {
  std::ostringstream os;
  if (model == "transformer") {
    os << "Transformer(ModelArgs(n_layers=" << c.n_layers << ", dim=" << c.dim
       << ", n_heads=" << c.n_heads << ", vocab_size=" << c.vocab_size
       << ", max_seq_len=" << c.seq_len << ", dropout_p=0, weight_tying=True)), tokens ["
       << c.batch << ", " << c.seq_len << "]";
  } else {
    os << "MLPStack(mlp_dim=" << c.mlp_dim << "), features [" << c.batch << ", " << c.mlp_dim
       << "]";
  }
  return os.str();
}

// Runs both tables for one model; returns its JSON and sets `exceeded` / `failed`.
nlohmann::json RunModel(const BenchConfig& c, const std::string& name, bool& exceeded,
                        bool& failed) {
  const ZooModel model = ZooModel::Make(name, ZooParams(c, name));
  const OptimConfig optim = BenchOptim(c);
  std::cout << "\n== " << Describe(c, name) << "\n   " << NumParameters(model) << " parameters, "
            << DTypeName(c.dtype) << ", loss out.sum(), SGD(lr=" << optim.lr
            << ", momentum=0.9), zero_grad(set_to_none=True)\n";

  Table memory = MemoryTable();
  Table time = TimeTable();
  Table all_gather = AllGatherTable();
  Table fsdp1_memory = Fsdp1MemoryTable();
  nlohmann::json groups_json = nlohmann::json::array();
  nlohmann::json breakdown_json = nlohmann::json::array();
  double world1_ms = NAN;
  std::vector<double> oracle_ms;
  double oracle_median = NAN;
  if (c.time_table) {
    oracle_ms = OracleStepMs(c, model, optim);
    oracle_median = Median(oracle_ms);
  }
  for (int world : c.worlds) {
    auto results = fakes::RunRanks(world, [&](fakes::RankEnv& env) {
      return RunRank(c, model, optim, env);
    });
    if (!results.all_ok()) {
      std::cout << "world " << world << " FAILED:\n" << results.summary();
      failed = true;
      continue;
    }
    const std::vector<RankReport> reports = results.values();
    groups_json.push_back({{"world", world},
                           {"group_unsharded_bytes", reports[0].bound.group_unsharded_bytes}});
    for (size_t r = 0; r < reports.size(); ++r) {
      const RankReport& rep = reports[r];
      const bool over = rep.peak.total() > rep.bound.bound;
      exceeded = exceeded || over;
      memory.AddRow({int64_t{world}, static_cast<int64_t>(r), rep.bound.sharded_bytes,
                     rep.bound.bound, rep.peak.total(),
                     static_cast<double>(rep.peak.total()) / static_cast<double>(rep.bound.bound),
                     rep.peak_comm_buffers, rep.allocator_peak,
                     std::string(over ? "WARN > bound" : "ok"), rep.peak.where});
      breakdown_json.push_back({{"world", world},
                                {"rank", r},
                                {"sharded_params", rep.peak.sharded_params},
                                {"sharded_grads", rep.peak.sharded_grads},
                                {"unsharded_params", rep.peak.unsharded_params},
                                {"unsharded_grads", rep.peak.unsharded_grads},
                                {"comm_buffers_at_peak", rep.peak.comm_buffers},
                                {"samples", rep.num_samples},
                                {"allocator_at_step_start", rep.allocator_start}});
    }
    if (c.time_table) {
      std::vector<double> per_step;  // the slowest rank of each step
      for (size_t i = 0; i < reports[0].step_ms.size(); ++i) {
        double worst = 0;
        for (const RankReport& rep : reports) worst = std::max(worst, rep.step_ms[i]);
        per_step.push_back(worst);
      }
      const double engine_ms = Median(per_step);
      if (world == 1) world1_ms = engine_ms;
      time.AddRow({int64_t{world}, RowsPerRank(c.batch, world), engine_ms,
                   *std::min_element(per_step.begin(), per_step.end()), oracle_median,
                   engine_ms / oracle_median,
                   std::isnan(world1_ms) ? TableCell{} : TableCell{engine_ms / world1_ms}});
    }
    for (size_t g = 0; c.comm_table && g < reports[0].all_gathers.size(); ++g) {
      // The slowest rank's median, for each of the two.
      double fsdp_ms = 0;
      double bare_ms = 0;
      for (const RankReport& rep : reports) {
        fsdp_ms = std::max(fsdp_ms, rep.all_gathers[g].fsdp_ms);
        bare_ms = std::max(bare_ms, rep.all_gathers[g].bare_ms);
      }
      const AllGatherTiming& t = reports[0].all_gathers[g];
      all_gather.AddRow({int64_t{world}, t.group, t.bytes, fsdp_ms, bare_ms, fsdp_ms / bare_ms});
    }
    for (const Fsdp1Row& row : c.fsdp1_table ? Fsdp1Rows(world) : std::vector<Fsdp1Row>{}) {
      auto fsdp1_results = fakes::RunRanks(world, [&](fakes::RankEnv& env) {
        return RunFsdp1Rank(c, model, optim, row, env);
      });
      if (!fsdp1_results.all_ok()) {
        std::cout << "world " << world << " " << row.Name() << " FAILED:\n"
                  << fsdp1_results.summary();
        failed = true;
        continue;
      }
      const std::vector<Fsdp1RankReport> fsdp1_reports = fsdp1_results.values();
      for (size_t r = 0; r < fsdp1_reports.size(); ++r) {
        const Fsdp1RankReport& rep = fsdp1_reports[r];
        const bool over = rep.peak.total() > rep.bound.bound;
        exceeded = exceeded || over;
        fsdp1_memory.AddRow({int64_t{world}, static_cast<int64_t>(r), row.Name(),
                             rep.bound.sharded_bytes, rep.bound.bound, rep.peak.total(),
                             static_cast<double>(rep.peak.total()) /
                                 static_cast<double>(rep.bound.bound),
                             std::string(over ? "WARN > bound" : "ok"), rep.peak.where});
      }
    }
    for (const RankReport& rep : reports) {
      if (!std::isfinite(rep.last_loss)) {
        std::cout << "note: world " << world << " reached a non-finite loss; timings of "
                  << "non-finite arithmetic may not be representative\n";
        break;
      }
    }
  }

  nlohmann::json out = {{"model", name},
                        {"description", Describe(c, name)},
                        {"num_parameters", NumParameters(model)},
                        {"optimizer", {{"kind", optim.kind}, {"lr", optim.lr}, {"momentum", 0.9}}},
                        {"groups", groups_json}};
  if (c.memory_table) {
    std::cout << "\nTable 1 - parameter + gradient bytes per rank during one training step\n"
              << "  bound = sharded (padded param + grad shards) + the two largest unsharded "
                 "groups (padded params + grads)\n"
              << "  measured = peak over FSDP events and gradient hooks of the bytes held in "
                 "param/grad storages; alloc peak = everything the rank allocated\n\n"
              << memory.ToText("  ");
    out["memory"] = memory.ToJson();
    out["memory_peak_breakdown"] = breakdown_json;
  }
  if (c.time_table) {
    std::cout << "\nTable 2 - step time (forward + backward + optimizer), median of " << c.iters
              << " after " << c.warmup
              << " warmup (engine min: the fastest step); engine = slowest rank per step\n\n"
              << time.ToText("  ");
    out["time"] = time.ToJson();
    out["oracle_step_ms_samples"] = oracle_ms;
  }
  if (c.fsdp1_table) {
    std::cout << "\nTable 4 - FSDP1 (FullyShardedDataParallel) parameter + gradient bytes per rank "
                 "during one training step, per sharding strategy\n"
              << "  bound = 2 x sharded flat params + the unsharded flat params alive at once by "
                 "the strategy's reshard rule and prefetch + unsharded gradients (one at a time; "
                 "all of them inside no_sync())\n\n"
              << fsdp1_memory.ToText("  ");
    out["fsdp1_memory"] = fsdp1_memory.ToJson();
  }
  if (c.comm_table) {
    std::cout << "\nTable 3 - all-gather per FSDP group: FSDP's path (unshard = copy-in + "
                 "all-gather + copy-out, then reshard) against the bare all_gather_into_tensor of "
                 "the same bytes on the same group, median of "
              << c.iters << " after " << c.warmup << " warmup, slowest rank\n\n"
              << all_gather.ToText("  ");
    out["all_gather"] = all_gather.ToJson();
  }
  return out;
}

int Main(int argc, char** argv) {
  BenchConfig c;
  try {
    c = ParseArgs(argc, argv);
  } catch (const Error& e) {
    std::cerr << "fsdp-bench: " << e.what() << "\n";
    return 2;
  }
  const int nproc = Nproc();
  const int max_world = *std::max_element(c.worlds.begin(), c.worlds.end());
  std::cout << "fsdp-bench: threaded engine (one thread per rank, ThreadedProcessGroup), CPU\n"
            << "nproc: " << nproc << "; global batch " << c.batch
            << " rows split across the ranks (torch.tensor_split)\n";
  if (max_world > nproc) {
    std::cout << "note: worlds > " << nproc << " oversubscribe the " << nproc
              << " cores; their step times measure contention, not scaling\n";
  }
  bool exceeded = false;
  bool failed = false;
  nlohmann::json json = {
      {"benchmark", "fsdp-bench"},
      {"nproc", nproc},
      {"config",
       {{"worlds", c.worlds}, {"n_layers", c.n_layers}, {"dim", c.dim}, {"n_heads", c.n_heads},
        {"vocab_size", c.vocab_size}, {"seq_len", c.seq_len}, {"mlp_dim", c.mlp_dim},
        {"global_batch", c.batch}, {"iters", c.iters}, {"warmup", c.warmup}, {"lr", c.lr},
        {"dtype", DTypeName(c.dtype)}, {"seed", c.seed}}},
      {"models", nlohmann::json::array()}};
  try {
    for (const std::string& model : c.models) {
      json["models"].push_back(RunModel(c, model, exceeded, failed));
    }
  } catch (const Error& e) {
    std::cerr << "fsdp-bench: " << e.what() << "\n";
    return 2;
  }
  json["bound_exceeded"] = exceeded;
  json["failed"] = failed;
  if (!c.json_path.empty()) {
    std::ofstream f(c.json_path);
    if (!f) {
      std::cerr << "fsdp-bench: cannot write --json " << c.json_path << "\n";
      return 2;
    }
    f << json.dump(2) << "\n";
  }
  if (exceeded) {
    std::cout << "\nWARN: a measured parameter + gradient peak exceeds its bound (rows marked "
                 "WARN)\n";
  }
  return exceeded || failed ? 1 : 0;
}

}  // namespace
}  // namespace fsdp::bench

int main(int argc, char** argv) { return fsdp::bench::Main(argc, argv); }
