// Family `parity/single` (scenarios `parity/single/<model>`): the engine on one rank against the
// oracle (reference/), one scenario per zoo model (conformance/model_zoo.h). Both train the model
// for `steps` steps from the same weights and inputs: each step a fresh input, forward, the seed's
// loss, backward, optimizer step (SGD with momentum, with and without nesterov, Adam or AdamW,
// each with weight_decay 1e-2: added to the gradient, or AdamW's decoupled decay), then zero_grad
// with set_to_none alternating (True after even steps, as test_fully_shard_comm.py's prefetch test
// does). Every step's loss and every parameter after every step must agree within the scenario's
// tolerance; the report carries the largest absolute and relative errors. The engine computes in
// `dtype` (weights and inputs rounded to it); the oracle computes in double from the same rounded
// values.
//
// Learning rates: Adam and AdamW use the seeds' 1e-2; SGD (momentum 0.9) the zoo's per-model sgd_lr
// (1e-3, the Transformer 3e-4), small enough that the seeds' unbounded sum losses do not
// diverge within the steps (see ZooModelKind::sgd_lr).
//
// Tolerances (|a - e| <= atol + rtol |e|), measured over seeds 0-7 on x86-64 with the default
// sizes: float32 atol 1e-5, rtol 1e-4 (at most 4.4% of it used by a loss and 3.3% by a
// parameter); float64 atol 1e-12, rtol 1e-10 (under 0.1% used by parameters). Losses computed
// in float32 (the Transformer's, whatever the parameters' dtype) are judged with the float32
// tolerance.
// The figures report, per case, the largest absolute and relative errors of the losses and of
// the parameters (relative over |e| >= atol) and the share of the tolerance used.
//
// Observations (rank 0): losses, "param_names", tensors "step<k>/<fqn>" (parameters after the
// optimizer step of step k).
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "conformance/model_zoo.h"
#include "conformance/observations.h"
#include "conformance/parity_common.h"
#include "conformance/scenario_registry.h"

namespace fsdp::conformance {

namespace {

constexpr const char* kFamily = "parity/single";

nlohmann::json RunParityRank(const std::string& kind, RankEnv& env) {
  const ParityCase c = DecodeParityCase(kind, env.params);
  nn::ModulePtr module = c.model.BuildEngineFromInputs(env.Inputs(), c.dtype);
  const EngineTrainingRecord record = TrainEngine(c.model, *module, c.optim, env.Inputs(), c.steps);
  nlohmann::json obs = TrainingObservations(record, c.dtype);
  obs["param_names"] = ParameterNamesOf(*module);
  return obs;
}

void JudgeParity(const std::string& kind, const CaseParams& p,
                 const std::vector<nlohmann::json>& per_rank, CheckList& checks) {
  const ParityCase c = DecodeParityCase(kind, p);
  const Tolerance tol = c.ToleranceFor(c.dtype);

  checks.CheckEqual("parameter FQNs (named_parameters order)", c.model.ParameterNames(),
                    RankObservation(per_rank, 0, "param_names"));
  const std::vector<reference::StepRecord<double>> expected =
      TrainOracle(c.model, c.optim, c.seed, c.steps, c.dtype, /*world=*/1);

  std::vector<double> expected_losses;
  for (const auto& record : expected) expected_losses.push_back(record.rank_losses.at(0));
  const std::vector<double> losses = Losses(per_rank, 0);
  // Losses are judged at the precision they were computed in (float32 for a model whose
  // output is float32 even with float64 parameters).
  const DType loss_dtype =
      ParseDType(RankObservation(per_rank, 0, "loss_dtype").get<std::string>());
  const Tolerance loss_tol = c.ToleranceFor(loss_dtype);
  checks.CheckClose("losses vs oracle", expected_losses, losses, loss_tol);
  const ErrorStats loss_err = CompareValues(expected_losses, losses, loss_tol);

  ErrorStats param_err;
  for (int64_t k = 0; k < c.steps; ++k) {
    const reference::RefTensorMap actual = MapFromObservations(per_rank, 0, StepPrefix(k));
    param_err.Merge(CheckMapsClose(checks, "step " + std::to_string(k) + " parameters",
                                   expected[static_cast<size_t>(k)].params, actual, tol));
  }
  checks.SetFigure("steps", c.steps);
  checks.SetFigure("final_loss", expected_losses.empty() ? 0.0 : expected_losses.back());
  checks.SetFigure("loss_max_abs_err", loss_err.max_abs);
  checks.SetFigure("loss_max_rel_err", loss_err.max_rel);
  checks.SetFigure("param_max_abs_err", param_err.max_abs);
  checks.SetFigure("param_max_rel_err", param_err.max_rel);
  checks.SetFigure("loss_tolerance_used", loss_err.tolerance_used);
  checks.SetFigure("param_tolerance_used", param_err.tolerance_used);
}

Scenario MakeParityScenario(const ZooModelKind& kind) {
  Scenario s;
  s.info.name = std::string(kFamily) + "/" + kind.name;
  s.info.description =
      kind.description + ": engine on one rank vs the oracle, every step's loss and parameters";
  s.info.seed_test = kind.seed_test;
  s.info.params = ParityParams(
      kind, ParamSpec::Axis("dtype", "the engine's parameter and input dtype",
                            {"float32", "float64"}));
  // The optimizers' update rules are judged here, on one rank: AdamW besides SGD and Adam, and
  // a weight decay (AdamW's default) so that coupled and decoupled decay differ.
  for (ParamSpec& p : s.info.params) {
    if (p.name == "optim") {
      p = ParamSpec::Axis("optim", "optimizer: SGD with momentum, Adam or AdamW",
                          {"sgd", "adam", "adamw"});
    } else if (p.name == "nesterov") {
      // Nesterov momentum is judged here too: SGD runs with and without it.
      p = ParamSpec::Axis("nesterov", p.description, {"False", "True"});
    } else if (p.name == "dampening") {
      // And SGD's dampening, whose first step keeps buf = g undampened (cases with Adam or
      // Nesterov momentum are excluded).
      p = ParamSpec::Axis("dampening", p.description, {"0", "0.5"});
    } else if (p.name == "amsgrad") {
      // And Adam's and AdamW's amsgrad (SGD cases with it are excluded).
      p = ParamSpec::Axis("amsgrad", p.description, {"False", "True"});
    } else if (p.name == "maximize" && kind.name == "mlp") {
      // And every optimizer's maximize, on one model (gradient ascent on the squares loss).
      p = ParamSpec::Axis("maximize", p.description, {"False", "True"});
    } else if (p.name == "weight_decay") {
      p = ParamSpec::SizeDouble("weight_decay", p.description, 1e-2);
    }
  }
  // The learning rate an LR scheduler set: every optimizer must step with its param group's
  // lr, not the one it was built with (an extra default run of mlp, every optimizer).
  s.info.params.push_back(ParamSpec::SizeInt(
      "lr_step_size",
      "0: a constant learning rate; N > 0: StepLR(optimizer, step_size=N, gamma=0.1) stepped "
      "after every optimizer step (the lr times 0.1 from step N on, 0.01 from step 2N on, ...)",
      0, /*minimum=*/0));
  if (kind.name == "mlp") {
    s.info.extra_default_runs = {{1,
                                  {{"lr_step_size", "4"},
                                   {"dtype", "float64"},
                                   {"nesterov", "False"},
                                   {"dampening", "0"},
                                   {"amsgrad", "False"},
                                   {"maximize", "False"}}}};
  }
  s.excluded = NesterovNeedsSgd;
  s.info.observations = TrainingSchema("the full parameter", /*with_grads=*/false);
  s.info.deterministic = true;
  s.info.observations.Add(ObservationKey::StringList(
      "param_names", "the FQNs of named_parameters(), in order"));
  s.info.default_world = 1;
  s.info.min_world = 1;
  s.info.max_world = 1;
  s.info.requirements.devices = {DeviceType::kCPU};
  const std::string name = kind.name;
  s.info.inputs = ZooInputsDoc(kind, "the case's dtype");
  s.inputs = ParityInputs(name);
  s.run_rank = [name](RankEnv& env) { return RunParityRank(name, env); };
  s.judge = [name](const CaseParams& p, int, const std::vector<nlohmann::json>& per_rank,
                   CheckList& checks) { JudgeParity(name, p, per_rank, checks); };
  return s;
}

}  // namespace

void RegisterParitySingleScenarios(ScenarioRegistry& registry) {
  for (const ZooModelKind& kind : ZooModel::Kinds()) registry.Add(MakeParityScenario(kind));
}

}  // namespace fsdp::conformance
