#include "engine/ops/elementwise.h"

#include <gtest/gtest.h>

#include <cmath>

#include "engine/ops/broadcast.h"
#include "engine/ops/compare.h"
#include "engine/testing/ops_test_util.h"

namespace fsdp::ops::kernels {
namespace {

using testing::ExpectGradientsMatch;
using testing::ExpectValues;
using testing::Randn;
using testing::Uniform;

constexpr DType kF64 = DType::kFloat64;

TEST(KernelBroadcast, ShapesAndErrors) {
  EXPECT_EQ(BroadcastShapes({2, 3}, {3}), (Shape{2, 3}));
  EXPECT_EQ(BroadcastShapes({2, 1, 4}, {3, 1}), (Shape{2, 3, 4}));
  EXPECT_EQ(BroadcastShapes({}, {5}), (Shape{5}));
  try {
    BroadcastShapes({2, 3}, {4}, "add");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("add"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("[2, 3]"), std::string::npos);
  }
}

TEST(KernelBroadcast, TypePromotion) {
  EXPECT_EQ(PromoteTypes(DType::kFloat32, DType::kFloat64), DType::kFloat64);
  EXPECT_EQ(PromoteTypes(DType::kBFloat16, DType::kFloat16), DType::kFloat32);
  EXPECT_EQ(PromoteTypes(DType::kInt64, DType::kBFloat16), DType::kBFloat16);
  // A 0-d float64 tensor does not raise a dimensioned float32 tensor.
  EXPECT_EQ(ResultType(Tensor::zeros({3}), Tensor::zeros({}, kF64)), DType::kFloat32);
  // ... but a float 0-d tensor does raise an int64 tensor.
  EXPECT_EQ(ResultType(Tensor::zeros({3}, DType::kInt64), Tensor::zeros({}, kF64)), kF64);
  EXPECT_EQ(ResultTypeWithScalar(Tensor::zeros({3}, DType::kInt64), 2.0), DType::kInt64);
  EXPECT_EQ(ResultTypeWithScalar(Tensor::zeros({3}, DType::kInt64), 0.5), DType::kFloat32);
}

TEST(KernelBroadcast, ExpandAndSumToShape) {
  Tensor x = Tensor::from_doubles({1, 2, 3}, {3, 1}, kF64);
  Tensor e = Expand(x, {2, 3, 2});
  ExpectValues(e, {1, 1, 2, 2, 3, 3, 1, 1, 2, 2, 3, 3}, 0, "expand");
  Tensor s = SumToShape(e, {3, 1});
  ExpectValues(s, {4, 8, 12}, 0, "sum_to_size");
  ExpectValues(SumToShape(e, {1, 2}), {12, 12}, 0, "sum_to_size keep");
  ExpectValues(SumToShape(e, {}), {24}, 0, "sum_to_size scalar");
  EXPECT_THROW(SumToShape(e, {4}), Error);
}

TEST(KernelElementwise, BroadcastingValues) {
  Tensor a = Tensor::from_doubles({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = Tensor::from_doubles({10, 20, 30}, {3});
  ExpectValues(Add(a, b), {11, 22, 33, 14, 25, 36}, 0, "add");
  ExpectValues(Sub(a, b, 0.5), {-4, -8, -12, -1, -5, -9}, 0, "sub alpha");
  Tensor col = Tensor::from_doubles({2, 3}, {2, 1});
  ExpectValues(Mul(col, b), {20, 40, 60, 30, 60, 90}, 0, "outer mul");
  ExpectValues(Div(a, col), {0.5, 1, 1.5, 4.0 / 3, 5.0 / 3, 2}, 1e-6, "div");
  // Leading broadcast on the left operand.
  ExpectValues(Add(b, a), {11, 22, 33, 14, 25, 36}, 0, "add reversed");
  EXPECT_THROW(Add(a, Tensor::zeros({2})), Error);
}

TEST(KernelElementwise, DtypesOfResults) {
  Tensor i = Tensor::from_int64s({1, 2, 3}, {3});
  EXPECT_EQ(Add(i, i).dtype(), DType::kInt64);
  EXPECT_EQ(Add(i, i).to_int64s(), (std::vector<int64_t>{2, 4, 6}));
  EXPECT_EQ(Div(i, i).dtype(), DType::kFloat32);
  EXPECT_EQ(MulScalar(i, 0.5).dtype(), DType::kFloat32);
  EXPECT_EQ(Neg(i).to_int64s(), (std::vector<int64_t>{-1, -2, -3}));
  EXPECT_EQ(Exp(i).dtype(), DType::kFloat32);
  Tensor h = Tensor::from_doubles({1}, {1}, DType::kBFloat16);
  EXPECT_EQ(Add(h, Tensor::from_doubles({1}, {1}, DType::kFloat16)).dtype(), DType::kFloat32);
  EXPECT_EQ(Add(h, Tensor::from_doubles({1}, {1}, DType::kFloat32)).dtype(), DType::kFloat32);
  EXPECT_EQ(Add(h, h).dtype(), DType::kBFloat16);
}

TEST(KernelElementwise, ReducedPrecisionRoundsOnce) {
  // bfloat16 has 8 significand bits: 1 + 2^-8 is a tie and rounds to even (1), 1 + 3 * 2^-9
  // rounds up to 1 + 2^-7. Both operands are exact in bfloat16; the sum is computed in float.
  Tensor one = Tensor::from_doubles({1, 1}, {2}, DType::kBFloat16);
  Tensor d = Tensor::from_doubles({std::ldexp(1.0, -8), 3 * std::ldexp(1.0, -9)}, {2}, DType::kBFloat16);
  ExpectValues(Add(one, d), {1.0, 1.0 + std::ldexp(1.0, -7)}, 0, "bf16 add");
  // float16 (11 bits): 1 + 2^-11 ties to 1, 1 + 3 * 2^-12 rounds to 1 + 2^-10.
  Tensor oneh = Tensor::from_doubles({1, 1}, {2}, DType::kFloat16);
  Tensor dh = Tensor::from_doubles({std::ldexp(1.0, -11), 3 * std::ldexp(1.0, -12)}, {2}, DType::kFloat16);
  ExpectValues(Add(oneh, dh), {1.0, 1.0 + std::ldexp(1.0, -10)}, 0, "f16 add");
  // Scalar ops compute in float: 0.1 * 3 in bfloat16 = round_bf16(float(bf16(0.1)) * 3).
  Tensor x = Tensor::from_doubles({0.1}, {1}, DType::kBFloat16);
  const float expected = static_cast<float>(BFloat16(static_cast<float>(BFloat16(0.1f)) * 3.0f));
  ExpectValues(MulScalar(x, 3.0), {expected}, 0, "bf16 scalar mul");
}

TEST(KernelElementwise, BinaryGradientsWithBroadcasting) {
  const Tensor a = Randn({2, 1, 3}, 1), b = Randn({4, 1}, 2);
  const Tensor pos = Uniform({4, 1}, 3, 0.5, 2.0);
  ExpectGradientsMatch([](const std::vector<Tensor>& in) { return Add(in[0], in[1], 0.7); },
                       [](const Tensor& g, const std::vector<Tensor>& in) {
                         BinaryGrads r = AddBackward(g, in[0], in[1], 0.7);
                         return std::vector<Tensor>{r.a, r.b};
                       },
                       {a, b}, "add");
  ExpectGradientsMatch([](const std::vector<Tensor>& in) { return Sub(in[0], in[1], 2.0); },
                       [](const Tensor& g, const std::vector<Tensor>& in) {
                         BinaryGrads r = SubBackward(g, in[0], in[1], 2.0);
                         return std::vector<Tensor>{r.a, r.b};
                       },
                       {a, b}, "sub");
  ExpectGradientsMatch([](const std::vector<Tensor>& in) { return Mul(in[0], in[1]); },
                       [](const Tensor& g, const std::vector<Tensor>& in) {
                         BinaryGrads r = MulBackward(g, in[0], in[1]);
                         return std::vector<Tensor>{r.a, r.b};
                       },
                       {a, b}, "mul");
  ExpectGradientsMatch([](const std::vector<Tensor>& in) { return Div(in[0], in[1]); },
                       [](const Tensor& g, const std::vector<Tensor>& in) {
                         BinaryGrads r = DivBackward(g, in[0], in[1]);
                         return std::vector<Tensor>{r.a, r.b};
                       },
                       {a, pos}, "div");
  // Scalar (0-d) second operand.
  ExpectGradientsMatch([](const std::vector<Tensor>& in) { return Mul(in[0], in[1]); },
                       [](const Tensor& g, const std::vector<Tensor>& in) {
                         BinaryGrads r = MulBackward(g, in[0], in[1]);
                         return std::vector<Tensor>{r.a, r.b};
                       },
                       {a, Tensor::full({}, 1.5, kF64)}, "mul by 0-d");
}

TEST(KernelElementwise, UnaryAndScalarGradients) {
  const Tensor x = Randn({2, 3}, 7);
  const Tensor p = Uniform({2, 3}, 8, 0.3, 3.0);
  auto check_unary = [](const char* name, const Tensor& in, auto fwd, auto bwd) {
    ExpectGradientsMatch([fwd](const std::vector<Tensor>& v) { return fwd(v[0]); },
                         [fwd, bwd](const Tensor& g, const std::vector<Tensor>& v) {
                           return std::vector<Tensor>{bwd(g, v[0], fwd(v[0]))};
                         },
                         {in}, name);
  };
  check_unary("exp", x, [](const Tensor& v) { return Exp(v); },
              [](const Tensor& g, const Tensor&, const Tensor& y) { return ExpBackward(g, y); });
  check_unary("log", p, [](const Tensor& v) { return Log(v); },
              [](const Tensor& g, const Tensor& v, const Tensor&) { return LogBackward(g, v); });
  check_unary("sqrt", p, [](const Tensor& v) { return Sqrt(v); },
              [](const Tensor& g, const Tensor&, const Tensor& y) { return SqrtBackward(g, y); });
  check_unary("rsqrt", p, [](const Tensor& v) { return Rsqrt(v); },
              [](const Tensor& g, const Tensor&, const Tensor& y) { return RsqrtBackward(g, y); });
  check_unary("reciprocal", p, [](const Tensor& v) { return Reciprocal(v); },
              [](const Tensor& g, const Tensor&, const Tensor& y) { return ReciprocalBackward(g, y); });
  check_unary("neg", x, [](const Tensor& v) { return Neg(v); },
              [](const Tensor& g, const Tensor&, const Tensor&) { return Neg(g); });
  for (double e : {2.0, 3.0, 0.5, -0.5, -1.0, 1.7, 0.0}) {
    check_unary("pow", p, [e](const Tensor& v) { return PowScalar(v, e); },
                [e](const Tensor& g, const Tensor& v, const Tensor&) { return PowScalarBackward(g, v, e); });
  }
  check_unary("add scalar", x, [](const Tensor& v) { return AddScalar(v, 2.5); },
              [](const Tensor& g, const Tensor&, const Tensor&) { return g; });
  check_unary("rsub scalar", x, [](const Tensor& v) { return RSubScalar(v, 2.5); },
              [](const Tensor& g, const Tensor&, const Tensor&) { return Neg(g); });
  check_unary("div scalar", x, [](const Tensor& v) { return DivScalar(v, 4.0); },
              [](const Tensor& g, const Tensor&, const Tensor&) { return DivScalar(g, 4.0); });
  ExpectValues(PowScalar(Tensor::from_doubles({2, 3}, {2}, kF64), 2.0), {4, 9}, 0, "pow 2");
  ExpectValues(RSubScalar(Tensor::from_doubles({2, 3}, {2}, kF64), 1.0), {-1, -2}, 0, "rsub");
}

}  // namespace
}  // namespace fsdp::ops::kernels
