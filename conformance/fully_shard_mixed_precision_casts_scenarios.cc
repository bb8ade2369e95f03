// Family `fully_shard_mixed_precision`, its forward-cast scenarios
// (test_fully_shard_mixed_precision.py, TestFullyShardMixedPrecisionCasts): which dtype each
// module's forward receives under per-module MixedPrecisionPolicy's, with cast_forward_inputs
// on and off, an output_dtype, and an input a module receives from outside the FSDP module
// before it (not another FSDP module's output):
//   forward_input_casts               test_float16_on_one_submodule's three subtests, and a
//                                     root without parameters of its own that casts
//   submodules_with_external_inputs   test_submodules_with_external_inputs, its input y passed
//                                     positionally (the test) or by keyword
//
// Every rank builds the test's model (Linear(dim, dim) layers in float32, weights from
// ManualSeed(0): the values play no part), applies fully_shard as the subtest does, runs
// model(x).sum().backward() on x = zeros(2, dim) and reports the dtype each module's forward
// saw (the test's forward_inputs) and the model output's dtype. The expectation plays FSDP2's
// rules module by module (FSDPState._pre_forward / _post_forward): a module whose own
// fully_shard has cast_forward_inputs and a param_dtype casts every floating-point tensor of
// its args and kwargs to that dtype; its Linear computes in its group's param_dtype (the
// parameters' dtype without one); a group's output_dtype casts its floating-point outputs. A
// module of the test that casts its input itself (SaveForwardInputsModule's
// cast_forward_inputs) does so to its Linear's unsharded weight dtype.
//
// Stateless; thread-safe (run_rank builds its own module on every rank's thread).
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "conformance/forward_inputs_models.h"
#include "conformance/fsdp_params.h"
#include "conformance/observations.h"
#include "conformance/rank_checks.h"
#include "conformance/scenario_registry.h"
#include "engine/fsdp/fully_shard.h"
#include "engine/functional/functional.h"
#include "engine/nn/init.h"

namespace fsdp::conformance {

namespace {

constexpr const char* kCasts =
    "test_fully_shard_mixed_precision.py::TestFullyShardMixedPrecisionCasts::";

// One subtest's configuration: the policies of the fully_shard calls by module FQN ("" the
// root, always sharded), and whether SaveForwardInputsModule casts its input itself.
struct CastCase {
  std::map<std::string, fsdp2::MixedPrecisionPolicy> policies;
  bool module_casts = false;
};

fsdp2::MixedPrecisionPolicy Policy(std::optional<DType> param_dtype, bool cast_forward_inputs,
                                   std::optional<DType> output_dtype = std::nullopt) {
  fsdp2::MixedPrecisionPolicy policy;
  policy.param_dtype = param_dtype;
  policy.cast_forward_inputs = cast_forward_inputs;
  policy.output_dtype = output_dtype;
  return policy;
}

// test_float16_on_one_submodule's subtest `subtest` with low-precision dtype `low`.
CastCase ForwardInputCastCase(const std::string& subtest, DType low) {
  CastCase c;
  c.policies[""] = {};
  if (subtest == "c2_param_dtype") {
    c.policies["c2"] = Policy(low, true);
  } else if (subtest == "c2_param_dtype_module_casts") {
    c.policies["c2"] = Policy(low, false);
    c.module_casts = true;
  } else if (subtest == "c1_param_dtype_output_float32") {
    c.policies["c1"] = Policy(low, true, DType::kFloat32);
  } else if (subtest == "root_casts_without_own_params") {
    // The root manages no parameter (c1 and c2 have their own groups) but still casts: FSDP's
    // pre-forward casts the inputs by the module's policy whether it has a param group or not.
    c.policies[""] = Policy(low, true);
    c.policies["c1"] = Policy(low, false);
    c.policies["c2"] = Policy(low, false);
  } else {
    FSDP_THROW(ErrorCode::kInvalidArgument, "forward_input_casts: unknown subtest '", subtest, "'");
  }
  return c;
}

// test_submodules_with_external_inputs: l2 with param_dtype `low` and cast_forward_inputs
// `submodule_cast`, the root with param_dtype `low`.
CastCase ExternalInputsCase(DType low, bool submodule_cast) {
  CastCase c;
  c.policies["l2"] = Policy(low, submodule_cast);
  c.policies[""] = Policy(low, true);
  return c;
}

// The policy of the group managing module `fqn`'s own parameters: its own fully_shard's, else
// the root's (the test's models have one level of children).
const fsdp2::MixedPrecisionPolicy& GroupPolicy(const CastCase& c, const std::string& fqn) {
  auto it = c.policies.find(fqn);
  return it != c.policies.end() ? it->second : c.policies.at("");
}

// The dtype of a floating-point input after module `fqn`'s FSDP pre-forward (a module without
// its own fully_shard casts nothing).
DType AfterPreForward(const CastCase& c, const std::string& fqn, DType in) {
  auto it = c.policies.find(fqn);
  if (it == c.policies.end()) return in;
  const fsdp2::MixedPrecisionPolicy& p = it->second;
  return p.cast_forward_inputs && p.param_dtype ? *p.param_dtype : in;
}

// The dtype of module `fqn`'s output from its Linear's compute dtype and its output_dtype.
DType AfterForward(const CastCase& c, const std::string& fqn) {
  const fsdp2::MixedPrecisionPolicy& group = GroupPolicy(c, fqn);
  const DType compute = group.param_dtype.value_or(DType::kFloat32);
  auto it = c.policies.find(fqn);
  if (it != c.policies.end() && it->second.output_dtype) return *it->second.output_dtype;
  return compute;
}

// The model's output dtype from its last module's `out`: the root's output_dtype when set.
DType RootOutput(const CastCase& c, DType out) {
  return c.policies.at("").output_dtype.value_or(out);
}

// The rules' forward inputs and output dtype of SaveForwardInputsModel under `c`.
nlohmann::json ExpectForwardInputCasts(const CastCase& c) {
  nlohmann::json seen = nlohmann::json::object();
  DType h = AfterPreForward(c, "", DType::kFloat32);
  seen[""] = DTypeName(h);
  for (const std::string& child : {std::string("c1"), std::string("c2")}) {
    h = AfterPreForward(c, child, h);
    seen[child] = DTypeName(h);
    h = AfterForward(c, child);
  }
  return {{kForwardInputDtypes, seen}, {kForwardOutputDtype, DTypeName(RootOutput(c, h))}};
}

// The rules' forward inputs and output dtype of ToyModel under `c`.
nlohmann::json ExpectExternalInputs(const CastCase& c) {
  const DType x = AfterPreForward(c, "", DType::kFloat32);
  const DType l1_out = GroupPolicy(c, "l1").param_dtype.value_or(DType::kFloat32);
  return {{kForwardInputDtypes,
           {{"model_input_x", DTypeName(x)},
            {"l2_input_x", DTypeName(AfterPreForward(c, "l2", l1_out))},
            {"l2_input_y", DTypeName(AfterPreForward(c, "l2", DType::kFloat32))}}},
          {kForwardOutputDtype, DTypeName(RootOutput(c, AfterForward(c, "l2")))}};
}

// fully_shard on every configured module but the root, then on the root; forward on
// zeros(2, dim), sum().backward(); the observations.
nlohmann::json RunCastCase(const nn::ModulePtr& model, const CastCase& c,
                           const std::shared_ptr<ForwardInputs>& forward_inputs, int64_t dim,
                           RankEnv& env) {
  for (const auto& [fqn, policy] : c.policies) {
    if (fqn.empty()) continue;
    fsdp2::FullyShardOptions options;
    options.process_group = env.pg;
    options.mp_policy = policy;
    fsdp2::fully_shard(model->get_submodule(fqn), options);
  }
  fsdp2::FullyShardOptions root;
  root.process_group = env.pg;
  root.mp_policy = c.policies.at("");
  fsdp2::fully_shard(model, root);
  Tensor out = (*model)(Tensor::zeros({2, dim}, DType::kFloat32, env.device)).tensor();
  fsdp::sum(out).backward();
  nlohmann::json seen(*forward_inputs);
  return {{kForwardInputDtypes, seen}, {kForwardOutputDtype, DTypeName(out.dtype())}};
}

ParamSpec LowDtype() {
  return ParamSpec::SizeString("param_dtype", "the low-precision MixedPrecisionPolicy.param_dtype",
                               "float16");
}
ParamSpec Dim() {
  return ParamSpec::SizeInt("dim", "every Linear(dim, dim) (the test's 100)", 100, /*minimum=*/1);
}

// A case's configuration from its parameters.
using CastDecoder = std::function<CastCase(const CaseParams& params)>;
// The test's model for a case, recording its forward inputs into `forward_inputs`.
using CastModelFn = std::function<nn::ModulePtr(const CaseParams& params, const CastCase& c,
                                                std::shared_ptr<ForwardInputs> forward_inputs)>;
// The rules' observations of a case (the same on every rank).
using CastExpectFn = std::function<nlohmann::json(const CastCase& c)>;

// A cast scenario: the test's world 2 (any world 1-8); every rank builds `model` (weights from
// ManualSeed(0)) and runs RunCastCase; the judge compares every rank with `expect`.
Scenario CastScenario(const std::string& test, const std::string& seed_test,
                      const std::string& description, std::vector<ParamSpec> params,
                      const std::string& keys, CastDecoder decode, CastModelFn model,
                      CastExpectFn expect) {
  Scenario s;
  s.info.name = "fully_shard_mixed_precision/" + test;
  s.info.description = description;
  s.info.seed_test = std::string(kCasts) + seed_test;
  s.info.params = std::move(params);
  s.info.observations = ForwardInputsSchema(keys);
  s.info.deterministic = true;
  s.info.default_world = 2;
  s.info.min_world = 1;
  s.info.max_world = 8;
  s.run_rank = [decode, model](RankEnv& env) {
    const CastCase c = decode(env.params);
    auto forward_inputs = std::make_shared<ForwardInputs>();
    nn::ManualSeed(0);
    nn::ModulePtr m = model(env.params, c, forward_inputs);
    m->to(env.device);
    return RunCastCase(m, c, forward_inputs, env.params.GetInt("dim"), env);
  };
  s.expect = [decode, expect](const CaseParams& p, int world) {
    return std::vector<nlohmann::json>(world, expect(decode(p)));
  };
  s.judge = [decode, expect](const CaseParams& p, int world,
                             const std::vector<nlohmann::json>& per_rank, CheckList& checks) {
    const nlohmann::json expected = expect(decode(p));
    CheckEveryRank(checks, per_rank, world,
                   {{kForwardInputDtypes, "dtypes forward received", expected[kForwardInputDtypes]},
                    {kForwardOutputDtype, "output dtype", expected[kForwardOutputDtype]}});
  };
  return s;
}

Scenario ForwardInputCasts() {
  return CastScenario(
      "forward_input_casts", "test_float16_on_one_submodule",
      "SaveForwardInputsModel: fully_shard(c2) with param_dtype (cast_forward_inputs True, or "
      "False with the module casting itself), or fully_shard(c1) with param_dtype and "
      "output_dtype float32, then the root without mixed precision: the dtype each module's "
      "forward receives, the output's",
      {ParamSpec::Axis(
           "subtest",
           "c2_param_dtype: fully_shard(c2, param_dtype); "
           "c2_param_dtype_module_casts: the same with cast_forward_inputs=False, "
           "the modules casting their input to their weight's dtype; "
           "c1_param_dtype_output_float32: fully_shard(c1, param_dtype, "
           "output_dtype=float32); root_casts_without_own_params (the suite's): fully_shard(c1) "
           "and fully_shard(c2) with param_dtype and cast_forward_inputs=False, then the root, "
           "which has no parameter of its own, with param_dtype",
           {"c2_param_dtype", "c2_param_dtype_module_casts", "c1_param_dtype_output_float32",
            "root_casts_without_own_params"}),
       LowDtype(), Dim()},
      "\"\", c1, c2",
      [](const CaseParams& p) {
        return ForwardInputCastCase(p.GetString("subtest"), ParseDType(p.GetString("param_dtype")));
      },
      [](const CaseParams& p, const CastCase& c, std::shared_ptr<ForwardInputs> forward_inputs) {
        return std::make_shared<SaveForwardInputsModel>(std::move(forward_inputs), p.GetInt("dim"),
                                                        c.module_casts);
      },
      ExpectForwardInputCasts);
}

Scenario SubmodulesWithExternalInputs() {
  return CastScenario(
      "submodules_with_external_inputs", "test_submodules_with_external_inputs",
      "ToyModel: fully_shard(l2) with param_dtype and cast_forward_inputs True / False, the "
      "root with param_dtype; l2 takes l1's output and a float32 tensor made in the root's "
      "forward, positionally or by keyword: only l2's own cast turns the external input into "
      "param_dtype",
      {ParamSpec::Axis("enable_submodule_cast", "l2's MixedPrecisionPolicy.cast_forward_inputs",
                       {"False", "True"}),
       ParamSpec::Axis("y_by_keyword",
                       "l2 called as l2(h, y) (False, the test) or l2(h, y=y) (True)",
                       {"False", "True"}),
       LowDtype(), Dim()},
      "model_input_x, l2_input_x, l2_input_y",
      [](const CaseParams& p) {
        return ExternalInputsCase(ParseDType(p.GetString("param_dtype")),
                                  p.GetBool("enable_submodule_cast"));
      },
      [](const CaseParams& p, const CastCase&, std::shared_ptr<ForwardInputs> forward_inputs) {
        return std::make_shared<ToyModel>(std::move(forward_inputs), p.GetInt("dim"),
                                          p.GetBool("y_by_keyword"));
      },
      ExpectExternalInputs);
}

}  // namespace

void RegisterFullyShardMixedPrecisionCastScenarios(ScenarioRegistry& registry) {
  registry.Add(ForwardInputCasts());
  registry.Add(SubmodulesWithExternalInputs());
}

}  // namespace fsdp::conformance
