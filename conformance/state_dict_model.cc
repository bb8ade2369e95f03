#include "conformance/state_dict_model.h"

#include "conformance/fsdp_params.h"
#include "conformance/observations.h"
#include "conformance/rank_checks.h"
#include "engine/distributed/device_mesh.h"
#include "engine/fsdp/fully_shard.h"
#include "engine/fsdp/shard_layout.h"
#include "engine/functional/functional.h"
#include "engine/nn/init.h"
#include "engine/nn/models.h"
#include "engine/ops/elementwise.h"
#include "engine/ops/shape_ops.h"
#include "engine/optim/sgd.h"

namespace fsdp::conformance {

namespace {

std::shared_ptr<nn::MLP> MakeModel(int64_t dim) {
  return std::make_shared<nn::MLP>(dim, /*bias=*/true, /*with_buffer=*/true);
}

int64_t Dim(const CaseParams& p) {
  const int64_t dim = p.GetInt("dim");
  FSDP_CHECK(dim >= 1 && dim <= 4096, "dim must be in [1, 4096], got ", dim);
  return dim;
}

}  // namespace

std::vector<ParamSpec> StateDictModelParams() {
  return {ParamSpec::SizeInt("dim", "MLP(dim): in_proj [4*dim, dim], out_proj [dim, 4*dim]", 5),
          ParamSpec::SizeInt("seed", "generator seed of the weights and inputs", 0)};
}

CaseInputs StateDictModelInputs(const CaseParams& params, int world) {
  const int64_t dim = Dim(params);
  const auto seed = static_cast<uint64_t>(params.GetInt("seed"));
  nn::ManualSeed(seed);
  auto model = MakeModel(dim);
  CaseInputs inputs;
  inputs.weights = WeightsOf(*model, DType::kFloat32);
  inputs.ranks.resize(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    Generator gen(seed * 1000003 + 7919 * static_cast<uint64_t>(r) + 1);
    for (int64_t k = 0; k < 2; ++k) {
      inputs.ranks[static_cast<size_t>(r)].emplace_back(
          StepInputName(k), Tensor::randn({2, dim}, DType::kFloat32, &gen));
    }
  }
  return inputs;
}

InputsDoc StateDictModelInputsDoc() {
  InputsDoc doc;
  doc.weights =
      "every key of MLP(dim, bias=True, with_buffer=True).state_dict() (in_proj.weight, "
      "in_proj.bias, out_proj.weight, out_proj.bias, buffer), float32";
  doc.rank_tensors = {{"step{k}/input", "float32", "[2, dim]", "the rank's input of step k"}};
  return doc;
}

ParamSpec ReplicateParam() {
  return ParamSpec::SizeInt(
      "replicate",
      "HSDP when > 1: fully_shard over a (replicate, world / replicate) mesh, the pieces "
      "torch.chunk's over the shard dim",
      1, 1);
}

int ShardSizeOf(const CaseParams& params, int world) {
  const int replicate = params.has("replicate") ? static_cast<int>(params.GetInt("replicate")) : 1;
  FSDP_CHECK(replicate >= 1 && world % replicate == 0, "replicate ", replicate,
             " does not divide world ", world);
  return world / replicate;
}

int ShardRankOf(const CaseParams& params, int rank, int world) {
  return rank % ShardSizeOf(params, world);
}

nn::ModulePtr BuildShardedStateDictModel(RankEnv& env, bool zero_weights,
                                         bool reshard_after_forward) {
  auto model = MakeModel(Dim(env.params));
  model->load_state_dict(env.Inputs().weights());
  if (zero_weights) {
    for (const Tensor& p : model->parameters()) p.detach().copy_(Tensor::zeros(p.sizes(), p.dtype()));
  }
  model->to(env.device);
  fsdp2::FullyShardOptions options;
  const int shard = ShardSizeOf(env.params, env.world);
  if (shard == env.world) {
    options.process_group = env.pg;
  } else {
    options.mesh =
        distributed::DeviceMesh::Init(env.pg, env.device.is_cuda() ? "cuda" : "cpu",
                                      {env.world / shard, shard}, {"replicate", "shard"});
  }
  options.shard_placement_fn = ShardPlacementFnOf(env.params, env.pg->size());
  if (!reshard_after_forward) options.reshard_after_forward = false;
  fsdp2::fully_shard(model->child("in_proj"), options);
  fsdp2::fully_shard(model, options);
  return model;
}

bool IsShardedKey(const std::string& key) { return key != "buffer"; }

Tensor ChunkRows(const Tensor& full, int rank, int world, int64_t shard_dim) {
  const fsdp2::ShardInfo info = fsdp2::ComputeShardInfo(full.sizes(), rank, world, shard_dim);
  return ops::kernels::Narrow(full, shard_dim, info.row_begin, info.rows).clone();
}

nlohmann::json ChunkSharding(const Tensor& full, int rank, int world, int64_t shard_dim) {
  const fsdp2::ShardInfo info = fsdp2::ComputeShardInfo(full.sizes(), rank, world, shard_dim);
  Shape offsets(full.sizes().size(), 0);
  offsets[shard_dim] = info.row_begin;
  return {{"global_shape", full.sizes()}, {"offsets", offsets}};
}

nlohmann::json ExpectedPieces(const NamedTensors& weights, int rank, int world,
                              const std::string& prefix, const CaseParams& params) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [key, t] : weights) {
    out[prefix + key] = TensorToJson(
        IsShardedKey(key) ? ChunkRows(t, rank, world, ShardDimOf(params, t.sizes(), world)) : t);
  }
  return out;
}

std::vector<std::string> KeysOf(const NamedTensors& weights) {
  std::vector<std::string> keys;
  for (const auto& [key, t] : weights) keys.push_back(key);
  return keys;
}

void SgdStepOnSum(nn::Module& model, const Tensor& input) {
  optim::SGD sgd(model.parameters(), optim::SGDOptions{.lr = 0.1});
  sum(model(input).tensor()).backward();
  sgd.step();
  sgd.zero_grad();
}

nlohmann::json StateDictPiecesJson(const nn::StateDict& sd, const std::string& prefix) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [key, t] : sd) out[prefix + key] = TensorToJson(t.to(Device::CPU()));
  return out;
}

nlohmann::json StateDictShardingJson(const nn::StateDict& sd) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [key, t] : sd) {
    const nn::ShardedEntry* e = sd.sharding(key);
    out[key] = e == nullptr
                   ? nlohmann::json(nullptr)
                   : nlohmann::json{{"global_shape", e->global_shape}, {"offsets", e->offsets}};
  }
  return out;
}

nn::StateDict ClonedStateDict(const nn::StateDict& sd, bool negate) {
  nn::StateDict out;
  for (const auto& [k, v] : sd) out.insert(k, negate ? ops::kernels::Neg(v) : v.clone());
  out.sharded = sd.sharded;
  return out;
}

int CheckLoadedContinuesLikeSaver(CheckList& checks, const std::vector<nlohmann::json>& per_rank,
                                  int rank, const std::vector<std::string>& keys) {
  nlohmann::json continued = nlohmann::json::object();
  const nlohmann::json& tensors = RankObservation(per_rank, rank, kTensors);
  for (const std::string& key : keys) {
    const std::string name = "continued/" + key;
    if (tensors.contains(name)) continued["loaded/" + key] = tensors[name];
  }
  CheckRankTensorsExact(checks, per_rank, rank, continued);
  return static_cast<int>(continued.size());
}

}  // namespace fsdp::conformance
