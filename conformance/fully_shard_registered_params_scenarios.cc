// Family `fully_shard_registered_params` (test_fully_shard_training.py,
// TestFullyShardRegisteredParams): what a fully_shard-ed module exposes between forward and
// backward, and after backward.
//   param_registration_after_forward   test_param_registration_after_forward: forward, then
//                                      every FSDP module's reshard()
//   param_registration_after_backward  test_param_registration_after_backward
// Each rank builds the seed's model with the runner-owned weights, MLP(dim) with only the root
// sharded (groups=single) or Sequential(MLP(dim), MLP(dim)) with 0.in_proj, 0.out_proj and the
// root sharded (groups=multiple), and reports, at each point, for every parameter (by FQN): the
// FSDP module that manages it, which form is registered (sharded: the DTensor shard over the
// world; sharded_post_forward: the shard over the post-forward group of an int
// reshard_after_forward; unsharded: the plain tensor), its shape, the global ranks of the group
// it is sharded over, and its local values.
//
// Rules (docs/fsdp-behaviour.md, "Dim-0 sharding", "Int reshard_after_forward"; docs/fsdp.md,
// "[Note: post-forward shard metadata]"), for any world W, any int k dividing W, any dim:
//   * after forward a module registers sharded_post_forward when it reshards after forward
//     (fsdp_params.h, ReshardsAfterForward) with an int 1 < k < W, sharded when it reshards
//     otherwise, unsharded when it does not; after reshard() and after backward, sharded;
//   * sharded: rank r's torch.chunk rows over W, group = all W ranks;
//   * sharded_post_forward: group = the k ranks r - r % k ... r - r % k + k - 1; rank r holds
//     slice j = r % k of the padded unsharded rows, i.e. the rows of the W/k padded shards
//     j·W/k ... (j+1)·W/k - 1. PyTorch registers a DTensor whose local size is the k-way
//     torch.chunk size over the same slice; both shapes are accepted (the values are the
//     slice's leading rows, zero past the parameter's last row);
//   * unsharded: the full parameter, no group.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <utility>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "conformance/case_inputs.h"
#include "conformance/fsdp_params.h"
#include "conformance/observations.h"
#include "conformance/rank_checks.h"
#include "conformance/scenario_registry.h"
#include "conformance/state_dict_model.h"
#include "engine/core/rng.h"
#include "engine/fsdp/fsdp_param.h"
#include "engine/fsdp/fsdp_param_group.h"
#include "engine/fsdp/fully_shard.h"
#include "engine/functional/functional.h"
#include "engine/nn/init.h"
#include "engine/nn/layers.h"
#include "engine/nn/models.h"
#include "reference/sharding.h"

namespace fsdp::conformance {

namespace {

constexpr const char* kSeedClass =
    "test_fully_shard_training.py::TestFullyShardRegisteredParams::";
constexpr const char* kRegistered = "registered";
constexpr const char* kSharded = "sharded";
constexpr const char* kShardedPostForward = "sharded_post_forward";
constexpr const char* kUnsharded = "unsharded";

bool MultipleGroups(const CaseParams& params) { return params.GetString("groups") == "multiple"; }

// The seed's model: MLP(dim), or Sequential(MLP(dim), MLP(dim)).
nn::ModulePtr BuildModel(const CaseParams& params) {
  const int64_t dim = params.GetInt("dim");
  if (!MultipleGroups(params)) return std::make_shared<nn::MLP>(dim);
  return std::make_shared<nn::Sequential>(
      std::vector<nn::ModulePtr>{std::make_shared<nn::MLP>(dim), std::make_shared<nn::MLP>(dim)});
}

// The FSDP module (FQN, root "") that manages each parameter FQN of the seed's model.
std::string ManagingModule(const CaseParams& params, const std::string& param_fqn) {
  if (!MultipleGroups(params)) return "";
  for (const char* child : {"0.in_proj", "0.out_proj"}) {
    if (param_fqn.rfind(std::string(child) + ".", 0) == 0) return child;
  }
  return "";
}

CaseInputs Inputs(const CaseParams& params, int world) {
  nn::ManualSeed(static_cast<uint64_t>(params.GetInt("seed")));
  nn::ModulePtr model = BuildModel(params);
  CaseInputs inputs;
  inputs.weights = WeightsOf(*model);
  inputs.ranks.resize(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    Generator generator(static_cast<uint64_t>(params.GetInt("seed") + 1 + r));
    inputs.ranks[static_cast<size_t>(r)].emplace_back(
        StepInputName(0), Tensor::randn({2, params.GetInt("dim")}, DType::kFloat32, &generator));
  }
  return inputs;
}

InputsDoc InputsDocumentation() {
  InputsDoc doc;
  doc.weights =
      "every key of the seed's model (MLP(dim), or Sequential(MLP(dim), MLP(dim)) for "
      "groups=multiple) initialised after manual_seed(seed), float32";
  doc.rank_tensors.push_back(
      {"step0/input", "float32", "[2, dim]", "the rank's forward input (seed + 1 + rank)"});
  return doc;
}

// What the case's reshard_after_forward makes module `module` register after forward.
std::string FormAfterForward(const CaseParams& params, int world, const std::string& module) {
  if (!ReshardsAfterForward(params, /*is_root=*/module.empty())) return kUnsharded;
  const std::optional<fsdp2::ReshardAfterForward> raf = ReshardAfterForwardOf(params);
  const int* k = raf ? std::get_if<int>(&*raf) : nullptr;
  return k != nullptr && *k > 1 && *k < world ? kShardedPostForward : kSharded;
}

int PostForwardSize(const CaseParams& params) {
  return std::get<int>(*ReshardAfterForwardOf(params));
}

std::vector<int> Range(int first, int count) {
  std::vector<int> out;
  for (int i = 0; i < count; ++i) out.push_back(first + i);
  return out;
}

// Rows [begin, begin + rows) of `full` along dim 0, zero rows past its end.
Tensor RowsOrZeros(const Tensor& full, int64_t begin, int64_t rows) {
  Shape shape = full.sizes();
  shape[0] = rows;
  Tensor out = Tensor::zeros(shape, full.dtype());
  const int64_t real = std::clamp<int64_t>(full.size(0) - begin, 0, rows);
  if (real > 0) out.narrow(0, 0, real).copy_(full.narrow(0, begin, real));
  return out;
}

// Rank `rank`'s post-forward rows of `full` at world W and factor k, the slice's real rows
// (torch_chunk_size false) or PyTorch's k-way torch.chunk local size (true).
Tensor PostForwardRows(const Tensor& full, int rank, int world, int k, bool torch_chunk_size) {
  const int64_t d0 = full.size(0);
  const int64_t slice_rows = reference::MakeChunkLayout(d0, world).chunk_rows * (world / k);
  const int j = rank % k;
  const int64_t begin = slice_rows * j;
  const int64_t rows = torch_chunk_size
                           ? reference::MakeChunkLayout(d0, k).RowsOnRank(j)
                           : std::clamp<int64_t>(d0 - begin, 0, slice_rows);
  return RowsOrZeros(full, begin, rows);
}

// The form each FSDP module (by FQN) registers at one point.
using FormOf = std::function<std::string(const std::string& module)>;

// The expected observations of rank `rank` at each (point, forms) of `points`.
nlohmann::json Expected(const CaseParams& params, int world, int rank,
                        const std::vector<std::pair<std::string, FormOf>>& points) {
  const CaseInputs inputs = Inputs(params, world);
  nlohmann::json obs;
  obs[kRegistered] = nlohmann::json::object();
  obs[kTensors] = nlohmann::json::object();
  for (const auto& [point, form_of] : points) {
    for (const auto& [fqn, full] : inputs.weights) {
      const std::string module = ManagingModule(params, fqn);
      const std::string form = form_of(module);
      Tensor local;
      std::vector<int> ranks;
      if (form == kSharded) {
        local = ChunkRows(full, rank, world);
        ranks = Range(0, world);
      } else if (form == kShardedPostForward) {
        const int k = PostForwardSize(params);
        local = PostForwardRows(full, rank, world, k, /*torch_chunk_size=*/false);
        ranks = Range(rank - rank % k, k);
      } else {
        local = full;
      }
      // Every parameter of the seed's model trains, and every form PyTorch registers is an
      // nn.Parameter that requires grad (the post-forward shard too, though nothing computes
      // with it).
      obs[kRegistered][point][fqn] = {{"module", module},
                                      {"form", form},
                                      {"shape", local.sizes()},
                                      {"mesh_ranks", ranks},
                                      {"requires_grad", true}};
      obs[kTensors][point + "/" + fqn] = TensorToJson(local);
    }
  }
  return obs;
}

// What rank reports for every parameter of `model` at `point`.
void Report(nn::Module& model, const std::string& point, nlohmann::json& obs) {
  for (const nn::ModulePtr& m : model.modules()) {
    if (!fsdp2::IsFsdpModule(*m)) continue;
    fsdp2::FSDPModule fsdp_module(m);
    fsdp2::FsdpParamGroup* group = fsdp_module.param_group();
    if (group == nullptr) continue;
    for (const auto& p : group->fsdp_params()) {
      const fsdp2::ParamModuleInfo& where = p->module_info();
      const Tensor registered = where.module->parameter(where.param_name);
      std::string form = "unknown";
      std::vector<int> ranks;
      if (registered.is_same(p->sharded_param())) {
        form = kSharded;
        ranks = p->mesh_info().shard_process_group->global_ranks();
      } else if (p->has_unsharded_param() && registered.is_same(p->unsharded_param())) {
        form = kUnsharded;
      } else if (p->sharded_state() == fsdp2::ShardedState::kShardedPostForward &&
                 p->post_forward_mesh_info()) {
        form = kShardedPostForward;
        ranks = p->post_forward_mesh_info()->shard_process_group->global_ranks();
      }
      obs[kRegistered][point][p->fqn()] = {{"module", group->module_fqn()},
                                           {"form", form},
                                           {"shape", registered.sizes()},
                                           {"mesh_ranks", ranks},
                                           {"requires_grad", registered.requires_grad()}};
      obs[kTensors][point + "/" + p->fqn()] =
          TensorToJson(registered.detach().to(Device::CPU()));
    }
  }
}

nn::ModulePtr ShardedModel(RankEnv& env) {
  nn::ModulePtr model = BuildModel(env.params);
  model->load_state_dict(env.Inputs().weights());
  model->to(env.device);
  fsdp2::FullyShardOptions options;
  options.process_group = env.pg;
  options.semantics = SemanticsOf(env.params);
  options.reshard_after_forward = ReshardAfterForwardOf(env.params);
  if (MultipleGroups(env.params)) {
    nn::Module& first = *model->get_submodule("0");
    fsdp2::fully_shard(first.get_submodule("in_proj"), options);
    fsdp2::fully_shard(first.get_submodule("out_proj"), options);
  }
  fsdp2::fully_shard(model, options);
  return model;
}

// Compares one point of every rank's report with the rules; the post-forward shape may also be
// PyTorch's torch.chunk size (see the file comment).
void JudgePoint(const CaseParams& params, int world, const std::vector<nlohmann::json>& per_rank,
                const std::vector<nlohmann::json>& expected, const std::string& point,
                CheckList& checks) {
  const CaseInputs inputs = Inputs(params, world);
  for (int r = 0; r < world; ++r) {
    const nlohmann::json& got = per_rank[static_cast<size_t>(r)];
    const nlohmann::json& want = expected[static_cast<size_t>(r)];
    for (const auto& [fqn, full] : inputs.weights) {
      const std::string name = "rank " + std::to_string(r) + " " + point + " " + fqn;
      const nlohmann::json& w = want[kRegistered][point][fqn];
      const nlohmann::json* g = nullptr;
      if (auto pit = got[kRegistered].find(point); pit != got[kRegistered].end()) {
        if (auto fit = pit->find(fqn); fit != pit->end()) g = &*fit;
      }
      if (g == nullptr) {
        checks.Fail(name, "not reported");
        continue;
      }
      checks.CheckEqual(name + " module", w["module"], g->value("module", nlohmann::json()));
      checks.CheckEqual(name + " form", w["form"], g->value("form", nlohmann::json()));
      checks.CheckEqual(name + " mesh_ranks", w["mesh_ranks"],
                        g->value("mesh_ranks", nlohmann::json()));
      checks.CheckEqual(name + " requires_grad", w["requires_grad"],
                        g->value("requires_grad", nlohmann::json()));
      nlohmann::json want_tensor = want[kTensors][point + "/" + fqn];
      if (w["form"] == kShardedPostForward && g->value("shape", nlohmann::json()) != w["shape"]) {
        want_tensor = TensorToJson(PostForwardRows(full, r, world, PostForwardSize(params),
                                                   /*torch_chunk_size=*/true));
      }
      const nlohmann::json& got_tensor = got[kTensors].value(point + "/" + fqn, nlohmann::json());
      checks.CheckEqual(name + " shape", want_tensor["shape"],
                        got_tensor.value("shape", nlohmann::json()));
      checks.CheckEqual(name + " values", want_tensor["data"],
                        got_tensor.value("data", nlohmann::json()));
    }
  }
}

// `dim`: the seed's MLP(dim) for this test.
ScenarioInfo CommonInfo(const std::string& case_name, const std::string& description,
                        int64_t dim) {
  ScenarioInfo info;
  info.name = "fully_shard_registered_params/" + case_name;
  info.description = description;
  info.seed_test = std::string(kSeedClass) + "test_" + case_name;
  info.params = {
      ReshardAfterForwardAxis(),
      ParamSpec::Axis("groups",
                      "single: MLP(dim) with only the root sharded; multiple: "
                      "Sequential(MLP(dim), MLP(dim)) with 0.in_proj, 0.out_proj and the root",
                      {"single", "multiple"}),
      ParamSpec::SizeInt("dim", "MLP(dim): in_proj [4·dim, dim], out_proj [dim, 4·dim]", dim,
                         /*minimum=*/1),
      ParamSpec::SizeInt("seed", "seed of the weights and the inputs", 0),
      SemanticsParam()};
  info.default_world = 4;  // the seed's world size
  info.min_world = 1;
  info.max_world = 8;
  info.test_runs = {{2, {}}, {3, {}}, {8, {}}, {8, {{"reshard_after_forward", "4"}}}};
  info.extra_default_runs = LaterProfileRuns(4);
  // An int k with 1 < k < W / k too, where a post-forward shard's W/k padded shards and k
  // padded shards (a rule that confuses the two agrees at W = 4, k = 2) differ in rows.
  info.extra_default_runs.push_back({8, {{"reshard_after_forward", "2"}}});
  // And k = W, which PyTorch takes for True: the full shard registered, over every rank.
  info.extra_default_runs.push_back({2, {{"reshard_after_forward", "2"}}});
  info.inputs = InputsDocumentation();
  for (const auto& [point, meaning] : std::vector<std::pair<std::string, std::string>>{
           {"after_forward", "after forward"},
           {"after_reshard", "after every FSDP module's reshard()"},
           {"after_backward", "after loss.sum().backward()"}}) {
    if ((case_name == "param_registration_after_backward") != (point == "after_backward")) {
      continue;
    }
    info.observations.AddTensors(
        {point + "/{fqn}", "float32", "the registered parameter's local shape",
         "the local values of the parameter registered on its module " + meaning});
  }
  info.observations.Add(ObservationKey::Custom(
      kRegistered,
      {{"type", "object"},
       {"additionalProperties",
        {{"type", "object"},
         {"additionalProperties",
          {{"type", "object"},
           {"required", {"module", "form", "shape", "mesh_ranks", "requires_grad"}},
           {"additionalProperties", false},
           {"properties",
            {{"module", {{"type", "string"}}},
             {"form",
              {{"type", "string"},
               {"enum", {kSharded, kShardedPostForward, kUnsharded, "unknown"}}}},
             {"shape", {{"type", "array"}, {"items", {{"type", "integer"}}}}},
             {"mesh_ranks", {{"type", "array"}, {"items", {{"type", "integer"}}}}},
             {"requires_grad", {{"type", "boolean"}}}}}}}}}},
      "{point: {parameter FQN: {module: the FSDP module managing it (root \"\"), form: "
      "sharded | sharded_post_forward | unsharded (what is registered), shape, mesh_ranks: "
      "the global ranks it is sharded over ([] when unsharded), requires_grad: the registered "
      "tensor's (every form of a trainable parameter requires grad)}}}"));
  return info;
}

Scenario AfterForward() {
  Scenario s;
  s.info = CommonInfo("param_registration_after_forward",
                      "after forward each parameter is registered per reshard_after_forward "
                      "(unsharded, sharded, or the post-forward shard of an int over its "
                      "k-rank group) with the runner-owned values; after reshard(), sharded",
                      /*dim=*/3);
  s.skip = SkipIntNotAFactor;
  s.inputs = Inputs;
  s.run_rank = [](RankEnv& env) {
    nn::ModulePtr model = ShardedModel(env);
    nlohmann::json obs;
    (void)(*model)(env.Inputs().Get(StepInputName(0)).to(env.device));
    Report(*model, "after_forward", obs);
    for (const nn::ModulePtr& m : model->modules()) {
      if (fsdp2::IsFsdpModule(*m)) fsdp2::FSDPModule(m).reshard();
    }
    Report(*model, "after_reshard", obs);
    return obs;
  };
  s.expect = [](const CaseParams& params, int world) {
    std::vector<nlohmann::json> out;
    for (int r = 0; r < world; ++r) {
      out.push_back(Expected(
          params, world, r,
          {{"after_forward",
            [&](const std::string& module) { return FormAfterForward(params, world, module); }},
           {"after_reshard", [](const std::string&) { return std::string(kSharded); }}}));
    }
    return out;
  };
  s.judge = [expect = s.expect](const CaseParams& params, int world,
                                const std::vector<nlohmann::json>& per_rank, CheckList& checks) {
    const std::vector<nlohmann::json> expected = expect(params, world);
    JudgePoint(params, world, per_rank, expected, "after_forward", checks);
    JudgePoint(params, world, per_rank, expected, "after_reshard", checks);
  };
  return s;
}

Scenario AfterBackward() {
  Scenario s;
  s.info = CommonInfo("param_registration_after_backward",
                      "after forward and loss.sum().backward() every parameter is registered "
                      "sharded (torch.chunk rows over the world) with its runner-owned values",
                      /*dim=*/8);
  s.skip = SkipIntNotAFactor;
  s.inputs = Inputs;
  s.run_rank = [](RankEnv& env) {
    nn::ModulePtr model = ShardedModel(env);
    nlohmann::json obs;
    sum((*model)(env.Inputs().Get(StepInputName(0)).to(env.device)).tensor()).backward();
    Report(*model, "after_backward", obs);
    return obs;
  };
  s.expect = [](const CaseParams& params, int world) {
    std::vector<nlohmann::json> out;
    for (int r = 0; r < world; ++r) {
      out.push_back(Expected(params, world, r,
                             {{"after_backward",
                               [](const std::string&) { return std::string(kSharded); }}}));
    }
    return out;
  };
  s.judge = [expect = s.expect](const CaseParams& params, int world,
                                const std::vector<nlohmann::json>& per_rank, CheckList& checks) {
    JudgePoint(params, world, per_rank, expect(params, world), "after_backward", checks);
  };
  return s;
}

}  // namespace

void RegisterFullyShardRegisteredParamsScenarios(ScenarioRegistry& registry) {
  registry.Add(AfterForward());
  registry.Add(AfterBackward());
}

}  // namespace fsdp::conformance
