// Family `fully_shard_state_dict` (issue #15, FSDP2 state dicts; test_fully_shard_state_dict.py):
//   sharded_state_dict  model.state_dict() of a fully_shard-ed MLP: the plain model's keys,
//                       every parameter as this rank's torch.chunk rows with its global shape
//                       and offsets (a Shard(0) DTensor), buffers full, no collective; with
//                       shard_placement=largest_dim (an extra default run at world 4)
//                       out_proj.weight is a Shard(1) DTensor: piece and offsets along dim 1;
//                       with after_forward=True (reshard_after_forward=False, the seed's
//                       model2) the negated state dict is loaded after a forward and the
//                       state dict taken after another: the state dict hooks must reshard;
//                       with replace_param=True (an extra default run) in_proj.weight is
//                       replaced after fully_shard by a new parameter holding the negated
//                       piece, and a forward runs first: lazy init must adopt it
//                       (test_reset_sharded_param_in_lazy_init)
//   load_and_continue   a state dict taken after one SGD step loads (assign False or True)
//                       into a zero model that has run a forward (lazy init done, so with
//                       assign=True the load's post-hook must adopt the new tensors), and the
//                       next step of both models is identical
//   full_state_dict     get_model_state_dict(full_state_dict) equals the weights on every rank,
//                       with cpu_offload only rank 0 holds it (cpu_offload alone keeps the
//                       sharded dict on every rank), and set_model_state_dict with
//                       broadcast_from_rank0 loads it into a zero model (rank 0 alone passes it),
//                       also from rank 0's dict in float64 (cast to the model's dtype); with
//                       replicate=2 (an extra default run at world 4) over an HSDP mesh
//   strict_load         set_model_state_dict's strict (test_state_dict.py's test_strict): an
//                       unexpected key raises, strict=False returns the missing and unexpected
//                       keys and loads the rest, a missing key raises; broadcast_from_rank0 with
//                       strict=False from a rank-0 full dict that lacks a key: the key keeps the
//                       model's value and is not missing (_broadcast_state_dict fills it in), as
//                       with full_state_dict=True alone (an unexpected key then reported); a
//                       full dict with an extra row on dim 0 raises its size mismatch under
//                       strict=False too
//   optimizer_state_dict, optimizer_state_dict_shared_weight  get/set_optimizer_state_dict
//   (conformance/optimizer_state_dict_scenario.h)
// Model and rules: conformance/state_dict_model.h (dim 5: uneven dim 0 at every world > 1).
#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "conformance/fsdp_params.h"
#include "conformance/observations.h"
#include "conformance/optimizer_state_dict_scenario.h"
#include "conformance/rank_checks.h"
#include "conformance/scenario_registry.h"
#include "conformance/state_dict_model.h"
#include "engine/autograd/grad_mode.h"
#include "engine/checkpoint/state_dict.h"
#include "engine/distributed/comm_debug_mode.h"
#include "engine/ops/elementwise.h"
#include "engine/ops/shape_ops.h"

namespace fsdp::conformance {

namespace {

constexpr const char* kSeedFile = "test_fully_shard_state_dict.py::TestFullyShardStateDictMultiProcess::";

void JudgeAgainst(const ExpectFn& expect, const CaseParams& p, int world,
                  const std::vector<nlohmann::json>& per_rank, CheckList& checks,
                  const std::vector<std::pair<std::string, std::string>>& keys) {
  const auto expected = expect(p, world);
  for (int r = 0; r < world; ++r) {
    for (const auto& [key, what] : keys) {
      CheckRankEqual(checks, per_rank, r, {key, what, expected[r][key]});
    }
    CheckRankTensorsExact(checks, per_rank, r, expected[r][kTensors]);
  }
}

Scenario ShardedStateDict() {
  Scenario s;
  s.info.name = "fully_shard_state_dict/sharded_state_dict";
  s.info.description =
      "state_dict() of a fully_shard-ed MLP: the plain model's keys, each parameter this rank's "
      "torch.chunk rows with global shape and offsets, buffers full, no collective";
  s.info.seed_test = std::string(kSeedFile) + "test_dp_state_dict_save_load";
  s.info.params = StateDictModelParams();
  s.info.params.push_back(ShardPlacementParam());
  s.info.params.push_back(ParamSpec::Axis(
      "after_forward",
      "True: both fully_shard calls with reshard_after_forward=False; the state dict negated "
      "is loaded after a forward, and the state dict reported is taken after another forward "
      "(the parameters unsharded both times: the state dict pre-hooks reshard)",
      {"False", "True"}));
  s.info.params.push_back(ParamSpec::SizeBool(
      "replace_param",
      "True: after fully_shard, in_proj.weight is replaced by a new parameter (this rank's piece "
      "negated: nn.Parameter(DTensor.from_local(...)) in PyTorch), and a no_grad forward runs "
      "(lazy init adopts the new parameter: FSDPParam.reset_sharded_param) before the rest",
      false));
  s.info.observations.Add(ObservationKey::StringList("keys", "the state dict's keys, in order"))
      .Add(ObservationKey::Custom(
          "sharding", {{"type", "object"}},
          "per key: {\"global_shape\", \"offsets\"} of a sharded (DTensor) value, null for a "
          "plain tensor"))
      .Add(ObservationKey::IntegerMap("state_dict_collectives",
                                      "collectives issued by state_dict() (CommDebugMode op keys)"))
      .AddTensors({"shard/{fqn}", "float32", "the rank's piece: [rows, *rest], or the full buffer",
                   "each value of the state dict (this rank's local tensor)"});
  s.info.default_world = 2;
  s.info.max_world = 8;
  // A Shard(d > 0) placement (out_proj.weight [dim, 4*dim] on its dim 1 at even worlds): its
  // piece and offsets are along d, not dim 0.
  s.info.extra_default_runs = {{4, {{kShardPlacementParam, "largest_dim"}}},
                               {2, {{"replace_param", "True"}}}};
  s.info.test_runs = {{1, {}}, {3, {}}, {4, {}}, {8, {}}};
  s.info.inputs = StateDictModelInputsDoc();
  s.inputs = StateDictModelInputs;
  s.run_rank = [](RankEnv& env) {
    const bool after_forward = env.params.GetBool("after_forward");
    nn::ModulePtr model = BuildShardedStateDictModel(env, /*zero_weights=*/false, !after_forward);
    const Tensor input = env.Inputs().Get(StepInputName(0)).to(env.device);
    auto forward = [&] {
      autograd::NoGradGuard no_grad;
      (*model)(input);
    };
    if (env.params.GetBool("replace_param")) {
      nn::Module& in_proj = *model->child("in_proj");
      Tensor replaced = ops::kernels::Neg(in_proj.parameter("weight").detach());
      replaced.set_requires_grad(true);
      in_proj.set_parameter("weight", replaced);
      forward();  // lazy init
    }
    if (after_forward) {
      // test_dp_state_dict_save_load's "Check that state dict hooks reshard" (model2), for the
      // load pre-hook as well: PyTorch's FSDPParamGroup registers to_sharded as both.
      const nn::StateDict negated = ClonedStateDict(model->state_dict(), /*negate=*/true);
      forward();  // every parameter stays unsharded
      model->load_state_dict(negated, /*strict=*/true);
      forward();
    }
    distributed::CommDebugMode comm;
    const nn::StateDict sd = model->state_dict();
    comm.exit();
    nlohmann::json obs;
    obs["keys"] = sd.keys();
    obs["sharding"] = StateDictShardingJson(sd);
    obs["state_dict_collectives"] = comm.get_comm_counts();
    obs[kTensors] = StateDictPiecesJson(sd, "shard/");
    return obs;
  };
  s.expect = [](const CaseParams& p, int world) {
    NamedTensors weights = StateDictModelInputs(p, world).weights;
    for (auto& [key, t] : weights) {
      if (p.GetBool("replace_param") && key == "in_proj.weight") t = ops::kernels::Neg(t);
      if (p.GetBool("after_forward")) t = ops::kernels::Neg(t);
    }
    std::vector<nlohmann::json> out;
    for (int r = 0; r < world; ++r) {
      nlohmann::json obs;
      obs["keys"] = KeysOf(weights);
      obs["sharding"] = nlohmann::json::object();
      for (const auto& [key, t] : weights) {
        obs["sharding"][key] = IsShardedKey(key)
                                   ? ChunkSharding(t, r, world, ShardDimOf(p, t.sizes(), world))
                                   : nlohmann::json(nullptr);
      }
      obs["state_dict_collectives"] = nlohmann::json::object();
      obs[kTensors] = ExpectedPieces(weights, r, world, "shard/", p);
      out.push_back(obs);
    }
    return out;
  };
  s.judge = [expect = s.expect](const CaseParams& p, int world,
                                const std::vector<nlohmann::json>& per_rank, CheckList& checks) {
    JudgeAgainst(expect, p, world, per_rank, checks,
                 {{"keys", "keys"}, {"sharding", "sharding"},
                  {"state_dict_collectives", "collectives of state_dict()"}});
  };
  return s;
}

Scenario LoadAndContinue() {
  Scenario s;
  s.info.name = "fully_shard_state_dict/load_and_continue";
  s.info.description =
      "a state dict saved after one SGD step loads into a zero model that has run a forward "
      "(load_state_dict, assign False/True) and the next step of both models is identical";
  s.info.seed_test = std::string(kSeedFile) + "test_dp_state_dict_save_load";
  s.info.params = StateDictModelParams();
  s.info.params.push_back(ParamSpec::Axis("assign", "load_state_dict(assign=...)", {"False", "True"}));
  s.info.observations.Add(ObservationKey::StringList("keys", "the saved state dict's keys"))
      .AddTensors({"continued/{fqn}", "float32", "the rank's piece",
                   "the saving model's values after its second step"})
      .AddTensors({"loaded/{fqn}", "float32", "the rank's piece",
                   "the loading model's values after the same second step"});
  s.info.default_world = 2;
  s.info.max_world = 8;
  s.info.test_runs = {{1, {}}, {3, {}}, {4, {}}, {8, {}}};
  s.info.inputs = StateDictModelInputsDoc();
  s.inputs = StateDictModelInputs;
  s.run_rank = [](RankEnv& env) {
    const bool assign = env.params.GetBool("assign");
    nn::ModulePtr model = BuildShardedStateDictModel(env);
    SgdStepOnSum(*model, env.Inputs().Get(StepInputName(0)).to(env.device));
    const nn::StateDict saved = ClonedStateDict(model->state_dict());
    nn::ModulePtr other = BuildShardedStateDictModel(env, /*zero_weights=*/true);
    {
      // Lazy init before the load: with assign=True only the load's post-hook
      // (FSDPParam.reset_sharded_param) can then adopt the new tensors.
      autograd::NoGradGuard no_grad;
      (*other)(env.Inputs().Get(StepInputName(0)).to(env.device));
    }
    other->load_state_dict(saved, /*strict=*/true, assign);
    const Tensor input = env.Inputs().Get(StepInputName(1)).to(env.device);
    SgdStepOnSum(*model, input);
    SgdStepOnSum(*other, input);
    nlohmann::json obs;
    obs["keys"] = saved.keys();
    obs[kTensors] = StateDictPiecesJson(model->state_dict(), "continued/");
    obs[kTensors].update(StateDictPiecesJson(other->state_dict(), "loaded/"));
    return obs;
  };
  s.judge = [](const CaseParams& p, int world, const std::vector<nlohmann::json>& per_rank,
               CheckList& checks) {
    const NamedTensors weights = StateDictModelInputs(p, world).weights;
    for (int r = 0; r < world; ++r) {
      CheckRankEqual(checks, per_rank, r, {"keys", "keys", KeysOf(weights)});
      CheckLoadedContinuesLikeSaver(checks, per_rank, r, KeysOf(weights));
    }
  };
  return s;
}

Scenario FullStateDict() {
  Scenario s;
  s.info.name = "fully_shard_state_dict/full_state_dict";
  s.info.description =
      "get_model_state_dict(full_state_dict) equals the weights on every rank, on rank 0 only "
      "with cpu_offload (cpu_offload alone: sharded, every rank); "
      "set_model_state_dict(broadcast_from_rank0) loads it into a zero model";
  s.info.seed_test = std::string(kSeedFile) + "test_rank0_offload_full_state_dict";
  s.info.params = StateDictModelParams();
  s.info.params.push_back(ReplicateParam());
  s.info.observations
      .Add(ObservationKey::Integer("rank0_only_size",
                                   "entries of get_model_state_dict(full_state_dict, cpu_offload)"))
      .Add(ObservationKey::Integer("offloaded_size",
                                   "entries of get_model_state_dict(cpu_offload) (sharded)"))
      .AddTensors({"full/{fqn}", "float32", "the full shape",
                   "get_model_state_dict(full_state_dict=True) on every rank"})
      .AddTensors({"offloaded/{fqn}", "float32", "the rank's piece",
                   "get_model_state_dict(cpu_offload=True) without full_state_dict: the sharded "
                   "dict on every rank (PyTorch offloads it to the CPU, rank 0 only is for full "
                   "state dicts)"})
      .AddTensors({"loaded/{fqn}", "float32", "the rank's piece",
                   "a zero model's state dict after set_model_state_dict(full, "
                   "broadcast_from_rank0=True), rank 0 alone passing the dict"})
      .AddTensors({"loaded_from_float64/{fqn}", "float32", "the rank's piece",
                   "a zero model's state dict after the same load of rank 0's full dict in "
                   "float64, every value divided by 3: the model keeps its dtype, each value "
                   "float32(float64(w) / 3)"});
  s.info.default_world = 2;
  s.info.max_world = 8;
  // World 4 splits out_proj's 5 rows 2, 2, 1, 0: the full dict gathers a one-row piece and an
  // empty one (world 2 gives every rank at least two rows of every parameter). HSDP at world 4
  // (a 2 x 2 mesh): the gather runs over the shard group, where global rank 2 is shard rank 0.
  s.info.extra_default_runs = {{4, {}}, {4, {{"replicate", "2"}}}};
  s.excluded = [](const CaseParams& p, int world) -> std::optional<std::string> {
    if (world % p.GetInt("replicate") != 0) return "replicate must divide the world size";
    return std::nullopt;
  };
  s.info.test_runs = {{1, {}}, {3, {}}, {4, {}}, {8, {}}};
  s.info.inputs = StateDictModelInputsDoc();
  s.inputs = StateDictModelInputs;
  s.run_rank = [](RankEnv& env) {
    nn::ModulePtr model = BuildShardedStateDictModel(env);
    checkpoint::StateDictOptions full;
    full.full_state_dict = true;
    checkpoint::StateDictOptions rank0 = full;
    rank0.cpu_offload = true;
    nlohmann::json obs;
    obs[kTensors] = StateDictPiecesJson(checkpoint::get_model_state_dict(*model, full), "full/");
    checkpoint::StateDictOptions offload;
    offload.cpu_offload = true;
    const nn::StateDict offloaded = checkpoint::get_model_state_dict(*model, offload);
    obs["offloaded_size"] = offloaded.size();
    obs[kTensors].update(StateDictPiecesJson(offloaded, "offloaded/"));
    const nn::StateDict on_rank0 = checkpoint::get_model_state_dict(*model, rank0);
    obs["rank0_only_size"] = on_rank0.size();
    nn::ModulePtr other = BuildShardedStateDictModel(env, /*zero_weights=*/true);
    checkpoint::StateDictOptions broadcast = rank0;
    broadcast.broadcast_from_rank0 = true;
    checkpoint::set_model_state_dict(*other, on_rank0, broadcast);
    obs[kTensors].update(StateDictPiecesJson(other->state_dict(), "loaded/"));
    // Rank 0's dict in another dtype than the model's: the load casts it (PyTorch broadcasts
    // rank 0's dtype, then copy_ into the model's tensors).
    nn::StateDict on_rank0_f64;
    for (const auto& [key, value] : on_rank0) {
      on_rank0_f64.insert(key, ops::kernels::DivScalar(value.to(DType::kFloat64), 3.0));
    }
    nn::ModulePtr other_f64 = BuildShardedStateDictModel(env, /*zero_weights=*/true);
    checkpoint::set_model_state_dict(*other_f64, on_rank0_f64, broadcast);
    obs[kTensors].update(StateDictPiecesJson(other_f64->state_dict(), "loaded_from_float64/"));
    return obs;
  };
  s.expect = [](const CaseParams& p, int world) {
    const NamedTensors weights = StateDictModelInputs(p, world).weights;
    NamedTensors thirds = weights;
    for (auto& [key, t] : thirds) {
      t = ops::kernels::DivScalar(t.to(DType::kFloat64), 3.0).to(t.dtype());
    }
    const int shard = ShardSizeOf(p, world);
    std::vector<nlohmann::json> out;
    for (int r = 0; r < world; ++r) {
      const int shard_rank = ShardRankOf(p, r, world);
      nlohmann::json obs;
      obs["rank0_only_size"] = r == 0 ? weights.size() : 0;
      obs["offloaded_size"] = weights.size();
      obs[kTensors] = ExpectedPieces(weights, 0, 1, "full/", p);
      obs[kTensors].update(ExpectedPieces(weights, shard_rank, shard, "offloaded/", p));
      obs[kTensors].update(ExpectedPieces(weights, shard_rank, shard, "loaded/", p));
      obs[kTensors].update(ExpectedPieces(thirds, shard_rank, shard, "loaded_from_float64/", p));
      out.push_back(obs);
    }
    return out;
  };
  s.judge = [expect = s.expect](const CaseParams& p, int world,
                                const std::vector<nlohmann::json>& per_rank, CheckList& checks) {
    JudgeAgainst(expect, p, world, per_rank, checks,
                 {{"rank0_only_size", "rank-0-only entries"},
                  {"offloaded_size", "entries of the cpu_offload sharded dict"}});
  };
  return s;
}

// The message of the error `load` throws, or "" when it returns.
template <typename Fn>
std::string ErrorOf(Fn&& load) {
  try {
    load();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

constexpr const char* kUnexpectedKey = "abc";

Scenario StrictLoad() {
  Scenario s;
  s.info.name = "fully_shard_state_dict/strict_load";
  s.info.description =
      "set_model_state_dict(strict): an unexpected key raises; strict=False returns the missing "
      "and unexpected keys and loads the rest into a zero model; a missing key raises; "
      "broadcast_from_rank0 with strict=False keeps a key rank 0 lacks, not reported missing";
  s.info.seed_test = "test/distributed/checkpoint/test_state_dict.py::TestStateDict::test_strict";
  s.info.params = StateDictModelParams();
  s.info.observations
      .Add(ObservationKey::String("unexpected_error",
                                  "the error of set_model_state_dict (strict) of the model's state "
                                  "dict plus \"abc\" (empty when it loads)"))
      .Add(ObservationKey::StringList(
          "missing_keys",
          "set_model_state_dict(strict=False) of that dict without its first "
          "parameter's key: missing_keys"))
      .Add(ObservationKey::StringList("unexpected_keys", "the same call's unexpected_keys"))
      .Add(ObservationKey::String(
          "missing_error",
          "the error of set_model_state_dict (strict) of the dict without its "
          "first parameter's key and without \"abc\" (empty when it loads)"))
      .AddTensors({"loaded/{fqn}", "float32", "the rank's piece",
                   "a zero model's state dict after the strict=False load"})
      .Add(ObservationKey::StringList(
          "broadcast_missing_keys",
          "set_model_state_dict(full_state_dict, broadcast_from_rank0, strict=False) into the "
          "model of rank 0's full dict negated and without the first parameter's key (the other "
          "ranks pass {}): missing_keys"))
      .AddTensors({"broadcast_loaded/{fqn}", "float32", "the rank's piece",
                   "the model's state dict after that load"})
      .Add(ObservationKey::StringList(
          "full_missing_keys",
          "set_model_state_dict(full_state_dict=True, strict=False) into the model of its full "
          "dict negated, without the first parameter's key and with \"abc\": missing_keys"))
      .Add(ObservationKey::StringList("full_unexpected_keys", "the same call's unexpected_keys"))
      .AddTensors({"full_loaded/{fqn}", "float32", "the rank's piece",
                   "the model's state dict after that load"})
      .Add(ObservationKey::String(
          "extra_rows_error",
          "the error of set_model_state_dict(full_state_dict=True, strict=False) of the full "
          "dict (every rank) whose first parameter has one extra row of ones on dim 0 (empty "
          "when it loads): strict=False keeps the size-mismatch errors"));
  s.info.default_world = 2;
  s.info.max_world = 8;
  s.info.test_runs = {{1, {}}, {3, {}}};
  s.info.inputs = StateDictModelInputsDoc();
  s.inputs = StateDictModelInputs;
  s.run_rank = [](RankEnv& env) {
    nn::ModulePtr model = BuildShardedStateDictModel(env);
    const nn::StateDict sd = ClonedStateDict(checkpoint::get_model_state_dict(*model));
    std::string first;  // the first parameter's key (a buffer would keep its built value)
    for (const std::string& key : sd.keys()) {
      if (first.empty() && IsShardedKey(key)) first = key;
    }
    nn::StateDict with_unexpected = sd;
    with_unexpected.insert(kUnexpectedKey, Tensor::zeros({10}, DType::kFloat32));
    nlohmann::json obs;
    obs["unexpected_error"] =
        ErrorOf([&] { checkpoint::set_model_state_dict(*model, with_unexpected); });
    nn::StateDict without_first;
    for (const auto& [key, value] : with_unexpected) {
      if (key == first) continue;
      without_first.insert(key, value);
      if (const nn::ShardedEntry* entry = sd.sharding(key))
        without_first.sharded.insert(key, *entry);
    }
    nn::ModulePtr other = BuildShardedStateDictModel(env, /*zero_weights=*/true);
    checkpoint::StateDictOptions non_strict;
    non_strict.strict = false;
    const nn::IncompatibleKeys keys =
        checkpoint::set_model_state_dict(*other, without_first, non_strict);
    obs["missing_keys"] = keys.missing_keys;
    obs["unexpected_keys"] = keys.unexpected_keys;
    obs[kTensors] = StateDictPiecesJson(other->state_dict(), "loaded/");
    nn::StateDict missing_only;
    for (const auto& [key, value] : without_first) {
      if (key == kUnexpectedKey) continue;
      missing_only.insert(key, value);
      if (const nn::ShardedEntry* entry = sd.sharding(key))
        missing_only.sharded.insert(key, *entry);
    }
    obs["missing_error"] = ErrorOf([&] { checkpoint::set_model_state_dict(*model, missing_only); });
    // broadcast_from_rank0 under strict=False: PyTorch's _broadcast_state_dict starts from the
    // model's own dict, so a key rank 0's dict lacks keeps the model's value (not missing).
    checkpoint::StateDictOptions rank0;
    rank0.full_state_dict = true;
    rank0.cpu_offload = true;
    nn::StateDict negated_without_first;
    for (const auto& [key, value] : checkpoint::get_model_state_dict(*model, rank0)) {
      if (key != first) negated_without_first.insert(key, ops::kernels::Neg(value));
    }
    checkpoint::StateDictOptions broadcast = rank0;
    broadcast.broadcast_from_rank0 = true;
    broadcast.strict = false;
    obs["broadcast_missing_keys"] =
        checkpoint::set_model_state_dict(*model, negated_without_first, broadcast).missing_keys;
    obs[kTensors].update(StateDictPiecesJson(model->state_dict(), "broadcast_loaded/"));
    // A full dict without the first parameter's key and with an unexpected one (every rank):
    // PyTorch fills the missing key from the model's own dict and keeps the unexpected one.
    checkpoint::StateDictOptions full_non_strict;
    full_non_strict.full_state_dict = true;
    full_non_strict.strict = false;
    nn::StateDict full_without_first;
    for (const auto& [key, value] : checkpoint::get_model_state_dict(*model, full_non_strict)) {
      if (key != first) full_without_first.insert(key, ops::kernels::Neg(value));
    }
    full_without_first.insert(kUnexpectedKey, Tensor::zeros({10}, DType::kFloat32));
    const nn::IncompatibleKeys full_keys =
        checkpoint::set_model_state_dict(*model, full_without_first, full_non_strict);
    obs["full_missing_keys"] = full_keys.missing_keys;
    obs["full_unexpected_keys"] = full_keys.unexpected_keys;
    obs[kTensors].update(StateDictPiecesJson(model->state_dict(), "full_loaded/"));
    // A full dict with one row too many: the global shapes differ, strict or not.
    nn::StateDict extra_rows;
    for (const auto& [key, value] : checkpoint::get_model_state_dict(*other, full_non_strict)) {
      Shape row = value.sizes();
      row[0] = 1;
      extra_rows.insert(key, key == first
                                 ? ops::kernels::Cat({value, Tensor::ones(row, value.dtype())})
                                 : value.clone());
    }
    obs["extra_rows_error"] =
        ErrorOf([&] { checkpoint::set_model_state_dict(*other, extra_rows, full_non_strict); });
    return obs;
  };
  s.judge = [](const CaseParams& p, int world, const std::vector<nlohmann::json>& per_rank,
               CheckList& checks) {
    NamedTensors weights = StateDictModelInputs(p, world).weights;
    // The broadcast load: every value negated but the first parameter's, which keeps its own.
    NamedTensors broadcast = weights;
    bool first_seen = false;
    for (auto& [key, t] : broadcast) {
      if (first_seen || !IsShardedKey(key)) t = ops::kernels::Neg(t);
      first_seen = first_seen || IsShardedKey(key);
    }
    // The full strict=False load after it: every value of that model negated again but the
    // first parameter's, which keeps its value.
    NamedTensors full_loaded = broadcast;
    bool first_kept = false;
    for (auto& [key, t] : full_loaded) {
      if (first_kept || !IsShardedKey(key)) t = ops::kernels::Neg(t);
      first_kept = first_kept || IsShardedKey(key);
    }
    // The first parameter is not loaded: the zero model keeps zeros there.
    auto missing = std::find_if(weights.begin(), weights.end(),
                                [](const auto& kv) { return IsShardedKey(kv.first); });
    const std::string first = missing->first;
    missing->second = Tensor::zeros(missing->second.sizes(), DType::kFloat32);
    for (int r = 0; r < world; ++r) {
      const std::string who = RankName(r);
      const std::string unexpected_error =
          RankObservation(per_rank, r, "unexpected_error").get<std::string>();
      checks.CheckTrue(who + " strict load of an unexpected key raises \"Unexpected key\"",
                       unexpected_error.find("Unexpected key") != std::string::npos,
                       unexpected_error);
      CheckRankEqual(checks, per_rank, r,
                     {"missing_keys", "strict=False missing_keys", nlohmann::json({first})});
      CheckRankEqual(
          checks, per_rank, r,
          {"unexpected_keys", "strict=False unexpected_keys", nlohmann::json({kUnexpectedKey})});
      const std::string missing_error =
          RankObservation(per_rank, r, "missing_error").get<std::string>();
      checks.CheckTrue(who + " strict load without a key raises \"Missing key\"",
                       missing_error.find("Missing key") != std::string::npos, missing_error);
      CheckRankTensorsExact(checks, per_rank, r, ExpectedPieces(weights, r, world, "loaded/", p));
      CheckRankEqual(checks, per_rank, r,
                     {"broadcast_missing_keys", "broadcast_from_rank0 strict=False missing_keys",
                      nlohmann::json::array()});
      CheckRankTensorsExact(checks, per_rank, r,
                            ExpectedPieces(broadcast, r, world, "broadcast_loaded/", p));
      CheckRankEqual(checks, per_rank, r,
                     {"full_missing_keys", "full_state_dict strict=False missing_keys",
                      nlohmann::json::array()});
      CheckRankEqual(checks, per_rank, r,
                     {"full_unexpected_keys", "full_state_dict strict=False unexpected_keys",
                      nlohmann::json({kUnexpectedKey})});
      // Negated twice but the first parameter, negated once by the broadcast load before.
      CheckRankTensorsExact(checks, per_rank, r,
                            ExpectedPieces(full_loaded, r, world, "full_loaded/", p));
      const std::string extra_rows_error =
          RankObservation(per_rank, r, "extra_rows_error").get<std::string>();
      checks.CheckTrue(who +
                           " strict=False load of a full dict with an extra row raises \"size "
                           "mismatch for " +
                           first + "\"",
                       extra_rows_error.find("size mismatch for " + first) != std::string::npos,
                       extra_rows_error);
    }
  };
  return s;
}

}  // namespace

void RegisterFullyShardStateDictScenarios(ScenarioRegistry& registry) {
  registry.Add(ShardedStateDict());
  registry.Add(LoadAndContinue());
  registry.Add(FullStateDict());
  registry.Add(StrictLoad());
  registry.Add(OptimizerStateDictScenario());
  registry.Add(OptimizerStateDictSharedWeightScenario());
}

}  // namespace fsdp::conformance
