// torch.nn's encoder-decoder Transformer stack, as used by common_fsdp.py's
// TransformerWithSharedParams: MultiheadAttention, TransformerEncoderLayer,
// TransformerDecoderLayer, TransformerEncoder, TransformerDecoder and nn.Transformer
// (EncoderDecoderTransformer here, class name "Transformer"). Defaults as in PyTorch:
// post-norm (norm_first=False), ReLU, sequence-first tensors [seq, batch, d_model], biases on.
// Registration order, FQNs and initialisation order follow torch/nn/modules/{activation,
// transformer}.py; attention uses need_weights=False (scaled-dot-product attention, dropout
// only in training).
//
// Ownership and thread-safety: as Module (configuration members only).
#pragma once

#include <cstdint>

#include "engine/nn/layers.h"
#include "engine/nn/module.h"

namespace fsdp::nn {

// MultiheadAttention(embed_dim, num_heads, dropout, bias) with kdim = vdim = embed_dim:
// in_proj_weight [3E, E] (xavier_uniform), q/k/v_proj_weight None, in_proj_bias [3E] (zeros),
// out_proj = NonDynamicallyQuantizableLinear(E, E) (bias zeroed). Forward on the tuple
// (query, key, value), each [L or S, N, E]; returns the attention output [L, N, E] (the
// `[0]` of PyTorch's (output, weights) pair). out_proj's parameters are used through F.linear,
// so out_proj's own hooks do not fire (as in PyTorch).
class MultiheadAttention : public Cloneable<MultiheadAttention> {
 public:
  MultiheadAttention(int64_t embed_dim, int64_t num_heads, double dropout = 0.0, bool bias = true);
  void reset_parameters();
  Value forward(const Value& qkv) override;
  Tensor attend(const Tensor& query, const Tensor& key, const Tensor& value);

 private:
  int64_t embed_dim_;
  int64_t num_heads_;
  double dropout_;
};

// Children: self_attn, linear1, dropout, linear2, norm1, norm2, dropout1, dropout2. Forward
// (post-norm): x = norm1(x + dropout1(self_attn(x, x, x))); x = norm2(x + dropout2(linear2(
// dropout(relu(linear1(x)))))).
class TransformerEncoderLayer : public Cloneable<TransformerEncoderLayer> {
 public:
  TransformerEncoderLayer(int64_t d_model, int64_t nhead, int64_t dim_feedforward = 2048,
                          double dropout = 0.1, double layer_norm_eps = 1e-5);
  Value forward(const Value& src) override;
};

// Children: self_attn, multihead_attn, linear1, dropout, linear2, norm1, norm2, norm3,
// dropout1, dropout2, dropout3. Forward on (tgt, memory): self-attention, cross-attention
// over memory, feed-forward, each followed by add & norm.
class TransformerDecoderLayer : public Cloneable<TransformerDecoderLayer> {
 public:
  TransformerDecoderLayer(int64_t d_model, int64_t nhead, int64_t dim_feedforward = 2048,
                          double dropout = 0.1, double layer_norm_eps = 1e-5);
  Value forward(const Value& tgt_memory) override;
};

// layers = ModuleList of deep copies of `layer`, then norm (optional).
class TransformerEncoder : public Cloneable<TransformerEncoder> {
 public:
  TransformerEncoder(const ModulePtr& layer, int64_t num_layers, ModulePtr norm);
  Value forward(const Value& src) override;
};

// layers = ModuleList of deep copies of `layer`, then norm (optional); forward on (tgt, memory).
class TransformerDecoder : public Cloneable<TransformerDecoder> {
 public:
  TransformerDecoder(const ModulePtr& layer, int64_t num_layers, ModulePtr norm);
  Value forward(const Value& tgt_memory) override;
};

// nn.Transformer (class name "Transformer"): encoder, decoder; every parameter of more than
// one dimension is re-initialised with xavier_uniform after construction. Forward on the tuple
// (src [S, N, E], tgt [T, N, E]) returns [T, N, E].
class EncoderDecoderTransformer : public Cloneable<EncoderDecoderTransformer> {
 public:
  EncoderDecoderTransformer(int64_t d_model = 512, int64_t nhead = 8,
                            int64_t num_encoder_layers = 6, int64_t num_decoder_layers = 6,
                            int64_t dim_feedforward = 2048, double dropout = 0.1,
                            double layer_norm_eps = 1e-5);
  Value forward(const Value& src_tgt) override;
};

}  // namespace fsdp::nn
