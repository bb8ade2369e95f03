// Family `fully_shard_autograd` (seed 002, test_fully_shard_autograd.py). So far:
//   post_acc_grad_hook_runs   TestFullyShardPostAccGradHookMultiThread.test_post_acc_grad_hook_runs
// Post-accumulate-grad hooks registered on the SHARDED parameters are called by FSDP itself
// after the reduce-scatter (autograd accumulates into the unsharded parameters), once per
// parameter per reduction (fsdp-semantics §6). Each rank reports how often every parameter's
// hook ran during one forward/backward; the judge expects exactly once for every parameter.
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "conformance/observations.h"
#include "conformance/scenario_registry.h"
#include "engine/autograd/variable.h"
#include "engine/core/rng.h"
#include "engine/fsdp/fully_shard.h"
#include "engine/nn/models.h"
#include "engine/ops/functional.h"

namespace fsdp::conformance {

namespace {

Scenario PostAccGradHookRuns() {
  Scenario s;
  s.info.name = "fully_shard_autograd/post_acc_grad_hook_runs";
  s.info.description =
      "MLP(dim) with in_proj, out_proj and the root sharded: every sharded parameter's "
      "post-accumulate-grad hook runs exactly once per backward";
  s.info.seed_test =
      "test_fully_shard_autograd.py::TestFullyShardPostAccGradHookMultiThread::"
      "test_post_acc_grad_hook_runs";
  s.info.params = {ParamSpec::SizeInt("dim", "MLP dim", 8),
                   ParamSpec::SizeInt("seed", "seed of the input batch", 0)};
  s.info.default_world = 2;
  s.info.min_world = 1;
  s.info.max_world = 8;
  s.info.backends = {kBackendThreaded, kBackendGloo};
  s.run_rank = [](RankEnv& env) {
    const int64_t dim = env.params.GetInt("dim");
    auto model = std::make_shared<nn::MLP>(dim);
    fsdp2::FullyShardOptions options;
    options.process_group = env.pg;
    for (const char* name : {"in_proj", "out_proj"}) fsdp2::fully_shard(model->child(name), options);
    fsdp2::fully_shard(model, options);
    std::map<std::string, int64_t> counts;
    std::vector<autograd::RemovableHandle> handles;
    for (const auto& [name, param] : model->named_parameters()) {
      counts[name] = 0;
      handles.push_back(autograd::register_post_accumulate_grad_hook(
          param, [&counts, name = name](const Tensor&) { ++counts[name]; }));
    }
    Generator generator(static_cast<uint64_t>(env.params.GetInt("seed")));
    const Tensor inp = Tensor::randn({2, dim}, DType::kFloat32, &generator);
    sum((*model)(inp).tensor()).backward();
    nlohmann::json obs;
    obs["hook_counts"] = counts;
    return obs;
  };
  s.judge = [](const CaseParams& params, int world, const std::vector<nlohmann::json>& per_rank,
               CheckList& checks) {
    // MLP's parameters, each managed by exactly one group (in_proj, out_proj; the root has
    // none left), each reduced once in this backward.
    nlohmann::json expected = nlohmann::json::object();
    for (const char* name : {"in_proj.weight", "in_proj.bias", "out_proj.weight", "out_proj.bias"}) {
      expected[name] = 1;
    }
    static_cast<void>(params);
    for (int r = 0; r < world; ++r) {
      checks.CheckEqual("rank " + std::to_string(r) + " hook calls per parameter", expected,
                        RankObservation(per_rank, r, "hook_counts"));
    }
  };
  return s;
}

}  // namespace

void RegisterFullyShardAutogradScenarios(ScenarioRegistry& registry) {
  registry.Add(PostAccGradHookRuns());
}

}  // namespace fsdp::conformance
