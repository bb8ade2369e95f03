// Parameters and helpers shared by the train-parity families (parity/single/*, parity/fsdp/*,
// and the sharded-training scenarios of fully_shard_autograd/*): the optimizer axis, learning
// rates, tolerances per dtype, the one decoding of a case's parameters (ParityCase), and the
// tensor-name prefix of each step's observations. Stateless; thread-safe.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "conformance/checks.h"
#include "conformance/model_zoo.h"
#include "conformance/params.h"
#include "conformance/scenario.h"
#include "engine/core/dtype.h"

namespace fsdp::conformance {

// The parameters of a parity scenario for zoo model `kind`: optim axis, `dtype_param` (an axis
// or a size), seed, steps, loss, learning rates, momentum, nesterov, tolerances, then the model's
// own knobs.
std::vector<ParamSpec> ParityParams(const ZooModelKind& kind, ParamSpec dtype_param);

// Scenario::excluded of a parity family: the reason a case with nesterov=True or a dampening
// and an optimizer other than SGD does not run (Adam and AdamW have neither), or with both
// (SGD rejects Nesterov with dampening), or with amsgrad=True and SGD, else nullopt.
std::optional<std::string> NesterovNeedsSgd(const CaseParams& params, int world);

// The "loss" parameter of the parity families for `kind`: "squares" or "sum" (the seeds'
// out.sum()); ZooModel::LossAt. The default is a loss bounded below: "sum" for a model whose
// output is a ReLU's (ZooModelKind::relu_output), "squares" otherwise.
ParamSpec LossParam(const ZooModelKind& kind);

// A parity case's parameters (ParityParams plus "dtype"), decoded once: what every body and
// judge of the parity families reads at its top.
struct ParityCase {
  ZooModel model;                 // ZooModel::Make(kind, params): the kind's own knobs
  uint64_t seed = 0;              // "seed": the zoo's weights and inputs
  DType dtype = DType::kFloat32;  // "dtype": the engine's parameter and input dtype
  int64_t steps = 0;              // "steps": training steps (>= 1)
  OptimConfig optim;  // "optim", "sgd_lr" / "adam_lr", "momentum", "nesterov", "dampening",
                      // "amsgrad", "maximize"
  Tolerance float_tolerance;      // "atol", "rtol"
  Tolerance float64_tolerance;    // "atol_float64", "rtol_float64"

  // atol/rtol for values computed in `computed_in` (float64 has its own pair).
  Tolerance ToleranceFor(DType computed_in) const;
};
// Decodes the case of zoo model `kind`. Throws InvalidArgument when steps < 1 (and what
// CaseParams and ZooModel::Make throw for missing or malformed parameters).
ParityCase DecodeParityCase(const std::string& kind, const CaseParams& params);
// The runner-owned inputs of a parity case of zoo model `kind` (Scenario::inputs): the model's
// weights and every rank's per-step batches (ZooModel::MakeCaseInputs with the case's seed,
// dtype and steps).
InputsFn ParityInputs(const std::string& kind);
// Rank `rank`'s loss dtype and losses against the expected observations (keys "loss_dtype" and
// "losses"), the losses at the tolerance of the expected loss dtype.
void CheckRankLosses(CheckList& checks, const ParityCase& c,
                     const std::vector<nlohmann::json>& expected,
                     const std::vector<nlohmann::json>& per_rank, int rank);
// "step<k>/": the prefix of step k's parameters in the observations.
std::string StepPrefix(int64_t step);
// "grad<k>/": the prefix of step k's gradients (after backward, before the optimizer step).
std::string GradPrefix(int64_t step);
// The schema of TrainingObservations: losses, loss_dtype, "step{k}/{fqn}" parameters and, with
// `with_grads`, "grad{k}/{fqn}" gradients; `parameters` says what the parameter tensors hold.
ObservationSchema TrainingSchema(const std::string& parameters, bool with_grads);
// A training run's observations: losses, "loss_dtype", and `tensors` with every step's
// parameters (StepPrefix) and, when recorded, gradients (GradPrefix), in `dtype`.
nlohmann::json TrainingObservations(const EngineTrainingRecord& record, DType dtype);

}  // namespace fsdp::conformance
