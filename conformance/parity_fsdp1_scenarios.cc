// Family `parity/fsdp1`: FSDP1 (`FullyShardedDataParallel`) training of the seed families'
// models (Transformer, MLP, DoubleLinear) on `world` ranks against the oracle's data-parallel
// run, under every sharding_strategy x backward_prefetch x use_orig_params x cpu_offload x
// mixed_precision. The hybrid strategies run on the (replicate, shard) mesh of
// HybridMeshShapeFor(world) (2 x 2 at world 4, an extra ctest run); a world without one skips
// them. Mixed precision is judged within MixedPrecisionRtol of the oracle (SGD only).
//
// Each rank loads the case's runner-owned weights, wraps the model with FSDP1, nesting an
// instance around the same submodules FSDP2's parity family shards (ChildrenToShard: the
// Transformer's blocks, MLP's in_proj/out_proj, DoubleLinear's lin1/lin2; a LambdaAutoWrapPolicy
// picks exactly those), and trains `steps` steps on its slice of every global batch
// (TrainEngine). It reports its losses and, after every optimizer step, the full parameters by
// clean FQN (summon_full_params(writeback=False)); the judge compares them with the oracle's
// data-parallel run (ExpectFsdp1Parity). Gradients are judged through the parameters they move.
// With sync_module_states, ranks other than 0 zero their parameters before wrapping, so the run
// matches the oracle only if FSDP broadcasts rank 0's (over both groups of a hybrid strategy).
// With mixed_strategy (test_fsdp_clip_grad_norm.py) the first nested instance uses NO_SHARD:
// clip_grad_norm_ must count its gradients once, not once per rank. Under use_orig_params each
// rank also reports its original parameters' numels after wrapping, judged against the
// flat-parameter layout rule (ExpectedLocalNumels); then, after training, it sets one gradient to
// None and runs a forward under no_grad (test_fsdp_fine_tune.py's evaluation forward), reporting
// the numels (the sharded views whatever the strategy) and whether that gradient stayed None
// (_is_grad_none_mask), and, after one more forward with gradients enabled, the numels
// named_parameters() lists before its backward (the whole unsharded views where SHARD_GRAD_OP /
// _HYBRID_SHARD_ZERO2 keep them until backward) and whether that gradient is back after it. Every
// rank
// also reports the dtypes of its gradients before every optimizer step (the parameters' dtype:
// keep_low_precision_grads is off) and of the reduce-scatters and all-reduces its backwards
// issue (FSDP1's reduce dtype, Fsdp1ReduceDType; an extra default run sets param_dtype alone).
//
// A flat parameter that gets no gradient in a backward (DoubleLinear's lin2 once the loss is
// out1.sum()) behaves unlike a plain model's parameters, and the oracle models it
// (reference::Fsdp1FlatParam): where the unsharded flat parameter outlives forward
// (SHARD_GRAD_OP, _HYBRID_SHARD_ZERO2) the full parameters read afterwards are that kept copy,
// not what the optimizer made of the shard (a zeroed gradient still moves it with momentum);
// under CPUOffload the optimizer keeps stepping it with the CPU buffer's stale gradient
// (prepare_gradient_for_optim).
#include <algorithm>
#include <cmath>
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
#include "conformance/sharded_parity.h"
#include "engine/autograd/grad_mode.h"
#include "engine/distributed/comm_debug_mode.h"
#include "engine/distributed/device_mesh.h"
#include "engine/fsdp1/fully_sharded_data_parallel.h"
#include "engine/fsdp1/unshard_params.h"

namespace fsdp::conformance {

namespace {

constexpr const char* kFamily = "parity/fsdp1";

// A "clip_grad_norm" value: "none" (nullopt inside), or "MAX_NORM:NORM_TYPE" (e.g. "0.5:2",
// "1:inf"; max_norm > 0 and finite, norm_type >= 1 or inf). nullopt when malformed.
std::optional<std::optional<reference::GradClip>> ParseGradClip(const std::string& v) {
  if (v == "none") return std::optional<reference::GradClip>();
  const size_t colon = v.find(':');
  if (colon == std::string::npos) return std::nullopt;
  // A finite number spelling all of `text`, or nullopt.
  auto number = [](const std::string& text) -> std::optional<double> {
    try {
      size_t used = 0;
      const double d = std::stod(text, &used);
      if (used != text.size() || std::isinf(d)) return std::nullopt;
      return d;
    } catch (const std::exception&) {
      return std::nullopt;
    }
  };
  const std::optional<double> max_norm = number(v.substr(0, colon));
  const std::string type = v.substr(colon + 1);
  const std::optional<double> norm_type = type == "inf" ? INFINITY : number(type);
  if (!max_norm || !(*max_norm > 0) || !norm_type || !(*norm_type >= 1)) return std::nullopt;
  return std::optional<reference::GradClip>(reference::GradClip{*max_norm, *norm_type});
}

// The "clip_grad_norm" parameter: the root's clip_grad_norm_(max_norm, norm_type) after every
// backward, or none.
ParamSpec ClipGradNormParam() {
  ParamSpec p = ParamSpec::SizeString(
      "clip_grad_norm",
      "none, or MAX_NORM:NORM_TYPE: the root's clip_grad_norm_(max_norm, norm_type) between "
      "backward and the optimizer step (norm_type a number >= 1 or inf)",
      "none");
  p.domain = ParamDomain{"none or MAX_NORM:NORM_TYPE (max_norm > 0, norm_type >= 1 or inf)",
                         [](const std::string& v) -> std::optional<std::string> {
                           if (!ParseGradClip(v)) return std::nullopt;
                           return v;
                         }};
  return p;
}

// The case's clip_grad_norm_ arguments, or none (the value passed the parameter's domain).
std::optional<reference::GradClip> ClipOf(const CaseParams& params) {
  return ParseGradClip(params.GetString("clip_grad_norm")).value();
}

// mixed_strategy (test_fsdp_clip_grad_norm.py's "mixed_strategy"): the first nested instance
// uses NO_SHARD, the others and the root the case's sharding_strategy.
std::optional<fsdp1::ShardingStrategy> FirstChildStrategy(const CaseParams& params) {
  if (!params.GetBool("mixed_strategy")) return std::nullopt;
  return fsdp1::ShardingStrategy::kNoShard;
}

// Whether unit `index` of Fsdp1FlatParamsOf (the nested instances first, then the root's) is
// sharded over a shard group of `shard_world` ranks under `strategy`: not the mixed_strategy's
// NO_SHARD first child.
bool UnitSharded(const CaseParams& params, fsdp1::ShardingStrategy strategy, int shard_world,
                 const Fsdp1FlatParamFqns& unit, size_t index) {
  if (FirstChildStrategy(params) && index == 0 && !unit.root) return false;
  return shard_world > 1 && fsdp1::UsesShardedStrategy(strategy);
}

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

// Sets the .grad of the first parameter with a non-empty local gradient to None, taking one
// whose module has another parameter with a non-empty local gradient (so of the same flat
// parameter, which keeps a gradient: were all of a flat parameter's gradients None,
// _reset_flat_param_grad_info_if_needed would free its gradient, and under CPU offload the next
// forward's gradient views would come from _cpu_grad with every mask entry cleared, in PyTorch
// as here). Returns that parameter, or nullopt when there is none.
std::optional<Tensor> SetOneGradToNone(nn::Module& module) {
  const std::vector<nn::NamedTensor> params = module.named_parameters();
  auto has_local_grad = [](const Tensor& p) { return p.numel() > 0 && p.grad().defined(); };
  auto module_of = [](const std::string& fqn) {
    const size_t dot = fqn.rfind('.');
    return dot == std::string::npos ? std::string() : fqn.substr(0, dot);
  };
  for (size_t i = 0; i < params.size(); ++i) {
    if (!has_local_grad(params[i].second)) continue;
    for (size_t j = 0; j < params.size(); ++j) {
      if (j != i && has_local_grad(params[j].second) &&
          module_of(params[j].first) == module_of(params[i].first)) {
        params[i].second.set_grad(Tensor());
        return params[i].second;
      }
    }
  }
  return std::nullopt;
}

nlohmann::json RunFsdp1ParityRank(const std::string& kind, RankEnv& env) {
  const ParityCase c = DecodeParityCase(kind, env.params);
  nn::ModulePtr module = c.model.BuildEngineFromInputs(env.Inputs(), c.dtype);
  module->to(env.device);
  const bool sync_module_states = env.params.GetBool("sync_module_states");
  if (sync_module_states && env.rank != 0) {
    // Only rank 0 holds the weights (test_fsdp_misc.py's sync_module_states tests zero the
    // other ranks' parameters): FSDP must broadcast them before sharding.
    autograd::NoGradGuard no_grad;
    for (Tensor p : module->parameters()) p.zero_();
  }
  fsdp1::FullyShardedDataParallelOptions options;
  options.sharding_strategy = ParseShardingStrategy(env.params.GetString("sharding_strategy"));
  if (fsdp1::IsHybridStrategy(options.sharding_strategy)) {
    const std::optional<HybridMeshShape> shape = HybridMeshShapeFor(env.world);
    FSDP_CHECK(shape.has_value(), "parity/fsdp1: world ", env.world,
               " has no (replicate, shard) mesh for a hybrid strategy");
    options.device_mesh = distributed::DeviceMesh::Init(
        env.pg, env.device.is_cuda() ? "cuda" : "cpu", {shape->replicate, shape->shard},
        {"replicate", "shard"});
  } else {
    options.process_group = env.pg;
  }
  options.mixed_precision = ParseMixedPrecision(env.params.GetString("mixed_precision"));
  options.backward_prefetch = ParseBackwardPrefetch(env.params.GetString("backward_prefetch"));
  options.use_orig_params = env.params.GetBool("use_orig_params");
  options.cpu_offload.offload_params = env.params.GetBool("cpu_offload");
  options.sync_module_states = sync_module_states;
  auto fsdp_model = WrapChildrenThenRoot(module, options, FirstChildStrategy(env.params));
  // use_orig_params: the original parameters are views into this rank's flat shard.
  nlohmann::json local_numels = nlohmann::json::object();
  if (options.use_orig_params) {
    for (const auto& [name, param] : fsdp_model->named_parameters()) {
      local_numels[fsdp1::CleanTensorName(name)] = param.numel();
    }
  }
  const std::optional<reference::GradClip> clip = ClipOf(env.params);
  std::vector<double> grad_norms;
  std::vector<std::string> grad_norm_dtypes;
  std::set<std::string> grad_dtypes;
  // use_orig_params: the numels named_parameters() lists between the last backward and its
  // optimizer step (the sharded views: every flat parameter resharded by its post-backward or by
  // _catch_all_reshard, which must also reshard one whose forward skipped the sharded views).
  nlohmann::json numels_before_step = nlohmann::json::object();
  const std::function<void()> before_step = [&] {
    if (options.use_orig_params) {
      for (const auto& [name, param] : fsdp_model->named_parameters()) {
        numels_before_step[fsdp1::CleanTensorName(name)] = param.numel();
      }
    }
    for (const Tensor& p : fsdp_model->parameters()) {
      if (p.grad().defined()) grad_dtypes.insert(DTypeName(p.grad().dtype()));
    }
    if (clip) {
      const Tensor total_norm = fsdp_model->clip_grad_norm_(clip->max_norm, clip->norm_type);
      grad_norms.push_back(total_norm.item());
      grad_norm_dtypes.push_back(DTypeName(total_norm.dtype()));
    }
  };
  distributed::CommDebugMode comm_mode;
  const EngineTrainingRecord record = TrainEngine(c.model, *fsdp_model, c.optim, env.Inputs(),
                                                  c.steps, FullParameters, {}, before_step);
  comm_mode.exit();
  std::set<std::string> reduce_dtypes;
  for (const distributed::CommRecord& comm : comm_mode.records()) {
    const bool reduces = comm.op.find("reduce_scatter") != std::string::npos ||
                         comm.op.find("allreduce") != std::string::npos;
    if (reduces && comm.phase == distributed::CommPhase::kBackward) {
      reduce_dtypes.insert(DTypeName(comm.info.dtype));
    }
  }
  nlohmann::json obs = TrainingObservations(record, c.dtype);
  obs["grad_norms"] = grad_norms;
  obs["grad_norm_dtypes"] = grad_norm_dtypes;
  obs["local_numels"] = std::move(local_numels);
  obs["numels_before_step"] = std::move(numels_before_step);
  obs["grad_dtypes"] = grad_dtypes;
  obs["reduce_dtypes"] = reduce_dtypes;
  // use_orig_params: the user sets one gradient to None (SetOneGradToNone), then a forward under
  // no_grad (test_fsdp_fine_tune.py's evaluation forward between training steps), reporting the
  // original parameters' numels and whether that gradient stayed None (the flat parameter's
  // _is_grad_none_mask); then one more forward (of step 0's input) with gradients enabled, the
  // original parameters' numels before its backward, and, after it, whether that parameter has a
  // gradient again (the post-backward clears its _is_grad_none_mask entry: _reset_is_grad_none).
  nlohmann::json numels_after_no_grad_forward = nlohmann::json::object();
  nlohmann::json numels_after_forward = nlohmann::json::object();
  bool user_none_grad_kept = true;
  bool user_none_grad_restored = true;
  if (options.use_orig_params) {
    std::optional<Tensor> none_grad_param = SetOneGradToNone(*fsdp_model);
    {
      autograd::NoGradGuard no_grad;
      c.model.Forward(*fsdp_model, env.Inputs().Get(StepInputName(0)).to(env.device));
    }
    for (const auto& [name, param] : fsdp_model->named_parameters()) {
      numels_after_no_grad_forward[fsdp1::CleanTensorName(name)] = param.numel();
    }
    user_none_grad_kept = !none_grad_param || !none_grad_param->grad().defined();
    Tensor loss = ZooModel::Loss(
        c.model.Forward(*fsdp_model, env.Inputs().Get(StepInputName(0)).to(env.device)),
        c.model.LossAt(0));
    for (const auto& [name, param] : fsdp_model->named_parameters()) {
      numels_after_forward[fsdp1::CleanTensorName(name)] = param.numel();
    }
    loss.backward();
    user_none_grad_restored = !none_grad_param || none_grad_param->grad().defined();
  }
  obs["numels_after_no_grad_forward"] = std::move(numels_after_no_grad_forward);
  obs["user_none_grad_kept"] = user_none_grad_kept;
  obs["user_none_grad_restored"] = user_none_grad_restored;
  obs["numels_after_forward"] = std::move(numels_after_forward);
  return obs;
}

// The size of the group the flat parameters are sharded over: the mesh's shard dimension for a
// hybrid strategy, else the world.
int ShardWorld(fsdp1::ShardingStrategy strategy, int world) {
  if (!fsdp1::IsHybridStrategy(strategy)) return world;
  const std::optional<HybridMeshShape> shape = HybridMeshShapeFor(world);
  return shape ? static_cast<int>(shape->shard) : world;
}

// RunFsdp1ParityRank's flat parameters, for the oracle: one per nested
// instance (the parameters under that child's FQN) and the root's (the rest), each keeping its
// unsharded flat parameter after forward when its effective strategy does not free it there
// (a sharded strategy on a shard group of more than one rank that does not reshard after
// forward, or the root, which never frees after forward; but not where use_orig_params skipped
// the sharded views, which _catch_all_reshard frees), read by summon_full_params from the
// full-precision shard under parameter mixed precision, and given the buffer as gradient after
// every backward (with CPU offload) unless use_orig_params skipped the gradient views in
// forward.
std::vector<reference::Fsdp1FlatParam> Fsdp1FlatParams(const ParityCase& c,
                                                        const CaseParams& params, int world) {
  const bool offload_params = params.GetBool("cpu_offload");
  const fsdp1::ShardingStrategy strategy =
      ParseShardingStrategy(params.GetString("sharding_strategy"));
  const bool full_precision_summon =
      ParseMixedPrecision(params.GetString("mixed_precision")).param_dtype.has_value();
  std::vector<reference::Fsdp1FlatParam> out;
  const std::vector<Fsdp1FlatParamFqns> units = Fsdp1FlatParamsOf(c.model);
  for (size_t i = 0; i < units.size(); ++i) {
    const Fsdp1FlatParamFqns& unit = units[i];
    const bool sharded = UnitSharded(params, strategy, ShardWorld(strategy, world), unit, i);
    // use_orig_params under a strategy that keeps the parameters after forward: the
    // post-forward reshard skips the sharded views (and the gradient views), and
    // _catch_all_reshard then frees the unsharded flat parameter after all.
    const bool skips_views =
        params.GetBool("use_orig_params") && sharded && !fsdp1::ReshardsAfterForward(strategy);
    reference::Fsdp1FlatParam flat;
    flat.params = unit.fqns;
    flat.keeps_unsharded_after_forward =
        sharded && (unit.root || !fsdp1::ReshardsAfterForward(strategy)) && !skips_views;
    flat.full_precision_summon = full_precision_summon;
    flat.offload_params = offload_params;
    flat.grad_every_backward = !skips_views;
    out.push_back(std::move(flat));
  }
  return out;
}

// The dtype forward and backward compute in: MixedPrecision's param_dtype, else the case's.
DType ComputeDType(const ParityCase& c, const CaseParams& params) {
  return ParseMixedPrecision(params.GetString("mixed_precision")).param_dtype.value_or(c.dtype);
}

// Under use_orig_params, every original parameter's numel on `rank` after wrapping: the part of
// its flat parameter's shard it covers (_flat_param.py's _init_flat_param_and_metadata: each
// parameter starts after padding to a multiple of 16 bytes of the forward/backward dtype, the
// total is padded to a multiple of the shard group's size, and the shard group's rank r holds
// [r * c, (r + 1) * c) of it, c the total over the group size); its whole numel where nothing
// is sharded. Empty without use_orig_params (the module exposes the flat parameters).
// `after_forward`: the numels after a forward, before its backward, where a sharded
// SHARD_GRAD_OP / _HYBRID_SHARD_ZERO2 instance that ran forward lists its whole unsharded views.
nlohmann::json ExpectedLocalNumels(const ParityCase& c, const CaseParams& params, int world,
                                   int rank, bool after_forward) {
  nlohmann::json out = nlohmann::json::object();
  if (!params.GetBool("use_orig_params")) return out;
  const fsdp1::ShardingStrategy strategy =
      ParseShardingStrategy(params.GetString("sharding_strategy"));
  const int shard_world = ShardWorld(strategy, world);
  // DoubleLinear(use_second_linear=False) never calls lin2: its instance keeps the sharded views.
  const bool lin2_unused = params.has("use_second_linear") && !params.GetBool("use_second_linear");
  const std::vector<Fsdp1FlatParamFqns> units = Fsdp1FlatParamsOf(c.model);
  for (size_t u = 0; u < units.size(); ++u) {
    const Fsdp1FlatParamFqns& unit = units[u];
    const bool sharded = UnitSharded(params, strategy, shard_world, unit, u);
    // After a forward (grad enabled), a sharded strategy that keeps the unsharded flat
    // parameter skips the sharded views (_use_sharded_flat_param): until backward, the original
    // parameters listed are the unsharded views the forward set (`module._parameters[name] =
    // view`).
    const bool skips_views = after_forward && sharded && !fsdp1::ReshardsAfterForward(strategy);
    const int64_t unit_world = sharded ? shard_world : 1;
    const int64_t shard_rank = rank % unit_world;  // the (replicate, shard) mesh is row-major
    const bool runs_forward = !(lin2_unused && unit.fqns.front().rfind("lin2.", 0) == 0);
    const FlatParamLayout layout =
        LayOutFlatParam(c.model, unit.fqns, ComputeDType(c, params), unit_world);
    for (size_t i = 0; i < layout.fqns.size(); ++i) {
      const auto [begin, end] = layout.ParamRangeOnRank(i, shard_rank);
      out[layout.fqns[i]] =
          sharded && !(skips_views && runs_forward) ? end - begin : layout.numels[i];
    }
  }
  return out;
}

// The relative error mixed precision adds to what the oracle computes in double. With
// param_dtype of unit roundoff u = finfo(param_dtype).eps / 2, every parameter is rounded to it
// and every value forward and backward compute carries rounding errors of about u per
// operation, which accumulate like a random walk over the model's N parameters: u * sqrt(N).
// With reduce_dtype only, a gradient is rounded when cast for the reduction and once per
// summation stage of the reduction tree: u * (1 + ceil(log2(world))). 0 without mixed precision.
double MixedPrecisionRtol(const ParityCase& c, const CaseParams& params, int world) {
  const fsdp1::MixedPrecision mp = ParseMixedPrecision(params.GetString("mixed_precision"));
  if (mp.param_dtype) {
    int64_t num_params = 0;
    for (const reference::TensorSpec& spec : c.model.oracle().ParameterSpecs()) {
      int64_t numel = 1;
      for (int64_t d : spec.shape) numel *= d;
      num_params += numel;
    }
    return FinfoEps(*mp.param_dtype) / 2 * std::sqrt(static_cast<double>(num_params));
  }
  if (mp.reduce_dtype) {
    return FinfoEps(*mp.reduce_dtype) / 2 * (1 + std::ceil(std::log2(std::max(world, 1))));
  }
  return 0;
}

std::vector<reference::StepRecord<double>> Fsdp1Oracle(const ParityCase& c,
                                                       const CaseParams& params, int world) {
  return TrainOracle(c.model, c.optim, c.seed, c.steps, c.dtype, world,
                     Fsdp1FlatParams(c, params, world), ClipOf(params));
}

std::vector<nlohmann::json> ExpectFsdp1Parity(const std::string& kind, const CaseParams& params,
                                              int world) {
  const ParityCase c = DecodeParityCase(kind, params);
  const auto oracle = Fsdp1Oracle(c, params, world);
  const bool clipped = ClipOf(params).has_value();
  std::vector<nlohmann::json> expected(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    nlohmann::json& e = expected[static_cast<size_t>(r)];
    e[kLosses] = nlohmann::json::array();
    e["loss_dtype"] = DTypeName(ZooModel::Kind(kind).LossDType(ComputeDType(c, params)));
    e[kTensors] = nlohmann::json::object();
    e["grad_norms"] = nlohmann::json::array();
    e["grad_norm_dtypes"] = nlohmann::json::array();
    e["local_numels"] = ExpectedLocalNumels(c, params, world, r, /*after_forward=*/false);
    e["numels_after_forward"] = ExpectedLocalNumels(c, params, world, r, /*after_forward=*/true);
    e["numels_before_step"] = ExpectedLocalNumels(c, params, world, r, /*after_forward=*/false);
    // A forward under no_grad ends with the sharded views whatever the strategy
    // (_use_sharded_flat_param skips them only with gradients enabled).
    e["numels_after_no_grad_forward"] =
        ExpectedLocalNumels(c, params, world, r, /*after_forward=*/false);
    // The next forward's gradient views leave a gradient the user set to None None
    // (_writeback_orig_params marks it in _is_grad_none_mask; _use_sharded_grad_views reads it).
    e["user_none_grad_kept"] = true;
    // A backward gives every parameter that requires gradient one again (_reset_is_grad_none).
    e["user_none_grad_restored"] = true;
    // Gradients reach the optimizer in the parameters' dtype, or with keep_low_precision_grads
    // in param_dtype (_prepare_gradient_for_optim's cast_grad_to_param_dtype_if_needed; NO_SHARD
    // skips the cast back after its all-reduce), after reductions in FSDP1's reduce dtype.
    const fsdp1::MixedPrecision mp = ParseMixedPrecision(params.GetString("mixed_precision"));
    const std::string grad_dtype =
        DTypeName(mp.keep_low_precision_grads ? mp.param_dtype.value_or(c.dtype) : c.dtype);
    e["grad_dtypes"] = {grad_dtype};
    e["reduce_dtypes"] = {DTypeName(Fsdp1ReduceDType(mp, c.dtype))};
    for (int64_t k = 0; k < c.steps; ++k) {
      const auto& step = oracle[static_cast<size_t>(k)];
      if (clipped) {
        e["grad_norms"].push_back(step.grad_norm);
        // Returned in the gradients' promoted dtype (computed in float32): bfloat16 under
        // keep_low_precision_grads.
        e["grad_norm_dtypes"].push_back(grad_dtype);
      }
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
  // Mixed precision (MixedPrecisionRtol): the parameters after step k within mp_rtol of every
  // update the oracle made up to it (the largest element's change per step, summed: the drift
  // bound); the loss of step k within mp_rtol of itself plus, to first order, what the drift
  // entering step k can move it: the L1 norm of the oracle's gradient of that rank's loss times
  // that drift.
  const double mp_rtol = MixedPrecisionRtol(c, params, world);
  std::vector<double> drift(static_cast<size_t>(c.steps), 0.0);  // after step k
  std::vector<reference::StepRecord<double>> oracle;
  if (mp_rtol > 0) {
    oracle = Fsdp1Oracle(c, params, world);
    reference::RefTensorMap previous = c.model.MakeParameters(c.seed, c.dtype);
    double total = 0;
    for (int64_t k = 0; k < c.steps; ++k) {
      const reference::RefTensorMap& current = oracle[static_cast<size_t>(k)].params;
      double largest_update = 0;
      for (const auto& [name, value] : current) {
        const reference::RefTensor& before = previous.at(name);
        for (size_t i = 0; i < value.data.size(); ++i) {
          largest_update = std::max(largest_update, std::fabs(value.data[i] - before.data[i]));
        }
      }
      total += mp_rtol * largest_update;
      drift[static_cast<size_t>(k)] = total;
      previous = current;
    }
  }
  ErrorStats param_err;
  for (int r = 0; r < world; ++r) {
    const std::string who = RankName(r);
    if (mp_rtol > 0) {
      const nlohmann::json& loss_dtype = RankObservation(expected, r, "loss_dtype");
      checks.CheckEqual(who + " loss dtype", loss_dtype,
                        RankObservation(per_rank, r, "loss_dtype"));
      const std::vector<double> want = Losses(expected, r);
      const std::vector<double> got = Losses(per_rank, r);
      for (size_t k = 0; k < want.size() && k < got.size(); ++k) {
        double grad_l1 = 0;
        for (const auto& [name, g] : oracle[k].rank_grads.at(static_cast<size_t>(r))) {
          for (double v : g.data) grad_l1 += std::fabs(v);
        }
        const double entering_drift = k == 0 ? 0.0 : drift[k - 1];
        checks.CheckClose(who + " loss at step " + std::to_string(k) + " vs oracle", std::vector<double>{want[k]},
                          std::vector<double>{got[k]},
                          Tolerance{tol.atol + grad_l1 * entering_drift, tol.rtol + mp_rtol});
      }
      checks.CheckEqual(who + " losses reported", want.size(), got.size());
    } else {
      CheckRankLosses(checks, c, expected, per_rank, r);
    }
    checks.CheckEqual(who + " use_orig_params parameter numels (flat-parameter layout)",
                      RankObservation(expected, r, "local_numels"),
                      RankObservation(per_rank, r, "local_numels"));
    checks.CheckEqual(who + " use_orig_params parameter numels before the last optimizer step",
                      RankObservation(expected, r, "numels_before_step"),
                      RankObservation(per_rank, r, "numels_before_step"));
    checks.CheckEqual(who + " use_orig_params parameter numels after a no_grad forward",
                      RankObservation(expected, r, "numels_after_no_grad_forward"),
                      RankObservation(per_rank, r, "numels_after_no_grad_forward"));
    checks.CheckEqual(who + " use_orig_params: a gradient set to None stays None through a forward",
                      RankObservation(expected, r, "user_none_grad_kept"),
                      RankObservation(per_rank, r, "user_none_grad_kept"));
    checks.CheckEqual(who + " use_orig_params: that gradient back after the next backward",
                      RankObservation(expected, r, "user_none_grad_restored"),
                      RankObservation(per_rank, r, "user_none_grad_restored"));
    checks.CheckEqual(who + " use_orig_params parameter numels after forward",
                      RankObservation(expected, r, "numels_after_forward"),
                      RankObservation(per_rank, r, "numels_after_forward"));
    checks.CheckEqual(who + " gradient dtypes before the optimizer step",
                      RankObservation(expected, r, "grad_dtypes"),
                      RankObservation(per_rank, r, "grad_dtypes"));
    checks.CheckEqual(who + " dtypes of the backward's reduce-scatters and all-reduces",
                      RankObservation(expected, r, "reduce_dtypes"),
                      RankObservation(per_rank, r, "reduce_dtypes"));
    checks.CheckEqual(who + " clip_grad_norm_ total norm dtypes (the gradients' promoted dtype)",
                      RankObservation(expected, r, "grad_norm_dtypes"),
                      RankObservation(per_rank, r, "grad_norm_dtypes"));
    // clip_grad_norm_'s total norm: a sum over every gradient element, computed in the
    // gradients' dtype (plus mixed precision's error).
    checks.CheckClose(
        who + " clip_grad_norm_ total norms vs oracle", RankObservation(expected, r, "grad_norms"),
        RankObservation(per_rank, r, "grad_norms"), Tolerance{tol.atol, tol.rtol + mp_rtol});
    for (int64_t k = 0; k < c.steps; ++k) {
      param_err.Merge(CheckMapsClose(checks, who + " parameters after step " + std::to_string(k),
                                     MapFromObservations(expected, r, StepPrefix(k)),
                                     MapFromObservations(per_rank, r, StepPrefix(k)),
                                     Tolerance{tol.atol + drift[static_cast<size_t>(k)], tol.rtol}));
    }
  }
  checks.SetFigure("mixed_precision_rtol", mp_rtol);
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
  s.info.params.push_back(AllShardingStrategiesAxis());
  s.info.params.push_back(BackwardPrefetchAxis());
  s.info.params.push_back(UseOrigParamsAxis());
  s.info.params.push_back(
      ParamSpec::Axis("cpu_offload", "CPUOffload(offload_params=...)", {"False", "True"}));
  s.info.params.push_back(MixedPrecisionAxis());
  s.info.params.push_back(ClipGradNormParam());
  s.info.params.push_back(ParamSpec::SizeBool(
      "sync_module_states",
      "FullyShardedDataParallel sync_module_states; ranks other than 0 start from zeroed "
      "parameters, so training matches the oracle only if every rank gets rank 0's weights",
      false));
  s.info.params.push_back(ParamSpec::SizeBool(
      "mixed_strategy",
      "test_fsdp_clip_grad_norm.py's mixed_strategy: the first nested instance uses NO_SHARD, "
      "the other nested instances and the root the case's sharding_strategy (not a hybrid one)",
      false));
  s.info.observations = TrainingSchema(
      "the full parameter, read inside summon_full_params(writeback=False), by its clean FQN "
      "(no _fsdp_wrapped_module.)",
      /*with_grads=*/false);
  s.info.observations.Add(ObservationKey::NumberList(
      "grad_norms",
      "the total norm clip_grad_norm_ returned at every step (empty without "
      "clip_grad_norm)"));
  s.info.observations.Add(ObservationKey::StringList(
      "grad_norm_dtypes",
      "the dtype of the total-norm tensor clip_grad_norm_ returned at every step (empty without "
      "clip_grad_norm)"));
  s.info.observations.Add(ObservationKey::IntegerMap(
      "local_numels",
      "use_orig_params: every original parameter's numel after wrapping (its part of the rank's "
      "flat shard), by clean FQN; empty without use_orig_params"));
  s.info.observations.Add(ObservationKey::IntegerMap(
      "numels_before_step",
      "use_orig_params: the numel of every parameter named_parameters() lists between the last "
      "step's backward and its optimizer step, by clean FQN; empty without use_orig_params"));
  s.info.observations.Add(ObservationKey::IntegerMap(
      "numels_after_no_grad_forward",
      "use_orig_params: after training, one forward under no_grad (step 0's input), then the "
      "numel of every parameter named_parameters() lists, by clean FQN; empty without "
      "use_orig_params"));
  s.info.observations.Add(ObservationKey::Boolean(
      "user_none_grad_kept",
      "use_orig_params: after training the rank sets the first parameter with a non-empty "
      "gradient's .grad to None before the no_grad forward; whether it is still None after it "
      "(true without use_orig_params)"));
  s.info.observations.Add(ObservationKey::Boolean(
      "user_none_grad_restored",
      "use_orig_params: whether the parameter whose .grad the rank set to None has a gradient "
      "again after the backward of the last forward (true without use_orig_params)"));
  s.info.observations.Add(ObservationKey::IntegerMap(
      "numels_after_forward",
      "use_orig_params: after the no_grad forward, one more forward (step 0's input), then the "
      "numel of every parameter named_parameters() lists before its backward, by clean FQN; "
      "empty without use_orig_params"));
  s.info.observations.Add(ObservationKey::StringList(
      "grad_dtypes",
      "the distinct dtypes of the parameters' gradients between backward and the optimizer "
      "step, over every step, sorted"));
  s.info.observations.Add(ObservationKey::StringList(
      "reduce_dtypes",
      "the distinct dtypes of the gradient reduce-scatters and all-reduces issued in backward, "
      "over every step, sorted"));
  s.info.deterministic = true;
  s.info.inputs = ZooInputsDoc(kind, "the case's dtype");
  s.info.default_world = 2;
  s.info.min_world = 1;
  s.info.max_world = 8;
  // An uneven world where the flat parameters shard unlike a balanced split; the prefetch and
  // mixed-precision axes play no part in the sharding there.
  if (const int uneven = ParityUnevenWorld(kind, s.info.params, s.info.max_world, true)) {
    s.info.extra_default_runs = {
        {uneven, {{"backward_prefetch", "BACKWARD_PRE"}, {"mixed_precision", "None"}}}};
  }
  // clip_grad_norm_ (test_fsdp_clip_grad_norm.py's DDP parity): the 2-norm at world 4 (the
  // hybrid strategies included) and the inf-norm at an uneven world, every sharding strategy
  // and use_orig_params, and the 1-norm (the seed's third norm_type) at the default world, where
  // a local norm that squares every element whatever norm_type is would agree with the 2-norm
  // run. The world-4 run also starts ranks other than 0 from zeroed parameters
  // under sync_module_states (a hybrid strategy broadcasts over the shard group, then over the
  // replicate group).
  for (const auto& [world, clip] :
       std::vector<std::pair<int, std::string>>{{4, "0.5:2"}, {3, "0.5:inf"}, {2, "0.5:1"}}) {
    s.info.extra_default_runs.push_back({world,
                                         {{"clip_grad_norm", clip},
                                          {"backward_prefetch", "BACKWARD_PRE"},
                                          {"cpu_offload", "False"},
                                          {"mixed_precision", "None"},
                                          {"sync_module_states", world == 4 ? "True" : "False"}}});
  }
  // test_fsdp_clip_grad_norm.py's mixed_strategy: a NO_SHARD instance among FULL_SHARD ones
  // under the root's clip_grad_norm_ (its gradients counted once in the total norm, not once
  // per rank, and clipped too), with and without use_orig_params: the 2-norm at an uneven
  // world, the inf-norm (the largest of the sharded and the non-sharded maxima) at world 2.
  for (const auto& [world, clip] :
       std::vector<std::pair<int, std::string>>{{3, "0.5:2"}, {2, "0.5:inf"}}) {
    s.info.extra_default_runs.push_back({world,
                                         {{"mixed_strategy", "True"},
                                          {"sharding_strategy", "FULL_SHARD"},
                                          {"clip_grad_norm", clip},
                                          {"backward_prefetch", "BACKWARD_PRE"},
                                          {"cpu_offload", "False"},
                                          {"mixed_precision", "None"}}});
  }
  // MixedPrecision(param_dtype=bfloat16) alone: FSDP1 reduces in the param dtype (FSDP2 would
  // reduce in float32), every sharding strategy (the hybrid ones on a 2 x 2 mesh).
  s.info.extra_default_runs.push_back({4,
                                       {{"mixed_precision", "param_bfloat16"},
                                        {"backward_prefetch", "BACKWARD_PRE"},
                                        {"use_orig_params", "False"},
                                        {"cpu_offload", "False"}}});
  // keep_low_precision_grads=True: the optimizer gets bfloat16 gradients (every non-hybrid
  // strategy: the sharded ones cast in _prepare_gradient_for_optim, NO_SHARD keeps its
  // all-reduced one), and clip_grad_norm_ returns its total norm in their dtype (bfloat16,
  // though computed in float32).
  s.info.extra_default_runs.push_back({2,
                                       {{"mixed_precision", "bfloat16_keep_low"},
                                        {"clip_grad_norm", "0.5:2"},
                                        {"backward_prefetch", "BACKWARD_PRE"},
                                        {"use_orig_params", "False"},
                                        {"cpu_offload", "False"}}});
  // use_orig_params under a float16 param_dtype: `_init_flat_param_and_metadata` aligns every
  // parameter to 16 bytes of the forward/backward dtype
  // (`_get_aligned_numel(_fwd_bwd_param_dtype)`: 8 float16 elements, not the 4 of the float32
  // parameters). DoubleLinear(6)'s 36-element weights are 4-aligned but not 8-aligned, so an
  // alignment taken from the wrong dtype (or a fixed one) moves every later parameter in the flat
  // parameter and changes the rank's numels.
  if (kind.name == "double_linear") {
    s.info.extra_default_runs.push_back({2,
                                         {{"mixed_precision", "float16"},
                                          {"use_orig_params", "True"},
                                          {"dim", "6"},
                                          {"sharding_strategy", "FULL_SHARD"},
                                          {"use_second_linear", "True"},
                                          {"backward_prefetch", "BACKWARD_PRE"},
                                          {"cpu_offload", "False"}}});
  }
  s.info.requirements.devices = {DeviceType::kCPU};
  // The hybrid strategies on a real 2 x 2 (replicate, shard) mesh.
  for (const char* hybrid : {"HYBRID_SHARD", "_HYBRID_SHARD_ZERO2"}) {
    s.info.test_runs.push_back({4, {{"sharding_strategy", hybrid}}});
  }
  s.skip = [](const CaseParams& p, int world) -> std::optional<std::string> {
    if (p.GetString("mixed_precision") != "None" && p.GetString("optim") != "sgd") {
      return "mixed_precision=" + p.GetString("mixed_precision") + " with optim=" +
             p.GetString("optim") +
             ": Adam normalises every element's gradient, so the rounding of a gradient that is "
             "zero for the oracle becomes an lr-sized step; only SGD's error is bounded by the "
             "oracle's updates";
    }
    const std::string strategy = p.GetString("sharding_strategy");
    if (p.GetBool("mixed_strategy") && fsdp1::IsHybridStrategy(ParseShardingStrategy(strategy))) {
      return "mixed_strategy with " + strategy +
             ": a NO_SHARD instance on the whole world next to instances on a (replicate, "
             "shard) mesh is not a configuration test_fsdp_clip_grad_norm.py runs";
    }
    if (fsdp1::IsHybridStrategy(ParseShardingStrategy(strategy)) &&
        !HybridMeshShapeFor(world).has_value()) {
      return strategy + " needs a (replicate, shard) mesh with both dimensions >= 2; world " +
             std::to_string(world) + " has none";
    }
    return std::nullopt;
  };
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
