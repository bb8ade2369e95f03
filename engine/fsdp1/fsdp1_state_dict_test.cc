// FSDP1 state dicts on the threaded fake (docs/fsdp1.md, "State dicts"): the state_dict_type
// scope and its config checks, FULL / SHARDED / LOCAL keys and values against an unwrapped
// copy of the model (every expectation derived from the copy and torch.chunk arithmetic), the
// rank0_only / offload_to_cpu config, buffer and parameter dtypes under mixed precision, and
// save -> zero -> load round trips checked with CheckFlatParamParity.
#include <gtest/gtest.h>

#include <algorithm>

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "engine/autograd/grad_mode.h"
#include "engine/distributed/device_mesh.h"
#include "engine/fsdp/shard_layout.h"
#include "engine/fsdp1/fully_sharded_data_parallel.h"
#include "engine/fsdp1/runtime_utils.h"
#include "engine/fsdp1/state_dict_type.h"
#include "engine/fsdp1/unshard_params.h"
#include "engine/nn/layers.h"
#include "engine/nn/models.h"
#include "engine/testing/fsdp1_parity.h"
#include "fakes/run_ranks.h"

namespace fsdp::fakes {
namespace {

using fsdp1::FullyShardedDataParallel;
using fsdp1::FullyShardedDataParallelOptions;
using fsdp1::ShardingStrategy;
using fsdp1::StateDictType;
using fsdp1::StateDictTypeScope;
using nn::TransformerWithSharedParams;

FullyShardedDataParallelOptions TransformerOptions(ShardingStrategy strategy, bool use_orig_params) {
  FullyShardedDataParallelOptions options;
  options.sharding_strategy = strategy;
  options.use_orig_params = use_orig_params;
  options.auto_wrap_policy = std::make_shared<fsdp1::ModuleWrapPolicy>(
      std::set<std::string>{"TransformerEncoderLayer", "TransformerDecoderLayer"});
  return options;
}

// The keys, sorted: FSDP re-registers a shared parameter (a tied weight) after its module's
// other parameters while it is unsharded, so the set, not the order, equals the plain model's
// (PyTorch compares `state_dict.keys()` views, which are set-like).
std::vector<std::string> Keys(const nn::StateDict& sd) {
  std::vector<std::string> keys = sd.keys();
  std::sort(keys.begin(), keys.end());
  return keys;
}

// "" when equal, else the first difference.
std::string KeysDiff(const std::vector<std::string>& got, const std::vector<std::string>& want) {
  for (size_t i = 0; i < std::max(got.size(), want.size()); ++i) {
    const std::string g = i < got.size() ? got[i] : "<none>";
    const std::string w = i < want.size() ? want[i] : "<none>";
    if (g != w) return "key " + std::to_string(i) + ": got '" + g + "', want '" + w + "'";
  }
  return "";
}

// Zeroes every parameter (through summon_full_params) and floating buffer of an FSDP model.
void ZeroModel(const nn::ModulePtr& fsdp_model) {
  fsdp1::SummonFullParams summon(fsdp_model);
  autograd::NoGradGuard no_grad;
  for (Tensor p : fsdp_model->parameters()) p.zero_();
  for (Tensor b : fsdp_model->buffers()) {
    if (IsFloatingPoint(b.dtype())) b.zero_();
  }
}

// copy.deepcopy(state_dict): FULL dicts share the live buffers' storage (as PyTorch's).
nn::StateDict DeepCopy(const nn::StateDict& sd) {
  nn::StateDict out = sd;
  for (auto& [key, value] : out) value = value.clone();
  return out;
}

fsdp2::ParityOptions ParamsOnly() {
  fsdp2::ParityOptions options;
  options.check_grads = false;
  return options;
}

TEST(Fsdp1StateDictType, ScopeRestoresThePreviousTypeAndChecksTheConfigClass) {
  auto results = RunRanks(2, [](RankEnv&) {
    auto fsdp_model = std::make_shared<FullyShardedDataParallel>(
        std::make_shared<TransformerWithSharedParams>(0, false, true),
        TransformerOptions(ShardingStrategy::kFullShard, false));
    const auto instances = FullyShardedDataParallel::fsdp_modules(fsdp_model);
    ASSERT_GT(instances.size(), 1u);
    {
      StateDictTypeScope scope(fsdp_model, StateDictType::kLocalStateDict);
      for (const auto* state : instances) {
        EXPECT_EQ(state->state_dict_type, StateDictType::kLocalStateDict);
        EXPECT_TRUE(std::holds_alternative<fsdp1::LocalStateDictConfig>(state->state_dict_config));
      }
      {
        StateDictTypeScope inner(fsdp_model, StateDictType::kShardedStateDict,
                                 fsdp1::ShardedStateDictConfig{.offload_to_cpu = true});
        EXPECT_TRUE(std::get<fsdp1::ShardedStateDictConfig>(
                        fsdp1::GetStateDictType(*fsdp_model).state_dict_config)
                        .offload_to_cpu);
      }
      EXPECT_EQ(fsdp1::GetStateDictType(*fsdp_model).state_dict_type,
                StateDictType::kLocalStateDict);
    }
    for (const auto* state : instances) {
      EXPECT_EQ(state->state_dict_type, StateDictType::kFullStateDict);
    }
    try {
      StateDictTypeScope scope(fsdp_model, StateDictType::kFullStateDict,
                               fsdp1::LocalStateDictConfig{});
      ADD_FAILURE() << "a LocalStateDictConfig for FULL_STATE_DICT was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.message(),
                "Expected state_dict_config of type FullStateDictConfig but got "
                "LocalStateDictConfig");
    }
    // The failed call changed nothing.
    EXPECT_EQ(fsdp1::GetStateDictType(*fsdp_model).state_dict_type, StateDictType::kFullStateDict);
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

// FULL and SHARDED keys are the unwrapped model's, values its tensors (SHARDED: this rank's
// torch.chunk dim-0 piece); LOCAL has one `_flat_param` per instance.
TEST(Fsdp1StateDict, KeysAndValuesAgainstTheUnwrappedModel) {
  for (int world : {2, 3}) {
    for (ShardingStrategy strategy : {ShardingStrategy::kFullShard, ShardingStrategy::kNoShard}) {
      for (bool use_orig_params : {false, true}) {
        auto results = RunRanks(world, [&](RankEnv& env) {
          auto model = std::make_shared<TransformerWithSharedParams>(0, false, true);
          nn::ModulePtr ref = model->deep_copy();
          const nn::StateDict ref_sd = ref->state_dict();
          auto fsdp_model = std::make_shared<FullyShardedDataParallel>(
              model, TransformerOptions(strategy, use_orig_params));
          nn::StateDict full;
          {
            StateDictTypeScope scope(fsdp_model, StateDictType::kFullStateDict);
            full = fsdp_model->state_dict();
          }
          ASSERT_EQ(KeysDiff(Keys(full), Keys(ref_sd)), "");
          for (const auto& [key, value] : ref_sd) {
            EXPECT_EQ(full.at(key).to_doubles(), value.to_doubles()) << key;
            EXPECT_EQ(full.sharding(key), nullptr) << key;
          }
          nn::StateDict sharded;
          {
            StateDictTypeScope scope(fsdp_model, StateDictType::kShardedStateDict);
            sharded = fsdp_model->state_dict();
          }
          ASSERT_EQ(KeysDiff(Keys(sharded), Keys(ref_sd)), "");
          const std::set<std::string> param_keys = [&] {
            std::set<std::string> out;
            for (const auto& [name, p] : ref->named_parameters("", true, false)) out.insert(name);
            return out;
          }();
          for (const auto& [key, value] : ref_sd) {
            const nn::ShardedEntry* entry = sharded.sharding(key);
            if (strategy == ShardingStrategy::kNoShard || !param_keys.count(key)) {
              // NO_SHARD saves a full dict; buffers are never sharded.
              EXPECT_EQ(entry, nullptr) << key;
              EXPECT_EQ(sharded.at(key).to_doubles(), value.to_doubles()) << key;
              continue;
            }
            ASSERT_NE(entry, nullptr) << key;
            const fsdp2::ShardInfo info = fsdp2::ComputeShardInfo(value.sizes(), env.rank, world);
            EXPECT_EQ(entry->global_shape, value.sizes()) << key;
            EXPECT_EQ(entry->offsets[0], info.row_begin) << key;
            EXPECT_EQ(sharded.at(key).sizes(), info.sharded_shape) << key;
            EXPECT_EQ(sharded.at(key).to_doubles(),
                      value.narrow(0, info.row_begin, info.rows).to_doubles())
                << key;
          }
          if (use_orig_params) return;  // LOCAL needs flat parameters
          nn::StateDict local;
          {
            StateDictTypeScope scope(fsdp_model, StateDictType::kLocalStateDict);
            local = fsdp_model->state_dict();
          }
          if (strategy == ShardingStrategy::kNoShard) {
            EXPECT_EQ(KeysDiff(Keys(local), Keys(ref_sd)), "");
            return;
          }
          for (const auto* state : FullyShardedDataParallel::fsdp_modules(fsdp_model)) {
            const std::string key = state->fqn.empty() ? "_flat_param" : state->fqn + "._flat_param";
            ASSERT_TRUE(local.contains(key)) << key;
            const fsdp1::FlatParamHandle& handle = *state->handle;
            const nn::ShardedEntry* entry = local.sharding(key);
            ASSERT_NE(entry, nullptr) << key;
            EXPECT_EQ(entry->global_shape, Shape{handle.unpadded_unsharded_numel()});
            EXPECT_EQ(entry->offsets, std::vector<int64_t>{handle.sharded_numel() * env.rank});
            EXPECT_EQ(local.at(key).numel(), handle.sharded_numel() - handle.shard_numel_padded());
            EXPECT_EQ(local.at(key).to_doubles(),
                      handle.local_shard().narrow(0, 0, local.at(key).numel()).to_doubles());
          }
        });
        ASSERT_TRUE(results.all_ok()) << "world " << world << " "
                                      << fsdp1::ShardingStrategyName(strategy) << " "
                                      << use_orig_params << "\n" << results.summary();
      }
    }
  }
}

// Saving, zeroing and loading each type restores the model (checked against the unwrapped
// copy); with rank0_only + offload_to_cpu only rank 0 returns entries, on the CPU.
TEST(Fsdp1StateDict, SaveZeroLoadRoundTrips) {
  for (StateDictType type : {StateDictType::kFullStateDict, StateDictType::kShardedStateDict,
                             StateDictType::kLocalStateDict}) {
    for (bool use_orig_params : {false, true}) {
      if (type == StateDictType::kLocalStateDict && use_orig_params) continue;
      auto results = RunRanks(3, [&](RankEnv& env) {
        auto model = std::make_shared<TransformerWithSharedParams>(0, false, true);
        nn::ModulePtr ref = model->deep_copy();
        auto fsdp_model = std::make_shared<FullyShardedDataParallel>(
            model, TransformerOptions(ShardingStrategy::kFullShard, use_orig_params));
        nn::StateDict sd;
        {
          StateDictTypeScope scope(fsdp_model, type);
          sd = DeepCopy(fsdp_model->state_dict());
        }
        ZeroModel(fsdp_model);
        EXPECT_FALSE(fsdp1::CheckFlatParamParity(*fsdp_model, *ref, ParamsOnly()).empty());
        {
          StateDictTypeScope scope(fsdp_model, type);
          const nn::IncompatibleKeys keys = fsdp_model->load_state_dict(sd);
          EXPECT_TRUE(keys.missing_keys.empty());
          EXPECT_TRUE(keys.unexpected_keys.empty());
        }
        const std::string parity = fsdp1::CheckFlatParamParity(*fsdp_model, *ref, ParamsOnly());
        EXPECT_TRUE(parity.empty()) << parity;
        EXPECT_EQ(fsdp_model->get_buffer("_fsdp_wrapped_module.vocab_bias").to_doubles(),
                  ref->buffer("vocab_bias").to_doubles());
        // rank0_only + offload_to_cpu (FULL only).
        if (type != StateDictType::kFullStateDict) return;
        nn::StateDict rank0;
        {
          StateDictTypeScope scope(fsdp_model, type,
                                   fsdp1::FullStateDictConfig{.offload_to_cpu = true,
                                                              .rank0_only = true});
          rank0 = fsdp_model->state_dict();
        }
        if (env.rank != 0) {
          EXPECT_TRUE(rank0.empty()) << rank0.size() << " keys, first " << rank0.keys()[0];
          return;
        }
        const nn::StateDict ref_sd = ref->state_dict();
        ASSERT_EQ(KeysDiff(Keys(rank0), Keys(ref_sd)), "");
        for (const auto& [key, value] : rank0) {
          EXPECT_TRUE(value.device().is_cpu()) << key;
          EXPECT_EQ(value.to_doubles(), ref_sd.at(key).to_doubles()) << key;
        }
      });
      ASSERT_TRUE(results.all_ok()) << fsdp1::StateDictTypeName(type) << " " << use_orig_params
                                    << "\n" << results.summary();
    }
  }
}

// Under mixed precision (float16 parameters and buffers) FULL values are float32, equal to
// the full-precision parameters; a FULL dict is a copy (later training does not change it).
TEST(Fsdp1StateDict, FullPrecisionValuesUnderMixedPrecision) {
  auto results = RunRanks(2, [](RankEnv&) {
    auto seq = std::make_shared<nn::Sequential>();
    seq->append(std::make_shared<nn::Linear>(10, 10, false));
    seq->append(std::make_shared<nn::BatchNorm1d>(10));
    nn::ModulePtr ref = seq->deep_copy();
    FullyShardedDataParallelOptions options;
    options.mixed_precision.param_dtype = DType::kFloat16;
    options.mixed_precision.buffer_dtype = DType::kFloat16;
    auto fsdp_model = std::make_shared<FullyShardedDataParallel>(seq, options);
    fsdp_model->check_is_root();  // lazy init casts the buffers to float16
    const nn::StateDict sd = fsdp_model->state_dict();
    const nn::StateDict ref_sd = ref->state_dict();
    ASSERT_EQ(KeysDiff(Keys(sd), Keys(ref_sd)), "");
    for (const auto& [key, value] : sd) {
      EXPECT_EQ(value.dtype(), ref_sd.at(key).dtype()) << key;
      EXPECT_EQ(value.to_doubles(), ref_sd.at(key).to_doubles()) << key;
    }
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

// strict=False reports missing and unexpected keys without "_fsdp_wrapped_module.".
TEST(Fsdp1StateDict, MissingAndUnexpectedKeysAreClean) {
  auto results = RunRanks(2, [](RankEnv&) {
    auto fsdp_model = std::make_shared<FullyShardedDataParallel>(
        std::make_shared<TransformerWithSharedParams>(0, false, true),
        TransformerOptions(ShardingStrategy::kFullShard, false));
    nn::StateDict sd = fsdp_model->state_dict();
    const std::string removed = sd.keys().back();
    sd.erase(removed);
    sd.insert("unexpected", Tensor::ones({1}));
    const nn::IncompatibleKeys keys = fsdp_model->load_state_dict(sd, /*strict=*/false);
    EXPECT_EQ(keys.missing_keys, std::vector<std::string>{removed});
    EXPECT_EQ(keys.unexpected_keys, std::vector<std::string>{"unexpected"});
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

// A LOCAL piece of the wrong size names the key, the rank and the expected shard.
TEST(Fsdp1StateDict, LocalLoadRejectsAPieceOfAnotherWorld) {
  auto results = RunRanks(2, [](RankEnv&) {
    auto fsdp_model = std::make_shared<FullyShardedDataParallel>(
        std::make_shared<nn::Linear>(10, 10, false));
    StateDictTypeScope scope(fsdp_model, StateDictType::kLocalStateDict);
    nn::StateDict sd = fsdp_model->state_dict();
    sd.insert("_flat_param", Tensor::zeros({7}));
    sd.sharded.erase("_flat_param");
    try {
      fsdp_model->load_state_dict(sd);
      ADD_FAILURE() << "a 7-element local shard was accepted";
    } catch (const Error& e) {
      EXPECT_NE(e.message().find("'_flat_param'"), std::string::npos) << e.message();
      EXPECT_NE(e.message().find("50 elements"), std::string::npos) << e.message();
    }
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

// Given a device mesh, SHARDED saves DTensor-style pieces (use_dtensor set, the same values)
// and LOCAL is refused with PyTorch's message.
TEST(Fsdp1StateDict, DeviceMeshMeansDtensorPiecesAndNoLocal) {
  auto results = RunRanks(2, [](RankEnv& env) {
    auto model = std::make_shared<nn::Linear>(5, 3, false);
    const Tensor weight = model->parameter("weight").detach().clone();
    FullyShardedDataParallelOptions options;
    options.device_mesh = distributed::DeviceMesh::Init(env.pg, "cpu", {2}, {"shard"});
    auto fsdp_model = std::make_shared<FullyShardedDataParallel>(model, options);
    {
      StateDictTypeScope scope(fsdp_model, StateDictType::kShardedStateDict);
      const nn::StateDict sd = fsdp_model->state_dict();
      EXPECT_TRUE(std::get<fsdp1::ShardedStateDictConfig>(fsdp_model->state_dict_config).use_dtensor);
      const fsdp2::ShardInfo info = fsdp2::ComputeShardInfo(weight.sizes(), env.rank, 2);
      EXPECT_EQ(sd.at("weight").to_doubles(),
                weight.narrow(0, info.row_begin, info.rows).to_doubles());
    }
    StateDictTypeScope scope(fsdp_model, StateDictType::kLocalStateDict);
    try {
      fsdp_model->state_dict();
      ADD_FAILURE() << "LOCAL_STATE_DICT with a device mesh was accepted";
    } catch (const Error& e) {
      EXPECT_NE(e.message().find("DeviceMesh is not compatible with LOCAL_STATE_DICT"),
                std::string::npos)
          << e.message();
    }
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

}  // namespace
}  // namespace fsdp::fakes
