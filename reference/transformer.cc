#include "reference/transformer.h"

#include <stdexcept>
#include <utility>

#include "reference/module_helpers.h"

namespace fsdp::reference {
namespace {

// Activations of one TransformerBlock, kept for the backward.
template <typename T>
struct BlockActivations {
  Matrix<T> x;        // block input (residual stream)
  Matrix<T> a;        // attention_norm(x)
  Matrix<T> q, k, v;  // projections of a
  Matrix<T> o;        // concatenated attention heads (input of wo)
  Matrix<T> h;        // x + wo(o)
  Matrix<T> f;        // ffn_norm(h)
  Matrix<T> u;        // w1(f)
  Matrix<T> g;        // gelu(u)
  Matrix<T> out;      // h + w2(g)
};

template <typename T>
struct Activations {
  std::vector<int64_t> token_ids;     // one per row (row = b * seq + s)
  std::vector<int64_t> position_ids;  // s for row b * seq + s
  std::vector<BlockActivations<T>> blocks;
  Matrix<T> final_in;  // input of the final norm
  Matrix<T> n;         // norm(final_in)
  Matrix<T> logits;
};

std::string Block(int64_t i) { return "layers." + std::to_string(i) + "."; }

template <typename T>
Activations<T> RunForward(const ModelArgs& args, const std::string& output_prefix,
                          const TensorMap<T>& p, const IndexTensor& tokens, int64_t bsz,
                          int64_t seq) {
  Activations<T> act;
  act.token_ids = tokens.data;
  for (int64_t b = 0; b < bsz; ++b)
    for (int64_t s = 0; s < seq; ++s) act.position_ids.push_back(s);
  Matrix<T> x = EmbeddingForward<T>(ToMatrix(Lookup(p, "tok_embeddings.weight")), act.token_ids) +
                EmbeddingForward<T>(ToMatrix(Lookup(p, "pos_embeddings.weight")), act.position_ids);
  for (int64_t i = 0; i < args.n_layers; ++i) {
    const std::string pre = Block(i);
    BlockActivations<T> a;
    a.x = x;
    a.a = LayerNormAt(p, pre + "attention_norm", true, a.x);
    a.q = LinearAt(p, pre + "attention.wq", false, a.a);
    a.k = LinearAt(p, pre + "attention.wk", false, a.a);
    a.v = LinearAt(p, pre + "attention.wv", false, a.a);
    a.o = MultiHeadAttentionForward<T>(a.q, a.k, a.v, bsz, args.n_heads,
                                       SequenceLayout::kBatchFirst, args.use_attn_mask);
    a.h = a.x + LinearAt(p, pre + "attention.wo", false, a.o);
    a.f = LayerNormAt(p, pre + "ffn_norm", true, a.h);
    a.u = LinearAt(p, pre + "feed_forward.w1", true, a.f);
    a.g = GeluForward<T>(a.u);
    a.out = a.h + LinearAt(p, pre + "feed_forward.w2", true, a.g);
    x = a.out;
    act.blocks.push_back(std::move(a));
  }
  act.final_in = x;
  act.n = LayerNormAt(p, "norm", true, x);
  act.logits = LinearAt(p, output_prefix, false, act.n);
  return act;
}

}  // namespace

template <typename T>
Transformer<T>::Transformer(const ModelArgs& args) : args_(args) {
  if (args_.n_layers < 0 || args_.vocab_size <= 0 || args_.max_seq_len <= 0 || args_.dim <= 0 ||
      args_.n_heads <= 0) {
    throw std::invalid_argument("Transformer: sizes must be positive");
  }
  if (args_.dim % args_.n_heads != 0) {
    throw std::invalid_argument("Transformer: dim " + std::to_string(args_.dim) +
                                " is not divisible by n_heads " + std::to_string(args_.n_heads));
  }
}

template <typename T>
std::string Transformer<T>::OutputPrefix() const {
  return args_.weight_tying ? "tok_embeddings" : "output";
}

template <typename T>
std::vector<TensorSpec> Transformer<T>::ParameterSpecs() const {
  const int64_t d = args_.dim;
  std::vector<TensorSpec> specs = {{"tok_embeddings.weight", {args_.vocab_size, d}},
                                   {"pos_embeddings.weight", {args_.max_seq_len, d}}};
  for (int64_t i = 0; i < args_.n_layers; ++i) {
    const std::string pre = Block(i);
    AppendSpecs(&specs, NormSpecs(pre + "attention_norm", d, true));
    for (const char* w : {"wq", "wk", "wv", "wo"}) {
      AppendSpecs(&specs, LinearSpecs(pre + "attention." + w, d, d, false));
    }
    AppendSpecs(&specs, NormSpecs(pre + "ffn_norm", d, true));
    AppendSpecs(&specs, LinearSpecs(pre + "feed_forward.w1", d, 4 * d, true));
    AppendSpecs(&specs, LinearSpecs(pre + "feed_forward.w2", 4 * d, d, true));
  }
  AppendSpecs(&specs, NormSpecs("norm", d, true));
  if (!args_.weight_tying) AppendSpecs(&specs, LinearSpecs("output", d, args_.vocab_size, false));
  return specs;
}

template <typename T>
std::pair<int64_t, int64_t> Transformer<T>::CheckInputs(const TensorMap<T>& params,
                                                        const ModelInput<T>& input) const {
  CheckTensorMap(ParameterSpecs(), params, Name(), "parameter");
  if (!input.tokens) throw std::invalid_argument("Transformer: input.tokens is not set");
  if (input.features) throw std::invalid_argument("Transformer: takes tokens, not features");
  const IndexTensor& t = *input.tokens;
  if (t.shape.size() != 2) {
    throw std::invalid_argument("Transformer: tokens must be [bsz, seq], got " +
                                ShapeToString(t.shape));
  }
  if (t.shape[1] > args_.max_seq_len) {
    throw std::invalid_argument("Transformer: seq " + std::to_string(t.shape[1]) +
                                " exceeds max_seq_len " + std::to_string(args_.max_seq_len));
  }
  return {t.shape[0], t.shape[1]};
}

template <typename T>
ForwardResult<T> Transformer<T>::Forward(const TensorMap<T>& params, const TensorMap<T>& buffers,
                                         const ModelInput<T>& input) const {
  const auto [bsz, seq] = CheckInputs(params, input);
  const std::string out_prefix = OutputPrefix();
  const Activations<T> act = RunForward(args_, out_prefix, params, *input.tokens, bsz, seq);
  return {{FromMatrix<T>(act.logits, {bsz, seq, args_.vocab_size})}, buffers};
}

template <typename T>
BackwardResult<T> Transformer<T>::Backward(
    const TensorMap<T>& params, const TensorMap<T>& /*buffers*/, const ModelInput<T>& input,
    const std::vector<std::optional<BasicRefTensor<T>>>& output_grads) const {
  const auto [bsz, seq] = CheckInputs(params, input);
  const auto dlogits = OutputGrad(output_grads, 0, 1, {bsz, seq, args_.vocab_size}, Name());
  BackwardResult<T> r;
  if (!dlogits) return r;
  const std::string out_prefix = OutputPrefix();
  const Activations<T> act = RunForward(args_, out_prefix, params, *input.tokens, bsz, seq);
  TensorMap<T>* g = &r.grads;

  // logits = norm(x) Woutᵀ; with tying Wout is tok_embeddings.weight and its gradient adds to the
  // embedding lookup's gradient below.
  const Matrix<T> dn = LinearAtBackward(params, out_prefix, false, act.n, *dlogits, g);
  Matrix<T> dx = LayerNormAtBackward(params, "norm", true, act.final_in, dn, g);

  for (int64_t i = args_.n_layers; i-- > 0;) {
    const std::string pre = Block(i);
    const BlockActivations<T>& a = act.blocks[static_cast<size_t>(i)];
    // out = h + w2(gelu(w1(ffn_norm(h))))
    const Matrix<T> dg = LinearAtBackward(params, pre + "feed_forward.w2", true, a.g, dx, g);
    const Matrix<T> du = GeluBackward<T>(a.u, dg);
    const Matrix<T> df = LinearAtBackward(params, pre + "feed_forward.w1", true, a.f, du, g);
    const Matrix<T> dh = dx + LayerNormAtBackward(params, pre + "ffn_norm", true, a.h, df, g);
    // h = x + wo(attention(attention_norm(x)))
    const Matrix<T> d_o = LinearAtBackward(params, pre + "attention.wo", false, a.o, dh, g);
    const AttentionGrads<T> ag = MultiHeadAttentionBackward<T>(
        a.q, a.k, a.v, bsz, args_.n_heads, SequenceLayout::kBatchFirst, args_.use_attn_mask, d_o);
    const Matrix<T> da = LinearAtBackward(params, pre + "attention.wq", false, a.a, ag.q, g) +
                         LinearAtBackward(params, pre + "attention.wk", false, a.a, ag.k, g) +
                         LinearAtBackward(params, pre + "attention.wv", false, a.a, ag.v, g);
    dx = dh + LayerNormAtBackward(params, pre + "attention_norm", true, a.x, da, g);
  }

  // x0 = tok_embeddings(tokens) + pos_embeddings(arange(seq))
  AccumulateInto(g, "tok_embeddings.weight",
                 FromMatrix<T>(EmbeddingBackward<T>(args_.vocab_size, act.token_ids, dx),
                               {args_.vocab_size, args_.dim}));
  AccumulateInto(g, "pos_embeddings.weight",
                 FromMatrix<T>(EmbeddingBackward<T>(args_.max_seq_len, act.position_ids, dx),
                               {args_.max_seq_len, args_.dim}));
  return r;
}

template class Transformer<float>;
template class Transformer<double>;

}  // namespace fsdp::reference
