// Family `fsdp_tp_integration` (seed 003, test_fsdp_tp_integration.py::TestTPFSDPIntegration):
// FullyShardedDataParallel (FSDP1) over tensor-parallel models on the (dp, tp) mesh
// init_device_mesh((world / tp, tp), mesh_dim_names=("dp", "tp")) (parameter `tp`, default 2;
// a world that tp does not divide, or tp < 2, skips with the reason).
//
//   fsdp_tp_integration      SimpleModel with net1 ColwiseParallel(input_layouts=Shard(0)), net2
//                            RowwiseParallel(output_layouts=Shard(0)), net3 plain, wrapped on
//                            mesh_2d["dp"] (cpu_offload x sharding_strategy x use_orig_params),
//                            beside the same model wrapped alone on the whole world (FSDP-only,
//                            cpu_offload only, as the seed). Each rank feeds both its own
//                            [2, 3, 5] batch. The seed's _sync_tp_grads turns the TP gradients
//                            into FSDP-only ones (the flat gradient's plain-parameter elements
//                            summed over tp, then every element divided by tp); both models then
//                            take one SGD step and run a second batch. Reported: both outputs of
//                            both steps and both models' full gradients (gathered over dp and,
//                            for TP parameters, over tp); the judge compares each with the
//                            oracle and the two models with each other, as the seed does.
//   fsdp_tp_extension_grad   the seed's TestModel (RMSNormPython replicated with
//                            distribute_module over Shard(0) rows, MLPModule with net1
//                            ColwiseParallel(input_layouts=Shard(0)) and net2
//                            RowwiseParallel(output_layouts=Shard(0))) under FSDP1 on
//                            mesh_2d["dp"]: the collectives of one forward and one backward by
//                            name and phase, derived from the placements (ExpectedTpCounts),
//                            and the gradients (finite, and the oracle's).
//   fsdp_tp_sync_module_state a Replicate() DTensor parameter and a buffer, different on every
//                            rank, under FSDP1(sync_module_states=True) on mesh_2d["dp"]: after
//                            wrapping each rank holds its dp group's first rank's values, equal
//                            across the dp replicas and still different across tp.
//
// PyTorch all-gathers a flat parameter with all_gather_into_tensor on accelerators and with
// the list all_gather on the CPU; the judge counts both as FSDP's all-gather
// (MergeFlatParamAllGathers).
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "conformance/fsdp1_params.h"
#include "conformance/model_zoo.h"
#include "conformance/observations.h"
#include "conformance/rank_checks.h"
#include "conformance/scenario_registry.h"
#include "conformance/tp_models.h"
#include "engine/autograd/grad_mode.h"
#include "engine/core/rng.h"
#include "engine/distributed/comm_debug_mode.h"
#include "engine/distributed/device_mesh.h"
#include "engine/fsdp1/flat_param.h"
#include "engine/fsdp1/fully_sharded_data_parallel.h"
#include "engine/fsdp1/unshard_params.h"
#include "engine/functional/functional.h"
#include "engine/nn/init.h"
#include "engine/nn/models.h"
#include "engine/optim/sgd.h"
#include "engine/tensor_parallel/distribute_module.h"
#include "engine/tensor_parallel/dtensor_parameter.h"
#include "engine/tensor_parallel/parallelize_module.h"
#include "reference/models.h"
#include "reference/optimizers.h"

namespace fsdp::conformance {

namespace {

using tensor_parallel::DTensor;
using tensor_parallel::Placement;

constexpr const char* kSeed003 = "test_fsdp_tp_integration.py::TestTPFSDPIntegration::";
constexpr const char* kFunAllGather = "c10d_functional.all_gather_into_tensor";
constexpr const char* kFunReduceScatter = "c10d_functional.reduce_scatter_tensor";
constexpr const char* kFunAllReduce = "c10d_functional.all_reduce";
constexpr const char* kReduceScatter = "c10d._reduce_scatter_base_";
constexpr const char* kAllReduce = "c10d.allreduce_";

// ---- Common parameters, mesh and inputs ---------------------------------------------------------

struct TpCase {
  int64_t tp = 2;
  uint64_t seed = 0;
  DType dtype = DType::kFloat64;
  Tolerance tolerance;

  static TpCase Decode(const CaseParams& p) {
    TpCase c;
    c.tp = p.GetInt("tp");
    c.seed = static_cast<uint64_t>(p.GetInt("seed"));
    c.dtype = ParseDType(p.GetString("dtype"));
    FSDP_CHECK(c.dtype == DType::kFloat32 || c.dtype == DType::kFloat64,
               "dtype must be float32 or float64, got ", p.GetString("dtype"));
    c.tolerance = c.dtype == DType::kFloat64
                      ? Tolerance{p.GetDouble("atol_float64"), p.GetDouble("rtol_float64")}
                      : Tolerance{p.GetDouble("atol"), p.GetDouble("rtol")};
    return c;
  }
  int64_t dp(int world) const { return world / tp; }
};

std::vector<ParamSpec> CommonParams() {
  return {ParamSpec::SizeInt("tp", "tensor-parallel size: the mesh is (world / tp, tp)", 2,
                             /*minimum=*/1),
          ParamSpec::SizeInt("seed", "seed of the weights and of every rank's inputs", 0),
          ParamSpec::SizeString("dtype", "parameter and input dtype: float32 or float64", "float64"),
          ParamSpec::SizeDouble("atol", "absolute tolerance for float32", 1e-5),
          ParamSpec::SizeDouble("rtol", "relative tolerance for float32", 1e-4),
          ParamSpec::SizeDouble("atol_float64", "absolute tolerance for float64", 1e-10),
          ParamSpec::SizeDouble("rtol_float64", "relative tolerance for float64", 1e-8)};
}

std::optional<std::string> SkipMesh(const CaseParams& p, int world) {
  const int64_t tp = p.GetInt("tp");
  if (tp < 2) {
    return "tp " + std::to_string(tp) + " leaves nothing tensor-parallel; the seed's mesh has tp 2";
  }
  if (world % tp != 0) {
    return "tp " + std::to_string(tp) + " does not divide world " + std::to_string(world) +
           ": no (dp, tp) mesh";
  }
  return std::nullopt;
}

std::shared_ptr<distributed::DeviceMesh> Mesh2d(const RankEnv& env, int64_t tp) {
  return distributed::DeviceMesh::Init(env.pg, env.device.is_cuda() ? "cuda" : "cpu",
                                       {env.world / tp, tp}, {"dp", "tp"});
}

// torch.rand(shape) of rank r's stream `stream` (the seed reseeds per rank and per batch).
Tensor RankRand(const Shape& shape, uint64_t seed, int rank, uint64_t stream, DType dtype) {
  Generator gen(seed * 1000003 + 7919 * static_cast<uint64_t>(rank) + 104729 * stream + 1);
  return Tensor::rand(shape, DType::kFloat64, &gen).to(dtype);
}

reference::RefTensorMap WeightsToRef(const NamedTensors& weights) {
  reference::RefTensorMap out;
  for (const auto& [key, t] : weights) out[key] = ToRef(t);
  return out;
}

const Tensor& InputOf(const CaseInputs& inputs, int rank, const std::string& name) {
  for (const auto& [key, t] : inputs.ranks.at(static_cast<size_t>(rank))) {
    if (key == name) return t;
  }
  FSDP_THROW(ErrorCode::kNotFound, "fsdp_tp_integration: rank ", rank, " has no input ", name);
}

reference::ModelInput<double> Features(const Tensor& t) {
  reference::ModelInput<double> in;
  in.features = ToRef(t);
  return in;
}

// ---- FSDP1 gradients -----------------------------------------------------------------------------

// The unsharded gradient of every parameter `handle` flattened (its sharded flat gradient
// all-gathered over the FSDP group, unflattened), by clean FQN: TP-local pieces for TP
// parameters.
std::map<std::string, Tensor> UnshardedGradients(const fsdp1::FlatParamHandle& handle) {
  const Tensor shard = handle.sharded_grad();
  FSDP_CHECK(shard.defined(), "fsdp_tp_integration: the flat parameter has no gradient");
  const int64_t n = shard.numel();
  Tensor full = Tensor::zeros({n * handle.world_size()}, shard.dtype());
  std::vector<Tensor> pieces;
  for (int r = 0; r < handle.world_size(); ++r) pieces.push_back(full.narrow(0, r * n, n));
  handle.options().process_group->all_gather(pieces, shard.to(Device::CPU()))->wait();
  std::map<std::string, Tensor> out;
  int64_t offset = 0;
  size_t idx = 0;
  const fsdp1::FlatParamLayout& layout = handle.layout();
  for (size_t i = 0; i < layout.numels_with_padding.size(); ++i) {
    if (!layout.is_padding_mask[i]) {
      out[handle.fqns()[idx]] =
          full.narrow(0, offset, layout.numels_with_padding[i]).view(handle.shapes()[idx]);
      ++idx;
    }
    offset += layout.numels_with_padding[i];
  }
  return out;
}

// Every flattened parameter's full gradient: TP parameters' pieces gathered over the TP mesh
// (DTensor.full_tensor()), plain ones as they are.
std::map<std::string, Tensor> FullGradients(const fsdp1::FlatParamHandle& handle) {
  std::map<std::string, Tensor> grads = UnshardedGradients(handle);
  for (size_t i = 0; i < handle.fqns().size(); ++i) {
    const std::optional<DTensor>& dt = handle.param_extensions()[i];
    if (!dt) continue;
    Tensor& g = grads.at(handle.fqns()[i]);
    g = DTensor::from_local(g, dt->device_mesh(), dt->placements(), dt->shape()).full_tensor();
  }
  return grads;
}

// The seed's _sync_tp_grads on the sharded flat gradient the optimizer will use: the
// elements of plain (non-TP) parameters become their sum over the TP group, then every element
// is divided by tp, "following the data parallel paradigm where gradients are averaged over
// ranks". TP parameters' gradients already sum over the TP group's rows.
void SyncTpGrads(const fsdp1::FlatParamHandle& handle, distributed::ProcessGroup& tp_group) {
  Tensor grad = handle.flat_param().grad();  // shares the optimizer's gradient
  FSDP_CHECK(grad.defined(), "fsdp_tp_integration: the flat parameter has no gradient");
  autograd::NoGradGuard no_grad;
  Tensor summed = grad.clone();
  tp_group.all_reduce(summed)->wait();
  for (size_t i = 0; i < handle.shard_param_infos().size(); ++i) {
    const fsdp1::ShardParamInfo& info = handle.shard_param_infos()[i];
    if (handle.param_extensions()[i] || !info.in_shard) continue;
    Tensor mine = grad.narrow(0, info.offset_in_shard, info.numel_in_shard);
    mine.copy_(summed.narrow(0, info.offset_in_shard, info.numel_in_shard));
  }
  grad.copy_(grad * (1.0 / tp_group.size()));
}

nlohmann::json GradientsJson(const std::map<std::string, Tensor>& grads, const std::string& prefix) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [fqn, g] : grads) out[prefix + fqn] = TensorToJson(g.to(Device::CPU()));
  return out;
}

// ---- fsdp_tp_integration -------------------------------------------------------------------------

constexpr int64_t kSteps = 2;  // the seed's two batches (before and after the SGD step)

std::string StepInput(int64_t k) { return StepInputName(k); }

CaseInputs IntegrationInputs(const CaseParams& params, int world) {
  const TpCase c = TpCase::Decode(params);
  nn::ManualSeed(c.seed);
  nn::SimpleModel model;
  CaseInputs inputs;
  inputs.weights = WeightsOf(model, c.dtype);
  inputs.ranks.resize(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    for (int64_t k = 0; k < kSteps; ++k) {
      inputs.ranks[static_cast<size_t>(r)].emplace_back(
          StepInput(k), RankRand({2, 3, 5}, c.seed, r, static_cast<uint64_t>(k), c.dtype));
    }
  }
  return inputs;
}

fsdp1::ShardingStrategy IntegrationStrategy(const CaseParams& p) {
  // The seed's `None` is the constructor default, FULL_SHARD.
  return ParseShardingStrategy(p.GetString("sharding_strategy"));
}

nlohmann::json RunIntegrationRank(RankEnv& env) {
  const TpCase c = TpCase::Decode(env.params);
  const double lr = env.params.GetDouble("lr");
  const bool offload = env.params.GetBool("cpu_offload");
  auto mesh_2d = Mesh2d(env, c.tp);
  auto tp_mesh = (*mesh_2d)["tp"];

  auto load = [&]() {
    auto m = std::make_shared<nn::SimpleModel>();
    m->to(c.dtype);
    m->load_state_dict(env.Inputs().weights());
    m->to(env.device);
    return m;
  };
  // FSDP-only: the whole world, cpu_offload only (the seed's FSDP(model, cpu_offload, mesh_1d)).
  fsdp1::FullyShardedDataParallelOptions fsdp_options;
  fsdp_options.device_mesh = distributed::DeviceMesh::Init(
      env.pg, env.device.is_cuda() ? "cuda" : "cpu", {static_cast<int64_t>(env.world)});
  fsdp_options.cpu_offload.offload_params = offload;
  auto fsdp_model = std::make_shared<fsdp1::FullyShardedDataParallel>(load(), fsdp_options);

  auto tp_model = load();
  tensor_parallel::ParallelStyleOptions net1;
  net1.input_layouts = Placement::Shard(0);
  tensor_parallel::ParallelStyleOptions net2;
  net2.output_layouts = Placement::Shard(0);
  tensor_parallel::parallelize_module(
      *tp_model, tp_mesh,
      {{"net1", std::make_shared<tensor_parallel::ColwiseParallel>(net1)},
       {"net2", std::make_shared<tensor_parallel::RowwiseParallel>(net2)}});
  fsdp1::FullyShardedDataParallelOptions tp_options;
  tp_options.device_mesh = (*mesh_2d)["dp"];
  tp_options.cpu_offload.offload_params = offload;
  tp_options.sharding_strategy = IntegrationStrategy(env.params);
  tp_options.use_orig_params = env.params.GetBool("use_orig_params");
  auto tp_fsdp_model = std::make_shared<fsdp1::FullyShardedDataParallel>(tp_model, tp_options);

  nlohmann::json obs;
  obs[kTensors] = nlohmann::json::object();
  auto forward = [&](nn::Module& m, int64_t k, const std::string& who) {
    const Tensor x = env.Inputs().Get(StepInput(k)).to(env.device);
    Tensor out = m(x).tensor();
    obs[kTensors][who + "/step" + std::to_string(k) + "/output"] =
        TensorToJson(out.detach().to(Device::CPU()));
    return out;
  };
  Tensor fsdp_out = forward(*fsdp_model, 0, "fsdp");
  Tensor tp_fsdp_out = forward(*tp_fsdp_model, 0, "tp_fsdp");
  sum(fsdp_out).backward();
  sum(tp_fsdp_out).backward();
  SyncTpGrads(*tp_fsdp_model->handle, *tp_mesh->get_group(0));
  obs[kTensors].update(GradientsJson(FullGradients(*fsdp_model->handle), "fsdp/grad/"));
  obs[kTensors].update(GradientsJson(FullGradients(*tp_fsdp_model->handle), "tp_fsdp/grad/"));

  optim::SGD fsdp_optim(fsdp_model->parameters(), optim::SGDOptions{.lr = lr});
  optim::SGD tp_fsdp_optim(tp_fsdp_model->parameters(), optim::SGDOptions{.lr = lr});
  fsdp_optim.step();
  tp_fsdp_optim.step();
  forward(*fsdp_model, 1, "fsdp");
  forward(*tp_fsdp_model, 1, "tp_fsdp");
  return obs;
}

// The oracle: each rank's outputs, the FSDP-only gradient (the mean over ranks of each rank's
// gradient of out.sum()), one SGD step with it, each rank's second outputs. Both models must
// report these.
std::vector<nlohmann::json> ExpectIntegration(const CaseParams& params, int world) {
  const TpCase c = TpCase::Decode(params);
  const CaseInputs inputs = IntegrationInputs(params, world);
  const reference::TpSimpleModel<double> model;
  reference::RefTensorMap weights = WeightsToRef(inputs.weights);
  reference::RefTensorMap mean_grads;
  std::vector<reference::LossAndGrads<double>> first(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    first[static_cast<size_t>(r)] = reference::ForwardBackward<double>(
        model, weights, {}, Features(InputOf(inputs, r, StepInput(0))), reference::SumLoss());
    for (const auto& [fqn, g] : first[static_cast<size_t>(r)].grads) {
      reference::RefTensor scaled = g;
      for (double& v : scaled.data) v /= world;
      reference::AccumulateInto(&mean_grads, fqn, scaled);
    }
  }
  reference::Sgd<double> sgd(reference::SgdOptions{.lr = params.GetDouble("lr")});
  reference::RefTensorMap stepped = weights;
  sgd.Step(&stepped, mean_grads);
  const std::string dtype = DTypeName(c.dtype);
  std::vector<nlohmann::json> expected(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    const auto second =
        model.Forward(stepped, {}, Features(InputOf(inputs, r, StepInput(1)))).outputs.at(0);
    nlohmann::json& e = expected[static_cast<size_t>(r)];
    e[kTensors] = nlohmann::json::object();
    for (const char* who : {"fsdp", "tp_fsdp"}) {
      const std::string w = who;
      e[kTensors].update(MapToJson({{"output", first[static_cast<size_t>(r)].outputs.at(0)}}, dtype,
                                   w + "/step0/"));
      e[kTensors].update(MapToJson({{"output", second}}, dtype, w + "/step1/"));
      e[kTensors].update(MapToJson(mean_grads, dtype, w + "/grad/"));
    }
  }
  return expected;
}

void JudgeIntegration(const CaseParams& params, int world, const std::vector<nlohmann::json>& per_rank,
                      CheckList& checks) {
  const TpCase c = TpCase::Decode(params);
  const std::vector<nlohmann::json> expected = ExpectIntegration(params, world);
  ErrorStats grad_err;
  ErrorStats out_err;
  for (int r = 0; r < world; ++r) {
    const std::string who = RankName(r);
    for (const char* model : {"fsdp", "tp_fsdp"}) {
      const std::string m = model;
      for (int64_t k = 0; k < kSteps; ++k) {
        const std::string prefix = m + "/step" + std::to_string(k) + "/";
        out_err.Merge(CheckMapsClose(checks, who + " " + m + " output of batch " + std::to_string(k) +
                                                 " vs oracle",
                                     MapFromObservations(expected, r, prefix),
                                     MapFromObservations(per_rank, r, prefix), c.tolerance));
      }
      grad_err.Merge(CheckMapsClose(checks, who + " " + m + " full gradients vs oracle",
                                    MapFromObservations(expected, r, m + "/grad/"),
                                    MapFromObservations(per_rank, r, m + "/grad/"), c.tolerance));
    }
    // The seed's own comparisons: TP + FSDP against FSDP-only.
    for (int64_t k = 0; k < kSteps; ++k) {
      const std::string step = "/step" + std::to_string(k) + "/";
      CheckMapsClose(checks, who + " tp_fsdp output of batch " + std::to_string(k) + " vs fsdp",
                     MapFromObservations(per_rank, r, "fsdp" + step),
                     MapFromObservations(per_rank, r, "tp_fsdp" + step), c.tolerance);
    }
    CheckMapsClose(checks, who + " tp_fsdp gradients vs fsdp gradients",
                   MapFromObservations(per_rank, r, "fsdp/grad/"),
                   MapFromObservations(per_rank, r, "tp_fsdp/grad/"), c.tolerance);
  }
  checks.SetFigure("dp", c.dp(world));
  checks.SetFigure("tp", c.tp);
  checks.SetFigure("grad_max_abs_err", grad_err.max_abs);
  checks.SetFigure("output_max_abs_err", out_err.max_abs);
}

Scenario MakeIntegration() {
  Scenario s;
  s.info.name = "fsdp_tp_integration/fsdp_tp_integration";
  s.info.description =
      "SimpleModel with net1 colwise and net2 rowwise (Shard(0) activations) under FSDP1 on "
      "mesh_2d[\"dp\"] vs FSDP1 alone: outputs, gradients averaged over tp as the seed does, "
      "outputs after one SGD step, all vs the oracle and vs each other";
  s.info.seed_test = std::string(kSeed003) + "test_fsdp_tp_integration";
  s.info.params = {
      ParamSpec::Axis("cpu_offload", "CPUOffload(offload_params=...)", {"False", "True"}),
      ParamSpec::Axis("sharding_strategy",
                      "FullyShardedDataParallel sharding_strategy of the TP model (the seed's None "
                      "is FULL_SHARD)",
                      {"FULL_SHARD", "SHARD_GRAD_OP"}),
      UseOrigParamsAxis()};
  for (ParamSpec& p : CommonParams()) s.info.params.push_back(std::move(p));
  s.info.params.push_back(ParamSpec::SizeDouble("lr", "SGD learning rate (the seed's LR)", 3e-5));
  s.info.observations.AddTensors(
      {"{name}/step{k}/output", "the case's dtype", "[2, 3, 12]",
       "{name} is fsdp (FSDP1 alone) or tp_fsdp (TP + FSDP1): the rank's output of batch k "
       "(k = 0 before, k = 1 after the SGD step)"});
  s.info.observations.AddTensors(
      {"{name}/grad/{fqn}", "the case's dtype", "the parameter's full shape",
       "the full gradient after the first backward (the TP model's after the seed's "
       "_sync_tp_grads), gathered over dp and, for TP parameters, over tp"});
  s.info.inputs.weights = "the state dict of test_fsdp_tp_integration.py's SimpleModel (net1 "
                          "Linear(5, 8), net2 Linear(8, 4), net3 Linear(4, 12)), in the case's "
                          "dtype";
  s.info.inputs.rank_tensors = {{"step{k}/input", "the case's dtype", "[2, 3, 5]",
                                 "the rank's batch k (torch.rand), k = 0, 1"}};
  s.info.deterministic = true;
  s.info.default_world = 4;
  s.info.min_world = 2;
  s.info.max_world = 8;
  s.info.requirements.devices = {DeviceType::kCPU};
  s.skip = [](const CaseParams& p, int world) -> std::optional<std::string> {
    if (auto reason = SkipMesh(p, world)) return reason;
    if (8 % p.GetInt("tp") != 0) {
      return "tp " + std::to_string(p.GetInt("tp")) +
             " does not divide net1's 8 output features: the seed's _sync_tp_grads all-reduces "
             "flat gradients over tp, which needs the same flat layout on every TP rank";
    }
    return std::nullopt;
  };
  s.inputs = IntegrationInputs;
  s.run_rank = RunIntegrationRank;
  s.expect = ExpectIntegration;
  s.judge = JudgeIntegration;
  return s;
}

// ---- fsdp_tp_extension_grad ----------------------------------------------------------------------

CaseInputs ExtensionInputs(const CaseParams& params, int world) {
  const TpCase c = TpCase::Decode(params);
  TpExtensionModel model;  // MLPModule seeds itself with 5; RMSNormPython's weight is ones
  CaseInputs inputs;
  inputs.weights = WeightsOf(model, c.dtype);
  inputs.ranks.resize(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    inputs.ranks[static_cast<size_t>(r)].emplace_back(StepInput(0),
                                                      RankRand({2, 10}, c.seed, r, 0, c.dtype));
  }
  return inputs;
}

nlohmann::json RunExtensionRank(RankEnv& env) {
  const TpCase c = TpCase::Decode(env.params);
  auto mesh_2d = Mesh2d(env, c.tp);
  auto tp_mesh = (*mesh_2d)["tp"];
  auto model = std::make_shared<TpExtensionModel>();
  model->to(c.dtype);
  model->load_state_dict(env.Inputs().weights());
  model->to(env.device);
  tensor_parallel::ParallelStyleOptions net1;
  net1.input_layouts = Placement::Shard(0);
  tensor_parallel::ParallelStyleOptions net2;
  net2.output_layouts = Placement::Shard(0);
  tensor_parallel::parallelize_module(
      *model, tp_mesh,
      {{"mlp.net1", std::make_shared<tensor_parallel::ColwiseParallel>(net1)},
       {"mlp.net2", std::make_shared<tensor_parallel::RowwiseParallel>(net2)}});
  // The seed's distribute_rmsnorm.
  tensor_parallel::distribute_module(
      *model->get_submodule("mlp_norm"), tp_mesh, nullptr,
      [](nn::Module&, const nn::Value& inputs, const std::shared_ptr<distributed::DeviceMesh>& m) {
        return DTensor::from_local(inputs.is_tensor() ? inputs.tensor() : inputs[0].tensor(), m,
                                   {Placement::Shard(0)});
      },
      [](nn::Module&, const DTensor& outputs, const std::shared_ptr<distributed::DeviceMesh>&) {
        return nn::Value(outputs.to_local());
      });
  fsdp1::FullyShardedDataParallelOptions options;
  options.device_mesh = (*mesh_2d)["dp"];
  auto fsdp_2d_model = std::make_shared<fsdp1::FullyShardedDataParallel>(model, options);

  const Tensor x = env.Inputs().Get(StepInput(0)).to(env.device);
  distributed::CommDebugMode forward_mode;
  Tensor out = (*fsdp_2d_model)(x).tensor();
  forward_mode.exit();
  distributed::CommDebugMode backward_mode;
  sum(out).backward();
  backward_mode.exit();

  nlohmann::json obs;
  obs[kCommCounts] = PhaseCommCountsJson(forward_mode.get_comm_counts(),
                                         backward_mode.get_comm_counts());
  bool finite = true;
  for (const Tensor& p : fsdp_2d_model->parameters()) {
    if (!p.grad().defined()) continue;
    for (double v : p.grad().to(Device::CPU()).to_doubles()) finite = finite && std::isfinite(v);
  }
  obs["grads_finite"] = finite;
  obs[kTensors] = GradientsJson(FullGradients(*fsdp_2d_model->handle), "grad/");
  return obs;
}

// How one collective is counted.
void Count(nlohmann::json& phase, const char* op) {
  phase[op] = phase.value(op, 0) + 1;
}

// One redistribution over the TP mesh dim that the plan implies: from -> to in forward; in
// backward the gradient arrives with `grad` and is brought back to `from` (a Replicate or
// Shard gradient of a Partial source becomes Replicate), as docs/tensor_parallel.md states.
struct Redistribution {
  Placement from;
  Placement to;
  Placement grad;
};

// The functional collective of one transition on a mesh dim of size > 1 (none for a local one):
// a Shard is gathered (then chunked for another Shard), a Partial is all-reduced to Replicate
// or reduce-scattered to a Shard; leaving Replicate is local (Shard: the local chunk; Partial:
// divided forward, kept as is backward).
const char* TransitionCollective(const Placement& from, const Placement& to) {
  if (from == to) return nullptr;
  if (from.is_shard()) return to.is_partial() ? nullptr : kFunAllGather;
  if (from.is_partial()) return to.is_replicate() ? kFunAllReduce : kFunReduceScatter;
  return nullptr;
}

// The collectives of test_fsdp_tp_extension_grad by phase, derived from the plan's
// redistributions and FSDP1's flat parameter (module docs above):
//   net1 (ColwiseParallel(input_layouts=Shard(0))): input Shard(0) -> Replicate, its gradient a
//     Partial sum (the local product reads every input column);
//   net2 (RowwiseParallel(output_layouts=Shard(0))): bias Replicate -> Partial (gradient
//     Replicate), output Partial -> Shard(0) (gradient Shard(0));
//   mlp_norm (distribute_module, input Shard(0) on a batch dim): weight from_local(Replicate)
//     with a Partial gradient (ReplicatedParamGradPlacements);
//   FSDP1 (one flat parameter, the root): a sharded dp group all-gathers once in forward (the
//     root keeps the unsharded parameter for backward) and reduce-scatters once in backward; a
//     dp group of one rank runs NO_SHARD: no all-gather, one all-reduce.
nlohmann::json ExpectedTpCounts(int64_t dp) {
  const std::vector<Redistribution> plan = {
      {Placement::Shard(0), Placement::Replicate(), Placement::Partial()},    // net1 input
      {Placement::Replicate(), Placement::Partial(), Placement::Replicate()},  // net2 bias
      {Placement::Partial(), Placement::Shard(0), Placement::Shard(0)},       // net2 output
      {Placement::Replicate(), Placement::Replicate(), Placement::Partial()},  // mlp_norm weight
  };
  nlohmann::json forward = nlohmann::json::object();
  nlohmann::json backward = nlohmann::json::object();
  for (const Redistribution& r : plan) {
    if (const char* op = TransitionCollective(r.from, r.to)) Count(forward, op);
    const Placement target =
        r.from.is_partial() && !r.grad.is_partial() ? Placement::Replicate() : r.from;
    if (const char* op = TransitionCollective(r.grad, target)) Count(backward, op);
  }
  if (dp > 1) {
    Count(forward, kFlatParamAllGather);
    Count(backward, kReduceScatter);
  } else {
    Count(backward, kAllReduce);
  }
  return {{"forward", forward}, {"backward", backward}};
}

// The oracle's gradients: the TP group is one data-parallel replica over its ranks' rows (every
// TP collective sums over them), and FSDP1 averages the dp replicas: (1/dp) * sum over all
// ranks of each rank's gradient of out.sum().
reference::RefTensorMap ExtensionGradients(const CaseParams& params, int world) {
  const TpCase c = TpCase::Decode(params);
  const CaseInputs inputs = ExtensionInputs(params, world);
  const reference::MlpWithRmsNorm<double> model;
  const reference::RefTensorMap weights = WeightsToRef(inputs.weights);
  reference::RefTensorMap grads;
  for (int r = 0; r < world; ++r) {
    const auto result = reference::ForwardBackward<double>(
        model, weights, {}, Features(InputOf(inputs, r, StepInput(0))), reference::SumLoss());
    for (const auto& [fqn, g] : result.grads) {
      reference::RefTensor scaled = g;
      for (double& v : scaled.data) v /= static_cast<double>(c.dp(world));
      reference::AccumulateInto(&grads, fqn, scaled);
    }
  }
  return grads;
}

std::vector<nlohmann::json> ExpectExtension(const CaseParams& params, int world) {
  const TpCase c = TpCase::Decode(params);
  const reference::RefTensorMap grads = ExtensionGradients(params, world);
  std::vector<nlohmann::json> expected(static_cast<size_t>(world));
  for (nlohmann::json& e : expected) {
    e[kCommCounts] = ExpectedTpCounts(c.dp(world));
    e["grads_finite"] = true;
    e[kTensors] = MapToJson(grads, DTypeName(c.dtype), "grad/");
  }
  return expected;
}

void JudgeExtension(const CaseParams& params, int world, const std::vector<nlohmann::json>& per_rank,
                    CheckList& checks) {
  const TpCase c = TpCase::Decode(params);
  const std::vector<nlohmann::json> expected = ExpectExtension(params, world);
  ErrorStats grad_err;
  int64_t total = 0;
  for (int r = 0; r < world; ++r) {
    const std::string who = RankName(r);
    const nlohmann::json& counts = RankObservation(per_rank, r, kCommCounts);
    for (const char* phase : {"forward", "backward"}) {
      const nlohmann::json got = MergeFlatParamAllGathers(counts.value(phase, nlohmann::json::object()));
      checks.CheckEqual(who + " " + phase + " collectives", expected[0][kCommCounts][phase], got);
      if (r == 0) {
        for (const auto& [op, n] : got.items()) total += n.get<int64_t>();
      }
    }
    checks.CheckEqual(who + " gradients finite", true, RankObservation(per_rank, r, "grads_finite"));
    grad_err.Merge(CheckMapsClose(checks, who + " full gradients vs oracle",
                                  MapFromObservations(expected, r, "grad/"),
                                  MapFromObservations(per_rank, r, "grad/"), c.tolerance));
  }
  checks.SetFigure("rank0_total_collectives", total);
  checks.SetFigure("grad_max_abs_err", grad_err.max_abs);
}

Scenario MakeExtensionGrad() {
  Scenario s;
  s.info.name = "fsdp_tp_integration/fsdp_tp_extension_grad";
  s.info.description =
      "RMSNormPython (distribute_module, Shard(0) rows) + MLPModule (colwise/rowwise, Shard(0) "
      "activations) under FSDP1 on mesh_2d[\"dp\"]: every collective of one forward and backward "
      "by name and phase (7 at the seed's mesh), derived from the placements; gradients finite "
      "and the oracle's";
  s.info.seed_test = std::string(kSeed003) + "test_fsdp_tp_extension_grad";
  s.info.params = CommonParams();
  s.info.observations.Add(ObservationKey::CommCounts(
      "the collectives of the forward and of the backward, CommDebugMode's op keys"));
  s.info.observations.Add(ObservationKey::Boolean(
      "grads_finite", "every gradient of fsdp_2d_model.parameters() is free of NaN and inf"));
  s.info.observations.AddTensors(
      {"grad/{fqn}", "the case's dtype", "the parameter's full shape",
       "the full gradient, gathered over dp and, for TP parameters, over tp"});
  s.info.inputs.weights = "the state dict of the seed's TestModel (mlp = MLPModule, mlp_norm = "
                          "RMSNormPython(10)), in the case's dtype";
  s.info.inputs.rank_tensors = {
      {"step0/input", "the case's dtype", "[2, 10]", "the rank's rows (torch.rand(2, 10))"}};
  s.info.default_world = 4;
  s.info.min_world = 2;
  s.info.max_world = 8;
  s.info.requirements.devices = {DeviceType::kCPU};
  s.skip = SkipMesh;
  s.inputs = ExtensionInputs;
  s.run_rank = RunExtensionRank;
  s.expect = ExpectExtension;
  s.judge = JudgeExtension;
  return s;
}

// ---- fsdp_tp_sync_module_state -------------------------------------------------------------------

CaseInputs SyncInputs(const CaseParams& params, int world) {
  const TpCase c = TpCase::Decode(params);
  CaseInputs inputs;
  inputs.ranks.resize(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    // torch.manual_seed(mesh_2d.get_rank()); randn(8, 8) twice.
    Generator gen(c.seed * 1000003 + static_cast<uint64_t>(r) + 1);
    auto& mine = inputs.ranks[static_cast<size_t>(r)];
    mine.emplace_back("param", Tensor::randn({8, 8}, DType::kFloat64, &gen).to(c.dtype));
    mine.emplace_back("buf", Tensor::randn({8, 8}, DType::kFloat64, &gen).to(c.dtype));
  }
  return inputs;
}

nlohmann::json RunSyncRank(RankEnv& env) {
  const TpCase c = TpCase::Decode(env.params);
  auto mesh_2d = Mesh2d(env, c.tp);
  auto tp_mesh = (*mesh_2d)["tp"];
  nn::ModulePtr model = MakeSyncStateModel(env.Inputs().Get("param").clone().to(env.device),
                                           env.Inputs().Get("buf").clone().to(env.device), tp_mesh);
  nlohmann::json obs;
  obs[kTensors] = nlohmann::json::object();
  auto report = [&](const std::string& when) {
    const Tensor param = tensor_parallel::GetDTensorParameter(*model, "param")->to_local();
    obs[kTensors][when + "/param"] = TensorToJson(param.detach().to(Device::CPU()));
    obs[kTensors][when + "/buf"] = TensorToJson(model->buffer("buf").to(Device::CPU()));
  };
  report("before");
  fsdp1::FullyShardedDataParallelOptions options;
  options.device_mesh = (*mesh_2d)["dp"];
  options.sync_module_states = true;
  auto fsdp_mod = std::make_shared<fsdp1::FullyShardedDataParallel>(model, options);
  {
    fsdp1::SummonFullParams full(fsdp_mod);
    report("after");
  }
  return obs;
}

// Rank r's dp group is {i * tp + r % tp} (docs: init_device_mesh's row-major layout); its
// first rank, r % tp, is the one sync_module_states broadcasts from.
std::vector<nlohmann::json> ExpectSync(const CaseParams& params, int world) {
  const TpCase c = TpCase::Decode(params);
  const CaseInputs inputs = SyncInputs(params, world);
  std::vector<nlohmann::json> expected(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    const int src = static_cast<int>(r % c.tp);
    nlohmann::json& e = expected[static_cast<size_t>(r)];
    e[kTensors] = nlohmann::json::object();
    for (const char* name : {"param", "buf"}) {
      e[kTensors][std::string("before/") + name] = TensorToJson(InputOf(inputs, r, name));
      e[kTensors][std::string("after/") + name] = TensorToJson(InputOf(inputs, src, name));
    }
  }
  return expected;
}

void JudgeSync(const CaseParams& params, int world, const std::vector<nlohmann::json>& per_rank,
               CheckList& checks) {
  const TpCase c = TpCase::Decode(params);
  const std::vector<nlohmann::json> expected = ExpectSync(params, world);
  for (int r = 0; r < world; ++r) {
    CheckRankTensorsExact(checks, per_rank, r, expected[static_cast<size_t>(r)][kTensors]);
  }
  // The seed's assert_local_shard_across_ranks over every dp group: different before, equal
  // after; and, the inputs differing per rank, still different across each TP group after.
  for (const char* name : {"param", "buf"}) {
    for (int r = 0; r < world; ++r) {
      const int dp_first = static_cast<int>(r % c.tp);
      if (r != dp_first) {
        const std::string pair = RankName(r) + " and " + RankName(dp_first) + " (one dp group)";
        checks.CheckTrue(pair + " " + name + " differ before", TensorData(per_rank, r, std::string("before/") + name) !=
                                                                 TensorData(per_rank, dp_first, std::string("before/") + name));
        checks.CheckTrue(pair + " " + name + " equal after", TensorData(per_rank, r, std::string("after/") + name) ==
                                                               TensorData(per_rank, dp_first, std::string("after/") + name));
      }
      const int tp_first = static_cast<int>(r - r % c.tp);
      if (r != tp_first) {
        const std::string pair = RankName(r) + " and " + RankName(tp_first) + " (one tp group)";
        checks.CheckTrue(pair + " " + name + " differ after", TensorData(per_rank, r, std::string("after/") + name) !=
                                                                TensorData(per_rank, tp_first, std::string("after/") + name));
      }
    }
  }
  checks.SetFigure("dp", c.dp(world));
  checks.SetFigure("tp", c.tp);
}

Scenario MakeSyncModuleState() {
  Scenario s;
  s.info.name = "fsdp_tp_integration/fsdp_tp_sync_module_state";
  s.info.description =
      "a Replicate() DTensor parameter and a buffer, different on every rank, under "
      "FSDP1(sync_module_states=True) on mesh_2d[\"dp\"]: equal across every dp replica "
      "(the dp group's first rank's values), still different across tp";
  s.info.seed_test = std::string(kSeed003) + "test_fsdp_tp_sync_module_state";
  s.info.params = CommonParams();
  s.info.observations.AddTensors(
      {"{name}/{fqn}", "the case's dtype", "[8, 8]",
       "{name} is before (at construction) or after (inside summon_full_params after "
       "FSDP(sync_module_states=True)); {fqn} is param (its DTensor's to_local()) or buf"});
  s.info.inputs.rank_tensors = {
      {"param", "the case's dtype", "[8, 8]", "the rank's own parameter (torch.randn)"},
      {"buf", "the case's dtype", "[8, 8]", "the rank's own buffer (torch.randn)"}};
  s.info.default_world = 4;
  s.info.min_world = 2;
  s.info.max_world = 8;
  s.info.requirements.devices = {DeviceType::kCPU};
  s.skip = SkipMesh;
  s.inputs = SyncInputs;
  s.run_rank = RunSyncRank;
  s.expect = ExpectSync;
  s.judge = JudgeSync;
  return s;
}

}  // namespace

void RegisterFsdpTpIntegrationScenarios(ScenarioRegistry& registry) {
  registry.Add(MakeIntegration());
  registry.Add(MakeExtensionGrad());
  registry.Add(MakeSyncModuleState());
}

}  // namespace fsdp::conformance
