#include "engine/nn/transformer_layers.h"

#include "engine/functional/functional.h"
#include "engine/nn/init.h"

namespace fsdp::nn {

namespace F = ::fsdp;  // the differentiable functional API

namespace {

// [L, N, E] → [N, H, L, head_dim], as multi_head_attention_forward reshapes q/k/v:
// view(L, N*H, hd).transpose(0, 1) then view(N, H, L, hd).
Tensor SplitHeads(const Tensor& x, int64_t num_heads) {
  const int64_t len = x.size(0);
  const int64_t bsz = x.size(1);
  const int64_t head_dim = x.size(2) / num_heads;
  Tensor t = F::transpose(F::view(x, {len, bsz * num_heads, head_dim}), 0, 1);
  return F::view(t, {bsz, num_heads, len, head_dim});
}

}  // namespace

// ---- MultiheadAttention ------------------------------------------------------------------------

MultiheadAttention::MultiheadAttention(int64_t embed_dim, int64_t num_heads, double dropout,
                                       bool bias)
    : Cloneable<MultiheadAttention>("MultiheadAttention"),
      embed_dim_(embed_dim),
      num_heads_(num_heads),
      dropout_(dropout) {
  FSDP_CHECK(num_heads > 0 && embed_dim % num_heads == 0,
             "MultiheadAttention: embed_dim must be divisible by num_heads (embed_dim ", embed_dim,
             ", num_heads ", num_heads, ")");
  register_parameter("in_proj_weight", Tensor::empty({3 * embed_dim, embed_dim}));
  register_parameter("q_proj_weight", Tensor());
  register_parameter("k_proj_weight", Tensor());
  register_parameter("v_proj_weight", Tensor());
  register_parameter("in_proj_bias", bias ? Tensor::empty({3 * embed_dim}) : Tensor());
  register_module("out_proj",
                  std::make_shared<NonDynamicallyQuantizableLinear>(embed_dim, embed_dim, bias));
  reset_parameters();
}

void MultiheadAttention::reset_parameters() {
  Tensor w = parameter("in_proj_weight");
  init::xavier_uniform_(w);
  Tensor b = parameter("in_proj_bias");
  if (b.defined()) {
    init::zeros_(b);
    Tensor out_bias = child("out_proj")->parameter("bias");
    init::zeros_(out_bias);
  }
}

Tensor MultiheadAttention::attend(const Tensor& query, const Tensor& key, const Tensor& value) {
  FSDP_CHECK(query.dim() == 3 && query.size(2) == embed_dim_,
             "MultiheadAttention: expected query of shape [L, N, ", embed_dim_, "], got ",
             ShapeStr(query.sizes()));
  const int64_t tgt_len = query.size(0);
  const int64_t bsz = query.size(1);
  const int64_t e = embed_dim_;
  const Tensor w = parameter("in_proj_weight");
  const Tensor b = parameter("in_proj_bias");
  Tensor q, k, v;
  if (query.is_same(key) && key.is_same(value)) {
    // Self-attention: one packed projection, unflattened into q, k, v.
    Tensor proj = F::view(F::linear(query, w, b), {tgt_len, bsz, 3, e});
    q = F::select(proj, 2, 0);
    k = F::select(proj, 2, 1);
    v = F::select(proj, 2, 2);
  } else if (key.is_same(value)) {
    // Shared key/value (encoder-decoder attention): q alone, k and v packed.
    const std::vector<Tensor> ws = F::split(w, std::vector<int64_t>{e, 2 * e}, 0);
    std::vector<Tensor> bs = {Tensor(), Tensor()};
    if (b.defined()) bs = F::split(b, std::vector<int64_t>{e, 2 * e}, 0);
    q = F::linear(query, ws[0], bs[0]);
    Tensor kv = F::view(F::linear(key, ws[1], bs[1]), {key.size(0), key.size(1), 2, e});
    k = F::select(kv, 2, 0);
    v = F::select(kv, 2, 1);
  } else {
    // Three distinct inputs (_in_projection with w.chunk(3)).
    const std::vector<Tensor> ws = F::chunk(w, 3, 0);
    std::vector<Tensor> bs = {Tensor(), Tensor(), Tensor()};
    if (b.defined()) bs = F::chunk(b, 3, 0);
    q = F::linear(query, ws[0], bs[0]);
    k = F::linear(key, ws[1], bs[1]);
    v = F::linear(value, ws[2], bs[2]);
  }
  Tensor out = F::scaled_dot_product_attention(SplitHeads(q, num_heads_), SplitHeads(k, num_heads_),
                                               SplitHeads(v, num_heads_), Tensor(),
                                               is_training() ? dropout_ : 0.0, false);
  // [N, H, L, hd] → [L, N, H, hd] → [L * N, E].
  out = F::view(F::permute(out, {2, 0, 1, 3}), {bsz * tgt_len, e});
  ModulePtr out_proj = child("out_proj");
  out = F::linear(out, out_proj->parameter("weight"), out_proj->parameter("bias"));
  return F::view(out, {tgt_len, bsz, e});
}

Value MultiheadAttention::forward(const Value& qkv) {
  FSDP_CHECK(qkv.is_tuple() && qkv.size() == 3,
             "MultiheadAttention: expected the tuple (query, key, value), got ", qkv.str());
  return attend(qkv[0].tensor(), qkv[1].tensor(), qkv[2].tensor());
}

// ---- Encoder / decoder layers ------------------------------------------------------------------

TransformerEncoderLayer::TransformerEncoderLayer(int64_t d_model, int64_t nhead,
                                                 int64_t dim_feedforward, double dropout,
                                                 double layer_norm_eps)
    : Cloneable<TransformerEncoderLayer>("TransformerEncoderLayer") {
  register_module("self_attn", std::make_shared<MultiheadAttention>(d_model, nhead, dropout));
  register_module("linear1", std::make_shared<Linear>(d_model, dim_feedforward));
  register_module("dropout", std::make_shared<Dropout>(dropout));
  register_module("linear2", std::make_shared<Linear>(dim_feedforward, d_model));
  register_module("norm1", std::make_shared<LayerNorm>(d_model, layer_norm_eps));
  register_module("norm2", std::make_shared<LayerNorm>(d_model, layer_norm_eps));
  register_module("dropout1", std::make_shared<Dropout>(dropout));
  register_module("dropout2", std::make_shared<Dropout>(dropout));
}

Value TransformerEncoderLayer::forward(const Value& src) {
  const Tensor& x0 = src.tensor();
  Tensor sa = call_child("self_attn", Value::Tuple({x0, x0, x0})).tensor();
  Tensor x = call_child("norm1", x0 + call_child("dropout1", sa).tensor()).tensor();
  Tensor ff = call_child("linear1", x).tensor();
  ff = call_child("linear2", call_child("dropout", F::relu(ff))).tensor();
  return call_child("norm2", x + call_child("dropout2", ff).tensor());
}

TransformerDecoderLayer::TransformerDecoderLayer(int64_t d_model, int64_t nhead,
                                                 int64_t dim_feedforward, double dropout,
                                                 double layer_norm_eps)
    : Cloneable<TransformerDecoderLayer>("TransformerDecoderLayer") {
  register_module("self_attn", std::make_shared<MultiheadAttention>(d_model, nhead, dropout));
  register_module("multihead_attn", std::make_shared<MultiheadAttention>(d_model, nhead, dropout));
  register_module("linear1", std::make_shared<Linear>(d_model, dim_feedforward));
  register_module("dropout", std::make_shared<Dropout>(dropout));
  register_module("linear2", std::make_shared<Linear>(dim_feedforward, d_model));
  register_module("norm1", std::make_shared<LayerNorm>(d_model, layer_norm_eps));
  register_module("norm2", std::make_shared<LayerNorm>(d_model, layer_norm_eps));
  register_module("norm3", std::make_shared<LayerNorm>(d_model, layer_norm_eps));
  register_module("dropout1", std::make_shared<Dropout>(dropout));
  register_module("dropout2", std::make_shared<Dropout>(dropout));
  register_module("dropout3", std::make_shared<Dropout>(dropout));
}

Value TransformerDecoderLayer::forward(const Value& tgt_memory) {
  FSDP_CHECK(tgt_memory.is_tuple() && tgt_memory.size() == 2,
             "TransformerDecoderLayer: expected the tuple (tgt, memory), got ", tgt_memory.str());
  const Tensor& x0 = tgt_memory[0].tensor();
  const Tensor& memory = tgt_memory[1].tensor();
  Tensor sa = call_child("self_attn", Value::Tuple({x0, x0, x0})).tensor();
  Tensor x = call_child("norm1", x0 + call_child("dropout1", sa).tensor()).tensor();
  Tensor mha = call_child("multihead_attn", Value::Tuple({x, memory, memory})).tensor();
  x = call_child("norm2", x + call_child("dropout2", mha).tensor()).tensor();
  Tensor ff = call_child("linear1", x).tensor();
  ff = call_child("linear2", call_child("dropout", F::relu(ff))).tensor();
  return call_child("norm3", x + call_child("dropout3", ff).tensor());
}

// ---- Encoder / decoder stacks ------------------------------------------------------------------

TransformerEncoder::TransformerEncoder(const ModulePtr& layer, int64_t num_layers, ModulePtr norm)
    : Cloneable<TransformerEncoder>("TransformerEncoder") {
  auto layers = register_module("layers", std::make_shared<ModuleList>());
  for (int64_t i = 0; i < num_layers; ++i) layers->append(layer->deep_copy());  // _get_clones
  register_module("norm", std::move(norm));
}

Value TransformerEncoder::forward(const Value& src) {
  Value out = src;
  for (const auto& [name, layer] : child("layers")->child_slots()) out = (*layer)(out);
  if (child("norm")) out = call_child("norm", out);
  return out;
}

TransformerDecoder::TransformerDecoder(const ModulePtr& layer, int64_t num_layers, ModulePtr norm)
    : Cloneable<TransformerDecoder>("TransformerDecoder") {
  auto layers = register_module("layers", std::make_shared<ModuleList>());
  for (int64_t i = 0; i < num_layers; ++i) layers->append(layer->deep_copy());
  register_module("norm", std::move(norm));
}

Value TransformerDecoder::forward(const Value& tgt_memory) {
  FSDP_CHECK(tgt_memory.is_tuple() && tgt_memory.size() == 2,
             "TransformerDecoder: expected the tuple (tgt, memory), got ", tgt_memory.str());
  Value out = tgt_memory[0];
  const Value& memory = tgt_memory[1];
  for (const auto& [name, layer] : child("layers")->child_slots()) {
    out = (*layer)(Value::Tuple({out, memory}));
  }
  if (child("norm")) out = call_child("norm", out);
  return out;
}

EncoderDecoderTransformer::EncoderDecoderTransformer(int64_t d_model, int64_t nhead,
                                                     int64_t num_encoder_layers,
                                                     int64_t num_decoder_layers,
                                                     int64_t dim_feedforward, double dropout,
                                                     double layer_norm_eps)
    : Cloneable<EncoderDecoderTransformer>("Transformer") {
  auto encoder_layer = std::make_shared<TransformerEncoderLayer>(d_model, nhead, dim_feedforward,
                                                                 dropout, layer_norm_eps);
  auto encoder_norm = std::make_shared<LayerNorm>(d_model, layer_norm_eps);
  register_module("encoder", std::make_shared<TransformerEncoder>(encoder_layer, num_encoder_layers,
                                                                  encoder_norm));
  auto decoder_layer = std::make_shared<TransformerDecoderLayer>(d_model, nhead, dim_feedforward,
                                                                 dropout, layer_norm_eps);
  auto decoder_norm = std::make_shared<LayerNorm>(d_model, layer_norm_eps);
  register_module("decoder", std::make_shared<TransformerDecoder>(decoder_layer, num_decoder_layers,
                                                                  decoder_norm));
  // _reset_parameters: xavier_uniform_ on every parameter with more than one dimension.
  for (Tensor& p : parameters()) {
    if (p.dim() > 1) init::xavier_uniform_(p);
  }
}

Value EncoderDecoderTransformer::forward(const Value& src_tgt) {
  FSDP_CHECK(src_tgt.is_tuple() && src_tgt.size() == 2,
             "Transformer: expected the tuple (src, tgt), got ", src_tgt.str());
  const Tensor& src = src_tgt[0].tensor();
  const Tensor& tgt = src_tgt[1].tensor();
  FSDP_CHECK(src.dim() == 3 && tgt.dim() == 3 && src.size(1) == tgt.size(1),
             "Transformer: the batch number of src and tgt must be equal (src ",
             ShapeStr(src.sizes()), ", tgt ", ShapeStr(tgt.sizes()), ")");
  Value memory = call_child("encoder", src);
  return call_child("decoder", Value::Tuple({tgt, memory}));
}

}  // namespace fsdp::nn
