// fully_shard on CUDA (docs/gpu.md "FSDP on CUDA"): a sharded MLP and a sharded Transformer
// trained a few SGD steps on cuda:0 over a world-1 group and over 2 threaded ranks sharing one
// GPU (the threaded process group stages CUDA buffers through host memory), compared per rank
// with the same run on the CPU; the FSDP streams are the CommContext's dedicated CUDA streams.
// Variations: the user's post-optimizer event (set_post_optim_event) and CPU offload with pinned
// memory. The CPU tests below run everywhere: the CPU path keeps no-op streams and CUDA events
// out, and consumes the post-optimizer event like the CUDA path.
// The CUDA tests skip with "no CUDA device visible" where there is none.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/allocator.h"
#include "engine/core/cuda_stream.h"
#include "engine/fsdp/fsdp_state.h"
#include "engine/fsdp/fully_shard.h"
#include "engine/functional/functional.h"
#include "engine/nn/models.h"
#include "engine/optim/sgd.h"
#include "fakes/run_ranks.h"

namespace fsdp::fakes {
namespace {

// What one rank observed: the loss of every step and, after the last step, every parameter's
// local shard.
struct RankTrace {
  std::vector<double> losses;
  std::map<std::string, std::vector<double>> shards;
  bool dedicated_streams = false;  // the root's CommContext owned CUDA streams
  bool any_cuda_stream = false;    // some stream of the root's CommContext was a CUDA stream
  bool current_stream_is_default = false;  // no stream guard was left installed on the thread
  int post_optim_events_consumed = 0;      // root pre-forwards that consumed the user's event
};

enum class Model { kMlp, kTransformer };

// Variations of the training loop.
struct TrainOptions {
  // Every step records an event on the current stream after the optimizer step and hands it to
  // the root (set_post_optim_event), as a user who overlaps the next forward's all-gathers
  // with unrelated work would.
  bool post_optim_event = false;
  // CPUOffloadPolicy(pin_memory): sharded parameters and gradients on the host, the optimizer
  // on the host; on a CUDA device the shards are pinned and the copies non-blocking.
  bool cpu_offload = false;
  // The parameters' dtype. The Transformer is compared in float64: its summed-logit loss
  // trains in a diverging regime that amplifies float32 rounding differences between cuBLAS and
  // the CPU kernels past any useful tolerance within three steps.
  DType dtype = DType::kFloat32;
};

RankTrace TrainRank(RankEnv& env, Model which, Device device, int steps,
                    const TrainOptions& train = {}) {
  nn::ModulePtr model;
  std::vector<nn::ModulePtr> blocks;
  nn::ModelArgs args;
  args.dropout_p = 0.0;
  if (which == Model::kMlp) {
    auto mlp = std::make_shared<nn::MLP>(8, true, false, 3);  // 24 hidden rows: uneven shards
    blocks = {mlp->child("in_proj"), mlp->child("out_proj")};
    model = mlp;
  } else {
    auto transformer = std::make_shared<nn::Transformer>(args);
    for (const auto& layer : transformer->layers()) blocks.push_back(layer);
    model = transformer;
  }
  model->to(train.dtype);
  fsdp2::FullyShardOptions shard_options;
  if (train.cpu_offload) shard_options.offload_policy = fsdp2::OffloadPolicy::CPUOffload();
  for (const nn::ModulePtr& block : blocks) fsdp2::fully_shard(block, shard_options);
  fsdp2::FSDPModule root = fsdp2::fully_shard(model, shard_options);
  optim::SGD optim(model->parameters(), optim::SGDOptions{.lr = 0.1});
  RankTrace trace;
  for (int step = 0; step < steps; ++step) {
    // Every rank draws the same global batch (one seed) and takes its slice, on the CPU.
    const int64_t local_batch = 2;
    const int64_t global_batch = env.world_size * local_batch;
    const Tensor global_inp = which == Model::kMlp
                                  ? Tensor::randn({global_batch, 8}).to(train.dtype)
                                  : Tensor::randint(0, args.vocab_size, {global_batch, 16});
    const Tensor local_inp =
        global_inp.narrow(0, env.rank * local_batch, local_batch).clone().to(device);
    const bool event_pending = root.state().state_ctx()->post_optim_event.has_value();
    Tensor loss = sum((*model)(local_inp).tensor());
    if (event_pending && !root.state().state_ctx()->post_optim_event.has_value()) {
      ++trace.post_optim_events_consumed;
    }
    loss.backward();
    optim.step();
    if (train.post_optim_event) {
      root.set_post_optim_event(fsdp2::CommStream::Current(device).record_event());
    }
    optim.zero_grad();
    trace.losses.push_back(loss.item());
  }
  for (const auto& [name, param] : model->named_parameters()) {
    EXPECT_EQ(param.device(), train.cpu_offload ? Device::CPU() : device) << name;
    EXPECT_EQ(param.is_pinned(), train.cpu_offload && device.is_cuda()) << name;
    trace.shards[name] = param.to_doubles();
  }
  const auto& ctx = fsdp2::GetFsdpState(*model)->comm_ctx();
  trace.dedicated_streams = ctx->all_gather_copy_in_stream().is_dedicated() &&
                            ctx->all_gather_stream().is_dedicated() &&
                            ctx->reduce_scatter_stream().is_dedicated() &&
                            ctx->all_reduce_stream().is_dedicated();
  for (const fsdp2::CommStream* s :
       {&ctx->current_stream(), &ctx->all_gather_copy_in_stream(), &ctx->all_gather_stream(),
        &ctx->reduce_scatter_stream(), &ctx->all_reduce_stream()}) {
    trace.any_cuda_stream = trace.any_cuda_stream || s->is_cuda();
  }
  trace.current_stream_is_default = CurrentCudaStream(Device::CUDA(0)).is_default();
  return trace;
}

std::vector<RankTrace> Train(int world, Model which, Device device, int steps,
                             const TrainOptions& train = {}) {
  RunRanksOptions options;
  options.device = device;
  options.seed = 1234;
  auto results = RunRanks(
      world,
      [&](RankEnv& env) { return TrainRank(env, which, device, steps, train); },
      options);
  EXPECT_TRUE(results.all_ok()) << results.summary();
  if (!results.all_ok()) return {};
  return results.values();
}

void ExpectClose(const std::vector<double>& got, const std::vector<double>& want, double tol,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], tol * (1.0 + std::fabs(want[i]))) << what << " [" << i << "]";
  }
}

// `tol` bounds the relative error of every parameter and of the losses; a float64
// Transformer's losses are float32 (its output is .float()) summed in different orders on the
// two devices, so they get float32's tolerance.
void ExpectCudaMatchesCpu(int world, Model which, double tol, const TrainOptions& train = {}) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
  const int steps = 3;
  const double loss_tol = which == Model::kTransformer ? std::max(tol, 1e-5) : tol;
  const std::vector<RankTrace> cpu =
      Train(world, which, Device::CPU(), steps, TrainOptions{.dtype = train.dtype});
  const std::vector<RankTrace> gpu = Train(world, which, Device::CUDA(0), steps, train);
  ASSERT_EQ(cpu.size(), static_cast<size_t>(world));
  ASSERT_EQ(gpu.size(), static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    const std::string rank = "rank " + std::to_string(r);
    EXPECT_TRUE(gpu[r].dedicated_streams) << rank;
    EXPECT_TRUE(gpu[r].current_stream_is_default) << rank;
    EXPECT_FALSE(cpu[r].any_cuda_stream) << rank;
    EXPECT_EQ(gpu[r].post_optim_events_consumed, train.post_optim_event ? steps - 1 : 0) << rank;
    ExpectClose(gpu[r].losses, cpu[r].losses, loss_tol, rank + " losses");
    ASSERT_EQ(gpu[r].shards.size(), cpu[r].shards.size()) << rank;
    for (const auto& [name, values] : cpu[r].shards) {
      ASSERT_TRUE(gpu[r].shards.count(name)) << rank << " " << name;
      std::string what = rank;
      what += " ";
      what += name;
      ExpectClose(gpu[r].shards.at(name), values, tol, what);
    }
  }
}

TEST(FsdpCpuStreams, CpuTrainingUsesNoOpStreams) {
  // Runs everywhere: the CPU path resolves every FSDP stream to a no-op and leaves the rank
  // thread's CUDA current-stream state untouched.
  for (Model which : {Model::kMlp, Model::kTransformer}) {
    const std::vector<RankTrace> traces = Train(2, which, Device::CPU(), 2);
    ASSERT_EQ(traces.size(), 2u);
    for (const RankTrace& t : traces) {
      EXPECT_FALSE(t.any_cuda_stream);
      EXPECT_FALSE(t.dedicated_streams);
      EXPECT_TRUE(t.current_stream_is_default);
      ASSERT_EQ(t.losses.size(), 2u);
      for (double loss : t.losses) EXPECT_TRUE(std::isfinite(loss));
      EXPECT_FALSE(t.shards.empty());
    }
  }
}

TEST(FsdpCpuStreams, PostOptimEventIsConsumedByTheNextRootPreForward) {
  // The event set after each optimizer step is taken (and cleared) by the next forward's root
  // pre-forward; training is unchanged, as every stream is a no-op on the CPU.
  const std::vector<RankTrace> plain = Train(2, Model::kMlp, Device::CPU(), 3);
  const std::vector<RankTrace> with_event =
      Train(2, Model::kMlp, Device::CPU(), 3, TrainOptions{.post_optim_event = true});
  ASSERT_EQ(with_event.size(), 2u);
  for (size_t r = 0; r < with_event.size(); ++r) {
    EXPECT_EQ(with_event[r].post_optim_events_consumed, 2);
    EXPECT_EQ(plain[r].post_optim_events_consumed, 0);
    EXPECT_EQ(with_event[r].losses, plain[r].losses);
    EXPECT_EQ(with_event[r].shards, plain[r].shards);
  }
}

TEST(FsdpGpu, MlpWorld1MatchesCpu) { ExpectCudaMatchesCpu(1, Model::kMlp, 1e-5); }
TEST(FsdpGpu, MlpTwoThreadedRanksOnOneGpuMatchCpu) { ExpectCudaMatchesCpu(2, Model::kMlp, 1e-5); }
TEST(FsdpGpu, TransformerWorld1MatchesCpu) {
  ExpectCudaMatchesCpu(1, Model::kTransformer, 1e-9, TrainOptions{.dtype = DType::kFloat64});
}
TEST(FsdpGpu, TransformerTwoThreadedRanksOnOneGpuMatchCpu) {
  ExpectCudaMatchesCpu(2, Model::kTransformer, 1e-9, TrainOptions{.dtype = DType::kFloat64});
}
TEST(FsdpGpu, PostOptimEventTwoThreadedRanksMatchCpu) {
  ExpectCudaMatchesCpu(2, Model::kMlp, 1e-5, TrainOptions{.post_optim_event = true});
}
TEST(FsdpGpu, CpuOffloadPinnedTwoThreadedRanksMatchCpu) {
  // Pinned sharded parameters, non-blocking uploads in the all-gather copy-in, non-blocking
  // gradient offload waited for in finalize_backward, SGD on the host.
  ExpectCudaMatchesCpu(2, Model::kMlp, 1e-5, TrainOptions{.cpu_offload = true});
  ExpectCudaMatchesCpu(
      2, Model::kTransformer, 1e-9,
      TrainOptions{.post_optim_event = true, .cpu_offload = true, .dtype = DType::kFloat64});
}

}  // namespace
}  // namespace fsdp::fakes
