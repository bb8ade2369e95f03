// The semantics profiles of fully_shard (engine/fsdp/semantics.h; docs/fsdp-behaviour.md,
// "Semantics profiles"): the profile names, and the root's reshard-after-forward rule under
// each profile, observed the way the seeds observe it (the root group's state after forward,
// CommDebugMode's backward all-gathers, the unshard events), on a Transformer with its blocks
// and the root sharded, over the threaded process group at world 4; and the reduce dtype of a
// MixedPrecisionPolicy without reduce_dtype under each profile (an MLP at world 2).
#include <gtest/gtest.h>

#include <cctype>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "engine/distributed/comm_debug_mode.h"
#include "engine/fsdp/fully_shard.h"
#include "engine/fsdp/observer.h"
#include "engine/fsdp/semantics.h"
#include "engine/functional/functional.h"
#include "engine/nn/models.h"
#include "fakes/run_ranks.h"

namespace fsdp::fakes {
namespace {

using distributed::CommDebugMode;
using fsdp2::EventKind;
using fsdp2::ReshardAfterForward;
using fsdp2::Semantics;
using fsdp2::ShardedState;
using fsdp2::TrainingState;

constexpr const char* kAllGather = "c10d._allgather_base_";
constexpr int64_t kBlocks = 2;
constexpr int kWorld = 4;

TEST(FsdpSemanticsNames, RoundTripAndUnknownNames) {
  const std::vector<std::string> names = fsdp2::SemanticsNames();
  ASSERT_EQ(names, (std::vector<std::string>{"torch-2.4", "torch-2.8", "torch-2.15"}));
  for (const std::string& name : names) {
    EXPECT_EQ(fsdp2::SemanticsName(fsdp2::ParseSemantics(name)), name);
  }
  EXPECT_EQ(fsdp2::SemanticsName(fsdp2::kDefaultSemantics), names.front());
  EXPECT_FALSE(fsdp2::FindSemantics("torch-2.6").has_value());
  try {
    fsdp2::ParseSemantics("torch-2.6");
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_EQ(e.message(),
              "unknown FSDP semantics 'torch-2.6'; known profiles: torch-2.4, torch-2.8, "
              "torch-2.15");
  }
}

struct RootCase {
  Semantics semantics;
  std::optional<ReshardAfterForward> raf;  // nullopt: None / unset
  // What the profile's rule says (docs/fsdp-behaviour.md, "Semantics profiles").
  bool root_reshards;
  bool blocks_reshard;
};

std::string Name(const RootCase& c) {
  std::string raf = "None";
  if (c.raf) {
    if (const bool* b = std::get_if<bool>(&*c.raf)) {
      raf = *b ? "True" : "False";
    } else {
      raf = "Int" + std::to_string(std::get<int>(*c.raf));
    }
  }
  std::string profile;  // "torch-2.15" -> "torch215"
  for (const char* p = fsdp2::SemanticsName(c.semantics); *p != '\0'; ++p) {
    if (std::isalnum(static_cast<unsigned char>(*p))) profile += *p;
  }
  return profile + "Raf" + raf;
}

std::string CaseName(const ::testing::TestParamInfo<RootCase>& info) { return Name(info.param); }

// GoogleTest prints parameters in failures.
void PrintTo(const RootCase& c, std::ostream* os) { *os << Name(c); }

std::shared_ptr<nn::Transformer> ShardedTransformer(Semantics semantics,
                                                    std::optional<ReshardAfterForward> raf) {
  nn::ModelArgs args;
  args.n_layers = kBlocks;
  auto model = std::make_shared<nn::Transformer>(args);
  fsdp2::FullyShardOptions options;
  options.semantics = semantics;
  options.reshard_after_forward = raf;
  for (const nn::ModulePtr& block : model->layers()) fsdp2::fully_shard(block, options);
  fsdp2::fully_shard(model, options);
  return model;
}

Tensor Tokens() {
  nn::ModelArgs args;
  return Tensor::randint(0, args.vocab_size, {2, args.max_seq_len});
}

class FsdpRootReshard : public ::testing::TestWithParam<RootCase> {};

TEST_P(FsdpRootReshard, AfterForwardAndInBackward) {
  const RootCase c = GetParam();
  auto results = RunRanks(kWorld, [&](RankEnv& env) {
    auto model = ShardedTransformer(c.semantics, c.raf);
    fsdp2::FSDPModule root(model);
    fsdp2::RecordingObserver observer;
    fsdp2::ScopedObserver install(observer);
    Tensor loss = (*model)(Tokens()).tensor();
    // After forward: a resharded root holds its sharded (or post-forward) parameters.
    EXPECT_EQ(root.param_group()->is_unsharded(), !c.root_reshards)
        << fsdp2::ShardedStateName(root.param_group()->sharded_state());
    // An int k with 1 < k < W reshards to the k-rank post-forward mesh (k == W means True).
    const bool post_forward_mesh =
        c.raf && std::holds_alternative<int>(*c.raf) && std::get<int>(*c.raf) < kWorld;
    if (c.root_reshards) {
      EXPECT_EQ(root.param_group()->sharded_state(),
                post_forward_mesh ? ShardedState::kShardedPostForward : ShardedState::kSharded);
    }
    for (const nn::ModulePtr& block : model->layers()) {
      EXPECT_EQ(fsdp2::FSDPModule(block).param_group()->is_unsharded(), !c.blocks_reshard);
    }
    observer.clear();
    CommDebugMode bwd_mode;
    sum(loss).backward();
    bwd_mode.exit();
    // Backward all-gathers exactly the groups resharded after forward.
    const int64_t expected =
        (c.blocks_reshard ? kBlocks : 0) + (c.root_reshards ? 1 : 0);
    EXPECT_EQ(bwd_mode.get_count(kAllGather), expected);
    // A resharded root unshards first in backward (its pre-backward runs first).
    const auto unshards = observer.events({EventKind::kUnshard});
    const bool root_unshard_first = !unshards.empty() && unshards.front().fqn.empty() &&
                                    unshards.front().state == TrainingState::kPreBackward;
    EXPECT_EQ(root_unshard_first, c.root_reshards) << fsdp2::EventsStr(unshards);
    EXPECT_TRUE(root.param_group()->is_sharded());  // post_backward resharded it
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

std::vector<RootCase> RootCases() {
  const Semantics v24 = Semantics::kTorch2_4;
  const Semantics v28 = Semantics::kTorch2_8;
  const Semantics v215 = Semantics::kTorch2_15;
  return {
      // torch-2.4: the root never reshards after forward; unset is the default True.
      {v24, std::nullopt, false, true},
      {v24, true, false, true},
      {v24, false, false, false},
      {v24, 2, false, true},
      // torch-2.8: None keeps the root unsharded; an explicit True or int > 1 reshards it.
      {v28, std::nullopt, false, true},
      {v28, true, true, true},
      {v28, false, false, false},
      {v28, 2, true, true},
      {v28, kWorld, true, true},  // int W means True
      {v28, 1, false, false},     // int 1 means False
      // torch-2.15 has torch-2.8's root rule.
      {v215, std::nullopt, false, true},
      {v215, true, true, true},
  };
}

INSTANTIATE_TEST_SUITE_P(Fsdp, FsdpRootReshard, ::testing::ValuesIn(RootCases()), CaseName);

TEST(FsdpRootReshardSetter, BeforeLazyInitTheSetterWinsOnlyUnderTorch28) {
  // set_reshard_after_forward(true) on a None root before its first forward marks the value as
  // the user's (torch-2.8: `_auto_reshard_after_forward = False`), so lazy init keeps it;
  // torch-2.4's lazy init keeps the root unsharded whatever was set.
  for (Semantics semantics : {Semantics::kTorch2_4, Semantics::kTorch2_8}) {
    auto results = RunRanks(kWorld, [&](RankEnv& env) {
      auto model = ShardedTransformer(semantics, std::nullopt);
      fsdp2::FSDPModule root(model);
      EXPECT_EQ(root.state().auto_reshard_after_forward(),
                fsdp2::HasReshardAfterForwardNone(semantics));
      root.set_reshard_after_forward(true, /*recurse=*/false);
      EXPECT_FALSE(root.state().auto_reshard_after_forward());
      Tensor loss = (*model)(Tokens()).tensor();
      EXPECT_EQ(root.param_group()->is_sharded(), semantics == Semantics::kTorch2_8)
          << fsdp2::SemanticsName(semantics);
      sum(loss).backward();
    });
    ASSERT_TRUE(results.all_ok()) << results.summary();
  }
}

TEST(FsdpRootReshardSetter, AfterLazyInitTheSetterReshardsTheRootUnderBothProfiles) {
  for (Semantics semantics : {Semantics::kTorch2_4, Semantics::kTorch2_8}) {
    auto results = RunRanks(kWorld, [&](RankEnv& env) {
      auto model = ShardedTransformer(semantics, true);
      fsdp2::FSDPModule root(model);
      sum((*model)(Tokens()).tensor()).backward();  // lazy init
      root.set_reshard_after_forward(true, /*recurse=*/false);
      Tensor loss = (*model)(Tokens()).tensor();
      EXPECT_TRUE(root.param_group()->is_sharded()) << fsdp2::SemanticsName(semantics);
      sum(loss).backward();
    });
    ASSERT_TRUE(results.all_ok()) << results.summary();
  }
}

// MixedPrecisionPolicy(param_dtype=bfloat16) on a float32 MLP at world 2: a backward without
// gradient sync, then a synced one. With reduce_dtype None, torch-2.4 and torch-2.8 keep the
// gradients in bfloat16 (accumulated by autograd) and reduce-scatter them in bfloat16;
// torch-2.15 upcasts them to float32 in the unsharded parameters' .grad to accumulate
// (KeepsUnshardedGradInReduceDtype) and reduce-scatters in float32
// (ReducesInParamDtypeWhenReduceDtypeUnset). An explicit reduce_dtype=bfloat16 reduces in
// bfloat16 under every profile. The sharded gradients are float32 either way.
TEST(FsdpReduceDtype, UnsetReduceDtypeFollowsTheProfile) {
  constexpr const char* kReduceScatter = "c10d._reduce_scatter_base_";
  constexpr int kMpWorld = 2;
  for (Semantics semantics : {Semantics::kTorch2_4, Semantics::kTorch2_8, Semantics::kTorch2_15}) {
    for (const std::optional<DType> reduce_dtype :
         {std::optional<DType>(), std::optional(DType::kBFloat16)}) {
      const bool in_param_dtype =
          reduce_dtype || fsdp2::ReducesInParamDtypeWhenReduceDtypeUnset(semantics);
      EXPECT_EQ(in_param_dtype, reduce_dtype || semantics != Semantics::kTorch2_15);
      const DType reduced = in_param_dtype ? DType::kBFloat16 : DType::kFloat32;
      const std::string what = std::string(fsdp2::SemanticsName(semantics)) +
                               (reduce_dtype ? " reduce_dtype=bfloat16" : " reduce_dtype=None");
      auto results = RunRanks(kMpWorld, [&](RankEnv& env) {
        auto model = std::make_shared<nn::MLP>(8);
        fsdp2::FullyShardOptions options;
        options.semantics = semantics;
        options.mp_policy.param_dtype = DType::kBFloat16;
        options.mp_policy.reduce_dtype = reduce_dtype;
        fsdp2::FSDPModule root = fsdp2::fully_shard(model, options);
        const Tensor input = Tensor::randn({2, 8});
        // Without sync: no reduce-scatter; the unsharded gradients wait in the reduce dtype.
        root.set_requires_gradient_sync(false);
        CommDebugMode no_sync;
        sum((*model)(input).tensor()).backward();
        no_sync.exit();
        EXPECT_EQ(no_sync.get_count(kReduceScatter), 0) << what;
        int64_t numel = 0;
        for (const auto& p : root.param_group()->fsdp_params()) {
          EXPECT_EQ(p->reduce_dtype().value_or(DType::kBFloat16), reduced) << what;
          const Tensor waiting = p->unsharded_accumulated_grad().defined()
                                     ? p->unsharded_accumulated_grad()
                                     : p->unsharded_grad();
          ASSERT_TRUE(waiting.defined()) << what << " " << p->fqn();
          EXPECT_EQ(waiting.dtype(), reduced) << what << " " << p->fqn();
          // A separate accumulator only when the reduce dtype is not the compute dtype and
          // the profile does not keep the gradient in .grad (KeepsUnshardedGradInReduceDtype).
          EXPECT_EQ(p->unsharded_accumulated_grad().defined(),
                    reduced != DType::kBFloat16 &&
                        !fsdp2::KeepsUnshardedGradInReduceDtype(semantics))
              << what << " " << p->fqn();
          numel += Numel(p->padded_sharded_size()) * kMpWorld;
        }
        // Synced: one reduce-scatter of every padded gradient in the reduce dtype.
        root.set_requires_gradient_sync(true);
        CommDebugMode synced;
        sum((*model)(input).tensor()).backward();
        synced.exit();
        EXPECT_EQ(synced.get_count(kReduceScatter), 1) << what;
        EXPECT_EQ(synced.get_comm_bytes()[kReduceScatter],
                  numel * static_cast<int64_t>(ElementSize(reduced)))
            << what;
        for (const auto& [name, p] : model->named_parameters()) {
          ASSERT_TRUE(p.grad().defined()) << what << " " << name;
          EXPECT_EQ(p.grad().dtype(), DType::kFloat32) << what << " " << name;
        }
      });
      ASSERT_TRUE(results.all_ok()) << what << "\n" << results.summary();
    }
  }
}

// A float32 MLP with an extra frozen float64 parameter that forward does not use, param_dtype
// bfloat16, at world 2: lazy init (the first
// forward) checks the frozen parameter's dtype under torch-2.4 and raises on every rank; the
// later profiles check only the parameters that require grad, and the model trains.
TEST(FsdpFrozenParamDtype, UniformDtypeChecksCoverFrozenParamsOnlyUnderTorch24) {
  for (Semantics semantics : {Semantics::kTorch2_4, Semantics::kTorch2_8, Semantics::kTorch2_15}) {
    const bool raises = fsdp2::DtypeChecksCoverFrozenParams(semantics);
    EXPECT_EQ(raises, semantics == Semantics::kTorch2_4);
    auto results = RunRanks(2, [&](RankEnv&) {
      auto model = std::make_shared<nn::MLP>(8);
      model->register_parameter("frozen", Tensor::zeros({4}, DType::kFloat64),
                                /*requires_grad=*/false);
      fsdp2::FullyShardOptions options;
      options.semantics = semantics;
      // param_dtype casts every floating parameter's all-gather input, the frozen one's too
      // (the engine all-gathers one dtype).
      options.mp_policy.param_dtype = DType::kBFloat16;
      fsdp2::fully_shard(model, options);
      const Tensor input = Tensor::randn({2, 8});
      if (raises) {
        try {
          (void)(*model)(input);
          ADD_FAILURE() << "no error under " << fsdp2::SemanticsName(semantics);
        } catch (const Error& e) {
          EXPECT_NE(e.message().find("FSDP expects uniform original parameter dtype"),
                    std::string::npos)
              << e.message();
        }
        return;
      }
      sum((*model)(input).tensor()).backward();
      EXPECT_FALSE(model->parameter("frozen").grad().defined());
      EXPECT_TRUE(model->get_submodule("in_proj")->parameter("weight").grad().defined());
    });
    ASSERT_TRUE(results.all_ok()) << fsdp2::SemanticsName(semantics) << "\n" << results.summary();
  }
}

}  // namespace
}  // namespace fsdp::fakes
