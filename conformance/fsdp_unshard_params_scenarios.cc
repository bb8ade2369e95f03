// Family `fsdp_unshard_params` (test_fsdp_unshard_params.py): the gradients FSDP1's
// `summon_full_params(with_grads=True)` exposes (use_orig_params=True, the only configuration
// PyTorch supports), judged against the float64 oracle.
//   with_grads_core        TestUnshardParams.test_with_grads_core: sharding_strategy x writeback.
//                          After forward and backward, every rank reads the full parameters and
//                          gradients inside summon_full_params(writeback=..., with_grads=True),
//                          then doubles every gradient there (the seed's WRITEBACK_FACTOR); after
//                          a second forward without backward it reads them again: the doubled
//                          gradients persist iff writeback or nothing is sharded (NO_SHARD, or a
//                          shard group of one rank), as the seed's writeback_persists says.
//   with_grads_none_grads  TestUnshardParams.test_with_grads_none_grads: sharding_strategy x
//                          none_grad_ranks. all (the seed): no rank has run backward, so every
//                          rank's FlatParameter gradient is None and every original parameter
//                          sees None. odd: every rank runs forward and backward, then the odd
//                          ranks zero_grad(set_to_none=True) (so their FlatParameter gradient is
//                          None on entering, _reset_flat_param_grad_info_if_needed): under a
//                          sharded strategy FlatParamHandle.unshard_grad all-gathers zeros for
//                          those ranks' shards ("Only some but not all ranks have a `None`
//                          `FlatParameter` gradient, so FSDP is using zeros"), so every rank sees
//                          the averaged gradient where an even rank's shard holds it and 0 where
//                          an odd rank's does (LayOutFlatParam); without sharding each rank sees
//                          its own: None on the odd ranks, the averaged gradient on the others.
//   unshard_params_writeback  TestUnshardParams.test_unshard_params_writeback: sharding_strategy
//                          x writeback x offload_to_cpu x use_orig_params. Inside
//                          summon_full_params(writeback=..., offload_to_cpu=...) every rank reads
//                          the full parameters, then doubles every one of them; a second
//                          summon_full_params(writeback=False) reads them again: doubled iff
//                          writeback or nothing is sharded (the seed's rule: without sharding the
//                          parameters exposed are the unsharded storage itself), whether or not
//                          the full parameters were offloaded to the CPU in between (to_cpu copies
//                          them back to the compute device on exit, before the writeback).
//   orig_param_data_writeback  test_fsdp_use_orig_params.py::TestFSDPUseOrigParamsWriteback::
//                          test_param_writeback (change_data=True): sharding_strategy. Outside
//                          forward every original parameter's data is rebound to a new tensor
//                          (`param.data = 2 * param`, the rank's sharded view doubled); FSDP
//                          must write it back into its flat parameter before the next unshard
//                          (_writeback_orig_params: the view no longer shares the flat
//                          parameter's storage), so summon_full_params(writeback=False) reads
//                          every full parameter doubled (sharded strategies only: without
//                          sharding the writeback refuses the unflattened shape).
//   with_grads_rank0_only  summon_full_params(rank0_only=True, with_grads=True) after forward and
//                          backward (_unshard_fsdp_state_params): sharding_strategy. Rank 0
//                          reads the full parameters and the averaged gradients (in_scope/);
//                          under sharding every other rank resharded the parameter and the
//                          gradient at once (_reshard, _reshard_grads) and so reads its sharded
//                          views (_use_sharded_views, _use_sharded_grad_views): the elements of
//                          each parameter its shard holds, flattened (size 0 and no gradient when
//                          none). Then every rank reads the full parameters and gradients inside
//                          summon_full_params(with_grads=True) (after_scope/): the averaged
//                          gradient everywhere, so a rank that kept the unsharded gradient (or
//                          lost its shard) fails.
//   clip_grad_norm_ignored_modules  FullyShardedDataParallel.clip_grad_norm_(max_norm,
//                          norm_type) on the model wrapped with ignored_modules=[norm] (its
//                          parameters FSDP does not manage), after forward and backward:
//                          sharding_strategy x norm_type. PyTorch's FSDP1 clip counts the
//                          unmanaged parameters' gradients as non-sharded (not reduced, so each
//                          rank's own) and clips them too: rank r's total norm is
//                          (S + I_r)^(1/p), S over the averaged managed gradient, I_r over its
//                          own ignored gradient; for inf, max(S, I_r) max-reduced over the ranks
//                          (max(S, I_r) alone without sharding, where FSDP runs
//                          torch.nn.utils.clip_grad_norm_ on the rank's parameters); its
//                          coefficient min(max_norm / (total + 1e-6), 1) scales what it holds: its
//                          shard of the managed gradient (all of it without sharding) and its
//                          ignored gradient. Every rank reports the total norm and reads the
//                          gradients inside summon_full_params(with_grads=True): the managed
//                          gradient's elements of rank q's shard scaled by q's coefficient.
//   backward_with_inputs   _prepare_gradient_for_optim after a backward that reaches the nested
//                          instances' outputs but not their flat parameters: sharding_strategy,
//                          use_orig_params=False. After one full forward and backward (every
//                          flat parameter holds its sharded gradient), the next forward's loss is
//                          backpropagated with inputs=[the root's flat parameter]
//                          (torch.autograd.backward(loss, inputs=...)): the pre-backward hook of
//                          every block and of the final norm runs (their outputs lie on the path
//                          to the root's tied embedding), saving the gradient aside
//                          (_saved_grad_shard), but no post-backward hook does, so under sharding
//                          FSDP forwards nothing to their .grad, which stays None; without
//                          sharding nothing was saved and the .grad keeps the first backward's
//                          gradient, as does pos_embeddings' (its output leads to no root
//                          parameter, so its hook never runs). The root's flat parameter has a
//                          gradient in every case.
//   unshard_params_errors  TestUnshardParamsErrors and test_with_grads_core's unsupported
//                          configurations: call. summon_full_params(rank0_only=True,
//                          writeback=True), offload_to_cpu=True under NO_SHARD, with_grads=True
//                          with offload_to_cpu=True or use_orig_params=False, and
//                          summon_full_params entered from a hook on the output during backward
//                          must raise PyTorch's errors (_validate_unshard_params_args, "Cannot
//                          manually unshard parameters during forward/backward") on every rank.
//   unshard_params_respects_reshard  TestUnshardParams.test_unshard_params_respects_reshard:
//                          sharding_strategy x mixed_precision x rank0_only (offload_to_cpu and
//                          use_orig_params in an extra run). An empty summon_full_params between
//                          a forward and its backward must leave unsharded what FSDP kept
//                          unsharded after forward (it frees on exit only what it gathered),
//                          except under parameter mixed precision, where it forces full
//                          precision and frees the low-precision unsharded copy; one after
//                          backward must free what it gathered. The seed reads the unsharded
//                          storage sizes; the suite counts what they cause: the flat-parameter
//                          all-gathers of that backward and of the next forward.
//
// Each rank loads the zoo's Transformer (the seed's TransformerWithSharedParams family; tied
// output and embedding weights by default) from the case's runner-owned weights and wraps it as
// parity/fsdp1 does (WrapChildrenThenRoot: an instance around every block, then the root). The
// averaged gradient is the oracle's data-parallel gradient of step 0 (the mean over ranks of each
// rank's gradient on its own batch, the seed's DDP reference); the parameters are the initial
// weights. Every rule is computed for any world and size; nothing is tabulated.
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
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
#include "engine/autograd/engine.h"
#include "engine/autograd/grad_mode.h"
#include "engine/autograd/variable.h"
#include "engine/core/error.h"
#include "engine/distributed/comm_debug_mode.h"
#include "engine/fsdp1/fully_sharded_data_parallel.h"
#include "engine/fsdp1/tensor_data.h"
#include "engine/fsdp1/unshard_params.h"
#include "engine/functional/functional.h"

namespace fsdp::conformance {

namespace {

constexpr const char* kFamily = "fsdp_unshard_params";
constexpr const char* kSeedFile = "test_fsdp_unshard_params.py::TestUnshardParams::";
constexpr const char* kKind = "transformer";
// The seed's WRITEBACK_FACTOR: every gradient is multiplied by it inside the scope.
constexpr double kWritebackFactor = 2.0;
// The reads of unshard_params_writeback: inside the writeback scope; after it.
constexpr const char* kInScope = "in_scope/";
constexpr const char* kAfterScope = "after_scope/";
// The phases of with_grads_core: after forward and backward; after a second forward only.
constexpr const char* kAfterBackward = "after_backward/";
constexpr const char* kAfterForward = "after_forward/";

// A case's parameters, decoded once.
struct UnshardCase {
  ZooModel model;
  uint64_t seed = 0;
  fsdp1::ShardingStrategy strategy = fsdp1::ShardingStrategy::kFullShard;
  Tolerance tolerance;
};

UnshardCase DecodeCase(const CaseParams& params) {
  return UnshardCase{ZooModel::Make(kKind, params), static_cast<uint64_t>(params.GetInt("seed")),
                     ParseShardingStrategy(params.GetString("sharding_strategy")),
                     Tolerance{params.GetDouble("atol"), params.GetDouble("rtol")}};
}

// Whether the flat parameters are sharded: a sharded strategy over more than one rank (at one
// rank FSDP runs every strategy as NO_SHARD).
bool Sharded(const UnshardCase& c, int world) {
  return world > 1 && fsdp1::UsesShardedStrategy(c.strategy);
}

// The case's parameters: the seed's axes, the model's seed and knobs, the tolerance.
std::vector<ParamSpec> UnshardParams(ParamSpec axis) {
  const ZooModelKind& kind = ZooModel::Kind(kKind);
  std::vector<ParamSpec> params = {
      ShardingStrategyAxis(),
      std::move(axis),
      ParamSpec::SizeInt("seed", "seed of the zoo's weights and inputs", 0),
      LossParam(kind),
      ParamSpec::SizeDouble("atol", "atol of parameters and gradients (float32)", 1e-5),
      ParamSpec::SizeDouble("rtol", "rtol of parameters and gradients (float32)", 1e-4)};
  params.insert(params.end(), kind.params.begin(), kind.params.end());
  return params;
}

// The runner-owned inputs: the weights and every rank's batches of steps 0 and 1, float32.
CaseInputs UnshardInputs(const CaseParams& params, int world) {
  const UnshardCase c = DecodeCase(params);
  return c.model.MakeCaseInputs(c.seed, DType::kFloat32, /*steps=*/2, world);
}

// The zoo model on this rank, wrapped as parity/fsdp1 wraps it with the case's strategy and
// use_orig_params (True unless said otherwise).
std::shared_ptr<fsdp1::FullyShardedDataParallel> BuildWrapped(
    const UnshardCase& c, RankEnv& env, bool use_orig_params = true,
    const std::vector<std::string>& ignored_modules = {},
    const fsdp1::MixedPrecision& mixed_precision = {}) {
  nn::ModulePtr module = c.model.BuildEngineFromInputs(env.Inputs(), DType::kFloat32);
  module->to(env.device);
  fsdp1::FullyShardedDataParallelOptions options;
  options.mixed_precision = mixed_precision;
  for (const std::string& fqn : ignored_modules) {
    options.ignored_modules.push_back(module->get_submodule(fqn));
  }
  options.process_group = env.pg;
  options.sharding_strategy = c.strategy;
  options.use_orig_params = use_orig_params;
  return WrapChildrenThenRoot(module, options);
}

// Step `step`'s loss on this rank's batch (forward only).
Tensor StepLoss(const UnshardCase& c, nn::Module& module, RankEnv& env, int64_t step) {
  const Tensor input = env.Inputs().Get(StepInputName(step)).to(env.device);
  return ZooModel::Loss(c.model.Forward(module, input), c.model.LossAt(step));
}

// Inside summon_full_params(with_grads=True, writeback): every parameter as `prefix`param/<fqn>
// and its gradient as `prefix`grad/<fqn> (absent when None), by clean FQN, into `tensors`; then,
// with `scale`, every gradient multiplied by kWritebackFactor (the seed's p2.grad *= 2).
void ReadWithGrads(fsdp1::FullyShardedDataParallel& model, bool writeback, bool scale,
                   const std::string& prefix, nlohmann::json& tensors, bool rank0_only = false) {
  fsdp1::SummonFullParams full(
      model.shared_from_this(),
      {.writeback = writeback, .rank0_only = rank0_only, .with_grads = true});
  reference::RefTensorMap params;
  reference::RefTensorMap grads;
  for (const auto& [name, param] : model.named_parameters()) {
    const std::string fqn = fsdp1::CleanTensorName(name);
    params[fqn] = ToRef(param);
    Tensor grad = param.grad();
    if (!grad.defined()) continue;
    grads[fqn] = ToRef(grad);
    if (scale) {
      autograd::NoGradGuard no_grad;
      grad.copy_(grad * kWritebackFactor);
    }
  }
  tensors.update(MapToJson(params, "float32", prefix + "param/"));
  tensors.update(MapToJson(grads, "float32", prefix + "grad/"));
}

nlohmann::json RunWithGradsCoreRank(RankEnv& env) {
  const UnshardCase c = DecodeCase(env.params);
  const bool writeback = env.params.GetBool("writeback");
  auto model = BuildWrapped(c, env);
  nlohmann::json tensors = nlohmann::json::object();
  StepLoss(c, *model, env, 0).backward();
  ReadWithGrads(*model, writeback, /*scale=*/true, kAfterBackward, tensors);
  // Between forward and backward: the second forward's loss (and its graph) stays alive.
  const Tensor pending = StepLoss(c, *model, env, 1);
  ReadWithGrads(*model, writeback, /*scale=*/true, kAfterForward, tensors);
  nlohmann::json obs;
  obs[kTensors] = std::move(tensors);
  return obs;
}

// Whether rank `rank`'s FlatParameter gradient is None on entering (none_grad_ranks).
bool GradNoneOn(const CaseParams& params, int rank) {
  return params.GetString("none_grad_ranks") == "all" || rank % 2 == 1;
}

nlohmann::json RunWithGradsNoneGradsRank(RankEnv& env) {
  const UnshardCase c = DecodeCase(env.params);
  auto model = BuildWrapped(c, env);
  if (env.params.GetString("none_grad_ranks") != "all") {
    StepLoss(c, *model, env, 0).backward();
    if (GradNoneOn(env.params, env.rank)) model->zero_grad(/*set_to_none=*/true);
  }
  nlohmann::json tensors = nlohmann::json::object();
  ReadWithGrads(*model, /*writeback=*/true, /*scale=*/false, "", tensors);
  nlohmann::json obs;
  obs[kTensors] = std::move(tensors);
  return obs;
}

// with_grads_rank0_only: the parameters and gradients read inside summon_full_params(
// rank0_only=True, with_grads=True, writeback=False) (in_scope/), then inside
// summon_full_params(with_grads=True) on every rank (after_scope/).
nlohmann::json RunWithGradsRank0OnlyRank(RankEnv& env) {
  const UnshardCase c = DecodeCase(env.params);
  auto model = BuildWrapped(c, env);
  StepLoss(c, *model, env, 0).backward();
  nlohmann::json tensors = nlohmann::json::object();
  ReadWithGrads(*model, /*writeback=*/false, /*scale=*/false, kInScope, tensors,
                /*rank0_only=*/true);
  ReadWithGrads(*model, /*writeback=*/false, /*scale=*/false, kAfterScope, tensors);
  nlohmann::json obs;
  obs[kTensors] = std::move(tensors);
  return obs;
}

// clip_grad_norm_ignored_modules: the module FSDP is told to ignore (the Transformer's final
// norm: outside every nested instance, not tied to anything), and its parameters' FQN prefix.
constexpr const char* kIgnoredModule = "norm";
bool IsIgnoredFqn(const std::string& fqn) {
  return fqn.rfind(std::string(kIgnoredModule) + ".", 0) == 0;
}

// The case's clip_grad_norm_ norm_type ("2" or "inf").
double NormTypeOf(const CaseParams& params) {
  return params.GetString("norm_type") == "inf" ? std::numeric_limits<double>::infinity()
                                                : std::stod(params.GetString("norm_type"));
}

// clip_grad_norm_ignored_modules: after forward and backward, the total norm clip_grad_norm_
// returns (grad_norms, one element), then the parameters and gradients read inside
// summon_full_params(with_grads=True, writeback=False).
nlohmann::json RunClipGradNormIgnoredModulesRank(RankEnv& env) {
  const UnshardCase c = DecodeCase(env.params);
  auto model = BuildWrapped(c, env, /*use_orig_params=*/true, {kIgnoredModule});
  StepLoss(c, *model, env, 0).backward();
  const double total =
      model->clip_grad_norm_(env.params.GetDouble("max_norm"), NormTypeOf(env.params)).item();
  nlohmann::json tensors = nlohmann::json::object();
  ReadWithGrads(*model, /*writeback=*/false, /*scale=*/false, "", tensors);
  nlohmann::json obs;
  obs["grad_norms"] = std::vector<double>{total};
  obs[kTensors] = std::move(tensors);
  return obs;
}

// backward_with_inputs: whether each instance's flat parameter has a .grad after a backward
// restricted to the root's flat parameter (flat_grad_defined, fsdp_modules order: 1 or 0).
nlohmann::json RunBackwardWithInputsRank(RankEnv& env) {
  const UnshardCase c = DecodeCase(env.params);
  auto model = BuildWrapped(c, env, /*use_orig_params=*/false);
  StepLoss(c, *model, env, 0).backward();
  const Tensor loss = StepLoss(c, *model, env, 1);
  FSDP_CHECK(model->handle != nullptr, "backward_with_inputs: the root manages no parameters");
  autograd::backward({loss}, {}, /*retain_graph=*/false, /*create_graph=*/false,
                     {model->handle->flat_param()});
  std::vector<int64_t> defined;
  for (fsdp1::FullyShardedDataParallel* state :
       fsdp1::FullyShardedDataParallel::fsdp_modules(model)) {
    defined.push_back(state->handle && state->handle->flat_param().grad().defined() ? 1 : 0);
  }
  nlohmann::json obs;
  obs["flat_grad_defined"] = defined;
  return obs;
}

// Whether the restricted backward runs the pre-backward hook of the nested instance of `unit`:
// its output lies on a path to a root parameter. The Transformer computes
// h = tok_embeddings(tokens) + pos_embeddings(positions) (tok_embeddings, tied to the output
// projection, is the root's), so every block and the final norm are upstream of the root's
// embedding and output weights, but pos_embeddings' output leads only to its own parameters.
bool ReachedByRootInputsBackward(const Fsdp1FlatParamFqns& unit) {
  for (const std::string& fqn : unit.fqns) {
    if (fqn.rfind("pos_embeddings.", 0) != 0) return true;
  }
  return false;
}

// The root first (its gradient reaches the restricted backward's input), then every nested
// instance in module order: where its pre-backward hook ran, None under sharding (nothing
// forwarded without a post-backward); otherwise (or without sharding) the first backward's.
std::vector<nlohmann::json> ExpectBackwardWithInputs(const CaseParams& params, int world) {
  const UnshardCase c = DecodeCase(params);
  std::vector<int64_t> defined = {1};
  for (const Fsdp1FlatParamFqns& unit : Fsdp1FlatParamsOf(c.model)) {
    if (!unit.root)
      defined.push_back(Sharded(c, world) && ReachedByRootInputsBackward(unit) ? 0 : 1);
  }
  nlohmann::json obs;
  obs["flat_grad_defined"] = defined;
  return std::vector<nlohmann::json>(static_cast<size_t>(world), obs);
}

// unshard_params_writeback: the full parameters read inside summon_full_params(writeback,
// offload_to_cpu) and doubled there (in_scope/param/<fqn>), then read again inside
// summon_full_params(writeback=False) (after_scope/param/<fqn>).
nlohmann::json RunUnshardParamsWritebackRank(RankEnv& env) {
  const UnshardCase c = DecodeCase(env.params);
  auto model = BuildWrapped(c, env, env.params.GetBool("use_orig_params"));
  nlohmann::json tensors = nlohmann::json::object();
  {
    fsdp1::SummonFullParams full(model->shared_from_this(),
                                 {.writeback = env.params.GetBool("writeback"),
                                  .offload_to_cpu = env.params.GetBool("offload_to_cpu")});
    autograd::NoGradGuard no_grad;
    reference::RefTensorMap params;
    for (const auto& [name, param] : model->named_parameters()) {
      params[fsdp1::CleanTensorName(name)] = ToRef(param);
      Tensor data = param;
      data.copy_(param * kWritebackFactor);
    }
    tensors.update(MapToJson(params, "float32", std::string(kInScope) + "param/"));
  }
  fsdp1::SummonFullParams full(model->shared_from_this(), {.writeback = false});
  reference::RefTensorMap params;
  for (const auto& [name, param] : model->named_parameters()) {
    params[fsdp1::CleanTensorName(name)] = ToRef(param);
  }
  tensors.update(MapToJson(params, "float32", std::string(kAfterScope) + "param/"));
  nlohmann::json obs;
  obs[kTensors] = std::move(tensors);
  return obs;
}

// orig_param_data_writeback: every original parameter's data rebound to twice itself (a new
// tensor), then the full parameters read inside summon_full_params(writeback=False)
// (after_scope/param/<fqn>).
nlohmann::json RunOrigParamDataWritebackRank(RankEnv& env) {
  const UnshardCase c = DecodeCase(env.params);
  auto model = BuildWrapped(c, env);
  {
    autograd::NoGradGuard no_grad;
    for (const auto& [name, param] : model->named_parameters()) {
      fsdp1::SetData(param, param.detach() * kWritebackFactor);
    }
  }
  fsdp1::SummonFullParams full(model->shared_from_this(), {.writeback = false});
  reference::RefTensorMap params;
  for (const auto& [name, param] : model->named_parameters()) {
    params[fsdp1::CleanTensorName(name)] = ToRef(param);
  }
  nlohmann::json obs;
  obs[kTensors] = MapToJson(params, "float32", std::string(kAfterScope) + "param/");
  return obs;
}

// The oracle's averaged gradient of step 0 over `world` ranks (each on its own batch).
reference::RefTensorMap AveragedGradient(const UnshardCase& c, int world) {
  return TrainOracle(c.model, OptimConfig{}, c.seed, /*steps=*/1, DType::kFloat32, world)
      .at(0)
      .grads;
}

reference::RefTensorMap Scaled(reference::RefTensorMap map, double factor) {
  for (auto& [name, t] : map) {
    for (double& v : t.data) v *= factor;
  }
  return map;
}

// The seed's writeback_persists: a doubling inside summon_full_params outlives the scope when
// it writes back or when nothing is sharded (the full parameters are the flat parameter).
double PersistedFactor(const CaseParams& params, const UnshardCase& c, int world) {
  return params.GetBool("writeback") || !Sharded(c, world) ? kWritebackFactor : 1.0;
}

// `tensors` as every rank's observations.
std::vector<nlohmann::json> TensorsOnEveryRank(nlohmann::json tensors, int world) {
  nlohmann::json obs;
  obs[kTensors] = std::move(tensors);
  return std::vector<nlohmann::json>(static_cast<size_t>(world), obs);
}

std::vector<nlohmann::json> ExpectWithGradsCore(const CaseParams& params, int world) {
  const UnshardCase c = DecodeCase(params);
  const reference::RefTensorMap weights = c.model.MakeParameters(c.seed, DType::kFloat32);
  const reference::RefTensorMap grads = AveragedGradient(c, world);
  nlohmann::json tensors = nlohmann::json::object();
  tensors.update(MapToJson(weights, "float32", std::string(kAfterBackward) + "param/"));
  tensors.update(MapToJson(grads, "float32", std::string(kAfterBackward) + "grad/"));
  tensors.update(MapToJson(weights, "float32", std::string(kAfterForward) + "param/"));
  tensors.update(MapToJson(Scaled(grads, PersistedFactor(params, c, world)), "float32",
                           std::string(kAfterForward) + "grad/"));
  return TensorsOnEveryRank(std::move(tensors), world);
}

// unshard_params_writeback: the initial weights inside the scope; after it, doubled iff the
// doubling persists (the seed's rule: writeback, or nothing sharded).
std::vector<nlohmann::json> ExpectUnshardParamsWriteback(const CaseParams& params, int world) {
  const UnshardCase c = DecodeCase(params);
  const reference::RefTensorMap weights = c.model.MakeParameters(c.seed, DType::kFloat32);
  nlohmann::json tensors = MapToJson(weights, "float32", std::string(kInScope) + "param/");
  tensors.update(MapToJson(Scaled(weights, PersistedFactor(params, c, world)), "float32",
                           std::string(kAfterScope) + "param/"));
  return TensorsOnEveryRank(std::move(tensors), world);
}

// orig_param_data_writeback: the initial weights doubled, on every rank and strategy.
std::vector<nlohmann::json> ExpectOrigParamDataWriteback(const CaseParams& params, int world) {
  const UnshardCase c = DecodeCase(params);
  return TensorsOnEveryRank(
      MapToJson(Scaled(c.model.MakeParameters(c.seed, DType::kFloat32), kWritebackFactor),
                "float32", std::string(kAfterScope) + "param/"),
      world);
}

// What rank `rank` sees of the averaged gradient `grads` when the ranks GradNoneOn have no
// FlatParameter gradient: under sharding, every element an odd rank's shard holds is 0 (and
// every gradient None when all ranks have none); without it, the rank's own (None or not).
reference::RefTensorMap ExpectedNoneGrads(const UnshardCase& c, const CaseParams& params, int world,
                                          int rank, const reference::RefTensorMap& grads) {
  if (params.GetString("none_grad_ranks") == "all") return {};
  if (!Sharded(c, world)) return GradNoneOn(params, rank) ? reference::RefTensorMap{} : grads;
  reference::RefTensorMap out = grads;
  for (const Fsdp1FlatParamFqns& unit : Fsdp1FlatParamsOf(c.model)) {
    const FlatParamLayout layout = LayOutFlatParam(c.model, unit.fqns, DType::kFloat32, world);
    for (size_t i = 0; i < layout.fqns.size(); ++i) {
      for (int r = 0; r < world; ++r) {
        if (!GradNoneOn(params, r)) continue;
        const auto [begin, end] = layout.ParamRangeOnRank(i, r);
        std::vector<double>& data = out.at(layout.fqns[i]).data;
        for (int64_t e = begin; e < end; ++e) data[static_cast<size_t>(e)] = 0.0;
      }
    }
  }
  return out;
}

std::vector<nlohmann::json> ExpectWithGradsNoneGrads(const CaseParams& params, int world) {
  const UnshardCase c = DecodeCase(params);
  const reference::RefTensorMap weights = c.model.MakeParameters(c.seed, DType::kFloat32);
  const reference::RefTensorMap grads = params.GetString("none_grad_ranks") == "all"
                                            ? reference::RefTensorMap{}
                                            : AveragedGradient(c, world);
  std::vector<nlohmann::json> expected;
  for (int r = 0; r < world; ++r) {
    nlohmann::json tensors = MapToJson(weights, "float32", "param/");
    tensors.update(MapToJson(ExpectedNoneGrads(c, params, world, r, grads), "float32", "grad/"));
    nlohmann::json obs;
    obs[kTensors] = std::move(tensors);
    expected.push_back(std::move(obs));
  }
  return expected;
}

// What a rank other than 0 sees of the full tensors `full` inside summon_full_params(
// rank0_only=True) under sharding: each parameter's elements that the rank's shard holds,
// flattened (FlatParamHandle._use_sharded_views: size 0 when none). With `grads`, a parameter
// without elements in the shard is absent (_use_sharded_grad_views sets its .grad to None).
reference::RefTensorMap ShardedViews(const UnshardCase& c, int world, int rank,
                                     const reference::RefTensorMap& full, bool grads) {
  reference::RefTensorMap out;
  for (const Fsdp1FlatParamFqns& unit : Fsdp1FlatParamsOf(c.model)) {
    const FlatParamLayout layout = LayOutFlatParam(c.model, unit.fqns, DType::kFloat32, world);
    for (size_t i = 0; i < layout.fqns.size(); ++i) {
      const auto it = full.find(layout.fqns[i]);
      if (it == full.end()) continue;
      const auto [begin, end] = layout.ParamRangeOnRank(i, rank);
      if (grads && begin == end) continue;
      out[layout.fqns[i]] = reference::RefTensor(
          {end - begin},
          std::vector<double>(it->second.data.begin() + begin, it->second.data.begin() + end));
    }
  }
  return out;
}

std::vector<nlohmann::json> ExpectWithGradsRank0Only(const CaseParams& params, int world) {
  const UnshardCase c = DecodeCase(params);
  const reference::RefTensorMap weights = c.model.MakeParameters(c.seed, DType::kFloat32);
  const reference::RefTensorMap grads = AveragedGradient(c, world);
  std::vector<nlohmann::json> expected;
  for (int r = 0; r < world; ++r) {
    const bool views = r != 0 && Sharded(c, world);
    nlohmann::json tensors = MapToJson(views ? ShardedViews(c, world, r, weights, false) : weights,
                                       "float32", std::string(kInScope) + "param/");
    tensors.update(MapToJson(views ? ShardedViews(c, world, r, grads, true) : grads, "float32",
                             std::string(kInScope) + "grad/"));
    tensors.update(MapToJson(weights, "float32", std::string(kAfterScope) + "param/"));
    tensors.update(MapToJson(grads, "float32", std::string(kAfterScope) + "grad/"));
    nlohmann::json obs;
    obs[kTensors] = std::move(tensors);
    expected.push_back(std::move(obs));
  }
  return expected;
}

// Every rank's own gradient of step 0 (the oracle's forward and backward of its slice of the
// global batch), before any reduction.
std::vector<reference::RefTensorMap> LocalGradients(const UnshardCase& c, int world) {
  const ZooInput global = c.model.MakeInput(c.seed, 0, DType::kFloat32, world * c.model.batch());
  const auto inputs = reference::SplitBatch(global.oracle, world);
  const reference::RefTensorMap params = c.model.MakeParameters(c.seed, DType::kFloat32);
  const reference::RefTensorMap buffers = c.model.MakeBuffers(c.seed, DType::kFloat32);
  std::vector<reference::RefTensorMap> out;
  for (int r = 0; r < world; ++r) {
    out.push_back(reference::ForwardBackward(c.model.oracle(), params, buffers,
                                             inputs[static_cast<size_t>(r)], c.model.LossAt(0))
                      .grads);
  }
  return out;
}

// sum |g|^p over `map`'s elements whose FQN `pick` accepts (max |g| for an infinite p).
double NormPower(const reference::RefTensorMap& map, double p,
                 const std::function<bool(const std::string&)>& pick) {
  double acc = 0.0;
  for (const auto& [fqn, t] : map) {
    if (!pick(fqn)) continue;
    for (double v : t.data)
      acc = std::isinf(p) ? std::max(acc, std::fabs(v)) : acc + std::pow(std::fabs(v), p);
  }
  return acc;
}

// clip_grad_norm_ignored_modules by FSDP1's rule (see the file comment).
std::vector<nlohmann::json> ExpectClipGradNormIgnoredModules(const CaseParams& params, int world) {
  const UnshardCase c = DecodeCase(params);
  const double p = NormTypeOf(params);
  const double max_norm = params.GetDouble("max_norm");
  const std::vector<reference::RefTensorMap> local = LocalGradients(c, world);
  // The managed gradient: averaged over the ranks.
  reference::RefTensorMap averaged;
  for (const auto& [fqn, g] : local.front()) {
    if (IsIgnoredFqn(fqn)) continue;
    reference::RefTensor sum = g;
    for (int r = 1; r < world; ++r) {
      const auto& other = local[static_cast<size_t>(r)].at(fqn).data;
      for (size_t e = 0; e < sum.data.size(); ++e) sum.data[e] += other[e];
    }
    for (double& v : sum.data) v /= world;
    averaged[fqn] = std::move(sum);
  }
  const double managed = NormPower(averaged, p, [](const std::string&) { return true; });
  // inf under sharding: every rank's local maximum (its shard and its ignored gradients),
  // max-reduced over the ranks; without (torch.nn.utils.clip_grad_norm_), the rank's own.
  double max_ignored = 0.0;
  for (const reference::RefTensorMap& mine : local) {
    max_ignored = std::max(max_ignored, NormPower(mine, p, IsIgnoredFqn));
  }
  std::vector<double> totals;
  std::vector<double> coefs;
  for (int r = 0; r < world; ++r) {
    const double ignored = NormPower(local[static_cast<size_t>(r)], p, IsIgnoredFqn);
    totals.push_back(std::isinf(p) ? std::max(managed, Sharded(c, world) ? max_ignored : ignored)
                                   : std::pow(managed + ignored, 1.0 / p));
    coefs.push_back(std::min(max_norm / (totals.back() + 1e-6), 1.0));
  }
  // The managed gradient as summon_full_params gathers it: each element scaled by the
  // coefficient of the rank whose shard holds it (without sharding, every rank's own).
  auto gathered = [&](int rank) {
    reference::RefTensorMap out = averaged;
    if (!Sharded(c, world)) return Scaled(out, coefs[static_cast<size_t>(rank)]);
    for (const Fsdp1FlatParamFqns& unit : Fsdp1FlatParamsOf(c.model)) {
      std::vector<std::string> fqns;
      for (const std::string& fqn : unit.fqns) {
        if (!IsIgnoredFqn(fqn)) fqns.push_back(fqn);
      }
      const FlatParamLayout layout = LayOutFlatParam(c.model, fqns, DType::kFloat32, world);
      for (size_t i = 0; i < layout.fqns.size(); ++i) {
        for (int q = 0; q < world; ++q) {
          const auto [begin, end] = layout.ParamRangeOnRank(i, q);
          std::vector<double>& data = out.at(layout.fqns[i]).data;
          for (int64_t e = begin; e < end; ++e)
            data[static_cast<size_t>(e)] *= coefs[static_cast<size_t>(q)];
        }
      }
    }
    return out;
  };
  const reference::RefTensorMap weights = c.model.MakeParameters(c.seed, DType::kFloat32);
  std::vector<nlohmann::json> expected;
  for (int r = 0; r < world; ++r) {
    reference::RefTensorMap grads = gathered(r);
    for (const auto& [fqn, g] : local[static_cast<size_t>(r)]) {
      if (IsIgnoredFqn(fqn)) grads[fqn] = Scaled({{fqn, g}}, coefs[static_cast<size_t>(r)]).at(fqn);
    }
    nlohmann::json tensors = MapToJson(weights, "float32", "param/");
    tensors.update(MapToJson(grads, "float32", "grad/"));
    nlohmann::json obs;
    obs["grad_norms"] = std::vector<double>{totals[static_cast<size_t>(r)]};
    obs[kTensors] = std::move(tensors);
    expected.push_back(std::move(obs));
  }
  return expected;
}

// Every rank's parameters and gradients under each of `prefixes` against `expected`.
void JudgeAgainst(const std::vector<std::string>& prefixes, const CaseParams& params, int world,
                  const std::vector<nlohmann::json>& expected,
                  const std::vector<nlohmann::json>& per_rank, CheckList& checks) {
  const Tolerance tol = DecodeCase(params).tolerance;
  ErrorStats param_err;
  ErrorStats grad_err;
  for (int r = 0; r < world; ++r) {
    for (const std::string& prefix : prefixes) {
      const std::string where = RankName(r) + (prefix.empty() ? "" : " " + prefix);
      param_err.Merge(CheckMapsClose(checks, where + " full parameters",
                                     MapFromObservations(expected, r, prefix + "param/"),
                                     MapFromObservations(per_rank, r, prefix + "param/"), tol));
      // A gradient element that cancels to near zero carries the rounding of the float32 terms
      // it sums: atol scales with the tensor's largest expected magnitude (as parity/fsdp's).
      const reference::RefTensorMap want = MapFromObservations(expected, r, prefix + "grad/");
      const std::map<std::string, double> scales = MaxAbsByFqn({want});
      grad_err.Merge(CheckMapsClose(checks, where + " full gradients (with_grads=True)", want,
                                    MapFromObservations(per_rank, r, prefix + "grad/"), tol,
                                    &scales));
    }
  }
  checks.SetFigure("param_max_abs_err", param_err.max_abs);
  checks.SetFigure("grad_max_abs_err", grad_err.max_abs);
  checks.SetFigure("grad_max_rel_err", grad_err.max_rel);
  checks.SetFigure("grad_tolerance_used", grad_err.tolerance_used);
}

// Sets `s`'s expectation to `expect` and its judge to JudgeAgainst over `prefixes` of it.
void ExpectAndJudgeAgainst(Scenario& s, std::vector<std::string> prefixes,
                           std::vector<nlohmann::json> (*expect)(const CaseParams&, int)) {
  s.expect = expect;
  s.judge = [prefixes = std::move(prefixes), expect](const CaseParams& p, int world,
                                                     const std::vector<nlohmann::json>& per_rank,
                                                     CheckList& checks) {
    JudgeAgainst(prefixes, p, world, expect(p, world), per_rank, checks);
  };
}

// What both scenarios share: parameters, worlds, inputs, an uneven default world.
Scenario MakeUnshardScenario(const std::string& name, const std::string& description,
                             ParamSpec axis) {
  const ZooModelKind& kind = ZooModel::Kind(kKind);
  Scenario s;
  s.info.name = std::string(kFamily) + "/" + name;
  s.info.description = description;
  s.info.seed_test = std::string(kSeedFile) + "test_" + name;
  s.info.params = UnshardParams(std::move(axis));
  s.info.deterministic = true;
  s.info.inputs = ZooInputsDoc(kind, "float32");
  s.inputs = UnshardInputs;
  s.info.default_world = 2;
  s.info.min_world = 1;
  s.info.max_world = 8;
  // An uneven world, where the flat parameters shard unlike a balanced split (the zeros of a
  // None shard land elsewhere).
  if (const int uneven = ParityUnevenWorld(kind, s.info.params, s.info.max_world, true)) {
    s.info.extra_default_runs = {{uneven, {}}};
  }
  s.info.requirements.devices = {DeviceType::kCPU};
  return s;
}

// The tensors of ReadWithGrads under `prefix`, for the schema; `phase` says when they are read.
void AddReadSchema(ObservationSchema& schema, const std::string& prefix, const std::string& phase,
                   const std::string& grads) {
  schema.AddTensors({prefix + "param/{fqn}", "float32", "the full parameter",
                     phase + ": every parameter inside summon_full_params(with_grads=True), by "
                             "clean FQN (named_parameters(), a tied parameter once)"});
  TensorObservation grad{
      prefix + "grad/{fqn}", "float32", "the full parameter's",
      phase + ": each parameter's .grad there, " + grads + " (absent when the .grad is None)"};
  grad.required = false;
  schema.AddTensors(grad);
}

Scenario MakeWithGradsCore() {
  Scenario s = MakeUnshardScenario(
      "with_grads_core",
      "the zoo Transformer under FullyShardedDataParallel(use_orig_params=True): the full "
      "gradients summon_full_params(with_grads=True) exposes after backward and between forward "
      "and backward vs the oracle's rank-averaged gradient, and whether doubling them persists",
      ParamSpec::Axis("writeback", "summon_full_params writeback", {"False", "True"}));
  AddReadSchema(s.info.observations, kAfterBackward, "after forward and backward",
                "before it is doubled");
  AddReadSchema(s.info.observations, kAfterForward, "after a second forward, before its backward",
                "before it is doubled again (doubled once iff the first doubling persisted)");
  s.run_rank = RunWithGradsCoreRank;
  ExpectAndJudgeAgainst(s, {kAfterBackward, kAfterForward}, ExpectWithGradsCore);
  return s;
}

Scenario MakeWithGradsNoneGrads() {
  ParamSpec ranks = ParamSpec::Axis(
      "none_grad_ranks",
      "the ranks whose FlatParameter gradient is None on entering: all (the seed: no backward "
      "ran), odd (every rank ran backward, then the odd ranks zero_grad(set_to_none=True))",
      {"all", "odd"});
  Scenario s = MakeUnshardScenario(
      "with_grads_none_grads",
      "the zoo Transformer under FullyShardedDataParallel(use_orig_params=True): the gradients "
      "summon_full_params(with_grads=True) exposes when all or some ranks' FlatParameter "
      "gradients are None (None everywhere; zeros for a None rank's shard)",
      std::move(ranks));
  AddReadSchema(s.info.observations, "", "after the backward of every rank but none_grad_ranks",
                "the averaged gradient with zeros where a None rank's shard lies (sharded), "
                "else the rank's own");
  s.run_rank = RunWithGradsNoneGradsRank;
  ExpectAndJudgeAgainst(s, {""}, ExpectWithGradsNoneGrads);
  return s;
}

Scenario MakeUnshardParamsWriteback() {
  Scenario s = MakeUnshardScenario(
      "unshard_params_writeback",
      "the zoo Transformer under FullyShardedDataParallel: every full parameter doubled inside "
      "summon_full_params(writeback, offload_to_cpu) persists iff writeback or nothing is "
      "sharded, read again inside summon_full_params(writeback=False)",
      ParamSpec::Axis("writeback", "summon_full_params writeback", {"False", "True"}));
  s.info.params.push_back(ParamSpec::Axis(
      "offload_to_cpu",
      "summon_full_params offload_to_cpu (the full parameters copied to the CPU inside the scope "
      "and back on exit; PyTorch refuses it without sharding)",
      {"False", "True"}));
  s.info.params.push_back(ParamSpec::Axis(
      "use_orig_params", "FullyShardedDataParallel use_orig_params", {"False", "True"}));
  s.info.observations.AddTensors(
      {std::string(kInScope) + "param/{fqn}", "float32", "the full parameter",
       "inside summon_full_params(writeback, offload_to_cpu), before it is doubled there, by "
       "clean FQN (named_parameters(), a tied parameter once)"});
  s.info.observations.AddTensors(
      {std::string(kAfterScope) + "param/{fqn}", "float32", "the full parameter",
       "after that scope, inside summon_full_params(writeback=False), by clean FQN: doubled iff "
       "the doubling persisted"});
  s.skip = [](const CaseParams& p, int world) -> std::optional<std::string> {
    if (p.GetBool("offload_to_cpu") && !Sharded(DecodeCase(p), world)) {
      return "summon_full_params(offload_to_cpu=True) without sharding: PyTorch raises "
             "\"offload_to_cpu=True and NO_SHARD is not supported yet\"";
    }
    return std::nullopt;
  };
  s.run_rank = RunUnshardParamsWritebackRank;
  ExpectAndJudgeAgainst(s, {kInScope, kAfterScope}, ExpectUnshardParamsWriteback);
  return s;
}

Scenario MakeOrigParamDataWriteback() {
  Scenario s = MakeUnshardScenario(
      "orig_param_data_writeback",
      "the zoo Transformer under FullyShardedDataParallel(use_orig_params=True): every original "
      "parameter's data rebound outside forward (param.data = 2 * param) is written back into "
      "the flat parameter, so summon_full_params reads every full parameter doubled",
      ShardingStrategyAxis());
  // MakeUnshardScenario put the strategy axis first already: keep one.
  s.info.params.erase(s.info.params.begin() + 1);
  s.info.seed_test =
      "test_fsdp_use_orig_params.py::TestFSDPUseOrigParamsWriteback::test_param_writeback";
  s.info.observations.AddTensors(
      {std::string(kAfterScope) + "param/{fqn}", "float32", "the full parameter",
       "after every original parameter's data was rebound to twice itself, inside "
       "summon_full_params(writeback=False), by clean FQN"});
  s.skip = [](const CaseParams& p, int world) -> std::optional<std::string> {
    if (Sharded(DecodeCase(p), world)) return std::nullopt;
    return "without sharding an original parameter keeps its shape, and "
           "FlatParamHandle._writeback_tensor expects the 1-D shape of its part of the shard: "
           "PyTorch raises \"Cannot writeback when the parameter shape changes\"";
  };
  s.run_rank = RunOrigParamDataWritebackRank;
  ExpectAndJudgeAgainst(s, {kAfterScope}, ExpectOrigParamDataWriteback);
  return s;
}

Scenario MakeWithGradsRank0Only() {
  Scenario s = MakeUnshardScenario(
      "with_grads_rank0_only",
      "the zoo Transformer under FullyShardedDataParallel(use_orig_params=True): after forward "
      "and backward, summon_full_params(rank0_only=True, with_grads=True) exposes the full "
      "parameters and averaged gradients on rank 0 and, under sharding, each other rank's "
      "sharded views; a later summon_full_params(with_grads=True) the full ones everywhere",
      ShardingStrategyAxis());
  // MakeUnshardScenario put the strategy axis first already: keep one.
  s.info.params.erase(s.info.params.begin() + 1);
  s.info.seed_test =
      "torch/distributed/fsdp/_unshard_param_utils.py::_unshard_fsdp_state_params (rank0_only: "
      "the other ranks reshard the parameter and gradient at once)";
  AddReadSchema(s.info.observations, kInScope,
                "inside summon_full_params(rank0_only=True, with_grads=True, writeback=False); "
                "on a rank other than 0 under sharding the sharded view (the parameter's "
                "elements of the rank's shard, flattened, size 0 when none)",
                "the averaged gradient (or, where the parameter is a sharded view, its "
                "elements of the rank's shard)");
  AddReadSchema(s.info.observations, kAfterScope,
                "after that scope, inside summon_full_params(with_grads=True) on every rank",
                "the averaged gradient");
  s.run_rank = RunWithGradsRank0OnlyRank;
  ExpectAndJudgeAgainst(s, {kInScope, kAfterScope}, ExpectWithGradsRank0Only);
  return s;
}

Scenario MakeClipGradNormIgnoredModules() {
  Scenario s = MakeUnshardScenario(
      "clip_grad_norm_ignored_modules",
      "the zoo Transformer under FullyShardedDataParallel(use_orig_params=True, "
      "ignored_modules=[norm]): clip_grad_norm_ after forward and backward counts the unmanaged "
      "parameters' (unreduced, per-rank) gradients once and clips them with the managed ones; "
      "the total norm and the gradients read in summon_full_params(with_grads=True) vs the rule",
      ParamSpec::Axis("norm_type", "clip_grad_norm_ norm_type", {"2", "inf"}));
  s.info.params.push_back(ParamSpec::SizeDouble(
      "max_norm", "clip_grad_norm_ max_norm (below the total norms, so that the ranks clip)", 500));
  s.info.seed_test =
      "torch/distributed/fsdp/fully_sharded_data_parallel.py::FullyShardedDataParallel."
      "clip_grad_norm_ (non-FSDP-managed parameters counted as non-sharded)";
  s.info.observations.Add(ObservationKey::NumberList(
      "grad_norms", "the total norm clip_grad_norm_ returned (one element)"));
  AddReadSchema(s.info.observations, "",
                "after clip_grad_norm_, inside summon_full_params(with_grads=True, "
                "writeback=False)",
                "the clipped gradient: the managed ones averaged over the ranks, each element "
                "scaled by the coefficient of the rank whose shard holds it; the ignored "
                "module's the rank's own, scaled by its coefficient");
  s.run_rank = RunClipGradNormIgnoredModulesRank;
  s.expect = ExpectClipGradNormIgnoredModules;
  s.judge = [](const CaseParams& p, int world, const std::vector<nlohmann::json>& per_rank,
               CheckList& checks) {
    const std::vector<nlohmann::json> expected = ExpectClipGradNormIgnoredModules(p, world);
    const Tolerance tol = DecodeCase(p).tolerance;
    for (int r = 0; r < world; ++r) {
      checks.CheckClose(RankName(r) + " clip_grad_norm_ total norm (ignored modules counted)",
                        RankObservation(expected, r, "grad_norms"),
                        RankObservation(per_rank, r, "grad_norms"), tol);
    }
    JudgeAgainst({""}, p, world, expected, per_rank, checks);
  };
  return s;
}

Scenario MakeBackwardWithInputs() {
  Scenario s = MakeUnshardScenario(
      "backward_with_inputs",
      "the zoo Transformer under FullyShardedDataParallel(use_orig_params=False): after a full "
      "backward, a backward with inputs=[the root's flat parameter] runs every block's "
      "pre-backward hook but no post-backward; the blocks' flat parameters then have no .grad "
      "under sharding (_prepare_gradient_for_optim forwards nothing), their old one without",
      ShardingStrategyAxis());
  // MakeUnshardScenario put the strategy axis first already: keep one.
  s.info.params.erase(s.info.params.begin() + 1);
  s.info.seed_test =
      "torch/distributed/fsdp/_flat_param.py::FlatParamHandle.prepare_gradient_for_optim (no "
      "sharded gradient computed this iteration: nothing forwarded to .grad)";
  s.info.observations.Add(ObservationKey::IntegerList(
      "flat_grad_defined",
      "after the restricted backward, for every instance in FSDP.fsdp_modules(model) order (the "
      "root first): 1 if its flat parameter's .grad is not None, else 0"));
  s.run_rank = RunBackwardWithInputsRank;
  s.expect = ExpectBackwardWithInputs;
  s.judge = [](const CaseParams& p, int world, const std::vector<nlohmann::json>& per_rank,
               CheckList& checks) {
    const std::vector<nlohmann::json> expected = ExpectBackwardWithInputs(p, world);
    for (int r = 0; r < world; ++r) {
      checks.CheckEqual(RankName(r) + " flat parameters with a .grad after backward(inputs=...)",
                        RankObservation(expected, r, "flat_grad_defined"),
                        RankObservation(per_rank, r, "flat_grad_defined"));
    }
  };
  return s;
}

// ---- unshard_params_errors -------------------------------------------------------------------

// The summon_full_params calls PyTorch refuses, by the `call` axis, each with the phrases its
// error must contain (the seeds match "is not supported" and "Cannot manually unshard
// parameters during forward/backward"; the configuration named in the text tells the checks
// of _validate_unshard_params_args apart).
struct UnshardMisuse {
  std::string call;
  std::string message;  // PyTorch's text (what `expect` reports)
  std::vector<std::string> phrases;
};

const std::vector<UnshardMisuse>& UnshardMisuses() {
  static const std::vector<UnshardMisuse> misuses = {
      {"rank0_only_writeback",
       "writeback=True and rank0_only=True is not supported yet",
       {"writeback=True and rank0_only=True", "is not supported"}},
      {"offload_to_cpu_no_shard",
       "offload_to_cpu=True and NO_SHARD is not supported yet",
       {"offload_to_cpu=True and NO_SHARD", "is not supported"}},
      {"with_grads_offload_to_cpu",
       "with_grads=True, use_orig_params=True, offload_to_cpu=True is not supported yet",
       {"with_grads=True", "offload_to_cpu=True", "is not supported"}},
      {"with_grads_flat_params",
       "with_grads=True, use_orig_params=False, offload_to_cpu=False is not supported yet",
       {"with_grads=True", "use_orig_params=False", "is not supported"}},
      {"from_backward",
       "Cannot manually unshard parameters during forward/backward",
       {"Cannot manually unshard parameters during forward/backward"}},
  };
  return misuses;
}

const UnshardMisuse& MisuseOf(const CaseParams& params) {
  const std::string call = params.GetString("call");
  for (const UnshardMisuse& m : UnshardMisuses()) {
    if (m.call == call) return m;
  }
  FSDP_THROW(ErrorCode::kInvalidArgument, "unknown call '", call, "'");
}

// unshard_params_errors: the case's misuse on a freshly wrapped Transformer (NO_SHARD for
// offload_to_cpu_no_shard, use_orig_params=False for with_grads_flat_params, else the case's
// strategy and use_orig_params=True); the message of what it raised ("" when nothing).
nlohmann::json RunUnshardParamsErrorsRank(RankEnv& env) {
  UnshardCase c = DecodeCase(env.params);
  const std::string call = MisuseOf(env.params).call;
  if (call == "offload_to_cpu_no_shard") c.strategy = fsdp1::ShardingStrategy::kNoShard;
  auto model = BuildWrapped(c, env, /*use_orig_params=*/call != "with_grads_flat_params");
  std::string message;
  try {
    if (call == "from_backward") {
      // test_unshard_params_from_backward_raises: a hook registered on the model's output
      // after FSDP's own pre-backward hook enters summon_full_params while the backward runs.
      const Tensor input = env.Inputs().Get(StepInputName(0)).to(env.device);
      const std::vector<Tensor> outputs = c.model.Forward(*model, input);
      autograd::register_hook(outputs.front(), [&model](const Tensor&) {
        fsdp1::SummonFullParams full(model->shared_from_this());
      });
      ZooModel::Loss(outputs, c.model.LossAt(0)).backward();
    } else {
      fsdp1::SummonFullParamsOptions options;
      options.rank0_only = call == "rank0_only_writeback";
      options.offload_to_cpu =
          call == "offload_to_cpu_no_shard" || call == "with_grads_offload_to_cpu";
      options.with_grads = call.rfind("with_grads", 0) == 0;
      fsdp1::SummonFullParams full(model->shared_from_this(), options);
    }
  } catch (const Error& e) {
    message = e.message();
  }
  return nlohmann::json{{"error_message", message}};
}

Scenario MakeUnshardParamsErrors() {
  std::vector<std::string> calls;
  for (const UnshardMisuse& m : UnshardMisuses()) calls.push_back(m.call);
  Scenario s = MakeUnshardScenario(
      "unshard_params_errors",
      "summon_full_params used as PyTorch refuses (rank0_only with writeback, offload_to_cpu "
      "under NO_SHARD, with_grads with offload_to_cpu or without use_orig_params, entered during "
      "backward): PyTorch's error on every rank",
      ParamSpec::Axis("call",
                      "the misuse: rank0_only_writeback, offload_to_cpu_no_shard, "
                      "with_grads_offload_to_cpu, with_grads_flat_params, from_backward",
                      calls));
  // The strategy only matters to offload_to_cpu_no_shard, which fixes it.
  s.info.params.front() =
      ParamSpec::SizeString("sharding_strategy",
                            "FullyShardedDataParallel sharding_strategy (NO_SHARD for "
                            "offload_to_cpu_no_shard)",
                            "FULL_SHARD");
  s.info.extra_default_runs.clear();
  s.info.deterministic = false;
  s.info.seed_test =
      "test_fsdp_unshard_params.py::TestUnshardParamsErrors (test_rank0_only_with_writeback_"
      "raises, test_offload_to_cpu_no_shard_raises, test_unshard_params_from_backward_raises) and "
      "TestUnshardParams.test_with_grads_core's unsupported configurations";
  s.info.observations.Add(ObservationKey::String(
      "error_message", "the message of the error the call raised (\"\" when it raised none)"));
  s.run_rank = RunUnshardParamsErrorsRank;
  s.expect = [](const CaseParams& p, int world) {
    return std::vector<nlohmann::json>(static_cast<size_t>(world),
                                       {{"error_message", MisuseOf(p).message}});
  };
  s.judge = [](const CaseParams& p, int world, const std::vector<nlohmann::json>& per_rank,
               CheckList& checks) {
    for (int r = 0; r < world; ++r) {
      const nlohmann::json& got = RankObservation(per_rank, r, "error_message");
      const std::string message = got.is_string() ? got.get<std::string>() : "";
      for (const std::string& phrase : MisuseOf(p).phrases) {
        checks.CheckTrue(RankName(r) + " error names \"" + phrase + "\"",
                         message.find(phrase) != std::string::npos, "got \"" + message + "\"");
      }
    }
  };
  return s;
}

// ---- unshard_params_respects_reshard ---------------------------------------------------------

// The summon_full_params options of unshard_params_respects_reshard (the seed's
// writeback=not rank0_only).
fsdp1::SummonFullParamsOptions RespectsReshardOptions(const CaseParams& params) {
  fsdp1::SummonFullParamsOptions options;
  options.rank0_only = params.GetBool("rank0_only");
  options.writeback = !options.rank0_only;
  options.offload_to_cpu = params.GetBool("offload_to_cpu");
  return options;
}

// unshard_params_respects_reshard: after a warm-up forward and backward, a forward, an empty
// summon_full_params, the backward (its all-gathers counted), another empty summon_full_params
// and a forward (counted).
nlohmann::json RunRespectsReshardRank(RankEnv& env) {
  const UnshardCase c = DecodeCase(env.params);
  const fsdp1::SummonFullParamsOptions options = RespectsReshardOptions(env.params);
  auto model = BuildWrapped(c, env, env.params.GetBool("use_orig_params"), {},
                            ParseMixedPrecision(env.params.GetString("mixed_precision")));
  StepLoss(c, *model, env, 0).backward();
  const Tensor loss = StepLoss(c, *model, env, 1);
  { fsdp1::SummonFullParams full(model->shared_from_this(), options); }
  distributed::CommDebugMode backward_mode;
  loss.backward();
  backward_mode.exit();
  { fsdp1::SummonFullParams full(model->shared_from_this(), options); }
  distributed::CommDebugMode forward_mode;
  const Tensor pending = StepLoss(c, *model, env, 0);
  forward_mode.exit();
  const nlohmann::json counts =
      PhaseCommCountsJson(forward_mode.get_comm_counts(), backward_mode.get_comm_counts());
  nlohmann::json all_gathers = nlohmann::json::object();
  for (const char* phase : {"backward", "forward"}) {
    const nlohmann::json merged = MergeFlatParamAllGathers(counts[phase]);
    all_gathers[phase] = merged.value(kFlatParamAllGather, 0);
  }
  return nlohmann::json{{"all_gathers", all_gathers}};
}

// FSDP1's reshard rules around summon_full_params (_unshard_fsdp_state_params frees on exit
// only what it had to unshard, handle.needs_unshard() on entering): a flat parameter that was
// unsharded before the scope (the root's between forward and backward: FSDP1's root never
// frees after forward; every instance's under SHARD_GRAD_OP) stays unsharded, so the backward
// all-gathers only the instances freed after forward (FULL_SHARD's non-roots). Under
// parameter mixed precision the scope forces full precision and frees the low-precision
// unsharded copy (_get_padded_unsharded_flat_param), so the backward all-gathers every
// instance again. After backward everything is resharded and the scope frees what it
// gathered: the next forward all-gathers every instance. Without sharding nothing is gathered.
std::vector<nlohmann::json> ExpectRespectsReshard(const CaseParams& params, int world) {
  const UnshardCase c = DecodeCase(params);
  const bool mixed =
      ParseMixedPrecision(params.GetString("mixed_precision")).param_dtype.has_value();
  int64_t backward = 0;
  int64_t forward = 0;
  if (Sharded(c, world)) {
    for (const Fsdp1FlatParamFqns& unit : Fsdp1FlatParamsOf(c.model)) {
      ++forward;
      if (mixed || (Fsdp1ReshardsAfterForwardRule(c.strategy) && !unit.root)) ++backward;
    }
  }
  return std::vector<nlohmann::json>(
      static_cast<size_t>(world),
      {{"all_gathers", {{"backward", backward}, {"forward", forward}}}});
}

Scenario MakeUnshardParamsRespectsReshard() {
  Scenario s = MakeUnshardScenario(
      "unshard_params_respects_reshard",
      "the zoo Transformer under FullyShardedDataParallel: summon_full_params between forward "
      "and backward leaves the flat parameters FSDP kept unsharded after forward unsharded "
      "(but under parameter mixed precision), and after backward frees what it gathered: the "
      "all-gathers of the following backward and forward",
      ParamSpec::Axis("mixed_precision", "MixedPrecision: None, or float16 (param, reduce, buffer)",
                      {"None", "float16"}));
  s.info.params.push_back(ParamSpec::Axis(
      "rank0_only", "summon_full_params rank0_only (writeback=not rank0_only)", {"False", "True"}));
  s.info.params.push_back(
      ParamSpec::SizeBool("offload_to_cpu", "summon_full_params offload_to_cpu", false));
  s.info.params.push_back(
      ParamSpec::SizeBool("use_orig_params", "FullyShardedDataParallel use_orig_params", true));
  s.info.extra_default_runs = {
      {2, {{"offload_to_cpu", "True"}, {"use_orig_params", "False"}, {"rank0_only", "False"}}}};
  s.info.deterministic = false;
  s.info.observations.Add(ObservationKey::IntegerMap(
      "all_gathers",
      "the flat-parameter all-gathers (all_gather_into_tensor or the list all_gather) of "
      "\"backward\": the backward after an empty summon_full_params between its forward and it; "
      "\"forward\": the forward after another empty summon_full_params that followed that "
      "backward"));
  s.skip = [](const CaseParams& p, int world) -> std::optional<std::string> {
    if (p.GetBool("offload_to_cpu") && !Sharded(DecodeCase(p), world)) {
      return "summon_full_params(offload_to_cpu=True) without sharding: PyTorch raises "
             "\"offload_to_cpu=True and NO_SHARD is not supported yet\"";
    }
    return std::nullopt;
  };
  s.run_rank = RunRespectsReshardRank;
  s.expect = ExpectRespectsReshard;
  s.judge = [](const CaseParams& p, int world, const std::vector<nlohmann::json>& per_rank,
               CheckList& checks) {
    const std::vector<nlohmann::json> expected = ExpectRespectsReshard(p, world);
    for (int r = 0; r < world; ++r) {
      checks.CheckEqual(RankName(r) + " all-gathers after summon_full_params",
                        RankObservation(expected, r, "all_gathers"),
                        RankObservation(per_rank, r, "all_gathers"));
    }
  };
  return s;
}

}  // namespace

void RegisterFsdpUnshardParamsScenarios(ScenarioRegistry& registry) {
  registry.Add(MakeWithGradsCore());
  registry.Add(MakeWithGradsNoneGrads());
  registry.Add(MakeUnshardParamsWriteback());
  registry.Add(MakeOrigParamDataWriteback());
  registry.Add(MakeWithGradsRank0Only());
  registry.Add(MakeClipGradNormIgnoredModules());
  registry.Add(MakeBackwardWithInputs());
  registry.Add(MakeUnshardParamsErrors());
  registry.Add(MakeUnshardParamsRespectsReshard());
}

}  // namespace fsdp::conformance
