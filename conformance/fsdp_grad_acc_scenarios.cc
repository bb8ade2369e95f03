// Family `fsdp_grad_acc` (seed 004, test_fsdp_grad_acc.py): gradient accumulation with FSDP1's
// `no_sync()` against the oracle's data-parallel accumulation.
//   grad_acc               TestGradAcc.test_grad_acc: configs x use_orig_params x
//                          backward_prefetch x sharding_strategy
//   grad_acc_cpu_offload   TestGradAcc.test_grad_acc_cpu_offload: CPUOffload(offload_params=True),
//                          configs [no_sync x 3]
//   grad_acc_fully_shard   the same accumulation with FSDP2: fully_shard on every encoder and
//                          decoder layer, then the root, and set_requires_gradient_sync(False)
//                          for the no_sync micro-batches, judged against the same oracle
// The configs axis spells the seed's _GradAccConfigs as "no_sync:3+sync:3+no_sync:3".
//
// Each rank wraps TransformerWithSharedParams (eval mode, as the seed's deterministic=True) with
// FullyShardedDataParallel, its encoder and decoder layers as nested instances
// (ModuleWrapPolicy, the seed's FSDPInitMode.RECURSIVE), and for each of `steps` optimizer steps
// runs the configs' micro-batches, inside or outside no_sync() (the last micro-batch of a step
// always synced, as the seed), then one SGD step. It reports every micro-batch's loss and
// collective counts per phase, and the full parameters after every optimizer step
// (summon_full_params). The seed compares accumulated gradients with one backward over the
// concatenated batch on identical ranks; here every rank gets its own micro-batches (the seed's
// permuted get_input batches, drawn per rank), so a dropped rank contribution shows, and the
// gradients are judged through the parameters they move: the oracle accumulates the
// rank-averaged gradients of the same micro-batches and steps the same SGD.
//
// Collective counts per micro-batch follow FSDP1's rules (docs/fsdp1.md, "Collective counts"):
// an instance all-gathers in forward iff its unsharded flat parameter was freed (FULL_SHARD
// after every backward; SHARD_GRAD_OP only after a synced one; NO_SHARD never); FULL_SHARD's
// backward re-gathers every instance but the root; a synced backward reduce-scatters every
// sharded instance (NO_SHARD all-reduces); inside no_sync() nothing is reduced. A world of one
// rank runs every strategy as NO_SHARD. The hybrid strategies (on the (replicate, shard) mesh
// of HybridMeshShapeFor(world); worlds without one skip them) count as FULL_SHARD and
// SHARD_GRAD_OP, plus, in a synced backward, one all-reduce per instance across the replicate
// group after its reduce-scatter. PyTorch all-gathers a flat parameter with
// all_gather_into_tensor on accelerators and with the list all_gather on the CPU, so the judge
// counts `c10d._allgather_base_` and `c10d.allgather_` together as all-gathers.
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "conformance/fsdp1_params.h"
#include "conformance/model_zoo.h"
#include "conformance/observations.h"
#include "conformance/rank_checks.h"
#include "conformance/scenario_registry.h"
#include "conformance/uneven_world.h"
#include "engine/core/rng.h"
#include "engine/distributed/comm_debug_mode.h"
#include "engine/distributed/device_mesh.h"
#include "engine/fsdp/fsdp_param.h"
#include "engine/fsdp/fully_shard.h"
#include "engine/fsdp1/fully_sharded_data_parallel.h"
#include "engine/fsdp1/unshard_params.h"
#include "engine/fsdp1/wrap_policy.h"
#include "engine/nn/init.h"
#include "engine/nn/models.h"
#include "engine/optim/sgd.h"
#include "reference/data_parallel.h"
#include "reference/loss.h"
#include "reference/optimizers.h"
#include "reference/transformer_with_shared_params.h"

namespace fsdp::conformance {

namespace {

constexpr const char* kSeed004 = "test_fsdp_grad_acc.py::TestGradAcc::";
constexpr const char* kAllGather = kFlatParamAllGather;
constexpr const char* kReduceScatter = "c10d._reduce_scatter_base_";
constexpr const char* kAllReduce = "c10d.allreduce_";
// The seed's micro-batch: get_input() = (arange(12).view(6, 2), arange(8).view(4, 2)).
constexpr int64_t kSrcLen = 6;
constexpr int64_t kTgtLen = 4;
constexpr int64_t kBatch = 2;

// `_GradAccConfig`: num_iters micro-batches inside no_sync() or not.
struct GradAccConfig {
  bool use_no_sync = false;
  int64_t num_iters = 1;
};

// "no_sync:3+sync:3+no_sync:3" <-> configs; nullopt for anything else.
std::optional<std::vector<GradAccConfig>> ParseConfigs(const std::string& text) {
  std::vector<GradAccConfig> configs;
  size_t begin = 0;
  while (begin <= text.size()) {
    const size_t comma = text.find('+', begin);
    const std::string item = text.substr(begin, comma == std::string::npos ? std::string::npos
                                                                            : comma - begin);
    const size_t colon = item.find(':');
    if (colon == std::string::npos) return std::nullopt;
    const std::string kind = item.substr(0, colon);
    const auto n = ParseInt(item.substr(colon + 1));
    if ((kind != "no_sync" && kind != "sync") || !n || *n < 1 || *n > 64) return std::nullopt;
    configs.push_back({kind == "no_sync", *n});
    if (comma == std::string::npos) break;
    begin = comma + 1;
  }
  if (configs.empty() || configs.size() > 16) return std::nullopt;
  return configs;
}

std::string ConfigsText(const std::vector<GradAccConfig>& configs) {
  std::string out;
  for (const GradAccConfig& c : configs) {
    out += (out.empty() ? "" : "+") + std::string(c.use_no_sync ? "no_sync" : "sync") + ":" +
           std::to_string(c.num_iters);
  }
  return out;
}

ParamSpec ConfigsAxis(std::vector<std::string> values) {
  ParamSpec spec = ParamSpec::Axis(
      "configs", "the seed's _GradAccConfigs: '+'-separated no_sync:N / sync:N micro-batch runs",
      std::move(values));
  spec.domain = ParamDomain{
      "a '+'-separated list of no_sync:N or sync:N (1 <= N <= 64, at most 16 items)",
      [](const std::string& value) -> std::optional<std::string> {
        auto configs = ParseConfigs(value);
        if (!configs) return std::nullopt;
        return ConfigsText(*configs);
      }};
  return spec;
}

// Per micro-batch of one optimizer step: whether it runs inside no_sync(). The seed's loop: the
// configs' iterations in order, then the last micro-batch always outside no_sync().
std::vector<bool> NoSyncPattern(const std::vector<GradAccConfig>& configs) {
  int64_t total = 0;
  for (const GradAccConfig& c : configs) total += c.num_iters;
  std::vector<bool> pattern;
  for (const GradAccConfig& c : configs) {
    for (int64_t i = 0; i < c.num_iters && static_cast<int64_t>(pattern.size()) < total - 1; ++i) {
      pattern.push_back(c.use_no_sync);
    }
  }
  pattern.push_back(false);
  return pattern;
}

// A case's parameters, decoded once.
struct GradAccCase {
  std::vector<GradAccConfig> configs;
  std::vector<bool> pattern;  // NoSyncPattern(configs)
  fsdp1::ShardingStrategy strategy = fsdp1::ShardingStrategy::kFullShard;
  std::optional<fsdp1::BackwardPrefetch> prefetch;
  bool use_orig_params = false;
  bool cpu_offload = false;
  bool fully_shard = false;  // FSDP2 instead of FSDP1
  int64_t steps = 2;
  uint64_t seed = 0;
  double lr = 0.002;
  DType dtype = DType::kFloat64;
  Tolerance tolerance;

  static GradAccCase Decode(const CaseParams& p) {
    GradAccCase c;
    c.configs = *ParseConfigs(p.GetString("configs"));
    c.pattern = NoSyncPattern(c.configs);
    c.fully_shard = p.GetString("api") == "fully_shard";
    if (!c.fully_shard) {
      c.strategy = ParseShardingStrategy(p.GetString("sharding_strategy"));
      c.prefetch = ParseBackwardPrefetch(p.GetString("backward_prefetch"));
      c.use_orig_params = p.GetBool("use_orig_params");
      c.cpu_offload = p.GetBool("cpu_offload");
    }
    c.steps = p.GetInt("steps");
    FSDP_CHECK(c.steps >= 1, "steps must be >= 1, got ", c.steps);
    c.seed = static_cast<uint64_t>(p.GetInt("seed"));
    c.lr = p.GetDouble("lr");
    c.dtype = ParseDType(p.GetString("dtype"));
    FSDP_CHECK(c.dtype == DType::kFloat32 || c.dtype == DType::kFloat64,
               "dtype must be float32 or float64, got ", p.GetString("dtype"));
    c.tolerance = c.dtype == DType::kFloat64
                      ? Tolerance{p.GetDouble("atol_float64"), p.GetDouble("rtol_float64")}
                      : Tolerance{p.GetDouble("atol"), p.GetDouble("rtol")};
    return c;
  }
  int64_t micro_batches() const { return static_cast<int64_t>(pattern.size()); }
};

std::string MicroName(int64_t step, int64_t micro, const char* which) {
  return "step" + std::to_string(step) + "/micro" + std::to_string(micro) + "/" + which;
}

// `permute_tensor` of the seed: the elements of arange(n) in an order drawn from `gen`.
std::vector<int64_t> Permutation(int64_t n, Generator& gen) {
  std::vector<int64_t> values(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) values[static_cast<size_t>(i)] = i;
  for (int64_t i = n - 1; i > 0; --i) {
    const auto j = std::min<int64_t>(i, static_cast<int64_t>(gen.uniform_double() * (i + 1)));
    std::swap(values[static_cast<size_t>(i)], values[static_cast<size_t>(j)]);
  }
  return values;
}

// Runner-owned inputs: the weights of TransformerWithSharedParams(add_bn=True) initialised
// from generator seed `seed`, in the case's dtype (int64 buffers stay int64); per rank, every
// micro-batch of every step: src [6, 2] and tgt [4, 2], each a permutation of the seed's
// arange values drawn from (seed, rank, step, micro-batch).
CaseInputs GradAccInputs(const CaseParams& params, int world) {
  const GradAccCase c = GradAccCase::Decode(params);
  nn::ManualSeed(c.seed);
  nn::TransformerWithSharedParams model(/*rank=*/0, /*add_bn=*/true, /*deterministic=*/true);
  CaseInputs inputs;
  inputs.weights = WeightsOf(model, c.dtype);
  inputs.ranks.resize(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    Generator gen(c.seed * 1000003 + 7919 * static_cast<uint64_t>(r) + 1);
    for (int64_t k = 0; k < c.steps; ++k) {
      for (int64_t i = 0; i < c.micro_batches(); ++i) {
        auto& mine = inputs.ranks[static_cast<size_t>(r)];
        mine.emplace_back(MicroName(k, i, "src"),
                          Tensor::from_int64s(Permutation(kSrcLen * kBatch, gen), {kSrcLen, kBatch}));
        mine.emplace_back(MicroName(k, i, "tgt"),
                          Tensor::from_int64s(Permutation(kTgtLen * kBatch, gen), {kTgtLen, kBatch}));
      }
    }
  }
  return inputs;
}

InputsDoc GradAccInputsDoc() {
  InputsDoc doc;
  doc.weights =
      "every key of common_fsdp.py's TransformerWithSharedParams(add_bn=True).state_dict() "
      "(embed_tokens, the nn.Transformer's 2 encoder and 2 decoder layers and norms, "
      "output_proj whose weight is tied to embed_tokens.weight, vocab_bias, long_buffer (int64), "
      "bn), floating entries in the case's dtype; the model runs in eval mode (the seed's "
      "deterministic=True)";
  doc.rank_tensors = {
      {"step{k}/micro{k}/src", "int64", "[6, 2]",
       "the rank's encoder tokens of micro-batch i of optimizer step k (a permutation of "
       "arange(12).view(6, 2))"},
      {"step{k}/micro{k}/tgt", "int64", "[4, 2]",
       "its decoder tokens and targets (a permutation of arange(8).view(4, 2))"}};
  return doc;
}

ObservationSchema GradAccSchema() {
  ObservationSchema schema;
  schema.Add(ObservationKey::Losses(
      "every micro-batch's loss, cross_entropy(output.view(-1, 23), tgt.view(-1), "
      "reduction=\"sum\"), in order over all steps"));
  schema.Add(ObservationKey::Custom(
      "micro_batch_comm_counts",
      {{"type", "array"}, {"items", ObservationKey::CommCounts("").schema}},
      "per micro-batch, the collectives of its forward and of its backward: {\"forward\": {op: "
      "n}, \"backward\": {op: n}} with CommDebugMode's op keys"));
  schema.AddTensors({"step{k}/{fqn}", "the case's dtype", "the parameter's full shape",
                     "every parameter after optimizer step k, by its clean FQN (no "
                     "_fsdp_wrapped_module.), read inside summon_full_params(writeback=False)"});
  return schema;
}

// The modules the seed wraps (FSDP1's ModuleWrapPolicy) or shards (FSDP2) before the root.
const std::set<std::string>& LayerTypes() {
  static const std::set<std::string> types = {"TransformerEncoderLayer", "TransformerDecoderLayer"};
  return types;
}

// The uneven world a default run adds: where what is sharded (FSDP2: dim 0 of every parameter;
// FSDP1: each layer's flat parameter and the root's) splits unlike a balanced split.
int GradAccUnevenWorld(bool fully_shard, int max_world) {
  auto model = std::make_shared<nn::TransformerWithSharedParams>(/*rank=*/0, /*add_bn=*/true,
                                                                 /*deterministic=*/true);
  std::vector<nn::ModulePtr> layers;
  for (const nn::ModulePtr& m : model->modules()) {
    if (LayerTypes().count(m->type_name()) != 0) layers.push_back(m);
  }
  return DiscriminatingWorld(
      fully_shard ? ParameterDim0Sizes(*model) : FlatParameterNumels(*model, layers), max_world);
}

std::shared_ptr<fsdp1::FullyShardedDataParallel> Wrap(const nn::ModulePtr& model,
                                                      const GradAccCase& c, const RankEnv& env) {
  fsdp1::FullyShardedDataParallelOptions options;
  if (fsdp1::IsHybridStrategy(c.strategy)) {
    const std::optional<HybridMeshShape> shape = HybridMeshShapeFor(env.world);
    FSDP_CHECK(shape.has_value(), "fsdp_grad_acc: world ", env.world,
               " has no (replicate, shard) mesh for a hybrid strategy");
    options.device_mesh = distributed::DeviceMesh::Init(
        env.pg, env.device.is_cuda() ? "cuda" : "cpu", {shape->replicate, shape->shard},
        {"replicate", "shard"});
  } else {
    options.process_group = env.pg;
  }
  options.sharding_strategy = c.strategy;
  options.use_orig_params = c.use_orig_params;
  options.backward_prefetch = c.prefetch;
  options.cpu_offload.offload_params = c.cpu_offload;
  options.auto_wrap_policy = std::make_shared<fsdp1::ModuleWrapPolicy>(LayerTypes());
  return std::make_shared<fsdp1::FullyShardedDataParallel>(model, options);
}

nlohmann::json RunGradAccRank(RankEnv& env) {
  const GradAccCase c = GradAccCase::Decode(env.params);
  const RankInputs& inputs = env.Inputs();
  auto model = std::make_shared<nn::TransformerWithSharedParams>(env.rank, /*add_bn=*/true,
                                                                  /*deterministic=*/true);
  model->to(c.dtype);
  model->load_state_dict(inputs.weights());
  model->to(env.device);
  // FSDP1's wrapper, or FSDP2 applied in place (every layer, then the root).
  std::shared_ptr<fsdp1::FullyShardedDataParallel> fsdp1_model;
  std::optional<fsdp2::FSDPModule> fsdp2_root;
  nn::ModulePtr fsdp_model;
  if (c.fully_shard) {
    fsdp2::FullyShardOptions options;
    options.process_group = env.pg;
    for (const nn::ModulePtr& m : model->modules()) {
      if (LayerTypes().count(m->type_name()) != 0) {
        fsdp2::fully_shard(m, options);
      }
    }
    fsdp2_root = fsdp2::fully_shard(model, options);
    fsdp_model = model;
  } else {
    fsdp1_model = Wrap(model, c, env);
    fsdp_model = fsdp1_model;
  }
  optim::SGD optimizer(fsdp_model->parameters(), optim::SGDOptions{.lr = c.lr});
  nlohmann::json obs;
  obs[kLosses] = nlohmann::json::array();
  obs["micro_batch_comm_counts"] = nlohmann::json::array();
  obs[kTensors] = nlohmann::json::object();
  for (int64_t k = 0; k < c.steps; ++k) {
    for (int64_t i = 0; i < c.micro_batches(); ++i) {
      const bool no_sync_here = c.pattern[static_cast<size_t>(i)];
      std::optional<fsdp1::NoSync> no_sync;
      if (fsdp2_root) {
        fsdp2_root->set_requires_gradient_sync(!no_sync_here);
      } else if (no_sync_here) {
        no_sync.emplace(fsdp1_model->no_sync());
      }
      const nn::Value batch = nn::Value::Tuple({inputs.Get(MicroName(k, i, "src")).to(env.device),
                                                inputs.Get(MicroName(k, i, "tgt")).to(env.device)});
      distributed::CommDebugMode forward_mode;
      Tensor out = (*fsdp_model)(batch).tensor();
      forward_mode.exit();
      Tensor loss = nn::TransformerWithSharedParams::get_loss(batch, out);
      distributed::CommDebugMode backward_mode;
      loss.backward();
      backward_mode.exit();
      obs[kLosses].push_back(loss.item());
      obs["micro_batch_comm_counts"].push_back(PhaseCommCountsJson(
          forward_mode.get_comm_counts(), backward_mode.get_comm_counts()));
    }
    optimizer.step();
    optimizer.zero_grad(SetToNoneAfterStep(k));
    const std::string prefix = "step" + std::to_string(k) + "/";
    if (fsdp2_root) {
      // FSDP2's parameters are DTensor shards: their full_tensor() (an all-gather).
      for (const auto& [name, param] : fsdp_model->named_parameters()) {
        const fsdp2::FsdpParam* fsdp_param = fsdp2::LookupFsdpParam(param);
        const Tensor full = fsdp_param != nullptr ? fsdp_param->full_tensor() : param;
        obs[kTensors][prefix + name] = TensorToJson(full.to(Device::CPU()));
      }
    } else {
      fsdp1::SummonFullParams full(fsdp1_model, {.writeback = false});
      for (const auto& [name, param] : fsdp_model->named_parameters()) {
        obs[kTensors][prefix + fsdp1::CleanTensorName(name)] = TensorToJson(param.to(Device::CPU()));
      }
    }
  }
  return obs;
}

// ---- Expectations ------------------------------------------------------------------------------

reference::IndexTensor Index(const Tensor& t) { return reference::IndexTensor(t.sizes(), t.to_int64s()); }

// One micro-batch's counts by the rules above (all-gathers under kAllGather).
nlohmann::json ExpectedCounts(fsdp1::ShardingStrategy strategy, int64_t instances, bool sync,
                              bool previous_backward_synced) {
  nlohmann::json forward = nlohmann::json::object();
  nlohmann::json backward = nlohmann::json::object();
  const bool sharded = fsdp1::UsesShardedStrategy(strategy);
  const bool reshards_after_forward = Fsdp1ReshardsAfterForwardRule(strategy);
  const bool freed = reshards_after_forward || (sharded && previous_backward_synced);
  if (freed) forward[kAllGather] = instances;
  if (reshards_after_forward) backward[kAllGather] = instances - 1;
  if (sync) {
    backward[sharded ? kReduceScatter : kAllReduce] = instances;
    // Hybrid: the reduce-scatter within the shard group, then an all-reduce of the shard across
    // the replicate group.
    if (Fsdp1HybridRule(strategy)) backward[kAllReduce] = instances;
  }
  return {{"forward", forward}, {"backward", backward}};
}

// One micro-batch's counts under fully_shard (docs/fsdp-behaviour.md, "Collective counts"):
// every group all-gathers in forward (all were resharded after the previous backward) and, but
// the root (kept after forward), again in backward; a backward with gradient sync
// reduce-scatters every group; set_requires_gradient_sync(False) reduces nothing. At world
// size 1 the all-gathers are skipped and the reduce-scatters are not (the seeds' era).
nlohmann::json ExpectedFullyShardCounts(int64_t groups, bool sync, int world) {
  nlohmann::json forward = nlohmann::json::object();
  nlohmann::json backward = nlohmann::json::object();
  if (world > 1) {
    forward[kAllGather] = groups;
    backward[kAllGather] = groups - 1;
  }
  if (sync) backward[kReduceScatter] = groups;
  return {{"forward", forward}, {"backward", backward}};
}

// The instances of the wrapped Transformer: the root plus one per encoder and decoder layer.
int64_t Instances() {
  const reference::TransformerWithSharedParamsConfig config;
  return 1 + config.num_encoder_layers + config.num_decoder_layers;
}

std::vector<nlohmann::json> ExpectGradAcc(const CaseParams& params, int world) {
  const GradAccCase c = GradAccCase::Decode(params);
  const CaseInputs inputs = GradAccInputs(params, world);
  reference::TensorMap<double> weights;
  reference::TensorMap<double> buffers;
  const reference::TransformerWithSharedParams<double> model{
      reference::TransformerWithSharedParamsConfig{}};
  std::set<std::string> param_names;
  for (const auto& spec : model.ParameterSpecs()) param_names.insert(spec.name);
  for (const auto& [key, tensor] : inputs.weights) {
    if (key == "output_proj.weight") continue;  // tied to embed_tokens.weight: one parameter
    (param_names.count(key) ? weights : buffers)[key] = ToRef(tensor);
  }
  std::vector<reference::TrainingStep<double>> plan;
  for (int64_t k = 0; k < c.steps; ++k) {
    for (int64_t i = 0; i < c.micro_batches(); ++i) {
      reference::TrainingStep<double> step;
      for (int r = 0; r < world; ++r) {
        const NamedTensors& mine = inputs.ranks[static_cast<size_t>(r)];
        reference::ModelInput<double> in;
        for (const auto& [name, t] : mine) {
          if (name == MicroName(k, i, "src")) in.tokens = Index(t);
          if (name == MicroName(k, i, "tgt")) {
            in.decoder_tokens = Index(t);
            in.targets = Index(t);
          }
        }
        step.rank_inputs.push_back(std::move(in));
      }
      step.loss = reference::CrossEntropyLoss(reference::Reduction::kSum);
      const bool last = i + 1 == c.micro_batches();
      step.optimizer_step = last;
      step.zero_grad = last;
      step.set_to_none = SetToNoneAfterStep(k);
      plan.push_back(std::move(step));
    }
  }
  reference::Sgd<double> sgd(reference::SgdOptions{.lr = c.lr});
  const auto records = reference::RunDataParallelTraining(model, weights, buffers, plan, &sgd);
  // One rank of one process runs every strategy as NO_SHARD.
  const fsdp1::ShardingStrategy effective =
      world == 1 ? fsdp1::ShardingStrategy::kNoShard : c.strategy;
  const std::string dtype = DTypeName(c.dtype);
  std::vector<nlohmann::json> expected(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    nlohmann::json& e = expected[static_cast<size_t>(r)];
    e[kLosses] = nlohmann::json::array();
    e["micro_batch_comm_counts"] = nlohmann::json::array();
    e[kTensors] = nlohmann::json::object();
    bool previous_synced = true;  // nothing is unsharded before the first forward
    for (int64_t k = 0; k < c.steps; ++k) {
      for (int64_t i = 0; i < c.micro_batches(); ++i) {
        const auto& record = records[static_cast<size_t>(k * c.micro_batches() + i)];
        e[kLosses].push_back(record.rank_losses.at(r));
        const bool sync = !c.pattern[static_cast<size_t>(i)];
        e["micro_batch_comm_counts"].push_back(
            c.fully_shard ? ExpectedFullyShardCounts(Instances(), sync, world)
                          : ExpectedCounts(effective, Instances(), sync, previous_synced));
        previous_synced = sync;
      }
      const reference::TensorMap<double>& params =
          records[static_cast<size_t>((k + 1) * c.micro_batches() - 1)].params;
      e[kTensors].update(MapToJson(params, dtype, "step" + std::to_string(k) + "/"));
    }
  }
  return expected;
}

void JudgeGradAcc(const CaseParams& params, int world, const std::vector<nlohmann::json>& per_rank,
                  CheckList& checks) {
  const GradAccCase c = GradAccCase::Decode(params);
  const std::vector<nlohmann::json> expected = ExpectGradAcc(params, world);
  ErrorStats param_err;
  for (int r = 0; r < world; ++r) {
    const std::string who = RankName(r);
    checks.CheckClose(who + " micro-batch losses vs oracle", Losses(expected, r),
                      Losses(per_rank, r), c.tolerance);
    const nlohmann::json& counts = RankObservation(per_rank, r, "micro_batch_comm_counts");
    const nlohmann::json& want = expected[static_cast<size_t>(r)]["micro_batch_comm_counts"];
    checks.CheckEqual(who + " micro-batches reported", want.size(), counts.size());
    for (size_t i = 0; i < want.size() && i < counts.size(); ++i) {
      const std::string at = who + " micro-batch " + std::to_string(i) +
                             (c.pattern[i % c.pattern.size()] ? " (no_sync)" : " (sync)");
      for (const char* phase : {"forward", "backward"}) {
        checks.CheckEqual(at + " " + phase + " comm counts", want[i][phase],
                          MergeFlatParamAllGathers(counts[i].value(phase, nlohmann::json::object())));
      }
    }
    for (int64_t k = 0; k < c.steps; ++k) {
      const std::string prefix = "step" + std::to_string(k) + "/";
      param_err.Merge(CheckMapsClose(checks, who + " parameters after step " + std::to_string(k),
                                     MapFromObservations(expected, r, prefix),
                                     MapFromObservations(per_rank, r, prefix), c.tolerance));
    }
  }
  checks.SetFigure("micro_batches", c.steps * c.micro_batches());
  checks.SetFigure("param_max_abs_err", param_err.max_abs);
  checks.SetFigure("param_max_rel_err", param_err.max_rel);
}

std::vector<ParamSpec> SizeParams() {
  return {
      ParamSpec::SizeInt("steps", "optimizer steps, each over every config's micro-batches", 2,
                         /*minimum=*/1),
      ParamSpec::SizeInt("seed", "seed of the weights and of the micro-batch permutations", 0),
      ParamSpec::SizeDouble("lr", "SGD learning rate (no momentum; the losses decrease)", 0.002),
      ParamSpec::SizeString("dtype", "parameter dtype: float32 or float64", "float64"),
      ParamSpec::SizeDouble("atol", "absolute tolerance for float32", 1e-5),
      ParamSpec::SizeDouble("rtol", "relative tolerance for float32", 1e-4),
      ParamSpec::SizeDouble("atol_float64", "absolute tolerance for float64", 1e-10),
      ParamSpec::SizeDouble("rtol_float64", "relative tolerance for float64", 1e-8)};
}

// `api` "FullyShardedDataParallel" (with its option axes) or "fully_shard".
std::vector<ParamSpec> CommonParams(const std::string& api, bool cpu_offload,
                                    std::vector<std::string> configs) {
  std::vector<ParamSpec> params = {
      ConfigsAxis(std::move(configs)),
      ParamSpec::SizeString("api", "FullyShardedDataParallel (FSDP1) or fully_shard (FSDP2)", api)};
  if (api != "fully_shard") {
    params.push_back(UseOrigParamsAxis());
    params.push_back(BackwardPrefetchAxis());
    params.push_back(AllShardingStrategiesAxis());
    params.push_back(
        ParamSpec::SizeBool("cpu_offload", "CPUOffload(offload_params=...)", cpu_offload));
  }
  for (ParamSpec& p : SizeParams()) params.push_back(std::move(p));
  return params;
}

Scenario MakeGradAcc(const std::string& test, const std::string& seed_test,
                     const std::string& description, const std::string& api, bool cpu_offload,
                     std::vector<std::string> configs) {
  Scenario s;
  s.info.name = "fsdp_grad_acc/" + test;
  s.info.description = description;
  s.info.seed_test = std::string(kSeed004) + seed_test;
  s.info.params = CommonParams(api, cpu_offload, std::move(configs));
  s.info.observations = GradAccSchema();
  s.info.deterministic = true;
  s.info.inputs = GradAccInputsDoc();
  s.info.default_world = 2;
  s.info.min_world = 1;
  s.info.max_world = 8;
  s.info.requirements.devices = {DeviceType::kCPU};
  if (api == "fully_shard") {
    s.info.test_runs = {{3, {}}, {4, {}}};
  } else {
    // World 4 runs the hybrid strategies on a 2 x 2 (replicate, shard) mesh.
    s.skip = [](const CaseParams& p, int world) -> std::optional<std::string> {
      const std::string strategy = p.GetString("sharding_strategy");
      if (fsdp1::IsHybridStrategy(ParseShardingStrategy(strategy)) &&
          !HybridMeshShapeFor(world).has_value()) {
        return strategy + " needs a (replicate, shard) mesh with both dimensions >= 2; world " +
               std::to_string(world) + " has none";
      }
      return std::nullopt;
    };
    s.info.test_runs = {{3, {{"use_orig_params", "True"}, {"backward_prefetch", "BACKWARD_PRE"}}},
                        {4, {{"use_orig_params", "False"}, {"backward_prefetch", "None"}}}};
  }
  if (const int uneven = GradAccUnevenWorld(api == "fully_shard", s.info.max_world)) {
    // The prefetch axis plays no part in the sharding.
    s.info.extra_default_runs = {
        {uneven, api == "fully_shard"
                     ? std::map<std::string, std::string>{}
                     : std::map<std::string, std::string>{{"backward_prefetch", "BACKWARD_PRE"}}}};
  }
  s.inputs = GradAccInputs;
  s.run_rank = RunGradAccRank;
  s.expect = ExpectGradAcc;
  s.judge = JudgeGradAcc;
  return s;
}

}  // namespace

void RegisterFsdpGradAccScenarios(ScenarioRegistry& registry) {
  const std::vector<std::string> seed_configs = {"no_sync:3+sync:3+no_sync:3",
                                                 "sync:3+no_sync:3+sync:3"};
  registry.Add(MakeGradAcc(
      "grad_acc", "test_grad_acc",
      "TransformerWithSharedParams under FSDP1: micro-batches inside and outside no_sync(), "
      "then SGD; losses, per-micro-batch collective counts and parameters vs the oracle",
      "FullyShardedDataParallel", /*cpu_offload=*/false, seed_configs));
  registry.Add(MakeGradAcc(
      "grad_acc_cpu_offload", "test_grad_acc_cpu_offload",
      "the same with CPUOffload(offload_params=True), micro-batches inside no_sync()",
      "FullyShardedDataParallel", /*cpu_offload=*/true, {"no_sync:3"}));
  registry.Add(MakeGradAcc(
      "grad_acc_fully_shard", "test_grad_acc (the same accumulation through FSDP2)",
      "the same accumulation with fully_shard and set_requires_gradient_sync(False) for the "
      "no_sync micro-batches, against the same oracle",
      "fully_shard", /*cpu_offload=*/false, seed_configs));
}

}  // namespace fsdp::conformance
