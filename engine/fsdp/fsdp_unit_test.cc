// Single-rank unit tests of the FSDP units that need no process group: state names, the
// observer contract's plumbing, reshard_after_forward validation, the reduce-scatter chunk-cat
// copy-in and FsdpParam's rejection of scalar parameters. Multi-rank behaviour is tested in
// engine/fsdp/fsdp_*_test.cc (on fakes::RunRanks).
#include <gtest/gtest.h>

#include "engine/fsdp/fsdp_collectives.h"
#include "engine/fsdp/fsdp_param.h"
#include "engine/fsdp/mesh_info.h"
#include "engine/fsdp/observer.h"
#include "engine/fsdp/training_state.h"
#include "engine/nn/layers.h"

namespace fsdp::fsdp2 {
namespace {

TEST(FsdpStateNames, PyTorchSpelling) {
  EXPECT_STREQ(TrainingStateName(TrainingState::kForward), "FORWARD");
  EXPECT_STREQ(TrainingStateName(TrainingState::kPreBackward), "PRE_BACKWARD");
  EXPECT_STREQ(TrainingStateName(TrainingState::kPostBackward), "POST_BACKWARD");
  EXPECT_STREQ(TrainingStateName(TrainingState::kIdle), "IDLE");
  EXPECT_STREQ(ShardedStateName(ShardedState::kShardedPostForward), "SHARDED_POST_FORWARD");
}

TEST(FsdpObserver, RecordsInstalledEventsInOrderAndFilters) {
  RecordingObserver observer;
  internal::NotifyObservers(EventKind::kUnshard, "x", TrainingState::kForward);  // none yet
  {
    ScopedObserver install(observer);
    internal::NotifyObservers(EventKind::kUnshard, "", TrainingState::kForward);
    internal::NotifyObservers(EventKind::kReshard, "layers.0", TrainingState::kForward);
    internal::NotifyObservers(EventKind::kPostBackward, "layers.0",
                              TrainingState::kPostBackward);
  }
  internal::NotifyObservers(EventKind::kUnshard, "y", TrainingState::kForward);  // removed
  ASSERT_EQ(observer.events().size(), 3u);
  const auto filtered = observer.events({EventKind::kUnshard, EventKind::kPostBackward});
  EXPECT_EQ(EventsStr(filtered),
            "[('unshard', '', FORWARD), ('post_backward', 'layers.0', POST_BACKWARD)]");
  observer.clear();
  EXPECT_TRUE(observer.events().empty());
}

TEST(FsdpPostForwardMesh, BoolsAndIntValidation) {
  FsdpMeshInfo info;
  info.shard_mesh_size = 4;
  EXPECT_TRUE(GetPostForwardMeshInfo(true, info).has_value());
  EXPECT_FALSE(GetPostForwardMeshInfo(false, info).has_value());
  EXPECT_FALSE(GetPostForwardMeshInfo(1, info).has_value());  // 1 means False
  EXPECT_TRUE(GetPostForwardMeshInfo(4, info).has_value());   // W means True
  for (int k : {0, 3, 5, -2}) {
    try {
      GetPostForwardMeshInfo(k, info);
      ADD_FAILURE() << k;
    } catch (const Error& e) {
      EXPECT_EQ(e.message(), "If passing reshard_after_forward as an int, it should be a factor "
                             "of 4, not " + std::to_string(k));
    }
  }
}

TEST(FsdpReduceScatterCopyIn, WorkedExampleRows) {
  // docs/fsdp-behaviour.md, "Reduce-scatter" (worked example): g0 [5,3], g1 [3] over W = 4 →
  // [4, 7]; rank 3's row is all padding.
  std::vector<double> g0(15), g1 = {100, 101, 102};
  for (int i = 0; i < 15; ++i) g0[i] = i;
  const Tensor out = Tensor::zeros({28}, DType::kFloat16);
  foreach_reduce_scatter_copy_in({Tensor::from_doubles(g0, {5, 3}), Tensor::from_doubles(g1, {3})},
                                 out, 4);
  const std::vector<double> v = out.to_doubles();
  EXPECT_EQ(std::vector<double>(v.begin() + 14, v.begin() + 21),
            (std::vector<double>{12, 13, 14, 0, 0, 0, 102}));
  EXPECT_EQ(std::vector<double>(v.begin() + 21, v.end()), std::vector<double>(7, 0.0));
}

TEST(FsdpParamUnit, RejectsScalarParametersWithPyTorchsMessage) {
  auto module = std::make_shared<nn::ParameterList>(std::vector<Tensor>{Tensor::ones({})});
  FsdpMeshInfo info;
  info.shard_mesh_size = 2;
  try {
    FsdpParam p(module->parameter("0"), {module.get(), "0", {}, {}}, info, std::nullopt,
                Device::CPU(), OffloadPolicy{});
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.message(), "fully_shard doesn't support salar parameters. Change 0 to a 1D tensor "
                           "with numel equal to 1.");
  }
}

TEST(FsdpParamUnit, ShardsPaddedAndRegistersTheShardedParameter) {
  // [5, 3] on rank 2 of 4: one row, padded to two; the module slot holds the sharded view.
  std::vector<double> v(15);
  for (int i = 0; i < 15; ++i) v[i] = i;
  auto module = std::make_shared<nn::ParameterList>(
      std::vector<Tensor>{Tensor::from_doubles(v, {5, 3})});
  FsdpMeshInfo info;
  info.shard_mesh_size = 4;
  info.shard_mesh_rank = 2;
  FsdpParam p(module->parameter("0"), {module.get(), "0", {}, {}}, info, std::nullopt,
              Device::CPU(), OffloadPolicy{});
  EXPECT_EQ(p.sharded_param().sizes(), (Shape{1, 3}));
  EXPECT_EQ(p.sharded_param().to_doubles(), (std::vector<double>{12, 13, 14}));
  EXPECT_EQ(p.sharded_param_data().to_doubles(), (std::vector<double>{12, 13, 14, 0, 0, 0}));
  EXPECT_TRUE(module->parameter("0").is_same(p.sharded_param()));
  EXPECT_TRUE(p.sharded_param().requires_grad());
  EXPECT_EQ(LookupFsdpParam(p.sharded_param()), &p);
  EXPECT_EQ(p.all_gather_inputs()[0].numel(), 6);
}

}  // namespace
}  // namespace fsdp::fsdp2
