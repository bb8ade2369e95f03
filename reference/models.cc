#include "reference/models.h"

#include <stdexcept>
#include <utility>

#include "reference/module_helpers.h"

namespace fsdp::reference {
namespace {

template <typename T>
using OutputGrads = std::vector<std::optional<BasicRefTensor<T>>>;

// ---- MLP block (common_fsdp.py MLP) shared by Mlp and MlpStack ---------------------------------

struct MlpBlock {
  std::string prefix;
  int64_t dim;
  int64_t multiplier;
  bool bias;
  bool with_buffer;

  std::vector<TensorSpec> Specs() const {
    std::vector<TensorSpec> s =
        LinearSpecs(JoinFqn(prefix, "in_proj"), dim, multiplier * dim, bias);
    AppendSpecs(&s, LinearSpecs(JoinFqn(prefix, "out_proj"), multiplier * dim, dim, bias));
    return s;
  }
};

template <typename T>
struct MlpActivations {
  Matrix<T> x, z1, a1, z2, out;
};

template <typename T>
MlpActivations<T> MlpBlockForward(const MlpBlock& block, const TensorMap<T>& params,
                                  const TensorMap<T>& buffers, const Matrix<T>& x) {
  MlpActivations<T> a;
  a.x = x;
  a.z1 = LinearAt(params, JoinFqn(block.prefix, "in_proj"), block.bias, x);
  a.a1 = ReluForward<T>(a.z1);
  a.z2 = LinearAt(params, JoinFqn(block.prefix, "out_proj"), block.bias, a.a1);
  a.out = ReluForward<T>(a.z2);
  if (block.with_buffer) {
    a.out.rowwise() += ToVector(Lookup(buffers, JoinFqn(block.prefix, "buffer"))).transpose();
  }
  return a;
}

// Returns d/dx; the buffer is not a parameter and gets no gradient.
template <typename T>
Matrix<T> MlpBlockBackward(const MlpBlock& block, const TensorMap<T>& params,
                           const MlpActivations<T>& a, const Matrix<T>& grad_out,
                           TensorMap<T>* grads) {
  const Matrix<T> dz2 = ReluBackward<T>(a.z2, grad_out);
  const Matrix<T> da1 =
      LinearAtBackward(params, JoinFqn(block.prefix, "out_proj"), block.bias, a.a1, dz2, grads);
  const Matrix<T> dz1 = ReluBackward<T>(a.z1, da1);
  return LinearAtBackward(params, JoinFqn(block.prefix, "in_proj"), block.bias, a.x, dz1, grads);
}

std::vector<MlpBlock> MlpStackBlocks(const MlpStackConfig& c) {
  return {{"0", c.mlp_dim, 3, true, false},
          {"1", c.mlp_dim, 4, true, false},
          {"2", c.mlp_dim, 3, true, false}};
}

// ---- BatchNorm buffers <-> stats ---------------------------------------------------------------

template <typename T>
BatchNormStats<T> StatsFromBuffers(const TensorMap<T>& buffers, const std::string& prefix) {
  BatchNormStats<T> s;
  s.running_mean = ToVector(Lookup(buffers, JoinFqn(prefix, "running_mean")));
  s.running_var = ToVector(Lookup(buffers, JoinFqn(prefix, "running_var")));
  s.num_batches_tracked =
      static_cast<int64_t>(Lookup(buffers, JoinFqn(prefix, "num_batches_tracked"))[0]);
  return s;
}

template <typename T>
void StatsToBuffers(const BatchNormStats<T>& s, const std::string& prefix, TensorMap<T>* buffers) {
  const Shape c = {s.running_mean.size()};
  (*buffers)[JoinFqn(prefix, "running_mean")] = FromVector<T>(s.running_mean, c);
  (*buffers)[JoinFqn(prefix, "running_var")] = FromVector<T>(s.running_var, c);
  (*buffers)[JoinFqn(prefix, "num_batches_tracked")] =
      BasicRefTensor<T>(Shape{}, {static_cast<T>(s.num_batches_tracked)});
}

// BatchNorm `prefix`'s buffers over `dim` channels, in nn.BatchNorm's registration order.
std::vector<TensorSpec> BatchNormBufferSpecs(const std::string& prefix, int64_t dim) {
  return {{JoinFqn(prefix, "running_mean"), {dim}},
          {JoinFqn(prefix, "running_var"), {dim}},
          {JoinFqn(prefix, "num_batches_tracked"), {}}};
}

// Their values at construction: zero mean, unit variance, no batch tracked.
template <typename T>
TensorMap<T> BatchNormDefaultBuffers(const std::string& prefix, int64_t dim) {
  BatchNormStats<T> s;
  s.running_mean = Vector<T>::Zero(dim);
  s.running_var = Vector<T>::Ones(dim);
  TensorMap<T> buffers;
  StatsToBuffers(s, prefix, &buffers);
  return buffers;
}

}  // namespace

// ---- LinearChain -------------------------------------------------------------------------------

template <typename T>
LinearChain<T>::LinearChain(LinearChainConfig config) : config_(std::move(config)) {
  if (config_.stages.empty()) throw std::invalid_argument(config_.model_name + ": no stages");
  for (size_t i = 0; i < config_.stages.size(); ++i) {
    const LinearStage& s = config_.stages[i];
    if (s.in_features <= 0 || s.out_features <= 0) {
      throw std::invalid_argument(config_.model_name + ": stage '" + s.name +
                                  "' needs positive sizes");
    }
    if (i > 0 && s.in_features != config_.stages[i - 1].out_features) {
      throw std::invalid_argument(config_.model_name + ": stage '" + s.name + "' takes " +
                                  std::to_string(s.in_features) + " features but the previous " +
                                  "stage produces " +
                                  std::to_string(config_.stages[i - 1].out_features));
    }
  }
}

template <typename T>
std::vector<TensorSpec> LinearChain<T>::ParameterSpecs() const {
  std::vector<TensorSpec> specs;
  for (const LinearStage& s : config_.stages) {
    AppendSpecs(&specs, LinearSpecs(s.name, s.in_features, s.out_features, s.bias));
  }
  return specs;
}

template <typename T>
ForwardResult<T> LinearChain<T>::Forward(const TensorMap<T>& params, const TensorMap<T>& buffers,
                                         const ModelInput<T>& input) const {
  CheckTensorMap(ParameterSpecs(), params, Name(), "parameter");
  Shape leading;
  Matrix<T> x = FeaturesAsMatrix(input, config_.stages.front().in_features, Name(), &leading);
  for (const LinearStage& s : config_.stages) {
    x = LinearAt(params, s.name, s.bias, x);
    if (s.relu_after) x = ReluForward<T>(x);
  }
  return {{FromMatrix<T>(x, WithLastDim(leading, config_.stages.back().out_features))}, buffers};
}

template <typename T>
BackwardResult<T> LinearChain<T>::Backward(const TensorMap<T>& params,
                                           const TensorMap<T>& /*buffers*/,
                                           const ModelInput<T>& input,
                                           const OutputGrads<T>& output_grads) const {
  CheckTensorMap(ParameterSpecs(), params, Name(), "parameter");
  Shape leading;
  const Matrix<T> x0 =
      FeaturesAsMatrix(input, config_.stages.front().in_features, Name(), &leading);
  const std::optional<Matrix<T>> dout = OutputGrad(
      output_grads, 0, 1, WithLastDim(leading, config_.stages.back().out_features), Name());
  BackwardResult<T> r;
  if (!dout) return r;
  // Forward again, keeping each stage's input and pre-activation.
  std::vector<Matrix<T>> inputs, pre;
  Matrix<T> x = x0;
  for (const LinearStage& s : config_.stages) {
    inputs.push_back(x);
    pre.push_back(LinearAt(params, s.name, s.bias, x));
    x = s.relu_after ? ReluForward<T>(pre.back()) : pre.back();
  }
  Matrix<T> dy = *dout;
  for (size_t i = config_.stages.size(); i-- > 0;) {
    const LinearStage& s = config_.stages[i];
    const Matrix<T> dz = s.relu_after ? ReluBackward<T>(pre[i], dy) : dy;
    dy = LinearAtBackward(params, s.name, s.bias, inputs[i], dz, &r.grads);
  }
  r.input_grad = FromMatrix<T>(dy, input.features->shape);
  return r;
}

LinearChainConfig MlpModuleChain(const MlpModuleConfig& config, const std::string& prefix) {
  LinearChainConfig c;
  c.model_name = "MLPModule";
  c.stages = {{JoinFqn(prefix, "net1"), 10, 16, config.bias, true},
              {JoinFqn(prefix, "net2"), 16, 10, config.bias, false}};
  return c;
}

LinearChainConfig MlpStackedChain(const MlpStackedConfig& config) {
  LinearChainConfig c;
  c.model_name = "MLPStacked";
  for (int i = 0; i < config.n_layers; ++i) {
    const LinearChainConfig layer = MlpModuleChain({}, "layers." + std::to_string(i));
    c.stages.insert(c.stages.end(), layer.stages.begin(), layer.stages.end());
  }
  return c;
}

LinearChainConfig TpSimpleModelChain() {
  LinearChainConfig c;
  c.model_name = "SimpleModel";
  c.stages = {
      {"net1", 5, 8, true, true}, {"net2", 8, 4, true, false}, {"net3", 4, 12, true, false}};
  return c;
}

LinearChainConfig NestedWrappedModuleChain() {
  LinearChainConfig c;
  c.model_name = "NestedWrappedModule";
  c.stages = {{"module.0", 8, 4, true, false},
              {"module.1.0", 4, 16, true, false},
              {"module.1.1", 16, 16, true, false},
              {"module.2", 16, 4, true, false},
              {"module.3", 4, 8, true, false}};
  return c;
}

// ---- Mlp ---------------------------------------------------------------------------------------

template <typename T>
std::vector<TensorSpec> Mlp<T>::ParameterSpecs() const {
  return MlpBlock{"", config_.dim, config_.dim_multiplier, config_.bias, false}.Specs();
}

template <typename T>
std::vector<TensorSpec> Mlp<T>::BufferSpecs() const {
  if (!config_.with_buffer) return {};
  return {{"buffer", {config_.dim}}};
}

template <typename T>
ForwardResult<T> Mlp<T>::Forward(const TensorMap<T>& params, const TensorMap<T>& buffers,
                                 const ModelInput<T>& input) const {
  CheckTensorMap(ParameterSpecs(), params, Name(), "parameter");
  CheckTensorMap(BufferSpecs(), buffers, Name(), "buffer");
  Shape leading;
  const Matrix<T> x = FeaturesAsMatrix(input, config_.dim, Name(), &leading);
  const MlpBlock block{"", config_.dim, config_.dim_multiplier, config_.bias, config_.with_buffer};
  const MlpActivations<T> a = MlpBlockForward(block, params, buffers, x);
  return {{FromMatrix<T>(a.out, WithLastDim(leading, config_.dim))}, buffers};
}

template <typename T>
BackwardResult<T> Mlp<T>::Backward(const TensorMap<T>& params, const TensorMap<T>& buffers,
                                   const ModelInput<T>& input,
                                   const OutputGrads<T>& output_grads) const {
  CheckTensorMap(ParameterSpecs(), params, Name(), "parameter");
  CheckTensorMap(BufferSpecs(), buffers, Name(), "buffer");
  Shape leading;
  const Matrix<T> x = FeaturesAsMatrix(input, config_.dim, Name(), &leading);
  const auto dout = OutputGrad(output_grads, 0, 1, WithLastDim(leading, config_.dim), Name());
  BackwardResult<T> r;
  if (!dout) return r;
  const MlpBlock block{"", config_.dim, config_.dim_multiplier, config_.bias, config_.with_buffer};
  const MlpActivations<T> a = MlpBlockForward(block, params, buffers, x);
  r.input_grad =
      FromMatrix<T>(MlpBlockBackward(block, params, a, *dout, &r.grads), input.features->shape);
  return r;
}

// ---- MlpStack ----------------------------------------------------------------------------------

template <typename T>
std::vector<TensorSpec> MlpStack<T>::ParameterSpecs() const {
  std::vector<TensorSpec> specs;
  for (const MlpBlock& b : MlpStackBlocks(config_)) AppendSpecs(&specs, b.Specs());
  if (config_.with_seq_parallel) AppendSpecs(&specs, NormSpecs("3", config_.mlp_dim, false));
  return specs;
}

template <typename T>
ForwardResult<T> MlpStack<T>::Forward(const TensorMap<T>& params, const TensorMap<T>& buffers,
                                      const ModelInput<T>& input) const {
  CheckTensorMap(ParameterSpecs(), params, Name(), "parameter");
  Shape leading;
  Matrix<T> x = FeaturesAsMatrix(input, config_.mlp_dim, Name(), &leading);
  for (const MlpBlock& b : MlpStackBlocks(config_)) x = MlpBlockForward(b, params, buffers, x).out;
  if (config_.with_seq_parallel) x = LayerNormAt(params, "3", false, x);
  return {{FromMatrix<T>(x, WithLastDim(leading, config_.mlp_dim))}, buffers};
}

template <typename T>
BackwardResult<T> MlpStack<T>::Backward(const TensorMap<T>& params, const TensorMap<T>& buffers,
                                        const ModelInput<T>& input,
                                        const OutputGrads<T>& output_grads) const {
  CheckTensorMap(ParameterSpecs(), params, Name(), "parameter");
  Shape leading;
  Matrix<T> x = FeaturesAsMatrix(input, config_.mlp_dim, Name(), &leading);
  const auto dout = OutputGrad(output_grads, 0, 1, WithLastDim(leading, config_.mlp_dim), Name());
  BackwardResult<T> r;
  if (!dout) return r;
  const std::vector<MlpBlock> blocks = MlpStackBlocks(config_);
  std::vector<MlpActivations<T>> acts;
  for (const MlpBlock& b : blocks) {
    acts.push_back(MlpBlockForward(b, params, buffers, x));
    x = acts.back().out;
  }
  Matrix<T> dy = *dout;
  if (config_.with_seq_parallel) dy = LayerNormAtBackward(params, "3", false, x, dy, &r.grads);
  for (size_t i = blocks.size(); i-- > 0;) {
    dy = MlpBlockBackward(blocks[i], params, acts[i], dy, &r.grads);
  }
  r.input_grad = FromMatrix<T>(dy, input.features->shape);
  return r;
}

// ---- DoubleLinear ------------------------------------------------------------------------------

template <typename T>
std::string DoubleLinear<T>::Lin(const char* name) const {
  return config_.preceded_by_linear ? std::string("1.") + name : std::string(name);
}

template <typename T>
std::vector<TensorSpec> DoubleLinear<T>::ParameterSpecs() const {
  std::vector<TensorSpec> specs;
  if (config_.preceded_by_linear) specs = LinearSpecs("0", config_.dim, config_.dim, true);
  AppendSpecs(&specs, LinearSpecs(Lin("lin1"), config_.dim, config_.dim, true));
  AppendSpecs(&specs, LinearSpecs(Lin("lin2"), config_.dim, config_.dim, true));
  return specs;
}

template <typename T>
ForwardResult<T> DoubleLinear<T>::Forward(const TensorMap<T>& params, const TensorMap<T>& buffers,
                                          const ModelInput<T>& input) const {
  CheckTensorMap(ParameterSpecs(), params, Name(), "parameter");
  Shape leading;
  Matrix<T> h = FeaturesAsMatrix(input, config_.dim, Name(), &leading);
  if (config_.preceded_by_linear) h = LinearAt(params, "0", true, h);
  const Shape out_shape = WithLastDim(leading, config_.dim);
  ForwardResult<T> r;
  r.buffers = buffers;
  r.outputs.push_back(
      FromMatrix<T>(ReluForward<T>(LinearAt(params, Lin("lin1"), true, h)), out_shape));
  if (config_.use_second_linear) {
    r.outputs.push_back(
        FromMatrix<T>(ReluForward<T>(LinearAt(params, Lin("lin2"), true, h)), out_shape));
  }
  return r;
}

template <typename T>
BackwardResult<T> DoubleLinear<T>::Backward(const TensorMap<T>& params,
                                            const TensorMap<T>& /*buffers*/,
                                            const ModelInput<T>& input,
                                            const OutputGrads<T>& output_grads) const {
  CheckTensorMap(ParameterSpecs(), params, Name(), "parameter");
  Shape leading;
  const Matrix<T> x = FeaturesAsMatrix(input, config_.dim, Name(), &leading);
  const Shape out_shape = WithLastDim(leading, config_.dim);
  const size_t n = static_cast<size_t>(NumOutputs());
  BackwardResult<T> r;
  if (!AnyGrad(output_grads)) {
    OutputGrad(output_grads, 0, n, out_shape, Name());  // validates the slot count
    return r;
  }
  const Matrix<T> h = config_.preceded_by_linear ? LinearAt(params, "0", true, x) : x;
  Matrix<T> dh = Matrix<T>::Zero(h.rows(), h.cols());
  const char* branches[] = {"lin1", "lin2"};
  for (size_t i = 0; i < n; ++i) {
    const auto g = OutputGrad(output_grads, i, n, out_shape, Name());
    if (!g) continue;  // this output sends no gradient: its Linear stays without one
    const Matrix<T> z = LinearAt(params, Lin(branches[i]), true, h);
    dh += LinearAtBackward(params, Lin(branches[i]), true, h, ReluBackward<T>(z, *g), &r.grads);
  }
  const Matrix<T> dx =
      config_.preceded_by_linear ? LinearAtBackward(params, "0", true, x, dh, &r.grads) : dh;
  r.input_grad = FromMatrix<T>(dx, input.features->shape);
  return r;
}

// ---- MlpWithRmsNorm ----------------------------------------------------------------------------

template <typename T>
std::vector<TensorSpec> MlpWithRmsNorm<T>::ParameterSpecs() const {
  std::vector<TensorSpec> specs = LinearSpecs("mlp.net1", 10, 16, config_.mlp_bias);
  AppendSpecs(&specs, LinearSpecs("mlp.net2", 16, 10, config_.mlp_bias));
  AppendSpecs(&specs, NormSpecs("mlp_norm", 10, false));
  return specs;
}

template <typename T>
ForwardResult<T> MlpWithRmsNorm<T>::Forward(const TensorMap<T>& params, const TensorMap<T>& buffers,
                                            const ModelInput<T>& input) const {
  CheckTensorMap(ParameterSpecs(), params, Name(), "parameter");
  Shape leading;
  const Matrix<T> x = FeaturesAsMatrix(input, 10, Name(), &leading);
  const auto mlp = [&](const Matrix<T>& in) {
    const Matrix<T> h = ReluForward<T>(LinearAt(params, "mlp.net1", config_.mlp_bias, in));
    return Matrix<T>(LinearAt(params, "mlp.net2", config_.mlp_bias, h));
  };
  const Matrix<T> y = config_.norm_last ? RmsNormAt(params, "mlp_norm", mlp(x), config_.eps)
                                        : mlp(RmsNormAt(params, "mlp_norm", x, config_.eps));
  return {{FromMatrix<T>(y, WithLastDim(leading, 10))}, buffers};
}

template <typename T>
BackwardResult<T> MlpWithRmsNorm<T>::Backward(const TensorMap<T>& params,
                                              const TensorMap<T>& /*buffers*/,
                                              const ModelInput<T>& input,
                                              const OutputGrads<T>& output_grads) const {
  CheckTensorMap(ParameterSpecs(), params, Name(), "parameter");
  Shape leading;
  const Matrix<T> x = FeaturesAsMatrix(input, 10, Name(), &leading);
  const auto dout = OutputGrad(output_grads, 0, 1, WithLastDim(leading, 10), Name());
  BackwardResult<T> r;
  if (!dout) return r;
  const Matrix<T> dy = *dout;
  // The MLP's backward from its input `in` and output gradient `dout_mlp`; returns d(in).
  const auto mlp_backward = [&](const Matrix<T>& in, const Matrix<T>& dout_mlp) {
    const Matrix<T> z = LinearAt(params, "mlp.net1", config_.mlp_bias, in);
    const Matrix<T> h = ReluForward<T>(z);
    const Matrix<T> dh =
        LinearAtBackward(params, "mlp.net2", config_.mlp_bias, h, dout_mlp, &r.grads);
    return Matrix<T>(LinearAtBackward(params, "mlp.net1", config_.mlp_bias, in,
                                      ReluBackward<T>(z, dh), &r.grads));
  };
  Matrix<T> dx;
  if (config_.norm_last) {
    const Matrix<T> y =
        LinearAt(params, "mlp.net2", config_.mlp_bias,
                 Matrix<T>(ReluForward<T>(LinearAt(params, "mlp.net1", config_.mlp_bias, x))));
    dx = mlp_backward(x, RmsNormAtBackward(params, "mlp_norm", y, dy, &r.grads, config_.eps));
  } else {
    const Matrix<T> n = RmsNormAt(params, "mlp_norm", x, config_.eps);
    dx = RmsNormAtBackward(params, "mlp_norm", x, mlp_backward(n, dy), &r.grads, config_.eps);
  }
  r.input_grad = FromMatrix<T>(dx, input.features->shape);
  return r;
}

// ---- StateDictModel ----------------------------------------------------------------------------

template <typename T>
std::vector<TensorSpec> StateDictModel<T>::ParameterSpecs() const {
  std::vector<TensorSpec> specs = LinearSpecs("inner", 4, 4, true);
  AppendSpecs(&specs, LinearSpecs("outer", 4, 5, true));
  return specs;
}

template <typename T>
std::vector<TensorSpec> StateDictModel<T>::BufferSpecs() const {
  if (!config_.register_buffers) return {};
  return {{"inner.buffer", {5, 5}, true},
          {"inner.non_persistent_buffer", {5, 5}, false},
          {"outer.buffer", {5, 5}, true},
          {"outer.non_persistent_buffer", {5, 5}, false}};
}

template <typename T>
ForwardResult<T> StateDictModel<T>::Forward(const TensorMap<T>& params, const TensorMap<T>& buffers,
                                            const ModelInput<T>& input) const {
  CheckTensorMap(ParameterSpecs(), params, Name(), "parameter");
  CheckTensorMap(BufferSpecs(), buffers, Name(), "buffer");
  Shape leading;
  const Matrix<T> x = FeaturesAsMatrix(input, 4, Name(), &leading);
  const Matrix<T> i = LinearAt(params, "inner", true, x);
  const Matrix<T> j = LinearAt(params, "inner", true, x);
  const Matrix<T> y = LinearAt(params, "outer", true, Matrix<T>(i + j));
  return {{FromMatrix<T>(y, WithLastDim(leading, 5))}, buffers};
}

template <typename T>
BackwardResult<T> StateDictModel<T>::Backward(const TensorMap<T>& params,
                                              const TensorMap<T>& buffers,
                                              const ModelInput<T>& input,
                                              const OutputGrads<T>& output_grads) const {
  CheckTensorMap(ParameterSpecs(), params, Name(), "parameter");
  CheckTensorMap(BufferSpecs(), buffers, Name(), "buffer");
  Shape leading;
  const Matrix<T> x = FeaturesAsMatrix(input, 4, Name(), &leading);
  const auto dout = OutputGrad(output_grads, 0, 1, WithLastDim(leading, 5), Name());
  BackwardResult<T> r;
  if (!dout) return r;
  const Matrix<T> s = LinearAt(params, "inner", true, x) + LinearAt(params, "inner", true, x);
  const Matrix<T> ds = LinearAtBackward(params, "outer", true, s, *dout, &r.grads);
  // i + j: both calls of `inner` receive ds and accumulate into the same parameters.
  Matrix<T> dx = LinearAtBackward(params, "inner", true, x, ds, &r.grads);
  dx += LinearAtBackward(params, "inner", true, x, ds, &r.grads);
  r.input_grad = FromMatrix<T>(dx, input.features->shape);
  return r;
}

// ---- SharedSubmoduleModel ----------------------------------------------------------------------

template <typename T>
std::vector<TensorSpec> SharedSubmoduleModel<T>::ParameterSpecs() const {
  std::vector<TensorSpec> specs = LinearSpecs("net1.0", 8, 16, true);
  AppendSpecs(&specs, LinearSpecs("net2.0", 16, 16, true));
  specs.push_back({"random_parameter", {10}});
  return specs;
}

template <typename T>
ForwardResult<T> SharedSubmoduleModel<T>::Forward(const TensorMap<T>& params,
                                                  const TensorMap<T>& buffers,
                                                  const ModelInput<T>& input) const {
  CheckTensorMap(ParameterSpecs(), params, Name(), "parameter");
  Shape leading;
  const Matrix<T> x = FeaturesAsMatrix(input, 8, Name(), &leading);
  const Matrix<T> a1 = ReluForward<T>(LinearAt(params, "net1.0", true, x));
  const Matrix<T> a2 = ReluForward<T>(LinearAt(params, "net2.0", true, a1));  // net2
  const Matrix<T> a3 = ReluForward<T>(LinearAt(params, "net2.0", true, a2));  // net3 is net2
  return {{FromMatrix<T>(a3, WithLastDim(leading, 16))}, buffers};
}

template <typename T>
BackwardResult<T> SharedSubmoduleModel<T>::Backward(const TensorMap<T>& params,
                                                    const TensorMap<T>& /*buffers*/,
                                                    const ModelInput<T>& input,
                                                    const OutputGrads<T>& output_grads) const {
  CheckTensorMap(ParameterSpecs(), params, Name(), "parameter");
  Shape leading;
  const Matrix<T> x = FeaturesAsMatrix(input, 8, Name(), &leading);
  const auto dout = OutputGrad(output_grads, 0, 1, WithLastDim(leading, 16), Name());
  BackwardResult<T> r;
  if (!dout) return r;
  const Matrix<T> z1 = LinearAt(params, "net1.0", true, x);
  const Matrix<T> a1 = ReluForward<T>(z1);
  const Matrix<T> z2 = LinearAt(params, "net2.0", true, a1);
  const Matrix<T> a2 = ReluForward<T>(z2);
  const Matrix<T> z3 = LinearAt(params, "net2.0", true, a2);
  const Matrix<T> da2 =
      LinearAtBackward(params, "net2.0", true, a2, ReluBackward<T>(z3, *dout), &r.grads);
  const Matrix<T> da1 =
      LinearAtBackward(params, "net2.0", true, a1, ReluBackward<T>(z2, da2), &r.grads);
  const Matrix<T> dx =
      LinearAtBackward(params, "net1.0", true, x, ReluBackward<T>(z1, da1), &r.grads);
  r.input_grad = FromMatrix<T>(dx, input.features->shape);
  return r;  // random_parameter is never used: no gradient
}

// ---- LinearBatchNormLinear ---------------------------------------------------------------------

template <typename T>
std::vector<TensorSpec> LinearBatchNormLinear<T>::ParameterSpecs() const {
  std::vector<TensorSpec> specs = LinearSpecs("0", config_.dim, config_.dim, false);
  AppendSpecs(&specs, NormSpecs("1", config_.dim, true));
  AppendSpecs(&specs, LinearSpecs("2", config_.dim, config_.dim, false));
  return specs;
}

template <typename T>
std::vector<TensorSpec> LinearBatchNormLinear<T>::BufferSpecs() const {
  return BatchNormBufferSpecs("1", config_.dim);
}

template <typename T>
TensorMap<T> LinearBatchNormLinear<T>::DefaultBuffers() const {
  return BatchNormDefaultBuffers<T>("1", config_.dim);
}

template <typename T>
ForwardResult<T> LinearBatchNormLinear<T>::Forward(const TensorMap<T>& params,
                                                   const TensorMap<T>& buffers,
                                                   const ModelInput<T>& input) const {
  CheckTensorMap(ParameterSpecs(), params, Name(), "parameter");
  CheckTensorMap(BufferSpecs(), buffers, Name(), "buffer");
  Shape leading;
  const Matrix<T> x = BatchRowsAsMatrix(input, config_.dim, Name(), &leading);
  const Shape shape = WithLastDim(leading, config_.dim);
  const Matrix<T> h = LinearAt(params, "0", false, x);
  BatchNormStats<T> stats = StatsFromBuffers(buffers, "1");
  const Vector<T> w = ToVector(Lookup(params, "1.weight"));
  const Vector<T> b = ToVector(Lookup(params, "1.bias"));
  const BatchNormOptions opts{config_.eps, config_.momentum, config_.training};
  const BasicRefTensor<T> n = BatchNormForward<T>(FromMatrix<T>(h, shape), &w, &b, &stats, opts);
  const Matrix<T> y = LinearAt(params, "2", false, ToMatrix(n));
  ForwardResult<T> r;
  r.outputs.push_back(FromMatrix<T>(y, shape));
  r.buffers = buffers;
  StatsToBuffers(stats, "1", &r.buffers);
  return r;
}

template <typename T>
BackwardResult<T> LinearBatchNormLinear<T>::Backward(const TensorMap<T>& params,
                                                     const TensorMap<T>& buffers,
                                                     const ModelInput<T>& input,
                                                     const OutputGrads<T>& output_grads) const {
  CheckTensorMap(ParameterSpecs(), params, Name(), "parameter");
  CheckTensorMap(BufferSpecs(), buffers, Name(), "buffer");
  Shape leading;
  const Matrix<T> x = BatchRowsAsMatrix(input, config_.dim, Name(), &leading);
  const Shape shape = WithLastDim(leading, config_.dim);
  const auto dout = OutputGrad(output_grads, 0, 1, shape, Name());
  BackwardResult<T> r;
  if (!dout) return r;
  const Matrix<T> h = LinearAt(params, "0", false, x);
  const BatchNormStats<T> stats = StatsFromBuffers(buffers, "1");
  BatchNormStats<T> scratch = stats;  // the forward's update, not reported by Backward
  const Vector<T> w = ToVector(Lookup(params, "1.weight"));
  const Vector<T> b = ToVector(Lookup(params, "1.bias"));
  const BatchNormOptions opts{config_.eps, config_.momentum, config_.training};
  const BasicRefTensor<T> hn = FromMatrix<T>(h, shape);
  const Matrix<T> n = ToMatrix(BatchNormForward<T>(hn, &w, &b, &scratch, opts));
  const Matrix<T> dn = LinearAtBackward(params, "2", false, n, *dout, &r.grads);
  const BatchNormGrads<T> g =
      BatchNormBackward<T>(hn, &w, true, &stats, opts, FromMatrix<T>(dn, shape));
  AccumulateInto(&r.grads, "1.weight", FromVector<T>(g.weight, {config_.dim}));
  AccumulateInto(&r.grads, "1.bias", FromVector<T>(g.bias, {config_.dim}));
  const Matrix<T> dx = LinearAtBackward(params, "0", false, x, ToMatrix(g.input), &r.grads);
  r.input_grad = FromMatrix<T>(dx, input.features->shape);
  return r;
}

// ---- GatedNorms --------------------------------------------------------------------------------

template <typename T>
std::vector<TensorSpec> GatedNorms<T>::ParameterSpecs() const {
  const int64_t d = config_.dim;
  std::vector<TensorSpec> specs = {{"shift", {d}}, {"scale", {1, 1}}, {"gain", {1, 1}}};
  AppendSpecs(&specs, LinearSpecs("net", d, d, false));
  AppendSpecs(&specs, NormSpecs("bn", d, true));
  AppendSpecs(&specs, NormSpecs("norm", d, false));
  return specs;
}

template <typename T>
std::vector<TensorSpec> GatedNorms<T>::BufferSpecs() const {
  return BatchNormBufferSpecs("bn", config_.dim);
}

template <typename T>
TensorMap<T> GatedNorms<T>::DefaultBuffers() const {
  return BatchNormDefaultBuffers<T>("bn", config_.dim);
}

namespace {

// The activations of GatedNorms' forward (see the header), kept for its backward.
template <typename T>
struct GatedNormsActivations {
  Matrix<T> a;  // net(x)
  Matrix<T> c;  // bn(a) - shift
  Matrix<T> n;  // norm(c)
  Matrix<T> p;  // softmax(n, -1)
  T scale = 0;  // scale + gain
  Matrix<T> out;
};

template <typename T>
GatedNormsActivations<T> GatedNormsForward(const GatedNormsConfig& config,
                                           const TensorMap<T>& params, const Matrix<T>& x,
                                           BatchNormStats<T>* stats) {
  GatedNormsActivations<T> f;
  f.a = LinearAt(params, "net", false, x);
  const Vector<T> w = ToVector(Lookup(params, "bn.weight"));
  const Vector<T> b = ToVector(Lookup(params, "bn.bias"));
  const BatchNormOptions opts{config.bn_eps, config.bn_momentum, /*training=*/true};
  const Shape shape = {static_cast<int64_t>(x.rows()), config.dim};
  f.c = ToMatrix(BatchNormForward<T>(FromMatrix<T>(f.a, shape), &w, &b, stats, opts));
  f.c.rowwise() -= ToVector(Lookup(params, "shift")).transpose();
  f.n = RmsNormAt(params, "norm", f.c, config.rms_eps);
  f.p = SoftmaxRows<T>(f.n);
  f.scale = Lookup(params, "scale")[0] + Lookup(params, "gain")[0];
  f.out = f.scale * f.p.cwiseProduct(f.n);
  return f;
}

}  // namespace

template <typename T>
ForwardResult<T> GatedNorms<T>::Forward(const TensorMap<T>& params, const TensorMap<T>& buffers,
                                        const ModelInput<T>& input) const {
  CheckTensorMap(ParameterSpecs(), params, Name(), "parameter");
  CheckTensorMap(BufferSpecs(), buffers, Name(), "buffer");
  Shape leading;
  const Matrix<T> x = BatchRowsAsMatrix(input, config_.dim, Name(), &leading);
  BatchNormStats<T> stats = StatsFromBuffers(buffers, "bn");
  const GatedNormsActivations<T> f = GatedNormsForward(config_, params, x, &stats);
  ForwardResult<T> r;
  r.outputs.push_back(FromMatrix<T>(f.out, WithLastDim(leading, config_.dim)));
  r.buffers = buffers;
  StatsToBuffers(stats, "bn", &r.buffers);
  return r;
}

template <typename T>
BackwardResult<T> GatedNorms<T>::Backward(const TensorMap<T>& params, const TensorMap<T>& buffers,
                                          const ModelInput<T>& input,
                                          const OutputGrads<T>& output_grads) const {
  CheckTensorMap(ParameterSpecs(), params, Name(), "parameter");
  CheckTensorMap(BufferSpecs(), buffers, Name(), "buffer");
  Shape leading;
  const Matrix<T> x = BatchRowsAsMatrix(input, config_.dim, Name(), &leading);
  const Shape shape = WithLastDim(leading, config_.dim);
  const auto dout = OutputGrad(output_grads, 0, 1, shape, Name());
  BackwardResult<T> r;
  if (!dout) return r;
  const BatchNormStats<T> stats = StatsFromBuffers(buffers, "bn");
  BatchNormStats<T> scratch = stats;  // the forward's update, not reported by Backward
  const GatedNormsActivations<T> f = GatedNormsForward(config_, params, x, &scratch);
  // out = (scale + gain) * (p ⊙ n): d scale = d gain = Σ dout ⊙ p ⊙ n over every row and
  // column.
  const T dscale = dout->cwiseProduct(f.p.cwiseProduct(f.n)).sum();
  AccumulateInto(&r.grads, "scale", BasicRefTensor<T>({1, 1}, {dscale}));
  AccumulateInto(&r.grads, "gain", BasicRefTensor<T>({1, 1}, {dscale}));
  const Matrix<T> dq = f.scale * *dout;
  const Matrix<T> dp = dq.cwiseProduct(f.n);
  // Softmax backward: dn += p ⊙ (dp - rowsum(dp ⊙ p)).
  const Vector<T> dot = dp.cwiseProduct(f.p).rowwise().sum();
  Matrix<T> dn = dq.cwiseProduct(f.p);
  dn += f.p.cwiseProduct(dp.colwise() - dot);
  const Matrix<T> dc = RmsNormAtBackward(params, "norm", f.c, dn, &r.grads, config_.rms_eps);
  // c = bn(a) - shift: d shift = -Σ_rows dc.
  AccumulateInto(&r.grads, "shift",
                 FromVector<T>(Vector<T>(-dc.colwise().sum().transpose()), {config_.dim}));
  const Vector<T> w = ToVector(Lookup(params, "bn.weight"));
  const BatchNormOptions opts{config_.bn_eps, config_.bn_momentum, /*training=*/true};
  const BatchNormGrads<T> g = BatchNormBackward<T>(FromMatrix<T>(f.a, shape), &w, true, &stats,
                                                   opts, FromMatrix<T>(dc, shape));
  AccumulateInto(&r.grads, "bn.weight", FromVector<T>(g.weight, {config_.dim}));
  AccumulateInto(&r.grads, "bn.bias", FromVector<T>(g.bias, {config_.dim}));
  const Matrix<T> dx = LinearAtBackward(params, "net", false, x, ToMatrix(g.input), &r.grads);
  r.input_grad = FromMatrix<T>(dx, input.features->shape);
  return r;
}

// ---- OpMix -------------------------------------------------------------------------------------

template <typename T>
std::vector<TensorSpec> OpMix<T>::ParameterSpecs() const {
  if (config_.dim < 2 || config_.dim % 2 != 0) {
    throw std::invalid_argument("OpMix: dim must be even and positive, got " +
                                std::to_string(config_.dim));
  }
  std::vector<TensorSpec> specs = {{"log_temperature", {config_.dim / 2}}};
  AppendSpecs(&specs, LinearSpecs("proj", config_.dim, config_.dim, false));
  return specs;
}

namespace {

// The activations of OpMix's forward (see the header), kept for its backward.
template <typename T>
struct OpMixActivations {
  Matrix<T> h;    // proj(x)
  Vector<T> e;    // exp(log_temperature)
  Matrix<T> c;    // cat([u, v], 1)
  Vector<T> s;    // c.sum(1)
  Vector<T> l;    // log(1 + s * s)
  Matrix<T> out;  // c * l - c.mean()
};

template <typename T>
OpMixActivations<T> OpMixForward(int64_t dim, const TensorMap<T>& params, const Matrix<T>& x) {
  const int64_t k = dim / 2;
  OpMixActivations<T> f;
  f.h = LinearAt(params, "proj", false, x);
  f.e = ToVector(Lookup(params, "log_temperature")).array().exp();
  f.c.resize(f.h.rows(), dim);
  for (int64_t j = 0; j < k; ++j) f.c.col(j) = f.h.col(j) / f.e(j);
  for (int64_t j = k; j < dim; ++j) f.c.col(j) = (f.h.col(j).array().square() + T(1)).sqrt();
  f.s = f.c.rowwise().sum();
  f.l = (f.s.array().square() + T(1)).log();
  f.out = f.c.array().colwise() * f.l.array();
  f.out.array() -= f.c.mean();
  return f;
}

}  // namespace

template <typename T>
ForwardResult<T> OpMix<T>::Forward(const TensorMap<T>& params, const TensorMap<T>& buffers,
                                   const ModelInput<T>& input) const {
  CheckTensorMap(ParameterSpecs(), params, Name(), "parameter");
  Shape leading;
  const Matrix<T> x = BatchRowsAsMatrix(input, config_.dim, Name(), &leading);
  const OpMixActivations<T> f = OpMixForward(config_.dim, params, x);
  return {{FromMatrix<T>(f.out, WithLastDim(leading, config_.dim))}, buffers};
}

template <typename T>
BackwardResult<T> OpMix<T>::Backward(const TensorMap<T>& params, const TensorMap<T>& /*buffers*/,
                                     const ModelInput<T>& input,
                                     const OutputGrads<T>& output_grads) const {
  CheckTensorMap(ParameterSpecs(), params, Name(), "parameter");
  Shape leading;
  const Matrix<T> x = BatchRowsAsMatrix(input, config_.dim, Name(), &leading);
  const auto dout = OutputGrad(output_grads, 0, 1, WithLastDim(leading, config_.dim), Name());
  BackwardResult<T> r;
  if (!dout) return r;
  const int64_t dim = config_.dim, k = dim / 2;
  const OpMixActivations<T> f = OpMixForward(dim, params, x);
  const Matrix<T>& g = *dout;
  // out = c * l - mean(c): dc = g * l + ds (the same for every column of a row) - Σg / numel.
  const Vector<T> dl = g.cwiseProduct(f.c).rowwise().sum();
  const Vector<T> ds = (dl.array() * T(2) * f.s.array() / (f.s.array().square() + T(1))).matrix();
  Matrix<T> dc = g.array().colwise() * f.l.array();
  dc.colwise() += ds;
  dc.array() -= g.sum() / static_cast<T>(dc.size());
  // u = a / e: da = du / e, d log_temperature = de * e = -Σ_rows du * u.
  Matrix<T> dh(dc.rows(), dim);
  Vector<T> dt(k);
  for (int64_t j = 0; j < k; ++j) {
    dh.col(j) = dc.col(j) / f.e(j);
    dt(j) = -dc.col(j).dot(f.c.col(j));
  }
  // v = sqrt(b² + 1): db = dv * b / v.
  for (int64_t j = k; j < dim; ++j) {
    dh.col(j) = dc.col(j).cwiseProduct(f.h.col(j)).cwiseQuotient(f.c.col(j));
  }
  AccumulateInto(&r.grads, "log_temperature", FromVector<T>(dt, {k}));
  const Matrix<T> dx = LinearAtBackward(params, "proj", false, x, dh, &r.grads);
  r.input_grad = FromMatrix<T>(dx, input.features->shape);
  return r;
}

// ---- OpProducts --------------------------------------------------------------------------------

template <typename T>
std::vector<TensorSpec> OpProducts<T>::ParameterSpecs() const {
  if (config_.dim < 2 || config_.dim % 2 != 0) {
    throw std::invalid_argument("OpProducts: dim must be even and positive, got " +
                                std::to_string(config_.dim));
  }
  std::vector<TensorSpec> specs = {{"u", {config_.dim / 2}}, {"gain", {config_.dim / 2}}};
  AppendSpecs(&specs, LinearSpecs("proj", config_.dim, config_.dim, false));
  return specs;
}

namespace {

// The activations of OpProducts' forward (see the header), kept for its backward. The bmm and
// mv collapse row by row: o[n, i, j] = a[n, i] q[n, j], so y[n, i] = a[n, i] (q[n] · u).
template <typename T>
struct OpProductsActivations {
  Matrix<T> h;    // proj(x)
  Matrix<T> a;    // h[:, :k]
  Matrix<T> b;    // h[:, k:]
  Matrix<T> r;    // 1 / (b² + 1)
  Matrix<T> q;    // 1 - r
  Vector<T> t;    // q · u per row
  Matrix<T> y;    // a * t (row-wise)
  T dot = T(0);   // u · gain
  Matrix<T> n;    // layer_norm(b) (no weight, no bias)
  Matrix<T> out;  // y * gain - a * dot + a * n
};

template <typename T>
OpProductsActivations<T> OpProductsForward(int64_t dim, const TensorMap<T>& params,
                                           const Matrix<T>& x) {
  const int64_t k = dim / 2;
  const Vector<T> u = ToVector(Lookup(params, "u"));
  const Vector<T> gain = ToVector(Lookup(params, "gain"));
  OpProductsActivations<T> f;
  f.h = LinearAt(params, "proj", false, x);
  f.a = f.h.leftCols(k);
  f.b = f.h.rightCols(k);
  f.r = (f.b.array().square() + T(1)).inverse();
  f.q = (T(1) - f.r.array()).matrix();
  f.t = f.q * u;
  f.y = f.a.array().colwise() * f.t.array();
  f.dot = u.dot(gain);
  f.out = f.y.array().rowwise() * gain.transpose().array();
  f.out -= f.a * f.dot;
  f.n = LayerNormForward<T>(f.b, nullptr, nullptr);
  f.out += f.a.cwiseProduct(f.n);
  return f;
}

}  // namespace

template <typename T>
ForwardResult<T> OpProducts<T>::Forward(const TensorMap<T>& params, const TensorMap<T>& buffers,
                                        const ModelInput<T>& input) const {
  CheckTensorMap(ParameterSpecs(), params, Name(), "parameter");
  Shape leading;
  const Matrix<T> x = BatchRowsAsMatrix(input, config_.dim, Name(), &leading);
  const OpProductsActivations<T> f = OpProductsForward(config_.dim, params, x);
  return {{FromMatrix<T>(f.out, WithLastDim(leading, config_.dim / 2))}, buffers};
}

template <typename T>
BackwardResult<T> OpProducts<T>::Backward(const TensorMap<T>& params,
                                          const TensorMap<T>& /*buffers*/,
                                          const ModelInput<T>& input,
                                          const OutputGrads<T>& output_grads) const {
  CheckTensorMap(ParameterSpecs(), params, Name(), "parameter");
  Shape leading;
  const Matrix<T> x = BatchRowsAsMatrix(input, config_.dim, Name(), &leading);
  const int64_t dim = config_.dim, k = dim / 2;
  const auto dout = OutputGrad(output_grads, 0, 1, WithLastDim(leading, k), Name());
  BackwardResult<T> r;
  if (!dout) return r;
  const OpProductsActivations<T> f = OpProductsForward(dim, params, x);
  const Vector<T> u = ToVector(Lookup(params, "u"));
  const Vector<T> gain = ToVector(Lookup(params, "gain"));
  const Matrix<T>& g = *dout;
  // out = y * gain - a * dot + a * n: d gain = Σ_rows g * y + d dot * u, dy = g * gain,
  // d dot = -Σ g * a (to u as d dot * gain, to gain as d dot * u).
  const T ddot = -(g.cwiseProduct(f.a)).sum();
  const Vector<T> dgain = (g.cwiseProduct(f.y)).colwise().sum().transpose() + ddot * u;
  const Matrix<T> dy = g.array().rowwise() * gain.transpose().array();
  // y = a * t: da = dy * t - g * dot, dt = Σ_cols dy * a; t = q u: du = qᵀ dt, dq = dt uᵀ.
  Matrix<T> da = dy.array().colwise() * f.t.array();
  da -= g * f.dot;
  da += g.cwiseProduct(f.n);
  const Vector<T> dt = dy.cwiseProduct(f.a).rowwise().sum();
  const Vector<T> du = f.q.transpose() * dt + ddot * gain;
  const Matrix<T> dq = dt * u.transpose();
  // q = 1 - 1 / (b² + 1): dq/db = 2 b r².
  // + a * layer_norm(b): db gets layer_norm's input gradient of g * a.
  const Matrix<T> db = dq.cwiseProduct(f.b).cwiseProduct(f.r).cwiseProduct(f.r) * T(2) +
                       LayerNormBackward<T>(f.b, nullptr, false, g.cwiseProduct(f.a)).input;
  Matrix<T> dh(g.rows(), dim);
  dh.leftCols(k) = da;
  dh.rightCols(k) = db;
  AccumulateInto(&r.grads, "u", FromVector<T>(du, {k}));
  AccumulateInto(&r.grads, "gain", FromVector<T>(dgain, {k}));
  const Matrix<T> dx = LinearAtBackward(params, "proj", false, x, dh, &r.grads);
  r.input_grad = FromMatrix<T>(dx, input.features->shape);
  return r;
}

// ---- PaddedLm ----------------------------------------------------------------------------------

template <typename T>
PaddedLm<T>::PaddedLm(const PaddedLmConfig& config) : config_(config) {
  const PaddedLmConfig& c = config_;
  if (c.vocab_size < 1 || c.dim < 1 || c.n_heads < 1 || c.dim % c.n_heads != 0 || c.seq_len < 2 ||
      c.padding_idx < 0 || c.padding_idx >= c.vocab_size) {
    throw std::invalid_argument(
        "PaddedLM: need vocab_size, dim, n_heads >= 1 with n_heads dividing dim, seq_len >= 2 "
        "and padding_idx in [0, vocab_size); got vocab_size " +
        std::to_string(c.vocab_size) + ", dim " + std::to_string(c.dim) + ", n_heads " +
        std::to_string(c.n_heads) + ", seq_len " + std::to_string(c.seq_len) + ", padding_idx " +
        std::to_string(c.padding_idx));
  }
}

template <typename T>
std::vector<TensorSpec> PaddedLm<T>::ParameterSpecs() const {
  const PaddedLmConfig& c = config_;
  std::vector<TensorSpec> specs = {{"attn_bias", {c.seq_len, c.seq_len}},
                                   {"tok_embeddings.weight", {c.vocab_size, c.dim}}};
  AppendSpecs(&specs, LinearSpecs("qkv", c.dim, 3 * c.dim, false));
  AppendSpecs(&specs, LinearSpecs("output", c.dim, c.vocab_size, true));
  return specs;
}

namespace {

// The activations of PaddedLm's forward, rows batch-first (row n * L + s), kept for its
// backward. Head j of sequence n reads columns [j * hd, (j + 1) * hd) of rows n * L .. + L - 1.
template <typename T>
struct PaddedLmActivations {
  int64_t n = 0;                 // sequences
  std::vector<int64_t> ids;      // tokens, row-major
  Matrix<T> h;                   // tok_embeddings(tokens) [N * L, D]
  Matrix<T> qkv;                 // qkv(h) [N * L, 3D]
  std::vector<Matrix<T>> probs;  // softmax(q kᵀ · scale + attn_bias) per (n, head) [L, L]
  Matrix<T> a;                   // attention output, heads merged [N * L, D]
  Matrix<T> r;                   // h + a
  Matrix<T> logits;              // output(r) [N * L, V]
  Matrix<T> pred;                // logits of positions 0 .. L - 2 [N * (L - 1), V]
  std::vector<int64_t> targets;  // tokens of positions 1 .. L - 1
};

template <typename T>
PaddedLmActivations<T> PaddedLmForward(const PaddedLmConfig& c, const TensorMap<T>& params,
                                       const ModelInput<T>& input, const std::string& name) {
  if (!input.tokens || input.tokens->shape.size() != 2 || input.tokens->shape[1] != c.seq_len) {
    throw std::invalid_argument(name + ": expected tokens [N, " + std::to_string(c.seq_len) + "]");
  }
  const int64_t len = c.seq_len, d = c.dim, hd = c.dim / c.n_heads;
  const double scale = 1.0 / static_cast<double>(hd);
  PaddedLmActivations<T> f;
  f.n = input.tokens->shape[0];
  f.ids = input.tokens->data;
  f.h = EmbeddingForward<T>(ToMatrix(Lookup(params, "tok_embeddings.weight")), f.ids);
  f.qkv = LinearAt(params, "qkv", false, f.h);
  const Matrix<T> bias = ToMatrix(Lookup(params, "attn_bias"));
  f.a = Matrix<T>::Zero(f.n * len, d);
  for (int64_t b = 0; b < f.n; ++b) {
    for (int64_t j = 0; j < c.n_heads; ++j) {
      const Matrix<T> q = f.qkv.block(b * len, j * hd, len, hd);
      const Matrix<T> k = f.qkv.block(b * len, d + j * hd, len, hd);
      const Matrix<T> v = f.qkv.block(b * len, 2 * d + j * hd, len, hd);
      const Matrix<T> scores = (q * k.transpose()) * T(scale) + bias;
      f.probs.push_back(SoftmaxRows<T>(scores));
      f.a.block(b * len, j * hd, len, hd) = f.probs.back() * v;
    }
  }
  f.r = f.h + f.a;
  f.logits = LinearAt(params, "output", true, f.r);
  f.pred.resize(f.n * (len - 1), c.vocab_size);
  for (int64_t b = 0; b < f.n; ++b) {
    for (int64_t s = 0; s + 1 < len; ++s) {
      f.pred.row(b * (len - 1) + s) = f.logits.row(b * len + s);
      f.targets.push_back(f.ids[static_cast<size_t>(b * len + s + 1)]);
    }
  }
  return f;
}

}  // namespace

template <typename T>
ForwardResult<T> PaddedLm<T>::Forward(const TensorMap<T>& params, const TensorMap<T>& buffers,
                                      const ModelInput<T>& input) const {
  CheckTensorMap(ParameterSpecs(), params, Name(), "parameter");
  const PaddedLmActivations<T> f = PaddedLmForward(config_, params, input, Name());
  const T loss = CrossEntropy<T>(f.pred, f.targets, Reduction::kMean, config_.padding_idx).loss;
  return {{BasicRefTensor<T>(Shape{1}, std::vector<T>{loss})}, buffers};
}

template <typename T>
BackwardResult<T> PaddedLm<T>::Backward(const TensorMap<T>& params, const TensorMap<T>& /*buffers*/,
                                        const ModelInput<T>& input,
                                        const OutputGrads<T>& output_grads) const {
  CheckTensorMap(ParameterSpecs(), params, Name(), "parameter");
  BackwardResult<T> r;
  const auto dout = OutputGrad(output_grads, 0, 1, Shape{1}, Name());
  if (!dout) return r;
  const PaddedLmConfig& c = config_;
  const int64_t len = c.seq_len, d = c.dim, hd = c.dim / c.n_heads;
  const double scale = 1.0 / static_cast<double>(hd);
  const PaddedLmActivations<T> f = PaddedLmForward(c, params, input, Name());
  // cross_entropy(mean, ignore_index): its logits gradient, scaled by the loss's gradient, on the
  // rows of positions 0 .. L - 2 (the last position's logits are not read).
  const Matrix<T> dpred =
      CrossEntropy<T>(f.pred, f.targets, Reduction::kMean, c.padding_idx).grad_logits *
      (*dout)(0, 0);
  Matrix<T> dlogits = Matrix<T>::Zero(f.n * len, c.vocab_size);
  for (int64_t b = 0; b < f.n; ++b) {
    for (int64_t s = 0; s + 1 < len; ++s) {
      dlogits.row(b * len + s) = dpred.row(b * (len - 1) + s);
    }
  }
  // logits = output(h + a): the residual hands dr to both h and a.
  const Matrix<T> dr = LinearAtBackward(params, "output", true, f.r, dlogits, &r.grads);
  Matrix<T> dqkv = Matrix<T>::Zero(f.n * len, 3 * d);
  Matrix<T> dbias = Matrix<T>::Zero(len, len);
  for (int64_t b = 0; b < f.n; ++b) {
    for (int64_t j = 0; j < c.n_heads; ++j) {
      const Matrix<T> q = f.qkv.block(b * len, j * hd, len, hd);
      const Matrix<T> k = f.qkv.block(b * len, d + j * hd, len, hd);
      const Matrix<T> v = f.qkv.block(b * len, 2 * d + j * hd, len, hd);
      const Matrix<T>& p = f.probs[static_cast<size_t>(b * c.n_heads + j)];
      const Matrix<T> dout_h = dr.block(b * len, j * hd, len, hd);
      // O = P V; S = q kᵀ · scale + attn_bias, P = softmax(S) row-wise:
      // dS = P ∘ (dP - Σ_k P dP), dq = dS k · scale, dk = dSᵀ q · scale, d attn_bias += dS.
      const Matrix<T> dp = dout_h * v.transpose();
      const Vector<T> row_dot = p.cwiseProduct(dp).rowwise().sum();
      const Matrix<T> ds = p.cwiseProduct(dp - row_dot.replicate(1, len));
      dqkv.block(b * len, j * hd, len, hd) = (ds * k) * T(scale);
      dqkv.block(b * len, d + j * hd, len, hd) = (ds.transpose() * q) * T(scale);
      dqkv.block(b * len, 2 * d + j * hd, len, hd) = p.transpose() * dout_h;
      dbias += ds;
    }
  }
  const Matrix<T> dh = dr + LinearAtBackward(params, "qkv", false, f.h, dqkv, &r.grads);
  // padding_idx: the padding row gets no gradient, however often it is looked up.
  Matrix<T> dtable = EmbeddingBackward<T>(c.vocab_size, f.ids, dh);
  dtable.row(c.padding_idx).setZero();
  AccumulateInto(&r.grads, "attn_bias", FromMatrix<T>(dbias, {len, len}));
  AccumulateInto(&r.grads, "tok_embeddings.weight", FromMatrix<T>(dtable, {c.vocab_size, d}));
  return r;
}

template class LinearChain<float>;
template class LinearChain<double>;
template class Mlp<float>;
template class Mlp<double>;
template class MlpStack<float>;
template class MlpStack<double>;
template class DoubleLinear<float>;
template class DoubleLinear<double>;
template class MlpWithRmsNorm<float>;
template class MlpWithRmsNorm<double>;
template class StateDictModel<float>;
template class StateDictModel<double>;
template class SharedSubmoduleModel<float>;
template class SharedSubmoduleModel<double>;
template class LinearBatchNormLinear<float>;
template class LinearBatchNormLinear<double>;
template class GatedNorms<float>;
template class GatedNorms<double>;
template class OpMix<float>;
template class OpMix<double>;
template class OpProducts<float>;
template class OpProducts<double>;
template class PaddedLm<float>;
template class PaddedLm<double>;

}  // namespace fsdp::reference
