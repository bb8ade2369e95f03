#include "reference/transformer_with_shared_params.h"

#include <stdexcept>
#include <utility>

#include "reference/module_helpers.h"

namespace fsdp::reference {
namespace {

// ---- nn.MultiheadAttention (packed in_proj, bias, seq-first, no mask, no dropout) --------------

template <typename T>
struct MhaActivations {
  Matrix<T> xq, xkv;  // query input and key/value input (the same for self-attention)
  Matrix<T> q, k, v;  // projections
  Matrix<T> o;        // concatenated heads, input of out_proj
  Matrix<T> out;      // out_proj(o)
};

template <typename T>
MhaActivations<T> MhaForward(const TensorMap<T>& p, const std::string& prefix, const Matrix<T>& xq,
                             const Matrix<T>& xkv, int64_t batch, int64_t heads) {
  const Matrix<T> w = ToMatrix(Lookup(p, prefix + ".in_proj_weight"));  // [3E, E]: q; k; v
  const Vector<T> b = ToVector(Lookup(p, prefix + ".in_proj_bias"));
  const int64_t e = w.cols();
  MhaActivations<T> a;
  a.xq = xq;
  a.xkv = xkv;
  a.q = LinearForward<T>(xq, w, &b).leftCols(e);
  const Matrix<T> kv = LinearForward<T>(xkv, w, &b);
  a.k = kv.middleCols(e, e);
  a.v = kv.rightCols(e);
  a.o = MultiHeadAttentionForward<T>(a.q, a.k, a.v, batch, heads, SequenceLayout::kSequenceFirst,
                                     /*causal=*/false);
  a.out = LinearAt(p, prefix + ".out_proj", true, a.o);
  return a;
}

// Returns (d xq, d xkv); accumulates in_proj_weight/bias and out_proj gradients.
template <typename T>
std::pair<Matrix<T>, Matrix<T>> MhaBackward(const TensorMap<T>& p, const std::string& prefix,
                                            const MhaActivations<T>& a, int64_t batch,
                                            int64_t heads, const Matrix<T>& grad_out,
                                            TensorMap<T>* grads) {
  const Matrix<T> d_o = LinearAtBackward(p, prefix + ".out_proj", true, a.o, grad_out, grads);
  const AttentionGrads<T> ag = MultiHeadAttentionBackward<T>(
      a.q, a.k, a.v, batch, heads, SequenceLayout::kSequenceFirst, /*causal=*/false, d_o);
  const BasicRefTensor<T>& wt = Lookup(p, prefix + ".in_proj_weight");
  const Matrix<T> w = ToMatrix(wt);
  const int64_t e = w.cols();
  // The query rows only feed the first E projection columns, the key/value rows the last 2E.
  Matrix<T> dpq = Matrix<T>::Zero(a.xq.rows(), 3 * e);
  dpq.leftCols(e) = ag.q;
  Matrix<T> dpkv = Matrix<T>::Zero(a.xkv.rows(), 3 * e);
  dpkv.middleCols(e, e) = ag.k;
  dpkv.rightCols(e) = ag.v;
  const LinearGrads<T> gq = LinearBackward<T>(a.xq, w, true, dpq);
  const LinearGrads<T> gkv = LinearBackward<T>(a.xkv, w, true, dpkv);
  AccumulateInto(grads, prefix + ".in_proj_weight",
                 FromMatrix<T>(gq.weight + gkv.weight, wt.shape));
  AccumulateInto(grads, prefix + ".in_proj_bias", FromVector<T>(gq.bias + gkv.bias, {3 * e}));
  return {gq.input, gkv.input};
}

// ---- Feed-forward: linear2(relu(linear1(x))) ---------------------------------------------------

template <typename T>
struct FfActivations {
  Matrix<T> x, h, a, out;
};

template <typename T>
FfActivations<T> FfForward(const TensorMap<T>& p, const std::string& prefix, const Matrix<T>& x) {
  FfActivations<T> f;
  f.x = x;
  f.h = LinearAt(p, prefix + ".linear1", true, x);
  f.a = ReluForward<T>(f.h);
  f.out = LinearAt(p, prefix + ".linear2", true, f.a);
  return f;
}

template <typename T>
Matrix<T> FfBackward(const TensorMap<T>& p, const std::string& prefix, const FfActivations<T>& f,
                     const Matrix<T>& grad_out, TensorMap<T>* grads) {
  const Matrix<T> da = LinearAtBackward(p, prefix + ".linear2", true, f.a, grad_out, grads);
  return LinearAtBackward(p, prefix + ".linear1", true, f.x, ReluBackward<T>(f.h, da), grads);
}

// ---- Encoder / decoder layers (post-norm) ------------------------------------------------------

template <typename T>
struct EncoderActivations {
  MhaActivations<T> sa;
  Matrix<T> r1, y1;  // x + sa(x), norm1(.)
  FfActivations<T> ff;
  Matrix<T> r2, y2;  // y1 + ff(y1), norm2(.)
};

template <typename T>
struct DecoderActivations {
  MhaActivations<T> sa;
  Matrix<T> r1, y1;  // x + sa(x), norm1(.)
  MhaActivations<T> ca;
  Matrix<T> r2, y2;  // y1 + mha(y1, memory), norm2(.)
  FfActivations<T> ff;
  Matrix<T> r3, y3;  // y2 + ff(y2), norm3(.)
};

struct Prefixes {
  static std::string Encoder(int64_t i) {
    return "transformer.encoder.layers." + std::to_string(i);
  }
  static std::string Decoder(int64_t i) {
    return "transformer.decoder.layers." + std::to_string(i);
  }
};

template <typename T>
struct Activations {
  std::vector<int64_t> src_ids, tgt_ids;
  Matrix<T> src_e;                 // embed(src) + vocab_bias + long_buffer
  BasicRefTensor<T> tgt_embedded;  // embed(tgt) as [T, B, E] (BatchNorm input)
  Matrix<T> tgt_e;                 // bn(embed(tgt))
  std::vector<EncoderActivations<T>> enc;
  Matrix<T> enc_out, memory;  // before / after encoder.norm
  std::vector<DecoderActivations<T>> dec;
  Matrix<T> dec_out, out;  // before / after decoder.norm
  Matrix<T> logits;
};

}  // namespace

template <typename T>
TransformerWithSharedParams<T>::TransformerWithSharedParams(
    const TransformerWithSharedParamsConfig& config)
    : config_(config) {
  const auto& c = config_;
  if (c.vocab_size <= 0 || c.d_model <= 0 || c.nhead <= 0 || c.num_encoder_layers < 0 ||
      c.num_decoder_layers < 0 || c.dim_feedforward <= 0 || c.batch_size <= 0) {
    throw std::invalid_argument(Name() + ": sizes must be positive");
  }
  if (c.d_model % c.nhead != 0) {
    throw std::invalid_argument(Name() + ": d_model is not divisible by nhead");
  }
}

template <typename T>
std::vector<TensorSpec> TransformerWithSharedParams<T>::ParameterSpecs() const {
  const auto& c = config_;
  const int64_t e = c.d_model;
  auto mha = [e](const std::string& prefix) {
    std::vector<TensorSpec> s = {{prefix + ".in_proj_weight", {3 * e, e}},
                                 {prefix + ".in_proj_bias", {3 * e}}};
    AppendSpecs(&s, LinearSpecs(prefix + ".out_proj", e, e, true));
    return s;
  };
  std::vector<TensorSpec> specs = {{"embed_tokens.weight", {c.vocab_size, e}}};
  for (int64_t i = 0; i < c.num_encoder_layers; ++i) {
    const std::string pre = Prefixes::Encoder(i);
    AppendSpecs(&specs, mha(pre + ".self_attn"));
    AppendSpecs(&specs, LinearSpecs(pre + ".linear1", e, c.dim_feedforward, true));
    AppendSpecs(&specs, LinearSpecs(pre + ".linear2", c.dim_feedforward, e, true));
    AppendSpecs(&specs, NormSpecs(pre + ".norm1", e, true));
    AppendSpecs(&specs, NormSpecs(pre + ".norm2", e, true));
  }
  AppendSpecs(&specs, NormSpecs("transformer.encoder.norm", e, true));
  for (int64_t i = 0; i < c.num_decoder_layers; ++i) {
    const std::string pre = Prefixes::Decoder(i);
    AppendSpecs(&specs, mha(pre + ".self_attn"));
    AppendSpecs(&specs, mha(pre + ".multihead_attn"));
    AppendSpecs(&specs, LinearSpecs(pre + ".linear1", e, c.dim_feedforward, true));
    AppendSpecs(&specs, LinearSpecs(pre + ".linear2", c.dim_feedforward, e, true));
    AppendSpecs(&specs, NormSpecs(pre + ".norm1", e, true));
    AppendSpecs(&specs, NormSpecs(pre + ".norm2", e, true));
    AppendSpecs(&specs, NormSpecs(pre + ".norm3", e, true));
  }
  AppendSpecs(&specs, NormSpecs("transformer.decoder.norm", e, true));
  specs.push_back({"output_proj.bias", {c.vocab_size}});  // output_proj.weight is embed_tokens'
  if (c.add_bn) AppendSpecs(&specs, NormSpecs("bn", c.batch_size, true));
  return specs;
}

template <typename T>
std::vector<TensorSpec> TransformerWithSharedParams<T>::BufferSpecs() const {
  std::vector<TensorSpec> specs = {{"vocab_bias", {config_.d_model}},
                                   {"long_buffer", {config_.d_model}}};
  if (config_.add_bn) {
    specs.push_back({"bn.running_mean", {config_.batch_size}});
    specs.push_back({"bn.running_var", {config_.batch_size}});
    specs.push_back({"bn.num_batches_tracked", {}});
  }
  return specs;
}

template <typename T>
TensorMap<T> TransformerWithSharedParams<T>::DefaultBuffers() const {
  TensorMap<T> b = ZerosLike<T>(BufferSpecs());
  b["vocab_bias"] = Full<T>({config_.d_model}, T(1));
  if (config_.add_bn) b["bn.running_var"] = Full<T>({config_.batch_size}, T(1));
  return b;
}

template <typename T>
ModelInput<T> TransformerWithSharedParams<T>::GetInput() {
  ModelInput<T> in;
  in.tokens = IndexTensor({6, 2}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
  in.decoder_tokens = IndexTensor({4, 2}, {0, 1, 2, 3, 4, 5, 6, 7});
  in.targets = in.decoder_tokens;
  return in;
}

template <typename T>
int64_t TransformerWithSharedParams<T>::CheckInputs(const TensorMap<T>& params,
                                                    const TensorMap<T>& buffers,
                                                    const ModelInput<T>& input) const {
  CheckTensorMap(ParameterSpecs(), params, Name(), "parameter");
  CheckTensorMap(BufferSpecs(), buffers, Name(), "buffer");
  if (!input.tokens || !input.decoder_tokens) {
    throw std::invalid_argument(Name() + ": needs input.tokens (src) and input.decoder_tokens");
  }
  if (input.features) throw std::invalid_argument(Name() + ": takes tokens, not features");
  const Shape& s = input.tokens->shape;
  const Shape& t = input.decoder_tokens->shape;
  if (s.size() != 2 || t.size() != 2 || s[1] != t[1]) {
    throw std::invalid_argument(Name() + ": src " + ShapeToString(s) + " and tgt " +
                                ShapeToString(t) + " must be [S, B] and [T, B]");
  }
  if (config_.add_bn && s[1] != config_.batch_size) {
    throw std::invalid_argument(Name() + ": BatchNorm1d(" + std::to_string(config_.batch_size) +
                                ") needs batch " + std::to_string(config_.batch_size));
  }
  return s[1];
}

namespace {

template <typename T>
Activations<T> RunForward(const TransformerWithSharedParamsConfig& c, const TensorMap<T>& p,
                          const TensorMap<T>& buffers, const ModelInput<T>& input, int64_t batch) {
  Activations<T> act;
  const int64_t e = c.d_model;
  const double eps = c.layer_norm_eps;
  act.src_ids = input.tokens->data;
  act.tgt_ids = input.decoder_tokens->data;
  const Matrix<T> table = ToMatrix(Lookup(p, "embed_tokens.weight"));

  act.src_e = EmbeddingForward<T>(table, act.src_ids);
  act.src_e.rowwise() +=
      (ToVector(Lookup(buffers, "vocab_bias")) + ToVector(Lookup(buffers, "long_buffer")))
          .transpose();
  const int64_t tgt_len = input.decoder_tokens->shape[0];
  act.tgt_embedded = FromMatrix<T>(EmbeddingForward<T>(table, act.tgt_ids), {tgt_len, batch, e});
  if (c.add_bn) {
    BatchNormStats<T> stats{ToVector(Lookup(buffers, "bn.running_mean")),
                            ToVector(Lookup(buffers, "bn.running_var")), 0};
    const Vector<T> w = ToVector(Lookup(p, "bn.weight")), b = ToVector(Lookup(p, "bn.bias"));
    const BatchNormOptions eval{c.bn_eps, 0.1, /*training=*/false};
    act.tgt_e = ToMatrix(BatchNormForward<T>(act.tgt_embedded, &w, &b, &stats, eval));
  } else {
    act.tgt_e = ToMatrix(act.tgt_embedded);
  }

  Matrix<T> x = act.src_e;
  for (int64_t i = 0; i < c.num_encoder_layers; ++i) {
    const std::string pre = Prefixes::Encoder(i);
    EncoderActivations<T> a;
    a.sa = MhaForward(p, pre + ".self_attn", x, x, batch, c.nhead);
    a.r1 = x + a.sa.out;
    a.y1 = LayerNormAt(p, pre + ".norm1", true, a.r1, eps);
    a.ff = FfForward(p, pre, a.y1);
    a.r2 = a.y1 + a.ff.out;
    a.y2 = LayerNormAt(p, pre + ".norm2", true, a.r2, eps);
    x = a.y2;
    act.enc.push_back(std::move(a));
  }
  act.enc_out = x;
  act.memory = LayerNormAt(p, "transformer.encoder.norm", true, x, eps);

  x = act.tgt_e;
  for (int64_t i = 0; i < c.num_decoder_layers; ++i) {
    const std::string pre = Prefixes::Decoder(i);
    DecoderActivations<T> a;
    a.sa = MhaForward(p, pre + ".self_attn", x, x, batch, c.nhead);
    a.r1 = x + a.sa.out;
    a.y1 = LayerNormAt(p, pre + ".norm1", true, a.r1, eps);
    a.ca = MhaForward(p, pre + ".multihead_attn", a.y1, act.memory, batch, c.nhead);
    a.r2 = a.y1 + a.ca.out;
    a.y2 = LayerNormAt(p, pre + ".norm2", true, a.r2, eps);
    a.ff = FfForward(p, pre, a.y2);
    a.r3 = a.y2 + a.ff.out;
    a.y3 = LayerNormAt(p, pre + ".norm3", true, a.r3, eps);
    x = a.y3;
    act.dec.push_back(std::move(a));
  }
  act.dec_out = x;
  act.out = LayerNormAt(p, "transformer.decoder.norm", true, x, eps);
  const Vector<T> out_bias = ToVector(Lookup(p, "output_proj.bias"));
  act.logits = LinearForward<T>(act.out, table, &out_bias);  // output_proj.weight is the table
  return act;
}

}  // namespace

template <typename T>
ForwardResult<T> TransformerWithSharedParams<T>::Forward(const TensorMap<T>& params,
                                                         const TensorMap<T>& buffers,
                                                         const ModelInput<T>& input) const {
  const int64_t batch = CheckInputs(params, buffers, input);
  const Activations<T> act = RunForward(config_, params, buffers, input, batch);
  const Shape shape = {input.decoder_tokens->shape[0], batch, config_.vocab_size};
  return {{FromMatrix<T>(act.logits, shape)}, buffers};  // eval: buffers unchanged
}

template <typename T>
BackwardResult<T> TransformerWithSharedParams<T>::Backward(
    const TensorMap<T>& params, const TensorMap<T>& buffers, const ModelInput<T>& input,
    const std::vector<std::optional<BasicRefTensor<T>>>& output_grads) const {
  const int64_t batch = CheckInputs(params, buffers, input);
  const auto& c = config_;
  const double eps = c.layer_norm_eps;
  const Shape shape = {input.decoder_tokens->shape[0], batch, c.vocab_size};
  const auto dlogits = OutputGrad(output_grads, 0, 1, shape, Name());
  BackwardResult<T> r;
  if (!dlogits) return r;
  const Activations<T> act = RunForward(config_, params, buffers, input, batch);
  const TensorMap<T>& p = params;
  TensorMap<T>* g = &r.grads;

  // logits = out Eᵀ + b with E = embed_tokens.weight (tied).
  const BasicRefTensor<T>& table = Lookup(p, "embed_tokens.weight");
  const LinearGrads<T> lg = LinearBackward<T>(act.out, ToMatrix(table), true, *dlogits);
  AccumulateInto(g, "embed_tokens.weight", FromMatrix<T>(lg.weight, table.shape));
  AccumulateInto(g, "output_proj.bias", FromVector<T>(lg.bias, {c.vocab_size}));

  // Decoder.
  Matrix<T> dx =
      LayerNormAtBackward(p, "transformer.decoder.norm", true, act.dec_out, lg.input, g, eps);
  Matrix<T> dmemory = Matrix<T>::Zero(act.memory.rows(), act.memory.cols());
  for (int64_t i = c.num_decoder_layers; i-- > 0;) {
    const std::string pre = Prefixes::Decoder(i);
    const DecoderActivations<T>& a = act.dec[static_cast<size_t>(i)];
    const Matrix<T> dr3 = LayerNormAtBackward(p, pre + ".norm3", true, a.r3, dx, g, eps);
    const Matrix<T> dy2 = dr3 + FfBackward(p, pre, a.ff, dr3, g);
    const Matrix<T> dr2 = LayerNormAtBackward(p, pre + ".norm2", true, a.r2, dy2, g, eps);
    const auto [dq_in, dmem] =
        MhaBackward(p, pre + ".multihead_attn", a.ca, batch, c.nhead, dr2, g);
    dmemory += dmem;
    const Matrix<T> dy1 = dr2 + dq_in;
    const Matrix<T> dr1 = LayerNormAtBackward(p, pre + ".norm1", true, a.r1, dy1, g, eps);
    const auto [dsq, dskv] = MhaBackward(p, pre + ".self_attn", a.sa, batch, c.nhead, dr1, g);
    dx = dr1 + dsq + dskv;
  }
  // tgt_e = bn(embed(tgt)).
  Matrix<T> d_tgt_embedded = dx;
  if (c.add_bn) {
    const BatchNormStats<T> stats{ToVector(Lookup(buffers, "bn.running_mean")),
                                  ToVector(Lookup(buffers, "bn.running_var")), 0};
    const Vector<T> w = ToVector(Lookup(p, "bn.weight"));
    const BatchNormOptions eval{c.bn_eps, 0.1, /*training=*/false};
    const BatchNormGrads<T> bg = BatchNormBackward<T>(act.tgt_embedded, &w, true, &stats, eval,
                                                      FromMatrix<T>(dx, act.tgt_embedded.shape));
    AccumulateInto(g, "bn.weight", FromVector<T>(bg.weight, {c.batch_size}));
    AccumulateInto(g, "bn.bias", FromVector<T>(bg.bias, {c.batch_size}));
    d_tgt_embedded = ToMatrix(bg.input);
  }
  AccumulateInto(
      g, "embed_tokens.weight",
      FromMatrix<T>(EmbeddingBackward<T>(c.vocab_size, act.tgt_ids, d_tgt_embedded), table.shape));

  // Encoder.
  dx = LayerNormAtBackward(p, "transformer.encoder.norm", true, act.enc_out, dmemory, g, eps);
  for (int64_t i = c.num_encoder_layers; i-- > 0;) {
    const std::string pre = Prefixes::Encoder(i);
    const EncoderActivations<T>& a = act.enc[static_cast<size_t>(i)];
    const Matrix<T> dr2 = LayerNormAtBackward(p, pre + ".norm2", true, a.r2, dx, g, eps);
    const Matrix<T> dy1 = dr2 + FfBackward(p, pre, a.ff, dr2, g);
    const Matrix<T> dr1 = LayerNormAtBackward(p, pre + ".norm1", true, a.r1, dy1, g, eps);
    const auto [dsq, dskv] = MhaBackward(p, pre + ".self_attn", a.sa, batch, c.nhead, dr1, g);
    dx = dr1 + dsq + dskv;
  }
  // src_e = embed(src) + buffers.
  AccumulateInto(g, "embed_tokens.weight",
                 FromMatrix<T>(EmbeddingBackward<T>(c.vocab_size, act.src_ids, dx), table.shape));
  return r;
}

template class TransformerWithSharedParams<float>;
template class TransformerWithSharedParams<double>;

}  // namespace fsdp::reference
