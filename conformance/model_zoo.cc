#include "conformance/model_zoo.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <limits>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "conformance/observations.h"
#include "engine/autograd/grad_mode.h"
#include "engine/core/error.h"
#include "engine/core/rng.h"
#include "engine/fsdp1/api.h"
#include "engine/functional/functional.h"
#include "engine/nn/checkpoint.h"
#include "engine/nn/layers.h"
#include "engine/nn/models.h"
#include "engine/optim/adam.h"
#include "engine/optim/sgd.h"
#include "reference/float32_output.h"
#include "reference/models.h"
#include "reference/transformer.h"

namespace fsdp::conformance {

namespace {

// Counter offset of stream s (see [Note: zoo randomness]).
constexpr int kStreamShift = 40;
constexpr uint64_t kWeightStream = 0;
constexpr uint64_t kBufferStream = 1;
constexpr uint64_t kFirstInputStream = 2;

Generator StreamGenerator(uint64_t seed, uint64_t stream) {
  Generator gen(seed);
  gen.set_offset(stream << kStreamShift);
  return gen;
}

double Symmetric(Generator& gen) { return 2.0 * gen.uniform_double() - 1.0; }

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The scale of a weight's uniform draws (see [Note: zoo randomness]).
std::pair<double, double> InitOf(const reference::TensorSpec& spec) {
  if (spec.shape.size() == 2) {
    if (spec.name.find("embeddings") != std::string::npos) return {0.0, 1.0};
    return {0.0, 1.0 / std::sqrt(static_cast<double>(spec.shape[1]))};
  }
  if (spec.shape.size() == 1 && EndsWith(spec.name, "weight")) return {1.0, 0.2};
  return {0.0, 0.1};
}

// ---- The TP integration test's TestModel (MLPModule + RMSNormPython) ---------------------------

// test_fsdp_tp_integration.py's local `TestModel`: mlp = MLPModule, mlp_norm = RMSNormPython(10);
// forward mlp(mlp_norm(x)), or mlp_norm(mlp(x)) with `norm_last` (so that the norm's input
// gradient, through rsqrt, pow and mean over a dim, reaches the MLP's parameters).
// Configuration-only members; thread-safety as nn::Module.
class TpTestModel : public nn::Cloneable<TpTestModel> {
 public:
  explicit TpTestModel(bool norm_last = false)
      : nn::Cloneable<TpTestModel>("TestModel"), norm_last_(norm_last) {
    register_module("mlp", std::make_shared<nn::MLPModule>());
    register_module("mlp_norm", std::make_shared<nn::RMSNormPython>(10));
  }
  nn::Value forward(const nn::Value& x) override {
    if (norm_last_) return call_child("mlp_norm", call_child("mlp", x));
    return call_child("mlp", call_child("mlp_norm", x));
  }

 private:
  bool norm_last_;
};

// ---- GatedNorms (the suite's own op-coverage model) ---------------------------------------------

// reference::GatedNorms' engine module: shift [dim], scale and gain [1, 1] registered on the
// root before its children (named_parameters lists them first), net = Linear(dim, dim,
// bias=False), bn = BatchNorm1d(dim), norm = nn.RMSNorm(dim, eps) (default eps=None); forward
// (scale + gain) * softmax(n, -1) * n with n = norm(bn(net(x)) - shift). Parameter values come from
// the zoo's weights. Configuration-only; thread-safety as nn::Module.
class GatedNormsModule : public nn::Cloneable<GatedNormsModule> {
 public:
  GatedNormsModule(int64_t dim, std::optional<double> rms_norm_eps)
      : nn::Cloneable<GatedNormsModule>("GatedNorms") {
    register_parameter("shift", Tensor::zeros({dim}, DType::kFloat32));
    register_parameter("scale", Tensor::ones({1, 1}, DType::kFloat32));
    register_parameter("gain", Tensor::zeros({1, 1}, DType::kFloat32));
    register_module("net", std::make_shared<nn::Linear>(dim, dim, /*bias=*/false));
    register_module("bn", std::make_shared<nn::BatchNorm1d>(dim));
    register_module("norm", std::make_shared<nn::RMSNorm>(dim, rms_norm_eps));
  }
  nn::Value forward(const nn::Value& x) override {
    const Tensor c = call_child("bn", call_child("net", x)).tensor() - parameter("shift");
    const Tensor n = call_child("norm", c).tensor();
    return (parameter("scale") + parameter("gain")) * softmax(n, -1) * n;
  }
};

// ---- OpMix (the suite's own op-coverage model) -----------------------------------------------

// reference::OpMix's engine module: log_temperature [dim / 2] on the root, proj =
// Linear(dim, dim, bias=False); forward c * log(1 + s * s) - c.mean() with
// c = cat([h[:, :k] / exp(log_temperature), sqrt(h[:, k:] * h[:, k:] + 1)], 1),
// s = c.sum(1).unsqueeze(1) (a sum over a dim without keepdim), h = proj(x).
// Configuration-only; thread-safety as nn::Module.
class OpMixModule : public nn::Cloneable<OpMixModule> {
 public:
  explicit OpMixModule(int64_t dim) : nn::Cloneable<OpMixModule>("OpMix"), dim_(dim) {
    register_parameter("log_temperature", Tensor::zeros({dim / 2}, DType::kFloat32));
    register_module("proj", std::make_shared<nn::Linear>(dim, dim, /*bias=*/false));
  }
  nn::Value forward(const nn::Value& x) override {
    const int64_t k = dim_ / 2;
    const Tensor h = call_child("proj", x).tensor();
    const Tensor b = narrow(h, 1, k, dim_ - k);
    const Tensor c =
        cat({narrow(h, 1, 0, k) / exp(parameter("log_temperature")), sqrt(b * b + 1.0)}, 1);
    const Tensor s = unsqueeze(sum(c, {1}, /*keepdim=*/false), 1);
    return c * log(s * s + 1.0) - mean(c);
  }

 private:
  int64_t dim_;
};

// ---- OpProducts (the suite's own op-coverage model) -------------------------------------------

// reference::OpProducts' engine module: u and gain [dim / 2] on the root, proj =
// Linear(dim, dim, bias=False); forward y * gain.expand(N, k).clone() + (-a) * dot(u, gain) +
// a * layer_norm(b, {k}) (no weight, no bias) with
// a, b = h.split(k, 1), q = 1 - reciprocal(b * b + 1), y = mv(bmm(a.unsqueeze(2),
// q.unsqueeze(1)).reshape(N * k, k), u).view(N, k), h = proj(x). Configuration-only;
// thread-safety as nn::Module.
class OpProductsModule : public nn::Cloneable<OpProductsModule> {
 public:
  explicit OpProductsModule(int64_t dim)
      : nn::Cloneable<OpProductsModule>("OpProducts"), dim_(dim) {
    register_parameter("u", Tensor::zeros({dim / 2}, DType::kFloat32));
    register_parameter("gain", Tensor::zeros({dim / 2}, DType::kFloat32));
    register_module("proj", std::make_shared<nn::Linear>(dim, dim, /*bias=*/false));
  }
  nn::Value forward(const nn::Value& x) override {
    const int64_t k = dim_ / 2;
    const std::vector<Tensor> ab = split(call_child("proj", x).tensor(), k, 1);
    const int64_t n = ab[0].size(0);
    const Tensor q = rsub(reciprocal(ab[1] * ab[1] + 1.0), 1.0);
    const Tensor o = bmm(unsqueeze(ab[0], 2), unsqueeze(q, 1));
    const Tensor y = view(mv(reshape(o, {n * k, k}), parameter("u")), {n, k});
    const Tensor gain = parameter("gain");
    return y * clone(expand(gain, {n, k})) + neg(ab[0]) * dot(parameter("u"), gain) +
           ab[0] * layer_norm(ab[1], {k});
  }

 private:
  int64_t dim_;
};

// ---- PaddedLM (the suite's own op-coverage model) ---------------------------------------------

// nn.Embedding(num_embeddings, embedding_dim, padding_idx=...) for PaddedLMModule: the weight
// row `padding_idx` is looked up as any other and gets no gradient (F.embedding's padding_idx).
// Parameter values come from the zoo's weights. Configuration-only; thread-safety as
// nn::Module.
class PaddingEmbedding : public nn::Cloneable<PaddingEmbedding> {
 public:
  PaddingEmbedding(int64_t num_embeddings, int64_t embedding_dim, int64_t padding_idx)
      : nn::Cloneable<PaddingEmbedding>("Embedding"), padding_idx_(padding_idx) {
    register_parameter("weight", Tensor::zeros({num_embeddings, embedding_dim}, DType::kFloat32));
  }
  nn::Value forward(const nn::Value& ids) override {
    return embedding(ids.tensor(), parameter("weight"), padding_idx_);
  }

 private:
  int64_t padding_idx_;
};

// reference::PaddedLm's engine module: attn_bias [L, L] on the root, tok_embeddings =
// Embedding(V, D, padding_idx), qkv = Linear(D, 3D, bias=False), output = Linear(D, V); forward
// on tokens [N, L]: h = tok_embeddings(tokens), q, k, v = qkv(h).split(D, -1) each viewed
// [N, L, H, D / H] and transposed to [N, H, L, D / H], a = scaled_dot_product_attention(q, k, v,
// attn_mask=attn_bias, scale=1 / (D / H)), logits = output(h + a.transpose(1, 2).reshape(N, L,
// D)), then cross_entropy(logits[:, :-1].reshape(-1, V), tokens[:, 1:].reshape(-1),
// ignore_index=padding_idx).reshape(1). With `negative_padding_idx` the Embedding is given
// padding_idx - V, the same row (F.embedding adds num_embeddings to a negative padding_idx).
// Configuration-only; thread-safety as nn::Module.
class PaddedLmModule : public nn::Cloneable<PaddedLmModule> {
 public:
  PaddedLmModule(const reference::PaddedLmConfig& c, bool negative_padding_idx)
      : nn::Cloneable<PaddedLmModule>("PaddedLM"), c_(c) {
    register_parameter("attn_bias", Tensor::zeros({c.seq_len, c.seq_len}, DType::kFloat32));
    const int64_t embedding_padding_idx =
        negative_padding_idx ? c.padding_idx - c.vocab_size : c.padding_idx;
    register_module("tok_embeddings",
                    std::make_shared<PaddingEmbedding>(c.vocab_size, c.dim, embedding_padding_idx));
    register_module("qkv", std::make_shared<nn::Linear>(c.dim, 3 * c.dim, /*bias=*/false));
    register_module("output", std::make_shared<nn::Linear>(c.dim, c.vocab_size));
  }
  nn::Value forward(const nn::Value& input) override {
    const Tensor& tokens = input.tensor();
    const int64_t n = tokens.size(0), len = tokens.size(1), hd = c_.dim / c_.n_heads;
    const Tensor h = call_child("tok_embeddings", tokens).tensor();
    std::vector<Tensor> qkv = split(call_child("qkv", h).tensor(), c_.dim, 2);
    for (Tensor& t : qkv) t = transpose(view(t, {n, len, c_.n_heads, hd}), 1, 2);
    const Tensor a = scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], parameter("attn_bias"),
                                                  0.0, false, 1.0 / static_cast<double>(hd));
    const Tensor logits =
        call_child("output", h + reshape(transpose(a, 1, 2), {n, len, c_.dim})).tensor();
    const Tensor loss =
        cross_entropy(reshape(narrow(logits, 1, 0, len - 1), {-1, c_.vocab_size}),
                      reshape(narrow(tokens, 1, 1, len - 1), {-1}), "mean", c_.padding_idx);
    return reshape(loss, {1});
  }

 private:
  reference::PaddedLmConfig c_;
};

// ---- Kinds -------------------------------------------------------------------------------------

nn::ContainerType ParseContainerType(const std::string& name) {
  if (name == "list") return nn::ContainerType::kList;
  if (name == "namedtuple") return nn::ContainerType::kNamedTuple;
  if (name == "tuple") return nn::ContainerType::kTuple;
  if (name == "dict") return nn::ContainerType::kDict;
  FSDP_THROW(ErrorCode::kInvalidArgument, "container_type must be list, namedtuple, tuple or dict; got '",
             name, "'");
}

ParamSpec Batch(int64_t rows) {
  return ParamSpec::SizeInt("batch", "rows of each step's input (per rank)", rows, /*minimum=*/1);
}

std::vector<ZooModelKind> MakeKinds() {
  std::vector<ZooModelKind> kinds;
  kinds.push_back(
      {"transformer",
       "common_dtensor.py Transformer(ModelArgs(dropout_p=0)) on randint "
       "tokens",
       "test_fully_shard_comm.py::TestFullyShardCommunication::"
       "test_fully_shard_communication_count",
       {ParamSpec::SizeInt("n_layers", "ModelArgs.n_layers", 2, /*minimum=*/1),
        ParamSpec::SizeInt("vocab_size", "ModelArgs.vocab_size", 8,
                           /*minimum=*/1),
        ParamSpec::SizeInt("max_seq_len", "ModelArgs.max_seq_len", 16,
                           /*minimum=*/1),
        ParamSpec::SizeInt("dim", "ModelArgs.dim", 16, /*minimum=*/1),
        ParamSpec::SizeInt("n_heads", "ModelArgs.n_heads", 4, /*minimum=*/1),
        ParamSpec::SizeBool("weight_tying", "ModelArgs.weight_tying", true),
        ParamSpec::SizeBool("block_kwargs",
                            "the Transformer calls each block as layer(x=h), its input a keyword "
                            "argument (FSDP must hook and cast keyword tensors as positional ones)",
                            false),
        ParamSpec::SizeBool("checkpoint_activations",
                            "ModelArgs.checkpoint_activations: each block's forward under "
                            "torch.utils.checkpoint (non-reentrant), recomputed in backward with "
                            "FSDP's hooks running again (its pre-forward must then do nothing)",
                            false),
        ParamSpec::SizeBool("checkpoint_wrapper",
                            "apply_activation_checkpointing(model, check_fn=isinstance(m, "
                            "(TransformerBlock, FeedForward))) after construction: each block "
                            "in a CheckpointWrapper (non-reentrant), its FeedForward in a nested "
                            "one, the recompute called with the block's own args and kwargs "
                            "(layer(x=h) with block_kwargs); the state dict without the "
                            "wrapper's prefix",
                            false),
        ParamSpec::SizeInt("seq_len", "tokens per input row (<= max_seq_len)", 16, /*minimum=*/1),
        Batch(2)},
       /*sgd_lr=*/3e-4,
       /*float32_output=*/true});
  kinds.push_back({"mlp",
                   "common_fsdp.py MLP(dim)",
                   "test_fully_shard_autograd.py::TestFullyShardPostAccGradHookMultiThread:"
                   ":"
                   "test_post_acc_grad_hook_runs",
                   {ParamSpec::SizeInt("dim", "MLP dim", 8, /*minimum=*/1),
                    ParamSpec::SizeInt("dim_multiplier", "MLP dim_multiplier", 4,
                                       /*minimum=*/1),
                    ParamSpec::SizeBool("with_buffer", "MLP with_buffer", false), Batch(2)}});
  kinds.push_back(
      {"mlp_stack",
       "common_fsdp.py MLPStack(mlp_dim)",
       "common_fsdp.py::MLPStack",
       {ParamSpec::SizeInt("mlp_dim", "MLPStack mlp_dim", 8, /*minimum=*/1), Batch(2)}});
  kinds.push_back(
      {"mlp_stack_seq_parallel",
       "common_fsdp.py MLPStack(mlp_dim, with_seq_parallel=True): the three MLPs, then "
       "LayerNorm(mlp_dim, bias=False) as module \"3\"; each input row is [seq_len, mlp_dim], so "
       "dim 1 of a batch is the sequence dim SequenceParallel(sequence_dim=1) shards",
       "test_fully_shard_training.py::TestFullyShardHSDP3DTraining::test_3d_mlp_with_nd_mesh",
       {ParamSpec::SizeInt("mlp_dim", "MLPStack mlp_dim", 8, /*minimum=*/1),
        ParamSpec::SizeInt("seq_len", "sequence positions per input row", 4, /*minimum=*/1),
        Batch(2)}});
  kinds.push_back(
      {"double_linear",
       "common_fsdp.py DoubleLinear(dim); two outputs: loss (out1 * out2).sum() before "
       "loss_switch_step, then of output switched_output only (out1, the seed's)",
       "test_fully_shard_autograd.py::TestFullyShardAutograd::test_unused_"
       "forward_output",
       {ParamSpec::Axis("use_second_linear", "DoubleLinear use_second_linear", {"True", "False"}),
        ParamSpec::SizeInt("dim", "DoubleLinear dim", 24, /*minimum=*/1),
        ParamSpec::SizeInt("loss_switch_step",
                           "first step whose loss reads one output (switched_output)", 3),
        ParamSpec::SizeInt("switched_output",
                           "the output the loss reads from loss_switch_step on: 0 (out1, the "
                           "seed's) or 1 (out2; the other output's hooks alone see a gradient)",
                           0, /*minimum=*/0),
        Batch(2)}});
  kinds.push_back({"nontensor_activations",
                   "test_nontensor_activations' Sequential(ToContainerType, Module(dim) "
                   "x3, "
                   "FromContainerType): activations wrapped in a list, named tuple, tuple "
                   "or dict between "
                   "the blocks",
                   "test_fully_shard_autograd.py::TestFullyShardAutograd::test_nontensor_"
                   "activations",
                   {ParamSpec::Axis("container_type", "the container wrapping the activations",
                                    {"list", "namedtuple", "tuple", "dict"}),
                    ParamSpec::SizeInt("dim", "Module dim", 24, /*minimum=*/1), Batch(2)},
                   /*sgd_lr=*/1e-3,
                   /*float32_output=*/false,
                   /*relu_output=*/true});
  kinds.push_back({"mlp_module",
                   "common_dtensor.py MLPModule (10 -> 16 -> 10)",
                   "test_fsdp_tp_integration.py::TestTPFSDPIntegration::"
                   "test_fsdp_tp_extension_grad",
                   {ParamSpec::SizeBool("bias", "MLPModule bias", true), Batch(2)}});
  kinds.push_back({"mlp_rms_norm",
                   "TestModel: MLPModule after RMSNormPython(10)",
                   "test_fsdp_tp_integration.py::TestTPFSDPIntegration::"
                   "test_fsdp_tp_extension_grad",
                   {ParamSpec::Axis("norm_position",
                                    "first: the test's mlp(mlp_norm(x)); last: mlp_norm(mlp(x)), "
                                    "whose norm backpropagates into the MLP (rsqrt, pow and "
                                    "mean(-1, keepdim=True) backward)",
                                    {"first", "last"}),
                    Batch(2)}});
  kinds.push_back({"tp_simple_model",
                   "SimpleModel of the TP integration test (5 -> 8 -> 4 -> 12) on [batch, 3, 5]",
                   "test_fsdp_tp_integration.py::TestTPFSDPIntegration::test_fsdp_tp_integration",
                   {Batch(2)}});
  kinds.push_back(
      {"state_dict_model",
       "the state-dict seed's Model: outer(inner(x) + inner(x))",
       "test_fsdp_state_dict.py::TestFSDPStateDict::test_local_state_dict_reshard",
       {ParamSpec::SizeBool("register_buffers", "Model register_buffers", false), Batch(4)}});
  kinds.push_back(
      {"gated_norms",
       "the suite's GatedNorms: (scale + gain) * softmax(n, -1) * n, n = "
       "RMSNorm(BatchNorm1d(Linear(x)) - shift) (training-mode BatchNorm, nn.RMSNorm eps=None, "
       "softmax, a subtracted parameter, two [1, 1] parameters summed and broadcast along both "
       "dims)",
       "none (the suite's own model: no seed model differentiates these ops; each is "
       "torch.nn / torch.nn.functional as documented)",
       {ParamSpec::SizeInt("dim", "features", 8, /*minimum=*/1),
        ParamSpec::SizeString("rms_norm_eps",
                              "nn.RMSNorm's eps: None (torch.finfo(dtype).eps of the dtype it "
                              "computes in) or a number",
                              "None"),
        Batch(4)}});
  kinds.push_back(
      {"op_mix",
       "the suite's OpMix: c * log(1 + s * s) - c.mean(), c = cat([h[:, :k] / exp(t), "
       "sqrt(h[:, k:] ** 2 + 1)], 1), s = c.sum(1).unsqueeze(1), h = Linear(x) (division, exp, "
       "log, sqrt, slices, cat, sum over a dim, mean)",
       "none (the suite's own model: no seed model differentiates these ops; each is torch's "
       "as documented)",
       {ParamSpec::SizeInt("dim", "features (even)", 6, /*minimum=*/2), Batch(4)}});
  kinds.push_back(
      {"op_products",
       "the suite's OpProducts: y * gain.expand(N, k).clone() + (-a) * dot(u, gain) + a * "
       "layer_norm(b, (k,)), y = mv(bmm("
       "a.unsqueeze(2), q.unsqueeze(1)).reshape(N * k, k), u).view(N, k), q = 1 - reciprocal(b * b "
       "+ 1), a, b = Linear(x).split(k, 1) (split, reciprocal, rsub, bmm, mv, expand, clone, neg, "
       "dot, layer_norm without elementwise affine)",
       "none (the suite's own model: no seed model differentiates these ops; each is torch's "
       "as documented)",
       {ParamSpec::SizeInt("dim", "features (even)", 6, /*minimum=*/2), Batch(4)}});
  kinds.push_back(
      {"padded_lm",
       "the suite's PaddedLM: tok_embeddings = Embedding(V, D, padding_idx), q, k, v = "
       "qkv(h).split(D, -1) in n_heads heads, a = scaled_dot_product_attention(q, k, v, "
       "attn_mask=attn_bias, scale=1 / head_dim) with attn_bias an [L, L] parameter, logits = "
       "output(h + a), loss = cross_entropy(logits[:, :-1], tokens[:, 1:], "
       "ignore_index=padding_idx).reshape(1) (the padding row gets no gradient; an additive float "
       "mask that requires grad; an explicit scale; the mean over the targets not ignored)",
       "none (the suite's own model: no seed model uses padding_idx, an attn_mask, an explicit "
       "scale or ignore_index; each is torch's as documented)",
       {ParamSpec::SizeInt("vocab_size", "Embedding num_embeddings and the classes", 5,
                           /*minimum=*/2),
        ParamSpec::SizeInt("dim", "embedding dim (a multiple of n_heads)", 8, /*minimum=*/1),
        ParamSpec::SizeInt("n_heads", "attention heads", 2, /*minimum=*/1),
        ParamSpec::SizeInt("seq_len", "tokens per input row (attn_bias is [seq_len, seq_len])", 6,
                           /*minimum=*/2),
        ParamSpec::SizeInt("padding_idx", "Embedding padding_idx and cross_entropy ignore_index", 0,
                           /*minimum=*/0),
        ParamSpec::SizeBool("negative_padding_idx",
                            "give the Embedding padding_idx - vocab_size (the same row: "
                            "nn.Embedding and F.embedding add num_embeddings to a negative "
                            "padding_idx); cross_entropy keeps ignore_index=padding_idx",
                            false),
        Batch(4)}});
  return kinds;
}

// The value of `key` in `params`, or the kind's default.
const std::string& ValueOf(const ZooModelKind& kind, const CaseParams& params,
                           const std::string& key) {
  if (params.has(key)) return params.GetString(key);
  for (const ParamSpec& p : kind.params) {
    if (p.name == key) return p.default_value();
  }
  FSDP_THROW(ErrorCode::kInternal, "zoo model ", kind.name, " has no parameter ", key);
}

// IEEE 754 round-to-nearest-even of `v` to a binary format with `precision` significand bits
// (the implicit one included), `min_exponent` the exponent of its smallest normal (2^min_exponent)
// and `max_finite` its largest finite value; beyond it, infinity. Computed in double from the
// rule (frexp / nearbyint), independently of the engine's Half / BFloat16 conversions, so that a
// judge comparing with it sees a conversion that truncates or rounds ties away.
double RoundToBinaryFormat(double v, int precision, int min_exponent, double max_finite) {
  if (v == 0 || !std::isfinite(v)) return v;
  int e = 0;
  std::frexp(v, &e);  // |v| = m * 2^e, m in [0.5, 1): the last bit has weight 2^(e - precision)
  const int quantum = std::max(e - precision, min_exponent - precision + 1);  // subnormals
  const double r = std::ldexp(std::nearbyint(std::ldexp(v, -quantum)), quantum);
  if (std::fabs(r) > max_finite) return std::copysign(INFINITY, v);
  return r;
}

}  // namespace

// ---- Conversions -------------------------------------------------------------------------------

std::vector<double> RoundTo(std::vector<double> values, DType dtype) {
  switch (dtype) {
    case DType::kFloat64:
      break;
    case DType::kFloat32:
      for (double& v : values) v = static_cast<float>(v);
      break;
    // Through float first, as PyTorch converts a double (c10::Half and c10::BFloat16 are
    // constructed from a float).
    case DType::kFloat16:
      for (double& v : values) {
        v = RoundToBinaryFormat(static_cast<float>(v), 11, -14, 65504.0);
      }
      break;
    case DType::kBFloat16:
      for (double& v : values) {
        v = RoundToBinaryFormat(static_cast<float>(v), 8, -126, 0x1.fep127);
      }
      break;
    case DType::kInt64:
      FSDP_THROW(ErrorCode::kInvalidArgument, "RoundTo: int64 is not a floating dtype");
  }
  return values;
}

reference::RefTensor RoundTo(reference::RefTensor tensor, DType dtype) {
  tensor.data = RoundTo(std::move(tensor.data), dtype);
  return tensor;
}

reference::RefTensorMap RoundTo(reference::RefTensorMap tensors, DType dtype) {
  for (auto& [name, t] : tensors) t = RoundTo(std::move(t), dtype);
  return tensors;
}

Tensor ToTensor(const reference::RefTensor& t, DType dtype, Device device) {
  return Tensor::from_doubles(t.data, t.shape, dtype, device);
}

Tensor ToTensor(const reference::IndexTensor& t, Device device) {
  return Tensor::from_int64s(t.data, t.shape, device);
}

reference::RefTensor ToRef(const Tensor& t) {
  FSDP_CHECK(t.defined(), "ToRef: undefined tensor");
  return reference::RefTensor(t.sizes(), t.to(Device::CPU()).to_doubles());
}

reference::RefTensorMap ParametersOf(const nn::Module& module) {
  reference::RefTensorMap out;
  for (const auto& [name, p] : module.named_parameters()) {
    if (p.defined()) out[name] = ToRef(p);
  }
  return out;
}

std::vector<std::string> ParameterNamesOf(const nn::Module& module) {
  std::vector<std::string> names;
  for (const auto& [name, p] : module.named_parameters())
    names.push_back(fsdp1::CleanTensorName(name));
  return names;
}

reference::RefTensorMap GradientsOf(const nn::Module& module) {
  reference::RefTensorMap out;
  for (const auto& [name, p] : module.named_parameters()) {
    if (p.defined() && p.grad().defined()) out[fsdp1::CleanTensorName(name)] = ToRef(p.grad());
  }
  return out;
}

std::vector<std::string> ParametersWithoutGrad(const nn::Module& module) {
  std::vector<std::string> names;
  for (const auto& [name, p] : module.named_parameters()) {
    if (p.defined() && !p.grad().defined()) names.push_back(fsdp1::CleanTensorName(name));
  }
  return names;
}

nn::StateDict MakeStateDict(nn::Module& module, const reference::RefTensorMap& params,
                            const reference::RefTensorMap& buffers, DType dtype, Device device) {
  // Canonical FQN of every parameter tensor (first name wins, as named_parameters() dedupes).
  std::vector<std::pair<const TensorImpl*, std::string>> canonical;
  for (const auto& [name, p] : module.named_parameters()) {
    if (p.defined()) canonical.emplace_back(p.impl(), fsdp1::CleanTensorName(name));
  }
  nn::StateDict out;
  const nn::StateDict current = module.state_dict("", /*keep_vars=*/true);
  for (const auto& [key, tensor] : current) {
    std::string source = key;
    for (const auto& [impl, name] : canonical) {
      if (impl == tensor.impl()) {
        source = name;
        break;
      }
    }
    const reference::RefTensor* value = nullptr;
    if (auto it = params.find(source); it != params.end()) {
      value = &it->second;
    } else if (auto jt = buffers.find(source); jt != buffers.end()) {
      value = &jt->second;
    }
    FSDP_CHECK_CODE(ErrorCode::kNotFound, value != nullptr, "MakeStateDict: no value for '", key,
                    "' of ", module.type_name(),
                    source == key ? std::string() : " (tied to '" + source + "')");
    const DType entry_dtype = IsFloatingPoint(tensor.dtype()) ? dtype : tensor.dtype();
    out.insert(key, ToTensor(*value, entry_dtype, device));
  }
  return out;
}

void LoadWeights(nn::Module& module, const reference::RefTensorMap& params,
                 const reference::RefTensorMap& buffers, DType dtype) {
  Device device = Device::CPU();
  const auto all = module.named_parameters();
  if (!all.empty() && all.front().second.defined()) device = all.front().second.device();
  module.load_state_dict(MakeStateDict(module, params, buffers, dtype, device));
}

nlohmann::json MapToJson(const reference::RefTensorMap& tensors, const std::string& dtype,
                         const std::string& prefix) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [name, t] : tensors) out[prefix + name] = TensorJson(t.shape, dtype, t.data);
  return out;
}

reference::RefTensorMap MapFromObservations(const std::vector<nlohmann::json>& per_rank, int rank,
                                            const std::string& prefix) {
  const nlohmann::json& tensors = RankObservation(per_rank, rank, kTensors);
  FSDP_CHECK_CODE(ErrorCode::kDataLoss, tensors.is_object(), "rank ", rank,
                  ": tensors must be an object");
  reference::RefTensorMap out;
  for (auto it = tensors.begin(); it != tensors.end(); ++it) {
    if (it.key().compare(0, prefix.size(), prefix) != 0) continue;
    std::vector<double> data = TensorData(per_rank, rank, it.key());
    std::vector<int64_t> shape = TensorShape(per_rank, rank, it.key());
    out[it.key().substr(prefix.size())] = reference::RefTensor(std::move(shape), std::move(data));
  }
  return out;
}

// ---- Judging helpers ---------------------------------------------------------------------------

void ErrorStats::Merge(const ErrorStats& other) {
  max_abs = std::max(max_abs, other.max_abs);
  max_rel = std::max(max_rel, other.max_rel);
  tolerance_used = std::max(tolerance_used, other.tolerance_used);
}

ErrorStats CompareValues(const std::vector<double>& expected, const std::vector<double>& actual,
                         Tolerance tolerance) {
  ErrorStats s;
  const size_t n = std::min(expected.size(), actual.size());
  for (size_t i = 0; i < n; ++i) {
    double abs_err = std::fabs(actual[i] - expected[i]);
    if (std::isnan(abs_err)) abs_err = INFINITY;
    s.max_abs = std::max(s.max_abs, abs_err);
    const double magnitude = std::fabs(expected[i]);
    if (magnitude >= tolerance.atol && magnitude != 0) {
      s.max_rel = std::max(s.max_rel, abs_err / magnitude);
    }
    const double allowed = tolerance.atol + tolerance.rtol * magnitude;
    const double used = allowed > 0 ? abs_err / allowed : (abs_err == 0 ? 0 : INFINITY);
    s.tolerance_used = std::max(s.tolerance_used, used);
  }
  return s;
}

std::map<std::string, double> MaxAbsByFqn(const std::vector<reference::RefTensorMap>& maps) {
  std::map<std::string, double> largest;
  for (const reference::RefTensorMap& map : maps) {
    for (const auto& [fqn, t] : map) {
      double& m = largest[fqn];
      for (double v : t.data) m = std::max(m, std::fabs(v));
    }
  }
  return largest;
}

ErrorStats CheckMapsClose(CheckList& checks, const std::string& name,
                          const reference::RefTensorMap& expected,
                          const reference::RefTensorMap& actual, Tolerance tolerance,
                          const std::map<std::string, double>* atol_scales) {
  std::vector<std::string> missing, extra;
  for (const auto& [k, v] : expected) {
    if (!actual.count(k)) missing.push_back(k);
  }
  for (const auto& [k, v] : actual) {
    if (!expected.count(k)) extra.push_back(k);
  }
  if (!missing.empty() || !extra.empty()) {
    auto join = [](const std::vector<std::string>& v) {
      std::string s;
      for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
      return s.empty() ? std::string("none") : s;
    };
    checks.Fail(name + " FQNs", "missing: " + join(missing) + "; unexpected: " + join(extra));
  }
  // The tolerance of tensor `fqn`: atol times max(1, its scale) when scales are given.
  auto tolerance_of = [&](const std::string& fqn) {
    if (atol_scales == nullptr) return tolerance;
    auto it = atol_scales->find(fqn);
    const double scale = it == atol_scales->end() ? 1.0 : std::max(1.0, it->second);
    return Tolerance{tolerance.atol * scale, tolerance.rtol};
  };
  std::vector<double> e_all, a_all, atol_all;
  ErrorStats stats;
  std::vector<std::string> mismatched;
  for (const auto& [k, e] : expected) {
    auto it = actual.find(k);
    if (it == actual.end()) continue;
    const reference::RefTensor& a = it->second;
    if (a.shape != e.shape) {
      checks.Fail(name + " " + k + " shape", "shape " + reference::ShapeToString(a.shape) +
                                                 ", expected " + reference::ShapeToString(e.shape));
      continue;
    }
    const Tolerance tol = tolerance_of(k);
    stats.Merge(CompareValues(e.data, a.data, tol));
    bool ok = true;
    for (size_t i = 0; i < e.data.size(); ++i) {
      const double err = std::fabs(a.data[i] - e.data[i]);
      if (!(err <= tol.atol + tol.rtol * std::fabs(e.data[i]))) ok = false;
    }
    if (!ok) mismatched.push_back(k);
    e_all.insert(e_all.end(), e.data.begin(), e.data.end());
    a_all.insert(a_all.end(), a.data.begin(), a.data.end());
    atol_all.insert(atol_all.end(), e.data.size(), tol.atol);
  }
  if (atol_scales == nullptr) {
    checks.CheckClose(name, e_all, a_all, tolerance);
  } else {
    std::ostringstream atol_label;
    atol_label << std::setprecision(3) << tolerance.atol
               << " x max(1, the tensor's max |expected|)";
    checks.CheckClose(name, e_all, a_all, atol_all, tolerance.rtol, atol_label.str());
  }
  for (const std::string& k : mismatched) {
    checks.CheckClose(name + " " + k, expected.at(k).data, actual.at(k).data, tolerance_of(k));
  }
  return stats;
}

// ---- Optimizers --------------------------------------------------------------------------------

std::unique_ptr<optim::Optimizer> MakeEngineOptimizer(
    const OptimConfig& config, std::vector<std::pair<std::string, Tensor>> named_params) {
  if (config.kind == "sgd") {
    optim::SGDOptions o;
    o.lr = config.lr;
    o.momentum = config.momentum;
    o.weight_decay = config.weight_decay;
    o.maximize = config.maximize;
    o.nesterov = config.nesterov;
    o.dampening = config.dampening;
    return std::make_unique<optim::SGD>(std::move(named_params), o);
  }
  if (config.kind == "adam") {
    optim::AdamOptions o;
    o.lr = config.lr;
    o.weight_decay = config.weight_decay;
    o.maximize = config.maximize;
    o.amsgrad = config.amsgrad;
    return std::make_unique<optim::Adam>(std::move(named_params), o);
  }
  if (config.kind == "adamw") {
    optim::AdamWOptions o;
    o.lr = config.lr;
    o.weight_decay = config.weight_decay;
    o.maximize = config.maximize;
    o.amsgrad = config.amsgrad;
    return std::make_unique<optim::AdamW>(std::move(named_params), o);
  }
  FSDP_THROW(ErrorCode::kInvalidArgument, "unknown optimizer '", config.kind,
             "'; optimizers: sgd, adam, adamw");
}

std::unique_ptr<reference::Optimizer<double>> MakeOracleOptimizer(const OptimConfig& config) {
  if (config.kind == "sgd") {
    reference::SgdOptions o;
    o.lr = config.lr;
    o.momentum = config.momentum;
    o.weight_decay = config.weight_decay;
    o.maximize = config.maximize;
    o.nesterov = config.nesterov;
    o.dampening = config.dampening;
    return std::make_unique<reference::Sgd<double>>(o);
  }
  if (config.kind == "adam" || config.kind == "adamw") {
    reference::AdamOptions o;
    o.lr = config.lr;
    o.weight_decay = config.weight_decay;
    o.maximize = config.maximize;
    o.amsgrad = config.amsgrad;
    return std::make_unique<reference::Adam<double>>(o, config.kind == "adamw");
  }
  FSDP_THROW(ErrorCode::kInvalidArgument, "unknown optimizer '", config.kind,
             "'; optimizers: sgd, adam, adamw");
}

bool SetToNoneAfterStep(int64_t step) { return step % 2 == 0; }

// ---- ZooInput ----------------------------------------------------------------------------------

Tensor ZooInput::ToEngine(Device device) const {
  if (oracle.tokens) return ToTensor(*oracle.tokens, device);
  FSDP_CHECK(oracle.features.has_value(), "ZooInput holds neither features nor tokens");
  return ToTensor(*oracle.features, dtype, device);
}

ZooInput ZooInput::RankSlice(int rank, int world) const {
  ZooInput out;
  out.oracle = reference::RankSlice(oracle, rank, world);
  out.dtype = dtype;
  return out;
}

int64_t ZooInput::rows() const {
  if (oracle.tokens) return oracle.tokens->shape.at(0);
  return oracle.features ? oracle.features->shape.at(0) : 0;
}

// ---- ZooModel ----------------------------------------------------------------------------------

const std::vector<ZooModelKind>& ZooModel::Kinds() {
  static const std::vector<ZooModelKind>* kinds = new std::vector<ZooModelKind>(MakeKinds());
  return *kinds;
}

const ZooModelKind& ZooModel::Kind(const std::string& name) {
  std::string names;
  for (const ZooModelKind& k : Kinds()) {
    if (k.name == name) return k;
    names += (names.empty() ? "" : ", ") + k.name;
  }
  FSDP_THROW(ErrorCode::kNotFound, "no zoo model '", name, "'; models: ", names);
}

ZooModel ZooModel::Make(const std::string& kind_name, const CaseParams& params) {
  const ZooModelKind& kind = Kind(kind_name);
  CaseParams p;
  for (const ParamSpec& spec : kind.params) p.set(spec.name, ValueOf(kind, params, spec.name));

  ZooModel m;
  m.kind_ = kind_name;
  m.squares_loss_ = params.has("loss") && params.GetString("loss") == "squares";
  m.batch_ = p.GetInt("batch");
  FSDP_CHECK(m.batch_ >= 1, "zoo model ", kind_name, ": batch must be positive, got ", m.batch_);

  if (kind_name == "transformer") {
    nn::ModelArgs args;
    args.n_layers = p.GetInt("n_layers");
    args.vocab_size = p.GetInt("vocab_size");
    args.max_seq_len = p.GetInt("max_seq_len");
    args.dim = p.GetInt("dim");
    args.n_heads = p.GetInt("n_heads");
    args.dropout_p = 0.0;
    args.weight_tying = p.GetBool("weight_tying");
    args.block_kwargs = p.GetBool("block_kwargs");
    args.checkpoint_activations = p.GetBool("checkpoint_activations");
    reference::ModelArgs rargs;
    rargs.n_layers = args.n_layers;
    rargs.vocab_size = args.vocab_size;
    rargs.max_seq_len = args.max_seq_len;
    rargs.dim = args.dim;
    rargs.n_heads = args.n_heads;
    rargs.weight_tying = args.weight_tying;
    const int64_t seq_len = p.GetInt("seq_len");
    FSDP_CHECK(seq_len >= 1 && seq_len <= args.max_seq_len, "zoo transformer: seq_len ", seq_len,
               " must be in [1, max_seq_len = ", args.max_seq_len, "]");
    // The forward ends with `.float()`.
    m.fd_oracle_ = std::make_shared<reference::Transformer<double>>(rargs);
    m.oracle_ = std::make_shared<reference::Float32Output<double>>(m.fd_oracle_);
    const bool checkpoint_wrapper = p.GetBool("checkpoint_wrapper");
    m.build_engine_ = [args, checkpoint_wrapper]() -> nn::ModulePtr {
      auto model = std::make_shared<nn::Transformer>(args);
      if (checkpoint_wrapper) {
        nn::apply_activation_checkpointing(model, [](nn::Module& m) {
          return dynamic_cast<nn::TransformerBlock*>(&m) != nullptr ||
                 dynamic_cast<nn::FeedForward*>(&m) != nullptr;
        });
      }
      return model;
    };
    m.uses_tokens_ = true;
    m.vocab_size_ = args.vocab_size;
    m.input_row_shape_ = {seq_len};
    m.fd_output_module_ = "output";
  } else if (kind_name == "mlp") {
    reference::MlpConfig c;
    c.dim = p.GetInt("dim");
    c.dim_multiplier = p.GetInt("dim_multiplier");
    c.with_buffer = p.GetBool("with_buffer");
    m.oracle_ = std::make_shared<reference::Mlp<double>>(c);
    m.build_engine_ = [c] {
      return std::make_shared<nn::MLP>(c.dim, c.bias, c.with_buffer, c.dim_multiplier);
    };
    m.input_row_shape_ = {c.dim};
  } else if (kind_name == "mlp_stack") {
    reference::MlpStackConfig c;
    c.mlp_dim = p.GetInt("mlp_dim");
    m.oracle_ = std::make_shared<reference::MlpStack<double>>(c);
    m.build_engine_ = [c] { return std::make_shared<nn::MLPStack>(c.mlp_dim); };
    m.input_row_shape_ = {c.mlp_dim};
  } else if (kind_name == "mlp_stack_seq_parallel") {
    reference::MlpStackConfig c;
    c.mlp_dim = p.GetInt("mlp_dim");
    c.with_seq_parallel = true;
    m.oracle_ = std::make_shared<reference::MlpStack<double>>(c);
    m.build_engine_ = [c] {
      return std::make_shared<nn::MLPStack>(c.mlp_dim, /*with_seq_parallel=*/true);
    };
    m.input_row_shape_ = {p.GetInt("seq_len"), c.mlp_dim};
  } else if (kind_name == "double_linear") {
    reference::DoubleLinearConfig c;
    c.dim = p.GetInt("dim");
    c.use_second_linear = p.GetBool("use_second_linear");
    m.oracle_ = std::make_shared<reference::DoubleLinear<double>>(c);
    m.build_engine_ = [c] {
      return std::make_shared<nn::DoubleLinear>(c.dim, c.use_second_linear);
    };
    m.input_row_shape_ = {c.dim};
    if (c.use_second_linear) {
      m.loss_switch_step_ = p.GetInt("loss_switch_step");
      m.switched_output_ = static_cast<int>(p.GetInt("switched_output"));
      FSDP_CHECK(m.switched_output_ <= 1, "switched_output must be 0 or 1, got ",
                 m.switched_output_);
    }
  } else if (kind_name == "nontensor_activations") {
    const int64_t dim = p.GetInt("dim");
    const nn::ContainerType type = ParseContainerType(p.GetString("container_type"));
    // The containers carry the tensor unchanged: numerically three (Linear, ReLU, Linear,
    // ReLU) blocks named "<i>.lin1" / "<i>.lin2" for the Sequential's elements 1..3.
    reference::LinearChainConfig c;
    c.model_name = "NontensorActivations";
    for (int i = 1; i <= 3; ++i) {
      for (const char* lin : {"lin1", "lin2"}) {
        c.stages.push_back({std::to_string(i) + "." + lin, dim, dim, true, true});
      }
    }
    m.oracle_ = std::make_shared<reference::LinearChain<double>>(c);
    m.build_engine_ = [type, dim] { return nn::MakeNontensorActivationsModel(type, dim); };
    m.input_row_shape_ = {dim};
  } else if (kind_name == "mlp_module") {
    reference::MlpModuleConfig c;
    c.bias = p.GetBool("bias");
    m.oracle_ = std::make_shared<reference::MlpModule<double>>(c);
    m.build_engine_ = [c] { return std::make_shared<nn::MLPModule>(c.bias); };
    m.input_row_shape_ = {10};
  } else if (kind_name == "mlp_rms_norm") {
    reference::MlpWithRmsNormConfig c;
    c.norm_last = p.GetString("norm_position") == "last";
    m.oracle_ = std::make_shared<reference::MlpWithRmsNorm<double>>(c);
    m.build_engine_ = [c] { return std::make_shared<TpTestModel>(c.norm_last); };
    m.input_row_shape_ = {10};
  } else if (kind_name == "tp_simple_model") {
    m.oracle_ = std::make_shared<reference::TpSimpleModel<double>>();
    m.build_engine_ = [] { return std::make_shared<nn::SimpleModel>(); };
    m.input_row_shape_ = {3, 5};
  } else if (kind_name == "state_dict_model") {
    reference::StateDictModelConfig c;
    c.register_buffers = p.GetBool("register_buffers");
    m.oracle_ = std::make_shared<reference::StateDictModel<double>>(c);
    m.build_engine_ = [c] { return std::make_shared<nn::StateDictModel>(c.register_buffers); };
    m.input_row_shape_ = {4};
  } else if (kind_name == "gated_norms") {
    reference::GatedNormsConfig c;
    c.dim = p.GetInt("dim");
    // nn.RMSNorm(eps=None) takes torch.finfo(x.dtype).eps of the dtype it computes in.
    const DType dtype =
        params.has("dtype") ? ParseDType(params.GetString("dtype")) : DType::kFloat64;
    c.rms_eps = dtype == DType::kFloat32 ? std::numeric_limits<float>::epsilon()
                                         : std::numeric_limits<double>::epsilon();
    // An explicit eps is used as given.
    std::optional<double> rms_norm_eps;
    if (p.GetString("rms_norm_eps") != "None") {
      rms_norm_eps = std::stod(p.GetString("rms_norm_eps"));
      c.rms_eps = *rms_norm_eps;
    }
    m.oracle_ = std::make_shared<reference::GatedNorms<double>>(c);
    m.build_engine_ = [dim = c.dim, rms_norm_eps] {
      return std::make_shared<GatedNormsModule>(dim, rms_norm_eps);
    };
    m.input_row_shape_ = {c.dim};
  } else if (kind_name == "op_mix") {
    reference::OpMixConfig c;
    c.dim = p.GetInt("dim");
    FSDP_CHECK(c.dim % 2 == 0, "zoo op_mix: dim must be even, got ", c.dim);
    m.oracle_ = std::make_shared<reference::OpMix<double>>(c);
    m.build_engine_ = [dim = c.dim] { return std::make_shared<OpMixModule>(dim); };
    m.input_row_shape_ = {c.dim};
  } else if (kind_name == "op_products") {
    reference::OpProductsConfig c;
    c.dim = p.GetInt("dim");
    FSDP_CHECK(c.dim % 2 == 0, "zoo op_products: dim must be even, got ", c.dim);
    m.oracle_ = std::make_shared<reference::OpProducts<double>>(c);
    m.build_engine_ = [dim = c.dim] { return std::make_shared<OpProductsModule>(dim); };
    m.input_row_shape_ = {c.dim};
  } else if (kind_name == "padded_lm") {
    reference::PaddedLmConfig c;
    c.vocab_size = p.GetInt("vocab_size");
    c.dim = p.GetInt("dim");
    c.n_heads = p.GetInt("n_heads");
    c.seq_len = p.GetInt("seq_len");
    c.padding_idx = p.GetInt("padding_idx");
    FSDP_CHECK(c.dim % c.n_heads == 0 && c.padding_idx < c.vocab_size, "zoo padded_lm: n_heads ",
               c.n_heads, " must divide dim ", c.dim, " and padding_idx ", c.padding_idx,
               " must be below vocab_size ", c.vocab_size);
    m.oracle_ = std::make_shared<reference::PaddedLm<double>>(c);
    const bool negative_padding_idx = p.GetBool("negative_padding_idx");
    m.build_engine_ = [c, negative_padding_idx] {
      return std::make_shared<PaddedLmModule>(c, negative_padding_idx);
    };
    m.uses_tokens_ = true;
    m.vocab_size_ = c.vocab_size;
    m.input_row_shape_ = {c.seq_len};
    // Autograd treats the padding row as a constant though the forward reads it.
    m.fd_constant_ranges_.push_back(
        {"tok_embeddings.weight", c.padding_idx * c.dim, (c.padding_idx + 1) * c.dim});
  } else {
    FSDP_THROW(ErrorCode::kInternal, "zoo model ", kind_name, " has no construction");
  }
  if (!m.fd_oracle_) m.fd_oracle_ = m.oracle_;
  return m;
}

std::vector<std::string> ZooModel::ParameterNames() const {
  std::vector<std::string> names;
  for (const reference::TensorSpec& s : oracle_->ParameterSpecs()) names.push_back(s.name);
  return names;
}

nn::ModulePtr ZooModel::BuildEngine() const { return build_engine_(); }

bool ZooModel::FdConstant(const std::string& param, int64_t index) const {
  return std::any_of(fd_constant_ranges_.begin(), fd_constant_ranges_.end(),
                     [&](const FdConstantRange& r) {
                       return r.param == param && index >= r.begin && index < r.end;
                     });
}

nn::ModulePtr ZooModel::BuildEngineWithWeights(uint64_t seed, DType dtype) const {
  nn::ModulePtr module = BuildEngine();
  module->to(dtype);
  LoadWeights(*module, MakeParameters(seed, dtype), MakeBuffers(seed, dtype), dtype);
  return module;
}

nn::ModulePtr ZooModel::BuildEngineFromInputs(const RankInputs& inputs, DType dtype) const {
  nn::ModulePtr module = BuildEngine();
  module->to(dtype);
  module->load_state_dict(inputs.weights(), /*strict=*/true);
  return module;
}

CaseInputs ZooModel::MakeCaseInputs(uint64_t seed, DType dtype, int64_t steps, int world) const {
  FSDP_CHECK(world >= 1, "MakeCaseInputs: world must be >= 1, got ", world);
  CaseInputs inputs;
  nn::ModulePtr module = BuildEngine();
  module->to(dtype);
  for (const auto& [key, tensor] :
       MakeStateDict(*module, MakeParameters(seed, dtype), MakeBuffers(seed, dtype), dtype)) {
    inputs.weights.emplace_back(key, tensor);
  }
  inputs.ranks.resize(static_cast<size_t>(world));
  for (int64_t step = 0; step < steps; ++step) {
    const ZooInput global = MakeInput(seed, step, dtype, world * batch_);
    for (int r = 0; r < world; ++r) {
      inputs.ranks[static_cast<size_t>(r)].emplace_back(StepInputName(step),
                                                        global.RankSlice(r, world).ToEngine());
    }
  }
  return inputs;
}

InputsDoc ZooInputsDoc(const ZooModelKind& kind, const std::string& dtype_text) {
  InputsDoc doc;
  doc.weights = "every key of the " + kind.name + " model's state_dict() (tied parameters under "
                "each of their keys, buffers included), in " + dtype_text +
                ": load it with load_state_dict(strict=True) into the model built from the "
                "case's size parameters";
  doc.rank_tensors.push_back(
      {"step{k}/input", dtype_text + " features, or int64 token ids",
       "[batch, ...]: rows [rank * batch, (rank + 1) * batch) of step k's global batch of "
       "world * batch rows",
       "the rank's model input of step k, one per step"});
  return doc;
}

reference::RefTensorMap ZooModel::MakeParameters(uint64_t seed, DType dtype) const {
  Generator gen = StreamGenerator(seed, kWeightStream);
  reference::RefTensorMap out;
  for (const reference::TensorSpec& spec : oracle_->ParameterSpecs()) {
    const auto [center, scale] = InitOf(spec);
    reference::RefTensor t(spec.shape);
    for (double& v : t.data) v = center + scale * Symmetric(gen);
    out[spec.name] = RoundTo(std::move(t), dtype);
  }
  return out;
}

reference::RefTensorMap ZooModel::MakeBuffers(uint64_t seed, DType dtype) const {
  Generator gen = StreamGenerator(seed, kBufferStream);
  reference::RefTensorMap out;
  for (const reference::TensorSpec& spec : oracle_->BufferSpecs()) {
    reference::RefTensor t(spec.shape);
    for (double& v : t.data) v = Symmetric(gen);
    out[spec.name] = RoundTo(std::move(t), dtype);
  }
  return out;
}

ZooInput ZooModel::MakeInput(uint64_t seed, int64_t step, DType dtype, int64_t rows) const {
  FSDP_CHECK(step >= 0, "MakeInput: step must be non-negative, got ", step);
  Generator gen = StreamGenerator(seed, kFirstInputStream + static_cast<uint64_t>(step));
  reference::Shape shape = {rows > 0 ? rows : batch_};
  shape.insert(shape.end(), input_row_shape_.begin(), input_row_shape_.end());
  ZooInput in;
  in.dtype = dtype;
  if (uses_tokens_) {
    std::vector<int64_t> ids(static_cast<size_t>(reference::NumelOf(shape)));
    for (int64_t& id : ids) {
      id = std::min<int64_t>(vocab_size_ - 1,
                             static_cast<int64_t>(gen.uniform_double() * vocab_size_));
    }
    in.oracle.tokens = reference::IndexTensor(shape, std::move(ids));
  } else {
    reference::RefTensor x(shape);
    for (double& v : x.data) v = Symmetric(gen);
    in.oracle.features = RoundTo(std::move(x), dtype);
  }
  return in;
}

reference::LossSpec ZooModel::LossAt(int64_t step) const {
  auto of_output = [this](int i) {
    return squares_loss_ ? reference::ProductSumLoss(i, i) : reference::SumLoss({i});
  };
  if (oracle_->NumOutputs() == 2) {
    if (loss_switch_step_ >= 0 && step >= loss_switch_step_) return of_output(switched_output_);
    return reference::ProductSumLoss(0, 1);
  }
  return of_output(0);
}

std::vector<Tensor> ZooModel::Forward(nn::Module& module, const Tensor& input) const {
  return module(nn::Value(input)).tensors();
}

Tensor ZooModel::Loss(const std::vector<Tensor>& outputs, const reference::LossSpec& spec) {
  auto output = [&](int i) -> const Tensor& {
    FSDP_CHECK(i >= 0 && i < static_cast<int>(outputs.size()), "loss reads output ", i,
               " of a model with ", outputs.size(), " outputs");
    return outputs[static_cast<size_t>(i)];
  };
  switch (spec.kind) {
    case reference::LossKind::kSum:
    case reference::LossKind::kMean: {
      Tensor total;
      for (int i : spec.outputs) {
        Tensor term = spec.kind == reference::LossKind::kSum ? sum(output(i)) : mean(output(i));
        total = total.defined() ? total + term : term;
      }
      FSDP_CHECK(total.defined(), "a sum/mean loss needs at least one output");
      return total;
    }
    case reference::LossKind::kSumOfProduct:
      FSDP_CHECK(spec.outputs.size() == 2, "(a * b).sum() reads two outputs, got ",
                 spec.outputs.size());
      return sum(output(spec.outputs[0]) * output(spec.outputs[1]));
    case reference::LossKind::kCrossEntropy:
      break;
  }
  FSDP_THROW(ErrorCode::kInvalidArgument,
             "the zoo's seed losses are sums and products of outputs; cross-entropy needs "
             "targets, which ZooModel inputs do not carry");
}

// ---- Training ----------------------------------------------------------------------------------

EngineTrainingRecord TrainEngine(const ZooModel& model, nn::Module& module,
                                 const OptimConfig& optim_config, const RankInputs& inputs,
                                 int64_t steps, const ParameterSnapshot& snapshot,
                                 const ParameterSnapshot& grad_snapshot,
                                 const std::function<void()>& before_optimizer_step) {
  auto optimizer = MakeEngineOptimizer(optim_config, module.named_parameters());
  std::unique_ptr<optim::StepLR> scheduler;
  if (optim_config.lr_step_size > 0) {
    scheduler = std::make_unique<optim::StepLR>(*optimizer, optim_config.lr_step_size);
  }
  return TrainEngineSteps(model, module, *optimizer, inputs, /*first_step=*/0, steps, snapshot,
                          grad_snapshot, before_optimizer_step, scheduler.get());
}

EngineTrainingRecord TrainEngineSteps(const ZooModel& model, nn::Module& module,
                                      optim::Optimizer& optimizer, const RankInputs& inputs,
                                      int64_t first_step, int64_t steps,
                                      const ParameterSnapshot& snapshot,
                                      const ParameterSnapshot& grad_snapshot,
                                      const std::function<void()>& before_optimizer_step,
                                      optim::LRScheduler* scheduler) {
  EngineTrainingRecord record;
  Device device = Device::CPU();
  for (const auto& [name, p] : module.named_parameters()) {
    if (p.defined()) {
      device = p.device();
      break;
    }
  }
  for (int64_t step = first_step; step < first_step + steps; ++step) {
    const Tensor input = inputs.Get(StepInputName(step)).to(device);
    Tensor loss = ZooModel::Loss(model.Forward(module, input), model.LossAt(step));
    loss.backward();
    record.losses.push_back(loss.item());
    record.loss_dtype = loss.dtype();
    if (grad_snapshot) record.gradients.push_back(grad_snapshot(module));
    if (before_optimizer_step) before_optimizer_step();
    optimizer.step();
    if (scheduler != nullptr) scheduler->step();
    optimizer.zero_grad(SetToNoneAfterStep(step));
    record.parameters.push_back(snapshot ? snapshot(module) : ParametersOf(module));
  }
  return record;
}

std::vector<reference::StepRecord<double>> TrainOracle(
    const ZooModel& model, const OptimConfig& optim_config, uint64_t seed, int64_t steps,
    DType dtype, int world, const std::vector<reference::Fsdp1FlatParam>& flat_params,
    const std::optional<reference::GradClip>& clip, const std::vector<std::string>& frozen) {
  auto optimizer = MakeOracleOptimizer(optim_config);
  std::unique_ptr<reference::StepLr<double>> scheduler;
  if (optim_config.lr_step_size > 0) {
    scheduler =
        std::make_unique<reference::StepLr<double>>(optimizer.get(), optim_config.lr_step_size);
  }
  return TrainOracleWith(model, *optimizer, seed, steps, dtype, world, flat_params, clip,
                         scheduler.get(), frozen);
}

std::vector<reference::StepRecord<double>> TrainOracleWith(
    const ZooModel& model, reference::Optimizer<double>& optimizer, uint64_t seed, int64_t steps,
    DType dtype, int world, const std::vector<reference::Fsdp1FlatParam>& flat_params,
    const std::optional<reference::GradClip>& clip, reference::StepLr<double>* scheduler,
    const std::vector<std::string>& frozen) {
  std::vector<reference::TrainingStep<double>> plan;
  for (int64_t step = 0; step < steps; ++step) {
    reference::TrainingStep<double> s;
    const ZooInput global = model.MakeInput(seed, step, dtype, world * model.batch());
    s.rank_inputs = reference::SplitBatch(global.oracle, world);
    s.loss = model.LossAt(step);
    s.set_to_none = SetToNoneAfterStep(step);
    s.clip = clip;
    s.frozen = frozen;
    plan.push_back(std::move(s));
  }
  return reference::RunDataParallelTraining<double>(
      model.oracle(), model.MakeParameters(seed, dtype), model.MakeBuffers(seed, dtype), plan,
      &optimizer, scheduler, flat_params);
}

}  // namespace fsdp::conformance
