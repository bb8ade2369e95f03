// DeviceMesh on the threaded fake: init_device_mesh layout, per-dim groups, sub-meshes.
#include "engine/distributed/device_mesh.h"

#include <gtest/gtest.h>

#include "engine/distributed/comm_debug_mode.h"
#include "fakes/run_ranks.h"

namespace fsdp::fakes {
namespace {

using distributed::DeviceMesh;

TEST(DeviceMeshTest, TwoDimensionalLayoutMatchesInitDeviceMesh) {
  for (int world : {4, 8}) {
    auto results = RunRanks(world, [](RankEnv& env) {
      const int tp = 2;
      const int dp = env.world_size / tp;
      auto mesh = DeviceMesh::Init(env.pg, "cpu", {dp, tp}, {"dp", "tp"});
      const int r = env.rank;
      EXPECT_EQ(mesh->ndim(), 2);
      EXPECT_EQ(mesh->size(), env.world_size);
      EXPECT_EQ(*mesh->get_coordinate(), (std::vector<int64_t>{r / tp, r % tp}));
      EXPECT_EQ(mesh->get_local_rank("dp"), r / tp);
      EXPECT_EQ(mesh->get_local_rank(1), r % tp);
      // TP group: consecutive ranks; DP group: strided ranks.
      auto tp_group = mesh->get_group("tp");
      auto dp_group = mesh->get_group(0);
      EXPECT_EQ(tp_group->global_ranks(), (std::vector<int>{r / tp * tp, r / tp * tp + 1}));
      std::vector<int> dp_ranks;
      for (int i = 0; i < dp; ++i) dp_ranks.push_back(i * tp + r % tp);
      EXPECT_EQ(dp_group->global_ranks(), dp_ranks);
      EXPECT_EQ(tp_group->rank(), r % tp);
      EXPECT_EQ(dp_group->rank(), r / tp);
      // Collectives on both mesh groups.
      Tensor t = Tensor::full({1}, r, DType::kInt64);
      tp_group->all_reduce(t);
      EXPECT_EQ(t.item(), (r / tp * tp) * 2 + 1);
      Tensor d = Tensor::full({1}, r, DType::kInt64);
      dp_group->all_reduce(d);
      int64_t expected = 0;
      for (int q : dp_ranks) expected += q;
      EXPECT_EQ(d.item(), expected);
      // Sub-meshes reuse the groups.
      auto tp_mesh = (*mesh)["tp"];
      EXPECT_EQ(tp_mesh->ndim(), 1);
      EXPECT_EQ(tp_mesh->get_group(), tp_group);
      EXPECT_EQ(tp_mesh->mesh(), tp_group->global_ranks());
      EXPECT_EQ(tp_mesh->mesh_dim_names(), std::vector<std::string>{"tp"});
      EXPECT_EQ((*mesh)["dp"]->mesh(), dp_ranks);
      EXPECT_EQ(*(*mesh)["dp"]->get_coordinate(), std::vector<int64_t>{r / tp});
      // Reordered 2-D slice.
      auto swapped = mesh->slice({"tp", "dp"});
      EXPECT_EQ(swapped->shape(), (std::vector<int64_t>{tp, dp}));
      EXPECT_EQ(swapped->get_group("dp"), dp_group);
      EXPECT_EQ(mesh->mesh_tensor().sizes(), (Shape{dp, tp}));
      if (env.world_size == 4 && r == 0) {
        EXPECT_EQ(mesh->str(), "DeviceMesh('cpu', [[0, 1], [2, 3]], mesh_dim_names=('dp', 'tp'))");
      }
    });
    ASSERT_TRUE(results.all_ok()) << "world " << world << "\n" << results.summary();
  }
}

TEST(DeviceMeshTest, OneDimensionalMeshReusesTheWorldGroupWithoutCollectives) {
  auto results = RunRanks(3, [](RankEnv& env) {
    distributed::CommDebugMode mode;
    const uint64_t seq = env.pg->sequence_number();
    auto mesh = DeviceMesh::Init(env.pg, "cpu", {3});
    EXPECT_EQ(mesh->get_group(), env.pg);
    EXPECT_EQ(env.pg->sequence_number(), seq);
    EXPECT_EQ(mode.get_total_counts(), 0);
    EXPECT_THROW(mesh->get_group("dp"), Error);
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

TEST(DeviceMeshTest, ThreeDimensionalMeshAndArbitraryRankLayout) {
  auto results = RunRanks(8, [](RankEnv& env) {
    auto mesh = DeviceMesh::Init(env.pg, "cpu", {2, 2, 2}, {"pp", "dp", "tp"});
    const int r = env.rank;
    EXPECT_EQ(*mesh->get_coordinate(), (std::vector<int64_t>{r / 4, (r / 2) % 2, r % 2}));
    EXPECT_EQ(mesh->get_group("pp")->global_ranks(), (std::vector<int>{r % 4, r % 4 + 4}));
    auto dp_tp = mesh->slice({"dp", "tp"});
    EXPECT_EQ(dp_tp->mesh(),
              (std::vector<int>{r / 4 * 4, r / 4 * 4 + 1, r / 4 * 4 + 2, r / 4 * 4 + 3}));
    // A transposed layout: mesh [[0, 2], [1, 3]] over ranks 0..3 only (ranks 4..7 are not in
    // it but still take part in creating its groups).
    auto custom = DeviceMesh::Create(env.pg, "cpu", {2, 2}, {0, 2, 1, 3}, {"a", "b"});
    if (r < 4) {
      EXPECT_EQ(custom->get_group("b")->global_ranks(),
                (r % 2 == 0 ? std::vector<int>{0, 2} : std::vector<int>{1, 3}));
      Tensor t = Tensor::ones({1});
      custom->get_group("a")->all_reduce(t);
      EXPECT_EQ(t.item(), 2.0);
    } else {
      EXPECT_FALSE(custom->get_coordinate().has_value());
      EXPECT_EQ(custom->get_group("a"), nullptr);
    }
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

TEST(DeviceMeshTest, World128TwoDimensionalMesh) {
  auto results = RunRanks(128, [](RankEnv& env) {
    auto mesh = DeviceMesh::Init(env.pg, "cpu", {64, 2}, {"dp", "tp"});
    Tensor t = Tensor::full({1}, 1, DType::kBFloat16);
    mesh->get_group("dp")->all_reduce(t);
    EXPECT_EQ(t.item(), 64.0);
    Tensor u = Tensor::full({1}, env.rank, DType::kInt64);
    mesh->get_group("tp")->all_reduce(u);
    EXPECT_EQ(u.item(), (env.rank / 2 * 2) * 2 + 1);
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

TEST(DeviceMeshTest, InvalidMeshesAreRejected) {
  auto results = RunRanks(4, [](RankEnv& env) {
    EXPECT_THROW(DeviceMesh::Init(env.pg, "cpu", {3, 2}), Error);
    EXPECT_THROW(DeviceMesh::Init(env.pg, "cpu", {2, 2}, {"x", "x"}), Error);
    EXPECT_THROW(DeviceMesh::Init(env.pg, "cpu", {2, 2}, {"x"}), Error);
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

}  // namespace
}  // namespace fsdp::fakes
