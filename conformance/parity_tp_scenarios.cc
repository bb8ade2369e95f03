// Family `parity/tp` (issue 16, FSDP2 × TP; extends seed 003's TP integration to FSDP2): the
// zoo's MLPStack (without and with sequence parallelism) and Transformer parallelised with
// tensor parallelism over mesh_2d["tp"] (conformance/tp_plans.h), then fully_shard per block
// and on the root over mesh_2d["dp"] (ChildrenToShard, less the norms the plan runs
// SequenceParallel on, which stay in the root's group as MLPStack.parallelize leaves its
// LayerNorm), trained `steps` steps with the case's optimizer against the
// oracle's data-parallel run over dp ranks (reference/, double). Mesh (dp, tp) from the
// parameters: world = dp * tp, rank r at (r / tp, r % tp) (init_device_mesh's layout); every
// rank of a TP group gets its dp index's batch. With `replicate` r > 1 the run is HSDP × TP
// (PyTorch's 3-D recipe): mesh (dp_replicate = r, dp_shard = dp / r, tp), fully_shard over
// mesh_3d[("dp_replicate", "dp_shard")]; parameters are sharded over dp_shard only.
//
// Observations per rank: its losses (under sequence parallelism the output is the rank's
// Shard(1) piece of the sequence and its loss the Partial sum over it, loss.to_local(): the
// oracle's loss of that torch.chunk piece of the rank's batch, which MLPStack computes position
// by position), its local parameter and gradient shards per step (the
// nested torch.chunk of tp_plans.h, over the shard group), the full parameters after the last
// step (full_tensor(), gathered over the shard group and tp), the global shape and offsets of
// every value of the model's state_dict() after it (the 2-D DTensor of each parameter: its TP
// piece's offset along the TP dim plus its dp chunk's along dim 0, as
// compute_local_shape_and_global_offset plans it for torch.distributed.checkpoint) and the
// collectives of every step's forward and backward. The counts are derived from the FSDP groups and
// the placements: per FSDP group with parameters one c10d all-gather in forward, one in backward
// unless it is the root (kept unsharded after forward) and one reduce-scatter (no all-gathers over
// a shard group of one rank), plus under HSDP one c10d all-reduce over the replicate group in
// backward; per RowwiseParallel whose output_layouts is Replicate() one functional all-reduce in
// forward (its Partial output to Replicate), per one whose output_layouts is Shard(d) one
// functional reduce-scatter in forward and one functional all-gather in backward (its
// gradient, Shard(d) to Replicate); per ColwiseParallel whose input needs a gradient one
// functional all-reduce in backward (its input's Partial gradient); per parameter of a
// SequenceParallel module one functional all-reduce in backward (its Partial gradient to
// Replicate).
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "conformance/fsdp_params.h"
#include "conformance/model_zoo.h"
#include "conformance/observations.h"
#include "conformance/parity_common.h"
#include "conformance/rank_checks.h"
#include "conformance/scenario_registry.h"
#include "conformance/sharded_parity.h"
#include "conformance/state_dict_model.h"
#include "conformance/tp_plans.h"
#include "engine/autograd/grad_mode.h"
#include "engine/distributed/comm_debug_mode.h"
#include "engine/distributed/device_mesh.h"
#include "engine/fsdp/fully_shard.h"
#include "engine/tensor_parallel/parallel_style.h"
#include "reference/loss.h"
#include "reference/sharding.h"

namespace fsdp::conformance {

namespace {

constexpr const char* kFamily = "parity/tp";
constexpr const char* kStepCommCounts = "step_comm_counts";
constexpr const char* kStateDictSharding = "state_dict_sharding";
using Counts = distributed::CommDebugMode::Counts;

// The case's (dp, tp) at `world`: tp from the parameters, dp from the parameters or world / tp;
// under HSDP (replicate > 1) dp = replicate × shard.
struct MeshShape {
  int dp = 1;
  int tp = 1;
  int replicate = 1;
  int shard() const { return dp / replicate; }
  // A rank's index in its dp shard group (init_device_mesh's row-major layout).
  int shard_index(int rank) const { return (rank / tp) % shard(); }
};
MeshShape MeshShapeOf(const CaseParams& params, int world) {
  MeshShape m;
  m.tp = static_cast<int>(params.GetInt("tp"));
  const int64_t dp = params.GetInt("dp");
  m.dp = dp > 0 ? static_cast<int>(dp) : world / m.tp;
  m.replicate = static_cast<int>(params.GetInt("replicate"));
  return m;
}

std::optional<std::string> SkipMeshNotWorld(const CaseParams& params, int world) {
  const MeshShape m = MeshShapeOf(params, world);
  if (m.dp < 1 || static_cast<int64_t>(m.dp) * m.tp != world) {
    return "the (dp, tp) = (" + std::to_string(m.dp) + ", " + std::to_string(m.tp) +
           ") mesh does not multiply to world size " + std::to_string(world);
  }
  if (m.dp % m.replicate != 0) {
    return "HSDP's replicate size " + std::to_string(m.replicate) + " does not divide dp " +
           std::to_string(m.dp);
  }
  return std::nullopt;
}

// The modules fully_shard runs on before the root: ChildrenToShard's, less the norms `plan`
// runs SequenceParallel on (MLPStack.parallelize: `if isinstance(module, nn.LayerNorm):
// continue`), whose parameters stay in the root's group.
std::vector<nn::ModulePtr> TpChildrenToShard(const nn::ModulePtr& root,
                                             const tensor_parallel::ParallelizePlan& plan) {
  std::set<const nn::Module*> sequence_parallel;
  for (const auto& [fqn, style] : plan) {
    if (dynamic_cast<const tensor_parallel::SequenceParallel*>(style.get()) != nullptr) {
      sequence_parallel.insert(root->get_submodule(fqn).get());
    }
  }
  std::vector<nn::ModulePtr> out;
  for (const nn::ModulePtr& child : ChildrenToShard(root)) {
    if (!sequence_parallel.count(child.get())) out.push_back(child);
  }
  return out;
}

// With `tp_src_only`, a rank off tensor-parallel index 0 zeroes the parameters of the plan's
// ColwiseParallel and RowwiseParallel modules before parallelize_module: their styles
// distribute_tensor them with src_data_rank=0 (ParallelStyle.src_data_rank's default; PyTorch
// 2.5 always scatters Shard and broadcasts Replicate from group rank 0), so every rank's pieces
// hold tp index 0's values and the run still matches the oracle. SequenceParallel's norms are
// left alone: its _replicate_module_fn keeps each rank's own values (from_local).
void ZeroDistributedParametersOffSource(const tensor_parallel::ParallelizePlan& plan,
                                        nn::Module& module) {
  autograd::NoGradGuard no_grad;
  for (const auto& [fqn, style] : plan) {
    if (dynamic_cast<const tensor_parallel::ColwiseParallel*>(style.get()) == nullptr &&
        dynamic_cast<const tensor_parallel::RowwiseParallel*>(style.get()) == nullptr) {
      continue;
    }
    for (Tensor p : module.get_submodule(fqn)->parameters()) p.zero_();
  }
}

tensor_parallel::ParallelizePlan PlanOf(const std::string& kind, const nn::Module& module) {
  std::vector<std::string> names;
  for (const auto& [name, param] : module.named_parameters()) names.push_back(name);
  return ZooTpPlan(kind, names);
}

// Every rank of dp index i gets the oracle's dp rank i's batches.
InputsFn TpInputs(const std::string& kind) {
  return [kind](const CaseParams& params, int world) {
    const ParityCase c = DecodeParityCase(kind, params);
    const MeshShape m = MeshShapeOf(params, world);
    CaseInputs dp_inputs = c.model.MakeCaseInputs(c.seed, c.dtype, c.steps, m.dp);
    CaseInputs inputs;
    inputs.weights = std::move(dp_inputs.weights);
    for (int r = 0; r < world; ++r) inputs.ranks.push_back(dp_inputs.ranks.at(r / m.tp));
    return inputs;
  };
}

ObservationSchema TpParitySchema() {
  ObservationSchema schema = TrainingSchema(
      "the rank's local shard: the TP piece (the style's placement over tp; whole for parameters "
      "no style shards), then torch.chunk(piece, dp, dim=0)[dp index]",
      /*with_grads=*/true);
  for (ObservationKey& key : schema.keys) {
    if (key.key != kLosses) continue;
    key = ObservationKey::Losses(
        "the rank's loss of every step, in order: of its dp index's batch; where the model's "
        "output is sequence-sharded (mlp_stack_seq_parallel: Shard(1)), the rank's Partial sum, "
        "loss.to_local(): the loss of its torch.chunk piece of the batch's sequence (dim 1)");
  }
  schema.AddTensors({"full/{fqn}", "the case's dtype", "the full parameter",
                     "every parameter after the last step, all-gathered over dp and tp "
                     "(full_tensor())"});
  schema.Add(ObservationKey::Custom(
      kStateDictSharding, {{"type", "object"}},
      "per key of the model's state_dict() after the last step: {\"global_shape\", "
      "\"offsets\"} of its DTensor value (compute_local_shape_and_global_offset), null for a "
      "plain tensor"));
  schema.Add(ObservationKey::Custom(
      kStepCommCounts, {{"type", "array"}, {"items", ObservationKey::CommCounts("").schema}},
      "per training step, the collectives of its forward and of its backward: {\"forward\": {op: "
      "n}, \"backward\": {op: n}} with CommDebugMode's op keys"));
  return schema;
}

// The collectives of one step on every rank, derived as the file comment says.
nlohmann::json ExpectedStepCounts(const std::string& kind, const ParityCase& c,
                                  const MeshShape& m) {
  nn::ModulePtr module = c.model.BuildEngine();
  std::vector<std::string> names;
  for (const auto& [name, param] : module->named_parameters()) names.push_back(name);
  const tensor_parallel::ParallelizePlan plan = ZooTpPlan(kind, names);
  int64_t groups = 0;
  int64_t non_root_groups = 0;
  std::set<const TensorImpl*> in_children;
  for (const nn::ModulePtr& child : TpChildrenToShard(module, plan)) {
    bool has_params = false;
    for (const auto& [name, param] : child->named_parameters()) {
      has_params = in_children.insert(param.impl()).second || has_params;
    }
    groups += has_params ? 1 : 0;
    non_root_groups += has_params ? 1 : 0;
  }
  for (const auto& [name, param] : module->named_parameters()) {
    if (!in_children.count(param.impl())) {
      ++groups;  // the root's own group
      break;
    }
  }
  int64_t rowwise_replicate = 0;
  int64_t rowwise_shard = 0;
  int64_t sequence_parallel_params = 0;
  for (const auto& [fqn, style] : plan) {
    if (const auto* rowwise = dynamic_cast<const tensor_parallel::RowwiseParallel*>(style.get())) {
      (rowwise->output_layouts().is_shard() ? rowwise_shard : rowwise_replicate) += 1;
    }
    if (dynamic_cast<const tensor_parallel::SequenceParallel*>(style.get()) != nullptr) {
      sequence_parallel_params +=
          static_cast<int64_t>(module->get_submodule(fqn)->named_parameters().size());
    }
  }
  int64_t colwise_with_input_grad = 0;
  for (const std::string& fqn : PlannedModulesWithInputGrad(names, plan)) {
    for (const auto& [planned, style] : plan) {
      if (planned == fqn) {
        colwise_with_input_grad +=
            dynamic_cast<const tensor_parallel::ColwiseParallel*>(style.get()) != nullptr;
      }
    }
  }
  // FSDP over a shard group of one rank skips its all-gathers (the local shard is the
  // parameter) but still reduce-scatters (docs/fsdp-behaviour.md, "All-gather"); HSDP then
  // all-reduces each group's gradients over the replicate group.
  const int64_t all_gathers = m.shard() == 1 ? 0 : groups;
  const int64_t backward_all_gathers = m.shard() == 1 ? 0 : non_root_groups;
  Counts forward{{"c10d._allgather_base_", all_gathers},
                 {"c10d_functional.all_reduce", rowwise_replicate},
                 {"c10d_functional.reduce_scatter_tensor", rowwise_shard}};
  Counts backward{
      {"c10d._allgather_base_", backward_all_gathers},
      {"c10d._reduce_scatter_base_", groups},
      {"c10d.allreduce_", m.replicate > 1 ? groups : 0},
      {"c10d_functional.all_gather_into_tensor", rowwise_shard},
      {"c10d_functional.all_reduce", colwise_with_input_grad + sequence_parallel_params}};
  for (Counts* counts : {&forward, &backward}) {
    for (auto it = counts->begin(); it != counts->end();) {
      it = it->second == 0 ? counts->erase(it) : std::next(it);
    }
  }
  return PhaseCommCountsJson(forward, backward);
}

nlohmann::json RunTpParityRank(const std::string& kind, RankEnv& env) {
  const ParityCase c = DecodeParityCase(kind, env.params);
  const MeshShape m = MeshShapeOf(env.params, env.world);
  const std::string device_type = env.device.is_cuda() ? "cuda" : "cpu";
  // (dp, tp), or under HSDP (replicate, shard, tp) with fully_shard over
  // mesh_3d[("dp_replicate", "dp_shard")].
  const auto mesh =
      m.replicate > 1
          ? distributed::DeviceMesh::Init(env.pg, device_type, {m.replicate, m.shard(), m.tp},
                                          {"dp_replicate", "dp_shard", "tp"})
          : distributed::DeviceMesh::Init(env.pg, device_type, {m.dp, m.tp}, {"dp", "tp"});
  nn::ModulePtr module = c.model.BuildEngineFromInputs(env.Inputs(), c.dtype);
  module->to(env.device);
  const tensor_parallel::ParallelizePlan plan = PlanOf(kind, *module);
  if (env.params.GetBool("tp_src_only") && env.rank % m.tp != 0) {
    ZeroDistributedParametersOffSource(plan, *module);
  }
  ParallelizeZooModel(kind, *module, (*mesh)["tp"]);
  fsdp2::FullyShardOptions options;
  options.mesh = m.replicate > 1 ? mesh->slice({"dp_replicate", "dp_shard"}) : (*mesh)["dp"];
  options.semantics = SemanticsOf(env.params);
  for (const nn::ModulePtr& child : TpChildrenToShard(module, plan)) {
    fsdp2::fully_shard(child, options);
  }
  fsdp2::fully_shard(module, options);

  // Each step's forward is counted from the root's first forward pre-hook to its forward hook,
  // its backward from there to the gradient snapshot.
  distributed::CommDebugMode comm_mode;
  comm_mode.exit();
  Counts forward;
  nlohmann::json step_counts = nlohmann::json::array();
  nn::ForwardPreHookOptions first;
  first.prepend = true;
  module->register_forward_pre_hook(
      [&comm_mode](nn::Module&, const nn::Value&) -> std::optional<nn::Value> {
        comm_mode.enter();
        return std::nullopt;
      },
      first);
  module->register_forward_hook(
      [&](nn::Module&, const nn::Value&, const nn::Value&) -> std::optional<nn::Value> {
        comm_mode.exit();
        forward = comm_mode.get_comm_counts();
        comm_mode.enter();
        return std::nullopt;
      });
  const EngineTrainingRecord record = TrainEngine(
      c.model, *module, c.optim, env.Inputs(), c.steps, LocalParameterShards, [&](nn::Module& mod) {
        comm_mode.exit();
        step_counts.push_back(PhaseCommCountsJson(forward, comm_mode.get_comm_counts()));
        return LocalGradientShards(mod);
      });
  nlohmann::json obs = TrainingObservations(record, c.dtype);
  obs[kTensors].update(MapToJson(FullShardedParameters(*module), DTypeName(c.dtype), "full/"));
  obs[kStepCommCounts] = std::move(step_counts);
  obs[kStateDictSharding] = StateDictShardingJson(module->state_dict());
  return obs;
}

// Rank `rank`'s loss of step `step` under sequence parallelism: the model's loss on its
// torch.chunk piece of the sequence (dim 1) of its dp index's batch, from `params` (those
// before the step); MLPStack computes position by position, so this is the Partial sum the
// rank's sequence-sharded output gives.
double SequencePieceLoss(const ParityCase& c, const reference::RefTensorMap& params, int64_t step,
                         const MeshShape& m, int rank) {
  reference::ModelInput<double> input =
      c.model.MakeInput(c.seed, step, c.dtype, m.dp * c.model.batch())
          .RankSlice(rank / m.tp, m.dp)
          .oracle;
  input.features = NestedShardOf(*input.features, tensor_parallel::Placement::Shard(1),
                                 /*dp_rank=*/0, /*dp=*/1, rank % m.tp, m.tp);
  const auto forward =
      c.model.oracle().Forward(params, c.model.MakeBuffers(c.seed, c.dtype), input);
  return reference::ComputeLoss(c.model.LossAt(step), forward.outputs).loss;
}

// {"global_shape", "offsets"} of `full`'s 2-D (dp, tp) DTensor on rank (dp_rank, tp_rank):
// the TP piece's offset along its dim (torch.chunk's: the dim's size for an empty piece), then
// the dp chunk's along dim 0 of that piece, added to it (FSDP's Shard(0), _StridedShard over a
// TP Shard(0)).
nlohmann::json ExpectedTpSharding(const reference::Shape& full,
                                  const std::optional<tensor_parallel::Placement>& tp_placement,
                                  int dp_rank, int dp, int tp_rank, int tp) {
  std::vector<int64_t> offsets(full.size(), 0);
  int64_t tp_local_rows = full.at(0);
  if (tp_placement && tp_placement->is_shard()) {
    const auto dim =
        static_cast<size_t>(tp_placement->normalized(static_cast<int64_t>(full.size())).dim());
    const reference::ChunkLayout layout = reference::MakeChunkLayout(full[dim], tp);
    offsets[dim] = layout.RowOffset(tp_rank);
    if (dim == 0) tp_local_rows = layout.RowsOnRank(tp_rank);
  }
  offsets[0] += reference::MakeChunkLayout(tp_local_rows, dp).RowOffset(dp_rank);
  return {{"global_shape", full}, {"offsets", offsets}};
}

std::vector<nlohmann::json> ExpectTpParity(const std::string& kind, const CaseParams& params,
                                           int world) {
  const ParityCase c = DecodeParityCase(kind, params);
  const MeshShape m = MeshShapeOf(params, world);
  const auto oracle = TrainOracle(c.model, c.optim, c.seed, c.steps, c.dtype, m.dp);
  const auto placements = ZooTpPlacements(kind, c.model.ParameterNames());
  const std::string dtype = DTypeName(c.dtype);
  const nlohmann::json step_counts = ExpectedStepCounts(kind, c, m);
  auto shards = [&](const reference::RefTensorMap& full, int rank) {
    reference::RefTensorMap out;
    for (const auto& [name, tensor] : full) {
      auto it = placements.find(name);
      out[name] = NestedShardOf(tensor,
                                it == placements.end()
                                    ? std::nullopt
                                    : std::optional<tensor_parallel::Placement>(it->second),
                                m.shard_index(rank), m.shard(), rank % m.tp, m.tp);
    }
    return out;
  };
  const reference::RefTensorMap initial = c.model.MakeParameters(c.seed, c.dtype);
  // The state dict's keys, each with the parameter it holds (a tied weight's other location
  // holds its owner's DTensor).
  std::vector<std::pair<std::string, std::string>> state_dict_keys;
  {
    const nn::ModulePtr module = c.model.BuildEngine();
    std::map<const TensorImpl*, std::string> owner;
    for (const auto& [name, param] : module->named_parameters()) owner.emplace(param.impl(), name);
    for (const auto& [name, param] :
         module->named_parameters("", /*recurse=*/true, /*remove_duplicate=*/false)) {
      state_dict_keys.emplace_back(name, owner.at(param.impl()));
    }
  }
  std::vector<nlohmann::json> expected(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    nlohmann::json& e = expected[static_cast<size_t>(r)];
    e[kLosses] = nlohmann::json::array();
    e["loss_dtype"] = DTypeName(ZooModel::Kind(kind).LossDType(c.dtype));
    e[kTensors] = nlohmann::json::object();
    e[kStepCommCounts] = nlohmann::json::array();
    e[kStateDictSharding] = nlohmann::json::object();
    for (const auto& [key, owner] : state_dict_keys) {
      auto it = placements.find(owner);
      e[kStateDictSharding][key] = ExpectedTpSharding(
          initial.at(owner).shape,
          it == placements.end() ? std::nullopt
                                 : std::optional<tensor_parallel::Placement>(it->second),
          m.shard_index(r), m.shard(), r % m.tp, m.tp);
    }
    for (int64_t k = 0; k < c.steps; ++k) {
      const auto& step = oracle[static_cast<size_t>(k)];
      double loss = step.rank_losses.at(r / m.tp);
      if (ZooTpOutputIsSequenceSharded(kind)) {
        loss = SequencePieceLoss(c, k == 0 ? initial : oracle[static_cast<size_t>(k - 1)].params, k,
                                 m, r);
      }
      e[kLosses].push_back(loss);
      e[kTensors].update(MapToJson(shards(step.grads, r), dtype, GradPrefix(k)));
      e[kTensors].update(MapToJson(shards(step.params, r), dtype, StepPrefix(k)));
      e[kStepCommCounts].push_back(step_counts);
    }
    e[kTensors].update(MapToJson(oracle.back().params, dtype, "full/"));
  }
  return expected;
}

void JudgeTpParity(const std::string& kind, const CaseParams& params, int world,
                   const std::vector<nlohmann::json>& per_rank, CheckList& checks) {
  const ParityCase c = DecodeParityCase(kind, params);
  const std::vector<nlohmann::json> expected = ExpectTpParity(kind, params, world);
  ErrorStats param_err;
  ErrorStats grad_err;
  const auto grad_scales = GradientScales(expected, c.steps);
  for (int r = 0; r < world; ++r) {
    CheckRankShardedParity(checks, c, expected, grad_scales, per_rank, r, param_err, grad_err);
    checks.CheckEqual(RankName(r) + " collectives of every step's forward and backward",
                      RankObservation(expected, r, kStepCommCounts),
                      RankObservation(per_rank, r, kStepCommCounts));
    checks.CheckEqual(RankName(r) + " state_dict() global shapes and offsets",
                      RankObservation(expected, r, kStateDictSharding),
                      RankObservation(per_rank, r, kStateDictSharding));
  }
  const MeshShape m = MeshShapeOf(params, world);
  checks.SetFigure("dp", m.dp);
  checks.SetFigure("tp", m.tp);
  checks.SetFigure("replicate", m.replicate);
  checks.SetFigure("steps", c.steps);
  checks.SetFigure("param_max_abs_err", param_err.max_abs);
  checks.SetFigure("grad_max_abs_err", grad_err.max_abs);
}

Scenario MakeScenario(const ZooModelKind& kind) {
  Scenario s;
  s.info.name = std::string(kFamily) + "/" + kind.name;
  s.info.description = kind.description +
                       ": tensor parallel over mesh_2d[\"tp\"], then fully_shard per block and "
                       "root over mesh_2d[\"dp\"], vs the oracle's data-parallel run over dp; "
                       "every rank's shards, losses and per-step collectives";
  s.info.seed_test =
      kind.name == "mlp_stack_seq_parallel"
          ? kind.seed_test
          : "test_fully_shard_training.py::TestFullyShard2DTraining::test_train_parity_2d_" +
                std::string(kind.name == "transformer" ? "transformer" : "mlp");
  s.info.params = ParityParams(
      kind, ParamSpec::SizeString("dtype", "the engine's parameter and input dtype", "float32"));
  s.info.params.push_back(
      ParamSpec::SizeInt("tp", "tensor-parallel size (mesh dim \"tp\")", 2, /*minimum=*/2));
  s.info.params.push_back(ParamSpec::SizeInt(
      "dp", "data-parallel size (mesh dim \"dp\"); 0: world / tp", 0, /*minimum=*/0));
  s.info.params.push_back(ParamSpec::SizeInt(
      "replicate",
      "HSDP replicate size: 1 is FSDP over dp; r > 1 is HSDP × TP on a (dp_replicate = r, "
      "dp_shard = dp / r, tp) mesh, fully_shard over mesh_3d[(\"dp_replicate\", \"dp_shard\")]",
      1, /*minimum=*/1));
  s.info.params.push_back(ParamSpec::SizeBool(
      "tp_src_only",
      "ranks off tp index 0 zero the parameters of the plan's ColwiseParallel / RowwiseParallel "
      "modules before parallelize_module: distribute_tensor's src_data_rank=0 (the default) must "
      "hand every rank tp index 0's pieces",
      false));
  s.info.observations = TpParitySchema();
  s.info.deterministic = true;
  s.info.default_world = 4;
  s.info.min_world = 2;
  s.info.max_world = 8;
  // HSDP × TP on (2, 2, 2) in every default run, beside FSDP × TP at the run's world; its
  // tp-index-1 ranks start from zeroed tensor-parallel parameters (distribute_tensor's
  // src_data_rank).
  s.info.extra_default_runs = {{8, {{"replicate", "2"}, {"tp_src_only", "True"}}}};
  // A tp size that divides none of MLPStack's sharded dims: torch.chunk's uneven pieces (the
  // last rank's shorter) in every colwise/rowwise weight, bias and activation. The Transformer
  // shards whole heads, so its tp must divide n_heads.
  if (kind.name == "mlp_stack") s.info.extra_default_runs.push_back({3, {{"tp", "3"}}});
  s.skip = SkipMeshNotWorld;
  const std::string name = kind.name;
  s.info.inputs = ZooInputsDoc(kind, "the case's dtype");
  s.inputs = TpInputs(name);
  s.expect = [name](const CaseParams& p, int world) { return ExpectTpParity(name, p, world); };
  s.run_rank = [name](RankEnv& env) { return RunTpParityRank(name, env); };
  s.judge = [name](const CaseParams& p, int world, const std::vector<nlohmann::json>& per_rank,
                   CheckList& checks) { JudgeTpParity(name, p, world, per_rank, checks); };
  return s;
}

}  // namespace

void RegisterParityTpScenarios(ScenarioRegistry& registry) {
  for (const char* kind : {"mlp_stack", "mlp_stack_seq_parallel", "transformer"}) {
    registry.Add(MakeScenario(ZooModel::Kind(kind)));
  }
}

}  // namespace fsdp::conformance
