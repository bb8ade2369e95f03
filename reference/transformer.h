// The toy Transformer of torch/testing/_internal/distributed/_tensor/common_dtensor.py (ModelArgs,
// Attention, FeedForward, TransformerBlock, Transformer), the model of most FSDP2 tests.
//
// Forward on tokens [bsz, seq] (seq <= max_seq_len), dropout taken as 0 (dropout_p = 0, or eval):
//   h = tok_embeddings(tokens) + pos_embeddings(arange(seq))
//   per block: h = h + attention(attention_norm(h)); h = h + feed_forward(ffn_norm(h))
//     attention: wq/wk/wv/wo = Linear(dim, dim, bias=False), n_heads heads of dim/n_heads,
//                softmax(q kᵀ / sqrt(head_dim)) v, causal iff use_attn_mask
//     feed_forward: w2(gelu(w1(x))), w1 = Linear(dim, 4 dim), w2 = Linear(4 dim, dim), with bias
//   logits = output(norm(h)); output = Linear(dim, vocab, bias=False) whose weight IS
//   tok_embeddings.weight when weight_tying (then reported once, as tok_embeddings.weight).
// LayerNorms have weight and bias, eps 1e-5. One output: logits [bsz, seq, vocab_size].
//
// Parameters in registration order: tok_embeddings.weight [vocab, dim], pos_embeddings.weight
// [max_seq_len, dim], then per block i: layers.i.attention_norm.{weight,bias},
// layers.i.attention.{wq,wk,wv,wo}.weight, layers.i.ffn_norm.{weight,bias},
// layers.i.feed_forward.w1.{weight,bias}, layers.i.feed_forward.w2.{weight,bias}; then
// norm.{weight,bias}; then output.weight only without weight tying.
//
// Thread-safety: immutable after construction. Ownership: the args are copied in.
#pragma once

#include <string>
#include <vector>

#include "reference/model.h"

namespace fsdp::reference {

// common_dtensor.py ModelArgs. PyTorch's dropout_p (default 0.1) and checkpoint_activations have
// no numeric effect here: the oracle computes the dropout-free (p = 0 / eval) forward, and
// activation checkpointing does not change values.
struct ModelArgs {
  int64_t n_layers = 2;       // Default: 2.
  int64_t vocab_size = 8;     // Default: 8.
  int64_t max_seq_len = 16;   // Default: 16.
  int64_t dim = 16;           // Default: 16.
  int64_t n_heads = 4;        // Default: 4.
  bool use_attn_mask = true;  // Default: true (causal attention).
  bool weight_tying = true;   // Default: true.
};

// The Transformer described above. Reads input.tokens [bsz, seq]; input.features must be unset.
// Backward reports no input grad. Holds only its args; immutable, const calls may run concurrently.
template <typename T>
class Transformer : public Model<T> {
 public:
  // Throws std::invalid_argument when dim % n_heads != 0 or a size is not positive.
  explicit Transformer(const ModelArgs& args = {});

  std::string Name() const override { return "Transformer"; }
  std::vector<TensorSpec> ParameterSpecs() const override;
  ForwardResult<T> Forward(const TensorMap<T>& params, const TensorMap<T>& buffers,
                           const ModelInput<T>& input) const override;
  BackwardResult<T> Backward(
      const TensorMap<T>& params, const TensorMap<T>& buffers, const ModelInput<T>& input,
      const std::vector<std::optional<BasicRefTensor<T>>>& output_grads) const override;

  const ModelArgs& args() const { return args_; }

 private:
  // Module whose ".weight" the output projection uses: "tok_embeddings" when tied, else "output".
  std::string OutputPrefix() const;
  // Checks params and tokens; returns (bsz, seq).
  std::pair<int64_t, int64_t> CheckInputs(const TensorMap<T>& params,
                                          const ModelInput<T>& input) const;

  ModelArgs args_;
};

}  // namespace fsdp::reference
