// The model zoo of the conformance suite: the seeds' test models, each available both as an
// engine module (engine/nn) and as an oracle model (reference/), with deterministic weights and
// inputs that the runner derives from a seed, so that every subject and the oracle see the
// same bytes. Scenario families build on it (models/*, parity_single/*, and the sharded
// families that train the same models under fully_shard).
//
//   ZooModel        one seed model at one configuration (its size knobs resolved from a
//                   scenario case): builds the engine module and the oracle model, makes the
//                   weights and the inputs, and runs forward + loss on the engine.
//   ZooInput        one batch: the oracle's ModelInput (values already rounded to the dtype the
//                   subject computes in) and the same values as an engine Tensor.
//   OptimConfig     SGD / Adam / AdamW hyper-parameters, built for the engine and the oracle.
//   conversions     engine Tensor <-> oracle RefTensor, FQN maps of parameters and gradients,
//                   state dicts, and the `tensors` observation format.
//
// [Note: zoo randomness] All values come from fsdp::Generator (Philox-4x32-10) with key `seed`;
// stream s starts at counter offset s * 2^40 (weights s = 0, buffers s = 1, the input of
// training step k s = 2 + k). Each value is 2 * uniform_double() - 1 = u in [-1, 1), drawn in
// row-major order, tensors in the oracle's ParameterSpecs() order, then scaled by the tensor's
// kind: 2-D embedding tables u; other 2-D weights [out, in] u / sqrt(in); 1-D "...weight"
// (norm scales) 1 + u / 5; other 1-D tensors (biases) u / 10; buffers u. Features are u;
// token ids are floor(uniform_double() * vocab_size). Values are then rounded to the subject's
// dtype (float32: the nearest float), and the oracle receives the rounded values as doubles,
// so engine and oracle start from identical numbers.
//
// Thread-safety: a ZooModel is immutable after Make(); its const members may be called from
// several rank threads at once. Engine modules it builds belong to the calling rank's thread.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "conformance/case_inputs.h"
#include "conformance/checks.h"
#include "conformance/params.h"
#include "engine/core/device.h"
#include "engine/core/dtype.h"
#include "engine/core/tensor.h"
#include "engine/nn/module.h"
#include "engine/optim/lr_scheduler.h"
#include "engine/optim/optimizer.h"
#include "reference/data_parallel.h"
#include "reference/loss.h"
#include "reference/model.h"
#include "reference/optimizers.h"
#include "reference/tensor.h"

namespace fsdp::conformance {

// ---- Conversions -------------------------------------------------------------------------------

// `values` rounded to what `dtype` can hold (float32: the nearest float; float64: unchanged;
// float16 and bfloat16: through float, then IEEE round-to-nearest-even, computed from the rule
// and not by the engine's conversions, so that judges can hold the engine's casts to it).
std::vector<double> RoundTo(std::vector<double> values, DType dtype);
reference::RefTensor RoundTo(reference::RefTensor tensor, DType dtype);
reference::RefTensorMap RoundTo(reference::RefTensorMap tensors, DType dtype);

// An engine tensor holding `t`'s values (converted to `dtype`) on `device`.
Tensor ToTensor(const reference::RefTensor& t, DType dtype, Device device = Device::CPU());
// An int64 engine tensor of token ids / targets.
Tensor ToTensor(const reference::IndexTensor& t, Device device = Device::CPU());
// The values of an engine tensor (any floating dtype, any device) as an oracle tensor.
reference::RefTensor ToRef(const Tensor& t);

// named_parameters() (tied parameters once, under their first FQN) as an oracle map.
reference::RefTensorMap ParametersOf(const nn::Module& module);
// The FQNs of named_parameters(), in order, without activation-checkpoint (and FSDP1) wrapper
// prefixes (fsdp1::CleanTensorName, FSDP's clean_tensor_name); the gradient helpers below
// report parameters under these names too.
std::vector<std::string> ParameterNamesOf(const nn::Module& module);
// The gradients of named_parameters(); a parameter whose .grad is None is absent.
reference::RefTensorMap GradientsOf(const nn::Module& module);
// The FQNs whose .grad is None.
std::vector<std::string> ParametersWithoutGrad(const nn::Module& module);

// The state dict that loads `params` and `buffers` into `module`: every key of
// module.state_dict(), each parameter key resolved to the FQN named_parameters() reports for
// that tensor (so a tied `output.weight` takes `tok_embeddings.weight`'s values), as `dtype`
// tensors on `device`. Throws NotFound naming the key when a value is missing.
nn::StateDict MakeStateDict(nn::Module& module, const reference::RefTensorMap& params,
                            const reference::RefTensorMap& buffers, DType dtype,
                            Device device = Device::CPU());
// module.load_state_dict(MakeStateDict(...)), strict.
void LoadWeights(nn::Module& module, const reference::RefTensorMap& params,
                 const reference::RefTensorMap& buffers, DType dtype);

// The `tensors` observation entries {prefix + fqn: {"shape", "dtype", "data"}} for a map.
nlohmann::json MapToJson(const reference::RefTensorMap& tensors, const std::string& dtype,
                         const std::string& prefix = "");
// The entries of a rank's `tensors` observation whose names start with `prefix`, keyed by the
// rest of the name. Throws DataLoss naming the rank when `tensors` is missing or malformed.
reference::RefTensorMap MapFromObservations(const std::vector<nlohmann::json>& per_rank, int rank,
                                            const std::string& prefix);

// ---- Judging helpers ---------------------------------------------------------------------------

// Largest errors of `actual` against `expected`: max |a - e|; max |a - e| / |e| over the
// elements with |e| >= tolerance.atol (smaller expected values are judged by atol alone); and
// the share of the tolerance used, max |a - e| / (atol + rtol * |e|) (<= 1 passes).
struct ErrorStats {
  double max_abs = 0;
  double max_rel = 0;
  double tolerance_used = 0;
  void Merge(const ErrorStats& other);
};
ErrorStats CompareValues(const std::vector<double>& expected, const std::vector<double>& actual,
                         Tolerance tolerance);

// Records one closeness check `name` over every tensor of `expected` (concatenated in key
// order) against `actual`; when it fails, also one check per mismatching FQN so the report
// names it. The key sets must match: an extra or missing FQN is a failed check of its own.
// Returns the error statistics. With `atol_scales` (FQN -> the magnitude of that tensor, e.g.
// MaxAbsByFqn of the expected values), tensor k is judged at atol x max(1, atol_scales[k]):
// the rounding of a float32 sum grows with the magnitudes summed, so an element that cancels to
// near zero is judged against its tensor's scale, not its own.
ErrorStats CheckMapsClose(CheckList& checks, const std::string& name,
                          const reference::RefTensorMap& expected,
                          const reference::RefTensorMap& actual, Tolerance tolerance,
                          const std::map<std::string, double>* atol_scales = nullptr);

// The largest |value| of each FQN over `maps` (e.g. every rank's shards of a tensor, whose union
// is the whole tensor).
std::map<std::string, double> MaxAbsByFqn(const std::vector<reference::RefTensorMap>& maps);

// ---- Optimizers --------------------------------------------------------------------------------

// Hyper-parameters of the optimizers the seeds use (torch.optim defaults otherwise).
struct OptimConfig {
  std::string kind = "sgd";   // Default: "sgd"; or "adam", "adamw"
  double lr = 1e-2;           // Default: 1e-2
  double momentum = 0.9;      // Default: 0.9 (SGD only)
  bool nesterov = false;      // Default: false (SGD only: g + momentum * buf instead of buf)
  double dampening = 0.0;     // Default: 0 (SGD only: buf = momentum * buf + (1 - dampening) * g
                              // after the first step, whose buf = g undampened)
  double weight_decay = 0.0;  // Default: 0 (AdamW: decoupled)
  bool amsgrad = false;       // Default: false (Adam and AdamW only: the running max of v)
  bool maximize = false;      // Default: false (every optimizer: the gradient negated)
  int64_t lr_step_size = 0;   // Default: 0 (no scheduler); else StepLR(step_size, gamma=0.1)
                              // stepped after every optimizer step
};

std::unique_ptr<optim::Optimizer> MakeEngineOptimizer(
    const OptimConfig& config, std::vector<std::pair<std::string, Tensor>> named_params);
std::unique_ptr<reference::Optimizer<double>> MakeOracleOptimizer(const OptimConfig& config);

// zero_grad(set_to_none=...) after optimizer step `step`, alternating like the seeds'
// `optim.zero_grad(set_to_none=(iter_idx % 2 == 0))`.
bool SetToNoneAfterStep(int64_t step);

// ---- Models ------------------------------------------------------------------------------------

// One batch of a zoo model: the oracle's input (features rounded to the subject's dtype, or
// token ids) and the dtype the engine tensor is made in.
struct ZooInput {
  reference::ModelInput<double> oracle;
  DType dtype = DType::kFloat32;  // Default: float32

  // The model's input as an engine tensor (features in `dtype`, or int64 tokens).
  Tensor ToEngine(Device device = Device::CPU()) const;
  // Rows [rank * b, (rank + 1) * b) with b = rows / world (data-parallel split of dim 0).
  ZooInput RankSlice(int rank, int world) const;
  int64_t rows() const;
};

// Static description of a zoo model kind (one per seed model).
struct ZooModelKind {
  std::string name;         // "transformer", "mlp", ... (scenario case names)
  std::string description;  // one line
  std::string seed_test;    // the seed test that uses it, file::Class::test
  // Size knobs with the seed's defaults (and axes such as use_second_linear).
  std::vector<ParamSpec> params;
  // SGD (momentum 0.9) learning rate for training scenarios over 10 steps. Default: 1e-3. The
  // seeds' losses are sums of outputs, unbounded below: at 1e-2 SGD diverges for the models
  // with a linear output and switches off every ReLU of MLP/MLPStack within 4 steps; the
  // Transformer's summed logits grow with the batch, and beyond 3e-4 (batch 2-4) its
  // parameters blow up chaotically, so that no two precisions agree.
  double sgd_lr = 1e-3;
  // The model's output (hence loss) is float32 whatever its parameters' dtype (the
  // Transformer's forward ends with `.float()`). Default: false (the parameters' dtype).
  bool float32_output = false;
  // The model's output is a ReLU's, so the seeds' out.sum() is already bounded below and is the
  // parity families' default loss for it; (out * out).sum() would drive every output to exactly
  // 0 within a few steps, where Adam's per-element normalisation magnifies float32 rounding of
  // the vanishing gradients into parameter errors far above the float32 tolerance.
  // Default: false (the default loss is (out * out).sum()).
  bool relu_output = false;

  // The dtype a loss of this model is computed in when its parameters are `dtype`.
  DType LossDType(DType dtype) const { return float32_output ? DType::kFloat32 : dtype; }
};

// One seed model at one configuration. Build with ZooModel::Make(kind, case parameters).
class ZooModel {
 public:
  // The kinds in the zoo, in a fixed order.
  static const std::vector<ZooModelKind>& Kinds();
  // Throws NotFound listing the kinds.
  static const ZooModelKind& Kind(const std::string& name);
  // `params` must hold the kind's parameters (missing ones take their defaults).
  static ZooModel Make(const std::string& kind, const CaseParams& params);

  const std::string& kind() const { return kind_; }
  const reference::Model<double>& oracle() const { return *oracle_; }
  std::vector<std::string> ParameterNames() const;  // the oracle's, registration order
  bool uses_tokens() const { return uses_tokens_; }
  int num_outputs() const { return oracle_->NumOutputs(); }

  // A fresh engine module (float32 parameters initialised from the rank's generator, as the
  // constructors do); convert with module->to(dtype) and load weights with LoadWeights.
  nn::ModulePtr BuildEngine() const;
  // Engine module in `dtype` holding exactly the weights of MakeParameters/MakeBuffers(seed).
  nn::ModulePtr BuildEngineWithWeights(uint64_t seed, DType dtype) const;
  // Engine module in `dtype` loaded (strictly) from the case's runner-owned weights.
  nn::ModulePtr BuildEngineFromInputs(const RankInputs& inputs, DType dtype) const;

  // The runner-owned inputs of a case that runs this model for `steps` steps on `world` ranks
  // (Scenario::inputs): weights = every key of the engine module's state dict (tied
  // parameters under each key) holding MakeParameters/MakeBuffers(seed, dtype); rank r gets
  // StepInputName(k) = rows [r * batch, (r + 1) * batch) of MakeInput(seed, k, dtype,
  // world * batch) for every step k, features in `dtype`, token ids in int64.
  CaseInputs MakeCaseInputs(uint64_t seed, DType dtype, int64_t steps, int world) const;

  // Weights and buffers of [Note: zoo randomness], rounded to `dtype`.
  reference::RefTensorMap MakeParameters(uint64_t seed, DType dtype) const;
  reference::RefTensorMap MakeBuffers(uint64_t seed, DType dtype) const;
  // The input of training step `step` with `rows` rows (the case's `batch` when 0).
  ZooInput MakeInput(uint64_t seed, int64_t step, DType dtype, int64_t rows = 0) const;
  int64_t batch() const { return batch_; }

  // The loss of step `step` (the seeds': `out.sum()`; DoubleLinear with both outputs uses
  // `(out1 * out2).sum()` before step `loss_switch_step` and `out1.sum()` from it on). A case
  // whose "loss" parameter is "squares" uses `(out * out).sum()` instead of `out.sum()` (and
  // `(out1 * out1).sum()` instead of `out1.sum()`): bounded below, so SGD converges instead of
  // driving the loss to minus infinity.
  reference::LossSpec LossAt(int64_t step) const;
  // Engine forward: the model's outputs (a tuple Value flattened into its tensors).
  std::vector<Tensor> Forward(nn::Module& module, const Tensor& input) const;
  // The loss of `spec` over engine outputs, with autograd: sums, means and (a * b).sum();
  // cross-entropy needs targets, which zoo inputs do not carry (InvalidArgument).
  static Tensor Loss(const std::vector<Tensor>& outputs, const reference::LossSpec& spec);
  // The submodule whose output the finite differences read instead of the model's output, or
  // "" for the model output itself: the Transformer casts its logits to float32 at the end
  // (`.float()`), which would drown central differences of a float64 model in rounding, so
  // they read the float64 output of its `output` projection (same values before the cast).
  const std::string& fd_output_module() const { return fd_output_module_; }
  // The oracle at that point: oracle() without the final cast to float32 (oracle() itself for
  // the models that have none).
  const reference::Model<double>& fd_oracle() const { return *fd_oracle_; }
  // Flat entries [begin, end) of a parameter that the forward reads but autograd treats as a
  // constant (an Embedding's padding_idx row): their finite differences are not the gradient
  // (which is zero there, judged against the oracle), so the judge does not compare them.
  struct FdConstantRange {
    std::string param;
    int64_t begin = 0;
    int64_t end = 0;
  };
  // True when entry `index` of `param` lies in one of the model's FdConstantRanges.
  bool FdConstant(const std::string& param, int64_t index) const;

 private:
  ZooModel() = default;

  std::string kind_;
  std::shared_ptr<const reference::Model<double>> oracle_;
  std::shared_ptr<const reference::Model<double>> fd_oracle_;
  std::function<nn::ModulePtr()> build_engine_;
  bool uses_tokens_ = false;
  int64_t vocab_size_ = 0;
  reference::Shape input_row_shape_;  // the shape of one row of features / tokens
  int64_t batch_ = 2;
  int64_t loss_switch_step_ = -1;  // -1: the loss never switches
  int switched_output_ = 0;        // the output the loss reads from loss_switch_step_ on
  bool squares_loss_ = false;      // the case's "loss" is "squares"
  std::string fd_output_module_;
  std::vector<FdConstantRange> fd_constant_ranges_;
};

// ---- Single-rank training ----------------------------------------------------------------------

// The description (ScenarioInfo::inputs) of ZooModel::MakeCaseInputs for a case of `kind` whose
// dtype is `dtype_text` ("the case's dtype", "float64").
InputsDoc ZooInputsDoc(const ZooModelKind& kind, const std::string& dtype_text);

// What TrainEngine reports for its rank.
struct EngineTrainingRecord {
  std::vector<double> losses;  // one per step, the rank's own loss
  // The dtype the losses were computed in (the Transformer's logits are float32 whatever the
  // parameters' dtype, as its forward ends with `.float()`). Default: float32.
  DType loss_dtype = DType::kFloat32;
  std::vector<reference::RefTensorMap> parameters;  // after each step's optimizer step
  // `.grad` after each step's backward, before the optimizer step (only when TrainEngine got a
  // gradient snapshot).
  std::vector<reference::RefTensorMap> gradients;
};

// How TrainEngine reads back the parameters after each step. Default: ParametersOf (plain
// modules); sharded families pass a snapshot that gathers the full parameters.
using ParameterSnapshot = std::function<reference::RefTensorMap(nn::Module& module)>;

// `steps` steps on the rank's runner-owned inputs: input `inputs.Get(StepInputName(step))`
// (the rank's slice of the step's global batch, ZooCaseInputs), forward, LossAt(step),
// backward, optimizer step over module.named_parameters(), zero_grad(SetToNoneAfterStep(step)).
// The module's parameters must live on one device (the inputs go there). `grad_snapshot`, when
// set, reads the gradients after each backward (before the optimizer step) into
// record.gradients.
// `before_optimizer_step`, when set, runs after each backward (and grad_snapshot), before the
// optimizer step (e.g. FSDP1's clip_grad_norm_).
EngineTrainingRecord TrainEngine(const ZooModel& model, nn::Module& module,
                                 const OptimConfig& optim_config, const RankInputs& inputs,
                                 int64_t steps, const ParameterSnapshot& snapshot = {},
                                 const ParameterSnapshot& grad_snapshot = {},
                                 const std::function<void()>& before_optimizer_step = {});
// The same with the caller's optimizer (its state stays with the caller), for steps
// [first_step, first_step + steps) of the inputs; `scheduler`, when set, steps right after
// every optimizer step (OptimConfig::lr_step_size's StepLR in TrainEngine).
EngineTrainingRecord TrainEngineSteps(const ZooModel& model, nn::Module& module,
                                      optim::Optimizer& optimizer, const RankInputs& inputs,
                                      int64_t first_step, int64_t steps,
                                      const ParameterSnapshot& snapshot = {},
                                      const ParameterSnapshot& grad_snapshot = {},
                                      const std::function<void()>& before_optimizer_step = {},
                                      optim::LRScheduler* scheduler = nullptr);

// The oracle's run of the same steps over `world` ranks, each step's global batch of
// world * model.batch() rows split by rank (world 1: the single-rank run above), from the
// weights MakeParameters(seed, dtype) and the inputs MakeInput(seed, step, dtype, rows).
// `flat_params`: FSDP1's flat parameters (reference::Fsdp1FlatParam).
// `clip`: clip_grad_norm_ before every optimizer step (StepRecord::grad_norm).
// `frozen`: parameters whose requires_grad is False (no gradient, never stepped).
std::vector<reference::StepRecord<double>> TrainOracle(
    const ZooModel& model, const OptimConfig& optim_config, uint64_t seed, int64_t steps,
    DType dtype, int world = 1, const std::vector<reference::Fsdp1FlatParam>& flat_params = {},
    const std::optional<reference::GradClip>& clip = std::nullopt,
    const std::vector<std::string>& frozen = {});
// The same with the caller's oracle optimizer, whose state (moments, momentum buffers, step
// counts) after the last step stays with the caller; `scheduler`, when set, steps right after
// every optimizer step.
std::vector<reference::StepRecord<double>> TrainOracleWith(
    const ZooModel& model, reference::Optimizer<double>& optimizer, uint64_t seed, int64_t steps,
    DType dtype, int world = 1, const std::vector<reference::Fsdp1FlatParam>& flat_params = {},
    const std::optional<reference::GradClip>& clip = std::nullopt,
    reference::StepLr<double>* scheduler = nullptr, const std::vector<std::string>& frozen = {});

}  // namespace fsdp::conformance
