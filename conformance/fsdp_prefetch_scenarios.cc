// Family `fsdp_prefetch`: where FullyShardedDataParallel (FSDP1) issues its all-gathers,
// reshards and gradient reductions under BackwardPrefetch and forward_prefetch
// (test_fsdp_backward_prefetch.py, which patches `_get_handle_to_prefetch` to see which flat
// parameter each hook prefetches, and test_fsdp_core.py's forward_prefetch parity runs).
//
// The zoo's Transformer is wrapped as parity/fsdp1 wraps it (an instance around each child it
// nests: pos_embeddings, every block, norm; the root's holds the rest) and trains `steps` steps.
// Each rank reports every step's events in order: each unshard that all-gathers a flat parameter
// and each reshard that frees one, as [kind, FQN of its instance (root ""), HandleTrainingState],
// and each collective FSDP issues, as [collective] ("all_gather", "reduce_scatter", "all_reduce").
// The collectives place every prefetch relative to the gradient reductions, which is what tells
// BACKWARD_POST (the next block's all-gather issued in the post-backward hook, before this block's
// reduce-scatter) from no prefetch (after it), and BACKWARD_PRE (in the pre-backward hook, before
// this block reshards) from both.
//
// Rules (PyTorch's _runtime_utils.py and _exec_order_utils.py, 2.4 to 2.15), for the nested
// instances U0..U(m-1) in forward order (pos_embeddings, the blocks, norm; with untied
// weights also tok_embeddings first and output last) and the root R, whose flat parameter
// (the tied embedding) exists only when some parameter is left to it:
//  * Forward. The pre-forward order is R's flat parameter, then U0..U(m-1). Each pre-forward
//    unshards its own flat parameter unless prefetched; with forward_prefetch, from the second
//    iteration on (the order is recorded in the first), it then prefetches the next one of
//    that order, in FORWARD state. A strategy that reshards after forward (FULL_SHARD) frees
//    each Ui in its post-forward; R never frees after forward.
//  * Backward (sharded strategies). R's pre-backward comes first (its output's gradient).
//    Each pre-backward (BACKWARD_PRE) unshards unless prefetched or kept unsharded since
//    forward (SHARD_GRAD_OP); each post-backward (BACKWARD_POST) frees and then reduces. The
//    backward prefetch targets the flat parameter before the current one in post-forward
//    order (U0..U(m-1), R) if its pre-backward has not run and it is not prefetched: under
//    BACKWARD_PRE from the pre-backward, under BACKWARD_POST from the post-backward between
//    the free and the reduce-scatter, in BACKWARD_PRE state either way.
//  * Autograd's order. Ui's post-backward follows its own pre-backward, except when a forward
//    prefetch made Ui's unsharded views in U(i-1)'s pre-forward: those views are older than
//    U(i-1)'s operations, and autograd runs the younger node first, so Ui's post-backward
//    comes after U(i-1)'s pre-backward. R's post-backward is last (the embedding is used
//    first).
//  * Frozen blocks (`frozen_blocks`, test_fsdp_fine_tune.py::test_backward_reshard_hooks):
//    a block whose parameters all have requires_grad=False has a flat parameter that does not
//    require grad, so no post-backward hook: `_register_post_backward_reshard_only_hook` hangs
//    a multi-grad hook on the block's inputs instead, which reshards (BACKWARD_POST, then the
//    BACKWARD_POST prefetch) without reducing anything. The input of a block after the first
//    is the previous block's output, whose pre-backward hook was registered first on that
//    same tensor: the previous block's pre-backward runs, then the frozen block's reshard.
//    Block 0's input is the embeddings' sum, whose gradient is ready before the sum's
//    backward reaches pos_embeddings: the reshard (and its BACKWARD_POST prefetch of
//    pos_embeddings) comes first. A skipped hook leaves the reshard to the end-of-backward
//    catch-all, in BACKWARD_PRE state.
//  * NO_SHARD: nothing to unshard or free; one all-reduce per flat parameter that requires
//    grad, in post-backward order.
// ExpectedStep plays these rules hook by hook over each flat parameter's state.
// Stateless; thread-safe.
#include <algorithm>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "conformance/fsdp1_flat_params.h"
#include "conformance/fsdp1_params.h"
#include "conformance/model_zoo.h"
#include "conformance/observations.h"
#include "conformance/parity_common.h"
#include "conformance/rank_checks.h"
#include "conformance/scenario_registry.h"
#include "engine/autograd/variable.h"
#include "engine/distributed/comm_debug_mode.h"
#include "engine/fsdp/observer.h"
#include "engine/fsdp1/fully_sharded_data_parallel.h"
#include "engine/functional/functional.h"
#include "engine/nn/layers.h"

namespace fsdp::conformance {

namespace {

constexpr const char* kFamily = "fsdp_prefetch";
constexpr const char* kKind = "transformer";
constexpr const char* kEvents = "fsdp1_events";
constexpr const char* kFrozenBlocks = "frozen_blocks";

// The "frozen_blocks" value's block indices ("none": none; else comma-separated indices,
// without repeats), or nullopt when malformed.
std::optional<std::set<int64_t>> ParseFrozenBlocks(const std::string& text) {
  std::set<int64_t> out;
  if (text == "none") return out;
  size_t begin = 0;
  while (begin <= text.size()) {
    const size_t comma = std::min(text.find(',', begin), text.size());
    const std::string item = text.substr(begin, comma - begin);
    if (item.empty() || item.find_first_not_of("0123456789") != std::string::npos ||
        item.size() > 6) {
      return std::nullopt;
    }
    const int64_t index = std::stoll(item);
    if (!out.insert(index).second) return std::nullopt;
    begin = comma + 1;
  }
  return out;
}

// The FQN of block `index` ("layers.1") and the prefix of its parameters' ("layers.1.").
std::string BlockFqn(int64_t index) { return "layers." + std::to_string(index); }
std::string BlockPrefix(int64_t index) { return BlockFqn(index) + "."; }

// The parameters of the case's frozen blocks, by FQN (the oracle's and the module's names).
std::vector<std::string> FrozenParams(const CaseParams& p, const ZooModel& model) {
  const std::set<int64_t> blocks = ParseFrozenBlocks(p.GetString(kFrozenBlocks)).value();
  std::vector<std::string> out;
  for (const auto& [name, value] : model.MakeParameters(/*seed=*/0, DType::kFloat64)) {
    for (int64_t block : blocks) {
      if (name.rfind(BlockPrefix(block), 0) == 0) out.push_back(name);
    }
  }
  return out;
}

// The FQN of the module a nested instance wraps: the longest common module path of its
// parameters ("layers.0" for layers.0.attention.wq.weight, ...; "norm" for norm.weight).
std::string UnitFqn(const std::vector<std::string>& fqns) {
  auto modules = [](const std::string& fqn) {
    std::vector<std::string> parts;
    size_t begin = 0;
    for (size_t dot = fqn.find('.'); dot != std::string::npos; dot = fqn.find('.', begin)) {
      parts.push_back(fqn.substr(begin, dot - begin));
      begin = dot + 1;
    }
    return parts;  // the parameter's own name dropped
  };
  std::vector<std::string> common = modules(fqns.front());
  for (const std::string& fqn : fqns) {
    const std::vector<std::string> parts = modules(fqn);
    size_t n = 0;
    while (n < common.size() && n < parts.size() && common[n] == parts[n]) ++n;
    common.resize(n);
  }
  std::string out;
  for (const std::string& part : common) out += (out.empty() ? "" : ".") + part;
  return out;
}

// The FSDP1 instances of one model: the nested ones in forward order, then the root's, which
// holds a flat parameter only when some parameter is left outside the nested instances.
struct Instances {
  std::vector<std::string> nested;
  bool root_has_params = false;
  std::set<std::string> frozen;  // the nested instances of the frozen blocks
};

Instances InstancesOf(const ZooModel& model, const std::set<int64_t>& frozen_blocks) {
  Instances out;
  for (const Fsdp1FlatParamFqns& unit : Fsdp1FlatParamsOf(model)) {
    if (unit.root) {
      out.root_has_params = true;
    } else {
      out.nested.push_back(UnitFqn(unit.fqns));
    }
  }
  for (int64_t block : frozen_blocks) out.frozen.insert(BlockFqn(block));
  return out;
}

// What one step's events should be: the file comment's rules, played hook by hook over the
// flat parameters' state (unsharded, prefetched, needs a pre-backward unshard), as
// _runtime_utils.py keeps it. Index m is the root's flat parameter, 0..m-1 the nested ones.
class ExpectedStep {
 public:
  ExpectedStep(const Instances& instances, fsdp1::ShardingStrategy strategy,
               std::optional<fsdp1::BackwardPrefetch> backward_prefetch, bool world_shards)
      : instances_(instances),
        m_(static_cast<int64_t>(instances.nested.size())),
        sharded_(world_shards && fsdp1::UsesShardedStrategy(strategy)),
        frees_after_forward_(sharded_ && fsdp1::ReshardsAfterForward(strategy)),
        backward_prefetch_(backward_prefetch),
        unsharded_(static_cast<size_t>(m_ + 1), false),
        prefetched_(static_cast<size_t>(m_ + 1), false),
        needs_pre_backward_unshard_(static_cast<size_t>(m_ + 1), true),
        ran_pre_backward_(static_cast<size_t>(m_ + 1), false),
        ran_reshard_only_(static_cast<size_t>(m_ + 1), false) {}

  // `forward_prefetch`: in effect this step (forward_prefetch=True after the first iteration).
  nlohmann::json Build(bool forward_prefetch) {
    if (!sharded_) {
      // NO_SHARD (or one rank): one all-reduce per flat parameter, in post-backward order.
      for (int64_t i = m_ - 1; i >= 0; --i) {
        if (!Frozen(i)) Collective("all_reduce");
      }
      if (instances_.root_has_params) Collective("all_reduce");
      return std::move(events_);
    }
    // Forward: the pre-forward order is the root's flat parameter (if any), then the nested
    // ones; each pre-forward unshards its own unless prefetched, then (forward_prefetch)
    // the next of that order.
    std::vector<int64_t> order;
    if (instances_.root_has_params) order.push_back(m_);
    for (int64_t i = 0; i < m_; ++i) order.push_back(i);
    for (size_t k = 0; k < order.size(); ++k) {
      const int64_t x = order[k];
      if (!prefetched_[At(x)]) Unshard(x, "FORWARD");
      if (forward_prefetch && k + 1 < order.size()) {
        Unshard(order[k + 1], "FORWARD");
        prefetched_[At(order[k + 1])] = true;
      }
      // The post-forward reshard of a nested instance (the root's comes after the blocks',
      // and never frees).
      if (x != m_) PostForwardReshard(x);
    }
    if (instances_.root_has_params) PostForwardReshard(m_);
    // Backward. The root's pre-backward (its output's gradient) comes first. A nested
    // instance's post-backward follows its pre-backward at once, unless its unsharded views
    // were made by a forward prefetch in the previous instance's pre-forward: then autograd
    // runs that previous instance's backward first (its nodes are younger than the views), so
    // the post-backward follows the previous instance's pre-backward. A frozen block's
    // reshard-only hook fires on its input's gradient: right after the previous instance's
    // pre-backward hook on that same tensor, or (block 0, fed the embeddings' sum) before the
    // previous instance's pre-backward.
    if (instances_.root_has_params) PreBackward(m_);
    for (int64_t i = m_ - 1; i >= 0; --i) {
      if (forward_prefetch && i + 1 < m_ && Frozen(i + 1) && !FedByPrevious(i + 1)) {
        PostBackwardReshardOnly(i + 1);
      }
      PreBackward(i);
      if (!forward_prefetch) {
        if (Frozen(i)) {
          if (FedByPrevious(i)) PreBackward(i - 1);
          PostBackwardReshardOnly(i);
        } else {
          PostBackward(i);
        }
      } else if (i + 1 < m_ && Frozen(i + 1)) {
        PostBackwardReshardOnly(i + 1);
      } else if (i + 1 < m_) {
        PostBackward(i + 1);
      }
    }
    if (forward_prefetch && m_ > 0) PostBackward(0);
    if (instances_.root_has_params) PostBackward(m_);
    return std::move(events_);
  }

 private:
  size_t At(int64_t x) const { return static_cast<size_t>(x); }
  std::string Fqn(int64_t x) const { return x == m_ ? "" : instances_.nested[At(x)]; }
  bool Frozen(int64_t x) const { return x != m_ && instances_.frozen.count(Fqn(x)) > 0; }
  // Whether nested instance x's input is instance x-1's output (every block but the first).
  bool FedByPrevious(int64_t x) const { return x > 0 && Fqn(x) != BlockFqn(0); }

  // `_unshard`: an event and an all-gather only when the flat parameter is not unsharded.
  void Unshard(int64_t x, const char* state) {
    if (unsharded_[At(x)]) return;
    unsharded_[At(x)] = true;
    events_.push_back(EventJson("unshard", Fqn(x), state));
    Collective("all_gather");
  }
  // `_reshard` freeing the unsharded flat parameter; any `_reshard` clears `_prefetched`.
  void Reshard(int64_t x, bool free, const char* state) {
    prefetched_[At(x)] = false;
    if (!free) return;
    unsharded_[At(x)] = false;
    events_.push_back(EventJson("reshard", Fqn(x), state));
  }
  void PostForwardReshard(int64_t x) { Reshard(x, x != m_ && frees_after_forward_, "FORWARD"); }
  // `_prefetch_handle` in backward: the flat parameter before x in post-forward order (the
  // nested ones, then the root's), if it still needs its pre-backward unshard and is not
  // prefetched.
  void PrefetchBackward(int64_t x) {
    const int64_t target = x == m_ ? m_ - 1 : x - 1;
    if (target < 0 || !needs_pre_backward_unshard_[At(target)] || prefetched_[At(target)]) return;
    Unshard(target, "BACKWARD_PRE");
    prefetched_[At(target)] = true;
  }
  // `_pre_backward_hook`: once per flat parameter per backward.
  void PreBackward(int64_t x) {
    if (ran_pre_backward_[At(x)]) return;
    ran_pre_backward_[At(x)] = true;
    if (needs_pre_backward_unshard_[At(x)] && !prefetched_[At(x)]) Unshard(x, "BACKWARD_PRE");
    needs_pre_backward_unshard_[At(x)] = false;
    if (backward_prefetch_ == fsdp1::BackwardPrefetch::kBackwardPre) PrefetchBackward(x);
  }
  // `_post_backward_hook`: free (every sharded strategy frees in backward when gradients
  // sync), prefetch under BACKWARD_POST, reduce-scatter.
  void PostBackward(int64_t x) {
    Reshard(x, true, "BACKWARD_POST");
    if (backward_prefetch_ == fsdp1::BackwardPrefetch::kBackwardPost) PrefetchBackward(x);
    Collective("reduce_scatter");
  }
  // `_post_backward_reshard_only_hook` of a frozen block: the same free and prefetch, no
  // gradient to reduce.
  void PostBackwardReshardOnly(int64_t x) {
    if (ran_reshard_only_[At(x)]) return;
    ran_reshard_only_[At(x)] = true;
    Reshard(x, true, "BACKWARD_POST");
    if (backward_prefetch_ == fsdp1::BackwardPrefetch::kBackwardPost) PrefetchBackward(x);
  }
  void Collective(const char* name) { events_.push_back(nlohmann::json::array({name})); }

  const Instances& instances_;
  const int64_t m_;
  const bool sharded_;
  const bool frees_after_forward_;
  const std::optional<fsdp1::BackwardPrefetch> backward_prefetch_;
  std::vector<bool> unsharded_;
  std::vector<bool> prefetched_;
  std::vector<bool> needs_pre_backward_unshard_;
  std::vector<bool> ran_pre_backward_;
  std::vector<bool> ran_reshard_only_;
  nlohmann::json events_ = nlohmann::json::array();
};

nlohmann::json ExpectedEvents(const CaseParams& p, int world) {
  const Instances instances = InstancesOf(DecodeParityCase(kKind, p).model,
                                          ParseFrozenBlocks(p.GetString(kFrozenBlocks)).value());
  nlohmann::json steps = nlohmann::json::array();
  for (int64_t k = 0; k < p.GetInt("steps"); ++k) {
    ExpectedStep step(instances, ParseShardingStrategy(p.GetString("sharding_strategy")),
                      ParseBackwardPrefetch(p.GetString("backward_prefetch")), world > 1);
    steps.push_back(step.Build(p.GetBool("forward_prefetch") && k >= 1));
  }
  return steps;
}

// What every rank should report: the oracle's data-parallel losses (rank r's own) and the
// events of ExpectedEvents.
std::vector<nlohmann::json> ExpectPrefetch(const CaseParams& p, int world) {
  const ParityCase c = DecodeParityCase(kKind, p);
  const auto oracle =
      TrainOracle(c.model, c.optim, c.seed, c.steps, c.dtype, world,
                  /*flat_params=*/{}, /*clip=*/std::nullopt, FrozenParams(p, c.model));
  const nlohmann::json events = ExpectedEvents(p, world);
  std::vector<nlohmann::json> expected(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    nlohmann::json& e = expected[static_cast<size_t>(r)];
    e[kLosses] = nlohmann::json::array();
    for (const auto& step : oracle) e[kLosses].push_back(step.rank_losses.at(r));
    e["loss_dtype"] = DTypeName(ZooModel::Kind(kKind).LossDType(c.dtype));
    e[kEvents] = events;
  }
  return expected;
}

// A CommDebugMode op key as the events name it: "all_gather", "reduce_scatter", "all_reduce"
// (the key itself for any other collective).
std::string CollectiveName(const std::string& op) {
  if (op.find("allgather") != std::string::npos || op.find("all_gather") != std::string::npos) {
    return "all_gather";
  }
  if (op.find("reduce_scatter") != std::string::npos) return "reduce_scatter";
  if (op.find("allreduce") != std::string::npos || op.find("all_reduce") != std::string::npos) {
    return "all_reduce";
  }
  return op;
}

// PyTorch's HandleTrainingState name of the state an FSDP1 event carries.
std::string HandleStateName(fsdp2::TrainingState state) {
  switch (state) {
    case fsdp2::TrainingState::kForward:
      return "FORWARD";
    case fsdp2::TrainingState::kPreBackward:
      return "BACKWARD_PRE";
    case fsdp2::TrainingState::kPostBackward:
      return "BACKWARD_POST";
    default:
      return fsdp2::TrainingStateName(state);
  }
}

// Records FSDP1's unshard and reshard events interleaved with the collectives `comm_mode`
// records: each event notes how many collectives preceded it. Owned by the rank's body; called
// on the rank's thread only.
class InterleavingObserver : public fsdp2::Observer {
 public:
  explicit InterleavingObserver(const distributed::CommDebugMode& comm_mode)
      : comm_mode_(comm_mode) {}

  void unshard(const std::string& fqn, fsdp2::TrainingState state) override {
    Add("unshard", fqn, state);
  }
  void reshard(const std::string& fqn, fsdp2::TrainingState state) override {
    Add("reshard", fqn, state);
  }

  // Everything recorded since the last call, in order, collectives included.
  nlohmann::json Take() {
    const std::vector<distributed::CommRecord>& records = comm_mode_.records();
    nlohmann::json out = nlohmann::json::array();
    for (const auto& [collectives_before, event] : pending_) {
      for (; taken_ < collectives_before; ++taken_) {
        out.push_back(nlohmann::json::array({CollectiveName(records[taken_].op)}));
      }
      out.push_back(event);
    }
    for (; taken_ < records.size(); ++taken_) {
      out.push_back(nlohmann::json::array({CollectiveName(records[taken_].op)}));
    }
    pending_.clear();
    return out;
  }

 private:
  void Add(const char* kind, const std::string& fqn, fsdp2::TrainingState state) {
    pending_.emplace_back(comm_mode_.records().size(),
                          EventJson(kind, fqn, HandleStateName(state)));
  }

  const distributed::CommDebugMode& comm_mode_;
  std::vector<std::pair<size_t, nlohmann::json>> pending_;
  size_t taken_ = 0;
};

nlohmann::json RunPrefetchRank(RankEnv& env) {
  const ParityCase c = DecodeParityCase(kKind, env.params);
  nn::ModulePtr module = c.model.BuildEngineFromInputs(env.Inputs(), c.dtype);
  module->to(env.device);
  const std::vector<std::string> frozen = FrozenParams(env.params, c.model);
  for (const auto& [name, param] : module->named_parameters()) {
    if (std::find(frozen.begin(), frozen.end(), name) != frozen.end()) {
      Tensor p = param;  // shares the parameter's impl
      p.set_requires_grad(false);
    }
  }
  auto fsdp_model = WrapChildrenThenRoot(module, Fsdp1CaseOptions(env.params, env.pg));
  distributed::CommDebugMode comm_mode;
  InterleavingObserver observer(comm_mode);
  nlohmann::json steps = nlohmann::json::array();
  EngineTrainingRecord record;
  {
    fsdp2::ScopedObserver install(observer);
    // Each step's events are taken after its optimizer step (which communicates nothing).
    record = TrainEngine(c.model, *fsdp_model, c.optim, env.Inputs(), c.steps, [&](nn::Module&) {
      steps.push_back(observer.Take());
      return reference::RefTensorMap{};
    });
  }
  comm_mode.exit();
  nlohmann::json obs;
  obs[kLosses] = record.losses;
  obs["loss_dtype"] = DTypeName(record.loss_dtype);
  obs[kEvents] = std::move(steps);
  return obs;
}

Scenario MakeScenario(bool forward_prefetch) {
  Scenario s;
  const std::string name = forward_prefetch ? "forward_prefetch" : "backward_prefetch";
  s.info.name = std::string(kFamily) + "/" + name;
  s.info.description =
      std::string("Transformer under FullyShardedDataParallel (an instance per block), ") +
      (forward_prefetch ? "forward_prefetch=True" : "forward_prefetch=False") +
      ", every BackwardPrefetch: every step's unshards, reshards and collectives in order";
  s.info.seed_test = forward_prefetch ? "test_fsdp_core.py (forward_prefetch parity runs)"
                                      : "test_fsdp_backward_prefetch.py::TestBackwardPrefetch";
  s.info.params = ParityParams(
      ZooModel::Kind(kKind),
      ParamSpec::SizeString("dtype", "the engine's parameter and input dtype", "float32"));
  for (ParamSpec spec : {ParamSpec::SizeInt("n_layers", "ModelArgs.n_layers", 3, 1),
                         ParamSpec::SizeInt("steps", "training steps", 3, 1),
                         ParamSpec::SizeString("optim", "optimizer: sgd or adam", "sgd")}) {
    s.info.params = OverrideParam(std::move(s.info.params), std::move(spec));
  }
  s.info.params.push_back(ShardingStrategyAxis());
  s.info.params.push_back(BackwardPrefetchAxis());
  s.info.params.push_back(ParamSpec::SizeBool(
      "forward_prefetch", "FullyShardedDataParallel forward_prefetch", forward_prefetch));
  s.info.params.push_back(
      ParamSpec::SizeBool("use_orig_params", "FullyShardedDataParallel use_orig_params", false));
  ParamSpec frozen = ParamSpec::SizeString(
      kFrozenBlocks,
      "none, or comma-separated indices >= 1 of blocks whose parameters get requires_grad=False "
      "before wrapping",
      "none");
  frozen.domain = ParamDomain{"none or comma-separated block indices >= 1, without repeats",
                              [](const std::string& v) -> std::optional<std::string> {
                                if (!ParseFrozenBlocks(v)) return std::nullopt;
                                return v;
                              }};
  s.info.params.push_back(std::move(frozen));
  s.info.observations.Add(ObservationKey::Losses("the rank's loss at every step"));
  s.info.observations.Add(ObservationKey::String("loss_dtype", "the dtype of the losses"));
  // [[event, ...] per step], an event being 1 to 3 strings.
  const nlohmann::json event = {
      {"type", "array"}, {"items", {{"type", "string"}}}, {"minItems", 1}, {"maxItems", 3}};
  const nlohmann::json step = {{"type", "array"}, {"items", event}};
  s.info.observations.Add(ObservationKey::Custom(
      kEvents, {{"type", "array"}, {"items", step}},
      "every step's events in order: each unshard that all-gathers a flat parameter and each "
      "reshard that frees one as [kind, FQN of its FullyShardedDataParallel instance (root \"\"), "
      "HandleTrainingState], each collective FSDP issues as [\"all_gather\" | "
      "\"reduce_scatter\" | \"all_reduce\"]"));
  s.info.deterministic = true;
  s.info.inputs = ZooInputsDoc(ZooModel::Kind(kKind), "the case's dtype");
  s.info.default_world = 2;
  s.info.min_world = 2;
  s.info.max_world = 8;
  // An uneven world: the same events, whatever the shard sizes.
  s.info.extra_default_runs = {{3, {{"sharding_strategy", "FULL_SHARD"}}}};
  // A frozen block (test_fsdp_fine_tune.py::test_backward_reshard_hooks): its reshard-only
  // post-backward hook, every strategy and BackwardPrefetch; under forward_prefetch with the
  // blocks called as `layer(x=h)`, whose input the hook must find among the keyword arguments.
  std::map<std::string, std::string> frozen_run = {{kFrozenBlocks, "0,2"}};
  if (forward_prefetch) frozen_run["block_kwargs"] = "True";
  s.info.extra_default_runs.push_back({2, frozen_run});
  s.skip = [](const CaseParams& p, int) -> std::optional<std::string> {
    const int64_t n_layers = p.GetInt("n_layers");
    const std::set<int64_t> blocks = ParseFrozenBlocks(p.GetString(kFrozenBlocks)).value();
    for (int64_t block : blocks) {
      if (block >= n_layers) {
        return "frozen_blocks names block " + std::to_string(block) + " but n_layers is " +
               std::to_string(n_layers);
      }
    }
    return std::nullopt;
  };
  s.info.requirements.devices = {DeviceType::kCPU};
  s.inputs = ParityInputs(kKind);
  s.run_rank = [](RankEnv& env) { return RunPrefetchRank(env); };
  s.expect = [](const CaseParams& p, int world) { return ExpectPrefetch(p, world); };
  s.judge = [](const CaseParams& p, int world, const std::vector<nlohmann::json>& per_rank,
               CheckList& checks) {
    const ParityCase c = DecodeParityCase(kKind, p);
    const std::vector<nlohmann::json> expected = ExpectPrefetch(p, world);
    for (int r = 0; r < world; ++r) {
      // Prefetching moves collectives, never values: the losses are the oracle's.
      CheckRankLosses(checks, c, expected, per_rank, r);
      const nlohmann::json& want = expected[static_cast<size_t>(r)][kEvents];
      const nlohmann::json& got = RankObservation(per_rank, r, kEvents);
      checks.CheckEqual(RankName(r) + " steps reported", want.size(), got.size());
      for (size_t k = 0; k < want.size() && k < got.size(); ++k) {
        checks.CheckEqual(RankName(r) + " step " + std::to_string(k) +
                              " unshards, reshards and collectives in order",
                          want[k], got[k]);
      }
    }
  };
  return s;
}

// ---- fsdp_prefetch/forward_prefetch_reused_module --------------------------------------------
//
// A module called twice in one forward under forward_prefetch (PyTorch's _runtime_utils.py
// `_get_handle_to_prefetch`, 2.4 to 2.15): the root (no parameters of its own) holds a and b,
// each a Linear(dim, dim) in its own FullyShardedDataParallel instance, and its forward is
// a(b(a(x))) reordered as out = a(x); out = b(out); out = a(out). The first iteration records
// the pre-forward order of each flat parameter's first use, [a, b]
// (`_ExecOrderData.record_pre_forward`); `get_handle_to_forward_prefetch` targets the next
// recorded one, so from the second iteration on a's first pre-forward prefetches b, and in
// every iteration (the first too: b is recorded by then) a's second pre-forward targets b
// again, but b already ran its pre-forward (`_needs_pre_forward_unshard` is False, reset to
// True only by the root's pre-forward), so nothing is prefetched. Rule: prefetching only
// moves all-gathers, so every forward all-gathers once per call of an instance whose flat
// parameter is sharded at that call: FULL_SHARD frees after each forward (3 per forward: a,
// b, a again), SHARD_GRAD_OP keeps it until the post-backward (2: a, b), NO_SHARD never
// gathers (0). A prefetch that ignores `_needs_pre_forward_unshard` gathers b a second time.
//
// Backward (test_fsdp_backward_prefetch.py's view of `_get_handle_to_prefetch`): the post-forward
// order of one forward is a, b, a. `_ExecOrderData.record_post_forward` tests a recorded index
// for truthiness, so a's first index, 0, counts as unrecorded and its second call records a
// again at index 2. The backward starts with a's pre-backward (the output's gradient), which
// unshards a where its flat parameter is sharded (FULL_SHARD freed it after its second call)
// and, under BACKWARD_PRE, prefetches the flat parameter before a's index, b (its pre-backward
// not yet run). A tensor hook on a clone of b's output, which a's second call consumes, runs
// after a's backward and before b's pre-backward: the backward's all-gathers counted there are
// FULL_SHARD 1 + (BACKWARD_PRE ? 1 : 0), SHARD_GRAD_OP and NO_SHARD 0 (nothing was freed).
// An index 0 taken as recorded leaves a at 0, with nothing before it to prefetch.

constexpr const char* kReusedForwardAllGathers = "forward_all_gathers";
constexpr const char* kReusedBackwardAllGathersAtB = "backward_all_gathers_at_b_output";

// The root of forward_prefetch_reused_module: a and b, forward a(b(a(x))), b's output cloned
// before a's second call and `probe` run by a hook on the clone (when its gradient is ready).
class ReusedChildModel : public nn::Cloneable<ReusedChildModel> {
 public:
  ReusedChildModel(int64_t dim, std::function<void()> probe)
      : nn::Cloneable<ReusedChildModel>("ReusedChildModel"), probe_(std::move(probe)) {
    register_module("a", std::make_shared<nn::Linear>(dim, dim));
    register_module("b", std::make_shared<nn::Linear>(dim, dim));
  }
  nn::Value forward(const nn::Value& args) override {
    nn::Value out = call_child("a", args);
    const Tensor b_output = clone(call_child("b", out).tensor());
    if (probe_ && b_output.requires_grad()) {
      autograd::register_hook(b_output, [probe = probe_](const Tensor& /*grad*/) { probe(); });
    }
    return call_child("a", b_output);
  }

 private:
  std::function<void()> probe_;
};

constexpr int64_t kReusedDim = 4;

// The flat-parameter all-gathers of one backward up to b's output's gradient (the rule above).
int64_t ExpectedReusedBackwardAllGathersAtB(const CaseParams& p) {
  if (ParseShardingStrategy(p.GetString("sharding_strategy")) !=
      fsdp1::ShardingStrategy::kFullShard) {
    return 0;
  }
  return p.GetString("backward_prefetch") == "BACKWARD_PRE" ? 2 : 1;
}

// The flat-parameter all-gathers of one forward (the rule above).
int64_t ExpectedReusedForwardAllGathers(const CaseParams& p) {
  switch (ParseShardingStrategy(p.GetString("sharding_strategy"))) {
    case fsdp1::ShardingStrategy::kFullShard:
      return 3;
    case fsdp1::ShardingStrategy::kShardGradOp:
      return 2;
    default:
      return 0;
  }
}

nlohmann::json RunReusedModuleRank(RankEnv& env) {
  // The backward's CommDebugMode while one is active; the probe reads its all-gathers.
  distributed::CommDebugMode* backward_mode = nullptr;
  std::vector<int64_t> at_b_output;
  auto module = std::make_shared<ReusedChildModel>(kReusedDim, [&backward_mode, &at_b_output] {
    if (backward_mode == nullptr) return;
    at_b_output.push_back(backward_mode->get_count(kFlatParamAllGather) +
                          backward_mode->get_count(kFlatParamAllGatherList));
  });
  module->to(env.device);
  fsdp1::FullyShardedDataParallelOptions options = Fsdp1CaseOptions(env.params, env.pg);
  options.auto_wrap_policy = nullptr;
  for (const char* name : {"a", "b"}) {
    module->register_module(name, std::make_shared<fsdp1::FullyShardedDataParallel>(
                                      module->get_submodule(name), options));
  }
  auto fsdp_model = std::make_shared<fsdp1::FullyShardedDataParallel>(module, options);
  nlohmann::json counts = nlohmann::json::array();
  for (int64_t k = 0; k < env.params.GetInt("steps"); ++k) {
    distributed::CommDebugMode forward_mode;
    Tensor out = (*fsdp_model)(Tensor::ones({2, kReusedDim}, DType::kFloat32, env.device)).tensor();
    forward_mode.exit();
    counts.push_back(forward_mode.get_count(kFlatParamAllGather) +
                     forward_mode.get_count(kFlatParamAllGatherList));
    distributed::CommDebugMode mode;
    backward_mode = &mode;
    fsdp::sum(out).backward();
    backward_mode = nullptr;
    mode.exit();
  }
  return {{kReusedForwardAllGathers, counts}, {kReusedBackwardAllGathersAtB, at_b_output}};
}

Scenario MakeReusedModuleScenario() {
  Scenario s;
  s.info.name = std::string(kFamily) + "/forward_prefetch_reused_module";
  s.info.description =
      "FullyShardedDataParallel forward_prefetch=True with a nested instance called twice in one "
      "forward (a, b, a): every forward's all-gathers";
  s.info.seed_test = "_runtime_utils.py::_get_handle_to_prefetch (_needs_pre_forward_unshard)";
  s.info.params.push_back(ParamSpec::SizeString(
      "sharding_strategy", "FullyShardedDataParallel sharding_strategy", "FULL_SHARD"));
  s.info.params.push_back(ParamSpec::SizeString(
      "backward_prefetch", "BackwardPrefetch (None: no prefetch)", "BACKWARD_PRE"));
  s.info.params.push_back(
      ParamSpec::SizeBool("forward_prefetch", "FullyShardedDataParallel forward_prefetch", true));
  s.info.params.push_back(
      ParamSpec::SizeBool("use_orig_params", "FullyShardedDataParallel use_orig_params", false));
  s.info.params.push_back(ParamSpec::SizeInt(
      "steps", "iterations (forward and backward; forward_prefetch starts in the second)", 2, 1));
  s.info.observations.Add(ObservationKey::Custom(
      kReusedForwardAllGathers, {{"type", "array"}, {"items", {{"type", "integer"}}}},
      "every iteration's count of flat-parameter all-gathers during forward"));
  s.info.observations.Add(ObservationKey::Custom(
      kReusedBackwardAllGathersAtB, {{"type", "array"}, {"items", {{"type", "integer"}}}},
      "every iteration's count of flat-parameter all-gathers the backward issued before the "
      "gradient of b's output is ready (a tensor hook on the clone of b's output that a's second "
      "call consumes: after a's pre-backward, before b's)"));
  s.info.deterministic = true;
  s.info.default_world = 2;
  s.info.min_world = 2;
  s.info.max_world = 8;
  s.skip = [](const CaseParams& p, int) -> std::optional<std::string> {
    const std::string strategy = p.GetString("sharding_strategy");
    if (strategy == "FULL_SHARD" || strategy == "SHARD_GRAD_OP" || strategy == "NO_SHARD") {
      return std::nullopt;
    }
    return "sharding_strategy " + strategy +
           ": the rule covers FULL_SHARD, SHARD_GRAD_OP and "
           "NO_SHARD";
  };
  s.info.requirements.devices = {DeviceType::kCPU};
  s.run_rank = [](RankEnv& env) { return RunReusedModuleRank(env); };
  s.expect = [](const CaseParams& p, int world) {
    nlohmann::json counts = nlohmann::json::array();
    nlohmann::json at_b_output = nlohmann::json::array();
    for (int64_t k = 0; k < p.GetInt("steps"); ++k) {
      counts.push_back(ExpectedReusedForwardAllGathers(p));
      at_b_output.push_back(ExpectedReusedBackwardAllGathersAtB(p));
    }
    return std::vector<nlohmann::json>(
        static_cast<size_t>(world),
        {{kReusedForwardAllGathers, counts}, {kReusedBackwardAllGathersAtB, at_b_output}});
  };
  s.judge = [](const CaseParams& p, int world, const std::vector<nlohmann::json>& per_rank,
               CheckList& checks) {
    const int64_t want = ExpectedReusedForwardAllGathers(p);
    for (int r = 0; r < world; ++r) {
      const nlohmann::json& got = RankObservation(per_rank, r, kReusedForwardAllGathers);
      checks.CheckEqual(RankName(r) + " iterations reported", p.GetInt("steps"),
                        static_cast<int64_t>(got.size()));
      for (size_t k = 0; k < got.size(); ++k) {
        checks.CheckEqual(RankName(r) + " iteration " + std::to_string(k) +
                              " forward all-gathers (one per call of a sharded instance)",
                          want, got[k].get<int64_t>());
      }
      const int64_t want_at_b = ExpectedReusedBackwardAllGathersAtB(p);
      const nlohmann::json& at_b = RankObservation(per_rank, r, kReusedBackwardAllGathersAtB);
      checks.CheckEqual(RankName(r) + " iterations reported (backward)", p.GetInt("steps"),
                        static_cast<int64_t>(at_b.size()));
      for (size_t k = 0; k < at_b.size(); ++k) {
        checks.CheckEqual(RankName(r) + " iteration " + std::to_string(k) +
                              " backward all-gathers when b's output gradient is ready (a's "
                              "pre-backward: a, and under BACKWARD_PRE b, the flat parameter "
                              "before a's last post-forward index)",
                          want_at_b, at_b[k].get<int64_t>());
      }
    }
  };
  return s;
}

}  // namespace

void RegisterFsdpPrefetchScenarios(ScenarioRegistry& registry) {
  registry.Add(MakeScenario(/*forward_prefetch=*/false));
  registry.Add(MakeScenario(/*forward_prefetch=*/true));
  registry.Add(MakeReusedModuleScenario());
}

}  // namespace fsdp::conformance
