// common_fsdp.py TransformerWithSharedParams (the model of the FSDP1 tests, e.g. gradient
// accumulation), in eval mode (`deterministic=True`): dropout is off and BatchNorm uses its
// running statistics. Training mode draws dropout masks (p = 0.1) and is not modelled.
//
// Modules: embed_tokens = Embedding(23, 16); transformer = nn.Transformer(d_model=16, nhead=8,
// num_encoder_layers=2, num_decoder_layers=2, dim_feedforward=8, dropout=0.1) (post-norm, ReLU,
// seq-first, no masks); output_proj = Linear(16, 23) whose weight IS embed_tokens.weight;
// buffers vocab_bias = ones(16), long_buffer = zeros(16) (int64 in PyTorch, held as T here);
// bn = BatchNorm1d(bs = 2) when add_bn, else Identity.
//
// Forward on src [S, B] (input.tokens) and tgt [T, B] (input.decoder_tokens), B = bs:
//   src_e = embed(src) + vocab_bias + long_buffer;  tgt_e = bn(embed(tgt))  (bn sees [T, B, 16]
//   as (N, C, L): the batch index is BatchNorm's channel)
//   memory = encoder.norm(enc_layers(src_e)); enc layer: x = norm1(x + sa(x)); x = norm2(x + ff(x))
//   out = decoder.norm(dec_layers(tgt_e, memory)); dec layer: x = norm1(x + sa(x));
//         x = norm2(x + mha(x, memory)); x = norm3(x + ff(x))
//   logits = output_proj(out) : [T, B, 23]
// The seeds' loss is cross_entropy(logits.view(-1, 23), tgt.view(-1), reduction="sum"): use
// CrossEntropyLoss(Reduction::kSum) with input.targets = tgt.
//
// Parameters in registration order: embed_tokens.weight; per encoder layer i
// transformer.encoder.layers.i.{self_attn.in_proj_weight [48,16], self_attn.in_proj_bias,
// self_attn.out_proj.weight, self_attn.out_proj.bias, linear1.weight [8,16], linear1.bias,
// linear2.weight [16,8], linear2.bias, norm1.weight, norm1.bias, norm2.weight, norm2.bias};
// transformer.encoder.norm.{weight,bias}; per decoder layer i transformer.decoder.layers.i.{
// self_attn.*, multihead_attn.*, linear1.*, linear2.*, norm1.*, norm2.*, norm3.*};
// transformer.decoder.norm.{weight,bias}; output_proj.bias; [bn.weight, bn.bias].
//
// Thread-safety: immutable after construction. Ownership: the config is copied in.
#pragma once

#include <string>
#include <vector>

#include "reference/model.h"

namespace fsdp::reference {

// The sizes are fixed in PyTorch; they are exposed so tests can shrink the model.
struct TransformerWithSharedParamsConfig {
  bool add_bn = true;              // Default: true (init()'s default).
  int64_t vocab_size = 23;         // Default: 23.
  int64_t d_model = 16;            // Default: 16.
  int64_t nhead = 8;               // Default: 8 (nn.Transformer's default).
  int64_t num_encoder_layers = 2;  // Default: 2.
  int64_t num_decoder_layers = 2;  // Default: 2.
  int64_t dim_feedforward = 8;     // Default: 8.
  int64_t batch_size = 2;          // Default: 2 (self.bs: BatchNorm1d's channel count).
  double layer_norm_eps = 1e-5;    // Default: 1e-5.
  double bn_eps = 1e-5;            // Default: 1e-5.
};

// The model described above. Holds only its config; immutable, const calls may run concurrently.
template <typename T>
class TransformerWithSharedParams : public Model<T> {
 public:
  // Throws std::invalid_argument when d_model % nhead != 0 or a size is not positive.
  explicit TransformerWithSharedParams(const TransformerWithSharedParamsConfig& config = {});

  std::string Name() const override { return "TransformerWithSharedParams"; }
  std::vector<TensorSpec> ParameterSpecs() const override;
  // vocab_bias, long_buffer, then bn.running_mean, bn.running_var, bn.num_batches_tracked.
  std::vector<TensorSpec> BufferSpecs() const override;
  // vocab_bias ones, long_buffer zeros, BatchNorm zeros / ones / 0.
  TensorMap<T> DefaultBuffers() const override;
  ForwardResult<T> Forward(const TensorMap<T>& params, const TensorMap<T>& buffers,
                           const ModelInput<T>& input) const override;
  BackwardResult<T> Backward(
      const TensorMap<T>& params, const TensorMap<T>& buffers, const ModelInput<T>& input,
      const std::vector<std::optional<BasicRefTensor<T>>>& output_grads) const override;

  // The fixed input of get_input(): src = arange(12).view(6, 2), tgt = arange(8).view(4, 2),
  // with targets = tgt.
  static ModelInput<T> GetInput();

 private:
  // Checks params, buffers and inputs; returns the batch size B.
  int64_t CheckInputs(const TensorMap<T>& params, const TensorMap<T>& buffers,
                      const ModelInput<T>& input) const;

  TransformerWithSharedParamsConfig config_;
};

}  // namespace fsdp::reference
