// Family `fully_shard_autograd` (seed 002, test_fully_shard_autograd.py):
//   unused_forward_output            TestFullyShardAutograd.test_unused_forward_output
//   unused_forward_module            TestFullyShardAutograd.test_unused_forward_module
//   nontensor_activations            TestFullyShardAutograd.test_nontensor_activations
//   post_acc_grad_hook_runs          TestFullyShardPostAccGradHookMultiThread.test_post_acc_grad_hook_runs
//   post_acc_grad_hook_optim_parity  TestFullyShardPostAccGradHookMultiProcess.test_post_acc_grad_hook_optim_parity
//
// The first three train a sharded model against the oracle (conformance/sharded_parity.h)
// where the seeds train against a replicated copy and call check_sharded_parity: every rank's
// loss, parameter shards and gradient shards at every step, with the seeds' sharding, Adam
// (lr 1e-2), 10 iterations and set_to_none alternating.
//
// Post-accumulate-grad hooks registered on the SHARDED parameters are called by FSDP itself
// after the reduce-scatter (autograd accumulates into the unsharded parameters), once per
// parameter per reduction (docs/fsdp-behaviour.md, "Post-accumulate-grad hooks"):
// post_acc_grad_hook_runs reports every hook call (the parameter's FQN, in call order) and the
// judge counts them; post_acc_grad_hook_optim_parity runs a per-parameter AdamW + StepLR
// inside the hooks and a normal optimizer loop on a copy, reports both models' losses and
// local parameter shards after every iteration, and the judge requires them bit-identical.
#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "conformance/fsdp_params.h"
#include "conformance/model_zoo.h"
#include "conformance/observations.h"
#include "conformance/parity_common.h"
#include "conformance/rank_checks.h"
#include "conformance/scenario_registry.h"
#include "conformance/transformer_inputs.h"
#include "conformance/sharded_parity.h"
#include "engine/autograd/variable.h"
#include "engine/core/rng.h"
#include "engine/fsdp/fully_shard.h"
#include "engine/functional/functional.h"
#include "engine/nn/init.h"
#include "engine/nn/models.h"
#include "engine/optim/adam.h"
#include "engine/optim/lr_scheduler.h"

namespace fsdp::conformance {

namespace {

constexpr const char* kSeed002 = "test_fully_shard_autograd.py::TestFullyShardAutograd::";

// A sharded-parity scenario of zoo model `kind` under `plan`, with the seeds' Adam, the given
// overrides of the kind's parameters and `extra_default_runs` (the later profile's).
Scenario ShardedTraining(const std::string& test, const std::string& description,
                         const std::string& kind, ShardPlan plan,
                         const std::vector<ParamSpec>& overrides,
                         std::vector<TestRun> extra_default_runs = {}) {
  Scenario s;
  s.info.name = "fully_shard_autograd/" + test;
  s.info.description = description;
  s.info.seed_test = std::string(kSeed002) + "test_" + test;
  // float64 by default: against a float64 oracle, Adam (lr 1e-2) turns float32 rounding of
  // nearly cancelling gradients into parameter differences that grow with the world size
  // (measured 2.2e-5 vs atol 1e-5 for nontensor_activations at world 8, while float64 agrees
  // to 5e-14); float32 runs with --param dtype=float32 and its atol/rtol.
  std::vector<ParamSpec> params = ParityParams(
      ZooModel::Kind(kind),
      ParamSpec::SizeString("dtype", "the engine's parameter and input dtype", "float64"));
  params = OverrideParam(
      std::move(params),
      ParamSpec::SizeString("optim", "optimizer (the seed's Adam, lr adam_lr)", "adam"));
  for (const ParamSpec& spec : overrides) {
    bool known = false;
    for (const ParamSpec& p : params) known = known || p.name == spec.name;
    if (known) {
      params = OverrideParam(std::move(params), spec);
    } else {
      params.push_back(spec);
    }
  }
  params.push_back(SemanticsParam());
  s.info.params = std::move(params);
  s.info.observations = ShardedParitySchema();
  s.info.deterministic = true;
  s.info.default_world = 4;  // min(4, gpus)
  s.info.min_world = 1;
  s.info.max_world = 8;
  s.info.extra_default_runs = std::move(extra_default_runs);
  s.skip = [](const CaseParams& p, int world) -> std::optional<std::string> {
    if (!p.has("reshard_after_forward")) return std::nullopt;
    return SkipIntNotAFactor(p, world);
  };
  s.info.inputs = ZooInputsDoc(ZooModel::Kind(kind), "the case's dtype");
  s.inputs = ParityInputs(kind);
  s.expect = [kind](const CaseParams& p, int world) { return ExpectShardedParity(kind, p, world); };
  s.run_rank = [kind, plan = std::move(plan)](RankEnv& env) {
    return RunShardedParityRank(kind, plan, env);
  };
  s.judge = [kind](const CaseParams& p, int world, const std::vector<nlohmann::json>& per_rank,
                   CheckList& checks) { JudgeShardedParity(kind, p, world, per_rank, checks); };
  return s;
}

Scenario UnusedForwardOutput() {
  // Beyond the seed: from loss_switch_step on the loss reads out2 only (lin2, in the root's
  // group), so only the hook on the root's second output sees a gradient; under torch-2.8 with
  // an explicit True the root was resharded after forward and must be unsharded by it.
  std::vector<TestRun> runs = LaterProfileRuns(4, {{"reshard_after_forward", "True"}});
  std::map<std::string, std::string> second = LaterProfile();
  second["reshard_after_forward"] = "True";
  second["switched_output"] = "1";
  runs.push_back({4, second});
  return ShardedTraining(
      "unused_forward_output",
      "DoubleLinear(dim, use_second_linear=True) with lin1 and the root sharded; loss "
      "(out1 * out2).sum() before loss_switch_step, then out1.sum() (lin2 gets no gradient; "
      "an extra default run reads out2 instead, lin1 getting none): "
      "losses, parameter and gradient shards vs the oracle at every step",
      "double_linear", ShardSubmodulesThenRoot({"lin1"}),
      {ParamSpec::SizeBool("use_second_linear", "DoubleLinear use_second_linear", true),
       ReshardAfterForwardAxis()},
      std::move(runs));
}

Scenario UnusedForwardModule() {
  return ShardedTraining(
      "unused_forward_module",
      "DoubleLinear(dim, use_second_linear=False) with lin1, lin2 and the root sharded; lin2 "
      "never runs forward (its group is never unsharded, its gradients stay None): losses, "
      "parameter and gradient shards vs the oracle at every step",
      "double_linear", ShardSubmodulesThenRoot({"lin1", "lin2"}),
      {ParamSpec::SizeBool("use_second_linear", "DoubleLinear use_second_linear", false),
       ReshardAfterForwardAxis()},
      LaterProfileRuns(4, {{"reshard_after_forward", "True"}}));
}

Scenario NontensorActivations() {
  return ShardedTraining(
      "nontensor_activations",
      "Sequential(ToContainerType, Module(dim) x3, FromContainerType), every element and the "
      "root sharded: activations travel in a list, named tuple, tuple or dict, and the "
      "pre-backward hooks still find them; losses, parameter and gradient shards vs the oracle",
      "nontensor_activations", ShardEveryChildThenRoot, {});
}

Scenario PostAccGradHookRuns() {
  Scenario s;
  s.info.name = "fully_shard_autograd/post_acc_grad_hook_runs";
  s.info.description =
      "MLP(dim) with in_proj, out_proj and the root sharded: every sharded parameter's "
      "post-accumulate-grad hook runs exactly once per backward, also in a backward that "
      "accumulates into the gradient of an earlier one (backwards before any step)";
  s.info.seed_test =
      "test_fully_shard_autograd.py::TestFullyShardPostAccGradHookMultiThread::"
      "test_post_acc_grad_hook_runs";
  s.info.params = {ParamSpec::SizeInt("dim", "MLP dim", 8, /*minimum=*/1),
                   ParamSpec::SizeInt("seed", "seed of the weights and the input batch", 0),
                   ParamSpec::SizeInt("backwards",
                                      "model(inp).sum().backward() calls without a step or "
                                      "zero_grad in between (after the first, FSDP adds to the "
                                      "sharded gradients)",
                                      2, /*minimum=*/1),
                   SemanticsParam()};
  s.info.inputs.weights = "every key of MLP(dim).state_dict() (in_proj, out_proj), float32";
  s.info.inputs.rank_tensors = {
      {"step0/input", "float32", "[2, dim]", "the input batch (the same on every rank)"}};
  s.inputs = [](const CaseParams& params, int world) {
    const int64_t dim = params.GetInt("dim");
    const auto seed = static_cast<uint64_t>(params.GetInt("seed"));
    nn::ManualSeed(seed);
    nn::MLP model(dim);
    CaseInputs inputs;
    inputs.weights = WeightsOf(model);
    Generator generator(seed);
    inputs.ranks.assign(static_cast<size_t>(world),
                        {{StepInputName(0), Tensor::randn({2, dim}, DType::kFloat32, &generator)}});
    return inputs;
  };
  s.info.default_world = 2;
  s.info.min_world = 1;
  s.info.max_world = 8;
  s.info.requirements.devices = {DeviceType::kCPU};
  s.info.observations.Add(ObservationKey::StringList(
      "hook_calls",
      "one entry per call of a post-accumulate-grad hook during the `backwards` calls of "
      "model(inp).sum().backward(), in call order: the named_parameters() FQN of the parameter it "
      "was registered on (one hook "
      "per parameter, registered after fully_shard, i.e. on the sharded parameters)"));
  s.run_rank = [](RankEnv& env) {
    const int64_t dim = env.params.GetInt("dim");
    auto model = std::make_shared<nn::MLP>(dim);
    model->load_state_dict(env.Inputs().weights());
    fsdp2::FullyShardOptions options;
    options.process_group = env.pg;
    options.semantics = SemanticsOf(env.params);
    for (const char* name : {"in_proj", "out_proj"}) fsdp2::fully_shard(model->child(name), options);
    fsdp2::fully_shard(model, options);
    std::vector<std::string> calls;
    std::vector<autograd::RemovableHandle> handles;
    for (const auto& [name, param] : model->named_parameters()) {
      handles.push_back(autograd::register_post_accumulate_grad_hook(
          param, [&calls, name = name](const Tensor&) { calls.push_back(name); }));
    }
    const Tensor inp = env.Inputs().Get(StepInputName(0));
    for (int64_t k = 0; k < env.params.GetInt("backwards"); ++k) {
      sum((*model)(inp).tensor()).backward();
    }
    nlohmann::json obs;
    obs["hook_calls"] = calls;
    return obs;
  };
  s.judge = [](const CaseParams& params, int world, const std::vector<nlohmann::json>& per_rank,
               CheckList& checks) {
    // MLP's parameters, each managed by exactly one group (in_proj, out_proj; the root has
    // none left), each reduced once per backward, whether its sharded gradient is assigned or
    // added to: one call each per backward, in any order.
    std::map<std::string, int64_t> expected;
    for (const char* name : {"in_proj.weight", "in_proj.bias", "out_proj.weight", "out_proj.bias"}) {
      expected[name] = params.GetInt("backwards");
    }
    for (int r = 0; r < world; ++r) {
      const nlohmann::json& calls = RankObservation(per_rank, r, "hook_calls");
      std::map<std::string, int64_t> counts;
      for (const nlohmann::json& name : calls) ++counts[name.get<std::string>()];
      checks.CheckEqual(RankName(r) + " hook calls per parameter", expected, counts);
    }
  };
  return s;
}

// "iter<k>/": the tensors of iteration k; kRefPrefix + "iter<k>/": the reference's.
std::string IterationPrefix(int64_t k) { return "iter" + std::to_string(k) + "/"; }
constexpr const char* kRefPrefix = "ref/";

// One rank of post_acc_grad_hook_optim_parity: the reference trains with a normal AdamW loop,
// the subject steps one AdamW (+ StepLR) per parameter inside its post-accumulate-grad hook.
nlohmann::json OptimParityRank(RankEnv& env) {
  const CaseParams& p = env.params;
  nn::ModelArgs args;
  args.n_layers = p.GetInt("n_layers");
  args.dropout_p = 0.0;
  auto model = std::make_shared<nn::Transformer>(args);
  model->load_state_dict(env.Inputs().weights());
  auto ref_model = std::static_pointer_cast<nn::Transformer>(model->deep_copy());
  fsdp2::FullyShardOptions options;
  options.process_group = env.pg;
  options.semantics = SemanticsOf(p);
  for (const auto& layer : ref_model->layers()) fsdp2::fully_shard(layer, options);
  fsdp2::fully_shard(ref_model, options);
  const optim::AdamWOptions optim_options{.lr = p.GetDouble("lr")};
  const int64_t step_size = p.GetInt("step_size");
  optim::AdamW ref_optim(ref_model->parameters(), optim_options);
  optim::StepLR ref_scheduler(ref_optim, step_size);
  for (const auto& layer : model->layers()) fsdp2::fully_shard(layer, options);
  fsdp2::fully_shard(model, options);
  struct PerParam {
    std::unique_ptr<optim::AdamW> optim;
    std::unique_ptr<optim::StepLR> scheduler;
  };
  std::vector<PerParam> per_param;
  std::vector<autograd::RemovableHandle> handles;
  for (const Tensor& param : model->parameters()) {
    PerParam& pp = per_param.emplace_back();
    pp.optim = std::make_unique<optim::AdamW>(std::vector<Tensor>{param}, optim_options);
    pp.scheduler = std::make_unique<optim::StepLR>(*pp.optim, step_size);
    handles.push_back(autograd::register_post_accumulate_grad_hook(
        param, [o = pp.optim.get(), sched = pp.scheduler.get()](const Tensor&) {
          o->step();
          o->zero_grad();
          sched->step();
        }));
  }
  const Tensor inp = env.Inputs().Get(StepInputName(0));
  std::vector<double> ref_losses;
  std::vector<double> losses;
  std::vector<double> ref_lrs;
  std::vector<double> lrs;
  std::vector<double> ref_grads_kept;
  nlohmann::json tensors = nlohmann::json::object();
  for (int64_t k = 0; k < p.GetInt("iterations"); ++k) {
    Tensor ref_loss = sum((*ref_model)(inp).tensor());
    ref_loss.backward();
    ref_optim.step();
    ref_optim.zero_grad();
    int64_t kept = 0;
    for (const Tensor& param : ref_model->parameters()) kept += param.grad().defined() ? 1 : 0;
    ref_grads_kept.push_back(static_cast<double>(kept));
    ref_scheduler.step();
    Tensor loss = sum((*model)(inp).tensor());
    loss.backward();
    ref_losses.push_back(ref_loss.item());
    losses.push_back(loss.item());
    ref_lrs.push_back(ref_optim.param_groups()[0].lr);
    lrs.push_back(per_param.front().optim->param_groups()[0].lr);
    for (const auto& [name, param] : ref_model->named_parameters()) {
      tensors[kRefPrefix + IterationPrefix(k) + name] = TensorToJson(param);
    }
    for (const auto& [name, param] : model->named_parameters()) {
      tensors[IterationPrefix(k) + name] = TensorToJson(param);
    }
  }
  nlohmann::json obs;
  obs["ref_losses"] = ref_losses;
  obs[kLosses] = losses;
  obs["ref_lrs"] = ref_lrs;
  obs["lrs"] = lrs;
  obs["ref_grads_after_zero_grad"] = ref_grads_kept;
  const optim::AdamOptions& ref_options = ref_optim.options();
  obs["ref_defaults"] = {ref_options.beta1, ref_options.beta2, ref_options.eps,
                         ref_options.weight_decay};
  obs[kTensors] = std::move(tensors);
  return obs;
}

Scenario PostAccGradHookOptimParity() {
  Scenario s;
  s.info.name = "fully_shard_autograd/post_acc_grad_hook_optim_parity";
  s.info.description =
      "Transformer(dropout 0), blocks and root sharded: AdamW + StepLR run per parameter in "
      "post-accumulate-grad hooks give bit-identical losses and parameter shards to a normal "
      "optimizer loop";
  s.info.seed_test =
      "test_fully_shard_autograd.py::TestFullyShardPostAccGradHookMultiProcess::"
      "test_post_acc_grad_hook_optim_parity";
  s.info.params = {ParamSpec::SizeInt("n_layers", "ModelArgs.n_layers", 2, /*minimum=*/1),
                   ParamSpec::SizeInt("iterations", "training iterations", 10,
                                      /*minimum=*/1),
                   ParamSpec::SizeDouble("lr", "AdamW lr (foreach=False)", 1e-2),
                   ParamSpec::SizeInt("step_size", "StepLR step_size", 5, /*minimum=*/1),
                   ParamSpec::SizeInt("seed", "model seed; rank r draws tokens from seed + r", 42),
                   SemanticsParam()};
  s.info.inputs = TransformerInputsDoc(TokenBatches::kPerRank);
  s.inputs = [](const CaseParams& params, int world) {
    return TransformerCaseInputs(params.GetInt("n_layers"),
                                 static_cast<uint64_t>(params.GetInt("seed")), world,
                                 TokenBatches::kPerRank);
  };
  s.info.deterministic = true;
  s.info.default_world = 2;  // min(2, gpus)
  s.info.min_world = 1;
  s.info.max_world = 8;
  s.info.requirements.devices = {DeviceType::kCPU};
  s.info.observations
      .Add(ObservationKey::Losses(
          "per iteration: model(inp).sum() of the model whose post-accumulate-grad hooks step "
          "one AdamW + StepLR per parameter"))
      .Add(ObservationKey::NumberList(
          "ref_losses",
          "per iteration: ref_model(inp).sum() of the reference, a copy of the "
          "model (same initial weights, same sharding) trained by one AdamW over "
          "all parameters + StepLR stepped after loss.backward()"))
      .Add(ObservationKey::NumberList(
          "ref_lrs",
          "per iteration: the reference optimizer's param_groups[0][\"lr\"] after "
          "its StepLR step"))
      .Add(ObservationKey::NumberList(
          "lrs",
          "per iteration: the first parameter's hook-stepped optimizer's "
          "param_groups[0][\"lr\"] after its StepLR step"))
      .Add(ObservationKey::NumberList(
          "ref_grads_after_zero_grad",
          "per iteration: how many of the reference's parameters still have a .grad (not "
          "None) right after its ref_optim.zero_grad() (the default set_to_none=True)"))
      .Add(ObservationKey::NumberList(
          "ref_defaults",
          "the reference AdamW (built with lr alone)'s param_groups[0] betas[0], betas[1], eps "
          "and weight_decay"))
      .AddTensors({"iter{k}/{fqn}", "float32", "the local shard's shape",
                   "after iteration k's backward (whose hooks stepped the optimizers): the "
                   "hook-stepped model's parameter FQN (named_parameters()), its local shard "
                   "(to_local(): rows torch.chunk(param, world, dim=0)[rank])"})
      .AddTensors({"ref/iter{k}/{fqn}", "float32", "the local shard's shape",
                   "after iteration k's optimizer step: the reference's parameter FQN, its "
                   "local shard"});
  s.run_rank = OptimParityRank;
  s.judge = [](const CaseParams& params, int world, const std::vector<nlohmann::json>& per_rank,
               CheckList& checks) {
    const int64_t iterations = params.GetInt("iterations");
    // The FQNs both models must report: the Transformer's named_parameters(), sorted as the
    // maps below are.
    nn::ModelArgs args;
    args.n_layers = params.GetInt("n_layers");
    std::vector<std::string> fqns = ParameterNamesOf(nn::Transformer(args));
    std::sort(fqns.begin(), fqns.end());
    for (int r = 0; r < world; ++r) {
      const std::string who = RankName(r);
      const std::vector<double> ref_losses =
          RankObservation(per_rank, r, "ref_losses").get<std::vector<double>>();
      checks.CheckEqual(who + " iterations reported", nlohmann::json({iterations, iterations}),
                        nlohmann::json({ref_losses.size(), Losses(per_rank, r).size()}));
      checks.CheckClose(who + " losses: hooks vs optimizer loop (exact)", ref_losses,
                        Losses(per_rank, r), Tolerance{0, 0});
      // StepLR's rule (gamma 0.1): after epoch e, lr = lr * gamma if e % step_size == 0, so
      // the schedule is judged by rule, not only hooks vs loop (a wrong schedule agrees there).
      std::vector<double> expected_lrs;
      double lr = params.GetDouble("lr");
      for (int64_t epoch = 1; epoch <= iterations; ++epoch) {
        if (epoch % params.GetInt("step_size") == 0) lr *= 0.1;
        expected_lrs.push_back(lr);
      }
      // torch.optim.AdamW's documented defaults (the loops share them, so the hooks-vs-loop
      // comparison cannot tell a wrong default).
      checks.CheckClose(who + " ref_defaults vs AdamW's defaults (betas, eps, weight_decay)",
                        std::vector<double>{0.9, 0.999, 1e-8, 1e-2},
                        RankObservation(per_rank, r, "ref_defaults").get<std::vector<double>>(),
                        Tolerance{0, 1e-12});
      // Optimizer.zero_grad()'s default set_to_none=True: every .grad becomes None (zeroed
      // gradients give the same values, so only the gradients' presence shows it).
      checks.CheckClose(
          who + " ref_grads_after_zero_grad (default set_to_none=True)",
          std::vector<double>(static_cast<size_t>(iterations), 0.0),
          RankObservation(per_rank, r, "ref_grads_after_zero_grad").get<std::vector<double>>(),
          Tolerance{0, 0});
      for (const char* key : {"ref_lrs", "lrs"}) {
        checks.CheckClose(who + " " + key + " vs StepLR(gamma=0.1)'s schedule", expected_lrs,
                          RankObservation(per_rank, r, key).get<std::vector<double>>(),
                          Tolerance{0, 1e-12});
      }
      reference::RefTensorMap previous;
      for (int64_t k = 0; k < iterations; ++k) {
        const std::string at = who + " iteration " + std::to_string(k);
        const reference::RefTensorMap ref =
            MapFromObservations(per_rank, r, kRefPrefix + IterationPrefix(k));
        const reference::RefTensorMap hooked =
            MapFromObservations(per_rank, r, IterationPrefix(k));
        std::vector<std::string> reported;
        for (const auto& [fqn, t] : hooked) reported.push_back(fqn);
        checks.CheckEqual(at + " parameters reported", fqns, reported);
        CheckMapsClose(checks, at + " parameter shards: hooks vs optimizer loop (exact)", ref,
                       hooked, Tolerance{0, 0});
        if (k > 0) {
          bool stepped = false;
          for (const auto& [fqn, t] : hooked) {
            const auto before = previous.find(fqn);
            stepped = stepped || before == previous.end() || before->second.data != t.data;
          }
          checks.CheckTrue(at + " the hooks stepped (some parameter changed)", stepped);
        }
        previous = hooked;
      }
    }
    checks.SetFigure("iterations", iterations);
  };
  return s;
}

}  // namespace

void RegisterFullyShardAutogradScenarios(ScenarioRegistry& registry) {
  registry.Add(UnusedForwardOutput());
  registry.Add(UnusedForwardModule());
  registry.Add(NontensorActivations());
  registry.Add(PostAccGradHookRuns());
  registry.Add(PostAccGradHookOptimParity());
}

}  // namespace fsdp::conformance
