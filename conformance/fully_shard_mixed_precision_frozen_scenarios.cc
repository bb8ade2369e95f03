// Family `fully_shard_mixed_precision`, its scenario of a group holding a frozen parameter of
// another dtype (test_fully_shard_mixed_precision.py,
// TestFullyShardMixedPrecisionTraining.test_reduce_dtype_after_frozen_first_forward):
//
//   reduce_dtype_after_frozen_first_forward
//       The test's Model: layers = Sequential(Linear(dim, dim), Linear(dim, dim)) in float32
//       and `non_float`, a frozen parameter of ones(dim) in `frozen_dtype` that forward never
//       uses; one fully_shard on the root with MixedPrecisionPolicy(param_dtype=bfloat16,
//       reduce_dtype). With `frozen_first_forward` (the test) the whole model is frozen for a
//       first forward under no_grad, then `layers` is unfrozen; a forward and sum().backward()
//       follow. The test's frozen parameter is int64, which FSDP all-gathers with the
//       bfloat16 ones as uint8 bytes (the engine rejects mixed all-gather dtypes,
//       docs/fsdp.md "Missing pieces"); a floating one (float64, bfloat16) is cast to
//       param_dtype and tests the same dtype rules.
//
// What each release does (docs/fsdp-behaviour.md, "Dtypes"), judged by the case's profile:
//   torch-2.4   lazy init checks every parameter of the group, frozen ones included: a
//               floating frozen parameter of another dtype raises "FSDP expects uniform
//               original parameter dtype" in the first forward, on every rank.
//   torch-2.8   only parameters that require grad take part; the reduce-scatter runs in
//               reduce_dtype, param_dtype when it is None.
//   torch-2.15  the same, and with no trainable parameter at lazy init the floating ones give
//               the group's dtypes, while each gradient is computed in its parameter's reduce
//               dtype (its own dtype when reduce_dtype is None): the reduce-scatter runs in
//               float32 in every case.
// Skipped under torch-2.8: the frozen first forward (PyTorch 2.8.0 then reduces in bfloat16 and
// fails assigning that gradient to the float32 parameter).
// Every rank reports the error of the whole sequence ("" when none), the backward's
// collectives by CommDebugMode key with their payload bytes, and each parameter's gradient
// dtype ("None" without one). Expected: one reduce-scatter of W * (the trainable parameters'
// padded shard numels) elements in the reduce dtype, and float32 gradients on `layers` only.
//
// Stateless; thread-safe (run_rank builds its own module on every rank's thread).
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "conformance/fsdp_params.h"
#include "conformance/rank_checks.h"
#include "conformance/scenario_registry.h"
#include "engine/autograd/grad_mode.h"
#include "engine/core/error.h"
#include "engine/distributed/comm_debug_mode.h"
#include "engine/fsdp/fully_shard.h"
#include "engine/functional/functional.h"
#include "engine/nn/init.h"
#include "engine/nn/layers.h"

namespace fsdp::conformance {

namespace {

constexpr const char* kError = "error";
constexpr const char* kBackwardCommCounts = "backward_comm_counts";
constexpr const char* kBackwardCommBytes = "backward_comm_bytes";
constexpr const char* kGradDtypes = "grad_dtypes";
constexpr const char* kReduceScatter = "c10d._reduce_scatter_base_";

// The test's Model: layers (two Linear(dim, dim)) and non_float, a frozen ones(dim) parameter
// of `frozen_dtype` that forward does not use.
class FrozenOtherDtypeModel : public nn::Cloneable<FrozenOtherDtypeModel> {
 public:
  FrozenOtherDtypeModel(int64_t dim, DType frozen_dtype)
      : nn::Cloneable<FrozenOtherDtypeModel>("Model") {
    register_module("layers", std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{
                                  std::make_shared<nn::Linear>(dim, dim),
                                  std::make_shared<nn::Linear>(dim, dim)}));
    register_parameter("non_float", Tensor::ones({dim}, frozen_dtype), /*requires_grad=*/false);
  }
  nn::Value forward(const nn::Value& input) override { return call_child("layers", input); }
};

// The case's reduce_dtype axis as the policy's (nullopt for "None").
std::optional<DType> ReduceDtypeOf(const CaseParams& p) {
  const std::string name = p.GetString("reduce_dtype");
  if (name == "None") return std::nullopt;
  return ParseDType(name);
}

// Why the case cannot run under its profile (see the file comment); nullopt when it can.
std::optional<std::string> SkipReason(const CaseParams& p) {
  if (SemanticsOf(p) == fsdp2::Semantics::kTorch2_8 && p.GetBool("frozen_first_forward")) {
    return "PyTorch 2.8 leaves a group without trainable parameters at lazy init with no orig "
           "or reduce dtype; 2.8.0's backward then reduces in bfloat16 and fails assigning "
           "the bfloat16 gradient to the float32 parameter, a defect rather than a rule "
           "(torch-2.15 falls back to the floating parameters)";
  }
  return std::nullopt;
}

// Whether lazy init must raise: torch-2.4 checks frozen parameters' dtypes too (every
// frozen_dtype differs from the layers' float32).
bool ExpectsUniformDtypeError(const CaseParams& p) {
  return ProfileChecksFrozenParamDtypes(SemanticsOf(p));
}

// The dtype of the reduce-scatter (see the file comment), written from each release's
// FSDPParamGroup._init_mp_dtypes and foreach_reduce, not from the engine's rules.
DType ExpectedReduceDtype(const CaseParams& p) {
  if (SemanticsOf(p) == fsdp2::Semantics::kTorch2_15) return DType::kFloat32;
  return ReduceDtypeOf(p).value_or(DType::kBFloat16);
}

nlohmann::json Expect(const CaseParams& p, int world) {
  // The error comes from lazy init, before the backward: nothing reduced, no gradients read.
  if (ExpectsUniformDtypeError(p)) {
    return {{kError, "FSDP expects uniform original parameter dtype"},
            {kBackwardCommCounts, nlohmann::json::object()},
            {kBackwardCommBytes, nlohmann::json::object()},
            {kGradDtypes, nlohmann::json::object()}};
  }
  const int64_t dim = p.GetInt("dim");
  // Two Linear(dim, dim): weights [dim, dim] and biases [dim], each padded to W * ceil(dim / W)
  // rows on dim 0.
  const int64_t rows = world * ((dim + world - 1) / world);
  const int64_t numel = 2 * (rows * dim + rows);
  const DType reduce = ExpectedReduceDtype(p);
  nlohmann::json grads = nlohmann::json::object();
  for (const char* layer : {"layers.0", "layers.1"}) {
    grads[std::string(layer) + ".weight"] = "float32";
    grads[std::string(layer) + ".bias"] = "float32";
  }
  grads["non_float"] = "None";
  return {
      {kError, ""},
      {kBackwardCommCounts, {{kReduceScatter, 1}}},
      {kBackwardCommBytes, {{kReduceScatter, numel * static_cast<int64_t>(ElementSize(reduce))}}},
      {kGradDtypes, grads}};
}

nlohmann::json RunRank(RankEnv& env) {
  const CaseParams& p = env.params;
  const int64_t dim = p.GetInt("dim");
  nlohmann::json obs = {{kError, ""},
                        {kBackwardCommCounts, nlohmann::json::object()},
                        {kBackwardCommBytes, nlohmann::json::object()},
                        {kGradDtypes, nlohmann::json::object()}};
  try {
    nn::ManualSeed(0);
    auto model =
        std::make_shared<FrozenOtherDtypeModel>(dim, ParseDType(p.GetString("frozen_dtype")));
    model->to(env.device);
    fsdp2::FullyShardOptions options;
    options.process_group = env.pg;
    options.semantics = SemanticsOf(p);
    options.mp_policy.param_dtype = DType::kBFloat16;
    options.mp_policy.reduce_dtype = ReduceDtypeOf(p);
    fsdp2::fully_shard(model, options);
    const Tensor input = Tensor::zeros({4, dim}, DType::kFloat32, env.device);
    if (p.GetBool("frozen_first_forward")) {
      model->requires_grad_(false);
      {
        autograd::NoGradGuard no_grad;
        (void)(*model)(nn::Value(input));
      }
      model->get_submodule("layers")->requires_grad_(true);
    }
    Tensor loss = fsdp::sum((*model)(nn::Value(input)).tensor());
    distributed::CommDebugMode backward_mode;
    loss.backward();
    backward_mode.exit();
    obs[kBackwardCommCounts] = backward_mode.get_comm_counts();
    obs[kBackwardCommBytes] = backward_mode.get_comm_bytes();
    for (const auto& [name, param] : model->named_parameters()) {
      const Tensor grad = param.grad();
      obs[kGradDtypes][name] = grad.defined() ? DTypeName(grad.dtype()) : "None";
    }
  } catch (const Error& e) {
    obs[kError] = e.message();
  } catch (const std::exception& e) {
    obs[kError] = e.what();
  }
  return obs;
}

void Judge(const CaseParams& p, int world, const std::vector<nlohmann::json>& per_rank,
           CheckList& checks) {
  const nlohmann::json expected = Expect(p, world);
  if (ExpectsUniformDtypeError(p)) {
    const std::string phrase = expected[kError].get<std::string>();
    for (int r = 0; r < world; ++r) {
      const std::string message = per_rank.at(r).value(kError, "");
      checks.CheckTrue(RankName(r) + " error says \"" + phrase + "\"",
                       message.find(phrase) != std::string::npos,
                       message.empty() ? "no error raised" : "got: " + message);
    }
    return;
  }
  CheckEveryRank(checks, per_rank, world,
                 {{kError, "error", expected[kError]},
                  {kBackwardCommCounts, "backward collectives", expected[kBackwardCommCounts]},
                  {kBackwardCommBytes, "backward collective bytes", expected[kBackwardCommBytes]},
                  {kGradDtypes, "gradient dtypes", expected[kGradDtypes]}});
}

Scenario ReduceDtypeAfterFrozenFirstForward() {
  Scenario s;
  s.info.name = "fully_shard_mixed_precision/reduce_dtype_after_frozen_first_forward";
  s.info.description =
      "a root group with two float32 Linears and a frozen parameter of another dtype, "
      "param_dtype bfloat16, optionally a first forward with every parameter frozen: "
      "torch-2.4 raises on the frozen dtype, later releases reduce in the reduce dtype, "
      "torch-2.15 falling back to the floating parameters";
  s.info.seed_test =
      "test_fully_shard_mixed_precision.py::TestFullyShardMixedPrecisionTraining::"
      "test_reduce_dtype_after_frozen_first_forward";
  s.info.params = {
      ParamSpec::Axis("frozen_dtype",
                      "the frozen parameter's dtype, floating (the test's int64 needs an "
                      "all-gather of mixed dtypes)",
                      {"float64", "bfloat16"}),
      ParamSpec::Axis("frozen_first_forward",
                      "a first forward under no_grad with the whole model frozen, then layers "
                      "unfrozen (True: the test)",
                      {"True", "False"}),
      ParamSpec::Axis("reduce_dtype", "MixedPrecisionPolicy.reduce_dtype (the test's float32)",
                      {"float32", "None"}),
      ParamSpec::SizeInt("dim",
                         "every Linear(dim, dim) and the frozen parameter's size (the "
                         "test's 16)",
                         16, /*minimum=*/1),
      SemanticsParam()};
  s.info.observations.Add(ObservationKey::String(
      kError, "the message of the error the sequence raised on this rank (\"\" when none)"));
  s.info.observations.Add(ObservationKey::IntegerMap(
      kBackwardCommCounts, "the backward's collectives, {CommDebugMode op key: n}"));
  s.info.observations.Add(ObservationKey::IntegerMap(
      kBackwardCommBytes, "the backward's collectives' payload bytes, {op key: bytes}"));
  s.info.observations.Add(ObservationKey::Custom(
      kGradDtypes, {{"type", "object"}, {"additionalProperties", {{"type", "string"}}}},
      "{parameter FQN: its .grad's dtype name, \"None\" without one} after the backward"));
  s.info.deterministic = true;
  s.info.default_world = 2;
  s.info.min_world = 2;
  s.info.max_world = 8;
  // Each profile's rule is its own: torch-2.4 raises, torch-2.8 reduces in reduce_dtype (else
  // param_dtype), torch-2.15 in float32.
  for (fsdp2::Semantics later : {fsdp2::Semantics::kTorch2_8, fsdp2::Semantics::kTorch2_15}) {
    s.info.extra_default_runs.push_back({3, {{kSemanticsParam, fsdp2::SemanticsName(later)}}});
    s.info.test_runs.push_back({2, {{kSemanticsParam, fsdp2::SemanticsName(later)}}});
  }
  s.run_rank = RunRank;
  s.expect = [](const CaseParams& p, int world) {
    return std::vector<nlohmann::json>(world, Expect(p, world));
  };
  s.judge = Judge;
  s.skip = [](const CaseParams& p, int) { return SkipReason(p); };
  return s;
}

}  // namespace

void RegisterFullyShardMixedPrecisionFrozenScenarios(ScenarioRegistry& registry) {
  registry.Add(ReduceDtypeAfterFrozenFirstForward());
}

}  // namespace fsdp::conformance
