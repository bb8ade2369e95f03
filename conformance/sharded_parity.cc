#include "conformance/sharded_parity.h"

#include <map>
#include <set>
#include <utility>

#include "conformance/fsdp_params.h"
#include "conformance/observations.h"
#include "conformance/parity_common.h"
#include "conformance/rank_checks.h"
#include "conformance/uneven_world.h"
#include "engine/fsdp/fsdp_param.h"
#include "engine/nn/layers.h"
#include "reference/sharding.h"

namespace fsdp::conformance {

namespace {

// The parameters of `module`'s subtree, by identity.
std::set<const TensorImpl*> ParamIds(const nn::Module& module) {
  std::set<const TensorImpl*> ids;
  for (const auto& [name, param] : module.named_parameters()) ids.insert(param.impl());
  return ids;
}

}  // namespace

reference::RefTensorMap LocalParameterShards(nn::Module& module) {
  reference::RefTensorMap out;
  for (const auto& [name, param] : module.named_parameters()) out[name] = ToRef(param);
  return out;
}

reference::RefTensorMap LocalGradientShards(nn::Module& module) {
  reference::RefTensorMap out;
  for (const auto& [name, param] : module.named_parameters()) {
    const Tensor grad = param.grad();
    if (grad.defined()) out[name] = ToRef(grad);
  }
  return out;
}

reference::RefTensorMap FullShardedParameters(nn::Module& module) {
  reference::RefTensorMap out;
  for (const auto& [name, param] : module.named_parameters()) {
    const fsdp2::FsdpParam* fsdp_param = fsdp2::LookupFsdpParam(param);
    out[name] = ToRef(fsdp_param != nullptr ? fsdp_param->full_tensor() : param);
  }
  return out;
}

int ParityUnevenWorld(const ZooModelKind& kind, const std::vector<ParamSpec>& params, int max_world,
                      bool flat_parameters) {
  const CaseParams defaults = ExpandCases(kind.name, params, {}).front();
  const nn::ModulePtr root = ZooModel::Make(kind.name, defaults).BuildEngine();
  return DiscriminatingWorld(flat_parameters ? FlatParameterNumels(*root, ChildrenToShard(root))
                                             : ParameterDim0Sizes(*root),
                             max_world);
}

std::vector<nn::ModulePtr> ChildrenToShard(const nn::ModulePtr& root) {
  const std::vector<nn::ModulePtr> children = root->children();
  std::vector<std::set<const TensorImpl*>> ids;
  for (const nn::ModulePtr& child : children) ids.push_back(ParamIds(*child));
  std::vector<nn::ModulePtr> out;
  for (size_t i = 0; i < children.size(); ++i) {
    if (auto* list = dynamic_cast<nn::ModuleList*>(children[i].get())) {
      for (const nn::ModulePtr& element : list->list()) out.push_back(element);
      continue;
    }
    if (ids[i].empty()) continue;
    bool shared = false;
    for (size_t j = 0; j < children.size() && !shared; ++j) {
      if (j == i) continue;
      for (const TensorImpl* id : ids[i]) shared = shared || ids[j].count(id) > 0;
    }
    if (!shared) out.push_back(children[i]);
  }
  return out;
}

void ShardChildrenThenRoot(const nn::ModulePtr& root, const fsdp2::FullyShardOptions& options) {
  for (const nn::ModulePtr& child : ChildrenToShard(root)) fsdp2::fully_shard(child, options);
  fsdp2::fully_shard(root, options);
}

ShardPlan ShardSubmodulesThenRoot(std::vector<std::string> fqns) {
  return [fqns = std::move(fqns)](const nn::ModulePtr& root,
                                  const fsdp2::FullyShardOptions& options) {
    for (const std::string& fqn : fqns) fsdp2::fully_shard(root->get_submodule(fqn), options);
    fsdp2::fully_shard(root, options);
  };
}

void ShardEveryChildThenRoot(const nn::ModulePtr& root, const fsdp2::FullyShardOptions& options) {
  for (const nn::ModulePtr& child : root->children()) fsdp2::fully_shard(child, options);
  fsdp2::fully_shard(root, options);
}

fsdp2::FullyShardOptions ShardOptionsOf(const RankEnv& env) {
  fsdp2::FullyShardOptions options;
  options.process_group = env.pg;
  options.semantics = SemanticsOf(env.params);
  if (env.params.has("reshard_after_forward")) {
    options.reshard_after_forward = ReshardAfterForwardOf(env.params);
  }
  options.shard_placement_fn = ShardPlacementFnOf(env.params, env.pg->size());
  return options;
}

ObservationSchema ShardedParitySchema() {
  ObservationSchema schema = TrainingSchema(
      "the rank's local shard: torch.chunk(param, world, dim=d)[rank] (possibly empty), d the "
      "case's shard_placement dim (0 by default)",
      /*with_grads=*/true);
  schema.AddTensors({"full/{fqn}", "the case's dtype", "the full parameter",
                     "every parameter after the last step, all-gathered (full_tensor())"});
  return schema;
}

nlohmann::json RunShardedParityRank(const std::string& kind, const ShardPlan& plan, RankEnv& env) {
  const ParityCase c = DecodeParityCase(kind, env.params);
  nn::ModulePtr module = c.model.BuildEngineFromInputs(env.Inputs(), c.dtype);
  module->to(env.device);  // cuda:<local rank> on GPU backends; TrainEngine follows the params
  plan(module, ShardOptionsOf(env));
  const EngineTrainingRecord record =
      TrainEngine(c.model, *module, c.optim, env.Inputs(), c.steps, LocalParameterShards,
                  LocalGradientShards);
  nlohmann::json obs = TrainingObservations(record, c.dtype);
  obs[kTensors].update(MapToJson(FullShardedParameters(*module), DTypeName(c.dtype), "full/"));
  return obs;
}

std::vector<nlohmann::json> ExpectShardedParity(const std::string& kind, const CaseParams& params,
                                                int world) {
  const ParityCase c = DecodeParityCase(kind, params);
  const auto oracle = TrainOracle(c.model, c.optim, c.seed, c.steps, c.dtype, world);
  const std::string dtype = DTypeName(c.dtype);
  std::vector<nlohmann::json> expected(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    nlohmann::json& e = expected[static_cast<size_t>(r)];
    e[kLosses] = nlohmann::json::array();
    e["loss_dtype"] = DTypeName(ZooModel::Kind(kind).LossDType(c.dtype));
    e[kTensors] = nlohmann::json::object();
  }
  // The shard dim of every parameter (and its gradient) under the case's shard_placement.
  reference::ShardDims dims;
  for (const auto& [fqn, t] : oracle.front().params) dims[fqn] = ShardDimOf(params, t.shape, world);
  for (int64_t k = 0; k < c.steps; ++k) {
    const auto& step = oracle[static_cast<size_t>(k)];
    const auto grads = reference::ShardsOnAllRanks(step.grads, world, dims);
    const auto params_k = reference::ShardsOnAllRanks(step.params, world, dims);
    for (int r = 0; r < world; ++r) {
      nlohmann::json& e = expected[static_cast<size_t>(r)];
      e[kLosses].push_back(step.rank_losses.at(r));
      e[kTensors].update(MapToJson(grads.at(r), dtype, GradPrefix(k)));
      e[kTensors].update(MapToJson(params_k.at(r), dtype, StepPrefix(k)));
    }
  }
  for (int r = 0; r < world; ++r) {
    expected[static_cast<size_t>(r)][kTensors].update(
        MapToJson(oracle.back().params, dtype, "full/"));
  }
  return expected;
}

std::vector<std::map<std::string, double>> GradientScales(
    const std::vector<nlohmann::json>& expected, int64_t steps) {
  std::vector<std::map<std::string, double>> scales;
  for (int64_t k = 0; k < steps; ++k) {
    std::vector<reference::RefTensorMap> all_shards;
    for (size_t r = 0; r < expected.size(); ++r) {
      all_shards.push_back(MapFromObservations(expected, static_cast<int>(r), GradPrefix(k)));
    }
    scales.push_back(MaxAbsByFqn(all_shards));
  }
  return scales;
}

void CheckRankShardedParity(CheckList& checks, const ParityCase& c,
                            const std::vector<nlohmann::json>& expected,
                            const std::vector<std::map<std::string, double>>& grad_scales,
                            const std::vector<nlohmann::json>& per_rank, int rank,
                            ErrorStats& param_err, ErrorStats& grad_err) {
  const Tolerance tol = c.ToleranceFor(c.dtype);
  const std::string who = RankName(rank);
  CheckRankLosses(checks, c, expected, per_rank, rank);
  for (int64_t k = 0; k < c.steps; ++k) {
    const std::string at = who + " step " + std::to_string(k);
    // A gradient element is a sum over the batch and the model: its rounding scales with the
    // whole tensor's magnitude, not with the element's own size.
    grad_err.Merge(CheckMapsClose(checks, at + " gradient shards",
                                  MapFromObservations(expected, rank, GradPrefix(k)),
                                  MapFromObservations(per_rank, rank, GradPrefix(k)), tol,
                                  &grad_scales.at(static_cast<size_t>(k))));
    param_err.Merge(CheckMapsClose(checks, at + " parameter shards",
                                   MapFromObservations(expected, rank, StepPrefix(k)),
                                   MapFromObservations(per_rank, rank, StepPrefix(k)), tol));
  }
  param_err.Merge(CheckMapsClose(checks, who + " full parameters after the last step",
                                 MapFromObservations(expected, rank, "full/"),
                                 MapFromObservations(per_rank, rank, "full/"), tol));
}

void JudgeShardedParity(const std::string& kind, const CaseParams& params, int world,
                        const std::vector<nlohmann::json>& per_rank, CheckList& checks) {
  const ParityCase c = DecodeParityCase(kind, params);
  const std::vector<nlohmann::json> expected = ExpectShardedParity(kind, params, world);
  ErrorStats param_err;
  ErrorStats grad_err;
  const auto grad_scales = GradientScales(expected, c.steps);
  for (int r = 0; r < world; ++r) {
    CheckRankShardedParity(checks, c, expected, grad_scales, per_rank, r, param_err, grad_err);
  }
  checks.SetFigure("steps", c.steps);
  checks.SetFigure("param_max_abs_err", param_err.max_abs);
  checks.SetFigure("param_max_rel_err", param_err.max_rel);
  checks.SetFigure("grad_max_abs_err", grad_err.max_abs);
  checks.SetFigure("grad_max_rel_err", grad_err.max_rel);
}

}  // namespace fsdp::conformance
