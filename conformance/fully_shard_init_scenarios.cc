// Family `fully_shard_init` (test_fully_shard_init.py): fully_shard used wrongly must fail with
// PyTorch's error, never go on with a half-initialised model.
//   double_lazy_init  TestFullyShardLazyInit.test_fully_shard_double_lazy_init: Sequential(MLP(8),
//                     MLP(8)) with fully_shard on 0.in_proj, 0.out_proj and the root; a forward
//                     through 0.in_proj first lazily initialises its state as a root, so the
//                     root's forward must raise "FSDP state has already been lazily initialized
//                     for 0.in_proj\nFSDP requires running forward through the root module
//                     first" (FSDPState._lazy_init). The test calls the private _lazy_init(); a
//                     forward through the child is the public way to the same state.
//   apply_twice       fully_shard applied to a module that already has it: _composable.contract
//                     raises "Each distinct composable distributed API can only be applied to a
//                     module once. fully_shard has already been applied to the following
//                     module".
//   uneven_shard_placement  fully_shard(MLP(5), shard_placement_fn=Shard(1) for every matrix):
//                     in_proj.weight [20, 5] has dim 1 = 5, which no world > 1 in {2, 3, 4}
//                     divides; FSDPParam._init_sharded_param raises NotImplementedError "FSDP
//                     does not support uneven sharding on dim 1" (torch 2.6+: shard_placement_fn).
// Every rank reports the message of the error it caught ("" when none) and the judge requires
// PyTorch's phrases in it.
//
// Stateless; thread-safe (run_rank builds its own module on every rank's thread).
#include <exception>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "conformance/scenario_registry.h"
#include "engine/core/error.h"
#include "engine/fsdp/fully_shard.h"
#include "engine/nn/init.h"
#include "engine/nn/layers.h"
#include "engine/nn/models.h"
#include "engine/tensor_parallel/placement.h"

namespace fsdp::conformance {

namespace {

constexpr const char* kError = "error";

// The MLP(8) pair of the test, parameters from ManualSeed(0) (their values play no part).
nn::ModulePtr MlpPair() {
  nn::ManualSeed(0);
  return std::make_shared<nn::Sequential>(
      std::vector<nn::ModulePtr>{std::make_shared<nn::MLP>(8), std::make_shared<nn::MLP>(8)});
}

fsdp2::FullyShardOptions OnWorld(RankEnv& env) {
  fsdp2::FullyShardOptions options;
  options.process_group = env.pg;
  return options;
}

// Runs `misuse`; the message of what it threw, "" when it returned.
std::string ErrorOf(const std::function<void()>& misuse) {
  try {
    misuse();
  } catch (const Error& e) {
    return e.message();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// A scenario whose ranks report the error `misuse` raised, judged to hold every phrase of
// `phrases` (PyTorch's message, split where it names a module by its repr).
Scenario MisuseScenario(const std::string& name, const std::string& description,
                        const std::string& seed_test, std::function<void(RankEnv&)> misuse,
                        std::vector<std::string> phrases, int min_world = 1) {
  Scenario s;
  s.info.name = "fully_shard_init/" + name;
  s.info.description = description;
  s.info.seed_test = seed_test;
  s.info.default_world = 2;
  s.info.min_world = min_world;
  s.info.max_world = 8;
  s.info.deterministic = true;
  s.info.observations.Add(ObservationKey::String(
      kError, "the message of the error the misuse raised on this rank (\"\" when none)"));
  s.run_rank = [misuse](RankEnv& env) {
    return nlohmann::json{{kError, ErrorOf([&] { misuse(env); })}};
  };
  s.judge = [phrases](const CaseParams&, int, const std::vector<nlohmann::json>& per_rank,
                      CheckList& checks) {
    for (size_t r = 0; r < per_rank.size(); ++r) {
      const std::string message = per_rank[r][kError].get<std::string>();
      const std::string who = "rank " + std::to_string(r) + " ";
      checks.CheckTrue(who + "raised", !message.empty(), "no error raised");
      for (const std::string& phrase : phrases) {
        checks.CheckTrue(who + "error says \"" + phrase + "\"",
                         message.find(phrase) != std::string::npos, "got: " + message);
      }
    }
  };
  return s;
}

Scenario DoubleLazyInit() {
  return MisuseScenario(
      "double_lazy_init",
      "Sequential(MLP(8), MLP(8)), fully_shard on 0.in_proj, 0.out_proj and the root; a forward "
      "through 0.in_proj before the root's: the root's forward raises that 0.in_proj was "
      "lazily initialised already",
      "test_fully_shard_init.py::TestFullyShardLazyInit::test_fully_shard_double_lazy_init",
      [](RankEnv& env) {
        nn::ModulePtr model = MlpPair();
        const fsdp2::FullyShardOptions options = OnWorld(env);
        fsdp2::fully_shard(model->get_submodule("0.in_proj"), options);
        fsdp2::fully_shard(model->get_submodule("0.out_proj"), options);
        fsdp2::fully_shard(model, options);
        model->to(env.device);
        const Tensor x = Tensor::zeros({2, 8}, DType::kFloat32, env.device);
        (void)(*model->get_submodule("0.in_proj"))(nn::Value(x));
        (void)(*model)(nn::Value(x));
      },
      {"FSDP state has already been lazily initialized for 0.in_proj",
       "FSDP requires running forward through the root module first"});
}

Scenario ApplyTwice() {
  return MisuseScenario(
      "apply_twice",
      "MLP(8) with fully_shard, then fully_shard on it again: raises that fully_shard was "
      "already applied to the module",
      "torch/distributed/_composable/contract.py (no test of its own): a composable API applied "
      "twice to one module",
      [](RankEnv& env) {
        nn::ManualSeed(0);
        auto model = std::make_shared<nn::MLP>(8);
        const fsdp2::FullyShardOptions options = OnWorld(env);
        fsdp2::fully_shard(model, options);
        fsdp2::fully_shard(model, options);
      },
      {"Each distinct composable distributed API can only be applied to a module once. "
       "fully_shard has already been applied to the following module"});
}

// MLP(5)'s in_proj.weight [20, 5] is the first parameter fully_shard shards: Shard(1) of its
// dim 1 (5) is uneven at every world from 2 to 4 (max_world stays at 8: 5 is prime).
Scenario UnevenShardPlacement() {
  return MisuseScenario(
      "uneven_shard_placement",
      "fully_shard(MLP(5), shard_placement_fn: Shard(1) for every 2-D parameter): in_proj.weight "
      "[20, 5] cannot be sharded evenly on dim 1, which FSDP2 does not support",
      "torch/distributed/fsdp/_fully_shard/_fsdp_param.py (FSDPParam._init_sharded_param's "
      "NotImplementedError; test_fully_shard_init.py's TestFullyShardShardPlacementFn shards "
      "even dims only)",
      [](RankEnv& env) {
        nn::ManualSeed(0);
        auto model = std::make_shared<nn::MLP>(5);
        fsdp2::FullyShardOptions options = OnWorld(env);
        options.shard_placement_fn =
            [](const Tensor& param) -> std::optional<tensor_parallel::Placement> {
          if (param.dim() == 2) return tensor_parallel::Placement::Shard(1);
          return std::nullopt;
        };
        fsdp2::fully_shard(model, options);
      },
      {"FSDP does not support uneven sharding on dim 1"}, /*min_world=*/2);
}

}  // namespace

void RegisterFullyShardInitScenarios(ScenarioRegistry& registry) {
  registry.Add(DoubleLazyInit());
  registry.Add(ApplyTwice());
  registry.Add(UnevenShardPlacement());
}

}  // namespace fsdp::conformance
