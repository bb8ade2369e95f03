// The small test models of PyTorch's FSDP/TP tests, re-implemented for the oracle with exact
// FQNs, shapes and forwards (docs/modules.md, "[Note: seed model shapes]"; seeds 000-004). The
// Transformer of
// ModelArgs lives in transformer.h; nn.Transformer-based TransformerWithSharedParams in
// transformer_with_shared_params.h.
//
// Every model reads input.features (any leading dims, last dim = the model's input width) and
// returns outputs with the same leading dims. Each class documents its PyTorch original, its
// parameters in registration order, and its forward.
//
// Thread-safety: immutable after construction (see Model). Ownership: configs are copied in.
#pragma once

#include <string>
#include <vector>

#include "reference/model.h"

namespace fsdp::reference {

// ---- LinearChain and the plain Linear stacks built from it -------------------------------------

// One nn.Linear in a chain, optionally followed by ReLU.
struct LinearStage {
  std::string name;          // module FQN, e.g. "net1" or "module.1.0" ("" for a bare Linear)
  int64_t in_features = 0;   // Default: 0 (must be set).
  int64_t out_features = 0;  // Default: 0 (must be set).
  bool bias = true;          // Default: true (nn.Linear's default).
  bool relu_after = false;   // Default: false.
};

struct LinearChainConfig {
  std::string model_name = "LinearChain";  // Default: "LinearChain"; reported by Name().
  std::vector<LinearStage> stages;         // Default: empty (must be set), applied in order.
};

// A sequence of Linear (+ReLU) stages: covers nn.Sequential(nn.Linear, ...) stacks, FSDP1's
// NestedWrappedModule, and the models below. One output. Holds only its config; immutable, so
// const calls may run concurrently.
template <typename T>
class LinearChain : public Model<T> {
 public:
  explicit LinearChain(LinearChainConfig config);

  std::string Name() const override { return config_.model_name; }
  std::vector<TensorSpec> ParameterSpecs() const override;
  ForwardResult<T> Forward(const TensorMap<T>& params, const TensorMap<T>& buffers,
                           const ModelInput<T>& input) const override;
  BackwardResult<T> Backward(
      const TensorMap<T>& params, const TensorMap<T>& buffers, const ModelInput<T>& input,
      const std::vector<std::optional<BasicRefTensor<T>>>& output_grads) const override;

 private:
  LinearChainConfig config_;
};

// common_dtensor.py MLPModule(device, bias=True): net1 = Linear(10, 16), ReLU, net2 =
// Linear(16, 10); forward net2(relu(net1(x))). Parameters: net1.weight [16,10], net1.bias [16],
// net2.weight [10,16], net2.bias [10] (no biases when bias=False).
struct MlpModuleConfig {
  bool bias = true;  // Default: true.
};
LinearChainConfig MlpModuleChain(const MlpModuleConfig& config = {},
                                 const std::string& prefix = "");
// The model described above. Holds only its config; immutable, so const calls may run
// concurrently (see Model).
template <typename T>
class MlpModule : public LinearChain<T> {
 public:
  explicit MlpModule(const MlpModuleConfig& config = {}) : LinearChain<T>(MlpModuleChain(config)) {}
};

// common_dtensor.py MLPStacked(device, n_layers=2): layers = ModuleList of MLPModule applied in
// sequence. Parameters layers.<i>.net1.weight, ...
struct MlpStackedConfig {
  int n_layers = 2;  // Default: 2.
};
LinearChainConfig MlpStackedChain(const MlpStackedConfig& config = {});
// The model described above. Holds only its config; immutable, so const calls may run
// concurrently (see Model).
template <typename T>
class MlpStacked : public LinearChain<T> {
 public:
  explicit MlpStacked(const MlpStackedConfig& config = {})
      : LinearChain<T>(MlpStackedChain(config)) {}
};

// test_fsdp_tp_integration.py SimpleModel: net1 = Linear(5, 8), ReLU, net2 = Linear(8, 4),
// net3 = Linear(4, 12); forward net3(net2(relu(net1(x)))) (no ReLU after net2).
LinearChainConfig TpSimpleModelChain();
// The model described above. Holds only its config; immutable, so const calls may run
// concurrently (see Model).
template <typename T>
class TpSimpleModel : public LinearChain<T> {
 public:
  TpSimpleModel() : LinearChain<T>(TpSimpleModelChain()) {}
};

// common_fsdp.py NestedWrappedModule (unwrapped): module = Sequential(Linear(8, 4),
// Sequential(Linear(4, 16), Linear(16, 16)), Linear(16, 4), Linear(4, 8)), no activations.
// Parameters module.0.*, module.1.0.*, module.1.1.*, module.2.*, module.3.*.
LinearChainConfig NestedWrappedModuleChain();
// The model described above. Holds only its config; immutable, so const calls may run
// concurrently (see Model).
template <typename T>
class NestedWrappedModule : public LinearChain<T> {
 public:
  NestedWrappedModule() : LinearChain<T>(NestedWrappedModuleChain()) {}
};

// ---- common_fsdp.py MLP and MLPStack -----------------------------------------------------------

// MLP(dim, *, bias=True, with_buffer=False, dim_multiplier=4): in_proj = Linear(dim, m*dim),
// out_proj = Linear(m*dim, dim); forward relu(out_proj(relu(in_proj(x)))) (+ buffer).
// Parameters in_proj.weight [m*dim, dim], in_proj.bias, out_proj.weight [dim, m*dim],
// out_proj.bias. Buffer (with_buffer) "buffer" [dim], randn in PyTorch: supply it.
struct MlpConfig {
  int64_t dim = 8;             // Default: 8 (PyTorch requires it; the FSDP tests use 8 or 16).
  bool bias = true;            // Default: true.
  bool with_buffer = false;    // Default: false.
  int64_t dim_multiplier = 4;  // Default: 4.
};
// The model described above. Holds only its config; immutable, so const calls may run
// concurrently (see Model).
template <typename T>
class Mlp : public Model<T> {
 public:
  explicit Mlp(const MlpConfig& config = {}) : config_(config) {}

  std::string Name() const override { return "MLP"; }
  std::vector<TensorSpec> ParameterSpecs() const override;
  std::vector<TensorSpec> BufferSpecs() const override;
  ForwardResult<T> Forward(const TensorMap<T>& params, const TensorMap<T>& buffers,
                           const ModelInput<T>& input) const override;
  BackwardResult<T> Backward(
      const TensorMap<T>& params, const TensorMap<T>& buffers, const ModelInput<T>& input,
      const std::vector<std::optional<BasicRefTensor<T>>>& output_grads) const override;

 private:
  MlpConfig config_;
};

// MLPStack(mlp_dim, *, with_seq_parallel=False): Sequential(MLP(d, dim_multiplier=3), MLP(d),
// MLP(d, dim_multiplier=3)) (+ LayerNorm(d, bias=False) as module "3" with sequence parallel).
// Parameters 0.in_proj.weight [3d, d], 0.in_proj.bias, 0.out_proj.weight [d, 3d], ..., 1.* (4d),
// 2.* (3d), [3.weight [d]].
struct MlpStackConfig {
  int64_t mlp_dim = 8;             // Default: 8.
  bool with_seq_parallel = false;  // Default: false.
};
// The model described above. Holds only its config; immutable, so const calls may run
// concurrently (see Model).
template <typename T>
class MlpStack : public Model<T> {
 public:
  explicit MlpStack(const MlpStackConfig& config = {}) : config_(config) {}

  std::string Name() const override { return "MLPStack"; }
  std::vector<TensorSpec> ParameterSpecs() const override;
  ForwardResult<T> Forward(const TensorMap<T>& params, const TensorMap<T>& buffers,
                           const ModelInput<T>& input) const override;
  BackwardResult<T> Backward(
      const TensorMap<T>& params, const TensorMap<T>& buffers, const ModelInput<T>& input,
      const std::vector<std::optional<BasicRefTensor<T>>>& output_grads) const override;

 private:
  MlpStackConfig config_;
};

// ---- DoubleLinear ------------------------------------------------------------------------------

// common_fsdp.py DoubleLinear(dim, use_second_linear=True): lin1, lin2 = Linear(dim, dim);
// forward returns (relu(lin1(x)), relu(lin2(x))), or only relu(lin1(x)) when
// use_second_linear=False (lin2 then never gets a gradient). With `preceded_by_linear` the model
// is test_fully_shard_comm.py's nn.Sequential(nn.Linear(dim, dim), DoubleLinear(dim)): parameters
// 0.weight, 0.bias, 1.lin1.*, 1.lin2.*, and both branches read the output of module 0.
struct DoubleLinearConfig {
  int64_t dim = 8;                  // Default: 8.
  bool use_second_linear = true;    // Default: true.
  bool preceded_by_linear = false;  // Default: false.
};
// The model described above. Holds only its config; immutable, so const calls may run
// concurrently (see Model).
template <typename T>
class DoubleLinear : public Model<T> {
 public:
  explicit DoubleLinear(const DoubleLinearConfig& config = {}) : config_(config) {}

  std::string Name() const override {
    return config_.preceded_by_linear ? "Sequential(Linear, DoubleLinear)" : "DoubleLinear";
  }
  std::vector<TensorSpec> ParameterSpecs() const override;
  int NumOutputs() const override { return config_.use_second_linear ? 2 : 1; }
  ForwardResult<T> Forward(const TensorMap<T>& params, const TensorMap<T>& buffers,
                           const ModelInput<T>& input) const override;
  BackwardResult<T> Backward(
      const TensorMap<T>& params, const TensorMap<T>& buffers, const ModelInput<T>& input,
      const std::vector<std::optional<BasicRefTensor<T>>>& output_grads) const override;

 private:
  std::string Lin(const char* name) const;
  DoubleLinearConfig config_;
};

// ---- MLPModule + RMSNormPython (test_fsdp_tp_integration.py TestModel) -------------------------

// mlp = MLPModule, mlp_norm = RMSNormPython(10); forward mlp(mlp_norm(x)), or mlp_norm(mlp(x))
// with `norm_last` (the norm's input gradient then flows into the MLP). Parameters
// mlp.net1.weight [16,10], mlp.net1.bias, mlp.net2.weight [10,16], mlp.net2.bias,
// mlp_norm.weight [10].
struct MlpWithRmsNormConfig {
  bool mlp_bias = true;    // Default: true.
  double eps = 1e-6;       // Default: 1e-6 (RMSNormPython's).
  bool norm_last = false;  // Default: false (the test's mlp(mlp_norm(x))); true: mlp_norm(mlp(x)).
};
// The model described above. Holds only its config; immutable, so const calls may run
// concurrently (see Model).
template <typename T>
class MlpWithRmsNorm : public Model<T> {
 public:
  explicit MlpWithRmsNorm(const MlpWithRmsNormConfig& config = {}) : config_(config) {}

  std::string Name() const override { return "TestModel(MLPModule, RMSNormPython)"; }
  std::vector<TensorSpec> ParameterSpecs() const override;
  ForwardResult<T> Forward(const TensorMap<T>& params, const TensorMap<T>& buffers,
                           const ModelInput<T>& input) const override;
  BackwardResult<T> Backward(
      const TensorMap<T>& params, const TensorMap<T>& buffers, const ModelInput<T>& input,
      const std::vector<std::optional<BasicRefTensor<T>>>& output_grads) const override;

 private:
  MlpWithRmsNormConfig config_;
};

// ---- test_fsdp_state_dict.py models ------------------------------------------------------------

// Model(wrap_fsdp, register_buffers=False): inner = Linear(4, 4), outer = Linear(4, 5); forward
// outer(inner(x) + inner(x)) (inner runs twice). Parameters inner.weight [4,4], inner.bias [4],
// outer.weight [5,4], outer.bias [5]. With register_buffers: inner.buffer [5,5],
// inner.non_persistent_buffer [5,5] (persistent=False), outer.buffer, outer.non_persistent_buffer
// (randn in PyTorch; the forward does not read them).
struct StateDictModelConfig {
  bool register_buffers = false;  // Default: false.
};
// The model described above. Holds only its config; immutable, so const calls may run
// concurrently (see Model).
template <typename T>
class StateDictModel : public Model<T> {
 public:
  explicit StateDictModel(const StateDictModelConfig& config = {}) : config_(config) {}

  std::string Name() const override { return "Model"; }
  std::vector<TensorSpec> ParameterSpecs() const override;
  std::vector<TensorSpec> BufferSpecs() const override;
  ForwardResult<T> Forward(const TensorMap<T>& params, const TensorMap<T>& buffers,
                           const ModelInput<T>& input) const override;
  BackwardResult<T> Backward(
      const TensorMap<T>& params, const TensorMap<T>& buffers, const ModelInput<T>& input,
      const std::vector<std::optional<BasicRefTensor<T>>>& output_grads) const override;

 private:
  StateDictModelConfig config_;
};

// TestDummyModel: net1 = Sequential(Linear(8, 16), ReLU), net2 = Sequential(Linear(16, 16),
// ReLU), net3 = net2 (shared), random_parameter [10] with shared_parameter the same object;
// forward net3(net2(net1(x))). Parameters net1.0.weight [16,8], net1.0.bias [16],
// net2.0.weight [16,16], net2.0.bias [16], random_parameter [10] (never used: no gradient).
// Stateless; const calls may run concurrently.
template <typename T>
class SharedSubmoduleModel : public Model<T> {
 public:
  std::string Name() const override { return "TestDummyModel"; }
  std::vector<TensorSpec> ParameterSpecs() const override;
  ForwardResult<T> Forward(const TensorMap<T>& params, const TensorMap<T>& buffers,
                           const ModelInput<T>& input) const override;
  BackwardResult<T> Backward(
      const TensorMap<T>& params, const TensorMap<T>& buffers, const ModelInput<T>& input,
      const std::vector<std::optional<BasicRefTensor<T>>>& output_grads) const override;
};

// _get_multibuffer_nested_model (unwrapped): Sequential(Linear(d, d, bias=False),
// BatchNorm1d(d), Linear(d, d, bias=False)), d = 10. Parameters 0.weight, 1.weight, 1.bias,
// 2.weight; buffers 1.running_mean, 1.running_var, 1.num_batches_tracked (a 0-d tensor holding
// the count). In training the forward returns updated buffers.
struct LinearBatchNormLinearConfig {
  int64_t dim = 10;       // Default: 10.
  bool training = true;   // Default: true (module.train()).
  double eps = 1e-5;      // Default: 1e-5.
  double momentum = 0.1;  // Default: 0.1.
};
// The model described above. Holds only its config; immutable, so const calls may run
// concurrently (see Model).
template <typename T>
class LinearBatchNormLinear : public Model<T> {
 public:
  explicit LinearBatchNormLinear(const LinearBatchNormLinearConfig& config = {})
      : config_(config) {}

  std::string Name() const override { return "Sequential(Linear, BatchNorm1d, Linear)"; }
  std::vector<TensorSpec> ParameterSpecs() const override;
  std::vector<TensorSpec> BufferSpecs() const override;
  TensorMap<T> DefaultBuffers() const override;
  ForwardResult<T> Forward(const TensorMap<T>& params, const TensorMap<T>& buffers,
                           const ModelInput<T>& input) const override;
  BackwardResult<T> Backward(
      const TensorMap<T>& params, const TensorMap<T>& buffers, const ModelInput<T>& input,
      const std::vector<std::optional<BasicRefTensor<T>>>& output_grads) const override;

 private:
  LinearBatchNormLinearConfig config_;
};

// ---- GatedNorms (the suite's own op-coverage model)
// ----------------------------------------------

// Not a seed model: it runs, in one small forward, the ops and modes no seed model
// differentiates. Forward, x [N, dim]:
//   c = bn(net(x)) - shift        net = Linear(dim, dim, bias=False); bn = BatchNorm1d(dim) in
//                                 training mode (batch statistics; running stats updated with
//                                 the unbiased batch variance, momentum 0.1); `shift` [dim] a
//                                 parameter subtracted (the subtrahend requires grad)
//   n = norm(c)                   nn.RMSNorm(dim) with eps=None: finfo(dtype).eps
//   out = (scale + gain) * softmax(n, -1) * n
//                                 `scale` and `gain` [1, 1] parameters: their sum is broadcast
//                                 along both dims, so its gradient sums over rows and columns at
//                                 once, and the sum's backward hands both leaves one gradient
//                                 tensor (AccumulateGrad must not let them share it)
// Parameters (named_parameters order, the root's own first): shift [dim], scale [1, 1],
// gain [1, 1], net.weight [dim, dim], bn.weight, bn.bias, norm.weight; buffers bn.running_mean,
// bn.running_var, bn.num_batches_tracked. The forward returns the updated buffers.
struct GatedNormsConfig {
  int64_t dim = 8;                         // Default: 8.
  double rms_eps = 2.220446049250313e-16;  // Default: finfo(float64).eps (nn.RMSNorm's
                                           // eps=None for float64 inputs; float32: 2^-23).
  double bn_eps = 1e-5;                    // Default: 1e-5 (BatchNorm1d's).
  double bn_momentum = 0.1;                // Default: 0.1 (BatchNorm1d's).
};
// The model described above. Holds only its config; immutable, so const calls may run
// concurrently (see Model).
template <typename T>
class GatedNorms : public Model<T> {
 public:
  explicit GatedNorms(const GatedNormsConfig& config = {}) : config_(config) {}

  std::string Name() const override { return "GatedNorms"; }
  std::vector<TensorSpec> ParameterSpecs() const override;
  std::vector<TensorSpec> BufferSpecs() const override;
  TensorMap<T> DefaultBuffers() const override;
  ForwardResult<T> Forward(const TensorMap<T>& params, const TensorMap<T>& buffers,
                           const ModelInput<T>& input) const override;
  BackwardResult<T> Backward(
      const TensorMap<T>& params, const TensorMap<T>& buffers, const ModelInput<T>& input,
      const std::vector<std::optional<BasicRefTensor<T>>>& output_grads) const override;

 private:
  GatedNormsConfig config_;
};

// ---- OpMix (the suite's own op-coverage model)
// ---------------------------------------------------

// Not a seed model: elementwise and reduction ops no other zoo model differentiates. With
// h = proj(x) (Linear(dim, dim, bias=False), x [N, dim], dim even, k = dim / 2):
//   u = h[:, :k] / exp(log_temperature)    division with both operands requiring grad, exp
//   v = sqrt(h[:, k:] * h[:, k:] + 1)       slices, sqrt
//   c = cat([u, v], 1)
//   out = c * log(1 + s * s) - c.mean()     s = c.sum(1).unsqueeze(1); log, sum over a dim,
//                                           the mean of every element
// Parameters (named_parameters order): log_temperature [k], proj.weight [dim, dim].
struct OpMixConfig {
  int64_t dim = 6;  // Default: 6 (must be even).
};
// The model described above. Holds only its config; immutable, so const calls may run
// concurrently (see Model).
template <typename T>
class OpMix : public Model<T> {
 public:
  explicit OpMix(const OpMixConfig& config = {}) : config_(config) {}

  std::string Name() const override { return "OpMix"; }
  std::vector<TensorSpec> ParameterSpecs() const override;
  ForwardResult<T> Forward(const TensorMap<T>& params, const TensorMap<T>& buffers,
                           const ModelInput<T>& input) const override;
  BackwardResult<T> Backward(
      const TensorMap<T>& params, const TensorMap<T>& buffers, const ModelInput<T>& input,
      const std::vector<std::optional<BasicRefTensor<T>>>& output_grads) const override;

 private:
  OpMixConfig config_;
};

// ---- OpProducts (the suite's own op-coverage model)
// ----------------------------------------------

// Not a seed model: products and unary ops no other zoo model differentiates. With
// h = proj(x) (Linear(dim, dim, bias=False), x [N, dim], dim even, k = dim / 2):
//   a, b = h.split(k, 1)                     split (one node, two outputs)
//   q = 1 - reciprocal(b * b + 1)            reciprocal, rsub
//   o = bmm(a.unsqueeze(2), q.unsqueeze(1))  [N, k, k] batched outer products, bmm
//   y = mv(o.reshape(N * k, k), u).view(N, k)                         mv
//   out = y * gain.expand(N, k).clone() + (-a) * dot(u, gain)   expand, clone, neg, dot
//         + a * layer_norm(b, (k,))         LayerNorm without elementwise affine (eps 1e-5)
// Every product has both operands requiring grad, so a swapped or transposed operand in a
// backward formula changes the gradients. Parameters (named_parameters order): u [k],
// gain [k], proj.weight [dim, dim].
struct OpProductsConfig {
  int64_t dim = 6;  // Default: 6 (must be even).
};
// The model described above. Holds only its config; immutable, so const calls may run
// concurrently (see Model).
template <typename T>
class OpProducts : public Model<T> {
 public:
  explicit OpProducts(const OpProductsConfig& config = {}) : config_(config) {}

  std::string Name() const override { return "OpProducts"; }
  std::vector<TensorSpec> ParameterSpecs() const override;
  ForwardResult<T> Forward(const TensorMap<T>& params, const TensorMap<T>& buffers,
                           const ModelInput<T>& input) const override;
  BackwardResult<T> Backward(
      const TensorMap<T>& params, const TensorMap<T>& buffers, const ModelInput<T>& input,
      const std::vector<std::optional<BasicRefTensor<T>>>& output_grads) const override;

 private:
  OpProductsConfig config_;
};

// ---- PaddedLm (the suite's own op-coverage model)
// ----------------------------------------------

// Not a seed model: a one-layer language model on token ids with padding, reaching what no seed
// model does: nn.Embedding(padding_idx=...) (the padding row is looked up in forward and gets no
// gradient), scaled_dot_product_attention with an additive float attn_mask that is itself a
// parameter (its gradient: the score gradient summed over batch and heads) and an explicit
// scale, and F.cross_entropy with the default reduction "mean" and an ignore_index (the mean
// divides by the targets not ignored). With tokens [N, L] (every id in [0, vocab_size)):
//   h = tok_embeddings(tokens)                          [N, L, D], padding_idx = padding_idx
//   q, k, v = qkv(h).split(D, -1)                       Linear(D, 3D, bias=False)
//   each viewed [N, L, H, D / H] and transposed to [N, H, L, D / H]
//   a = sdpa(q, k, v, attn_mask=attn_bias, scale=1 / (D / H))     attn_bias [L, L]
//   logits = output(h + a.transpose(1, 2).reshape(N, L, D))       Linear(D, vocab_size)
//   loss = cross_entropy(logits[:, :-1].reshape(-1, V), tokens[:, 1:].reshape(-1),
//                        ignore_index=padding_idx).reshape(1)
// The output is the loss as a [1] tensor. Parameters (named_parameters order): attn_bias [L, L]
// (the root's own), tok_embeddings.weight [V, D], qkv.weight [3D, D], output.weight [V, D],
// output.bias [V].
struct PaddedLmConfig {
  int64_t vocab_size = 5;   // Default: 5.
  int64_t dim = 8;          // Default: 8 (a multiple of n_heads).
  int64_t n_heads = 2;      // Default: 2.
  int64_t seq_len = 6;      // Default: 6 (the input's length; at least 2).
  int64_t padding_idx = 0;  // Default: 0 (in [0, vocab_size)).
};
// The model described above. Holds only its config; immutable, so const calls may run
// concurrently (see Model).
template <typename T>
class PaddedLm : public Model<T> {
 public:
  explicit PaddedLm(const PaddedLmConfig& config = {});

  std::string Name() const override { return "PaddedLM"; }
  std::vector<TensorSpec> ParameterSpecs() const override;
  ForwardResult<T> Forward(const TensorMap<T>& params, const TensorMap<T>& buffers,
                           const ModelInput<T>& input) const override;
  BackwardResult<T> Backward(
      const TensorMap<T>& params, const TensorMap<T>& buffers, const ModelInput<T>& input,
      const std::vector<std::optional<BasicRefTensor<T>>>& output_grads) const override;

 private:
  PaddedLmConfig config_;
};

}  // namespace fsdp::reference
