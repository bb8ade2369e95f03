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
//     (reference/, double precision, the data-parallel step on the whole global batch, one thread)
//     and, at world 1, against the unsharded engine step: the same model and optimizer without
//     FSDP, timed in alternation with the FSDP step.
//   Table 4 (FSDP1 memory, per rank): the same model under FullyShardedDataParallel (the same
//     instances: the blocks nested, the root; tools/fsdp_bench/flat_param_meter.h), one row per
//     sharding strategy (HYBRID_SHARD where the world has a (replicate, shard) mesh) and one
//     for FULL_SHARD with the measured step's micro-batch inside no_sync(), each against its
//     closed-form bound from the flat parameters' sizes. Over the bound: WARN, exit status 1.
//   Table 3 (all-gather): per FSDP group, the median time of FSDP's whole all-gather path
//     (unshard: copy-in, all-gather, copy-out; then reshard) against the process group's bare
//     all_gather_into_tensor of the same bytes, and against plain copies of the bytes the path
//     copies (copy-in: the rank's shards; copy-out: the whole all-gather output), all three
//     timed in alternation in the same run. The path minus its copies, over the bare
//     collective, is FSDP's own overhead.
//
// Ranks: --backend threaded (default) runs each world's ranks as threads of this process on the
// threaded fake; a process backend (--backend gloo) runs Tables 2 and 3 with each world's ranks
// as processes: fsdp-bench starts W copies of itself per world (tools/launch/local_launcher.h),
// every rank gathers the others' timings (tools/fsdp_bench/gather_doubles.h) and rank 0 prints.
//
// Usage: fsdp-bench [--model transformer|mlp_stack[,..]] [--worlds 1,2,4,8 | 1-8] [--n-layers N]
//        [--dim N] [--n-heads N] [--vocab-size N] [--seq-len N] [--mlp-dim N] [--batch N]
//        [--iters N] [--warmup N] [--lr X] [--dtype float32|float64] [--seed N]
//        [--tables memory,time,comm,fsdp1] [--backend threaded|gloo] [--json PATH]
// Output: aligned text tables and --json, both through tools/bench/table.h (bench::Table).
// Exit status: 0 ok; 1 when a row exceeds the bound or a rank failed; 2 on bad arguments.
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "conformance/fsdp1_params.h"
#include "conformance/model_zoo.h"
#include "conformance/params.h"
#include "conformance/sharded_parity.h"
#include "engine/core/error.h"
#include "engine/core/rank_context.h"
#include "engine/distributed/backend_registry.h"
#include "engine/distributed/device_mesh.h"
#include "engine/distributed/launch.h"
#include "engine/fsdp/fully_shard.h"
#include "engine/fsdp/observer.h"
#include "engine/fsdp1/fully_sharded_data_parallel.h"
#include "engine/fsdp1/wrap_policy.h"
#include "engine/nn/layers.h"
#include "fakes/rank_thread_memory.h"
#include "fakes/run_ranks.h"
#include "fakes/threaded_backend.h"
#include "reference/data_parallel.h"
#include "tools/bench/table.h"
#include "tools/fsdp_bench/flat_param_meter.h"
#include "tools/fsdp_bench/gather_doubles.h"
#include "tools/fsdp_bench/param_grad_meter.h"
#include "tools/launch/local_launcher.h"

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
  bool tables_given = false;  // --tables was passed
  std::string backend = "threaded";
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
    "  --tables LIST      memory,time,comm,fsdp1 (default all four; time,comm with a process\n"
    "                     backend)\n"
    "  --backend NAME     threaded (default: ranks are threads of this process) or a process\n"
    "                     backend (gloo): each world's ranks are processes, Tables 2 and 3 only\n"
    "  --json PATH        also write the results as JSON to PATH (a process backend: one world)\n";

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
      c.tables_given = true;
      c.memory_table = c.time_table = c.comm_table = c.fsdp1_table = false;
      for (const std::string& t : SplitCommas(value)) {
        FSDP_CHECK(t == "memory" || t == "time" || t == "comm" || t == "fsdp1",
                   "--tables: unknown table '", t, "' (choose memory, time, comm, fsdp1)");
        (t == "memory" ? c.memory_table
         : t == "time" ? c.time_table
         : t == "comm" ? c.comm_table
                       : c.fsdp1_table) = true;
      }
    } else if (flag == "--backend") {
      c.backend = value;
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
  const distributed::BackendRegistry backends = fakes::DefaultBackends();
  const distributed::BackendSpec& spec = backends.Get(c.backend);  // throws naming the backend
  FSDP_CHECK(spec.capabilities.device == DeviceType::kCPU, "--backend ", c.backend,
             ": fsdp-bench trains on the CPU; choose threaded or gloo");
  if (spec.capabilities.ranks == distributed::RankPlacement::kProcesses) {
    if (!c.tables_given) c.memory_table = c.fsdp1_table = false;
    FSDP_CHECK(!c.memory_table && !c.fsdp1_table, "--backend ", c.backend,
               ": Tables 1 and 4 (memory, fsdp1) run on the threaded backend only; choose "
               "--tables time,comm");
    FSDP_CHECK(c.json_path.empty() || c.worlds.size() == 1, "--backend ", c.backend,
               ": --json needs a single world (each world's rank 0 writes it)");
  } else {
    FSDP_CHECK(c.backend == "threaded", "--backend ", c.backend,
               ": fsdp-bench runs threaded ranks on the threaded backend only");
  }
  return c;
}

bool IsProcessBackend(const BenchConfig& c) { return c.backend != "threaded"; }

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
  double copies_ms = 0;  // plain copies of the bytes FSDP's copy-in and copy-out move
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
  std::vector<double> unsharded_step_ms;  // world 1: the unsharded engine step, in alternation
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
    // The copies' floor: copy-in moves the rank's shards into the all-gather input, copy-out
    // the whole all-gather output into the unsharded parameters.
    Tensor copy_in_dst = Tensor::zeros({numel}, dtype);
    Tensor copy_out_dst = Tensor::zeros({numel * pg.size()}, dtype);
    std::vector<double> fsdp_ms;
    std::vector<double> bare_ms;
    std::vector<double> copies_ms;
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
      pg.barrier();
      t0 = std::chrono::steady_clock::now();
      copy_in_dst.copy_(input);
      copy_out_dst.copy_(output);
      const double copies = MsSince(t0);
      if (i >= c.warmup) {
        fsdp_ms.push_back(fsdp);
        bare_ms.push_back(bare);
        copies_ms.push_back(copies);
      }
    }
    const std::string fqn = group->module_fqn();
    out.push_back({fqn.empty() ? "(root)" : fqn, numel * static_cast<int64_t>(ElementSize(dtype)),
                   Median(fsdp_ms), Median(bare_ms), Median(copies_ms)});
  }
  return out;
}

// The rank's run on `pg` (its world group): build + shard, one priming step (lazy init, first
// unshard, optimizer state), the memory step with the meter installed (step 1), then warmup +
// timed steps; at world 1 each timed step alternates with the unsharded engine step.
RankReport RunRank(const BenchConfig& c, const ZooModel& model, const OptimConfig& optim,
                   const std::shared_ptr<distributed::ProcessGroup>& pg) {
  RankReport report;
  const int rank = pg->rank();
  const int world_size = pg->size();
  nn::ModulePtr module = model.BuildEngineWithWeights(c.seed, c.dtype);
  fsdp2::FullyShardOptions options;
  options.process_group = pg;
  conformance::ShardChildrenThenRoot(module, options);  // as parity/fsdp shards
  auto optimizer = conformance::MakeEngineOptimizer(optim, module->named_parameters());
  const auto [row_begin, row_count] = RankRows(c.batch, rank, world_size);
  const int64_t num_steps = 2 + c.warmup + c.iters;
  std::vector<Tensor> inputs;
  for (int64_t k = 0; k < num_steps; ++k) {
    inputs.push_back(
        model.MakeInput(c.seed, k, c.dtype, c.batch).ToEngine().narrow(0, row_begin, row_count));
  }
  // One training step of `m` with `opt` on input k; returns the loss.
  auto train_step = [&](nn::Module& m, optim::Optimizer& opt, int64_t k, ParamGradMeter* meter) {
    auto sample = [&](const char* where) {
      if (meter != nullptr) meter->Sample(where);
    };
    Tensor loss = ZooModel::Loss(model.Forward(m, inputs[k]), model.LossAt(k));
    sample("after forward");
    loss.backward();
    sample("after backward");
    opt.step();
    sample("after optimizer step");
    opt.zero_grad(/*set_to_none=*/true);
    sample("after zero_grad");
    return loss.item();
  };
  auto step = [&](int64_t k, ParamGradMeter* meter) {
    report.last_loss = train_step(*module, *optimizer, k, meter);
  };
  step(0, nullptr);

  MemoryStats& stats = RankContext::Current().memory_stats(Device::CPU());
  {
    ParamGradMeter meter(module);
    report.bound = ClosedFormBound(meter.groups(), world_size);
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
    // World 1: the same model (same weights) and optimizer without FSDP, primed like the FSDP
    // one (optimizer state), then stepped on the same inputs right after each FSDP step.
    nn::ModulePtr unsharded;
    std::unique_ptr<optim::Optimizer> unsharded_optimizer;
    if (world_size == 1) {
      unsharded = model.BuildEngineWithWeights(c.seed, c.dtype);
      unsharded_optimizer = conformance::MakeEngineOptimizer(optim, unsharded->named_parameters());
      train_step(*unsharded, *unsharded_optimizer, 0, nullptr);
      train_step(*unsharded, *unsharded_optimizer, 1, nullptr);
    }
    for (int i = 0; i < c.warmup + c.iters; ++i) {
      pg->barrier();
      auto t0 = std::chrono::steady_clock::now();
      step(2 + i, nullptr);
      const double ms = MsSince(t0);
      if (i >= c.warmup) report.step_ms.push_back(ms);
      if (unsharded == nullptr) continue;
      t0 = std::chrono::steady_clock::now();
      train_step(*unsharded, *unsharded_optimizer, 2 + i, nullptr);
      const double unsharded_ms = MsSince(t0);
      if (i >= c.warmup) report.unsharded_step_ms.push_back(unsharded_ms);
    }
  }
  if (c.comm_table) report.all_gathers = TimeAllGathers(c, module, *pg);
  return report;
}

// Every rank's timings (Tables 2 and 3) on every rank of a process backend: the ranks' reports
// as far as the tables use them, gathered over `pg` (each rank's timings have the same length:
// same --iters, same groups).
std::vector<RankReport> GatherTimings(const RankReport& mine, distributed::ProcessGroup& pg) {
  std::vector<double> flat = mine.step_ms;
  flat.insert(flat.end(), mine.unsharded_step_ms.begin(), mine.unsharded_step_ms.end());
  for (const AllGatherTiming& t : mine.all_gathers) {
    flat.push_back(t.fsdp_ms);
    flat.push_back(t.bare_ms);
    flat.push_back(t.copies_ms);
  }
  flat.push_back(mine.last_loss);
  const std::vector<std::vector<double>> all = AllGatherDoubles(pg, flat);
  std::vector<RankReport> reports;
  for (const std::vector<double>& theirs : all) {
    RankReport r = mine;  // group names and byte counts are the same on every rank
    auto at = theirs.begin();
    r.step_ms.assign(at, at + static_cast<std::ptrdiff_t>(mine.step_ms.size()));
    at += static_cast<std::ptrdiff_t>(mine.step_ms.size());
    r.unsharded_step_ms.assign(at, at + static_cast<std::ptrdiff_t>(mine.unsharded_step_ms.size()));
    at += static_cast<std::ptrdiff_t>(mine.unsharded_step_ms.size());
    for (AllGatherTiming& t : r.all_gathers) {
      t.fsdp_ms = *at++;
      t.bare_ms = *at++;
      t.copies_ms = *at++;
    }
    r.last_loss = *at;
    reports.push_back(std::move(r));
  }
  return reports;
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
                {"engine_over_world1", "vs world 1", "", 3},
                {"unsharded_step_ms", "unsharded step", "(ms)", 3},
                {"engine_over_unsharded", "engine/unsharded", "", 3}});
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
                {"fsdp_over_bare", "fsdp/bare", "", 3},
                {"copies_ms", "copies", "(ms)", 4},
                {"fsdp_minus_copies_over_bare", "(fsdp-copies)/bare", "", 3}});
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

// Every rank's report of one world of FSDP2 ranks; nullopt when a rank failed (said on stdout).
using WorldRunner = std::function<std::optional<std::vector<RankReport>>(
    int world, const ZooModel& model, const OptimConfig& optim)>;

// The threaded backend's world: W rank threads of this process.
std::optional<std::vector<RankReport>> RunThreadedWorld(const BenchConfig& c, int world,
                                                        const ZooModel& model,
                                                        const OptimConfig& optim) {
  auto results = fakes::RunRanks(world, [&](fakes::RankEnv& env) {
    return RunRank(c, model, optim, env.pg);
  });
  if (!results.all_ok()) {
    std::cout << "world " << world << " FAILED:\n" << results.summary();
    return std::nullopt;
  }
  return results.values();
}

// Runs the tables for one model; returns its JSON and sets `exceeded` / `failed`.
nlohmann::json RunModel(const BenchConfig& c, const std::string& name,
                        const WorldRunner& run_world, bool& exceeded, bool& failed) {
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
    const std::optional<std::vector<RankReport>> results = run_world(world, model, optim);
    if (!results) {
      failed = true;
      continue;
    }
    const std::vector<RankReport>& reports = *results;
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
      const double unsharded_ms = Median(reports[0].unsharded_step_ms);  // world 1 only
      time.AddRow({int64_t{world}, RowsPerRank(c.batch, world), engine_ms,
                   *std::min_element(per_step.begin(), per_step.end()), oracle_median,
                   engine_ms / oracle_median,
                   std::isnan(world1_ms) ? TableCell{} : TableCell{engine_ms / world1_ms},
                   std::isnan(unsharded_ms) ? TableCell{} : TableCell{unsharded_ms},
                   std::isnan(unsharded_ms) ? TableCell{} : TableCell{engine_ms / unsharded_ms}});
    }
    for (size_t g = 0; c.comm_table && g < reports[0].all_gathers.size(); ++g) {
      // The slowest rank's median, for each of the two.
      double fsdp_ms = 0;
      double bare_ms = 0;
      double copies_ms = 0;
      for (const RankReport& rep : reports) {
        fsdp_ms = std::max(fsdp_ms, rep.all_gathers[g].fsdp_ms);
        bare_ms = std::max(bare_ms, rep.all_gathers[g].bare_ms);
        copies_ms = std::max(copies_ms, rep.all_gathers[g].copies_ms);
      }
      const AllGatherTiming& t = reports[0].all_gathers[g];
      all_gather.AddRow({int64_t{world}, t.group, t.bytes, fsdp_ms, bare_ms, fsdp_ms / bare_ms,
                         copies_ms, (fsdp_ms - copies_ms) / bare_ms});
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
              << " warmup (engine min: the fastest step); engine = slowest rank per step;\n"
              << "  unsharded = the same model and optimizer without FSDP (world 1), timed in "
                 "alternation with the FSDP step\n\n"
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
                 "the same bytes on the same group, and against plain copies of the bytes the "
                 "path copies (copy-in + copy-out); median of "
              << c.iters << " after " << c.warmup << " warmup, slowest rank\n\n"
              << all_gather.ToText("  ");
    out["all_gather"] = all_gather.ToJson();
  }
  return out;
}

// Prints the header and every model's tables for the worlds `run_world` runs; writes --json.
// Returns the exit status.
int Report(const BenchConfig& c, const std::string& ranks, const WorldRunner& run_world) {
  const int nproc = Nproc();
  const int max_world = *std::max_element(c.worlds.begin(), c.worlds.end());
  std::cout << "fsdp-bench: " << ranks << ", CPU\n"
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
      {"backend", c.backend},
      {"nproc", nproc},
      {"config",
       {{"worlds", c.worlds}, {"n_layers", c.n_layers}, {"dim", c.dim}, {"n_heads", c.n_heads},
        {"vocab_size", c.vocab_size}, {"seq_len", c.seq_len}, {"mlp_dim", c.mlp_dim},
        {"global_batch", c.batch}, {"iters", c.iters}, {"warmup", c.warmup}, {"lr", c.lr},
        {"dtype", DTypeName(c.dtype)}, {"seed", c.seed}}},
      {"models", nlohmann::json::array()}};
  for (const std::string& model : c.models) {
    json["models"].push_back(RunModel(c, model, run_world, exceeded, failed));
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

// A process backend, this process being one launched rank of a world of --worlds' one size:
// every rank runs every model's FSDP steps; rank 0 prints the tables.
int RunLaunchedRank(const BenchConfig& c, const distributed::LaunchEnvironment& launch) {
  FSDP_CHECK(c.worlds == std::vector<int>{launch.world_size}, "--worlds must be the launched "
             "world size ", launch.world_size, " (", launch.source, ")");
  distributed::LaunchEnvironment env = launch;
  env.backend = c.backend;
  const std::unique_ptr<distributed::DistributedSession> session =
      distributed::DistributedSession::Create(env);
  const std::shared_ptr<distributed::ProcessGroup>& pg = session->world_ptr();
  const WorldRunner run_world = [&](int /*world*/, const ZooModel& model,
                                    const OptimConfig& optim) {
    return std::optional<std::vector<RankReport>>(
        GatherTimings(RunRank(c, model, optim, pg), *pg));
  };
  if (pg->rank() == 0) {
    return Report(c, "engine ranks as processes (--backend " + c.backend + ", world " +
                         std::to_string(pg->size()) + ")", run_world);
  }
  for (const std::string& name : c.models) {
    run_world(pg->size(), ZooModel::Make(name, ZooParams(c, name)), BenchOptim(c));
  }
  return 0;
}

// A process backend without a launcher: for each world of --worlds, start W copies of this
// program (the same arguments, then --worlds W) as the ranks. Returns the first failure's
// status, else 0.
int LaunchWorlds(const BenchConfig& c, int argc, char** argv) {
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  FSDP_CHECK_CODE(ErrorCode::kUnavailable, !ec, "cannot resolve /proc/self/exe: ", ec.message());
  int status = 0;
  for (int world : c.worlds) {
    LocalLaunchOptions launch;
    launch.nproc_per_node = world;
    launch.prefix_output = false;  // rank 0 prints the tables; errors name their rank
    launch.name = "fsdp-bench";
    launch.command.push_back(self.string());
    for (int i = 1; i < argc; ++i) launch.command.emplace_back(argv[i]);
    launch.command.insert(launch.command.end(), {"--worlds", std::to_string(world)});
    const int rc = RunLocalWorld(launch);
    if (status == 0) status = rc;
  }
  return status;
}

int Main(int argc, char** argv) {
  BenchConfig c;
  try {
    c = ParseArgs(argc, argv);
  } catch (const Error& e) {
    std::cerr << "fsdp-bench: " << e.what() << "\n";
    return 2;
  }
  std::string who;  // "rank R: " once this process is known to be a launched rank
  try {
    if (!IsProcessBackend(c)) {
      return Report(c, "threaded engine (one thread per rank, ThreadedProcessGroup)",
                    [&](int world, const ZooModel& model, const OptimConfig& optim) {
                      return RunThreadedWorld(c, world, model, optim);
                    });
    }
    const distributed::LaunchEnvironment launch = distributed::ReadLaunchEnvironment();
    if (launch.source == "default") return LaunchWorlds(c, argc, argv);
    who = "rank " + std::to_string(launch.rank) + ": ";
    return RunLaunchedRank(c, launch);
  } catch (const Error& e) {
    std::cerr << "fsdp-bench: " + who + e.what() + "\n";  // one write: peers may be killed
    return 2;
  }
}

}  // namespace
}  // namespace fsdp::bench

int main(int argc, char** argv) {
  fsdp::fakes::KeepFreedMemoryInProcess();  // threaded worlds of up to hundreds of ranks
  return fsdp::bench::Main(argc, argv);
}
