// Family `models`: one scenario per zoo model (conformance/model_zoo.h). On one rank, the engine
// runs one forward + loss + backward of the model in float64 and reports its loss, outputs and
// gradients, plus central finite differences of the loss computed with its own forward at a
// sample of entries of every parameter. The judge checks the gradients against those finite
// differences and, with the outputs and loss, against the oracle's hand-derived backward
// (reference/), and that the parameter FQNs and the parameters without a gradient match.
//
// Tolerances, measured over seeds 0-7: gradients vs central differences (h = 1e-6) atol 1e-6,
// rtol 1e-5 (at most 7% used, the Transformer, whose large summed loss limits the differences'
// precision to about 1e-7); loss, outputs and gradients vs the oracle atol 1e-12, rtol 1e-10
// (under 0.5% used). Figures: fd_/oracle_ max_abs_err, max_rel_err (over |e| >= atol) and
// tolerance_used.
//
// Observations (rank 0): losses [loss], "param_names", "grad_none" (FQNs whose .grad is
// None), tensors "output<k>", "grad/<fqn>" and "buffer/<fqn>" (buffers after the forward, as
// float64), "fd" {fqn: {"index": [...], "value": [...]}}.
// The loss, outputs and differences are read at the model's finite-difference point
// (ZooModel::fd_output_module): the Transformer's float64 logits before its final `.float()`.
//
// Scenario `models/dropout_training`: nn.Dropout in training and eval mode, judged by rule.
// The kept elements come from an RNG stream that PyTorch and the engine do not share, so no
// oracle can give the output; what any conforming dropout does can be judged instead. On one
// rank, in float64, x[i] = 0.5 + (i % 13) / 8 (never 0) requiring grad passes through
// nn.Dropout(p) in training mode, and once more (output_again); then out.backward(g) with
// g[i] = 1 + (i % 7) / 4; then the same module runs on x once more in training mode
// (output_after_backward) and once in eval mode. Axis `checkpoint`: the training-mode calls go
// through activation checkpointing (non-reentrant, preserve_rng_state=True by default):
// torch.utils.checkpoint.checkpoint(dropout, x, use_reentrant=False) ("utils"),
// checkpoint_wrapper(dropout) ("wrapper") or torch.distributed._composable.checkpoint(dropout)
// ("composable"). The backward then recomputes the mask from the generator state saved at the
// forward (torch.random.fork_rng), and restores the generator afterwards, so every rule below
// is the same as without checkpointing. The judge requires, element by element:
//   * out[i] = 0 and x.grad[i] = 0 (dropped), or out[i] = x[i] / (1 - p) and
//     x.grad[i] = g[i] / (1 - p) (kept; within 1e-12 relative: PyTorch multiplies by the
//     mask's 1 / (1 - p) rounded to float64), so the mask's scale, the gradient's scale and the
//     gradient flowing only through kept elements are all checked;
//   * the number kept within 6 standard deviations of Binomial(n, 1 - p) (a mask keeping with
//     probability p, or keeping all or none, fails; a conforming one fails with probability
//     about 2e-9);
//     Under checkpointing, a recompute that does not restore the forward's generator state
//     draws another mask for the gradient than the output's;
//   * the second training-mode output dropped or x[i] / (1 - p) too, with another mask than
//     the first (the generator advanced: PyTorch draws a fresh mask per call; two masks of 4096
//     elements agree with probability below 1e-300);
//   * the output after the backward under the same rule, with a mask unlike both earlier ones
//     (under checkpointing, a recompute that leaves the generator at the forward's state plus
//     one draw repeats output_again's mask);
//   * the eval-mode output equal to x, exactly.
//   * the dropout's forward pre-hook run 4 times, 5 under checkpointing (the recompute in
//     backward calls the module again; a checkpoint that saves the activations instead of
//     recomputing them gives the same values and fails only this).
// Observations (rank 0): tensors "output", "input_grad", "output_again",
// "output_after_backward", "eval_output" [numel] float64; "forward_pre_hook_calls".
//
// Scenario `models/shared_buffer`: one tensor registered as a buffer of two modules, judged by
// nn.Module's rules (named_buffers() keeps a tensor's first FQN; remove_duplicate=False and
// state_dict() every path).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "conformance/model_zoo.h"
#include "conformance/observations.h"
#include "conformance/scenario_registry.h"
#include "engine/autograd/grad_mode.h"
#include "engine/core/dtype.h"
#include "engine/core/error.h"
#include "engine/fsdp1/api.h"
#include "engine/functional/functional.h"
#include "engine/nn/checkpoint.h"
#include "engine/nn/init.h"
#include "engine/nn/layers.h"

namespace fsdp::conformance {

namespace {

// Evenly spaced entries of a tensor with `numel` elements, first and last included.
std::vector<int64_t> SampleIndices(int64_t numel, int64_t count) {
  std::vector<int64_t> out;
  if (numel <= 0 || count <= 0) return out;
  if (numel <= count) {
    for (int64_t i = 0; i < numel; ++i) out.push_back(i);
    return out;
  }
  if (count == 1) return {0};
  for (int64_t k = 0; k < count; ++k) {
    const int64_t i = k * (numel - 1) / (count - 1);
    if (out.empty() || out.back() != i) out.push_back(i);
  }
  return out;
}

// The outputs at the finite-difference point: the model's outputs, or the output of the
// submodule the zoo names (captured by a forward hook during the model's own forward).
// Borrows the model and the module (both must outlive it); removes its hook on destruction.
// Thread-safety: one rank's thread, like the module.
class FdForward {
 public:
  FdForward(const ZooModel& model, nn::Module& module) : model_(model), module_(module) {
    if (!model.fd_output_module().empty()) {
      handle_ =
          module.get_submodule(model.fd_output_module())
              ->register_forward_hook([this](nn::Module&, const nn::Value&,
                                             const nn::Value& output) -> std::optional<nn::Value> {
                captured_ = output.tensors();
                return std::nullopt;
              });
    }
  }
  ~FdForward() { handle_.remove(); }
  FdForward(const FdForward&) = delete;
  FdForward& operator=(const FdForward&) = delete;

  std::vector<Tensor> Outputs(const Tensor& input) {
    std::vector<Tensor> outputs = model_.Forward(module_, input);
    if (model_.fd_output_module().empty()) return outputs;
    return captured_;
  }

 private:
  const ZooModel& model_;
  nn::Module& module_;
  nn::RemovableHandle handle_;
  std::vector<Tensor> captured_;
};

nlohmann::json RunModelRank(const std::string& kind, RankEnv& env) {
  const CaseParams& p = env.params;
  const ZooModel model = ZooModel::Make(kind, p);
  const double h = p.GetDouble("fd_step");
  const int64_t entries = p.GetInt("fd_entries");
  FSDP_CHECK(h > 0, "fd_step must be positive, got ", h);

  nn::ModulePtr module = model.BuildEngineFromInputs(env.Inputs(), DType::kFloat64);
  const Tensor input = env.Inputs().Get(StepInputName(0));
  const reference::LossSpec spec = model.LossAt(0);

  // Analytic gradients: loss.backward() through the model's real forward.
  Tensor loss = ZooModel::Loss(model.Forward(*module, input), spec);
  loss.backward();
  nlohmann::json obs;
  obs["param_names"] = ParameterNamesOf(*module);
  obs["grad_none"] = ParametersWithoutGrad(*module);
  nlohmann::json tensors = MapToJson(GradientsOf(*module), "float64", "grad/");
  // The buffers after the one training-mode forward (BatchNorm's running statistics and
  // counter), before the finite differences' forwards update them again; as float64 values.
  for (const auto& [name, buffer] : module->named_buffers()) {
    if (buffer.defined()) tensors["buffer/" + name] = TensorToJson(buffer.to(DType::kFloat64));
  }

  // Central differences of the float64 loss at the finite-difference point.
  FdForward fd_forward(model, *module);
  autograd::NoGradGuard no_grad;
  auto loss_at = [&](std::vector<Tensor>* outputs_out) {
    std::vector<Tensor> outputs = fd_forward.Outputs(input);
    const double value = ZooModel::Loss(outputs, spec).item();
    if (outputs_out) *outputs_out = std::move(outputs);
    return value;
  };
  std::vector<Tensor> outputs;
  const double base = loss_at(&outputs);
  // Under torch.no_grad() no op records a graph: the outputs neither require grad nor have a
  // grad_fn, whatever the parameters require.
  bool no_grad_requires_grad = false;
  for (const Tensor& out : outputs) {
    no_grad_requires_grad |= out.requires_grad() || out.grad_fn() != nullptr;
  }
  obs["no_grad_outputs_require_grad"] = no_grad_requires_grad;
  for (size_t k = 0; k < outputs.size(); ++k) {
    tensors["output" + std::to_string(k)] = TensorToJson(outputs[k]);
  }
  nlohmann::json fd = nlohmann::json::object();
  for (const auto& [name, param] : module->named_parameters()) {
    if (!param.defined()) continue;
    FSDP_CHECK(param.dtype() == DType::kFloat64, "parameter ", name, " is ",
               DTypeName(param.dtype()), " after module.to(float64)");
    double* data = param.data<double>();
    std::vector<int64_t> index = SampleIndices(param.numel(), entries);
    std::vector<double> value;
    for (int64_t i : index) {
      const double original = data[i];
      data[i] = original + h;
      const double plus = loss_at(nullptr);
      data[i] = original - h;
      const double minus = loss_at(nullptr);
      data[i] = original;
      value.push_back((plus - minus) / (2 * h));
    }
    fd[fsdp1::CleanTensorName(name)] = {{"index", index}, {"value", value}};
  }
  obs[kLosses] = nlohmann::json::array({base});
  obs["loss_dtype"] = DTypeName(loss.dtype());
  obs["fd"] = fd;
  obs[kTensors] = tensors;
  return obs;
}

void JudgeModel(const std::string& kind, const CaseParams& p,
                const std::vector<nlohmann::json>& per_rank, CheckList& checks) {
  const ZooModel model = ZooModel::Make(kind, p);
  const uint64_t seed = static_cast<uint64_t>(p.GetInt("seed"));
  const Tolerance oracle_tol{p.GetDouble("atol"), p.GetDouble("rtol")};
  const Tolerance fd_tol{p.GetDouble("fd_atol"), p.GetDouble("fd_rtol")};

  const std::vector<std::string> names = model.ParameterNames();
  checks.CheckEqual("parameter FQNs (named_parameters order)", names,
                    RankObservation(per_rank, 0, "param_names"));

  const reference::RefTensorMap params = model.MakeParameters(seed, DType::kFloat64);
  const ZooInput input = model.MakeInput(seed, 0, DType::kFloat64);
  const reference::LossAndGrads<double> expected = reference::ForwardBackward(
      model.fd_oracle(), params, model.MakeBuffers(seed, DType::kFloat64), input.oracle,
      model.LossAt(0));

  ErrorStats oracle_err;
  const std::vector<double> losses = Losses(per_rank, 0);
  checks.CheckClose("loss vs oracle", std::vector<double>{expected.loss}, losses, oracle_tol);
  if (losses.size() == 1) {
    oracle_err.Merge(CompareValues({expected.loss}, losses, oracle_tol));
  }
  for (size_t k = 0; k < expected.outputs.size(); ++k) {
    const std::string key = "output" + std::to_string(k);
    const std::vector<double> actual = TensorData(per_rank, 0, key);
    checks.CheckClose(key + " vs oracle", expected.outputs[k].data, actual, oracle_tol);
    oracle_err.Merge(CompareValues(expected.outputs[k].data, actual, oracle_tol));
  }

  // Buffers after the forward (BatchNorm in training mode: running statistics moved by the
  // momentum toward the batch mean and the unbiased batch variance, num_batches_tracked + 1).
  oracle_err.Merge(CheckMapsClose(checks, "buffers after the forward vs oracle", expected.buffers,
                                  MapFromObservations(per_rank, 0, "buffer/"), oracle_tol));

  checks.CheckEqual("outputs of a forward under no_grad require grad (torch.no_grad: no graph)",
                    false, RankObservation(per_rank, 0, "no_grad_outputs_require_grad"));

  std::vector<std::string> expected_none;
  for (const std::string& name : names) {
    if (!expected.grads.count(name)) expected_none.push_back(name);
  }
  checks.CheckEqual("parameters whose grad is None", expected_none,
                    RankObservation(per_rank, 0, "grad_none"));
  const reference::RefTensorMap grads = MapFromObservations(per_rank, 0, "grad/");
  oracle_err.Merge(
      CheckMapsClose(checks, "gradients vs oracle", expected.grads, grads, oracle_tol));

  // Finite differences: the analytic gradient (zero where it is None) at the sampled entries.
  const nlohmann::json& fd = RankObservation(per_rank, 0, "fd");
  reference::RefTensorMap numerical, analytic;
  for (const std::string& name : names) {
    if (!fd.contains(name)) {
      checks.Fail("finite differences of " + name, "rank 0 reported none");
      continue;
    }
    const auto index = fd[name].at("index").get<std::vector<int64_t>>();
    const auto value = fd[name].at("value").get<std::vector<double>>();
    const reference::RefTensor* grad = grads.count(name) ? &grads.at(name) : nullptr;
    FSDP_CHECK_CODE(ErrorCode::kDataLoss, index.size() == value.size(), "rank 0: ", index.size(),
                    " finite-difference indices but ", value.size(), " values for ", name);
    std::vector<double> at, numeric;
    for (size_t j = 0; j < index.size(); ++j) {
      const int64_t i = index[j];
      FSDP_CHECK_CODE(ErrorCode::kDataLoss, i >= 0 && (!grad || i < grad->numel()),
                      "rank 0: finite-difference index ", i, " outside ", name);
      // An entry autograd treats as a constant (padding_idx) is judged by the oracle only.
      if (model.FdConstant(name, i)) continue;
      at.push_back(grad ? (*grad)[i] : 0.0);
      numeric.push_back(value[j]);
    }
    const int64_t n = static_cast<int64_t>(numeric.size());
    numerical[name] = reference::RefTensor({n}, numeric);
    analytic[name] = reference::RefTensor({n}, at);
  }
  const ErrorStats fd_err =
      CheckMapsClose(checks, "gradients vs finite differences", numerical, analytic, fd_tol);

  int64_t sampled = 0;
  for (const auto& [name, t] : numerical) sampled += t.numel();
  checks.SetFigure("loss", expected.loss);
  checks.SetFigure("fd_entries", sampled);
  checks.SetFigure("fd_max_abs_err", fd_err.max_abs);
  checks.SetFigure("fd_max_rel_err", fd_err.max_rel);
  checks.SetFigure("oracle_max_abs_err", oracle_err.max_abs);
  checks.SetFigure("oracle_max_rel_err", oracle_err.max_rel);
  checks.SetFigure("fd_tolerance_used", fd_err.tolerance_used);
  checks.SetFigure("oracle_tolerance_used", oracle_err.tolerance_used);
}

Scenario MakeModelScenario(const ZooModelKind& kind) {
  Scenario s;
  s.info.name = "models/" + kind.name;
  s.info.description =
      kind.description +
      ": float64 forward/backward of the seed's loss at step 0 (out.sum(), or DoubleLinear's "
      "own) against finite differences and the oracle";
  s.info.seed_test = kind.seed_test;
  s.info.params = {ParamSpec::SizeInt("seed", "seed of the zoo's weights and inputs", 0)};
  s.info.params.insert(s.info.params.end(), kind.params.begin(), kind.params.end());
  s.info.params.push_back(
      ParamSpec::SizeDouble("fd_step", "central-difference step h (float64)", 1e-6));
  s.info.params.push_back(
      ParamSpec::SizeInt("fd_entries", "entries sampled per parameter (evenly spaced)", 6));
  s.info.params.push_back(
      ParamSpec::SizeDouble("fd_atol", "atol of gradients vs finite differences", 1e-6));
  s.info.params.push_back(
      ParamSpec::SizeDouble("fd_rtol", "rtol of gradients vs finite differences", 1e-5));
  s.info.params.push_back(
      ParamSpec::SizeDouble("atol", "atol of loss, outputs and gradients vs the oracle", 1e-12));
  s.info.params.push_back(
      ParamSpec::SizeDouble("rtol", "rtol of loss, outputs and gradients vs the oracle", 1e-10));
  s.info.default_world = 1;
  s.info.min_world = 1;
  s.info.max_world = 1;
  s.info.requirements.devices = {DeviceType::kCPU};
  if (kind.name == "padded_lm") {
    // A negative padding_idx, which F.embedding normalises by adding num_embeddings (an extra
    // default run; without the normalisation the padding row gets a gradient).
    s.info.extra_default_runs = {{1, {{"negative_padding_idx", "True"}}}};
  } else if (kind.name == "gated_norms") {
    // nn.RMSNorm with an explicit eps besides the default None (an extra default run).
    s.info.extra_default_runs = {{1, {{"rms_norm_eps", "1e-05"}}}};
  } else if (kind.name == "mlp") {
    // MLP(with_buffer=True): the buffer added to the output (nothing else reads it).
    s.info.extra_default_runs = {{1, {{"with_buffer", "True"}}}};
  } else if (kind.name == "transformer") {
    // Each block in a CheckpointWrapper (its FeedForward in a nested one), called as
    // layer(x=h): the recompute in backward must get the block's keyword argument again, and
    // the weights' load (state_dict / load_state_dict hooks) must not see the wrapper's prefix.
    s.info.extra_default_runs = {{1, {{"checkpoint_wrapper", "True"}, {"block_kwargs", "True"}}}};
  }
  const std::string name = kind.name;
  // One float64 forward/backward at world 1: the weights and the input of step 0.
  s.info.observations
      .Add(ObservationKey::StringList("param_names",
                                      "the FQNs of named_parameters(), in order, without "
                                      "checkpoint_wrapper's \"_checkpoint_wrapped_module.\" "
                                      "(clean_tensor_name); the grad/ and fd keys alike"))
      .Add(ObservationKey::StringList(
          "grad_none", "the FQNs whose .grad is None after loss.backward() (unused parameters)"))
      .Add(ObservationKey::Losses("[the loss of the forward on step0/input]"))
      .Add(ObservationKey::String("loss_dtype", "the dtype the loss was computed in"))
      .Add(ObservationKey::Boolean(
          "no_grad_outputs_require_grad",
          "whether any output of the finite-difference point's base forward, run under "
          "torch.no_grad(), requires grad or has a grad_fn (false in PyTorch)"))
      .Add(ObservationKey::Custom(
          "fd",
          {{"type", "object"},
           {"additionalProperties",
            {{"type", "object"},
             {"required", {"index", "value"}},
             {"additionalProperties", false},
             {"properties",
              {{"index", {{"type", "array"}, {"items", {{"type", "integer"}, {"minimum", 0}}}}},
               {"value", {{"type", "array"}, {"items", {{"type", "number"}}}}}}}}}},
          "per parameter FQN: flat element indices and the central difference of the float64 "
          "loss with step fd_step at each (the subject's own finite differences)"))
      .AddTensors({"grad/{fqn}", "float64", "the parameter's shape",
                   "each parameter's .grad after loss.backward() (absent when None)"})
      .AddTensors({"output{k}", "float64", "the model's output k",
                   "the model's outputs (a tuple output flattened in order)"})
      .AddTensors({"buffer/{fqn}", "float64", "the buffer's shape",
                   "each buffer of named_buffers() after the forward (BatchNorm's running_mean, "
                   "running_var and num_batches_tracked, updated in training mode), before any "
                   "finite-difference forward, as float64 values (none for a model without "
                   "buffers)",
                   /*required=*/false});
  s.info.inputs = ZooInputsDoc(kind, "float64");
  s.inputs = [name](const CaseParams& p, int world) {
    return ZooModel::Make(name, p).MakeCaseInputs(static_cast<uint64_t>(p.GetInt("seed")),
                                                  DType::kFloat64, /*steps=*/1, world);
  };
  s.run_rank = [name](RankEnv& env) { return RunModelRank(name, env); };
  s.judge = [name](const CaseParams& p, int, const std::vector<nlohmann::json>& per_rank,
                   CheckList& checks) { JudgeModel(name, p, per_rank, checks); };
  return s;
}

// ---- models/linear_init ------------------------------------------------------------------------

// Scenario `models/linear_init`: nn.Linear(in_features, out_features)'s default initialisation
// (reset_parameters: kaiming_uniform_(weight, a=sqrt(5)), i.e. U(-1/sqrt(fan_in), 1/sqrt(fan_in))
// with fan_in = in_features, and the bias U(-1/sqrt(fan_in), 1/sqrt(fan_in))), judged by rule
// since the draws come from an RNG PyTorch and the engine do not share. The defaults have
// in_features (64) != out_features (8), so a fan taken from the wrong dim changes the bound.
// The judge requires every element within the bound; the weight's largest magnitude above
// 0.9 of it (512 draws all below: probability 0.9^512, about 4e-24); the weight's mean and mean
// square within 6 standard deviations of U(-b, b)'s (0 and b^2 / 3).
// Beside it, nn.LayerNorm(out_features) and nn.BatchNorm1d(out_features), whose defaults are
// constants (weight ones, bias zeros; running_mean zeros, running_var ones), judged exactly.
// Observations (rank 0): tensors "weight" [out, in], "bias" [out] and NormInitTensors() as
// float64.

// The constant-initialised tensors of the fresh norms and each one's default value.
const std::vector<std::pair<std::string, double>>& NormInitTensors() {
  static const std::vector<std::pair<std::string, double>> kTensors = {
      {"layer_norm.weight", 1.0},       {"layer_norm.bias", 0.0},
      {"batch_norm.weight", 1.0},       {"batch_norm.bias", 0.0},
      {"batch_norm.running_mean", 0.0}, {"batch_norm.running_var", 1.0}};
  return kTensors;
}

nlohmann::json RunLinearInitRank(RankEnv& env) {
  nn::ManualSeed(1);
  nn::Linear linear(env.params.GetInt("in_features"), env.params.GetInt("out_features"));
  nlohmann::json tensors;
  tensors["weight"] = TensorToJson(linear.weight().detach().to(DType::kFloat64));
  tensors["bias"] = TensorToJson(linear.bias().detach().to(DType::kFloat64));
  const int64_t out = env.params.GetInt("out_features");
  auto norms = std::make_shared<nn::Sequential>();
  norms->register_module("layer_norm", std::make_shared<nn::LayerNorm>(out));
  norms->register_module("batch_norm", std::make_shared<nn::BatchNorm1d>(out));
  const nn::StateDict state = norms->state_dict();
  for (const auto& [name, value] : NormInitTensors()) {
    tensors[name] = TensorToJson(state.at(name).detach().to(DType::kFloat64));
  }
  nlohmann::json obs;
  obs[kTensors] = tensors;
  return obs;
}

void JudgeLinearInit(const CaseParams& params, const std::vector<nlohmann::json>& per_rank,
                     CheckList& checks) {
  const int64_t in = params.GetInt("in_features");
  const int64_t out = params.GetInt("out_features");
  const double bound = 1.0 / std::sqrt(static_cast<double>(in));
  const std::vector<double> w = TensorData(per_rank, 0, "weight");
  const std::vector<double> b = TensorData(per_rank, 0, "bias");
  if (!checks.CheckTrue(
          "weight and bias sizes",
          w.size() == static_cast<size_t>(in * out) && b.size() == static_cast<size_t>(out),
          "expected " + std::to_string(in * out) + " and " + std::to_string(out))) {
    return;
  }
  // float32 draws: allow the bound's rounding.
  const double limit = bound * (1.0 + 1e-6);
  auto within = [&](const std::vector<double>& v) {
    return std::all_of(v.begin(), v.end(), [&](double x) { return std::abs(x) <= limit; });
  };
  checks.CheckTrue("every weight element in [-1/sqrt(in_features), 1/sqrt(in_features)]",
                   within(w));
  checks.CheckTrue("every bias element in [-1/sqrt(in_features), 1/sqrt(in_features)]", within(b));
  double max_abs = 0.0, sum = 0.0, sum_sq = 0.0;
  for (double x : w) {
    max_abs = std::max(max_abs, std::abs(x));
    sum += x;
    sum_sq += x * x;
  }
  const double n = static_cast<double>(w.size());
  checks.CheckTrue("the weight's largest magnitude above 0.9 / sqrt(in_features)",
                   max_abs >= 0.9 * bound,
                   std::to_string(max_abs) + " vs bound " + std::to_string(bound));
  // U(-b, b): mean 0, variance b^2 / 3; x^2 has mean b^2 / 3 and variance 4 b^4 / 45.
  const double mean_sd = bound / std::sqrt(3.0 * n);
  checks.CheckTrue("the weight's mean within 6 standard deviations of 0",
                   std::abs(sum / n) <= 6.0 * mean_sd, std::to_string(sum / n));
  const double sq_sd = bound * bound * std::sqrt(4.0 / 45.0 / n);
  checks.CheckTrue("the weight's mean square within 6 standard deviations of b^2 / 3",
                   std::abs(sum_sq / n - bound * bound / 3.0) <= 6.0 * sq_sd,
                   std::to_string(sum_sq / n) + " vs " + std::to_string(bound * bound / 3.0));
  checks.SetFigure("max_abs_over_bound", max_abs / bound);
  for (const auto& [name, value] : NormInitTensors()) {
    checks.CheckClose(name + " of a fresh norm vs its default",
                      std::vector<double>(static_cast<size_t>(out), value),
                      TensorData(per_rank, 0, name), Tolerance{0, 0});
  }
}

Scenario MakeLinearInitScenario() {
  Scenario s;
  s.info.name = "models/linear_init";
  s.info.description =
      "nn.Linear(in_features, out_features)'s default initialisation (kaiming_uniform_(a=sqrt(5)) "
      "weight and uniform bias, both U(-1/sqrt(in_features), 1/sqrt(in_features))), judged by "
      "rule: bounds, the largest magnitude near the bound, mean and mean square; beside it a fresh "
      "nn.LayerNorm's and nn.BatchNorm1d's constant defaults (weight ones, bias zeros, "
      "running_mean zeros, running_var ones), exactly";
  s.info.seed_test = "none (torch.nn.Linear.reset_parameters as documented)";
  s.info.params = {
      ParamSpec::SizeInt("in_features", "nn.Linear in_features (the fan-in)", 64, /*minimum=*/1),
      ParamSpec::SizeInt("out_features", "nn.Linear out_features", 8, /*minimum=*/1)};
  s.info.default_world = 1;
  s.info.min_world = 1;
  s.info.max_world = 1;
  s.info.requirements.devices = {DeviceType::kCPU};
  s.info.observations
      .AddTensors({"weight", "float64", "[out_features, in_features]",
                   "a freshly constructed nn.Linear's weight (after torch.manual_seed(1))"})
      .AddTensors({"bias", "float64", "[out_features]", "its bias"});
  for (const auto& [name, value] : NormInitTensors()) {
    s.info.observations.AddTensors(
        {name, "float64", "[out_features]",
         "a freshly constructed nn.LayerNorm(out_features) / nn.BatchNorm1d(out_features)'s " +
             name.substr(name.find('.') + 1)});
  }
  s.run_rank = [](RankEnv& env) { return RunLinearInitRank(env); };
  s.judge = [](const CaseParams& p, int, const std::vector<nlohmann::json>& per_rank,
               CheckList& checks) { JudgeLinearInit(p, per_rank, checks); };
  return s;
}

// ---- models/dropout_training -------------------------------------------------------------------

// The scenario's input and upstream gradient, by rule (exact binary fractions, never 0).
double DropoutInputAt(int64_t i) { return 0.5 + static_cast<double>(i % 13) / 8.0; }
double DropoutGradAt(int64_t i) { return 1.0 + static_cast<double>(i % 7) / 4.0; }

std::vector<double> RuleValues(int64_t n, double (*at)(int64_t)) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = at(i);
  return v;
}

nlohmann::json RunDropoutRank(RankEnv& env) {
  const double p = env.params.GetDouble("p");
  const int64_t n = env.params.GetInt("numel");
  Tensor x = Tensor::from_doubles(RuleValues(n, DropoutInputAt), {n}, DType::kFloat64);
  x.set_requires_grad(true);
  const std::string checkpoint = env.params.GetString("checkpoint");
  // torch.manual_seed(1): the generator away from a fresh one's state, so a recompute that
  // starts from a fresh generator instead of the forward's state draws another mask.
  nn::ManualSeed(1);
  auto dropout = std::make_shared<nn::Dropout>(p);
  // Counts the dropout's forward pre-hook calls: a checkpoint's recompute in backward calls
  // the module again (its pre-hooks run before the early stop ends the recompute).
  int64_t pre_hook_calls = 0;
  dropout->register_forward_pre_hook([&pre_hook_calls](nn::Module&, const nn::Value&) {
    ++pre_hook_calls;
    return std::optional<nn::Value>();
  });
  // The module called in training mode: the dropout itself, or it under checkpointing.
  nn::ModulePtr module = dropout;
  if (checkpoint == "wrapper") module = nn::checkpoint_wrapper(dropout);
  if (checkpoint == "composable") nn::checkpoint(dropout);
  auto train_call = [&]() {
    const nn::Value input(x);
    return (checkpoint == "utils" ? nn::CheckpointModuleCall(module, input) : (*module)(input))
        .tensor();
  };
  dropout->train();
  const Tensor out = train_call();
  const Tensor out_again = train_call();
  out.backward(Tensor::from_doubles(RuleValues(n, DropoutGradAt), {n}, DType::kFloat64));
  const Tensor out_after = train_call();
  dropout->eval();
  const Tensor eval_out = (*dropout)(nn::Value(x)).tensor();
  nlohmann::json tensors;
  tensors["output"] = TensorToJson(out.detach());
  tensors["input_grad"] = TensorToJson(x.grad());
  tensors["output_again"] = TensorToJson(out_again.detach());
  tensors["output_after_backward"] = TensorToJson(out_after.detach());
  tensors["eval_output"] = TensorToJson(eval_out.detach());
  nlohmann::json obs;
  obs[kTensors] = tensors;
  obs["forward_pre_hook_calls"] = pre_hook_calls;
  return obs;
}

void JudgeDropout(const CaseParams& params, const std::vector<nlohmann::json>& per_rank,
                  CheckList& checks) {
  const double p = params.GetDouble("p");
  const int64_t n = params.GetInt("numel");
  const double scale = 1.0 / (1.0 - p);
  const std::vector<double> x = RuleValues(n, DropoutInputAt);
  const std::vector<double> g = RuleValues(n, DropoutGradAt);
  const std::vector<double> out = TensorData(per_rank, 0, "output");
  const std::vector<double> grad = TensorData(per_rank, 0, "input_grad");
  const std::vector<double> again = TensorData(per_rank, 0, "output_again");
  const std::vector<double> after = TensorData(per_rank, 0, "output_after_backward");
  // Three training-mode calls and one eval-mode call, plus one recompute in backward of the
  // checkpointed region (non-reentrant checkpointing: the module runs again).
  const int64_t expected_calls = params.GetString("checkpoint") == "none" ? 4 : 5;
  checks.CheckEqual(
      "the dropout's forward pre-hook calls (a checkpointed call runs again in "
      "backward)",
      nlohmann::json(expected_calls), RankObservation(per_rank, 0, "forward_pre_hook_calls"));
  checks.CheckClose("eval-mode output = input", x, TensorData(per_rank, 0, "eval_output"),
                    Tolerance{0.0, 0.0});
  if (!checks.CheckTrue("output and input_grad sizes",
                        out.size() == x.size() && grad.size() == x.size() &&
                            again.size() == x.size() && after.size() == x.size(),
                        "expected " + std::to_string(n) + " elements each")) {
    return;
  }
  auto near = [](double actual, double expected) {
    return std::abs(actual - expected) <= 1e-12 * std::abs(expected);
  };
  int64_t kept = 0;
  std::string first_bad;
  for (int64_t i = 0; i < n; ++i) {
    const size_t k = static_cast<size_t>(i);
    const bool dropped = out[k] == 0.0 && grad[k] == 0.0;
    const bool kept_here = near(out[k], x[k] * scale) && near(grad[k], g[k] * scale);
    if (kept_here) ++kept;
    if (!dropped && !kept_here && first_bad.empty()) {
      first_bad = "element " + std::to_string(i) + ": output " + std::to_string(out[k]) +
                  ", input_grad " + std::to_string(grad[k]) + "; expected 0 and 0 or " +
                  std::to_string(x[k] * scale) + " and " + std::to_string(g[k] * scale);
    }
  }
  checks.CheckTrue(
      "each element dropped (output and gradient 0) or kept (both scaled by "
      "1 / (1 - p))",
      first_bad.empty(), first_bad);
  const double mean = static_cast<double>(n) * (1.0 - p);
  const double bound = 6.0 * std::sqrt(static_cast<double>(n) * p * (1.0 - p));
  checks.CheckTrue("elements kept ~ Binomial(numel, 1 - p) (within 6 standard deviations)",
                   std::abs(static_cast<double>(kept) - mean) <= bound,
                   std::to_string(kept) + " kept of " + std::to_string(n) + ", expected " +
                       std::to_string(mean) + " +- " + std::to_string(bound));
  checks.SetFigure("kept_fraction", static_cast<double>(kept) / static_cast<double>(n));

  // The later training-mode calls: the same rule, and a fresh mask each (the generator
  // advanced by every draw, and restored after a checkpoint's recompute).
  auto rule_holds = [&](const std::vector<double>& o) {
    for (size_t k = 0; k < x.size(); ++k) {
      if (o[k] != 0.0 && !near(o[k], x[k] * scale)) return false;
    }
    return true;
  };
  auto same_mask = [&](const std::vector<double>& a, const std::vector<double>& b) {
    for (size_t k = 0; k < x.size(); ++k) {
      if ((a[k] == 0.0) != (b[k] == 0.0)) return false;
    }
    return true;
  };
  checks.CheckTrue("second training-mode output: each element 0 or x / (1 - p)", rule_holds(again));
  checks.CheckTrue("second training-mode call draws a new mask (the generator advanced)",
                   !same_mask(again, out), "both calls dropped exactly the same elements");
  checks.CheckTrue("training-mode output after the backward: each element 0 or x / (1 - p)",
                   rule_holds(after));
  checks.CheckTrue(
      "training-mode call after the backward draws a mask unlike both earlier calls (the "
      "generator as the forward calls left it, restored after a checkpoint's recompute)",
      !same_mask(after, out) && !same_mask(after, again),
      same_mask(after, again) ? "it dropped exactly the elements output_again dropped"
                              : "it dropped exactly the elements output dropped");
}

Scenario MakeDropoutTrainingScenario() {
  Scenario s;
  s.info.name = "models/dropout_training";
  s.info.description =
      "nn.Dropout(p) in training mode, optionally under activation checkpointing (each output 0 "
      "or x / (1 - p), the gradient through the kept elements only, with the same scale, also "
      "when recomputed; the number kept ~ Binomial; a fresh mask per call, also after a "
      "recompute) and in eval mode "
      "(the identity), judged by rule";
  s.info.seed_test =
      "none (torch.nn.Dropout as documented; under checkpointing, torch.utils.checkpoint's "
      "preserve_rng_state, as test_utils.py::TestCheckpoint::test_checkpoint_rng_cpu)";
  s.info.params = {
      ParamSpec::Axis("p", "the dropout probability (1 / p differs from 1 / (1 - p))",
                      {"0.2", "0.7"}),
      ParamSpec::SizeInt("numel", "elements of the float64 input", 4096, /*minimum=*/1),
      ParamSpec::Axis("checkpoint",
                      "activation checkpointing of the training-mode calls (non-reentrant, "
                      "preserve_rng_state=True): none, utils "
                      "(torch.utils.checkpoint.checkpoint(dropout, x, use_reentrant=False)), "
                      "wrapper (checkpoint_wrapper(dropout)), composable "
                      "(torch.distributed._composable.checkpoint(dropout))",
                      {"none", "utils", "wrapper", "composable"})};
  s.info.default_world = 1;
  s.info.min_world = 1;
  s.info.max_world = 1;
  s.info.requirements.devices = {DeviceType::kCPU};
  s.info.observations
      .AddTensors({"output", "float64", "[numel]",
                   "nn.Dropout(p) in training mode applied to x[i] = 0.5 + (i % 13) / 8"})
      .AddTensors({"input_grad", "float64", "[numel]",
                   "x.grad after output.backward(g), g[i] = 1 + (i % 7) / 4"})
      .AddTensors({"output_again", "float64", "[numel]",
                   "the same module called on x once more in training mode, before the "
                   "backward (a fresh mask)"})
      .AddTensors({"output_after_backward", "float64", "[numel]",
                   "the same module called on x in training mode after the backward (a mask "
                   "unlike both earlier ones)"})
      .AddTensors({"eval_output", "float64", "[numel]", "the same module in eval mode on x"})
      .Add(ObservationKey::Integer("forward_pre_hook_calls",
                                   "calls of a forward pre-hook registered on the dropout: every "
                                   "call of it, and its recompute in backward under "
                                   "checkpointing"));
  s.run_rank = [](RankEnv& env) { return RunDropoutRank(env); };
  s.judge = [](const CaseParams& p, int, const std::vector<nlohmann::json>& per_rank,
               CheckList& checks) { JudgeDropout(p, per_rank, checks); };
  return s;
}

// ---- models/shared_buffer ----------------------------------------------------------------------

// The buffers of models/shared_buffer, in registration order: (module index, buffer name, which
// tensor). Tensor 0 is registered in both Linears (as PyTorch lets one tensor be a buffer of two
// modules); tensor 1 only in the second.
struct SharedBufferSlot {
  int module;
  const char* name;
  int tensor;
};
constexpr SharedBufferSlot kSharedBufferSlots[] = {
    {0, "stat", 0}, {1, "stat_alias", 0}, {1, "own", 1}};

nlohmann::json RunSharedBufferRank(RankEnv&) {
  auto model = std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{
      std::make_shared<nn::Linear>(2, 2), std::make_shared<nn::Linear>(2, 2)});
  const Tensor tensors[] = {Tensor::from_doubles({1.0, 2.0}, {2}, DType::kFloat32),
                            Tensor::from_doubles({3.0, 4.0}, {2}, DType::kFloat32)};
  for (const SharedBufferSlot& slot : kSharedBufferSlots) {
    model->children()[static_cast<size_t>(slot.module)]->register_buffer(slot.name,
                                                                         tensors[slot.tensor]);
  }
  auto names = [](const std::vector<nn::NamedTensor>& named) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& [name, t] : named) out.push_back(name);
    return out;
  };
  nlohmann::json obs;
  obs["buffer_names"] = names(model->named_buffers());
  obs["buffer_names_all"] = names(model->named_buffers("", true, /*remove_duplicate=*/false));
  obs["state_dict_keys"] = nlohmann::json::array();
  for (const auto& [key, t] : model->state_dict()) obs["state_dict_keys"].push_back(key);
  return obs;
}

// nn.Module's rules: named_buffers() visits modules in pre-order and each module's buffers in
// registration order, keeping only a tensor's first FQN (its memo is by tensor identity);
// remove_duplicate=False keeps every FQN; state_dict() saves every module's parameters, then
// its buffers, under every path (no deduplication).
nlohmann::json ExpectedSharedBuffer() {
  nlohmann::json unique = nlohmann::json::array();
  nlohmann::json all = nlohmann::json::array();
  nlohmann::json state_dict = nlohmann::json::array();
  std::set<int> seen;
  for (int module = 0; module < 2; ++module) {
    const std::string prefix = std::to_string(module) + ".";
    state_dict.push_back(prefix + "weight");
    state_dict.push_back(prefix + "bias");
    for (const SharedBufferSlot& slot : kSharedBufferSlots) {
      if (slot.module != module) continue;
      all.push_back(prefix + slot.name);
      state_dict.push_back(prefix + slot.name);
      if (seen.insert(slot.tensor).second) unique.push_back(prefix + slot.name);
    }
  }
  return {{"buffer_names", unique}, {"buffer_names_all", all}, {"state_dict_keys", state_dict}};
}

Scenario MakeSharedBufferScenario() {
  Scenario s;
  s.info.name = "models/shared_buffer";
  s.info.description =
      "Sequential(Linear(2,2), Linear(2,2)) with one tensor registered as a buffer of both "
      "Linears (0.stat, 1.stat_alias) and one of the second only (1.own): named_buffers() "
      "lists the shared tensor once, named_buffers(remove_duplicate=False) and state_dict() "
      "under every path, judged by nn.Module's rules";
  s.info.seed_test = "none (torch.nn.Module.named_buffers / state_dict as documented)";
  s.info.params = {};
  s.info.default_world = 1;
  s.info.min_world = 1;
  s.info.max_world = 1;
  s.info.requirements.devices = {DeviceType::kCPU};
  s.info.observations
      .Add(ObservationKey::StringList("buffer_names", "the FQNs of named_buffers(), in order"))
      .Add(ObservationKey::StringList(
          "buffer_names_all", "the FQNs of named_buffers(remove_duplicate=False), in order"))
      .Add(ObservationKey::StringList("state_dict_keys", "the keys of state_dict(), in order"));
  s.run_rank = [](RankEnv& env) { return RunSharedBufferRank(env); };
  s.judge = [](const CaseParams&, int, const std::vector<nlohmann::json>& per_rank,
               CheckList& checks) {
    const nlohmann::json expected = ExpectedSharedBuffer();
    for (const auto& [key, value] : expected.items()) {
      checks.CheckEqual(key, value, RankObservation(per_rank, 0, key));
    }
  };
  return s;
}
}  // namespace

void RegisterModelsScenarios(ScenarioRegistry& registry) {
  for (const ZooModelKind& kind : ZooModel::Kinds()) registry.Add(MakeModelScenario(kind));
  registry.Add(MakeDropoutTrainingScenario());
  registry.Add(MakeLinearInitScenario());
  registry.Add(MakeSharedBufferScenario());
}

}  // namespace fsdp::conformance
