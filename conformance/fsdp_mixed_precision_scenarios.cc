// Family `fsdp_mixed_precision`: which dtype each module's forward receives under
// FullyShardedDataParallel (FSDP1) instances with different MixedPrecision configs
// (test_fsdp_mixed_precision.py, TestFSDPDifferentSubmodulePrecision):
//   different_submodule_precision     test_float16_on_one_submodule, its _skip_inputs variant,
//                                     test_submodules_with_different_precisions, and a root
//                                     with cast_root_forward_inputs=False
//   submodules_with_external_inputs   test_submodules_with_external_inputs, its input y passed
//                                     positionally (the test) or by keyword, with the
//                                     submodule's cast_forward_inputs off (the test) and on,
//                                     under a root in param_dtype (the test) or without
//                                     mixed precision
//
// Every rank builds the test's model (Linear(dim, dim) layers in float32, weights from
// ManualSeed(0): the values play no part), wraps the configured submodule in its own instance,
// then the model in the root instance, runs model(x).sum().backward() on x = zeros(2, dim) and
// reports the dtype each module's forward saw (the test's forward_inputs) and the output's.
// The expectation plays FSDP1's rules (_runtime_utils.py, 2.4 to 2.15) instance by instance:
//  * the root's `_root_pre_forward` casts every floating-point tensor of its args and kwargs to
//    its param_dtype when cast_root_forward_inputs (default True) and a param_dtype are set;
//  * every instance's `_pre_forward` (the root's too) casts its args and kwargs the same way
//    when cast_forward_inputs (default False) and a param_dtype are set;
//  * a Linear computes in the param_dtype of the instance whose flat parameter holds its
//    weight (the parameters' float32 without one), and nothing casts an instance's output.
// A module of the test that casts its input itself (SaveForwardInputsModule's
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
#include "conformance/rank_checks.h"
#include "conformance/scenario_registry.h"
#include "engine/fsdp1/fully_sharded_data_parallel.h"
#include "engine/functional/functional.h"
#include "engine/nn/init.h"

namespace fsdp::conformance {

namespace {

constexpr const char* kSeed = "test_fsdp_mixed_precision.py::TestFSDPDifferentSubmodulePrecision::";

// One subtest's configuration: the MixedPrecision of each instance by the FQN of the module it
// wraps ("" the root, wrapped last), and whether SaveForwardInputsModule casts its input itself.
struct Fsdp1CastCase {
  std::map<std::string, fsdp1::MixedPrecision> configs;
  bool module_casts = false;
};

fsdp1::MixedPrecision Config(std::optional<DType> param_dtype, bool cast_forward_inputs) {
  fsdp1::MixedPrecision mp;
  mp.param_dtype = param_dtype;
  mp.cast_forward_inputs = cast_forward_inputs;
  return mp;
}

// TestFSDPDifferentSubmodulePrecision's subtest `subtest` with low-precision dtype `low`: c2 in
// its own instance, the root around the model.
Fsdp1CastCase DifferentSubmoduleCase(const std::string& subtest, DType low) {
  Fsdp1CastCase c;
  c.configs[""] = {};
  if (subtest == "float16_on_one_submodule") {
    c.configs["c2"] = Config(low, true);
  } else if (subtest == "float16_on_one_submodule_skip_inputs") {
    c.configs["c2"] = Config(low, false);
    c.module_casts = true;
  } else if (subtest == "submodules_with_different_precisions") {
    c.configs["c2"] = Config(low, true);
    c.configs[""] = Config(DType::kFloat32, true);
  } else if (subtest == "root_without_cast_root_forward_inputs") {
    // The suite's: the root in param_dtype with cast_root_forward_inputs=False leaves the
    // model's input alone; the modules cast their input to their weights' dtype themselves.
    c.configs[""] = Config(low, false);
    c.configs[""].cast_root_forward_inputs = false;
    c.module_casts = true;
  } else {
    FSDP_THROW(ErrorCode::kInvalidArgument, "different_submodule_precision: unknown subtest '",
               subtest, "'");
  }
  return c;
}

// test_submodules_with_external_inputs: l2 in its own instance with param_dtype `low` and
// cast_forward_inputs `submodule_cast`; the root with param_dtype `low` (`root_low`) or none.
Fsdp1CastCase ExternalInputsCase(DType low, bool submodule_cast, bool root_low) {
  Fsdp1CastCase c;
  c.configs["l2"] = Config(low, submodule_cast);
  c.configs[""] = root_low ? Config(low, false) : fsdp1::MixedPrecision{};
  return c;
}

// The instance that manages module `fqn`'s own parameters: its own, else the root (the test's
// models have one level of children).
const fsdp1::MixedPrecision& ManagingConfig(const Fsdp1CastCase& c, const std::string& fqn) {
  auto it = c.configs.find(fqn);
  return it != c.configs.end() ? it->second : c.configs.at("");
}

// The dtype of a floating-point input after the pre-forward of the instance wrapping module
// `fqn` (a module without its own instance casts nothing).
DType AfterPreForward(const Fsdp1CastCase& c, const std::string& fqn, DType in) {
  auto it = c.configs.find(fqn);
  if (it == c.configs.end() || !it->second.param_dtype) return in;
  const fsdp1::MixedPrecision& mp = it->second;
  const bool casts = mp.cast_forward_inputs || (fqn.empty() && mp.cast_root_forward_inputs);
  return casts ? *mp.param_dtype : in;
}

// The compute dtype (and output dtype) of module `fqn`'s Linear.
DType ComputeDtype(const Fsdp1CastCase& c, const std::string& fqn) {
  return ManagingConfig(c, fqn).param_dtype.value_or(DType::kFloat32);
}

nlohmann::json ExpectDifferentSubmodule(const Fsdp1CastCase& c) {
  nlohmann::json seen = nlohmann::json::object();
  DType h = AfterPreForward(c, "", DType::kFloat32);
  seen[""] = DTypeName(h);
  for (const std::string& child : {std::string("c1"), std::string("c2")}) {
    h = AfterPreForward(c, child, h);
    seen[child] = DTypeName(h);
    h = ComputeDtype(c, child);
  }
  return {{kForwardInputDtypes, seen}, {kForwardOutputDtype, DTypeName(h)}};
}

nlohmann::json ExpectExternalInputs(const Fsdp1CastCase& c) {
  const DType x = AfterPreForward(c, "", DType::kFloat32);
  return {{kForwardInputDtypes,
           {{"model_input_x", DTypeName(x)},
            {"l2_input_x", DTypeName(AfterPreForward(c, "l2", ComputeDtype(c, "l1")))},
            {"l2_input_y", DTypeName(AfterPreForward(c, "l2", DType::kFloat32))}}},
          {kForwardOutputDtype, DTypeName(ComputeDtype(c, "l2"))}};
}

// Every configured submodule wrapped in its own instance (model.c2 = FSDP(model.c2, ...)),
// then the root; forward on zeros(2, dim), sum().backward(); the observations.
nlohmann::json RunCastCase(const nn::ModulePtr& model, const Fsdp1CastCase& c,
                           const std::shared_ptr<ForwardInputs>& forward_inputs, int64_t dim,
                           RankEnv& env) {
  for (const auto& [fqn, mp] : c.configs) {
    if (fqn.empty()) continue;
    fsdp1::FullyShardedDataParallelOptions options;
    options.process_group = env.pg;
    options.mixed_precision = mp;
    model->register_module(
        fqn, std::make_shared<fsdp1::FullyShardedDataParallel>(model->get_submodule(fqn), options));
  }
  fsdp1::FullyShardedDataParallelOptions root_options;
  root_options.process_group = env.pg;
  root_options.mixed_precision = c.configs.at("");
  auto fsdp_model = std::make_shared<fsdp1::FullyShardedDataParallel>(model, root_options);
  Tensor out = (*fsdp_model)(Tensor::zeros({2, dim}, DType::kFloat32, env.device)).tensor();
  fsdp::sum(out).backward();
  nlohmann::json seen(*forward_inputs);
  return {{kForwardInputDtypes, seen}, {kForwardOutputDtype, DTypeName(out.dtype())}};
}

ParamSpec LowDtype() {
  return ParamSpec::SizeString("param_dtype", "the low-precision MixedPrecision.param_dtype",
                               "float16");
}
ParamSpec Dim() {
  return ParamSpec::SizeInt("dim", "every Linear(dim, dim) (the test's 100)", 100, /*minimum=*/1);
}

using CastDecoder = std::function<Fsdp1CastCase(const CaseParams& params)>;
using CastModelFn = std::function<nn::ModulePtr(const CaseParams& params, const Fsdp1CastCase& c,
                                                std::shared_ptr<ForwardInputs> forward_inputs)>;
using CastExpectFn = std::function<nlohmann::json(const Fsdp1CastCase& c)>;

// A cast scenario: the test's world 2 (any world 1-8); every rank builds `model` (weights from
// ManualSeed(0)) and runs RunCastCase; the judge compares every rank with `expect`.
Scenario CastScenario(const std::string& name, const std::string& seed_test,
                      const std::string& description, std::vector<ParamSpec> params,
                      const std::string& keys, CastDecoder decode, CastModelFn model,
                      CastExpectFn expect) {
  Scenario s;
  s.info.name = "fsdp_mixed_precision/" + name;
  s.info.description = description;
  s.info.seed_test = std::string(kSeed) + seed_test;
  s.info.params = std::move(params);
  s.info.observations = ForwardInputsSchema(keys);
  s.info.deterministic = true;
  s.info.default_world = 2;
  s.info.min_world = 1;
  s.info.max_world = 8;
  s.run_rank = [decode, model](RankEnv& env) {
    const Fsdp1CastCase c = decode(env.params);
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

Scenario DifferentSubmodulePrecision() {
  return CastScenario(
      "different_submodule_precision", "test_float16_on_one_submodule",
      "SaveForwardInputsModel: c2 in an instance with param_dtype (cast_forward_inputs True, or "
      "False with the modules casting their input themselves), the root without mixed precision "
      "or with param_dtype float32, or only the root with param_dtype and "
      "cast_root_forward_inputs=False: the dtype each module's forward receives, the output's",
      {ParamSpec::Axis(
           "subtest",
           "float16_on_one_submodule: FSDP(c2, MixedPrecision(param_dtype, "
           "cast_forward_inputs=True)), FSDP(model); float16_on_one_submodule_skip_inputs: the "
           "same with cast_forward_inputs=False, the modules casting their input to their "
           "weight's dtype; submodules_with_different_precisions: the root with "
           "MixedPrecision(param_dtype=float32, cast_forward_inputs=True); "
           "root_without_cast_root_forward_inputs (the suite's): only the root, with "
           "MixedPrecision(param_dtype, cast_root_forward_inputs=False), the modules casting "
           "their input themselves",
           {"float16_on_one_submodule", "float16_on_one_submodule_skip_inputs",
            "submodules_with_different_precisions", "root_without_cast_root_forward_inputs"}),
       LowDtype(), Dim()},
      "\"\", c1, c2",
      [](const CaseParams& p) {
        return DifferentSubmoduleCase(p.GetString("subtest"),
                                      ParseDType(p.GetString("param_dtype")));
      },
      [](const CaseParams& p, const Fsdp1CastCase& c,
         std::shared_ptr<ForwardInputs> forward_inputs) {
        return std::make_shared<SaveForwardInputsModel>(std::move(forward_inputs), p.GetInt("dim"),
                                                        c.module_casts);
      },
      ExpectDifferentSubmodule);
}

Scenario SubmodulesWithExternalInputs() {
  Scenario s = CastScenario(
      "submodules_with_external_inputs", "test_submodules_with_external_inputs",
      "ToyModel: l2 in an instance with param_dtype and cast_forward_inputs False (the test) or "
      "True, the root with param_dtype (the test) or without mixed precision; l2 takes l1's "
      "output and a float32 tensor made in the root's forward, positionally or by keyword: only "
      "l2's own cast turns the external input into param_dtype",
      {ParamSpec::Axis("enable_submodule_cast", "l2's MixedPrecision.cast_forward_inputs",
                       {"False", "True"}),
       ParamSpec::Axis("y_by_keyword",
                       "l2 called as l2(h, y) (False, the test) or l2(h, y=y) (True)",
                       {"False", "True"}),
       ParamSpec::Axis("root_mixed_precision",
                       "param_dtype: the root's MixedPrecision(param_dtype) (the test); none: a "
                       "full-precision root, so l2 gets l1's float32 output",
                       {"param_dtype", "none"}),
       LowDtype(), Dim()},
      "model_input_x, l2_input_x, l2_input_y",
      [](const CaseParams& p) {
        return ExternalInputsCase(ParseDType(p.GetString("param_dtype")),
                                  p.GetBool("enable_submodule_cast"),
                                  p.GetString("root_mixed_precision") == "param_dtype");
      },
      [](const CaseParams& p, const Fsdp1CastCase&, std::shared_ptr<ForwardInputs> forward_inputs) {
        return std::make_shared<ToyModel>(std::move(forward_inputs), p.GetInt("dim"),
                                          p.GetBool("y_by_keyword"));
      },
      ExpectExternalInputs);
  s.excluded = [](const CaseParams& p, int) -> std::optional<std::string> {
    if (p.GetString("root_mixed_precision") == "none" && !p.GetBool("enable_submodule_cast")) {
      return "a full-precision root and no cast in l2 feed l2's low-precision Linear a float32 "
             "input, which F.linear refuses";
    }
    return std::nullopt;
  };
  return s;
}

}  // namespace

void RegisterFsdpMixedPrecisionScenarios(ScenarioRegistry& registry) {
  registry.Add(DifferentSubmodulePrecision());
  registry.Add(SubmodulesWithExternalInputs());
}

}  // namespace fsdp::conformance
