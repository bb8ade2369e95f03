// Family `fully_shard_comm` (seed 000, test_fully_shard_comm.py), the collective-count part:
//   communication_count   TestFullyShardCommunication.test_fully_shard_communication_count
//   manual_reshard_with_reshard_after_forward_false
//   ...test_manual_reshard_with_reshard_after_forward_false set_reshard_after_forward
//   ...test_set_reshard_after_forward (PyTorch's later test; not a seed)
//   backward_prefetch_forward_backward   TestFullyShardPrefetch,
//   _test_backward_prefetch_forward_backward backward_prefetch_multi_forward
//   TestFullyShardPrefetch, _test_backward_prefetch_multi_forward
//   backward_prefetch_unused_in_backward _test_backward_prefetch_unused_in_backward (mistargeted)
//   backward_prefetch_reused_module      a module used twice in one forward (a, b, a, out), two
//                                        iterations: each pre-backward pops its group's last
//                                        post-forward index, from this iteration's order
//   unshard_no_param_group, unshard_without_lazy_init   TestFullyShardUnshardMultiThread
// Each rank shards Transformer(ModelArgs(n_layers)) block by block and then the root, runs one
// forward under a CommDebugMode and one `loss.sum().backward()` under another, and reports the
// two count tables as comm_counts {"forward": {op: n}, "backward": {op: n}}. The judges derive
// the expected tables and event lists from the rules of docs/fsdp-behaviour.md, "Collective
// counts", "Backward prefetch" and "Manual unshard and reshard", under the case's semantics
// profile ("Semantics profiles": whether the root reshards after forward), so the scenarios run
// at any n_layers, world size and reshard_after_forward.
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "conformance/fsdp_params.h"
#include "conformance/observations.h"
#include "conformance/rank_checks.h"
#include "conformance/scenario_registry.h"
#include "conformance/sharded_parity.h"
#include "conformance/sharded_transformer.h"
#include "conformance/transformer_inputs.h"
#include "engine/core/rng.h"
#include "engine/distributed/comm_debug_mode.h"
#include "engine/fsdp/fully_shard.h"
#include "engine/fsdp/observer.h"
#include "engine/functional/functional.h"
#include "engine/nn/init.h"
#include "engine/nn/layers.h"
#include "engine/nn/models.h"
#include "engine/ops/elementwise.h"
#include "engine/optim/sgd.h"

namespace fsdp::conformance {

namespace {

constexpr const char* kSeed000 = "test_fully_shard_comm.py::TestFullyShardCommunication::";
constexpr const char* kAllGather = "c10d._allgather_base_";
constexpr const char* kReduceScatter = "c10d._reduce_scatter_base_";

// Runner-owned inputs of the Transformer scenarios: the same tokens on every rank.
CaseInputs TransformerInputs(const CaseParams& params, int world) {
  return TransformerCaseInputs(params.GetInt("n_layers"),
                               static_cast<uint64_t>(params.GetInt("seed")), world,
                               TokenBatches::kSameOnEveryRank);
}

// Every rank's expected observations are `expected`.
ExpectFn SameOnEveryRank(std::function<nlohmann::json(const CaseParams&)> expected) {
  return [expected = std::move(expected)](const CaseParams& params, int world) {
    return std::vector<nlohmann::json>(static_cast<size_t>(world), expected(params));
  };
}

// A judge comparing `keys` of every rank's observations with the scenario's expectations.
JudgeFn JudgeKeysAgainst(ExpectFn expect, std::vector<std::pair<std::string, std::string>> keys) {
  return [expect = std::move(expect), keys = std::move(keys)](
             const CaseParams& params, int world, const std::vector<nlohmann::json>& per_rank,
             CheckList& checks) {
    const std::vector<nlohmann::json> expected = expect(params, world);
    for (int r = 0; r < world; ++r) {
      for (const auto& [key, what] : keys) {
        CheckRankEqual(checks, per_rank, r, {key, what, expected[static_cast<size_t>(r)].at(key)});
      }
    }
  };
}

ObservationKey EventsKey(const std::string& key, const std::string& meaning) {
  return ObservationKey::Events(
      key, meaning + ": the FSDP events of kinds unshard and post_backward, in order, as "
                     "[kind, module FQN (root \"\"), training state]");
}

constexpr const char* kCommModuleCounts = "comm_module_counts";

std::string Layer(int64_t i) { return "layers." + std::to_string(i); }

// The FSDP modules of the sharded Transformer by FQN from the root: the root (""), then
// "layers.0" ... "layers.<n-1>".
std::vector<std::string> FsdpModuleFqns(int64_t n_layers) {
  std::vector<std::string> fqns = {""};
  for (int64_t i = 0; i < n_layers; ++i) fqns.push_back(Layer(i));
  return fqns;
}

// `comm_module_counts` from CommDebugMode.get_comm_module_counts(): "Global" and every module of
// `fqns`, keyed by its FQN from the root (the tracker's names are the root's class name, then
// ".fqn": the first component is dropped), each {"forward": {op: n}, "backward": {op: n}}.
// Modules of other FQNs (the tracker also credits the non-FSDP submodules in whose hooks a
// collective runs) are left out.
nlohmann::json ModuleCommCountsJson(const distributed::CommDebugMode::ModuleCounts& counts,
                                    const std::vector<std::string>& fqns) {
  nlohmann::json out = nlohmann::json::object();
  for (const std::string& key : fqns) out[key] = PhaseCommCountsJson({}, {});
  out[distributed::kGlobalModule] = PhaseCommCountsJson({}, {});
  for (const auto& [name, phases] : counts) {
    std::string key = name;
    if (name != distributed::kGlobalModule) {
      const size_t dot = name.find('.');
      key = dot == std::string::npos ? "" : name.substr(dot + 1);
    }
    if (!out.contains(key)) continue;
    for (const auto& [phase, ops] : phases) {
      for (const auto& [op, n] : ops) {
        if (n > 0) out[key][phase][op] = n;
      }
    }
  }
  return out;
}

// Runs forward and backward under two CommDebugModes; `between` runs after forward. With
// `module_fqns`, also reports comm_module_counts from a third mode over both passes (PyTorch's
// tracker attributes backward collectives only when it saw the forward).
nlohmann::json ForwardBackwardCounts(nn::Transformer& model, const Tensor& tokens,
                                     const std::function<void()>& between,
                                     const std::vector<std::string>* module_fqns = nullptr) {
  distributed::CommDebugMode module_mode;
  distributed::CommDebugMode fwd_mode;
  Tensor loss = model(tokens).tensor();
  fwd_mode.exit();
  between();
  distributed::CommDebugMode bwd_mode;
  sum(loss).backward();
  bwd_mode.exit();
  module_mode.exit();
  nlohmann::json obs;
  obs[kCommCounts] =
      PhaseCommCountsJson(fwd_mode.get_comm_counts(), bwd_mode.get_comm_counts());
  if (module_fqns != nullptr) {
    obs[kCommModuleCounts] =
        ModuleCommCountsJson(module_mode.get_comm_module_counts(), *module_fqns);
  }
  return obs;
}

// Compares every rank's comm_counts with the expectations, phase by phase.
JudgeFn JudgeCountsAgainst(ExpectFn expect) {
  return [expect = std::move(expect)](const CaseParams& params, int world,
                                      const std::vector<nlohmann::json>& per_rank,
                                      CheckList& checks) {
    const nlohmann::json expected = expect(params, world).front().at(kCommCounts);
    std::vector<RankCheck> rank_checks;
    for (const std::string phase : {"forward", "backward"}) {
      rank_checks.push_back({kCommCounts, phase + " comm counts", expected.at(phase), "/" + phase});
    }
    CheckEveryRank(checks, per_rank, world, rank_checks);
    checks.SetFigure("fwd_all_gather", expected.at("forward").value(kAllGather, 0));
    checks.SetFigure("bwd_all_gather", expected.at("backward").value(kAllGather, 0));
    checks.SetFigure("bwd_reduce_scatter", expected.at("backward").value(kReduceScatter, 0));
  };
}

std::vector<ParamSpec> CommonParams() {
  return {ParamSpec::SizeInt("n_layers", "ModelArgs.n_layers (TransformerBlocks, each sharded)", 2,
                             /*minimum=*/1),
          ParamSpec::SizeInt("seed", "seed of the weights and the token batch", 0),
          SemanticsParam()};
}

// Whether the sharded Transformer's blocks and its root reshard after forward in this case
// (fsdp_params.h, ReshardsAfterForward): a resharded group all-gathers again in backward.
struct Resharded {
  bool blocks;
  bool root;
};
Resharded ReshardedOf(const CaseParams& params) {
  return {ReshardsAfterForward(params, /*is_root=*/false),
          ReshardsAfterForward(params, /*is_root=*/true)};
}

// docs/fsdp-behaviour.md, "Collective counts": the sharded Transformer's n blocks and root each
// all-gather once in forward; in backward a group all-gathers iff it was resharded after
// forward; every group reduce-scatters once.
nlohmann::json ExpectedCommCounts(int64_t n, const Resharded& resharded) {
  const int64_t backward_all_gathers = (resharded.blocks ? n : 0) + (resharded.root ? 1 : 0);
  nlohmann::json expected;
  expected["forward"] = {{kAllGather, n + 1}};
  expected["backward"] = nlohmann::json::object();
  if (backward_all_gathers > 0) expected["backward"][kAllGather] = backward_all_gathers;
  expected["backward"][kReduceScatter] = n + 1;
  return nlohmann::json{{kCommCounts, expected}};
}

ScenarioInfo CommonInfo(const std::string& case_name, const std::string& description) {
  ScenarioInfo info;
  info.name = "fully_shard_comm/" + case_name;
  info.description = description;
  info.seed_test = std::string(kSeed000) + "test_" + case_name;
  info.params = CommonParams();
  info.default_world = 4;  // min(4, gpus)
  info.min_world = 2;      // world 1 skips the all-gather (E3), which the seed never runs
  info.max_world = 8;
  info.inputs = TransformerInputsDoc(TokenBatches::kSameOnEveryRank);
  return info;
}

// Forward of the sharded Transformer: (the root,) then every block, each unsharded in FORWARD.
nlohmann::json ForwardUnshards(int64_t n_layers, bool with_root) {
  nlohmann::json events = nlohmann::json::array();
  if (with_root) events.push_back(EventJson("unshard", "", "FORWARD"));
  for (int64_t i = 0; i < n_layers; ++i) events.push_back(EventJson("unshard", Layer(i), "FORWARD"));
  return events;
}

// The root's own unshard at the start of backward, when it was resharded after forward.
nlohmann::json RootBackwardUnshard(bool root_resharded) {
  nlohmann::json events = nlohmann::json::array();
  if (root_resharded) events.push_back(EventJson("unshard", "", "PRE_BACKWARD"));
  return events;
}

void Append(nlohmann::json& events, const nlohmann::json& more) {
  for (const auto& e : more) events.push_back(e);
}

// One use of the blocks in backward (docs/fsdp-behaviour.md, "Backward prefetch"): the last
// block is unsharded first
// (prefetched by whoever precedes it in reverse post-forward order), then each block i
// prefetches block i-1 before its own post_backward. `with_unshard` false: the blocks were
// still unsharded, so no unshard is issued.
nlohmann::json BlockBackwardEvents(int64_t n_layers, bool with_unshard) {
  nlohmann::json events = nlohmann::json::array();
  auto unshard = [&](int64_t i) {
    if (with_unshard) events.push_back(EventJson("unshard", Layer(i), "PRE_BACKWARD"));
  };
  if (n_layers > 0) unshard(n_layers - 1);
  for (int64_t i = n_layers - 1; i >= 1; --i) {
    unshard(i - 1);
    events.push_back(EventJson("post_backward", Layer(i), "POST_BACKWARD"));
  }
  if (n_layers > 0) events.push_back(EventJson("post_backward", Layer(0), "POST_BACKWARD"));
  return events;
}

std::vector<ParamSpec> PrefetchParams() {
  return {ReshardAfterForwardAxis(),
          ParamSpec::Axis("checkpoint_impl", "activation checkpointing of each block",
                          {"none", "utils", "composable"}),
          ParamSpec::SizeInt("n_layers", "ModelArgs.n_layers", 3, /*minimum=*/1),
          ParamSpec::SizeInt("seed", "seed of the weights and the token batch", 0),
          SemanticsParam()};
}

// docs/fsdp-behaviour.md, "Collective counts by module": the counts CommDebugMode credits to
// each FSDP module of the sharded Transformer over one forward and backward. A collective is
// credited to the module whose hook issues it and to every module enclosing that one in forward
// (and to "Global"). Forward: each group all-gathers in its own pre-forward. Backward: the root's
// pre-backward all-gathers the root (when resharded after forward) and prefetches the last
// block; block i's pre-backward prefetches block i-1 (blocks resharded after forward); each
// group reduce-scatters in its own post-backward. The root encloses every block.
nlohmann::json ExpectedModuleCommCounts(int64_t n, const Resharded& resharded) {
  const int64_t b = resharded.blocks ? 1 : 0;
  const int64_t root_issued = (resharded.root ? 1 : 0) + (n > 0 ? b : 0);
  auto phases = [](int64_t fwd_all_gathers, int64_t bwd_all_gathers, int64_t reduce_scatters) {
    std::map<std::string, int64_t> forward, backward;
    if (fwd_all_gathers > 0) forward[kAllGather] = fwd_all_gathers;
    if (bwd_all_gathers > 0) backward[kAllGather] = bwd_all_gathers;
    if (reduce_scatters > 0) backward[kReduceScatter] = reduce_scatters;
    return PhaseCommCountsJson(forward, backward);
  };
  // The root and Global: everything (the root's own and, enclosed, every block's).
  const nlohmann::json whole = phases(n + 1, root_issued + b * std::max<int64_t>(n - 1, 0), n + 1);
  nlohmann::json out = {{distributed::kGlobalModule, whole}, {"", whole}};
  for (int64_t i = 0; i < n; ++i) out[Layer(i)] = phases(1, i >= 1 ? b : 0, 1);
  return out;
}

ObservationSchema CountsSchema() {
  ObservationSchema schema;
  schema.Add(ObservationKey::CommCounts(
      "collectives issued by the rank, by phase (\"forward\": the forward pass, \"backward\": "
      "loss.sum().backward()), each {CommDebugMode op key: count}"));
  return schema;
}

Scenario CommunicationCount() {
  Scenario s;
  s.info = CommonInfo("fully_shard_communication_count",
                      "Transformer(n_layers) fully sharded: forward all-gathers N+1; backward "
                      "all-gathers the groups resharded after forward (N, the root too under "
                      "torch-2.8 with an explicit value) and reduce-scatters N+1");
  s.info.name = "fully_shard_comm/communication_count";
  s.info.params.insert(s.info.params.begin(),
                       ReshardAfterForwardAxis(
                           "fully_shard reshard_after_forward (bool, int factor or None)"));
  // The later profile in a default run too (an explicit value reshards the root). And the int
  // 1, which PyTorch takes for False (resharding to groups of one rank keeps the parameters
  // unsharded), not for True: no backward all-gather.
  s.info.extra_default_runs = LaterProfileRuns(4);
  s.info.extra_default_runs.push_back({4, {{"reshard_after_forward", "1"}}});
  s.info.test_runs = {{8, {{"reshard_after_forward", "4"}}}};
  for (const TestRun& run : LaterProfileRuns(8, {{"reshard_after_forward", "4"}})) {
    s.info.test_runs.push_back(run);
  }
  s.skip = SkipIntNotAFactor;
  s.info.observations = CountsSchema();
  s.info.observations.Add(ObservationKey::Custom(
      kCommModuleCounts,
      {{"type", "object"},
       {"additionalProperties",
        {{"type", "object"},
         {"additionalProperties",
          {{"type", "object"}, {"additionalProperties", {{"type", "integer"}, {"minimum", 1}}}}}}}},
      "CommDebugMode.get_comm_module_counts() of one mode over the forward and the backward: "
      "\"Global\" and each FSDP module by its FQN from the root (\"\" for the root; the tracker's "
      "name without its first component), each {\"forward\": {op: n}, \"backward\": {op: n}} "
      "(ops with a count of 0 left out; other submodules left out)"));
  s.inputs = TransformerInputs;
  s.run_rank = [](RankEnv& env) {
    auto model = ShardedTransformer(env, ReshardAfterForwardOf(env.params));
    const std::vector<std::string> fqns = FsdpModuleFqns(env.params.GetInt("n_layers"));
    return ForwardBackwardCounts(
        *model, TransformerTokens(env), [] {}, &fqns);
  };
  // The root resharded after forward per the profile ("Semantics profiles").
  s.expect = SameOnEveryRank([](const CaseParams& params) {
    nlohmann::json obs = ExpectedCommCounts(params.GetInt("n_layers"), ReshardedOf(params));
    obs[kCommModuleCounts] =
        ExpectedModuleCommCounts(params.GetInt("n_layers"), ReshardedOf(params));
    return obs;
  });
  JudgeFn counts = JudgeCountsAgainst(s.expect);
  s.judge = [counts, expect = s.expect](const CaseParams& params, int world,
                                        const std::vector<nlohmann::json>& per_rank,
                                        CheckList& checks) {
    counts(params, world, per_rank, checks);
    const nlohmann::json expected = expect(params, world).front().at(kCommModuleCounts);
    std::vector<RankCheck> rank_checks;
    for (const auto& [module, phases] : expected.items()) {
      const std::string label = module.empty() ? "the root" : module;
      for (const std::string phase : {"forward", "backward"}) {
        rank_checks.push_back({kCommModuleCounts, label + " " + phase + " comm module counts",
                               phases.at(phase), "/" + module + "/" + phase});
      }
    }
    CheckEveryRank(checks, per_rank, world, rank_checks);
  };
  return s;
}

Scenario ManualReshard() {
  Scenario s;
  s.info = CommonInfo("manual_reshard_with_reshard_after_forward_false",
                      "reshard_after_forward=False everywhere, then a manual reshard() of every "
                      "FSDP module after forward: backward all-gathers and reduce-scatters once "
                      "per FSDP module");
  s.info.observations = CountsSchema();
  s.inputs = TransformerInputs;
  s.run_rank = [](RankEnv& env) {
    auto model = ShardedTransformer(env, false);
    return ForwardBackwardCounts(*model, TransformerTokens(env), [&] {
      for (const nn::ModulePtr& m : model->modules()) {
        if (fsdp2::IsFsdpModule(*m)) fsdp2::FSDPModule(m).reshard();
      }
    });
  };
  // docs/fsdp-behaviour.md, "Manual unshard and reshard": every FSDP module (the blocks and the
  // root) was resharded by hand, so each all-gathers again in backward.
  s.expect = SameOnEveryRank([](const CaseParams& params) {
    return ExpectedCommCounts(params.GetInt("n_layers"), {/*blocks=*/true, /*root=*/true});
  });
  s.judge = JudgeCountsAgainst(s.expect);
  return s;
}

constexpr const char* kSetReshardAfterForward = "set_reshard_after_forward";
constexpr const char* kNotCalled = "None";

// The case's set_reshard_after_forward: True, False, or None (the method is not called).
std::optional<bool> SetReshardAfterForwardOf(const CaseParams& params) {
  const std::string value = params.GetString(kSetReshardAfterForward);
  if (value == kNotCalled) return std::nullopt;
  return params.GetBool(kSetReshardAfterForward);
}

// TestFullyShardCommunication.test_set_reshard_after_forward
// (_test_set_reshard_after_forward_by_communication_count): every module is fully_shard-ed
// with the opposite of the value later set (initial=not_value, as the test) or with
// fully_shard's default (initial=default: None under torch-2.8, whose root lazy init keeps
// unsharded unless a value is set; True under torch-2.4), then the root's
// set_reshard_after_forward(value, recurse) switches the root, and with recurse every block
// too. The backward all-gathers show which groups resharded after forward.
Scenario SetReshardAfterForward() {
  Scenario s;
  s.info = CommonInfo(kSetReshardAfterForward,
                      "fully_shard(reshard_after_forward=not v) on every block and the root, "
                      "then root.set_reshard_after_forward(v, recurse): the backward all-gathers "
                      "count the groups that resharded after forward (the root's switch, the "
                      "blocks' only with recurse; the root never under torch-2.4)");
  s.info.seed_test = std::string(kSeed000) +
                     "test_set_reshard_after_forward (_test_set_reshard_after_forward_by_"
                     "communication_count; PyTorch's later test, not in the seed file)";
  const std::vector<ParamSpec> axes = {
      ParamSpec::Axis(kSetReshardAfterForward,
                      "the value passed to FSDPModule.set_reshard_after_forward on the root "
                      "(None: not called, every module fully_shard-ed with the default)",
                      {"True", "False", kNotCalled}),
      ParamSpec::Axis("recurse", "set_reshard_after_forward(recurse=...)", {"True", "False"}),
      ParamSpec::Axis("initial",
                      "fully_shard's reshard_after_forward on every module: not_value (the "
                      "opposite of the value set; the default when none is) or default (not "
                      "passed)",
                      {"not_value", "default"})};
  s.info.params.insert(s.info.params.begin(), axes.begin(), axes.end());
  // ctest: the torch-2.8 profile too, where the switch decides the root's resharding.
  s.info.test_runs = {{3, {}}, {3, LaterProfile()}};
  // And by default the one case where the switch must mark the root's value as the user's
  // (FSDPState._auto_reshard_after_forward = False): the root fully_shard-ed with the default
  // (None) and switched to True before lazy init, which then keeps it resharding.
  std::map<std::string, std::string> later = LaterProfile();
  later[kSetReshardAfterForward] = "True";
  later["recurse"] = "False";
  later["initial"] = "default";
  s.info.extra_default_runs = {{3, later}};
  s.info.observations = CountsSchema();
  s.inputs = TransformerInputs;
  s.run_rank = [](RankEnv& env) {
    const std::optional<bool> value = SetReshardAfterForwardOf(env.params);
    std::optional<fsdp2::ReshardAfterForward> initial;
    if (value && env.params.GetString("initial") == "not_value") initial = !*value;
    auto model = ShardedTransformer(env, initial);
    if (value) {
      fsdp2::FSDPModule(model).set_reshard_after_forward(*value, env.params.GetBool("recurse"));
    }
    return ForwardBackwardCounts(*model, TransformerTokens(env), [] {});
  };
  // docs/fsdp-behaviour.md, "Runtime switches": the switch replaces the post-forward mesh of
  // the root (and with recurse of every FSDP module below it) and marks the value as set, so
  // that lazy init keeps it on the root under torch-2.8; under torch-2.4 lazy init keeps the
  // root unsharded whatever was set. Unswitched blocks keep their fully_shard value.
  s.expect = SameOnEveryRank([](const CaseParams& params) {
    const int64_t n = params.GetInt("n_layers");
    const std::optional<bool> value = SetReshardAfterForwardOf(params);
    const bool recurse = params.GetBool("recurse");
    // The blocks keep their fully_shard value unless switched; a non-root module fully_shard-ed
    // with the default reshards.
    bool blocks = true;
    if (value && recurse) {
      blocks = *value;
    } else if (value && params.GetString("initial") == "not_value") {
      blocks = !*value;
    }
    const bool root = SemanticsOf(params) != fsdp2::Semantics::kTorch2_4 && value && *value;
    return ExpectedCommCounts(n, {blocks, root});
  });
  s.judge = JudgeCountsAgainst(s.expect);
  return s;
}

nlohmann::json EventsJson(const std::vector<fsdp2::FsdpEvent>& events) {
  nlohmann::json out = nlohmann::json::array();
  for (const fsdp2::FsdpEvent& e : events) {
    out.push_back(EventJson(fsdp2::EventKindName(e.kind), e.fqn, fsdp2::TrainingStateName(e.state)));
  }
  return out;
}

Scenario BackwardPrefetchMultiForward() {
  Scenario s;
  s.info = CommonInfo("fully_shard_backward_prefetch",
                      "two forwards of Transformer(n_layers), then one backward of the summed "
                      "losses: the per-use prefetch pattern twice, the root's post_backward once");
  s.info.name = "fully_shard_comm/backward_prefetch_multi_forward";
  s.info.seed_test =
      "test_fully_shard_comm.py::TestFullyShardPrefetch::test_fully_shard_backward_prefetch "
      "(_test_backward_prefetch_multi_forward; seed body truncated; docs/fsdp-behaviour.md, \"Several forwards before one backward\")";
  s.info.params = PrefetchParams();
  s.info.extra_default_runs = LaterProfileRuns(4, {{"checkpoint_impl", "none"}});
  s.skip = SkipIntNotAFactor;
  s.info.observations
      .Add(EventsKey("forward_events", "during both forwards"))
      .Add(EventsKey("backward_events", "during the backward of the summed losses"))
      .Add(EventsKey("events", "forward_events then backward_events (for the report)").Optional());
  s.inputs = TransformerInputs;
  s.run_rank = [](RankEnv& env) {
    auto model = ShardedTransformer(env, ReshardAfterForwardOf(env.params),
                                    env.params.GetString("checkpoint_impl"));
    const Tensor tokens = TransformerTokens(env);
    fsdp2::RecordingObserver observer;
    fsdp2::ScopedObserver install(observer);
    const std::set<fsdp2::EventKind> kinds = {fsdp2::EventKind::kUnshard,
                                              fsdp2::EventKind::kPostBackward};
    Tensor loss1 = (*model)(tokens).tensor();
    Tensor loss2 = (*model)(tokens).tensor();
    nlohmann::json obs;
    obs["forward_events"] = EventsJson(observer.events(kinds));
    observer.clear();
    sum(add(loss1, loss2)).backward();
    obs["backward_events"] = EventsJson(observer.events(kinds));
    obs[kEvents] = obs["forward_events"];
    for (const auto& e : obs["backward_events"]) obs[kEvents].push_back(e);
    return obs;
  };
  // docs/fsdp-behaviour.md, "Several forwards before one backward": forward 2 re-unshards the
  // root and the blocks only when they were resharded after forward (the root per the profile,
  // "Semantics profiles"). Backward starts with the root's unshard when it was resharded, then
  // runs the block pattern once per use; without reshard after forward the first use finds the
  // blocks unsharded, and the second needs all-gathers again because post_backward resharded
  // them. The root's post_backward comes once, at the end.
  s.expect = SameOnEveryRank([](const CaseParams& params) {
    const int64_t n = params.GetInt("n_layers");
    const Resharded resharded = ReshardedOf(params);
    nlohmann::json fwd = ForwardUnshards(n, /*with_root=*/true);
    if (resharded.root) fwd.push_back(EventJson("unshard", "", "FORWARD"));
    if (resharded.blocks) Append(fwd, ForwardUnshards(n, /*with_root=*/false));
    nlohmann::json bwd = RootBackwardUnshard(resharded.root);
    Append(bwd, BlockBackwardEvents(n, /*with_unshard=*/resharded.blocks));
    Append(bwd, BlockBackwardEvents(n, /*with_unshard=*/true));
    bwd.push_back(EventJson("post_backward", "", "POST_BACKWARD"));
    return nlohmann::json{{"forward_events", fwd}, {"backward_events", bwd}};
  });
  s.judge = JudgeKeysAgainst(s.expect, {{"forward_events", "forward events"},
                                        {"backward_events", "backward events"}});
  return s;
}

Scenario BackwardPrefetchForwardBackward() {
  Scenario s;
  s.info = CommonInfo("fully_shard_backward_prefetch",
                      "Transformer(n_layers) fully sharded, `iterations` x (forward, backward, "
                      "optimizer step): the exact unshard / post_backward event order, identical "
                      "with and without activation checkpointing");
  s.info.name = "fully_shard_comm/backward_prefetch_forward_backward";
  s.info.seed_test =
      "test_fully_shard_comm.py::TestFullyShardPrefetch::test_fully_shard_backward_prefetch "
      "(_test_backward_prefetch_forward_backward)";
  s.info.params = PrefetchParams();
  s.info.params.push_back(
      ParamSpec::SizeInt("iterations", "forward/backward/step iterations", 3, /*minimum=*/1));
  s.info.extra_default_runs = LaterProfileRuns(4, {{"checkpoint_impl", "none"}});
  s.skip = SkipIntNotAFactor;
  s.info.observations
      .Add(ObservationKey::Custom(
          "forward_events", {{"type", "array"}, {"items", EventsKey("x", "").schema}},
          "per iteration, the FSDP events of kinds unshard and post_backward during forward, "
          "as [kind, module FQN (root \"\"), training state]"))
      .Add(ObservationKey::Custom("backward_events",
                                  {{"type", "array"}, {"items", EventsKey("x", "").schema}},
                                  "per iteration, the same during loss.sum().backward()"))
      .Add(ObservationKey::Custom(
          "backward_reshard_events", {{"type", "array"}, {"items", EventsKey("x", "").schema}},
          "per iteration, the FSDP events of kind reshard during loss.sum().backward() (a "
          "block's activation-checkpoint recompute runs its forward hooks again, which must not "
          "reshard it)"))
      .Add(EventsKey("events", "every iteration's forward then backward events (for the report)")
               .Optional());
  s.inputs = TransformerInputs;
  s.run_rank = [](RankEnv& env) {
    auto model = ShardedTransformer(env, ReshardAfterForwardOf(env.params),
                                    env.params.GetString("checkpoint_impl"));
    optim::SGD optim(model->parameters(), optim::SGDOptions{.lr = 1e-2});
    const Tensor tokens = TransformerTokens(env);
    fsdp2::RecordingObserver observer;
    fsdp2::ScopedObserver install(observer);
    const std::set<fsdp2::EventKind> kinds = {fsdp2::EventKind::kUnshard,
                                              fsdp2::EventKind::kPostBackward};
    nlohmann::json forward = nlohmann::json::array();
    nlohmann::json backward = nlohmann::json::array();
    nlohmann::json backward_reshards = nlohmann::json::array();
    nlohmann::json all = nlohmann::json::array();
    for (int64_t iter = 0; iter < env.params.GetInt("iterations"); ++iter) {
      Tensor loss = (*model)(tokens).tensor();
      forward.push_back(EventsJson(observer.events(kinds)));
      observer.clear();
      sum(loss).backward();
      backward.push_back(EventsJson(observer.events(kinds)));
      backward_reshards.push_back(EventsJson(observer.events({fsdp2::EventKind::kReshard})));
      observer.clear();
      for (const auto& e : forward.back()) all.push_back(e);
      for (const auto& e : backward.back()) all.push_back(e);
      optim.step();
      optim.zero_grad(/*set_to_none=*/iter % 2 == 0);
    }
    nlohmann::json obs;
    obs[kEvents] = all;
    obs["forward_events"] = forward;
    obs["backward_events"] = backward;
    obs["backward_reshard_events"] = backward_reshards;
    return obs;
  };
  // docs/fsdp-behaviour.md, "Backward prefetch": forward unshards the root, then every block in
  // order; backward: the root unshards first if it was resharded after forward (per the
  // profile, "Semantics profiles") and prefetches the last block, each block i prefetches block
  // i-1 before its post_backward, and the root's post_backward comes from the end-of-backward
  // callback. Groups not resharded after forward issue no unshard. Every iteration alike.
  // Backward reshards each group once, in its post_backward (reshard_after_backward), and
  // nowhere else: a block's activation-checkpoint recompute runs its forward hooks again while
  // it is in PRE_BACKWARD, where FSDP's pre- and post-forward return at once.
  s.expect = SameOnEveryRank([](const CaseParams& params) {
    const int64_t n = params.GetInt("n_layers");
    const Resharded resharded = ReshardedOf(params);
    const nlohmann::json fwd = ForwardUnshards(n, /*with_root=*/true);
    nlohmann::json bwd = RootBackwardUnshard(resharded.root);
    Append(bwd, BlockBackwardEvents(n, /*with_unshard=*/resharded.blocks));
    bwd.push_back(EventJson("post_backward", "", "POST_BACKWARD"));
    nlohmann::json bwd_reshards = nlohmann::json::array();
    for (const nlohmann::json& e : bwd) {
      if (e[0] == "post_backward") {
        bwd_reshards.push_back(EventJson("reshard", e[1].get<std::string>(), "POST_BACKWARD"));
      }
    }
    const auto iterations = static_cast<size_t>(params.GetInt("iterations"));
    return nlohmann::json{
        {"forward_events", std::vector<nlohmann::json>(iterations, fwd)},
        {"backward_events", std::vector<nlohmann::json>(iterations, bwd)},
        {"backward_reshard_events", std::vector<nlohmann::json>(iterations, bwd_reshards)}};
  });
  s.judge = [expect = s.expect](const CaseParams& params, int world,
                                const std::vector<nlohmann::json>& per_rank, CheckList& checks) {
    const nlohmann::json expected = expect(params, world).front();
    // Element `it` of each rank's per-iteration lists (null when the rank reported fewer).
    std::vector<RankCheck> rank_checks;
    for (size_t it = 0; it < expected["forward_events"].size(); ++it) {
      const std::string iteration = "iteration " + std::to_string(it);
      const std::string element = "/" + std::to_string(it);
      rank_checks.push_back(
          {"forward_events", iteration + " forward events", expected["forward_events"][it], element});
      rank_checks.push_back({"backward_events", iteration + " backward events",
                             expected["backward_events"][it], element});
      rank_checks.push_back({"backward_reshard_events", iteration + " backward reshard events",
                             expected["backward_reshard_events"][it], element});
    }
    CheckEveryRank(checks, per_rank, world, rank_checks);
    checks.SetFigure("events_per_iteration",
                     expected["forward_events"][0].size() + expected["backward_events"][0].size());
  };
  return s;
}

// The inputs of the small event models: after nn::ManualSeed(seed) the weights of
// make_model(dim), and one [4, dim] float32 batch from Generator(seed), the same on every rank.
CaseInputs SeededModelInputs(const CaseParams& params, int world,
                             const std::function<nn::ModulePtr(int64_t)>& make_model) {
  const int64_t dim = params.GetInt("dim");
  const auto seed = static_cast<uint64_t>(params.GetInt("seed"));
  nn::ManualSeed(seed);
  CaseInputs inputs;
  inputs.weights = WeightsOf(*make_model(dim));
  Generator generator(seed);
  inputs.ranks.assign(static_cast<size_t>(world),
                      {{StepInputName(0), Tensor::randn({4, dim}, DType::kFloat32, &generator)}});
  return inputs;
}

Scenario BackwardPrefetchUnusedInBackward() {
  Scenario s;
  s.info = CommonInfo("fully_shard_backward_prefetch",
                      "Sequential(Linear, DoubleLinear): backward through lin2 only "
                      "(set_is_last_backward(False)) mistargets a prefetch of lin1, kept pending "
                      "and consumed by the last backward through lin1");
  s.info.name = "fully_shard_comm/backward_prefetch_unused_in_backward";
  s.info.seed_test =
      "test_fully_shard_comm.py::TestFullyShardPrefetch::test_fully_shard_backward_prefetch "
      "(_test_backward_prefetch_unused_in_backward)";
  ParamSpec raf_axis = ReshardAfterForwardAxis();
  raf_axis.values = {"True"};  // the seed runs True only
  s.info.params = {
      raf_axis, ParamSpec::SizeInt("dim", "Linear / DoubleLinear dim", 8, /*minimum=*/1),
      ParamSpec::SizeInt("seed", "seed of the weights and the input batch", 0), SemanticsParam()};
  s.info.test_runs = {{4, {{"reshard_after_forward", "False"}}},
                      {4, {{"reshard_after_forward", "2"}}}};
  s.info.extra_default_runs = LaterProfileRuns(4);
  s.skip = SkipIntNotAFactor;
  s.info.inputs.weights =
      "every key of Sequential(Linear(dim, dim), DoubleLinear(dim)).state_dict() (0.weight, "
      "0.bias, 1.lin1.weight, 1.lin1.bias, 1.lin2.weight, 1.lin2.bias), float32";
  s.info.inputs.rank_tensors = {
      {"step0/input", "float32", "[4, dim]", "the input batch (the same on every rank)"}};
  s.inputs = [](const CaseParams& params, int world) {
    return SeededModelInputs(params, world, [](int64_t dim) {
      return std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{
          std::make_shared<nn::Linear>(dim, dim), std::make_shared<nn::DoubleLinear>(dim)});
    });
  };
  s.info.observations.Add(EventsKey("forward_events", "during forward"))
      .Add(EventsKey("backward1_events",
                     "during the first backward, through lin2's output only, after "
                     "set_is_last_backward(False)"))
      .Add(EventsKey("backward2_events",
                     "during the second backward, through lin1's output, after "
                     "set_is_last_backward(True)"))
      .Add(EventsKey("events", "the three lists concatenated (for the report)").Optional());
  s.run_rank = [](RankEnv& env) {
    const int64_t dim = env.params.GetInt("dim");
    auto lin0 = std::make_shared<nn::Linear>(dim, dim);
    auto double_linear = std::make_shared<nn::DoubleLinear>(dim);
    auto model =
        std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{lin0, double_linear});
    model->load_state_dict(env.Inputs().weights());
    model->to(env.device);
    const fsdp2::FullyShardOptions options = ShardOptionsOf(env);
    fsdp2::fully_shard(lin0, options);
    fsdp2::fully_shard(double_linear->child("lin1"), options);
    fsdp2::fully_shard(double_linear->child("lin2"), options);
    fsdp2::FSDPModule root = fsdp2::fully_shard(model, options);
    const Tensor inp = env.Inputs().Get(StepInputName(0)).to(env.device);
    fsdp2::RecordingObserver observer;
    fsdp2::ScopedObserver install(observer);
    const std::set<fsdp2::EventKind> kinds = {fsdp2::EventKind::kUnshard,
                                              fsdp2::EventKind::kPostBackward};
    nlohmann::json obs;
    nn::Value out = (*model)(inp);
    obs["forward_events"] = EventsJson(observer.events(kinds));
    observer.clear();
    root.set_is_last_backward(false);
    sum(out[1].tensor()).backward(Tensor(), /*retain_graph=*/true);
    obs["backward1_events"] = EventsJson(observer.events(kinds));
    observer.clear();
    root.set_is_last_backward(true);
    sum(out[0].tensor()).backward();
    obs["backward2_events"] = EventsJson(observer.events(kinds));
    obs[kEvents] = nlohmann::json::array();
    for (const char* key : {"forward_events", "backward1_events", "backward2_events"}) {
      for (const auto& e : obs[key]) obs[kEvents].push_back(e);
    }
    return obs;
  };
  s.expect = SameOnEveryRank([](const CaseParams& params) {
    // docs/fsdp-behaviour.md, "Backward prefetch" and "End-of-backward callback" (the sweep
    // of groups still UNSHARDED, as the seed asserts): post_forward_order is
    // [0, 1.lin1, 1.lin2]; the root has no parameters, so the profile's root rule plays no
    // part. Resharded after forward (the seed's True), lin2's pre-backward prefetches its
    // predecessor lin1 although lin1 is not in that backward; the pending all-gather is kept
    // (not the last backward) and consumed by lin1's own unshard in the second backward,
    // which then prefetches 0. Not resharded, the first backward issues no unshard and its
    // sweep gives lin1, still UNSHARDED, its post_backward (which reshards it); the second
    // backward then all-gathers lin1 and prefetches 0.
    // Under torch-2.8 the callback sweeps every group not in POST_BACKWARD
    // (ProfileSweepsEveryGroupAtEndOfBackward): the unused lin1 (first backward; its pending
    // prefetch survives, SHARDED) and lin2 (second) get their no-op post_backward last, as
    // PyTorch 2.8's version of the seed expects ("`1.lin1` post-backward hook runs but is a
    // no-op").
    const bool r = ReshardsAfterForward(params, /*is_root=*/false);
    const bool sweeps_every_group = ProfileSweepsEveryGroupAtEndOfBackward(SemanticsOf(params));
    auto unshard = [](const char* fqn) { return EventJson("unshard", fqn, "PRE_BACKWARD"); };
    auto post_backward = [](const char* fqn) {
      return EventJson("post_backward", fqn, "POST_BACKWARD");
    };
    const nlohmann::json expected_forward = {EventJson("unshard", "0", "FORWARD"),
                                             EventJson("unshard", "1.lin1", "FORWARD"),
                                             EventJson("unshard", "1.lin2", "FORWARD")};
    nlohmann::json expected_backward1 = nlohmann::json::array();
    nlohmann::json expected_backward2 = nlohmann::json::array();
    if (r) {
      expected_backward1 = {unshard("1.lin2"), unshard("1.lin1"), post_backward("1.lin2"),
                            unshard("0"), post_backward("0")};
      expected_backward2 = {unshard("0"), post_backward("1.lin1"), post_backward("0")};
    } else {
      expected_backward1 = {post_backward("1.lin2"), post_backward("0"), post_backward("1.lin1")};
      expected_backward2 = {unshard("1.lin1"), unshard("0"), post_backward("1.lin1"),
                            post_backward("0")};
    }
    if (sweeps_every_group) {
      if (r) expected_backward1.push_back(post_backward("1.lin1"));
      expected_backward2.push_back(post_backward("1.lin2"));
    }
    return nlohmann::json{{"forward_events", expected_forward},
                          {"backward1_events", expected_backward1},
                          {"backward2_events", expected_backward2}};
  });
  s.judge = JudgeKeysAgainst(s.expect, {{"forward_events", "forward events"},
                                        {"backward1_events", "backward through lin2 (not last)"},
                                        {"backward2_events", "backward through lin1 (last)"}});
  return s;
}

// The model of backward_prefetch_reused_module: Sequential(a, b, a, out) of Linear(dim, dim),
// `a` called twice in one forward.
std::shared_ptr<nn::Sequential> ReusedModuleModel(int64_t dim) {
  auto a = std::make_shared<nn::Linear>(dim, dim);
  auto b = std::make_shared<nn::Linear>(dim, dim);
  auto out = std::make_shared<nn::Linear>(dim, dim);
  return std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{a, b, a, out});
}

Scenario BackwardPrefetchReusedModule() {
  Scenario s;
  s.info = CommonInfo("fully_shard_backward_prefetch",
                      "Sequential(a, b, a, out) of Linear(dim, dim), a, b, out and the "
                      "parameter-less root sharded, `iterations` x (forward, backward): a runs "
                      "twice per forward; the implicit backward prefetch of a's second use "
                      "targets b, its first use's nothing, in every iteration");
  s.info.name = "fully_shard_comm/backward_prefetch_reused_module";
  s.info.seed_test =
      "test_fully_shard_training.py::TestFullyShard1DTrainingCore::test_multi_forward_module "
      "(a module used twice per forward) with test_fully_shard_comm.py's event order";
  s.info.params = {
      ReshardAfterForwardAxis(), ParamSpec::SizeInt("dim", "every Linear's dim", 8, /*minimum=*/1),
      ParamSpec::SizeInt("iterations", "forward/backward iterations", 2, /*minimum=*/1),
      ParamSpec::SizeInt("seed", "seed of the weights and the input batch", 0), SemanticsParam()};
  s.info.extra_default_runs = LaterProfileRuns(4, {{"reshard_after_forward", "True"}});
  s.skip = SkipIntNotAFactor;
  s.info.inputs.weights =
      "every key of Sequential(a, b, a, out).state_dict() (0.*, 1.*, 2.* (a again), 3.*), "
      "float32";
  s.info.inputs.rank_tensors = {
      {"step0/input", "float32", "[4, dim]", "the input batch (the same on every rank)"}};
  s.inputs = [](const CaseParams& params, int world) {
    return SeededModelInputs(params, world, ReusedModuleModel);
  };
  s.info.observations
      .Add(ObservationKey::Custom(
          "forward_events", {{"type", "array"}, {"items", EventsKey("x", "").schema}},
          "per iteration, the FSDP events of kinds unshard and post_backward during forward, "
          "as [kind, module FQN (root \"\"), training state]"))
      .Add(ObservationKey::Custom("backward_events",
                                  {{"type", "array"}, {"items", EventsKey("x", "").schema}},
                                  "per iteration, the same during out.sum().backward()"))
      .Add(EventsKey("events", "every iteration's forward then backward events (for the report)")
               .Optional());
  s.run_rank = [](RankEnv& env) {
    auto model = ReusedModuleModel(env.params.GetInt("dim"));
    model->load_state_dict(env.Inputs().weights());
    model->to(env.device);
    const fsdp2::FullyShardOptions options = ShardOptionsOf(env);
    for (int64_t i : {0, 1, 3}) fsdp2::fully_shard((*model)[i], options);
    fsdp2::fully_shard(model, options);
    const Tensor inp = env.Inputs().Get(StepInputName(0)).to(env.device);
    fsdp2::RecordingObserver observer;
    fsdp2::ScopedObserver install(observer);
    const std::set<fsdp2::EventKind> kinds = {fsdp2::EventKind::kUnshard,
                                              fsdp2::EventKind::kPostBackward};
    nlohmann::json forward = nlohmann::json::array();
    nlohmann::json backward = nlohmann::json::array();
    nlohmann::json all = nlohmann::json::array();
    for (int64_t iter = 0; iter < env.params.GetInt("iterations"); ++iter) {
      const Tensor out = (*model)(inp).tensor();
      forward.push_back(EventsJson(observer.events(kinds)));
      observer.clear();
      sum(out).backward();
      backward.push_back(EventsJson(observer.events(kinds)));
      observer.clear();
      for (const auto& e : forward.back()) all.push_back(e);
      for (const auto& e : backward.back()) all.push_back(e);
    }
    nlohmann::json obs;
    obs["forward_events"] = forward;
    obs["backward_events"] = backward;
    obs[kEvents] = all;
    return obs;
  };
  // docs/fsdp-behaviour.md, "Backward prefetch": post_forward_order is [0, 1, 0, 3] (a group
  // records one index per use; the root has no parameters, so no entry), a's indices [0, 2].
  // Forward unshards a, b, a again only if a was resharded after its first use, then out.
  // Backward: out unshards itself (if resharded), pops 3 and prefetches post_forward_order[2] =
  // a; post_backward out; a's pre-backward (its second use, the first in backward) pops its
  // LAST index, 2, and prefetches b; a's post_backward (registered on its second use's input,
  // b's output) reshards it; b pops 1 and prefetches a again, then b's post_backward; a's
  // pre-backward runs again for its first use (its state is POST_BACKWARD), finds it
  // unsharded and pops 0: no prefetch. a's first use took the input batch, which requires no
  // gradient, so its post_backward comes from the end-of-backward callback. A prefetch of a
  // group that is still unsharded issues no unshard. The last backward clears the post-forward
  // order, so every iteration repeats the first (a stale order would make a's first use
  // prefetch the previous iteration's out, resharded by then).
  s.expect = SameOnEveryRank([](const CaseParams& params) {
    const bool r = ReshardsAfterForward(params, /*is_root=*/false);
    auto unshard = [](const char* fqn, const char* state) {
      return EventJson("unshard", fqn, state);
    };
    auto post_backward = [](const char* fqn) {
      return EventJson("post_backward", fqn, "POST_BACKWARD");
    };
    nlohmann::json fwd = {unshard("0", "FORWARD"), unshard("1", "FORWARD")};
    if (r) fwd.push_back(unshard("0", "FORWARD"));
    fwd.push_back(unshard("3", "FORWARD"));
    nlohmann::json bwd = nlohmann::json::array();
    if (r) {
      bwd.push_back(unshard("3", "PRE_BACKWARD"));  // out's own
      bwd.push_back(unshard("0", "PRE_BACKWARD"));  // out's prefetch of a's second use
    }
    bwd.push_back(post_backward("3"));
    if (r) bwd.push_back(unshard("1", "PRE_BACKWARD"));  // a's (second use) prefetch
    bwd.push_back(post_backward("0"));
    bwd.push_back(unshard("0", "PRE_BACKWARD"));  // b's prefetch of a's first use
    bwd.push_back(post_backward("1"));
    bwd.push_back(post_backward("0"));
    const auto iterations = static_cast<size_t>(params.GetInt("iterations"));
    return nlohmann::json{{"forward_events", std::vector<nlohmann::json>(iterations, fwd)},
                          {"backward_events", std::vector<nlohmann::json>(iterations, bwd)}};
  });
  s.judge = [expect = s.expect](const CaseParams& params, int world,
                                const std::vector<nlohmann::json>& per_rank, CheckList& checks) {
    const nlohmann::json expected = expect(params, world).front();
    std::vector<RankCheck> rank_checks;
    for (size_t it = 0; it < expected["forward_events"].size(); ++it) {
      const std::string iteration = "iteration " + std::to_string(it);
      const std::string element = "/" + std::to_string(it);
      rank_checks.push_back({"forward_events", iteration + " forward events",
                             expected["forward_events"][it], element});
      rank_checks.push_back({"backward_events", iteration + " backward events",
                             expected["backward_events"][it], element});
    }
    CheckEveryRank(checks, per_rank, world, rank_checks);
  };
  return s;
}

ScenarioInfo UnshardInfo(const std::string& case_name, const std::string& description) {
  ScenarioInfo info;
  info.name = "fully_shard_comm/" + case_name;
  info.description = description;
  info.seed_test = "test_fully_shard_comm.py::TestFullyShardUnshardMultiThread::test_" + case_name;
  info.params = {SemanticsParam()};
  info.default_world = 2;
  info.min_world = 1;
  info.max_world = 8;
  info.requirements.devices = {DeviceType::kCPU};
  return info;
}

Scenario UnshardNoParamGroup() {
  Scenario s;
  s.info = UnshardInfo("unshard_no_param_group",
                       "Sequential(Linear(4,4), Linear(4,4)) with each Linear and the param-less "
                       "root sharded: root.unshard(async_op=True).wait() succeeds");
  s.info.observations
      .Add(ObservationKey::Boolean("root_has_param_group",
                                   "whether the root FSDP module manages any parameter (it must "
                                   "not: each Linear took its own)"))
      .Add(ObservationKey::Boolean("unshard_completed",
                                   "root.unshard(async_op=True).wait() returned without error"));
  s.run_rank = [](RankEnv& env) {
    auto model = std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{
        std::make_shared<nn::Linear>(4, 4), std::make_shared<nn::Linear>(4, 4)});
    fsdp2::FullyShardOptions options;
    options.process_group = env.pg;
    options.semantics = SemanticsOf(env.params);
    for (const nn::ModulePtr& lin : model->children()) fsdp2::fully_shard(lin, options);
    fsdp2::FSDPModule root = fsdp2::fully_shard(model, options);
    fsdp2::UnshardHandle handle = root.unshard(/*async_op=*/true);
    handle.wait();
    nlohmann::json obs;
    obs["root_has_param_group"] = root.param_group() != nullptr;
    obs["unshard_completed"] = true;
    return obs;
  };
  s.judge = [](const CaseParams&, int world, const std::vector<nlohmann::json>& per_rank,
               CheckList& checks) {
    CheckEveryRank(checks, per_rank, world,
                   {{"root_has_param_group", "root has no param group", false},
                    {"unshard_completed", "unshard handle waited", true}});
  };
  return s;
}

Scenario UnshardWithoutLazyInit() {
  Scenario s;
  s.info = UnshardInfo("unshard_without_lazy_init",
                       "MLP(dim) broadcast from rank 0 and fully sharded: unshard() before any "
                       "forward registers unsharded parameters equal to the reference copy");
  s.info.params.insert(s.info.params.begin(),
                       ParamSpec::SizeInt("dim", "MLP dim", 4, /*minimum=*/1));
  s.info.params.push_back(ParamSpec::SizeBool(
      "replace_param",
      "True: between fully_shard and unshard(), in_proj.weight is replaced by a new sharded "
      "parameter holding its local piece negated (nn.Parameter(DTensor.from_local(...)) in "
      "PyTorch): unshard()'s lazy init must adopt it (FSDPParamGroup.lazy_init's "
      "reset_sharded_param), so the unsharded in_proj.weight is the reference negated",
      false));
  s.info.params.push_back(ParamSpec::SizeBool(
      "async_op",
      "True: unshard(async_op=True) and a wait() on the handle it returns (the all-gather's work "
      "must be waited before its output is copied out)",
      false));
  s.info.params.push_back(ParamSpec::SizeBool(
      "unshard_in_backward",
      "False: set_unshard_in_backward(False) before unshard(); the flag only skips the "
      "pre-backward unshard (FSDPParamGroup.unshard returns early only in PRE_BACKWARD), so an "
      "explicit unshard() still all-gathers every parameter",
      true));
  // The lazy init that unshard() runs (test_reset_sharded_param_in_lazy_init, through unshard),
  // an async unshard's values (at an uneven world too), and an explicit unshard() of a module
  // whose pre-backward unshard is off.
  s.info.extra_default_runs = {{2, {{"replace_param", "True"}}},
                               {3, {{"async_op", "True"}}},
                               {2, {{"unshard_in_backward", "False"}}}};
  s.info.observations
      .AddTensors({"reference/{fqn}", "float32", "the parameter's shape",
                   "each parameter after the broadcast from rank 0, before fully_shard"})
      .AddTensors({"unsharded/{fqn}", "float32", "the parameter's shape",
                   "each registered parameter after fully_shard(model).unshard(), before any "
                   "forward (lazy init run by unshard)"});
  s.run_rank = [](RankEnv& env) {
    auto model = std::make_shared<nn::MLP>(env.params.GetInt("dim"));
    if (env.pg) {
      for (Tensor& param : model->parameters()) env.pg->broadcast(param, 0);
    }
    nlohmann::json obs;
    nlohmann::json& tensors = obs[kTensors];
    for (const auto& [name, param] : model->named_parameters()) {
      tensors["reference/" + name] = TensorToJson(param);
    }
    fsdp2::FullyShardOptions options;
    options.process_group = env.pg;
    options.semantics = SemanticsOf(env.params);
    fsdp2::FSDPModule fsdp_model = fsdp2::fully_shard(model, options);
    if (env.params.GetBool("replace_param")) {
      nn::Module& in_proj = *model->child("in_proj");
      Tensor replaced = ops::kernels::Neg(in_proj.parameter("weight").detach());
      replaced.set_requires_grad(true);
      in_proj.set_parameter("weight", replaced);
    }
    if (!env.params.GetBool("unshard_in_backward")) fsdp_model.set_unshard_in_backward(false);
    if (env.params.GetBool("async_op")) {
      fsdp_model.unshard(/*async_op=*/true).wait();
    } else {
      fsdp_model.unshard();
    }
    for (const auto& [name, param] : model->named_parameters()) {
      tensors["unsharded/" + name] = TensorToJson(param);
    }
    return obs;
  };
  s.judge = [](const CaseParams& p, int world, const std::vector<nlohmann::json>& per_rank,
               CheckList& checks) {
    for (int r = 0; r < world; ++r) {
      const nlohmann::json& tensors = RankObservation(per_rank, r, kTensors);
      int compared = 0;
      for (const auto& [key, value] : tensors.items()) {
        if (key.rfind("reference/", 0) != 0) continue;
        const std::string name = key.substr(std::string("reference/").size());
        const std::string unsharded = "unsharded/" + name;
        const std::string who = RankName(r) + " " + name;
        if (!tensors.contains(unsharded)) {
          checks.Fail(who, "no unsharded parameter reported");
          continue;
        }
        checks.CheckEqual(who + " shape", value.at("shape"), tensors.at(unsharded).at("shape"));
        nlohmann::json expected = value.at("data");
        if (p.GetBool("replace_param") && name == "in_proj.weight") {
          for (auto& x : expected) x = -x.get<double>();
        }
        checks.CheckClose(who + " values", expected, tensors.at(unsharded).at("data"),
                          Tolerance{0.0, 0.0});
        ++compared;
      }
      checks.CheckTrue(RankName(r) + " reported parameters", compared > 0);
    }
  };
  return s;
}

}  // namespace

void RegisterFullyShardCommScenarios(ScenarioRegistry& registry) {
  registry.Add(CommunicationCount());
  registry.Add(ManualReshard());
  registry.Add(SetReshardAfterForward());
  registry.Add(BackwardPrefetchForwardBackward());
  registry.Add(BackwardPrefetchMultiForward());
  registry.Add(BackwardPrefetchUnusedInBackward());
  registry.Add(BackwardPrefetchReusedModule());
  registry.Add(UnshardNoParamGroup());
  registry.Add(UnshardWithoutLazyInit());
}

}  // namespace fsdp::conformance
