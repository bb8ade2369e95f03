#include "engine/nn/models.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "engine/core/allocator.h"
#include "engine/core/rank_context.h"
#include "engine/functional/functional.h"
#include "engine/nn/init.h"
#include "engine/testing/nn_test_util.h"

namespace fsdp::nn {
namespace {

using Names = std::vector<std::string>;
using Shapes = std::vector<std::pair<std::string, Shape>>;

Shapes ParamShapes(const Module& m) {
  Shapes out;
  for (const auto& [name, t] : m.named_parameters()) out.emplace_back(name, t.sizes());
  return out;
}

Names NamesOf(const std::vector<NamedModule>& mods) {
  Names out;
  for (const auto& [n, m] : mods) out.push_back(n);
  return out;
}

Names BlockParams(const std::string& p) {
  return {p + "attention_norm.weight", p + "attention_norm.bias",    p + "attention.wq.weight",
          p + "attention.wk.weight",   p + "attention.wv.weight",    p + "attention.wo.weight",
          p + "ffn_norm.weight",       p + "ffn_norm.bias",          p + "feed_forward.w1.weight",
          p + "feed_forward.w1.bias",  p + "feed_forward.w2.weight", p + "feed_forward.w2.bias"};
}

TEST(ModelsFqn, TransformerParametersStateDictModules) {
  auto model = std::make_shared<Transformer>(ModelArgs{});
  Names expected = {"tok_embeddings.weight", "pos_embeddings.weight"};
  for (const std::string& p : {"layers.0.", "layers.1."}) {
    for (auto& n : BlockParams(p)) expected.push_back(n);
  }
  expected.push_back("norm.weight");
  expected.push_back("norm.bias");
  Names got;
  for (const auto& [n, t] : model->named_parameters()) got.push_back(n);
  EXPECT_EQ(got, expected);  // output.weight is tied: absent
  Names sd_expected = expected;
  sd_expected.push_back("output.weight");
  EXPECT_EQ(model->state_dict().keys(), sd_expected);
  EXPECT_TRUE(
      model->get_parameter("output.weight").is_same(model->get_parameter("tok_embeddings.weight")));

  std::map<std::string, Shape> shapes;
  for (const auto& [n, s] : ParamShapes(*model)) shapes[n] = s;
  EXPECT_EQ(shapes["tok_embeddings.weight"], (Shape{8, 16}));
  EXPECT_EQ(shapes["pos_embeddings.weight"], (Shape{16, 16}));
  EXPECT_EQ(shapes["layers.1.attention.wo.weight"], (Shape{16, 16}));
  EXPECT_EQ(shapes["layers.0.feed_forward.w1.weight"], (Shape{64, 16}));
  EXPECT_EQ(shapes["layers.0.feed_forward.w1.bias"], (Shape{64}));
  EXPECT_EQ(shapes["layers.0.feed_forward.w2.weight"], (Shape{16, 64}));
  EXPECT_EQ(shapes["layers.0.feed_forward.w2.bias"], (Shape{16}));
  EXPECT_EQ(shapes["norm.weight"], (Shape{16}));

  Names modules = {"", "tok_embeddings", "pos_embeddings", "dropout", "layers"};
  for (const std::string& p : {"layers.0", "layers.1"}) {
    for (const std::string& s :
         {"", ".attention_norm", ".attention", ".attention.resid_dropout", ".attention.wq",
          ".attention.wk", ".attention.wv", ".attention.wo", ".ffn_norm", ".feed_forward",
          ".feed_forward.w1", ".feed_forward.gelu", ".feed_forward.w2",
          ".feed_forward.resid_dropout"}) {
      modules.push_back(p + s);
    }
  }
  modules.push_back("norm");
  modules.push_back("output");
  EXPECT_EQ(NamesOf(model->named_modules()), modules);
  EXPECT_EQ(model->layers().size(), 2u);
  EXPECT_EQ(model->layers()[0]->type_name(), "TransformerBlock");

  ModelArgs untied;
  untied.weight_tying = false;
  untied.n_layers = 1;
  auto model2 = std::make_shared<Transformer>(untied);
  EXPECT_EQ(model2->named_parameters().back().first, "output.weight");
}

TEST(ModelsFqn, FsdpCommonModels) {
  EXPECT_EQ(ParamShapes(MLP(8)), (Shapes{{"in_proj.weight", {32, 8}},
                                         {"in_proj.bias", {32}},
                                         {"out_proj.weight", {8, 32}},
                                         {"out_proj.bias", {8}}}));
  auto with_buffer = std::make_shared<MLP>(8, /*bias=*/false, /*with_buffer=*/true);
  EXPECT_EQ(ParamShapes(*with_buffer),
            (Shapes{{"in_proj.weight", {32, 8}}, {"out_proj.weight", {8, 32}}}));
  EXPECT_EQ(with_buffer->state_dict().keys(),
            (Names{"buffer", "in_proj.weight", "out_proj.weight"}));

  auto stack = std::make_shared<MLPStack>(4);
  EXPECT_EQ(stack->type_name(), "MLPStack");
  EXPECT_EQ(ParamShapes(*stack), (Shapes{{"0.in_proj.weight", {12, 4}},
                                         {"0.in_proj.bias", {12}},
                                         {"0.out_proj.weight", {4, 12}},
                                         {"0.out_proj.bias", {4}},
                                         {"1.in_proj.weight", {16, 4}},
                                         {"1.in_proj.bias", {16}},
                                         {"1.out_proj.weight", {4, 16}},
                                         {"1.out_proj.bias", {4}},
                                         {"2.in_proj.weight", {12, 4}},
                                         {"2.in_proj.bias", {12}},
                                         {"2.out_proj.weight", {4, 12}},
                                         {"2.out_proj.bias", {4}}}));
  auto sp_stack = std::make_shared<MLPStack>(4, /*with_seq_parallel=*/true);
  EXPECT_EQ(ParamShapes(*sp_stack).back(), (std::pair<std::string, Shape>{"3.weight", {4}}));

  EXPECT_EQ(ParamShapes(DoubleLinear(3)), (Shapes{{"lin1.weight", {3, 3}},
                                                  {"lin1.bias", {3}},
                                                  {"lin2.weight", {3, 3}},
                                                  {"lin2.bias", {3}}}));
}

TEST(ModelsFqn, DtensorCommonAndSeedModels) {
  auto mlp = std::make_shared<MLPModule>();
  EXPECT_EQ(ParamShapes(*mlp), (Shapes{{"net1.weight", {16, 10}},
                                       {"net1.bias", {16}},
                                       {"net2.weight", {10, 16}},
                                       {"net2.bias", {10}}}));
  // MLPModule seeds the generator with 5: every instance has the same weights.
  auto stacked = std::make_shared<MLPStacked>();
  EXPECT_EQ(stacked->get_parameter("layers.0.net1.weight").to_doubles(),
            stacked->get_parameter("layers.1.net1.weight").to_doubles());
  EXPECT_EQ(stacked->get_parameter("layers.1.net2.bias").to_doubles(),
            mlp->get_parameter("net2.bias").to_doubles());
  EXPECT_EQ(stacked->named_parameters().size(), 8u);
  EXPECT_EQ(stacked->named_parameters()[4].first, "layers.1.net1.weight");
  EXPECT_EQ(ParamShapes(*std::make_shared<MLPStacked>(3)).size(), 12u);
  EXPECT_EQ(ParamShapes(*std::make_shared<MLPModule>(/*bias=*/false)),
            (Shapes{{"net1.weight", {16, 10}}, {"net2.weight", {10, 16}}}));

  EXPECT_EQ(ParamShapes(RMSNormPython(10)), (Shapes{{"weight", {10}}}));

  auto simple = std::make_shared<SimpleModel>();
  EXPECT_EQ(ParamShapes(*simple), (Shapes{{"net1.weight", {8, 5}},
                                          {"net1.bias", {8}},
                                          {"net2.weight", {4, 8}},
                                          {"net2.bias", {4}},
                                          {"net3.weight", {12, 4}},
                                          {"net3.bias", {12}}}));
  EXPECT_EQ(SimpleModel::sharded_param_names(), (Names{"net1.weight", "net1.bias", "net2.weight"}));

  auto sd_model = std::make_shared<StateDictModel>();
  EXPECT_EQ(sd_model->type_name(), "Model");
  EXPECT_EQ(ParamShapes(*sd_model), (Shapes{{"inner.weight", {4, 4}},
                                            {"inner.bias", {4}},
                                            {"outer.weight", {5, 4}},
                                            {"outer.bias", {5}}}));

  EXPECT_EQ(ParamShapes(*MakeSimpleNestedModel()),
            (Shapes{{"0.weight", {10, 10}}, {"1.weight", {10, 10}}}));
  auto multibuffer = MakeMultibufferNestedModel();
  EXPECT_EQ(
      ParamShapes(*multibuffer),
      (Shapes{
          {"0.weight", {10, 10}}, {"1.weight", {10}}, {"1.bias", {10}}, {"2.weight", {10, 10}}}));
  EXPECT_EQ(multibuffer->state_dict().keys(),
            (Names{"0.weight", "1.weight", "1.bias", "1.running_mean", "1.running_var",
                   "1.num_batches_tracked", "2.weight"}));
}

Names EncoderLayerParams(const std::string& p) {
  Names out;
  for (const std::string& attn : {"self_attn."}) {
    for (const std::string& n :
         {"in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"}) {
      out.push_back(p + attn + n);
    }
  }
  for (const std::string& n : {"linear1.weight", "linear1.bias", "linear2.weight", "linear2.bias",
                               "norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias"}) {
    out.push_back(p + n);
  }
  return out;
}

Names DecoderLayerParams(const std::string& p) {
  Names out;
  for (const std::string& attn : {"self_attn.", "multihead_attn."}) {
    for (const std::string& n :
         {"in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"}) {
      out.push_back(p + attn + n);
    }
  }
  for (const std::string& n :
       {"linear1.weight", "linear1.bias", "linear2.weight", "linear2.bias", "norm1.weight",
        "norm1.bias", "norm2.weight", "norm2.bias", "norm3.weight", "norm3.bias"}) {
    out.push_back(p + n);
  }
  return out;
}

TEST(ModelsFqn, TransformerWithSharedParams) {
  auto model = std::make_shared<TransformerWithSharedParams>();
  Names expected = {"embed_tokens.weight"};
  for (const std::string& l : {"0.", "1."}) {
    for (auto& n : EncoderLayerParams("transformer.encoder.layers." + l)) expected.push_back(n);
  }
  expected.push_back("transformer.encoder.norm.weight");
  expected.push_back("transformer.encoder.norm.bias");
  for (const std::string& l : {"0.", "1."}) {
    for (auto& n : DecoderLayerParams("transformer.decoder.layers." + l)) expected.push_back(n);
  }
  expected.push_back("transformer.decoder.norm.weight");
  expected.push_back("transformer.decoder.norm.bias");
  Names params = expected;
  params.push_back("output_proj.bias");
  params.push_back("bn.weight");
  params.push_back("bn.bias");
  Names got;
  for (const auto& [n, t] : model->named_parameters()) got.push_back(n);
  EXPECT_EQ(got, params);
  EXPECT_EQ(got.size(), 68u);

  Names sd = {"vocab_bias", "long_buffer"};
  for (auto& n : expected) sd.push_back(n);
  for (const std::string& n : {"output_proj.weight", "output_proj.bias", "bn.weight", "bn.bias",
                               "bn.running_mean", "bn.running_var", "bn.num_batches_tracked"}) {
    sd.push_back(n);
  }
  EXPECT_EQ(model->state_dict().keys(), sd);

  std::map<std::string, Shape> shapes;
  for (const auto& [n, s] : ParamShapes(*model)) shapes[n] = s;
  EXPECT_EQ(shapes["embed_tokens.weight"], (Shape{23, 16}));
  EXPECT_EQ(shapes["transformer.encoder.layers.0.self_attn.in_proj_weight"], (Shape{48, 16}));
  EXPECT_EQ(shapes["transformer.decoder.layers.1.multihead_attn.out_proj.weight"], (Shape{16, 16}));
  EXPECT_EQ(shapes["transformer.encoder.layers.1.linear1.weight"], (Shape{8, 16}));
  EXPECT_EQ(shapes["transformer.encoder.layers.1.linear2.weight"], (Shape{16, 8}));
  EXPECT_EQ(shapes["bn.weight"], (Shape{2}));
  EXPECT_EQ(model->get_submodule("transformer")->type_name(), "Transformer");
  EXPECT_EQ(model->get_submodule("transformer.encoder.layers.0.self_attn.out_proj")->type_name(),
            "NonDynamicallyQuantizableLinear");
  EXPECT_TRUE(model->get_parameter("output_proj.weight")
                  .is_same(model->get_parameter("embed_tokens.weight")));
  EXPECT_EQ(model->get_ignored_modules().front(), model->child("transformer"));
  // Cloned layers start identical before xavier re-initialises the matrices: biases match.
  EXPECT_EQ(model->get_parameter("transformer.encoder.layers.0.linear1.bias").to_doubles(),
            model->get_parameter("transformer.encoder.layers.1.linear1.bias").to_doubles());
  EXPECT_NE(model->get_parameter("transformer.encoder.layers.0.linear1.weight").to_doubles(),
            model->get_parameter("transformer.encoder.layers.1.linear1.weight").to_doubles());

  auto no_bn = std::make_shared<TransformerWithSharedParams>(0, /*add_bn=*/false);
  EXPECT_EQ(no_bn->child("bn")->type_name(), "Identity");
  auto det_a = std::make_shared<TransformerWithSharedParams>(0, true, /*deterministic=*/true);
  auto det_b = std::make_shared<TransformerWithSharedParams>(1, true, /*deterministic=*/true);
  EXPECT_FALSE(det_a->is_training());
  EXPECT_EQ(det_a->get_parameter("embed_tokens.weight").to_doubles(),
            det_b->get_parameter("embed_tokens.weight").to_doubles());
}

TEST(ModelsForward, TransformerWithSharedParamsLoss) {
  auto model = std::make_shared<TransformerWithSharedParams>(0, true, /*deterministic=*/true);
  Value input = model->get_input();
  EXPECT_EQ(input[0].tensor().sizes(), (Shape{6, 2}));
  EXPECT_EQ(input[1].tensor().to_int64s(), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  Tensor out = (*model)(input).tensor();
  EXPECT_EQ(out.sizes(), (Shape{4, 2, 23}));
  Tensor loss = TransformerWithSharedParams::get_loss(input, out);
  EXPECT_EQ(loss.dim(), 0);
  EXPECT_GT(loss.item(), 0.0);
  // Deterministic: a second model built the same way gives the same loss.
  auto again = std::make_shared<TransformerWithSharedParams>(0, true, true);
  EXPECT_EQ(TransformerWithSharedParams::get_loss(input, (*again)(input).tensor()).item(),
            loss.item());
}

TEST(ModelsForward, NontensorActivationsContainers) {
  Tensor x = Tensor::randn({2, 6});
  std::vector<double> expected;
  for (ContainerType type : {ContainerType::kList, ContainerType::kTuple,
                             ContainerType::kNamedTuple, ContainerType::kDict}) {
    ManualSeed(42);
    auto model = MakeNontensorActivationsModel(type, 6);
    EXPECT_EQ(model->named_parameters().front().first, "1.lin1.weight");
    EXPECT_EQ(model->named_parameters().size(), 12u);
    EXPECT_EQ((*model)[1]->type_name(), "Module");
    const Value packed = (*(*model)[0])(x);
    const Value through = (*(*model)[1])(packed);
    EXPECT_TRUE(through.same_structure(packed)) << through.str();
    const auto out = (*model)(x).tensor().to_doubles();
    if (expected.empty()) expected = out;
    EXPECT_EQ(out, expected);
  }
}

TEST(ModelsForward, OutputsShapesAndKinds) {
  auto transformer = std::make_shared<Transformer>(ModelArgs{});
  Tensor tokens = Tensor::randint(0, 8, {2, 16});
  Tensor logits = (*transformer)(tokens).tensor();
  EXPECT_EQ(logits.sizes(), (Shape{2, 16, 8}));
  EXPECT_EQ(logits.dtype(), DType::kFloat32);
  EXPECT_THROW((*transformer)(Tensor::randint(0, 8, {2, 17})), Error);

  Value pair = (*std::make_shared<DoubleLinear>(4))(Tensor::rand({2, 4}));
  ASSERT_TRUE(pair.is_tuple());
  EXPECT_EQ(pair.size(), 2u);
  Value single = (*std::make_shared<DoubleLinear>(4, false))(Tensor::rand({2, 4}));
  EXPECT_TRUE(single.is_tensor());
  for (double v : single.tensor().to_doubles()) EXPECT_GE(v, 0.0);

  EXPECT_EQ((*std::make_shared<MLPStack>(4))(Tensor::rand({3, 4})).tensor().sizes(), (Shape{3, 4}));
  EXPECT_EQ((*std::make_shared<SimpleModel>())(Tensor::rand({2, 5})).tensor().sizes(),
            (Shape{2, 12}));
  EXPECT_EQ((*std::make_shared<StateDictModel>())(Tensor::rand({2, 4})).tensor().sizes(),
            (Shape{2, 5}));
  EXPECT_EQ((*std::make_shared<TestDummyModel>())(Tensor::rand({8, 8})).tensor().sizes(),
            (Shape{8, 16}));
  EXPECT_EQ((*MakeMultibufferNestedModel())(Tensor::rand({4, 10})).tensor().sizes(),
            (Shape{4, 10}));

  // RMSNormPython agrees with the fused rms_norm.
  auto norm = std::make_shared<RMSNormPython>(4);
  Tensor x = Tensor::rand({3, 4});
  Tensor a = (*norm)(x).tensor();
  Tensor b = ::fsdp::rms_norm(x, {4}, norm->parameter("weight"), 1e-6);
  const auto av = a.to_doubles();
  const auto bv = b.to_doubles();
  for (size_t i = 0; i < av.size(); ++i) EXPECT_NEAR(av[i], bv[i], 1e-6);
}

TEST(ModelsForward, StateDictRoundTripGivesIdenticalOutputs) {
  ManualSeed(11);
  auto a = std::make_shared<Transformer>(ModelArgs{.dropout_p = 0.0});
  ManualSeed(12);
  auto b = std::make_shared<Transformer>(ModelArgs{.dropout_p = 0.0});
  Tensor tokens = Tensor::randint(0, 8, {2, 5});
  EXPECT_NE((*a)(tokens).tensor().to_doubles(), (*b)(tokens).tensor().to_doubles());
  b->load_state_dict(a->state_dict());
  EXPECT_TRUE(b->get_parameter("output.weight").is_same(b->get_parameter("tok_embeddings.weight")));
  EXPECT_EQ((*a)(tokens).tensor().to_doubles(), (*b)(tokens).tensor().to_doubles());
}

TEST(ModelsForwardGpu, CudaTransformerMatchesCpu) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
  auto cpu = std::make_shared<Transformer>(ModelArgs{.dropout_p = 0.0});
  ModulePtr gpu = cpu->deep_copy();
  Tensor tok = gpu->get_parameter("tok_embeddings.weight");
  gpu->to(Device::CUDA(0));
  EXPECT_TRUE(gpu->get_parameter("tok_embeddings.weight").is_same(tok));
  EXPECT_TRUE(tok.device().is_cuda());
  EXPECT_TRUE(gpu->get_parameter("output.weight").is_same(tok));
  Tensor tokens = Tensor::randint(0, 8, {2, 16});
  const auto expected = (*cpu)(tokens).tensor().to_doubles();
  Tensor out = (*gpu)(tokens.to(Device::CUDA(0))).tensor();
  EXPECT_TRUE(out.device().is_cuda());
  const auto got = out.to_doubles();
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], expected[i], 1e-4) << i;
}

// ---- Gradients against central finite differences (float64) ------------------------------------

using testing::ExpectGradientsMatchFiniteDifferences;

TEST(ModelsGradients, FsdpCommonModels) {
  Tensor x = Tensor::randn({3, 4}, DType::kFloat64);
  auto mlp = std::make_shared<MLP>(4, true, /*with_buffer=*/true);
  mlp->to(DType::kFloat64);
  ExpectGradientsMatchFiniteDifferences(*mlp, [&](Module& m) { return m(x); },
                                        {"in_proj.weight", "in_proj.bias", "out_proj.weight"});
  auto stack = std::make_shared<MLPStack>(4);
  stack->to(DType::kFloat64);
  ExpectGradientsMatchFiniteDifferences(*stack, [&](Module& m) { return m(x); },
                                        {"0.in_proj.weight", "2.out_proj.bias"});
  auto dl = std::make_shared<DoubleLinear>(4);
  dl->to(DType::kFloat64);
  ExpectGradientsMatchFiniteDifferences(*dl, [&](Module& m) { return m(x); },
                                        {"lin1.weight", "lin2.bias"});
}

TEST(ModelsGradients, TransformerWithDropoutAndTiedWeights) {
  auto model = std::make_shared<Transformer>(ModelArgs{});  // dropout 0.1, training mode
  model->to(DType::kFloat64);
  Tensor tokens = Tensor::randint(0, 8, {2, 6});
  // Differentiate the float64 logits (the model casts its output to float32): capture the
  // output projection's result with a forward hook.
  Value captured;
  model->get_submodule("output")->register_forward_hook(
      [&](Module&, const Value&, const Value& out) -> std::optional<Value> {
        captured = out;
        return std::nullopt;
      });
  ExpectGradientsMatchFiniteDifferences(
      *model,
      [&](Module& m) {
        m(tokens);
        return captured;
      },
      {"tok_embeddings.weight", "pos_embeddings.weight", "layers.0.attention.wq.weight",
       "layers.1.feed_forward.w1.bias", "layers.1.ffn_norm.weight", "norm.bias"},
      1e-6, 1e-5);
}

TEST(ModelsGradients, DtensorCommonAndSeedModels) {
  auto stacked = std::make_shared<MLPStacked>();
  stacked->to(DType::kFloat64);
  Tensor x10 = Tensor::randn({2, 10}, DType::kFloat64);
  ExpectGradientsMatchFiniteDifferences(*stacked, [&](Module& m) { return m(x10); },
                                        {"layers.0.net1.weight", "layers.1.net2.bias"});
  // Seed 003's TestModel: mlp(mlp_norm(x)).
  auto seq = std::make_shared<Sequential>(std::vector<NamedModule>{
      {"mlp_norm", std::make_shared<RMSNormPython>(10)}, {"mlp", std::make_shared<MLPModule>()}});
  seq->to(DType::kFloat64);
  ExpectGradientsMatchFiniteDifferences(*seq, [&](Module& m) { return m(x10); },
                                        {"mlp_norm.weight", "mlp.net1.weight"});

  auto simple = std::make_shared<SimpleModel>();
  simple->to(DType::kFloat64);
  Tensor x5 = Tensor::randn({3, 5}, DType::kFloat64);
  ExpectGradientsMatchFiniteDifferences(*simple, [&](Module& m) { return m(x5); },
                                        {"net1.weight", "net3.bias"});

  // inner is called twice: its gradient sums both uses.
  auto sd_model = std::make_shared<StateDictModel>(/*register_buffers=*/true);
  sd_model->to(DType::kFloat64);
  Tensor x4 = Tensor::randn({2, 4}, DType::kFloat64);
  ExpectGradientsMatchFiniteDifferences(*sd_model, [&](Module& m) { return m(x4); },
                                        {"inner.weight", "inner.bias", "outer.weight"});

  // net2 is also net3: its gradient sums both uses.
  auto dummy = std::make_shared<TestDummyModel>();
  dummy->to(DType::kFloat64);
  Tensor x8 = Tensor::randn({4, 8}, DType::kFloat64);
  ExpectGradientsMatchFiniteDifferences(*dummy, [&](Module& m) { return m(x8); },
                                        {"net1.0.weight", "net2.0.weight", "net2.0.bias"});

  auto multibuffer = MakeMultibufferNestedModel();
  multibuffer->to(DType::kFloat64);
  Tensor x10b = Tensor::randn({4, 10}, DType::kFloat64);
  ExpectGradientsMatchFiniteDifferences(*multibuffer, [&](Module& m) { return m(x10b); },
                                        {"0.weight", "1.weight", "2.weight"});

  auto containers = MakeNontensorActivationsModel(ContainerType::kNamedTuple, 5);
  containers->to(DType::kFloat64);
  Tensor x5b = Tensor::randn({2, 5}, DType::kFloat64);
  ExpectGradientsMatchFiniteDifferences(*containers, [&](Module& m) { return m(x5b); },
                                        {"1.lin1.weight", "3.lin2.bias"});
}

TEST(ModelsGradients, TransformerWithSharedParamsDropoutAndBatchNorm) {
  auto model = std::make_shared<TransformerWithSharedParams>();  // training: dropout 0.1, BN
  model->to(DType::kFloat64);
  const Value input = model->get_input();
  ExpectGradientsMatchFiniteDifferences(
      *model, [&](Module& m) { return m(input); },
      {"embed_tokens.weight", "transformer.encoder.layers.0.self_attn.in_proj_weight",
       "transformer.decoder.layers.1.multihead_attn.in_proj_weight",
       "transformer.decoder.layers.0.multihead_attn.out_proj.bias",
       "transformer.encoder.norm.weight", "output_proj.bias", "bn.weight"},
      1e-6, 1e-5);
}

}  // namespace
}  // namespace fsdp::nn
