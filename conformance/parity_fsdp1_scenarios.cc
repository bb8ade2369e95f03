// Family `parity/fsdp1`: FSDP1 (`FullyShardedDataParallel`) training of the seed families'
// models (Transformer, MLP, DoubleLinear) on `world` ranks against the oracle's data-parallel
// run, under every sharding_strategy x backward_prefetch x use_orig_params x cpu_offload.
//
// Each rank loads the case's runner-owned weights, wraps the model with FSDP1, nesting an
// instance around the same submodules FSDP2's parity family shards (ChildrenToShard: the
// Transformer's blocks, MLP's in_proj/out_proj, DoubleLinear's lin1/lin2; a LambdaAutoWrapPolicy
// picks exactly those), and trains `steps` steps on its slice of every global batch
// (TrainEngine). It reports its losses and, after every optimizer step, the full parameters by
// clean FQN (summon_full_params(writeback=False)); the judge compares them with the oracle's
// data-parallel run (ExpectFsdp1Parity). Gradients are judged through the parameters they move.
//
// Under CPUOffload the oracle models FSDP1's CPU gradient buffer (reference::OffloadedFlatParam):
// a flat parameter that got no gradient in a backward (DoubleLinear's lin2 once the loss is
// out1.sum()) is still stepped with the buffer's stale gradient (prepare_gradient_for_optim), and
// where the unsharded flat parameter outlives forward (SHARD_GRAD_OP, _HYBRID_SHARD_ZERO2) the
// full parameters read afterwards are that kept unsharded copy, not the stepped shard.
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "conformance/fsdp1_params.h"
#include "conformance/model_zoo.h"
#include "conformance/observations.h"
#include "conformance/parity_common.h"
#include "conformance/rank_checks.h"
#include "conformance/scenario_registry.h"
#include "conformance/sharded_parity.h"
#include "engine/fsdp1/fully_sharded_data_parallel.h"
#include "engine/fsdp1/unshard_params.h"
#include "engine/fsdp1/wrap_policy.h"

namespace fsdp::conformance {

namespace {

constexpr const char* kFamily = "parity/fsdp1";

// The full parameters by clean FQN (every rank must call it: it all-gathers).
reference::RefTensorMap FullParameters(nn::Module& module) {
  FSDP_INTERNAL_ASSERT(fsdp1::AsFsdp(module) != nullptr,
                       "parity/fsdp1: the root is not an FSDP instance");
  fsdp1::SummonFullParams full(module.shared_from_this(), {.writeback = false});
  reference::RefTensorMap out;
  for (const auto& [name, param] : module.named_parameters()) {
    out[fsdp1::CleanTensorName(name)] = ToRef(param);
  }
  return out;
}

nlohmann::json RunFsdp1ParityRank(const std::string& kind, RankEnv& env) {
  const ParityCase c = DecodeParityCase(kind, env.params);
  nn::ModulePtr module = c.model.BuildEngineFromInputs(env.Inputs(), c.dtype);
  module->to(env.device);
  std::set<const nn::Module*> nested;
  for (const nn::ModulePtr& child : ChildrenToShard(module)) nested.insert(child.get());
  fsdp1::FullyShardedDataParallelOptions options;
  options.process_group = env.pg;
  options.sharding_strategy = ParseShardingStrategy(env.params.GetString("sharding_strategy"));
  options.backward_prefetch = ParseBackwardPrefetch(env.params.GetString("backward_prefetch"));
  options.use_orig_params = env.params.GetBool("use_orig_params");
  options.cpu_offload.offload_params = env.params.GetBool("cpu_offload");
  options.auto_wrap_policy = std::make_shared<fsdp1::LambdaAutoWrapPolicy>(
      [nested](const nn::Module& m) { return nested.count(&m) > 0; });
  auto fsdp_model = std::make_shared<fsdp1::FullyShardedDataParallel>(module, options);
  const EngineTrainingRecord record =
      TrainEngine(c.model, *fsdp_model, c.optim, env.Inputs(), c.steps, FullParameters);
  return TrainingObservations(record, c.dtype);
}

// RunFsdp1ParityRank's flat parameters under CPUOffload, for the oracle: one per nested
// instance (the parameters under that child's FQN) and the root's (the rest), each keeping its
// unsharded flat parameter after forward when its effective strategy does not free it there
// (a sharded strategy on a shard group of `shard_world` > 1 ranks that does not reshard after
// forward, or the root, which never frees after forward). Empty without CPU offload.
std::vector<reference::OffloadedFlatParam> OffloadedFlatParams(const ParityCase& c,
                                                                const CaseParams& params,
                                                                int shard_world) {
  if (!params.GetBool("cpu_offload")) return {};
  const fsdp1::ShardingStrategy strategy =
      ParseShardingStrategy(params.GetString("sharding_strategy"));
  const bool sharded = shard_world > 1 && fsdp1::UsesShardedStrategy(strategy);
  const nn::ModulePtr module = c.model.BuildEngine();
  std::map<const nn::Module*, std::string> fqns;
  for (const auto& [name, m] : module->named_modules()) fqns[m.get()] = name;
  std::vector<reference::OffloadedFlatParam> out;
  std::set<std::string> nested_params;
  for (const nn::ModulePtr& child : ChildrenToShard(module)) {
    reference::OffloadedFlatParam flat;
    for (const auto& [name, p] : child->named_parameters(fqns.at(child.get()))) {
      flat.params.push_back(name);
      nested_params.insert(name);
    }
    flat.keeps_unsharded_after_forward = sharded && !fsdp1::ReshardsAfterForward(strategy);
    if (!flat.params.empty()) out.push_back(std::move(flat));
  }
  reference::OffloadedFlatParam root;
  for (const auto& [name, p] : module->named_parameters()) {
    if (nested_params.count(name) == 0) root.params.push_back(name);
  }
  root.keeps_unsharded_after_forward = sharded;
  if (!root.params.empty()) out.push_back(std::move(root));
  return out;
}

std::vector<nlohmann::json> ExpectFsdp1Parity(const std::string& kind, const CaseParams& params,
                                              int world) {
  const ParityCase c = DecodeParityCase(kind, params);
  const auto oracle = TrainOracle(c.model, c.optim, c.seed, c.steps, c.dtype, world,
                                  OffloadedFlatParams(c, params, world));
  std::vector<nlohmann::json> expected(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    nlohmann::json& e = expected[static_cast<size_t>(r)];
    e[kLosses] = nlohmann::json::array();
    e["loss_dtype"] = DTypeName(ZooModel::Kind(kind).LossDType(c.dtype));
    e[kTensors] = nlohmann::json::object();
    for (int64_t k = 0; k < c.steps; ++k) {
      const auto& step = oracle[static_cast<size_t>(k)];
      e[kLosses].push_back(step.rank_losses.at(r));
      e[kTensors].update(MapToJson(step.params, DTypeName(c.dtype), StepPrefix(k)));
    }
  }
  return expected;
}

void JudgeFsdp1Parity(const std::string& kind, const CaseParams& params, int world,
                      const std::vector<nlohmann::json>& per_rank, CheckList& checks) {
  const ParityCase c = DecodeParityCase(kind, params);
  const Tolerance tol = c.ToleranceFor(c.dtype);
  const std::vector<nlohmann::json> expected = ExpectFsdp1Parity(kind, params, world);
  ErrorStats param_err;
  for (int r = 0; r < world; ++r) {
    const std::string who = RankName(r);
    CheckRankLosses(checks, c, expected, per_rank, r);
    for (int64_t k = 0; k < c.steps; ++k) {
      param_err.Merge(CheckMapsClose(checks, who + " parameters after step " + std::to_string(k),
                                     MapFromObservations(expected, r, StepPrefix(k)),
                                     MapFromObservations(per_rank, r, StepPrefix(k)), tol));
    }
  }
  checks.SetFigure("steps", c.steps);
  checks.SetFigure("param_max_abs_err", param_err.max_abs);
  checks.SetFigure("param_max_rel_err", param_err.max_rel);
}

Scenario MakeScenario(const ZooModelKind& kind) {
  Scenario s;
  s.info.name = std::string(kFamily) + "/" + kind.name;
  s.info.description = kind.description +
                       ": FullyShardedDataParallel on `world` ranks vs the oracle's data-parallel "
                       "run, every rank's losses and full parameters at every step";
  s.info.seed_test = "test_fsdp_grad_acc.py / common_fsdp.py FSDP1 training (" + kind.seed_test + ")";
  s.info.params = ParityParams(
      kind, ParamSpec::SizeString("dtype", "the engine's parameter and input dtype", "float32"));
  for (ParamSpec& p : s.info.params) {
    if (p.name == "optim") p = ParamSpec::SizeString("optim", "optimizer: sgd, adam or adamw", "sgd");
  }
  s.info.params.push_back(ShardingStrategyAxis());
  s.info.params.push_back(BackwardPrefetchAxis());
  s.info.params.push_back(UseOrigParamsAxis());
  s.info.params.push_back(
      ParamSpec::Axis("cpu_offload", "CPUOffload(offload_params=...)", {"False", "True"}));
  s.info.observations = TrainingSchema(
      "the full parameter, read inside summon_full_params(writeback=False), by its clean FQN "
      "(no _fsdp_wrapped_module.)",
      /*with_grads=*/false);
  s.info.inputs = ZooInputsDoc(kind, "the case's dtype");
  s.info.default_world = 2;
  s.info.min_world = 1;
  s.info.max_world = 8;
  s.info.requirements.devices = {DeviceType::kCPU};
  const std::string name = kind.name;
  s.inputs = ParityInputs(name);
  s.run_rank = [name](RankEnv& env) { return RunFsdp1ParityRank(name, env); };
  s.expect = [name](const CaseParams& p, int world) { return ExpectFsdp1Parity(name, p, world); };
  s.judge = [name](const CaseParams& p, int world, const std::vector<nlohmann::json>& per_rank,
                   CheckList& checks) { JudgeFsdp1Parity(name, p, world, per_rank, checks); };
  return s;
}

}  // namespace

void RegisterParityFsdp1Scenarios(ScenarioRegistry& registry) {
  for (const char* kind : {"transformer", "mlp", "double_linear"}) {
    registry.Add(MakeScenario(ZooModel::Kind(kind)));
  }
}

}  // namespace fsdp::conformance
