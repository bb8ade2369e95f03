#include "engine/nn/layers.h"

#include <cmath>
#include <sstream>

#include "engine/functional/functional.h"
#include "engine/nn/init.h"

namespace fsdp::nn {

namespace F = ::fsdp;  // the differentiable functional API

namespace {

std::string Bool(bool b) { return b ? "True" : "False"; }

std::string ShapeTuple(const Shape& shape) {
  std::ostringstream os;
  os << "(";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  if (shape.size() == 1) os << ",";
  os << ")";
  return os.str();
}

std::string FormatDouble(double v) {
  std::ostringstream os;
  os << v;
  std::string s = os.str();
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

int64_t WrapIndex(int64_t index, size_t size, const std::string& who) {
  const int64_t n = static_cast<int64_t>(size);
  const int64_t i = index < 0 ? index + n : index;
  FSDP_CHECK(i >= 0 && i < n, who, ": index ", index, " is out of range for ", n, " entries");
  return i;
}

}  // namespace

// ---- Linear ------------------------------------------------------------------------------------

Linear::Linear(int64_t in_features, int64_t out_features, bool bias, DType dtype)
    : Linear("Linear", in_features, out_features, bias, dtype) {}

Linear::Linear(std::string type_name, int64_t in_features, int64_t out_features, bool bias,
               DType dtype)
    : Cloneable<Linear>(std::move(type_name)),
      in_features_(in_features),
      out_features_(out_features) {
  FSDP_CHECK(in_features >= 0 && out_features >= 0, "Linear(", in_features, ", ", out_features,
             "): sizes must be non-negative");
  register_parameter("weight", Tensor::empty({out_features, in_features}, dtype));
  register_parameter("bias", bias ? Tensor::empty({out_features}, dtype) : Tensor());
  reset_parameters();
}

void Linear::reset_parameters() {
  Tensor w = weight();
  init::kaiming_uniform_(w, std::sqrt(5.0));
  Tensor b = bias();
  if (b.defined()) {
    const int64_t fan_in = in_features_;
    const double bound = fan_in > 0 ? 1.0 / std::sqrt(static_cast<double>(fan_in)) : 0.0;
    init::uniform_(b, -bound, bound);
  }
}

Value Linear::forward(const Value& input) { return F::linear(input.tensor(), weight(), bias()); }

std::string Linear::extra_repr() const {
  return "in_features=" + std::to_string(in_features_) +
         ", out_features=" + std::to_string(out_features_) +
         ", bias=" + Bool(parameter("bias").defined());
}

// ---- Embedding ---------------------------------------------------------------------------------

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim, DType dtype)
    : Cloneable<Embedding>("Embedding"),
      num_embeddings_(num_embeddings),
      embedding_dim_(embedding_dim) {
  register_parameter("weight", Tensor::empty({num_embeddings, embedding_dim}, dtype));
  reset_parameters();
}

void Embedding::reset_parameters() {
  Tensor w = weight();
  init::normal_(w);
}

Value Embedding::forward(const Value& input) { return F::embedding(input.tensor(), weight()); }

std::string Embedding::extra_repr() const {
  return std::to_string(num_embeddings_) + ", " + std::to_string(embedding_dim_);
}

// ---- LayerNorm ---------------------------------------------------------------------------------

LayerNorm::LayerNorm(Shape normalized_shape, double eps, bool elementwise_affine, bool bias,
                     DType dtype)
    : Cloneable<LayerNorm>("LayerNorm"),
      normalized_shape_(std::move(normalized_shape)),
      eps_(eps),
      elementwise_affine_(elementwise_affine) {
  if (elementwise_affine) {
    register_parameter("weight", Tensor::empty(normalized_shape_, dtype));
    register_parameter("bias", bias ? Tensor::empty(normalized_shape_, dtype) : Tensor());
  } else {
    register_parameter("weight", Tensor());
    register_parameter("bias", Tensor());
  }
  reset_parameters();
}

void LayerNorm::reset_parameters() {
  Tensor w = parameter("weight");
  if (w.defined()) init::ones_(w);
  Tensor b = parameter("bias");
  if (b.defined()) init::zeros_(b);
}

Value LayerNorm::forward(const Value& input) {
  return F::layer_norm(input.tensor(), normalized_shape_, parameter("weight"), parameter("bias"),
                       eps_);
}

std::string LayerNorm::extra_repr() const {
  return ShapeTuple(normalized_shape_) + ", eps=" + FormatDouble(eps_) +
         ", elementwise_affine=" + Bool(elementwise_affine_);
}

// ---- RMSNorm -----------------------------------------------------------------------------------

RMSNorm::RMSNorm(Shape normalized_shape, std::optional<double> eps, bool elementwise_affine,
                 DType dtype)
    : Cloneable<RMSNorm>("RMSNorm"),
      normalized_shape_(std::move(normalized_shape)),
      eps_(eps),
      elementwise_affine_(elementwise_affine) {
  register_parameter("weight",
                     elementwise_affine ? Tensor::empty(normalized_shape_, dtype) : Tensor());
  reset_parameters();
}

void RMSNorm::reset_parameters() {
  Tensor w = parameter("weight");
  if (w.defined()) init::ones_(w);
}

Value RMSNorm::forward(const Value& input) {
  return F::rms_norm(input.tensor(), normalized_shape_, parameter("weight"), eps_);
}

std::string RMSNorm::extra_repr() const {
  return ShapeTuple(normalized_shape_) + ", eps=" + (eps_ ? FormatDouble(*eps_) : "None") +
         ", elementwise_affine=" + Bool(elementwise_affine_);
}

// ---- BatchNorm1d -------------------------------------------------------------------------------

BatchNorm1d::BatchNorm1d(int64_t num_features, double eps, std::optional<double> momentum,
                         bool affine, bool track_running_stats, DType dtype)
    : Cloneable<BatchNorm1d>("BatchNorm1d"),
      num_features_(num_features),
      eps_(eps),
      momentum_(momentum),
      affine_(affine),
      track_running_stats_(track_running_stats) {
  register_parameter("weight", affine ? Tensor::empty({num_features}, dtype) : Tensor());
  register_parameter("bias", affine ? Tensor::empty({num_features}, dtype) : Tensor());
  if (track_running_stats) {
    register_buffer("running_mean", Tensor::zeros({num_features}, dtype));
    register_buffer("running_var", Tensor::ones({num_features}, dtype));
    register_buffer("num_batches_tracked", Tensor::zeros({}, DType::kInt64));
  } else {
    register_buffer("running_mean", Tensor());
    register_buffer("running_var", Tensor());
    register_buffer("num_batches_tracked", Tensor());
  }
  reset_parameters();
}

void BatchNorm1d::reset_running_stats() {
  if (!track_running_stats_) return;
  buffer("running_mean").zero_();
  buffer("running_var").fill_(1.0);
  buffer("num_batches_tracked").zero_();
}

void BatchNorm1d::reset_parameters() {
  reset_running_stats();
  if (affine_) {
    Tensor w = parameter("weight");
    init::ones_(w);
    Tensor b = parameter("bias");
    init::zeros_(b);
  }
}

Value BatchNorm1d::forward(const Value& input) {
  const Tensor& x = input.tensor();
  FSDP_CHECK(x.dim() == 2 || x.dim() == 3, "BatchNorm1d: expected 2D or 3D input (got ", x.dim(),
             "D input of shape ", ShapeStr(x.sizes()), ")");
  const bool training = is_training();
  Tensor num_batches_tracked;
  double exponential_average_factor = momentum_.value_or(0.0);
  if (training && track_running_stats_) {
    num_batches_tracked = buffer("num_batches_tracked");
    // batch_norm increments num_batches_tracked; momentum=None is the cumulative average.
    if (num_batches_tracked.defined() && !momentum_) {
      exponential_average_factor = 1.0 / (num_batches_tracked.item() + 1.0);
    }
  }
  const bool bn_training =
      training || (!buffer("running_mean").defined() && !buffer("running_var").defined());
  const bool use_running = !training || track_running_stats_;
  return F::batch_norm(x, use_running ? buffer("running_mean") : Tensor(),
                       use_running ? buffer("running_var") : Tensor(), parameter("weight"),
                       parameter("bias"), bn_training, exponential_average_factor, eps_,
                       num_batches_tracked);
}

std::string BatchNorm1d::extra_repr() const {
  return std::to_string(num_features_) + ", eps=" + FormatDouble(eps_) +
         ", momentum=" + (momentum_ ? FormatDouble(*momentum_) : "None") +
         ", affine=" + Bool(affine_) + ", track_running_stats=" + Bool(track_running_stats_);
}

void BatchNorm1d::load_from_state_dict(StateDict& state_dict, const std::string& prefix,
                                       std::optional<int64_t> version, LoadStateDictState& state) {
  if ((!version || *version < 2) && track_running_stats_) {
    const std::string key = prefix + "num_batches_tracked";
    if (!state_dict.contains(key)) {
      Tensor current = buffer("num_batches_tracked");
      state_dict.insert(key, current.defined() ? current : Tensor::zeros({}, DType::kInt64));
    }
  }
  Module::load_from_state_dict(state_dict, prefix, version, state);
}

// ---- Activations and dropout -------------------------------------------------------------------

Dropout::Dropout(double p) : Cloneable<Dropout>("Dropout"), p_(p) {
  FSDP_CHECK(p >= 0.0 && p <= 1.0, "dropout probability has to be between 0 and 1, but got ", p);
}

Value Dropout::forward(const Value& input) { return F::dropout(input.tensor(), p_, is_training()); }

std::string Dropout::extra_repr() const { return "p=" + FormatDouble(p_) + ", inplace=False"; }

Value ReLU::forward(const Value& input) { return F::relu(input.tensor()); }

GELU::GELU(std::string approximate)
    : Cloneable<GELU>("GELU"), approximate_(std::move(approximate)) {
  FSDP_CHECK(approximate_ == "none" || approximate_ == "tanh",
             "GELU: approximate must be 'none' or 'tanh', got '", approximate_, "'");
}

Value GELU::forward(const Value& input) { return F::gelu(input.tensor(), approximate_); }

std::string GELU::extra_repr() const { return "approximate='" + approximate_ + "'"; }

// ---- Containers --------------------------------------------------------------------------------

Sequential::Sequential(std::vector<ModulePtr> modules)
    : Sequential("Sequential", std::move(modules)) {}

Sequential::Sequential(std::string type_name, std::vector<ModulePtr> modules)
    : Cloneable<Sequential>(std::move(type_name)) {
  for (auto& m : modules) append(std::move(m));
}

Sequential::Sequential(std::vector<NamedModule> named_modules)
    : Cloneable<Sequential>("Sequential") {
  for (auto& [name, m] : named_modules) register_module(name, std::move(m));
}

void Sequential::append(ModulePtr module) {
  register_module(std::to_string(child_slots().size()), std::move(module));
}

ModulePtr Sequential::operator[](int64_t index) const {
  const int64_t i = WrapIndex(index, child_slots().size(), type_name());
  return child_slots().items()[static_cast<size_t>(i)].second;
}

Value Sequential::forward(const Value& input) {
  Value x = input;
  // A copy: a hook may replace a child while we iterate.
  const auto children = child_slots().items();
  for (const auto& [name, m] : children) x = (*m)(std::move(x));
  return x;
}

ModuleList::ModuleList(std::vector<ModulePtr> modules) : Cloneable<ModuleList>("ModuleList") {
  for (auto& m : modules) append(std::move(m));
}

void ModuleList::append(ModulePtr module) {
  register_module(std::to_string(child_slots().size()), std::move(module));
}

ModulePtr ModuleList::operator[](int64_t index) const {
  const int64_t i = WrapIndex(index, child_slots().size(), type_name());
  return child_slots().items()[static_cast<size_t>(i)].second;
}

std::vector<ModulePtr> ModuleList::list() const {
  std::vector<ModulePtr> out;
  for (const auto& [name, m] : child_slots()) out.push_back(m);
  return out;
}

ParameterList::ParameterList(std::vector<Tensor> params)
    : Cloneable<ParameterList>("ParameterList") {
  for (auto& p : params) append(std::move(p));
}

void ParameterList::append(Tensor param) {
  register_parameter(std::to_string(parameter_slots().size()), std::move(param));
}

Tensor ParameterList::operator[](int64_t index) const {
  const int64_t i = WrapIndex(index, parameter_slots().size(), type_name());
  return parameter_slots().items()[static_cast<size_t>(i)].second;
}

}  // namespace fsdp::nn
