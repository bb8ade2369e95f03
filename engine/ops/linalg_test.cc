#include "engine/ops/linalg.h"

#include <gtest/gtest.h>

#include "engine/ops/compare.h"
#include "engine/ops/shape_ops.h"
#include "engine/testing/ops_test_util.h"

namespace fsdp::ops::kernels {
namespace {

using testing::ExpectGradientsMatch;
using testing::ExpectValues;
using testing::Randn;

TEST(KernelLinalg, MmValuesAndTransposeFlags) {
  Tensor a = Tensor::from_doubles({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = Tensor::from_doubles({1, 0, 0, 1, 1, 1}, {3, 2});
  ExpectValues(Mm(a, b), {4, 5, 10, 11}, 0, "mm");
  const Tensor at = Transpose(a, 0, 1), bt = Transpose(b, 0, 1);
  ExpectValues(Mm(at, b, true, false), {4, 5, 10, 11}, 0, "mm ta");
  ExpectValues(Mm(a, bt, false, true), {4, 5, 10, 11}, 0, "mm tb");
  ExpectValues(Mm(at, bt, true, true), {4, 5, 10, 11}, 0, "mm ta tb");
  EXPECT_THROW(Mm(a, a), Error);
  EXPECT_THROW(Mm(a, Tensor::zeros({3, 2}, DType::kInt64)), Error);
  // Empty inner dimension gives zeros.
  ExpectValues(Mm(Tensor::zeros({2, 0}), Tensor::zeros({0, 2})), {0, 0, 0, 0}, 0, "mm k=0");
}

TEST(KernelLinalg, BatchedAndBroadcastMatmul) {
  const Tensor a = Randn({2, 3, 4, 5}, 1), b = Randn({2, 3, 5, 2}, 2);
  const Tensor c = Bmm(a, b);
  ASSERT_EQ(c.sizes(), (Shape{2, 3, 4, 2}));
  // Batch (1, 2) by hand.
  const Tensor ref = Mm(a.select(1).select(2), b.select(1).select(2));
  EXPECT_LT(MaxAbsDiff(c.select(1).select(2), ref), 1e-12);
  const Tensor w = Randn({5, 3}, 3);
  const Tensor m = Matmul(a, w);
  ASSERT_EQ(m.sizes(), (Shape{2, 3, 4, 3}));
  EXPECT_LT(MaxAbsDiff(m.select(0).select(1), Mm(a.select(0).select(1), w)), 1e-12);
  ExpectGradientsMatch([](const std::vector<Tensor>& in) { return Bmm(in[0], in[1]); },
                       [](const Tensor& g, const std::vector<Tensor>& in) {
                         MatmulGrads r = BmmBackward(g, in[0], in[1]);
                         return std::vector<Tensor>{r.a, r.b};
                       },
                       {Randn({2, 3, 4}, 4), Randn({2, 4, 2}, 5)}, "bmm");
  ExpectGradientsMatch([](const std::vector<Tensor>& in) { return Matmul(in[0], in[1]); },
                       [](const Tensor& g, const std::vector<Tensor>& in) {
                         MatmulGrads r = MatmulBackward(g, in[0], in[1]);
                         return std::vector<Tensor>{r.a, r.b};
                       },
                       {Randn({2, 1, 3, 4}, 6), Randn({3, 4, 2}, 7)}, "broadcast matmul");
  ExpectGradientsMatch([](const std::vector<Tensor>& in) { return Mm(in[0], in[1]); },
                       [](const Tensor& g, const std::vector<Tensor>& in) {
                         MatmulGrads r = MmBackward(g, in[0], in[1]);
                         return std::vector<Tensor>{r.a, r.b};
                       },
                       {Randn({3, 4}, 8), Randn({4, 2}, 9)}, "mm");
}

TEST(KernelLinalg, AddmmAndLinear) {
  const Tensor x = Randn({4, 3}, 10), w = Randn({2, 3}, 11), b = Randn({2}, 12);
  const Tensor y = Linear(x, w, b);
  EXPECT_LT(MaxAbsDiff(y, Addmm(b, x, w, false, true)), 1e-12);
  const std::vector<double> xv = x.to_doubles(), wv = w.to_doubles(), bv = b.to_doubles();
  EXPECT_NEAR(y.to_doubles()[3], xv[3] * wv[3] + xv[4] * wv[4] + xv[5] * wv[5] + bv[1], 1e-12);
  // Leading batch dims.
  const Tensor x3 = Randn({2, 3, 3}, 13);
  ASSERT_EQ(Linear(x3, w, b).sizes(), (Shape{2, 3, 2}));
  ASSERT_EQ(Linear(Randn({3}, 14), w).sizes(), (Shape{2}));
  EXPECT_THROW(Linear(x, Randn({2, 4}, 1)), Error);
  EXPECT_THROW(Linear(x, w, Randn({3}, 1)), Error);
  ExpectGradientsMatch([](const std::vector<Tensor>& in) { return Linear(in[0], in[1], in[2]); },
                       [](const Tensor& g, const std::vector<Tensor>& in) {
                         LinearGrads r = LinearBackward(g, in[0], in[1], true);
                         return std::vector<Tensor>{r.input, r.weight, r.bias};
                       },
                       {x3, w, b}, "linear 3-D");
  ExpectGradientsMatch([](const std::vector<Tensor>& in) { return Linear(in[0], in[1]); },
                       [](const Tensor& g, const std::vector<Tensor>& in) {
                         LinearGrads r = LinearBackward(g, in[0], in[1], false);
                         return std::vector<Tensor>{r.input, r.weight};
                       },
                       {x, w}, "linear no bias");
}

TEST(KernelLinalg, ReducedPrecisionMatmul) {
  const Tensor a = Randn({3, 8}, 20, DType::kFloat32), b = Randn({8, 2}, 21, DType::kFloat32);
  const Tensor ab = a.to(DType::kBFloat16), bb = b.to(DType::kBFloat16);
  const Tensor c = Mm(ab, bb);
  EXPECT_EQ(c.dtype(), DType::kBFloat16);
  // Equal to the float product of the bfloat16 operands, rounded once.
  const Tensor ref = Mm(ab.to(DType::kFloat32), bb.to(DType::kFloat32)).to(DType::kBFloat16);
  EXPECT_EQ(MaxAbsDiff(c, ref), 0.0);
}

}  // namespace
}  // namespace fsdp::ops::kernels
