// The test models of PyTorch's FSDP tests, with the seeds' exact registration order, FQNs,
// shapes and forwards (docs/modules.md, "[Note: seed model shapes]"; seeds 001 and 003):
//   common_fsdp.py:    MLP, MLPStack, DoubleLinear
//   common_dtensor.py: ModelArgs, Attention, FeedForward, TransformerBlock, Transformer,
//                      MLPModule, MLPStacked, RMSNormPython
//                      TransformerWithSharedParams (FSDP1 tests, seeds 001 and 004)
//   seed 003:          SimpleModel (TP integration)
//   seed 001:          StateDictModel (`Model`: inner 4→4, outer 4→5, optional buffers),
//                      TestDummyModel (shared submodule and shared parameter),
//                      MakeSimpleNestedModel / MakeMultibufferNestedModel (the unwrapped
//                      `_get_simple_nested_model` / `_get_multibuffer_nested_model`).
// Parameters are initialised from the calling rank's generator in PyTorch's construction
// order; to give two implementations identical bytes, load the same state dict into both
// (Module::load_state_dict).
//
// Ownership: as Module (configuration members only). Thread-safety: as Module.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/nn/layers.h"
#include "engine/nn/module.h"
#include "engine/nn/transformer_layers.h"

namespace fsdp::nn {

// ---- common_fsdp.py ----------------------------------------------------------------------------

// in_proj = Linear(dim, m*dim), out_proj = Linear(m*dim, dim); forward
// relu(out_proj(relu(in_proj(x)))) (+ buffer). with_buffer registers buffer = randn(dim).
class MLP : public Cloneable<MLP> {
 public:
  explicit MLP(int64_t dim, bool bias = true, bool with_buffer = false, int64_t dim_multiplier = 4);
  Value forward(const Value& x) override;
};

// Sequential(MLP(d, dim_multiplier=3), MLP(d), MLP(d, dim_multiplier=3)) (+ "3" =
// LayerNorm(d, bias=False) with sequence parallel).
class MLPStack : public Cloneable<MLPStack, Sequential> {
 public:
  explicit MLPStack(int64_t mlp_dim, bool with_seq_parallel = false);
  bool with_seq_parallel() const { return with_seq_parallel_; }

 private:
  bool with_seq_parallel_;
};

// lin1, lin2 = Linear(dim, dim), relu; forward returns the tuple (relu(lin1(x)),
// relu(lin2(x))), or relu(lin1(x)) alone when use_second_linear is false (lin2 unused).
class DoubleLinear : public Cloneable<DoubleLinear> {
 public:
  explicit DoubleLinear(int64_t dim, bool use_second_linear = true);
  Value forward(const Value& x) override;

 private:
  bool use_second_linear_;
};

// embed_tokens = Embedding(23, 16); transformer = nn.Transformer(d_model=16,
// num_encoder_layers=2, num_decoder_layers=2, dim_feedforward=8, dropout=0.1);
// output_proj = Linear(16, 23) with output_proj.weight IS embed_tokens.weight; buffers
// vocab_bias = ones(16), long_buffer = zeros(16, int64); bn = BatchNorm1d(2) (add_bn) or
// Identity. `deterministic` seeds the generator with 0 first and calls eval() last.
// Forward on the tuple (src_ids [S, 2], tgt_ids [T, 2]) (int64, sequence-first):
// output_proj(transformer(embed(src) + vocab_bias + long_buffer, bn(embed(tgt)))).
class TransformerWithSharedParams : public Cloneable<TransformerWithSharedParams> {
 public:
  static constexpr int64_t kVocab = 23;
  static constexpr int64_t kModelDim = 16;
  static constexpr int64_t kBatch = 2;

  explicit TransformerWithSharedParams(int rank = 0, bool add_bn = true,
                                       bool deterministic = false);
  Value forward(const Value& src_tgt) override;
  // get_input: seeds the generator with 1 + rank, returns (arange(12).view(6, 2),
  // arange(8).view(4, 2)) on `device`.
  Value get_input(Device device = Device::CPU()) const;
  // cross_entropy(output.view(-1, 23), tgt.view(-1), reduction="sum").
  static Tensor get_loss(const Value& input, const Tensor& output);
  // [transformer].
  std::vector<ModulePtr> get_ignored_modules() const;

 private:
  int rank_;
};

// ---- test_fully_shard_autograd.py: test_nontensor_activations (seed 002) -------------------

enum class ContainerType { kList, kTuple, kNamedTuple, kDict };

// The test's local `Module(dim)` (class name "Module"): lin1, lin2 = Linear(dim, dim), relu;
// forward applies relu(lin2(relu(lin1(t)))) to the container's first tensor (dict: "x") and
// returns the same container type: [y], (y,), NT(y, *rest) or {"x": y}.
class ContainerModule : public Cloneable<ContainerModule> {
 public:
  explicit ContainerModule(int64_t dim);
  Value forward(const Value& inp) override;
};

// Packs a tensor into the container: [x], (x,), NT(x=x, y=ones_like(x)) or {"x": x}.
class ToContainerType : public Cloneable<ToContainerType> {
 public:
  explicit ToContainerType(ContainerType type)
      : Cloneable<ToContainerType>("ToContainerType"), type_(type) {}
  Value forward(const Value& inp) override;

 private:
  ContainerType type_;
};

// Unpacks the tensor: inp[0] (list, tuple, named tuple) or inp["x"] (dict).
class FromContainerType : public Cloneable<FromContainerType> {
 public:
  explicit FromContainerType(ContainerType type)
      : Cloneable<FromContainerType>("FromContainerType"), type_(type) {}
  Value forward(const Value& inp) override;

 private:
  ContainerType type_;
};

// nn.Sequential(ToContainerType(t), Module(dim), Module(dim), Module(dim), FromContainerType(t)).
std::shared_ptr<Sequential> MakeNontensorActivationsModel(ContainerType type, int64_t dim = 24);

// ---- common_dtensor.py -------------------------------------------------------------------------

struct ModelArgs {
  int64_t n_layers = 2;                 // Default: 2
  int64_t vocab_size = 8;               // Default: 8
  int64_t max_seq_len = 16;             // Default: 16
  int64_t dim = 16;                     // Default: 16
  int64_t n_heads = 4;                  // Default: 4
  double dropout_p = 0.1;               // Default: 0.1
  bool use_attn_mask = true;            // Default: true (causal attention)
  bool weight_tying = true;             // Default: true (output.weight IS tok_embeddings.weight)
  bool checkpoint_activations = false;  // Default: false (per-block non-reentrant checkpoint)
  bool block_kwargs = false;            // Default: false (blocks called as layer(x=h) when true)
};

// Children: resid_dropout, wq, wk, wv, wo (Linear(dim, dim, bias=False)). Forward on
// [bsz, seq, dim]: heads [bsz, n_heads, seq, head_dim], scaled-dot-product attention (dropout
// only in training, causal = use_attn_mask), back to [bsz, seq, dim], wo, resid_dropout.
class Attention : public Cloneable<Attention> {
 public:
  explicit Attention(const ModelArgs& args);
  Value forward(const Value& x) override;
  int64_t n_heads() const { return n_heads_; }
  // TP with local outputs divides the heads (layer.attention.n_heads = n_heads // tp).
  void set_n_heads(int64_t n_heads) { n_heads_ = n_heads; }

 private:
  int64_t head_dim_;
  int64_t n_heads_;
  double dropout_p_;
  bool use_attn_mask_;
};

// w1 = Linear(dim, hidden), gelu, w2 = Linear(hidden, dim), resid_dropout.
class FeedForward : public Cloneable<FeedForward> {
 public:
  FeedForward(int64_t dim, int64_t hidden_dim, double dropout_p);
  Value forward(const Value& x) override;
};

// attention_norm, attention, ffn_norm, feed_forward (hidden 4*dim); pre-norm residual blocks.
class TransformerBlock : public Cloneable<TransformerBlock> {
 public:
  explicit TransformerBlock(const ModelArgs& args);
  Value forward(const Value& x) override;
  // forward(x) called as block(x=h): no positional input, the keyword argument "x".
  Value forward_with_kwargs(const Value& args, const Value& kwargs) override;
};

// tok_embeddings, pos_embeddings, dropout, layers (ModuleList of TransformerBlock), norm,
// output (Linear(dim, vocab, bias=False), weight tied to tok_embeddings.weight). Forward on
// int64 tokens [bsz, seq]: embeddings + positions, dropout, blocks (each under non-reentrant
// activation checkpointing when checkpoint_activations; called as layer(x=h) when
// block_kwargs), norm, output, cast to float32.
class Transformer : public Cloneable<Transformer> {
 public:
  explicit Transformer(const ModelArgs& args);
  Value forward(const Value& tokens) override;
  const ModelArgs& model_args() const { return args_; }
  // The blocks in order (children of "layers").
  std::vector<ModulePtr> layers() const;

 private:
  ModelArgs args_;
};

// Seeds the calling rank's generator with 5 (torch.manual_seed(5)), then net1 = Linear(10, 16),
// relu, net2 = Linear(16, 10); forward net2(relu(net1(x))).
class MLPModule : public Cloneable<MLPModule> {
 public:
  explicit MLPModule(bool bias = true);
  Value forward(const Value& x) override;
};

// layers = ModuleList(n_layers × MLPModule) applied in sequence.
class MLPStacked : public Cloneable<MLPStacked> {
 public:
  explicit MLPStacked(int64_t n_layers = 2);
  Value forward(const Value& x) override;
};

// weight = ones(dim); forward x * rsqrt(mean(x², -1, keepdim) + eps) * weight.
class RMSNormPython : public Cloneable<RMSNormPython> {
 public:
  explicit RMSNormPython(int64_t dim, double eps = 1e-6);
  Value forward(const Value& x) override;

 private:
  double eps_;
};

// ---- Seeds -------------------------------------------------------------------------------------

// Seed 003: net1 = Linear(5, 8), relu, net2 = Linear(8, 4), net3 = Linear(4, 12); forward
// net3(net2(relu(net1(x)))).
class SimpleModel : public Cloneable<SimpleModel> {
 public:
  SimpleModel();
  Value forward(const Value& x) override;
  static std::vector<std::string> sharded_param_names() {
    return {"net1.weight", "net1.bias", "net2.weight"};
  }
  static std::vector<std::string> non_sharded_param_names() { return {"net3.weight", "net3.bias"}; }
};

// Seed 001's `Model` (class name "Model"): inner = Linear(4, 4), outer = Linear(4, 5); with
// register_buffers each Linear gets buffer = randn(5, 5) and a non-persistent
// non_persistent_buffer = randn(5, 5). Forward: i = inner(x); j = inner(x); outer(i + j).
class StateDictModel : public Cloneable<StateDictModel> {
 public:
  explicit StateDictModel(bool register_buffers = false);
  Value forward(const Value& x) override;
};

// Seed 001's TestDummyModel: seeds the generator with 0; net1 = Sequential(Linear(8, 16),
// ReLU), net2 = Sequential(Linear(16, 16), ReLU), net3 = net2 (the same module),
// random_parameter = Parameter(10 elements, zeros here), shared_parameter = random_parameter.
// Forward net3(net2(net1(x))).
class TestDummyModel : public Cloneable<TestDummyModel> {
 public:
  TestDummyModel();
  Value forward(const Value& x) override;
};

// nn.Sequential(Linear(10, 10, bias=False), Linear(10, 10, bias=False)).
std::shared_ptr<Sequential> MakeSimpleNestedModel();
// nn.Sequential(Linear(10, 10, bias=False), BatchNorm1d(10), Linear(10, 10, bias=False)).
std::shared_ptr<Sequential> MakeMultibufferNestedModel();

}  // namespace fsdp::nn
