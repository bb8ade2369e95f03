#include "conformance/optimizer_state_dict_scenario.h"

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "conformance/model_zoo.h"
#include "conformance/observations.h"
#include "conformance/parity_common.h"
#include "conformance/rank_checks.h"
#include "conformance/sharded_parity.h"
#include "conformance/state_dict_model.h"
#include "engine/checkpoint/state_dict.h"
#include "engine/core/error.h"
#include "reference/sharding.h"

namespace fsdp::conformance {

namespace {

constexpr const char* kStatePrefix = "state.";
constexpr const char* kGroupsPrefix = "param_groups.";

// test_multi_param_groups's layout (param_groups=True): the second half of the model's
// parameters, in registration order, form a second param group with twice the lr
// (optimizer.add_param_group); empty otherwise.
std::vector<std::string> SecondGroupFqns(const ParityCase& c, const CaseParams& params) {
  if (!params.GetBool("param_groups")) return {};
  const std::vector<std::string> names = c.model.ParameterNames();
  return {names.begin() + static_cast<std::ptrdiff_t>(names.size() / 2), names.end()};
}

// frozen=True: the model's last parameter has requires_grad=False (set before fully_shard), so
// it never gets a gradient or optimizer state but stays in its param group.
std::vector<std::string> FrozenFqns(const ParityCase& c, const CaseParams& params) {
  if (!params.GetBool("frozen")) return {};
  return {c.model.ParameterNames().back()};
}

bool Contains(const std::vector<std::string>& fqns, const std::string& fqn) {
  return std::find(fqns.begin(), fqns.end(), fqn) != fqns.end();
}

// The lr of every param group, in order: the case's lr, then twice it for the second group.
std::vector<double> GroupLrs(const ParityCase& c, const CaseParams& params) {
  std::vector<double> lrs = {c.optim.lr};
  if (!SecondGroupFqns(c, params).empty()) lrs.push_back(2 * c.optim.lr);
  return lrs;
}

// The optimizer state of `steps` steps of the oracle's data-parallel run (the same inputs and
// weights as the engine's), flattened as get_optimizer_state_dict names it, full tensors:
// "state.<fqn>.momentum_buffer" (SGD) or ".step", ".exp_avg", ".exp_avg_sq" (Adam) of every
// parameter that had a gradient, and "param_groups.<fqn>.lr" of every parameter (its group's).
reference::RefTensorMap OracleOptimizerState(const ParityCase& c, const CaseParams& params,
                                             int world) {
  std::unique_ptr<reference::Optimizer<double>> optimizer = MakeOracleOptimizer(c.optim);
  const std::vector<std::string> second = SecondGroupFqns(c, params);
  if (!second.empty()) optimizer->AddParamGroup(second, GroupLrs(c, params).back());
  const auto records = TrainOracleWith(c.model, *optimizer, c.seed, c.steps, c.dtype, world, {},
                                       std::nullopt, nullptr, FrozenFqns(c, params));
  reference::RefTensorMap state;
  const reference::RefTensorMap& final_params = records.back().params;
  if (auto* sgd = dynamic_cast<reference::Sgd<double>*>(optimizer.get())) {
    for (const auto& [fqn, buffer] : sgd->momentum_buffers()) {
      state[kStatePrefix + fqn + ".momentum_buffer"] = buffer;
    }
  } else if (auto* adam = dynamic_cast<reference::Adam<double>*>(optimizer.get())) {
    for (const auto& [fqn, step] : adam->steps()) {
      state[kStatePrefix + fqn + ".step"] = reference::RefTensor({}, {static_cast<double>(step)});
      state[kStatePrefix + fqn + ".exp_avg"] = adam->exp_avg().at(fqn);
      state[kStatePrefix + fqn + ".exp_avg_sq"] = adam->exp_avg_sq().at(fqn);
    }
  } else {
    FSDP_THROW(ErrorCode::kInternal, "optimizer_state_dict: no oracle state for ", c.optim.kind);
  }
  for (const auto& [fqn, p] : final_params) {
    // Every parameter of a group, with state or not (a frozen one included).
    state[kGroupsPrefix + fqn + ".lr"] = reference::RefTensor({}, {optimizer->LrOf(fqn)});
  }
  return state;
}

// What rank `rank` of `world` holds of `state`: a tensor with dim 0 (the shape of its
// parameter) as its parameter is sharded, torch.chunk's rows; scalars (step, lr) whole. With
// `full_state_dict`, everything whole.
reference::RefTensorMap RankPieces(const reference::RefTensorMap& state, int rank, int world,
                                   bool full_state_dict) {
  if (full_state_dict) return state;
  reference::RefTensorMap sharded_part, whole;
  for (const auto& [key, t] : state) (t.shape.empty() ? whole : sharded_part)[key] = t;
  reference::RefTensorMap out = reference::ShardsOf(sharded_part, rank, world);
  out.insert(whole.begin(), whole.end());
  return out;
}

// {"global_shape", "offsets"} per state key of a sharded dict (null for scalars and for a
// full dict), by the torch.chunk rule.
nlohmann::json ExpectedSharding(const reference::RefTensorMap& state, int rank, int world,
                                bool full_state_dict) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [key, t] : state) {
    if (key.rfind(kStatePrefix, 0) != 0) continue;
    if (full_state_dict || t.shape.empty()) {
      out[key] = nullptr;
      continue;
    }
    std::vector<int64_t> offsets(t.shape.size(), 0);
    offsets[0] = reference::MakeChunkLayout(t.shape.front(), world).RowOffset(rank);
    out[key] = {{"global_shape", t.shape}, {"offsets", offsets}};
  }
  return out;
}

// {"global_shape", "offsets"} per key of get_model_state_dict's dict (every key of the model's
// state dict, each location of a tied weight included): torch.chunk's dim-0 piece for a
// parameter, null for a buffer and for every value of a full dict.
nlohmann::json ExpectedModelSharding(const ParityCase& c, int rank, int world,
                                     bool full_state_dict) {
  const CaseInputs inputs = c.model.MakeCaseInputs(c.seed, c.dtype, 1, world);
  const reference::RefTensorMap buffers = c.model.MakeBuffers(c.seed, c.dtype);
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [key, t] : inputs.weights) {
    if (full_state_dict || buffers.count(key) != 0) {
      out[key] = nullptr;
      continue;
    }
    std::vector<int64_t> offsets(static_cast<size_t>(t.dim()), 0);
    offsets[0] = reference::MakeChunkLayout(t.size(0), world).RowOffset(rank);
    out[key] = {{"global_shape", t.sizes()}, {"offsets", offsets}};
  }
  return out;
}

// {key: dtype} of every entry of `state` as PyTorch's optimizers keep it: Adam's "step" a
// float32 tensor (`_get_scalar_dtype()` under the default float32 dtype, not the parameters'),
// the lr (a Python float, observed as float64) and every other state tensor in `dtype`, the
// parameters' dtype (torch.zeros_like(p)).
nlohmann::json ExpectedStateDTypes(const reference::RefTensorMap& state, DType dtype) {
  nlohmann::json out = nlohmann::json::object();
  const std::string step = ".step", lr = ".lr";
  auto ends_with = [](const std::string& key, const std::string& suffix) {
    return key.size() >= suffix.size() &&
           key.compare(key.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  for (const auto& [key, t] : state) {
    out[key] = ends_with(key, step) ? "float32" : ends_with(key, lr) ? "float64" : DTypeName(dtype);
  }
  return out;
}

// {key: dtype} of the rank's "optim/<key>" tensor observations.
nlohmann::json ObservedStateDTypes(const nlohmann::json& observations) {
  nlohmann::json out = nlohmann::json::object();
  const std::string prefix = "optim/";
  if (!observations.contains(kTensors)) return out;
  for (const auto& [name, t] : observations.at(kTensors).items()) {
    if (name.rfind(prefix, 0) == 0 && t.is_object() && t.contains("dtype")) {
      out[name.substr(prefix.size())] = t.at("dtype");
    }
  }
  return out;
}

// The sharding of the "state.<fqn>.<name>" entries of an optimizer state dict.
nlohmann::json StateShardingJson(const nn::StateDict& sd) {
  nlohmann::json out = StateDictShardingJson(sd);
  for (const auto& [key, t] : sd) {
    if (key.rfind(kStatePrefix, 0) != 0) out.erase(key);
  }
  return out;
}

nn::ModulePtr BuildSharded(const ParityCase& c, RankEnv& env) {
  nn::ModulePtr module = c.model.BuildEngineFromInputs(env.Inputs(), c.dtype);
  module->to(env.device);
  const std::vector<std::string> frozen = FrozenFqns(c, env.params);
  for (auto& [fqn, p] : module->named_parameters()) {
    if (Contains(frozen, fqn)) p.set_requires_grad(false);
  }
  ShardChildrenThenRoot(module, ShardOptionsOf(env));
  return module;
}

// The case's optimizer over `module`: one group of the case's lr, and with param_groups a second
// one added with its own lr (SecondGroupFqns).
std::unique_ptr<optim::Optimizer> BuildOptimizer(const ParityCase& c, const CaseParams& params,
                                                 nn::Module& module) {
  const std::vector<std::string> second = SecondGroupFqns(c, params);
  std::vector<std::pair<std::string, Tensor>> first_params;
  std::vector<Tensor> second_params;
  for (auto& [fqn, p] : module.named_parameters()) {
    if (Contains(second, fqn)) {
      second_params.push_back(p);
    } else {
      first_params.emplace_back(fqn, p);
    }
  }
  std::unique_ptr<optim::Optimizer> optimizer = MakeEngineOptimizer(c.optim, first_params);
  if (!second.empty())
    optimizer->add_param_group(second_params, GroupLrs(c, params).back(), second);
  return optimizer;
}

nlohmann::json RunRank(const std::string& kind, RankEnv& env) {
  const ParityCase c = DecodeParityCase(kind, env.params);
  checkpoint::StateDictOptions options;
  options.full_state_dict = env.params.GetBool("full_state_dict");

  nn::ModulePtr saver = BuildSharded(c, env);
  auto saver_optim = BuildOptimizer(c, env.params, *saver);
  TrainEngineSteps(c.model, *saver, *saver_optim, env.Inputs(), 0, c.steps);
  const nn::StateDict model_sd = ClonedStateDict(checkpoint::get_model_state_dict(*saver, options));
  const nn::StateDict optim_sd =
      ClonedStateDict(checkpoint::get_optimizer_state_dict(*saver, *saver_optim, options));

  // A model and optimizer built from the case's initial weights take one step of their own
  // (the optimizer has state then), then load both dicts: the loaded state replaces theirs.
  nn::ModulePtr loader = BuildSharded(c, env);
  auto loader_optim = BuildOptimizer(c, env.params, *loader);
  // Another learning rate than the saver's: only the loaded param_groups give it back.
  for (optim::ParamGroup& group : loader_optim->param_groups()) group.lr *= 2;
  TrainEngineSteps(c.model, *loader, *loader_optim, env.Inputs(), 0, 1);
  checkpoint::set_model_state_dict(*loader, model_sd, options);
  checkpoint::set_optimizer_state_dict(*loader, *loader_optim, optim_sd, options);
  std::vector<double> loaded_lrs;
  for (const optim::ParamGroup& group : loader_optim->param_groups())
    loaded_lrs.push_back(group.lr);

  const EngineTrainingRecord continued = TrainEngineSteps(
      c.model, *saver, *saver_optim, env.Inputs(), c.steps, 1, LocalParameterShards);
  const EngineTrainingRecord loaded = TrainEngineSteps(
      c.model, *loader, *loader_optim, env.Inputs(), c.steps, 1, LocalParameterShards);
  // The dtypes the loaded optimizer keeps (a load must not cast Adam's step counter).
  nlohmann::json loaded_dtypes = nlohmann::json::object();
  for (const auto& [key, value] :
       checkpoint::get_optimizer_state_dict(*loader, *loader_optim, options)) {
    loaded_dtypes[key] = DTypeName(value.dtype());
  }

  nlohmann::json obs;
  obs["loaded_state_dtypes"] = loaded_dtypes;
  obs["loaded_lrs"] = loaded_lrs;
  obs["model_sharding"] = StateDictShardingJson(model_sd);
  obs["optim_sharding"] = StateShardingJson(optim_sd);
  obs[kTensors] = StateDictPiecesJson(optim_sd, "optim/");
  const std::string dtype = DTypeName(c.dtype);
  obs[kTensors].update(MapToJson(continued.parameters.back(), dtype, "continued/"));
  obs[kTensors].update(MapToJson(loaded.parameters.back(), dtype, "loaded/"));
  return obs;
}

void Judge(const std::string& kind, const CaseParams& params, int world,
           const std::vector<nlohmann::json>& per_rank, CheckList& checks) {
  const ParityCase c = DecodeParityCase(kind, params);
  const bool full = params.GetBool("full_state_dict");
  const reference::RefTensorMap state = OracleOptimizerState(c, params, world);
  const Tolerance tol = c.ToleranceFor(c.dtype);
  // Each state tensor judged at atol x max(1, its largest magnitude), as the parity families
  // judge gradients: a momentum element that cancels to near zero carries the rounding of the
  // large terms it sums.
  const std::map<std::string, double> scales = MaxAbsByFqn({state});
  ErrorStats err;
  for (int r = 0; r < world; ++r) {
    const std::string who = RankName(r);
    CheckRankEqual(checks, per_rank, r,
                   {"model_sharding", "model state dict sharding (global shape and offsets)",
                    ExpectedModelSharding(c, r, world, full)});
    CheckRankEqual(checks, per_rank, r,
                   {"optim_sharding", "optimizer state sharding (global shape and offsets)",
                    ExpectedSharding(state, r, world, full)});
    // Keys and values against the oracle's optimizer (the key sets must match exactly).
    // The dtypes (values are compared in float64 below): Adam's step counter stays float32
    // whatever the parameters' dtype.
    checks.CheckEqual(who + " optimizer state dict dtypes", ExpectedStateDTypes(state, c.dtype),
                      ObservedStateDTypes(per_rank[static_cast<size_t>(r)]));
    CheckRankEqual(
        checks, per_rank, r,
        {"loaded_state_dtypes", "the loaded optimizer's state dict dtypes after its step",
         ExpectedStateDTypes(state, c.dtype)});
    CheckRankEqual(checks, per_rank, r,
                   {"loaded_lrs", "the loading optimizer's param_groups lr after the load",
                    GroupLrs(c, params)});
    err.Merge(CheckMapsClose(checks, who + " optimizer state dict vs oracle",
                             RankPieces(state, r, world, full),
                             MapFromObservations(per_rank, r, "optim/"), tol, &scales));
    // After loading both dicts, the next step equals the saver's own, bit for bit.
    if (CheckLoadedContinuesLikeSaver(checks, per_rank, r, c.model.ParameterNames()) == 0) {
      checks.Fail(who + " parameters after the next step", "no continued/{fqn} observation");
    }
  }
  checks.SetFigure("steps", c.steps);
  checks.SetFigure("state_max_abs_err", err.max_abs);
  checks.SetFigure("state_max_rel_err", err.max_rel);
}

// The scenario on the zoo model `kind_name`.
Scenario MakeScenario(const std::string& kind_name, const std::string& name,
                      const std::string& description, const std::string& seed_test) {
  const ZooModelKind& kind = ZooModel::Kind(kind_name);
  Scenario s;
  s.info.name = name;
  s.info.description = description;
  s.info.seed_test = seed_test;
  s.info.params = ParityParams(
      kind, ParamSpec::SizeString("dtype", "the engine's parameter and input dtype", "float32"));
  for (ParamSpec& p : s.info.params) {
    if (p.name == "steps") p = ParamSpec::SizeInt("steps", "training steps before the save", 3, 1);
  }
  s.info.params.push_back(ParamSpec::SizeBool(
      "param_groups",
      "True: the second half of the parameters (registration order) in a second param group "
      "added with twice the lr (test_multi_param_groups)",
      false));
  s.info.params.push_back(ParamSpec::SizeBool(
      "frozen",
      "True: the last parameter requires_grad=False before fully_shard (in its group, never a "
      "gradient or state)",
      false));
  s.info.params.push_back(ParamSpec::Axis(
      "full_state_dict", "StateDictOptions.full_state_dict of the get and set calls",
      {"False", "True"}));
  s.info.observations
      .Add(ObservationKey::Custom(
          "model_sharding", {{"type", "object"}},
          "per key of get_model_state_dict (every location of a tied weight included): "
          "{\"global_shape\", \"offsets\"} of a sharded (DTensor) value, null for a plain "
          "tensor"))
      .Add(ObservationKey::Custom(
          "loaded_state_dtypes", {{"type", "object"}},
          "per key of get_optimizer_state_dict of the loading optimizer after its next step: the "
          "value's dtype (the lr, a Python float: float64)"))
      .Add(ObservationKey::Custom("loaded_lrs",
                                  {{"type", "array"}, {"items", {{"type", "number"}}}},
                                  "the lr of each param group of the loading optimizer right after "
                                  "set_optimizer_state_dict, in group order"))
      .Add(ObservationKey::Custom(
          "optim_sharding", {{"type", "object"}},
          "per \"state.<fqn>.<name>\" key of get_optimizer_state_dict: {\"global_shape\", "
          "\"offsets\"} of a sharded (DTensor) value, null for a plain tensor"))
      .AddTensors({"optim/{name}", "the case's dtype (step: float32, lr: float64)",
                   "the rank's piece, or the full tensor",
                   "get_optimizer_state_dict after `steps` steps: every \"state.<fqn>.<name>\" "
                   "tensor and \"param_groups.<fqn>.lr\" (a 0-dim tensor)"})
      .AddTensors({"continued/{fqn}", "the case's dtype", "the rank's shard",
                   "the saver's parameters after one more step (input `steps`)"})
      .AddTensors({"loaded/{fqn}", "the case's dtype", "the rank's shard",
                   "the loader's parameters after the same step"});
  s.info.default_world = 2;
  s.info.max_world = 8;
  s.info.test_runs = {{1, {}}, {3, {}}, {4, {}}, {8, {}}};
  s.info.inputs = ZooInputsDoc(kind, "the case's dtype");
  s.inputs = [kind_name](const CaseParams& params, int world) {
    const ParityCase c = DecodeParityCase(kind_name, params);
    return c.model.MakeCaseInputs(c.seed, c.dtype, c.steps + 1, world);
  };
  s.run_rank = [kind_name](RankEnv& env) { return RunRank(kind_name, env); };
  s.judge = [kind_name](const CaseParams& params, int world,
                        const std::vector<nlohmann::json>& per_rank,
                        CheckList& checks) { Judge(kind_name, params, world, per_rank, checks); };
  return s;
}

}  // namespace

Scenario OptimizerStateDictScenario() {
  Scenario s = MakeScenario(
      "mlp", "fully_shard_state_dict/optimizer_state_dict",
      "MLP sharded per child then root, trained `steps` steps with SGD (momentum) or Adam: "
      "get_optimizer_state_dict (sharded or full_state_dict) against the oracle optimizer's "
      "state, keyed by FQN; a fresh model and optimizer that load the model and optimizer "
      "dicts take the next step bit-identically to the saver",
      "test/distributed/checkpoint/test_state_dict.py::TestStateDict (get_optimizer_state_dict / "
      "set_optimizer_state_dict of a fully_shard-ed model, save then load then train)");
  // Adam's step counter in float32 beside float64 parameters and moments (an extra default run:
  // in a float32 case a counter kept in the parameters' dtype looks right).
  // test_multi_param_groups: two param groups of their own lr, and a frozen parameter that keeps
  // its param_groups entry without state.
  s.info.extra_default_runs = {
      {2, {{"dtype", "float64"}, {"optim", "adam"}}},
      {2, {{"optim", "adam"}, {"param_groups", "True"}, {"frozen", "True"}}}};
  return s;
}

Scenario OptimizerStateDictSharedWeightScenario() {
  return MakeScenario(
      "transformer", "fully_shard_state_dict/optimizer_state_dict_shared_weight",
      "the same on the Transformer (weight_tying: output.weight is tok_embeddings.weight, in "
      "the root's group): the model dict reports the tied parameter under both keys, sharded "
      "alike; the optimizer dict keys its state by the first FQN (tok_embeddings.weight)",
      "test/distributed/checkpoint/test_state_dict.py::TestStateDict::test_shared_weight");
}

}  // namespace fsdp::conformance
