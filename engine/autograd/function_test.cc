// Custom autograd functions (function.h) and saved-tensor hooks (saved_tensor_hooks.h).
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "engine/testing/autograd_test_util.h"

namespace fsdp::autograd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::Filled;
using testing::Mat;
using testing::Mul;
using testing::OrderRecorder;
using testing::Param;
using testing::RawMap;
using testing::RawZip;
using testing::Relu;
using testing::Sum;

// out = x * w * factor; saves x and w, keeps factor in saved_data.
struct ScaledMul : Function<ScaledMul> {
  static constexpr const char* kName = "ScaledMulBackward";
  static inline int forward_calls = 0;
  static inline bool forward_saw_grad_mode = true;
  static inline uint64_t forward_seq = 0;

  static TensorList forward(FunctionCtx* ctx, const TensorList& in, double factor) {
    ++forward_calls;
    forward_saw_grad_mode = GradMode::is_enabled();
    forward_seq = sequence_number::peek();
    ctx->saved_data["factor"] = factor;
    ctx->save_for_backward({in[0], in[1]});
    Tensor prod = Mul(in[0], in[1]);  // records nothing: forward runs under no-grad
    EXPECT_EQ(prod.grad_fn(), nullptr);
    return {RawMap(prod, [factor](double v) { return v * factor; })};
  }
  static TensorList backward(FunctionCtx* ctx, const TensorList& grads) {
    const double factor = std::any_cast<double>(ctx->saved_data.at("factor"));
    TensorList saved = ctx->saved_tensors();
    auto mul = [factor](double a, double b) { return a * b * factor; };
    return {ctx->needs_input_grad(0) ? RawZip(grads[0], saved[1], mul) : Tensor(),
            ctx->needs_input_grad(1) ? RawZip(grads[0], saved[0], mul) : Tensor()};
  }
};

TEST(AutogradFunctionTest, ForwardUnderNoGradBackwardWithCtx) {
  Tensor x = Param(1, 3, 1);
  Tensor w = Filled(1, 3, 2);  // needs no grad
  const uint64_t before = sequence_number::peek();
  TensorList out = ScaledMul::apply({x, w}, 3.0);
  EXPECT_FALSE(ScaledMul::forward_saw_grad_mode);
  EXPECT_EQ(ScaledMul::forward_seq, before + 1) << "the node took its number before forward ran";
  ASSERT_NE(out[0].grad_fn(), nullptr);
  EXPECT_EQ(out[0].grad_fn()->sequence_nr(), before);
  EXPECT_EQ(out[0].grad_fn()->name(), "ScaledMulBackward");
  Sum(out[0]).backward();
  const std::vector<double> wv = w.to_doubles();
  const std::vector<double> g = x.grad().to_doubles();
  for (size_t i = 0; i < g.size(); ++i) EXPECT_DOUBLE_EQ(g[i], 3.0 * wv[i]);
  EXPECT_FALSE(w.grad().defined());
}

TEST(AutogradFunctionTest, NoNodeWithoutGrad) {
  Tensor x = Filled(1, 3, 1);
  TensorList out = ScaledMul::apply({x, x}, 1.0);
  EXPECT_EQ(out[0].grad_fn(), nullptr);
  Tensor p = Param(1, 3, 2);
  NoGradGuard no_grad;
  EXPECT_EQ(ScaledMul::apply({p, x}, 1.0)[0].grad_fn(), nullptr);
}

TEST(AutogradFunctionTest, SavedTensorsReleasedWithoutRetainGraph) {
  Tensor x = Param(1, 3, 1);
  Tensor loss = Sum(ScaledMul::apply({x, Filled(1, 3, 2)}, 1.0)[0]);
  loss.backward(Tensor(), true);
  loss.backward();
  try {
    loss.backward();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("Trying to backward through the graph a second time"));
  }
}

// Identity on two inputs, but backward returns no gradient for the second.
struct DropSecond : Function<DropSecond> {
  static TensorList forward(FunctionCtx*, const TensorList& in) { return {in[0].clone(), in[1].clone()}; }
  static TensorList backward(FunctionCtx*, const TensorList& grads) { return {grads[0], Tensor()}; }
};

TEST(AutogradFunctionTest, UndefinedGradStillRunsAccumulateGrad) {
  OrderRecorder rec;
  Tensor x = Param(1, 2, 1);
  Tensor w = Param(1, 2, 2);
  int post_acc_w = 0;
  register_post_accumulate_grad_hook(w, [&](const Tensor&) { ++post_acc_w; });
  TensorList out = DropSecond::apply({x, w});
  EXPECT_EQ(out[0].grad_fn()->name(), "CustomFunctionBackward");
  std::vector<bool> w_grad_defined;
  try_get_grad_accumulator(w)->register_prehook(
      [&](const TensorList& g) { w_grad_defined.push_back(g[0].defined()); });
  rec.LabelLeaf(x, "x");
  rec.LabelLeaf(w, "w");
  Sum(testing::Add(out[0], out[1])).backward();
  EXPECT_THAT(rec.log, ElementsAre("Acc(x)", "Acc(w)"));
  EXPECT_THAT(w_grad_defined, ElementsAre(false));
  EXPECT_FALSE(w.grad().defined());
  EXPECT_EQ(post_acc_w, 0) << "no accumulation, no post-accumulate hooks";
  EXPECT_TRUE(x.grad().defined());
}

struct TwoOutputs : Function<TwoOutputs> {
  static inline bool materialize = true;
  static inline std::vector<bool> seen_defined;
  static TensorList forward(FunctionCtx* ctx, const TensorList& in) {
    ctx->set_materialize_grads(materialize);
    return {in[0].clone(), in[0].clone()};
  }
  static TensorList backward(FunctionCtx*, const TensorList& grads) {
    seen_defined = {grads[0].defined(), grads[1].defined()};
    if (grads[1].defined()) {
      EXPECT_EQ(grads[1].to_doubles(), (std::vector<double>{0, 0}));
    }
    return {grads[0], Tensor(), Tensor()};  // trailing undefined extras are allowed
  }
};

TEST(AutogradFunctionTest, MaterializeGrads) {
  for (bool materialize : {true, false}) {
    TwoOutputs::materialize = materialize;
    Tensor x = Param(1, 2, 1);
    TensorList out = TwoOutputs::apply({x});
    Sum(out[0]).backward();
    EXPECT_THAT(TwoOutputs::seen_defined, ElementsAre(true, materialize));
  }
}

struct WrongCount : Function<WrongCount> {
  static TensorList forward(FunctionCtx*, const TensorList& in) { return {in[0].clone()}; }
  static TensorList backward(FunctionCtx*, const TensorList& grads) { return {grads[0], grads[0]}; }
};

TEST(AutogradFunctionTest, WrongGradientCountIsAnError) {
  Tensor x = Param(1, 2, 1);
  try {
    Sum(WrongCount::apply({x})[0]).backward();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("returned an incorrect number of gradients (expected 1, got 2)"));
  }
}

struct ReturnsInput : Function<ReturnsInput> {
  static TensorList forward(FunctionCtx* ctx, const TensorList& in) {
    Tensor idx = Tensor::from_int64s({0}, {1});
    Tensor marked = in[0].clone();
    ctx->mark_non_differentiable({marked});
    return {in[0], idx, marked};
  }
  static TensorList backward(FunctionCtx*, const TensorList& grads) { return {grads[0]}; }
};

TEST(AutogradFunctionTest, InputReturnedAsIsBecomesAliasAndNonDifferentiableOutputs) {
  Tensor x = Param(1, 2, 1);
  TensorList out = ReturnsInput::apply({x});
  EXPECT_FALSE(out[0].is_same(x));
  EXPECT_TRUE(x.is_leaf());
  EXPECT_NE(out[0].grad_fn(), nullptr);
  EXPECT_EQ(out[0].storage(), x.storage());
  EXPECT_EQ(out[1].grad_fn(), nullptr);
  EXPECT_FALSE(out[2].requires_grad());
  Sum(out[0]).backward();
  EXPECT_EQ(x.grad().to_doubles(), (std::vector<double>{1, 1}));
}

TEST(AutogradSavedTensorHooksTest, PackUnpackInnermostWins) {
  std::vector<std::string> log;
  Tensor x = Param(1, 2, 1);
  Tensor loss;
  {
    SavedTensorHooksGuard outer(
        [&](const Tensor& t) -> std::any {
          log.push_back("outer_pack");
          return t;
        },
        [&](const std::any& p) {
          log.push_back("outer_unpack");
          return std::any_cast<Tensor>(p);
        });
    Tensor h = Relu(x);  // saves its output through `outer`
    {
      SavedTensorHooksGuard inner(
          [&](const Tensor& t) -> std::any {
            log.push_back("inner_pack");
            return t.clone();
          },
          [&](const std::any& p) {
            log.push_back("inner_unpack");
            return std::any_cast<Tensor>(p);
          });
      loss = Sum(Mul(h, Filled(1, 2, 3)));  // saves two tensors through `inner`
    }
    EXPECT_EQ(saved_tensor_hooks_depth(), 1u);
  }
  EXPECT_EQ(saved_tensor_hooks_depth(), 0u);
  EXPECT_THAT(log, ElementsAre("outer_pack", "inner_pack", "inner_pack"));
  log.clear();
  loss.backward();
  EXPECT_THAT(log, ElementsAre("inner_unpack", "inner_unpack", "outer_unpack"));
  EXPECT_TRUE(x.grad().defined());
}

TEST(AutogradSavedTensorHooksTest, HooksAreThreadLocalAndUnpackIsDetached) {
  int packs = 0;
  SavedTensorHooksGuard guard([&](const Tensor& t) -> std::any {
    ++packs;
    return t;
  }, [](const std::any& p) { return std::any_cast<Tensor>(p); });
  std::thread other([] {
    EXPECT_EQ(saved_tensor_hooks_depth(), 0u);
    Tensor y = Param(1, 2, 2);
    Sum(Relu(y)).backward();
  });
  other.join();
  EXPECT_EQ(packs, 0);
  Tensor x = Param(1, 2, 1);
  SavedTensor saved(x);
  EXPECT_EQ(packs, 1);
  Tensor unpacked = saved.unpack();
  EXPECT_FALSE(unpacked.requires_grad());
  EXPECT_EQ(unpacked.storage(), x.storage());
  SavedTensor kept(x, /*keep_history=*/true);
  EXPECT_TRUE(kept.unpack().requires_grad());
  kept.release();
  EXPECT_THROW(kept.unpack(), Error);
}

}  // namespace
}  // namespace fsdp::autograd
