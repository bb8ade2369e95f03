#include "engine/nn/models.h"

#include "engine/core/rank_context.h"
#include "engine/functional/functional.h"
#include "engine/nn/checkpoint.h"
#include "engine/nn/init.h"

namespace fsdp::nn {

namespace F = ::fsdp;  // the differentiable functional API

// ---- MLP / MLPStack / DoubleLinear -------------------------------------------------------------

MLP::MLP(int64_t dim, bool bias, bool with_buffer, int64_t dim_multiplier) : Cloneable<MLP>("MLP") {
  register_module("in_proj", std::make_shared<Linear>(dim, dim_multiplier * dim, bias));
  register_module("out_proj", std::make_shared<Linear>(dim_multiplier * dim, dim, bias));
  if (with_buffer) register_buffer("buffer", Tensor::randn({dim}));
}

Value MLP::forward(const Value& x) {
  Tensor z = call_child("in_proj", x).tensor();
  z = F::relu(z);
  z = call_child("out_proj", z).tensor();
  z = F::relu(z);
  if (has_buffer("buffer")) {
    Tensor b = buffer("buffer");
    if (b.defined()) z = z + b;
  }
  return z;
}

MLPStack::MLPStack(int64_t mlp_dim, bool with_seq_parallel)
    : Cloneable<MLPStack, Sequential>("MLPStack", std::vector<ModulePtr>{}),
      with_seq_parallel_(with_seq_parallel) {
  // dim_multiplier 3 exercises uneven sharding.
  append(std::make_shared<MLP>(mlp_dim, true, false, 3));
  append(std::make_shared<MLP>(mlp_dim));
  append(std::make_shared<MLP>(mlp_dim, true, false, 3));
  if (with_seq_parallel) {
    append(std::make_shared<LayerNorm>(mlp_dim, 1e-5, /*elementwise_affine=*/true,
                                       /*bias=*/false));
  }
}

DoubleLinear::DoubleLinear(int64_t dim, bool use_second_linear)
    : Cloneable<DoubleLinear>("DoubleLinear"), use_second_linear_(use_second_linear) {
  register_module("lin1", std::make_shared<Linear>(dim, dim));
  register_module("lin2", std::make_shared<Linear>(dim, dim));
  register_module("relu", std::make_shared<ReLU>());
}

Value DoubleLinear::forward(const Value& x) {
  if (use_second_linear_) {
    Value a = call_child("relu", call_child("lin1", x));
    Value b = call_child("relu", call_child("lin2", x));
    return Value::Tuple({std::move(a), std::move(b)});
  }
  return call_child("relu", call_child("lin1", x));
}

// ---- Non-tensor activations (seed 002) ---------------------------------------------------------

ContainerModule::ContainerModule(int64_t dim) : Cloneable<ContainerModule>("Module") {
  register_module("lin1", std::make_shared<Linear>(dim, dim));
  register_module("lin2", std::make_shared<Linear>(dim, dim));
  register_module("relu", std::make_shared<ReLU>());
}

Value ContainerModule::forward(const Value& inp) {
  auto run = [this](const Value& x) {
    return call_child("relu", call_child("lin2", call_child("relu", call_child("lin1", x))));
  };
  switch (inp.kind()) {
    case Value::Kind::kList:
      return Value::List({run(inp[0])});
    case Value::Kind::kNamedTuple: {
      std::vector<Value> items = inp.items();
      items[0] = run(items[0]);
      return Value::NamedTuple(inp.named_tuple_type(), inp.keys(), std::move(items));
    }
    case Value::Kind::kTuple:
      return Value::Tuple({run(inp[0])});
    case Value::Kind::kDict:
      return Value::Dict({{"x", run(inp.at("x"))}});
    default:
      break;
  }
  FSDP_THROW(ErrorCode::kInvalidArgument, "Module: unsupported input container ", inp.type_name());
}

Value ToContainerType::forward(const Value& inp) {
  switch (type_) {
    case ContainerType::kList:
      return Value::List({inp});
    case ContainerType::kTuple:
      return Value::Tuple({inp});
    case ContainerType::kNamedTuple:
      // collections.namedtuple("NT", "x y")(x, torch.ones_like(x)), as the seed builds it.
      return Value::NamedTuple(
          "NT", {"x", "y"},
          {inp, Tensor::ones(inp.tensor().sizes(), inp.tensor().dtype(), inp.tensor().device())});
    case ContainerType::kDict:
      return Value::Dict({{"x", inp}});
  }
  return inp;
}

Value FromContainerType::forward(const Value& inp) {
  return type_ == ContainerType::kDict ? inp.at("x") : inp[0];
}

std::shared_ptr<Sequential> MakeNontensorActivationsModel(ContainerType type, int64_t dim) {
  return std::make_shared<Sequential>(std::vector<ModulePtr>{
      std::make_shared<ToContainerType>(type), std::make_shared<ContainerModule>(dim),
      std::make_shared<ContainerModule>(dim), std::make_shared<ContainerModule>(dim),
      std::make_shared<FromContainerType>(type)});
}

// ---- TransformerWithSharedParams --------------------------------------------------------------

TransformerWithSharedParams::TransformerWithSharedParams(int rank, bool add_bn, bool deterministic)
    : Cloneable<TransformerWithSharedParams>("TransformerWithSharedParams"), rank_(rank) {
  if (deterministic) ManualSeed(0);
  auto embed = register_module("embed_tokens", std::make_shared<Embedding>(kVocab, kModelDim));
  register_module("transformer", std::make_shared<EncoderDecoderTransformer>(
                                     kModelDim, /*nhead=*/8, /*num_encoder_layers=*/2,
                                     /*num_decoder_layers=*/2, /*dim_feedforward=*/8,
                                     /*dropout=*/0.1));
  auto output_proj = register_module("output_proj", std::make_shared<Linear>(kModelDim, kVocab));
  // Share the embedding and output projection weights.
  output_proj->register_parameter("weight", embed->weight());
  register_buffer("vocab_bias", Tensor::ones({kModelDim}, embed->weight().dtype()));
  register_buffer("long_buffer", Tensor::zeros({kModelDim}, DType::kInt64));
  if (add_bn) {
    register_module("bn", std::make_shared<BatchNorm1d>(kBatch));
  } else {
    register_module("bn", std::make_shared<Identity>());
  }
  if (deterministic) eval();
}

Value TransformerWithSharedParams::forward(const Value& src_tgt) {
  FSDP_CHECK(src_tgt.is_tuple() && src_tgt.size() == 2,
             "TransformerWithSharedParams: expected the tuple (src_ids, tgt_ids), got ",
             src_tgt.str());
  Tensor src = call_child("embed_tokens", src_tgt[0]).tensor();
  src = src + buffer("vocab_bias") + buffer("long_buffer").to(src.dtype());
  Tensor tgt = call_child("embed_tokens", src_tgt[1]).tensor();
  tgt = call_child("bn", tgt).tensor();
  Value x = call_child("transformer", Value::Tuple({src, tgt}));
  return call_child("output_proj", x);
}

Value TransformerWithSharedParams::get_input(Device device) const {
  ManualSeed(static_cast<uint64_t>(1 + rank_));  // keep everything deterministic
  Tensor src = Tensor::arange(12, DType::kInt64, device).view({6, kBatch});
  Tensor tgt = Tensor::arange(kBatch * 4, DType::kInt64, device).view({4, kBatch});
  return Value::Tuple({src, tgt});
}

Tensor TransformerWithSharedParams::get_loss(const Value& input, const Tensor& output) {
  const Tensor& tgt = input[1].tensor();
  return F::cross_entropy(F::view(output, {-1, output.size(-1)}), tgt.view({-1}), "sum");
}

std::vector<ModulePtr> TransformerWithSharedParams::get_ignored_modules() const {
  return {child("transformer")};
}

// ---- Transformer -------------------------------------------------------------------------------

Attention::Attention(const ModelArgs& args)
    : Cloneable<Attention>("Attention"),
      head_dim_(0),
      n_heads_(args.n_heads),
      dropout_p_(args.dropout_p),
      use_attn_mask_(args.use_attn_mask) {
  FSDP_CHECK(args.n_heads > 0 && args.dim % args.n_heads == 0, "Attention: dim ", args.dim,
             " is not divisible by n_heads ", args.n_heads);
  head_dim_ = args.dim / args.n_heads;
  register_module("resid_dropout", std::make_shared<Dropout>(args.dropout_p));
  register_module("wq", std::make_shared<Linear>(args.dim, args.dim, false));
  register_module("wk", std::make_shared<Linear>(args.dim, args.dim, false));
  register_module("wv", std::make_shared<Linear>(args.dim, args.dim, false));
  register_module("wo", std::make_shared<Linear>(args.dim, args.dim, false));
}

Value Attention::forward(const Value& input) {
  const Tensor& x = input.tensor();
  FSDP_CHECK(x.dim() == 3, "Attention: expected x of shape [bsz, seq_len, dim], got ",
             ShapeStr(x.sizes()));
  const int64_t bsz = x.size(0);
  const int64_t seq_len = x.size(1);
  Tensor queries = call_child("wq", x).tensor();
  Tensor keys = call_child("wk", x).tensor();
  Tensor values = call_child("wv", x).tensor();
  queries = F::view(queries, {bsz, seq_len, n_heads_, head_dim_});
  keys = F::view(keys, {bsz, seq_len, n_heads_, head_dim_});
  values = F::view(values, {bsz, seq_len, n_heads_, head_dim_});
  queries = F::transpose(queries, 1, 2);  // (bsz, n_heads, seq_len, head_dim)
  keys = F::transpose(keys, 1, 2);
  values = F::transpose(values, 1, 2);
  Tensor output = F::scaled_dot_product_attention(queries, keys, values, Tensor(),
                                                  is_training() ? dropout_p_ : 0.0, use_attn_mask_);
  output = F::view(F::transpose(output, 1, 2), {bsz, seq_len, -1});
  return call_child("resid_dropout", call_child("wo", output));
}

FeedForward::FeedForward(int64_t dim, int64_t hidden_dim, double dropout_p)
    : Cloneable<FeedForward>("FeedForward") {
  register_module("w1", std::make_shared<Linear>(dim, hidden_dim));
  register_module("gelu", std::make_shared<GELU>());
  register_module("w2", std::make_shared<Linear>(hidden_dim, dim));
  register_module("resid_dropout", std::make_shared<Dropout>(dropout_p));
}

Value FeedForward::forward(const Value& x) {
  return call_child("resid_dropout", call_child("w2", call_child("gelu", call_child("w1", x))));
}

TransformerBlock::TransformerBlock(const ModelArgs& args)
    : Cloneable<TransformerBlock>("TransformerBlock") {
  register_module("attention_norm", std::make_shared<LayerNorm>(args.dim));
  register_module("attention", std::make_shared<Attention>(args));
  register_module("ffn_norm", std::make_shared<LayerNorm>(args.dim));
  register_module("feed_forward",
                  std::make_shared<FeedForward>(args.dim, 4 * args.dim, args.dropout_p));
}

Value TransformerBlock::forward(const Value& input) {
  const Tensor& x = input.tensor();
  Tensor h = x + call_child("attention", call_child("attention_norm", x)).tensor();
  Tensor out = h + call_child("feed_forward", call_child("ffn_norm", h)).tensor();
  return out;
}

Value TransformerBlock::forward_with_kwargs(const Value& args, const Value& kwargs) {
  if (kwargs.is_dict() && kwargs.contains("x")) {
    FSDP_CHECK(kwargs.size() == 1 && (args.is_none() || (args.is_tuple() && args.size() == 0)),
               "TransformerBlock.forward() takes one input x; got args ", args.str(),
               " and kwargs ", kwargs.str());
    return forward(kwargs.at("x"));
  }
  return Module::forward_with_kwargs(args, kwargs);
}

Transformer::Transformer(const ModelArgs& args)
    : Cloneable<Transformer>("Transformer"), args_(args) {
  FSDP_CHECK(args.vocab_size > 0 && args.max_seq_len > 0, "Transformer: vocab_size (",
             args.vocab_size, ") and max_seq_len (", args.max_seq_len, ") must be positive");
  auto tok =
      register_module("tok_embeddings", std::make_shared<Embedding>(args.vocab_size, args.dim));
  register_module("pos_embeddings", std::make_shared<Embedding>(args.max_seq_len, args.dim));
  register_module("dropout", std::make_shared<Dropout>(args.dropout_p));
  auto layers = register_module("layers", std::make_shared<ModuleList>());
  for (int64_t i = 0; i < args.n_layers; ++i)
    layers->append(std::make_shared<TransformerBlock>(args));
  register_module("norm", std::make_shared<LayerNorm>(args.dim));
  auto output =
      register_module("output", std::make_shared<Linear>(args.dim, args.vocab_size, false));
  if (args.weight_tying) output->register_parameter("weight", tok->weight());
}

std::vector<ModulePtr> Transformer::layers() const {
  std::vector<ModulePtr> out;
  for (const auto& [name, m] : child("layers")->child_slots()) out.push_back(m);
  return out;
}

Value Transformer::forward(const Value& input) {
  const Tensor& tokens = input.tensor();
  FSDP_CHECK(tokens.dim() == 2, "Transformer: expected tokens of shape [bsz, seq_len], got ",
             ShapeStr(tokens.sizes()));
  const int64_t seq_len = tokens.size(1);
  FSDP_CHECK(seq_len <= args_.max_seq_len, "Transformer: seq_len ", seq_len,
             " exceeds max_seq_len ", args_.max_seq_len);
  Tensor h = call_child("tok_embeddings", tokens).tensor();
  Tensor pos = Tensor::arange(seq_len, DType::kInt64, tokens.device());
  Tensor p = call_child("pos_embeddings", pos).tensor();  // (seq_len, dim)
  h = h + p;
  h = call_child("dropout", h).tensor();
  for (const ModulePtr& layer : layers()) {
    if (args_.checkpoint_activations) {
      h = CheckpointModuleCall(layer, h).tensor();
    } else if (args_.block_kwargs) {
      h = layer->call(Value::Tuple({}), Value::Dict({{"x", h}})).tensor();
    } else {
      h = (*layer)(h).tensor();
    }
  }
  h = call_child("norm", h).tensor();
  return F::to(call_child("output", h).tensor(), DType::kFloat32);
}

// ---- MLPModule / MLPStacked / RMSNormPython ----------------------------------------------------

MLPModule::MLPModule(bool bias) : Cloneable<MLPModule>("MLPModule") {
  ManualSeed(5);  // torch.manual_seed(5)
  register_module("net1", std::make_shared<Linear>(10, 16, bias));
  register_module("relu", std::make_shared<ReLU>());
  register_module("net2", std::make_shared<Linear>(16, 10, bias));
}

Value MLPModule::forward(const Value& x) {
  return call_child("net2", call_child("relu", call_child("net1", x)));
}

MLPStacked::MLPStacked(int64_t n_layers) : Cloneable<MLPStacked>("MLPStacked") {
  auto layers = register_module("layers", std::make_shared<ModuleList>());
  for (int64_t i = 0; i < n_layers; ++i) layers->append(std::make_shared<MLPModule>());
}

Value MLPStacked::forward(const Value& input) {
  Value x = input;
  for (const auto& [name, layer] : child("layers")->child_slots()) x = (*layer)(x);
  return x;
}

RMSNormPython::RMSNormPython(int64_t dim, double eps)
    : Cloneable<RMSNormPython>("RMSNormPython"), eps_(eps) {
  register_parameter("weight", Tensor::ones({dim}));
}

Value RMSNormPython::forward(const Value& input) {
  const Tensor& x = input.tensor();
  Tensor norm = x * F::rsqrt(F::mean(F::pow(x, 2.0), {-1}, /*keepdim=*/true) + eps_);
  return norm * parameter("weight");
}

// ---- Seed models -------------------------------------------------------------------------------

SimpleModel::SimpleModel() : Cloneable<SimpleModel>("SimpleModel") {
  register_module("net1", std::make_shared<Linear>(5, 8));
  register_module("relu", std::make_shared<ReLU>());
  register_module("net2", std::make_shared<Linear>(8, 4));
  register_module("net3", std::make_shared<Linear>(4, 12));
}

Value SimpleModel::forward(const Value& x) {
  return call_child("net3", call_child("net2", call_child("relu", call_child("net1", x))));
}

StateDictModel::StateDictModel(bool register_buffers) : Cloneable<StateDictModel>("Model") {
  auto inner = register_module("inner", std::make_shared<Linear>(4, 4));
  if (register_buffers) {
    inner->register_buffer("buffer", Tensor::randn({5, 5}));
    inner->register_buffer("non_persistent_buffer", Tensor::randn({5, 5}), /*persistent=*/false);
  }
  auto outer = register_module("outer", std::make_shared<Linear>(4, 5));
  if (register_buffers) {
    outer->register_buffer("buffer", Tensor::randn({5, 5}));
    outer->register_buffer("non_persistent_buffer", Tensor::randn({5, 5}), /*persistent=*/false);
  }
}

Value StateDictModel::forward(const Value& x) {
  Tensor i = call_child("inner", x).tensor();
  Tensor j = call_child("inner", x).tensor();
  return call_child("outer", i + j);
}

TestDummyModel::TestDummyModel() : Cloneable<TestDummyModel>("TestDummyModel") {
  ManualSeed(0);  // torch.manual_seed(0)
  register_module("net1", std::make_shared<Sequential>(std::vector<ModulePtr>{
                              std::make_shared<Linear>(8, 16), std::make_shared<ReLU>()}));
  auto net2 =
      register_module("net2", std::make_shared<Sequential>(std::vector<ModulePtr>{
                                  std::make_shared<Linear>(16, 16), std::make_shared<ReLU>()}));
  register_module("net3", net2);
  // nn.Parameter(torch.Tensor(10)) is uninitialised memory in PyTorch; zeros here.
  Tensor random_parameter = register_parameter("random_parameter", Tensor::zeros({10}));
  register_parameter("shared_parameter", random_parameter);
}

Value TestDummyModel::forward(const Value& x) {
  return call_child("net3", call_child("net2", call_child("net1", x)));
}

std::shared_ptr<Sequential> MakeSimpleNestedModel() {
  return std::make_shared<Sequential>(std::vector<ModulePtr>{
      std::make_shared<Linear>(10, 10, false), std::make_shared<Linear>(10, 10, false)});
}

std::shared_ptr<Sequential> MakeMultibufferNestedModel() {
  return std::make_shared<Sequential>(std::vector<ModulePtr>{
      std::make_shared<Linear>(10, 10, false), std::make_shared<BatchNorm1d>(10),
      std::make_shared<Linear>(10, 10, false)});
}

}  // namespace fsdp::nn
