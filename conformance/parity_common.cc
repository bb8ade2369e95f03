#include "conformance/parity_common.h"

#include "conformance/observations.h"
#include "engine/core/error.h"

namespace fsdp::conformance {

std::vector<ParamSpec> ParityParams(const ZooModelKind& kind, ParamSpec dtype_param) {
  std::vector<ParamSpec> params = {
      ParamSpec::Axis("optim", "optimizer: SGD with momentum, or Adam", {"sgd", "adam"}),
      std::move(dtype_param),
      ParamSpec::SizeInt("seed", "seed of the zoo's weights and inputs", 0),
      ParamSpec::SizeInt("steps", "training steps", 10, /*minimum=*/1),
      LossParam(kind),
      ParamSpec::SizeDouble("sgd_lr", "SGD learning rate (ZooModelKind::sgd_lr)", kind.sgd_lr),
      ParamSpec::SizeDouble("adam_lr", "Adam learning rate (the seeds' 1e-2)", 1e-2),
      ParamSpec::SizeDouble("momentum", "SGD momentum", 0.9),
      ParamSpec::SizeBool("nesterov",
                          "SGD nesterov: Nesterov momentum (the step uses g + momentum * buf, not "
                          "buf); needs optim=sgd",
                          false),
      ParamSpec::SizeDouble("dampening",
                            "SGD dampening: buf = momentum * buf + (1 - dampening) * g after the "
                            "first step (whose buf = g, undampened); needs optim=sgd and "
                            "nesterov=False",
                            0.0),
      ParamSpec::SizeBool("amsgrad",
                          "Adam/AdamW amsgrad: the denominator uses the running max of exp_avg_sq; "
                          "needs optim=adam or adamw",
                          false),
      ParamSpec::SizeBool("maximize", "the optimizer's maximize (the gradient negated)", false),
      ParamSpec::SizeDouble("weight_decay",
                            "the optimizer's weight_decay (SGD and Adam: added to the gradient; "
                            "AdamW: decoupled, p *= 1 - lr * weight_decay)",
                            0.0),
      ParamSpec::SizeDouble("atol", "atol of losses and parameters, float32", 1e-5),
      ParamSpec::SizeDouble("rtol", "rtol of losses and parameters, float32", 1e-4),
      ParamSpec::SizeDouble("atol_float64", "atol of losses and parameters, float64", 1e-12),
      ParamSpec::SizeDouble("rtol_float64", "rtol of losses and parameters, float64", 1e-10)};
  params.insert(params.end(), kind.params.begin(), kind.params.end());
  return params;
}

std::optional<std::string> NesterovNeedsSgd(const CaseParams& params, int /*world*/) {
  const bool sgd = params.GetString("optim") == "sgd";
  const std::string other = params.GetString("optim") == "adamw" ? "AdamW" : "Adam";
  if (params.GetBool("nesterov") && !sgd) {
    return "nesterov=True is an option of SGD only (torch.optim." + other + " has none)";
  }
  if (params.GetDouble("dampening") != 0.0 && !sgd) {
    return "dampening is an option of SGD only (torch.optim." + other + " has none)";
  }
  if (params.GetBool("amsgrad") && sgd) {
    return "amsgrad is an option of Adam and AdamW only (torch.optim.SGD has none)";
  }
  if (params.GetDouble("dampening") != 0.0 && params.GetBool("nesterov")) {
    return "Nesterov momentum requires zero dampening (torch.optim.SGD raises)";
  }
  return std::nullopt;
}

ParamSpec LossParam(const ZooModelKind& kind) {
  ParamSpec p = ParamSpec::SizeString(
      "loss",
      "squares: (out * out).sum(), bounded below, so training converges and the output gradients "
      "depend on the outputs (the default, except for a model whose output is a ReLU's); sum: "
      "the seeds' out.sum(), unbounded below for a linear output, so the loss diverges "
      "(DoubleLinear keeps its seed's (out1 * out2).sum() before loss_switch_step either way)",
      kind.relu_output ? "sum" : "squares");
  p.domain = ParamDomain{"sum or squares", [](const std::string& v) -> std::optional<std::string> {
                           if (v == "squares" || v == "sum") return v;
                           return std::nullopt;
                         }};
  return p;
}

Tolerance ParityCase::ToleranceFor(DType computed_in) const {
  return computed_in == DType::kFloat64 ? float64_tolerance : float_tolerance;
}

ParityCase DecodeParityCase(const std::string& kind, const CaseParams& params) {
  // Braced initialization evaluates left to right: the model's own parameters first.
  ParityCase c{ZooModel::Make(kind, params),
               static_cast<uint64_t>(params.GetInt("seed")),
               ParseDType(params.GetString("dtype")),
               params.GetInt("steps"),
               OptimConfig{},
               Tolerance{params.GetDouble("atol"), params.GetDouble("rtol")},
               Tolerance{params.GetDouble("atol_float64"), params.GetDouble("rtol_float64")}};
  FSDP_CHECK(c.steps >= 1, "steps must be positive, got ", c.steps);
  c.optim.kind = params.GetString("optim");
  c.optim.lr = params.GetDouble(c.optim.kind == "sgd" ? "sgd_lr" : "adam_lr");
  c.optim.momentum = params.GetDouble("momentum");
  c.optim.nesterov = params.GetBool("nesterov");
  FSDP_CHECK(!c.optim.nesterov || c.optim.kind == "sgd",
             "nesterov=True needs optim=sgd, got optim=", c.optim.kind);
  c.optim.dampening = params.GetDouble("dampening");
  c.optim.amsgrad = params.GetBool("amsgrad");
  c.optim.maximize = params.GetBool("maximize");
  c.optim.weight_decay = params.GetDouble("weight_decay");
  // A scenario that declares it (parity/single) schedules the learning rate.
  if (params.has("lr_step_size")) c.optim.lr_step_size = params.GetInt("lr_step_size");
  return c;
}

InputsFn ParityInputs(const std::string& kind) {
  return [kind](const CaseParams& params, int world) {
    const ParityCase c = DecodeParityCase(kind, params);
    return c.model.MakeCaseInputs(c.seed, c.dtype, c.steps, world);
  };
}

void CheckRankLosses(CheckList& checks, const ParityCase& c,
                     const std::vector<nlohmann::json>& expected,
                     const std::vector<nlohmann::json>& per_rank, int rank) {
  const std::string who = "rank " + std::to_string(rank);
  const nlohmann::json& loss_dtype = RankObservation(expected, rank, "loss_dtype");
  checks.CheckEqual(who + " loss dtype", loss_dtype, RankObservation(per_rank, rank, "loss_dtype"));
  checks.CheckClose(who + " losses vs oracle", Losses(expected, rank), Losses(per_rank, rank),
                    c.ToleranceFor(ParseDType(loss_dtype.get<std::string>())));
}

std::string StepPrefix(int64_t step) { return "step" + std::to_string(step) + "/"; }

std::string GradPrefix(int64_t step) { return "grad" + std::to_string(step) + "/"; }

ObservationSchema TrainingSchema(const std::string& parameters, bool with_grads) {
  ObservationSchema schema;
  schema.Add(ObservationKey::Losses(
      "the rank's loss of every step, in order (the loss of the rank's own batch)"));
  schema.Add(ObservationKey::String(
      "loss_dtype", "the dtype the loss was computed in (float32 for the Transformer, whose "
                    "forward ends with .float(); otherwise the case's dtype)"));
  schema.AddTensors({"step{k}/{fqn}", "the case's dtype",
                     parameters + " (shape as stored)",
                     "every parameter after optimizer step k, by named_parameters() FQN (a tied "
                     "parameter once, under its first FQN)"});
  if (with_grads) {
    schema.AddTensors({"grad{k}/{fqn}", "the case's dtype", "like step{k}/{fqn}",
                       "each parameter's .grad after backward k, before optimizer step k (absent "
                       "when the .grad is None)"});
  }
  return schema;
}

nlohmann::json TrainingObservations(const EngineTrainingRecord& record, DType dtype) {
  nlohmann::json obs;
  obs[kLosses] = record.losses;
  obs["loss_dtype"] = DTypeName(record.loss_dtype);
  nlohmann::json tensors = nlohmann::json::object();
  for (size_t k = 0; k < record.parameters.size(); ++k) {
    const auto step = static_cast<int64_t>(k);
    tensors.update(MapToJson(record.parameters[k], DTypeName(dtype), StepPrefix(step)));
    if (k < record.gradients.size()) {
      tensors.update(MapToJson(record.gradients[k], DTypeName(dtype), GradPrefix(step)));
    }
  }
  obs[kTensors] = std::move(tensors);
  return obs;
}

}  // namespace fsdp::conformance
