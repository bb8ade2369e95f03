// FSDP2 data paths over the threaded process group: all-gather copy-in / copy-out and the
// reduce-scatter (chunk-cat copy-in, divide factors, view-out at padded offsets) against the
// hand-computed layouts of docs/fsdp-behaviour.md, "All-gather" / "Reduce-scatter", uneven
// shapes and empty shards at
// worlds 1–4, and the 128-rank seed test (test_fully_shard_comm.py
// TestFullyShardCollectiveOps) over its eight parameter shapes.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <numeric>
#include <vector>

#include "engine/core/tensor.h"
#include "engine/fsdp/comm_context.h"
#include "engine/fsdp/fsdp_collectives.h"
#include "engine/fsdp/fsdp_param.h"
#include "engine/fsdp/fsdp_param_group.h"
#include "engine/fsdp/mesh_info.h"
#include "engine/nn/layers.h"
#include "fakes/run_ranks.h"

namespace fsdp::fakes {
namespace {

using fsdp2::FsdpMeshInfo;
using fsdp2::FsdpParam;
using fsdp2::FsdpParamGroup;
using fsdp2::ParamToShard;

// Values 0, 1, 2, ... (+ base) of `shape`, identical on every rank.
Tensor Iota(const Shape& shape, double base = 0.0, DType dtype = DType::kFloat32) {
  std::vector<double> v(static_cast<size_t>(Numel(shape)));
  std::iota(v.begin(), v.end(), base);
  return Tensor::from_doubles(v, shape, dtype);
}

Tensor Scaled(const Tensor& t, double scale) {
  std::vector<double> v = t.to_doubles();
  for (double& x : v) x *= scale;
  return Tensor::from_doubles(v, t.sizes(), t.dtype());
}

// PyTorch's `_init_fsdp_param_group`: a ParameterList of clones of `params` and one group over
// it on the world group, lazily initialized.
struct TestGroup {
  std::shared_ptr<nn::ParameterList> module;
  std::shared_ptr<FsdpParamGroup> group;
};

TestGroup MakeGroup(const std::vector<Tensor>& params, const std::shared_ptr<distributed::ProcessGroup>& pg,
                    fsdp2::ReshardAfterForward reshard_after_forward = true) {
  TestGroup t;
  std::vector<Tensor> clones;
  for (const Tensor& p : params) clones.push_back(p.clone());
  t.module = std::make_shared<nn::ParameterList>(clones);
  const FsdpMeshInfo mesh_info = FsdpMeshInfo::FromProcessGroup(pg);
  std::vector<ParamToShard> to_shard;
  for (size_t i = 0; i < clones.size(); ++i) {
    to_shard.push_back({clones[i], {t.module.get(), std::to_string(i), {}, {}}});
  }
  t.group = std::make_shared<FsdpParamGroup>(
      std::move(to_shard), std::vector<nn::Module*>{t.module.get()}, mesh_info,
      fsdp2::GetPostForwardMeshInfo(reshard_after_forward, mesh_info), Device::CPU(),
      fsdp2::MixedPrecisionPolicy{}, fsdp2::OffloadPolicy{});
  t.group->lazy_init();
  return t;
}

// The seed's `all_gather` helper: foreach_all_gather + copy-out + register unsharded params.
void AllGather(FsdpParamGroup& group, const std::shared_ptr<distributed::ProcessGroup>& pg) {
  fsdp2::CommContext ctx;
  auto result = fsdp2::foreach_all_gather(group.fsdp_param_ptrs(), pg, /*async_op=*/false,
                                          ctx.all_gather_copy_in_stream(),
                                          ctx.all_gather_stream(), Device::CPU());
  fsdp2::foreach_all_gather_copy_out(*result, group.fsdp_param_ptrs(), pg);
  for (FsdpParam* p : group.fsdp_param_ptrs()) p->init_unsharded_param();
  group.to_unsharded();
}

TEST(FsdpCollectives, WorkedExampleAllGatherLayoutAndCopyOut) {
  // docs/fsdp-behaviour.md, "All-gather" (worked example): p0 [5,3], p1 [3], W = 4: L = 7;
  // rank k writes [p0 rows 2k, 2k+1 | p1 element k].
  auto results = RunRanks(4, [](RankEnv& env) {
    const Tensor p0 = Iota({5, 3});
    const Tensor p1 = Iota({3}, 100.0);
    TestGroup t = MakeGroup({p0, p1}, env.pg);
    const auto params = t.group->fsdp_param_ptrs();
    const int64_t rows[] = {2, 2, 1, 0};
    EXPECT_EQ(params[0]->sharded_param().sizes(), (Shape{rows[env.rank], 3}));
    EXPECT_EQ(params[1]->sharded_param().sizes(), (Shape{env.rank < 3 ? 1 : 0}));
    EXPECT_EQ(params[0]->sharded_param_data().numel(), 6);
    EXPECT_TRUE(t.module->parameter("0").is_same(params[0]->sharded_param()));

    fsdp2::CommContext ctx;
    auto result = fsdp2::foreach_all_gather(params, env.pg, false, ctx.all_gather_copy_in_stream(),
                                            ctx.all_gather_stream(), Device::CPU());
    std::vector<double> expected;
    for (int k = 0; k < 4; ++k) {
      for (int i = 0; i < 6; ++i) {
        const int e = 6 * k + i;
        expected.push_back(e < 15 ? e : 0.0);
      }
      expected.push_back(k < 3 ? 100.0 + k : 0.0);
    }
    EXPECT_EQ(result->all_gather_output.to_doubles(), expected);
    EXPECT_EQ(result->all_gather_input_split_sizes, (std::vector<int64_t>{6, 1}));

    fsdp2::foreach_all_gather_copy_out(*result, params, env.pg);
    EXPECT_EQ(params[0]->all_gather_outputs()[0].numel(), 24);
    EXPECT_EQ(params[1]->all_gather_outputs()[0].numel(), 4);
    for (FsdpParam* p : params) p->init_unsharded_param();
    t.group->to_unsharded();
    EXPECT_EQ(t.module->parameter("0").to_doubles(), p0.to_doubles());
    EXPECT_EQ(t.module->parameter("0").sizes(), (Shape{5, 3}));
    EXPECT_EQ(t.module->parameter("1").to_doubles(), p1.to_doubles());

    // Reshard frees the unsharded storage but keeps the unsharded parameter's identity.
    const Tensor unsharded = params[0]->unsharded_param();
    t.group->reshard();
    EXPECT_TRUE(t.module->parameter("0").is_same(params[0]->sharded_param()));
    EXPECT_FALSE(unsharded.has_storage());
    t.group->unshard();
    t.group->wait_for_unshard();
    EXPECT_TRUE(t.module->parameter("0").is_same(unsharded));
    EXPECT_EQ(unsharded.to_doubles(), p0.to_doubles());
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

TEST(FsdpCollectives, WorkedExampleReduceScatterLayoutAndViewOut) {
  // docs/fsdp-behaviour.md, "Reduce-scatter" (worked example): grads g0 [5,3], g1 [3], W = 4:
  // the RS input is [4, 7], row k = [g0 rows 2k..2k+1 |
  // g1 element k]; rank 2 gets g0 row 4 ([1,3]) and g1 element 2; rank 3 gets [0,3] and [0].
  auto results = RunRanks(4, [](RankEnv& env) {
    TestGroup t = MakeGroup({Iota({5, 3}), Iota({3})}, env.pg);
    const auto params = t.group->fsdp_param_ptrs();
    const double scale = env.rank + 1.0;  // mean over ranks: 2.5
    std::vector<Tensor> grads = {Scaled(Iota({5, 3}), scale), Scaled(Iota({3}, 100.0), scale)};
    fsdp2::ForeachReduceOptions options;
    options.orig_dtype = DType::kFloat32;
    options.device = Device::CPU();
    auto result = fsdp2::foreach_reduce(params, grads, env.pg, options);
    EXPECT_EQ(result.divide_factors.op, fsdp2::DivideFactors::Op::kAvg);
    std::vector<double> expected_input;
    for (int k = 0; k < 4; ++k) {
      for (int i = 0; i < 6; ++i) {
        const int e = 6 * k + i;
        expected_input.push_back(e < 15 ? e * scale : 0.0);
      }
      expected_input.push_back(k < 3 ? (100.0 + k) * scale : 0.0);
    }
    EXPECT_EQ(result.reduce_scatter_input.to_doubles(), expected_input);
    EXPECT_EQ(result.reduce_output.numel(), 7);
    const Tensor g0 = params[0]->sharded_param().grad();
    const Tensor g1 = params[1]->sharded_param().grad();
    ASSERT_TRUE(g0.defined() && g1.defined());
    std::vector<double> e0;
    for (int64_t row = 0; row < g0.size(0); ++row) {
      for (int c = 0; c < 3; ++c) e0.push_back((3 * (2 * env.rank + row) + c) * 2.5);
    }
    EXPECT_EQ(g0.sizes(), params[0]->sharded_param().sizes());
    EXPECT_EQ(g0.to_doubles(), e0);
    if (env.rank < 3) {
      EXPECT_EQ(g1.to_doubles(), (std::vector<double>{(100.0 + env.rank) * 2.5}));
    } else {
      EXPECT_EQ(g1.sizes(), (Shape{0}));
    }
    // The view-out advanced by the padded numel: g1 sits at offset 6 of the output.
    EXPECT_EQ(g1.storage_offset() - result.reduce_output.storage_offset(), 6);
    // A second reduction accumulates into the existing sharded grads.
    fsdp2::foreach_reduce(params, grads, env.pg, options);
    for (size_t i = 0; i < e0.size(); ++i) e0[i] *= 2;
    EXPECT_EQ(params[0]->sharded_param().grad().to_doubles(), e0);
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

TEST(FsdpCollectives, ChunkCatCopyInPadsEveryChunk) {
  // [2] over W = 3 (c = 1: rows 1, 1, 0) next to [1, 2] (c = 1: rows 1, 0, 0).
  const Tensor out = Tensor::zeros({9});
  fsdp2::foreach_reduce_scatter_copy_in({Iota({2}, 1.0), Iota({1, 2}, 10.0)}, out, 3);
  EXPECT_EQ(out.to_doubles(), (std::vector<double>{1, 10, 11, 2, 0, 0, 0, 0, 0}));
}

// Round trip of uneven shapes (empty shards included) at worlds 1..4: all-gather gives back
// the original; the reduce-scatter of rank-dependent grads gives the mean chunk.
class FsdpCollectivesWorld : public ::testing::TestWithParam<int> {};

TEST_P(FsdpCollectivesWorld, UnevenShapesRoundTripAndReduce) {
  const int world = GetParam();
  const std::vector<Shape> shapes = {{5, 3}, {6, 4}, {7}, {1, 8}, {2}, {3, 1, 2}};
  auto results = RunRanks(world, [&](RankEnv& env) {
    std::vector<Tensor> originals;
    for (size_t i = 0; i < shapes.size(); ++i) originals.push_back(Iota(shapes[i], 10.0 * i));
    TestGroup t = MakeGroup(originals, env.pg);
    for (size_t i = 0; i < shapes.size(); ++i) {
      const auto info = fsdp2::ComputeShardInfo(shapes[i], env.rank, world);
      EXPECT_EQ(t.group->fsdp_params()[i]->sharded_param().to_doubles(),
                originals[i].narrow(0, info.row_begin, info.rows).to_doubles());
      EXPECT_EQ(t.group->fsdp_params()[i]->full_tensor().to_doubles(), originals[i].to_doubles());
    }
    t.group->unshard();
    t.group->wait_for_unshard();
    for (size_t i = 0; i < shapes.size(); ++i) {
      EXPECT_EQ(t.module->parameter(std::to_string(i)).to_doubles(), originals[i].to_doubles());
    }
    std::vector<Tensor> grads;
    for (const Tensor& o : originals) grads.push_back(Scaled(o, env.rank + 1.0));
    fsdp2::ForeachReduceOptions options;
    options.device = Device::CPU();
    fsdp2::foreach_reduce(t.group->fsdp_param_ptrs(), grads, env.pg, options);
    const double mean_scale = (world + 1) / 2.0;
    for (size_t i = 0; i < shapes.size(); ++i) {
      auto expected = originals[i].to_doubles();
      for (double& x : expected) x *= mean_scale;
      const auto full = t.group->fsdp_params()[i]->full_grad().to_doubles();
      ASSERT_EQ(full.size(), expected.size());
      for (size_t j = 0; j < full.size(); ++j) EXPECT_NEAR(full[j], expected[j], 1e-4);
    }
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

INSTANTIATE_TEST_SUITE_P(Fsdp, FsdpCollectivesWorld, ::testing::Values(1, 2, 3, 4));

// ---- The seed's 128-rank tests ----------------------------------------------------------

std::vector<Shape> SeedParamSizes() {
  return {{17, 257}, {17}, {64, 312}, {64}, {64, 64}, {512, 64}, {256}, {64, 297}};
}

// `_init_params`: randn from one seed on every rank (the generator is per rank but seeded
// identically, which the seed's broadcast from rank 0 guarantees).
std::vector<Tensor> SeedParams() {
  std::vector<Tensor> params;
  for (const Shape& s : SeedParamSizes()) params.push_back(Tensor::randn(s));
  return params;
}

TEST(FsdpCollectives, Seed128RanksAllGatherPostForwardAndReduceScatter) {
  // test_all_gather_fp32 (reshard_after_forward = 8: the post-forward all-gather over 8-rank
  // groups reproduces the parameters) and test_reduce_scatter_fp32 / _fp16 (grads = ones *
  // rank; the sharded grad is the mean 63.5 everywhere; fp16: pre-divide 16, SUM,
  // post-divide 8), in one 128-rank run to keep the test fast.
  auto results = RunRanks(128, [&](RankEnv& env) {
    const std::vector<Tensor> orig = SeedParams();
    TestGroup t = MakeGroup(orig, env.pg, 8);
    for (size_t i = 0; i < orig.size(); ++i) {
      ASSERT_TRUE(t.module->parameter(std::to_string(i))
                      .is_same(t.group->fsdp_params()[i]->sharded_param()));
    }
    AllGather(*t.group, t.group->mesh_info().shard_process_group);
    for (size_t i = 0; i < orig.size(); ++i) {
      ASSERT_EQ(t.module->parameter(std::to_string(i)).to_doubles(), orig[i].to_doubles());
    }
    t.group->to_sharded_post_forward();
    ASSERT_EQ(t.group->post_forward_mesh_info()->shard_mesh_size, 8);
    AllGather(*t.group, t.group->post_forward_mesh_info()->shard_process_group);
    for (size_t i = 0; i < orig.size(); ++i) {
      ASSERT_EQ(t.module->parameter(std::to_string(i)).to_doubles(), orig[i].to_doubles());
    }
    t.group->to_sharded();

    for (DType reduce_dtype : {DType::kFloat32, DType::kFloat16}) {
      std::vector<Tensor> grads;
      for (const Shape& s : SeedParamSizes()) {
        grads.push_back(Tensor::full(s, static_cast<double>(env.rank)));
      }
      fsdp2::ForeachReduceOptions options;
      options.orig_dtype = DType::kFloat32;
      options.reduce_dtype = reduce_dtype;
      options.device = Device::CPU();
      auto result = fsdp2::foreach_reduce(t.group->fsdp_param_ptrs(), grads, env.pg, options);
      if (reduce_dtype == DType::kFloat16) {
        EXPECT_EQ(result.divide_factors.op, fsdp2::DivideFactors::Op::kSum);
        EXPECT_EQ(result.divide_factors.pre_divide, 16.0);
        EXPECT_EQ(result.divide_factors.post_divide, 8.0);
      } else {
        EXPECT_EQ(result.divide_factors.op, fsdp2::DivideFactors::Op::kAvg);
      }
      for (const auto& p : t.group->fsdp_params()) {
        Tensor sharded = p->sharded_param();
        const Tensor grad = sharded.grad();
        ASSERT_TRUE(grad.defined());
        ASSERT_EQ(grad.sizes(), sharded.sizes());
        ASSERT_EQ(grad.dtype(), DType::kFloat32);
        for (double v : grad.to_doubles()) ASSERT_EQ(v, 63.5);
        sharded.set_grad(Tensor());
      }
    }
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

}  // namespace
}  // namespace fsdp::fakes
