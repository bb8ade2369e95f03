// Parameters and helpers shared by the train-parity families (parity/single/*, parity/fsdp/*):
// the optimizer axis, learning rates, tolerances per dtype, and the tensor-name prefix of
// each step's observations. Stateless; thread-safe.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "conformance/checks.h"
#include "conformance/model_zoo.h"
#include "conformance/params.h"
#include "engine/core/dtype.h"

namespace fsdp::conformance {

// The parameters of a parity scenario for zoo model `kind`: optim axis, `dtype_param` (an axis
// or a size), seed, steps, learning rates, momentum, tolerances, then the model's own knobs.
std::vector<ParamSpec> ParityParams(const ZooModelKind& kind, ParamSpec dtype_param);
// The optimizer of a case (optim, sgd_lr / adam_lr, momentum).
OptimConfig ParityOptim(const CaseParams& params);
// atol/rtol for values computed in `dtype` (float64 has its own pair).
Tolerance ParityTolerance(const CaseParams& params, DType dtype);
// "step<k>/": the prefix of step k's parameters in the observations.
std::string StepPrefix(int64_t step);
// "grad<k>/": the prefix of step k's gradients (after backward, before the optimizer step).
std::string GradPrefix(int64_t step);
// A training run's observations: losses, "loss_dtype", and `tensors` with every step's
// parameters (StepPrefix) and, when recorded, gradients (GradPrefix), in `dtype`.
nlohmann::json TrainingObservations(const EngineTrainingRecord& record, DType dtype);

}  // namespace fsdp::conformance
