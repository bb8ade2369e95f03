#include "reference/tensor.h"

#include <gtest/gtest.h>

#include "reference/loss.h"

namespace fsdp::reference {
namespace {

TEST(TensorTest, ConstructionAndShapes) {
  EXPECT_EQ(NumelOf({2, 3}), 6);
  EXPECT_EQ(NumelOf({}), 1);
  EXPECT_EQ(NumelOf({4, 0}), 0);
  EXPECT_EQ(ShapeToString({2, 3}), "[2, 3]");
  EXPECT_EQ(ShapeToString({}), "[]");
  const RefTensor z({2, 2});
  EXPECT_EQ(z.data, (std::vector<double>{0, 0, 0, 0}));
  EXPECT_EQ(z.size(-1), 2);
  EXPECT_THROW(z.size(2), std::out_of_range);
  EXPECT_THROW(RefTensor({2}, {1, 2, 3}), std::invalid_argument);
  EXPECT_THROW(IndexTensor({2}, {1}), std::invalid_argument);
  const RefTensor def;
  EXPECT_EQ(def.shape, (Shape{0}));
  EXPECT_EQ(RefTensor(Shape{}, {7}).numel(), 1);
}

TEST(TensorTest, DeterministicUniformValues) {
  const RefTensor a = UniformTensor<double>({100}, 42, -1, 1);
  EXPECT_EQ(a, UniformTensor<double>({100}, 42, -1, 1));
  EXPECT_NE(a, UniformTensor<double>({100}, 43, -1, 1));
  for (double v : a.data) {
    EXPECT_GE(v, -1);
    EXPECT_LT(v, 1);
  }
  // float draws the same values, rounded.
  EXPECT_EQ(UniformTensor<float>({100}, 42, -1, 1), CastTensor<float>(a));
  const IndexTensor ids = UniformIndices({50}, 7, 3);
  for (int64_t v : ids.data) {
    EXPECT_GE(v, 0);
    EXPECT_LT(v, 3);
  }
}

TEST(TensorTest, SliceConcatAndCompare) {
  const RefTensor t({3, 2}, {0, 1, 2, 3, 4, 5});
  EXPECT_EQ(SliceRows(t, 1, 3), RefTensor({2, 2}, {2, 3, 4, 5}));
  EXPECT_EQ(SliceRows(t, 3, 3), RefTensor({0, 2}, {}));
  EXPECT_THROW(SliceRows(t, 2, 4), std::invalid_argument);
  EXPECT_EQ(ConcatRows<double>({SliceRows(t, 0, 1), SliceRows(t, 1, 3)}), t);
  EXPECT_THROW(ConcatRows<double>({t, RefTensor({1, 3})}), std::invalid_argument);
  EXPECT_EQ(SliceRows(IndexTensor({2, 2}, {1, 2, 3, 4}), 1, 2), IndexTensor({1, 2}, {3, 4}));

  RefTensor u = t;
  u[5] += 1e-9;
  EXPECT_DOUBLE_EQ(MaxAbsDiff(t, u), MaxAbsDiff(u, t));
  EXPECT_TRUE(AllClose(u, t, 0, 1e-8));
  EXPECT_FALSE(AllClose(u, t, 0, 1e-10));
  std::string why;
  EXPECT_FALSE(AllCloseMaps<double>({{"a", u}}, {{"a", t}}, 0, 1e-10, &why));
  EXPECT_NE(why.find("'a' element 5"), std::string::npos) << why;
  EXPECT_FALSE(AllCloseMaps<double>({{"a", t}}, {{"b", t}}, 1, 1, &why));
}

TEST(LossSpecTest, OutputGradientSlots) {
  const std::vector<RefTensor> outs = {RefTensor({2}, {1, 2}), RefTensor({2}, {3, 4})};
  const LossResult<double> sum0 = ComputeLoss(SumLoss({0}), outs);
  EXPECT_EQ(sum0.loss, 3);
  EXPECT_TRUE(sum0.output_grads[0].has_value());
  EXPECT_FALSE(sum0.output_grads[1].has_value());  // unused output: no gradient

  const LossResult<double> both = ComputeLoss(SumLoss({0, 1}), outs);
  EXPECT_EQ(both.loss, 10);
  EXPECT_EQ(*both.output_grads[1], RefTensor({2}, {1, 1}));

  const LossResult<double> prod = ComputeLoss(ProductSumLoss(0, 1), outs);
  EXPECT_EQ(prod.loss, 1 * 3 + 2 * 4);
  EXPECT_EQ(*prod.output_grads[0], outs[1]);
  EXPECT_EQ(*prod.output_grads[1], outs[0]);

  const LossResult<double> square = ComputeLoss(ProductSumLoss(0, 0), outs);  // (a * a).sum()
  EXPECT_EQ(*square.output_grads[0], RefTensor({2}, {2, 4}));

  const LossResult<double> mean = ComputeLoss(MeanLoss({1}), outs);
  EXPECT_EQ(mean.loss, 3.5);
  EXPECT_EQ(*mean.output_grads[1], RefTensor({2}, {0.5, 0.5}));

  EXPECT_THROW(ComputeLoss(SumLoss({2}), outs), std::invalid_argument);
  const std::vector<RefTensor> logits = {RefTensor({1, 2, 2}, {0, 0, 0, 0})};
  const LossResult<double> ce =
      ComputeLoss(CrossEntropyLoss(Reduction::kSum), logits, IndexTensor({1, 2}, {0, 1}));
  EXPECT_NEAR(ce.loss, 2 * std::log(2.0), 1e-15);
  EXPECT_EQ(ce.output_grads[0]->shape, (Shape{1, 2, 2}));
  EXPECT_THROW(ComputeLoss(CrossEntropyLoss(), logits), std::invalid_argument);  // no targets
}

}  // namespace
}  // namespace fsdp::reference
