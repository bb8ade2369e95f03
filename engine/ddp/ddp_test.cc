// DistributedDataParallel on the threaded fake against a single-process run: each rank trains
// its replica on its own batches; one process trains an identical model on the mean of every
// rank's loss. After every SGD step the parameters agree (the mean of the per-rank gradients
// is the gradient of the mean loss), and construction makes rank 0's initial state everyone's.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/rng.h"
#include "engine/ddp/distributed_data_parallel.h"
#include "engine/functional/functional.h"
#include "engine/nn/init.h"
#include "engine/nn/layers.h"
#include "engine/optim/sgd.h"
#include "fakes/run_ranks.h"

namespace fsdp::fakes {
namespace {

nn::ModulePtr MakeModel() {
  return std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{
      std::make_shared<nn::Linear>(4, 8), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(8, 2), std::make_shared<nn::BatchNorm1d>(2)});
}

// Rank r's batch of step k (a deterministic function of both).
Tensor Batch(int rank, int step) {
  Generator gen(1000 + 17 * static_cast<uint64_t>(rank) + static_cast<uint64_t>(step));
  return Tensor::randn({3, 4}, DType::kFloat32, &gen);
}

double MaxAbsDiff(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.to_doubles();
  const std::vector<double> y = b.to_doubles();
  EXPECT_EQ(x.size(), y.size());
  double m = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) m = std::max(m, std::abs(x[i] - y[i]));
  return m;
}

TEST(DistributedDataParallel, MatchesASingleProcessRunOnTheMeanLoss) {
  constexpr int kSteps = 3;
  for (int world : {2, 3}) {
    auto results = RunRanks(world, [world](RankEnv& env) {
      nn::ManualSeed(7);
      nn::ModulePtr reference = MakeModel();
      // Every rank draws different initial values; DDP broadcasts rank 0's.
      nn::ManualSeed(7 + static_cast<uint64_t>(env.rank));
      nn::ModulePtr replica = MakeModel();
      auto ddp_model = std::make_shared<ddp::DistributedDataParallel>(
          replica, ddp::DistributedDataParallelOptions{.process_group = env.pg});
      for (const auto& [name, p] : replica->named_parameters()) {
        EXPECT_EQ(MaxAbsDiff(p, reference->get_parameter(name)), 0.0) << name;
      }
      optim::SGD ddp_optim(ddp_model->parameters(), {.lr = 0.1});
      optim::SGD ref_optim(reference->parameters(), {.lr = 0.1});
      // Batch statistics differ per rank; eval mode keeps the running stats out of it.
      replica->eval();
      reference->eval();
      for (int step = 0; step < kSteps; ++step) {
        fsdp::sum((*ddp_model)(nn::Value(Batch(env.rank, step))).tensor()).backward();
        ddp_optim.step();
        ddp_optim.zero_grad();
        Tensor total;
        for (int r = 0; r < world; ++r) {
          Tensor loss = fsdp::sum((*reference)(nn::Value(Batch(r, step))).tensor());
          total = total.defined() ? fsdp::add(total, loss) : loss;
        }
        fsdp::div(total, static_cast<double>(world)).backward();
        ref_optim.step();
        ref_optim.zero_grad();
        for (const auto& [name, p] : replica->named_parameters()) {
          EXPECT_LT(MaxAbsDiff(p, reference->get_parameter(name)), 1e-6)
              << "step " << step << " " << name;
        }
      }
    });
    ASSERT_TRUE(results.all_ok()) << "world " << world << "\n" << results.summary();
  }
}

}  // namespace
}  // namespace fsdp::fakes
