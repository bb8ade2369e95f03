// Explicit prefetching (test_fully_shard_comm.py's TestFullyShardPrefetch
// .test_set_modules_to_forward_prefetch / test_set_modules_to_backward_prefetch, and
// test_backward_misprefetch below), family `fully_shard_comm`: the zoo's Transformer with
// fully_shard on every block of `layers`, then the root (embeddings, norm and output stay with the
// root); block i prefetches `num_to_prefetch` blocks `prefetch_stride` apart, the next in forward
// (set_modules_to_forward_prefetch: i + s, i + 2s, ...) or the previous in backward
// (set_modules_to_backward_prefetch: i - s, i - 2s, ...). Each rank trains `steps` steps (sharded
// parity, conformance/sharded_parity.h: prefetching must not change a value) and reports the FSDP
// `unshard` and `reshard` events of every step in order (a prefetch shows as an unshard issued
// before the issuing block's reshard). The judge derives the order for any n_layers and
// num_to_prefetch (ExpectedEvents) and compares the training against the oracle.
//
// Rules (docs/fsdp-behaviour.md, "Backward prefetch" and "Explicit prefetch"): a module's
// pre-forward unshards its own group (unless a prefetch already did), then issues the unshard of
// each target not yet unsharded, in list order, in FORWARD state; the root is first. In backward
// the blocks run in reverse; each block's pre-backward unshards its group (unless prefetched), then
// its explicit backward targets, or, with an empty list, the block before it (the implicit
// prefetch: the next in reverse post-forward order), all in PRE_BACKWARD state. An explicit list
// replaces the implicit prefetch: with a stride of 2 the last block prefetches the one two before
// it and never the one before it. A block reshards after its
// forward (FORWARD) and in its post-backward (POST_BACKWARD). The root (kept unsharded after
// forward) unshards nothing in backward and reshards last, in the end-of-backward callback. A world
// of one rank all-gathers nothing but records the same events.
//
// backward_misprefetch (TestFullyShardCommunication.test_backward_misprefetch): common_fsdp's
// MLP with fully_shard on in_proj, out_proj, then the root (which manages no parameter), and
// in_proj.set_modules_to_backward_prefetch([out_proj]): backward runs out_proj then in_proj, so
// in_proj's prefetch all-gathers out_proj after its post-backward resharded it, and nothing
// waits for that all-gather. The rules (ExpectedMisprefetchEvents): the unshard is recorded,
// the group stays sharded (no copy-out ran, so no reshard follows), the end of backward drops
// the pending result, and the next forward all-gathers out_proj again; the training matches
// the oracle at every step. Stateless; thread-safe.
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "conformance/fsdp_params.h"
#include "conformance/observations.h"
#include "conformance/parity_common.h"
#include "conformance/rank_checks.h"
#include "conformance/scenario_registry.h"
#include "conformance/sharded_parity.h"
#include "engine/fsdp/fully_shard.h"
#include "engine/fsdp/observer.h"
#include "engine/nn/models.h"

namespace fsdp::conformance {

namespace {

constexpr const char* kKind = "transformer";
constexpr const char* kUnshards = "fsdp_events";

enum class Direction { kForward, kBackward };

std::string Layer(int64_t i) { return "layers." + std::to_string(i); }

// Block i's explicit targets: the next (forward) or previous (backward) `num` blocks, `stride`
// apart, that exist.
std::vector<int64_t> Targets(Direction direction, int64_t i, int64_t n_layers, int64_t num,
                             int64_t stride) {
  std::vector<int64_t> out;
  for (int64_t k = 1; k <= num; ++k) {
    const int64_t j = direction == Direction::kForward ? i + stride * k : i - stride * k;
    if (j >= 0 && j < n_layers) out.push_back(j);
  }
  return out;
}

// One step's unshard and reshard events by the rules of the file comment.
nlohmann::json ExpectedEvents(Direction direction, int64_t n_layers, int64_t num, int64_t stride) {
  nlohmann::json events = nlohmann::json::array();
  events.push_back(EventJson("unshard", "", "FORWARD"));
  std::set<int64_t> done;
  auto unshard = [&](int64_t i, const char* state) {
    if (done.insert(i).second) events.push_back(EventJson("unshard", Layer(i), state));
  };
  for (int64_t i = 0; i < n_layers; ++i) {
    unshard(i, "FORWARD");
    if (direction == Direction::kForward) {
      for (int64_t j : Targets(direction, i, n_layers, num, stride)) unshard(j, "FORWARD");
    }
    events.push_back(EventJson("reshard", Layer(i), "FORWARD"));
  }
  done.clear();
  for (int64_t i = n_layers - 1; i >= 0; --i) {
    unshard(i, "PRE_BACKWARD");
    std::vector<int64_t> targets;
    if (direction == Direction::kBackward) targets = Targets(direction, i, n_layers, num, stride);
    if (targets.empty()) targets = Targets(Direction::kBackward, i, n_layers, 1, 1);  // implicit
    for (int64_t j : targets) unshard(j, "PRE_BACKWARD");
    events.push_back(EventJson("reshard", Layer(i), "POST_BACKWARD"));
  }
  events.push_back(EventJson("reshard", "", "POST_BACKWARD"));
  return events;
}

// One rank's sharded-parity run of zoo model `kind` under `plan`, with the FSDP unshard and
// reshard events of every step under kUnshards.
nlohmann::json RunRecordingEvents(const std::string& kind, const ShardPlan& plan, RankEnv& env) {
  fsdp2::RecordingObserver observer;
  nlohmann::json obs;
  {
    fsdp2::ScopedObserver install(observer);
    obs = RunShardedParityRank(kind, plan, env);
  }
  obs[kUnshards] = nlohmann::json::array();
  const std::set<fsdp2::EventKind> kinds = {fsdp2::EventKind::kUnshard, fsdp2::EventKind::kReshard};
  for (const fsdp2::FsdpEvent& e : observer.events(kinds)) {
    obs[kUnshards].push_back(
        EventJson(fsdp2::EventKindName(e.kind), e.fqn, fsdp2::TrainingStateName(e.state)));
  }
  return obs;
}

// The sharded-parity expectations of zoo model `kind` with `step_events` (one step's events)
// repeated for every step under kUnshards.
ExpectFn ExpectWithEvents(const std::string& kind,
                          std::function<nlohmann::json(const CaseParams&)> step_events) {
  return [kind, step_events](const CaseParams& p, int world) {
    std::vector<nlohmann::json> expected = ExpectShardedParity(kind, p, world);
    const nlohmann::json step = step_events(p);
    for (nlohmann::json& e : expected) {
      e[kUnshards] = nlohmann::json::array();
      for (int64_t k = 0; k < p.GetInt("steps"); ++k) {
        for (const auto& event : step) e[kUnshards].push_back(event);
      }
    }
    return expected;
  };
}

// The sharded-parity judge plus every rank's events against `expect`.
JudgeFn JudgeWithEvents(const std::string& kind, ExpectFn expect) {
  return [kind, expect](const CaseParams& p, int world, const std::vector<nlohmann::json>& per_rank,
                        CheckList& checks) {
    JudgeShardedParity(kind, p, world, per_rank, checks);
    const std::vector<nlohmann::json> expected = expect(p, world);
    for (int r = 0; r < world; ++r) {
      checks.CheckEqual(RankName(r) + " unshard and reshard events (prefetch order)",
                        expected[static_cast<size_t>(r)][kUnshards],
                        RankObservation(per_rank, r, kUnshards));
    }
  };
}

ObservationSchema EventsSchema() {
  ObservationSchema schema = ShardedParitySchema();
  schema.Add(ObservationKey::Events(
      kUnshards,
      "every step's FSDP unshard and reshard events, in order, as [kind, module FQN "
      "(root \"\"), training state]"));
  return schema;
}

// A sharded-parity scenario of zoo model `kind` judged with its events: the parity parameters in
// float64 with `overrides`, worlds 1-8 (default 2), one step's events from `step_events`, each
// rank's ShardPlan from `plan_of`. The caller names it and adds its own parameters and runs.
Scenario EventsParityScenario(const std::string& kind, std::vector<ParamSpec> overrides,
                              std::function<nlohmann::json(const CaseParams&)> step_events,
                              std::function<ShardPlan(const CaseParams&)> plan_of) {
  Scenario s;
  s.info.params = ParityParams(
      ZooModel::Kind(kind),
      ParamSpec::SizeString("dtype", "the engine's parameter and input dtype", "float64"));
  for (ParamSpec& spec : overrides) {
    s.info.params = OverrideParam(std::move(s.info.params), std::move(spec));
  }
  s.info.observations = EventsSchema();
  s.info.inputs = ZooInputsDoc(ZooModel::Kind(kind), "the case's dtype");
  s.info.default_world = 2;
  s.info.min_world = 1;
  s.info.max_world = 8;
  s.inputs = ParityInputs(kind);
  s.expect = ExpectWithEvents(kind, std::move(step_events));
  s.run_rank = [kind, plan_of = std::move(plan_of)](RankEnv& env) {
    return RunRecordingEvents(kind, plan_of(env.params), env);
  };
  s.judge = JudgeWithEvents(kind, s.expect);
  return s;
}

Scenario MakePrefetchScenario(Direction direction) {
  const bool forward = direction == Direction::kForward;
  const std::string api =
      forward ? "set_modules_to_forward_prefetch" : "set_modules_to_backward_prefetch";
  Scenario s = EventsParityScenario(
      kKind,
      {ParamSpec::SizeInt("n_layers", "ModelArgs.n_layers", 4, 1),
       ParamSpec::SizeInt("steps", "training steps", 2, 1),
       ParamSpec::Axis("optim", "optimizer", {"sgd"})},
      [direction](const CaseParams& p) {
        return ExpectedEvents(direction, p.GetInt("n_layers"), p.GetInt("num_to_prefetch"),
                              p.GetInt("prefetch_stride"));
      },
      [direction](const CaseParams& p) -> ShardPlan {
        const int64_t num = p.GetInt("num_to_prefetch");
        const int64_t stride = p.GetInt("prefetch_stride");
        return [direction, num, stride](const nn::ModulePtr& root,
                                        const fsdp2::FullyShardOptions& options) {
          std::vector<nn::ModulePtr> blocks;
          for (const nn::ModulePtr& block : root->get_submodule("layers")->children()) {
            fsdp2::fully_shard(block, options);
            blocks.push_back(block);
          }
          fsdp2::fully_shard(root, options);
          const auto n = static_cast<int64_t>(blocks.size());
          for (int64_t i = 0; i < n; ++i) {
            std::vector<nn::ModulePtr> targets;
            for (int64_t j : Targets(direction, i, n, num, stride)) {
              targets.push_back(blocks[static_cast<size_t>(j)]);
            }
            fsdp2::FSDPModule block(blocks[static_cast<size_t>(i)]);
            if (direction == Direction::kForward) {
              block.set_modules_to_forward_prefetch(targets);
            } else {
              block.set_modules_to_backward_prefetch(targets);
            }
          }
        };
      });
  s.info.name = "fully_shard_comm/" + api;
  s.info.description = "Transformer, block i " + api + "(the " + (forward ? "next" : "previous") +
                       " num_to_prefetch blocks, prefetch_stride apart): unshard events of every "
                       "step in the prefetch order, losses, "
                       "parameter and gradient shards vs the oracle";
  s.info.seed_test = "test_fully_shard_comm.py::TestFullyShardPrefetch::test_" + api;
  s.info.params.push_back(ParamSpec::Axis("num_to_prefetch", "blocks each block prefetches",
                                          {"1", "2"}));
  s.info.params.push_back(
      ParamSpec::SizeInt("prefetch_stride", "distance between a block's targets", 1, 1));
  s.info.test_runs = {{1, {}}, {3, {}}, {4, {}}, {8, {{"num_to_prefetch", "2"}}}};
  // Blocks called as layer(x=h): FSDP must register its post-backward on keyword tensors too,
  // or each block's reshard moves to the end of backward.
  // A stride of 2 tells an explicit list from the implicit backward prefetch it replaces (with
  // stride 1 both target the block before first).
  s.info.extra_default_runs = {{3, {{"block_kwargs", "True"}}}, {4, {{"prefetch_stride", "2"}}}};
  return s;
}

constexpr const char* kMlp = "mlp";

// One step of backward_misprefetch (file comment): each group unshards and reshards in
// forward; in backward out_proj unshards, prefetches in_proj (the implicit prefetch), reshards
// in its post-backward, then in_proj's pre-backward prefetches out_proj (recorded, never waited
// for: no reshard follows) and in_proj reshards in its post-backward.
nlohmann::json ExpectedMisprefetchEvents() {
  nlohmann::json events = nlohmann::json::array();
  for (const char* fqn : {"in_proj", "out_proj"}) {
    events.push_back(EventJson("unshard", fqn, "FORWARD"));
    events.push_back(EventJson("reshard", fqn, "FORWARD"));
  }
  events.push_back(EventJson("unshard", "out_proj", "PRE_BACKWARD"));
  events.push_back(EventJson("unshard", "in_proj", "PRE_BACKWARD"));
  events.push_back(EventJson("reshard", "out_proj", "POST_BACKWARD"));
  events.push_back(EventJson("unshard", "out_proj", "PRE_BACKWARD"));
  events.push_back(EventJson("reshard", "in_proj", "POST_BACKWARD"));
  return events;
}

Scenario BackwardMisprefetch() {
  Scenario s = EventsParityScenario(
      kMlp,
      {ParamSpec::SizeInt("steps", "training steps", 3, 1),
       ParamSpec::Axis("optim", "optimizer (the test's Adam)", {"adam"})},
      [](const CaseParams&) { return ExpectedMisprefetchEvents(); },
      [](const CaseParams&) -> ShardPlan {
        return [](const nn::ModulePtr& root, const fsdp2::FullyShardOptions& options) {
          const nn::ModulePtr in_proj = root->get_submodule("in_proj");
          const nn::ModulePtr out_proj = root->get_submodule("out_proj");
          fsdp2::fully_shard(in_proj, options);
          fsdp2::fully_shard(out_proj, options);
          fsdp2::fully_shard(root, options);
          fsdp2::FSDPModule(in_proj).set_modules_to_backward_prefetch({out_proj});
        };
      });
  s.info.name = "fully_shard_comm/backward_misprefetch";
  s.info.description =
      "MLP, in_proj set_modules_to_backward_prefetch([out_proj]) (a prefetch after out_proj's "
      "backward, never waited for): unshard and reshard events of every step, losses, parameter "
      "and gradient shards vs the oracle";
  s.info.seed_test =
      "test_fully_shard_comm.py::TestFullyShardCommunication::test_backward_misprefetch";
  s.info.extra_default_runs = {{3, {}}};
  return s;
}

}  // namespace

void RegisterFullyShardPrefetchScenarios(ScenarioRegistry& registry) {
  registry.Add(MakePrefetchScenario(Direction::kForward));
  registry.Add(MakePrefetchScenario(Direction::kBackward));
  registry.Add(BackwardMisprefetch());
}

}  // namespace fsdp::conformance
