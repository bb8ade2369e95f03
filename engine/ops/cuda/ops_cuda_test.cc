// GPU tests (ctest label `gpu`): every CUDA kernel against its CPU kernel for every supported
// dtype, through the public kernels of engine/ops (so the dispatch is exercised too), plus
// streams and events. Every test skips with "no CUDA device visible" where there is none.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <vector>

#include "engine/core/allocator.h"
#include "engine/core/cuda_stream.h"
#include "engine/core/rng.h"
#include "engine/ops/kernels.h"

namespace fsdp::ops::kernels {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible"

const Device kGpu = Device::CUDA(0);
const DType kFloatTypes[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16};

double Tol(DType d) {
  switch (d) {
    case DType::kFloat64: return 1e-10;
    case DType::kFloat16: return 2e-2;
    case DType::kBFloat16: return 6e-2;
    default: return 2e-5;
  }
}

Tensor Rand(const Shape& s, DType d, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  Generator g(seed);
  std::vector<double> v(static_cast<size_t>(Numel(s)));
  for (double& x : v) x = lo + (hi - lo) * g.uniform_double();
  return Tensor::from_doubles(v, s, d);
}

Tensor G(const Tensor& t) { return t.defined() ? t.to(kGpu) : t; }

// The CUDA result equals the CPU result: same shape, dtype, device, values within tol
// (relative to max(1, |cpu|)); exact when tol == 0.
void ExpectMatches(const Tensor& gpu, const Tensor& cpu, double tol, const std::string& what) {
  ASSERT_EQ(gpu.defined(), cpu.defined()) << what;
  if (!cpu.defined()) return;
  EXPECT_TRUE(gpu.device().is_cuda()) << what << ": " << gpu.str();
  EXPECT_EQ(gpu.dtype(), cpu.dtype()) << what;
  ASSERT_EQ(gpu.sizes(), cpu.sizes()) << what;
  const std::vector<double> a = gpu.to_doubles(), b = cpu.to_doubles();
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(b[i])) {
      EXPECT_TRUE(std::isnan(a[i])) << what << " @" << i;
      continue;
    }
    if (tol == 0.0) {
      ASSERT_EQ(a[i], b[i]) << what << " @" << i;
    } else {
      ASSERT_NEAR(a[i], b[i], tol * std::max(1.0, std::fabs(b[i]))) << what << " @" << i;
    }
  }
}

TEST(CudaOps, ElementwiseBinaryUnaryAndBackward) {
  SKIP_WITHOUT_GPU();
  for (DType d : kFloatTypes) {
    const Tensor a = Rand({4, 1, 6}, d, 1), b = Rand({3, 1}, d, 2, 0.5, 2.0), x = Rand({5, 7}, d, 3, 0.2, 3.0);
    const std::string n = DTypeName(d);
    ExpectMatches(Add(G(a), G(b), 0.5), Add(a, b, 0.5), Tol(d), "add " + n);
    ExpectMatches(Sub(G(a), G(b)), Sub(a, b), Tol(d), "sub " + n);
    ExpectMatches(Mul(G(a), G(b)), Mul(a, b), Tol(d), "mul " + n);
    ExpectMatches(Div(G(a), G(b)), Div(a, b), Tol(d), "div " + n);
    const Tensor g = Rand({4, 3, 6}, d, 4);
    const BinaryGrads cg = DivBackward(g, a, b), gg = DivBackward(G(g), G(a), G(b));
    ExpectMatches(gg.a, cg.a, Tol(d), "div_backward a " + n);
    ExpectMatches(gg.b, cg.b, Tol(d) * 10, "div_backward b " + n);
    for (auto [name, fn] : std::vector<std::pair<std::string, std::function<Tensor(const Tensor&)>>>{
             {"neg", Neg}, {"exp", Exp}, {"log", Log}, {"sqrt", Sqrt}, {"rsqrt", Rsqrt}, {"reciprocal", Reciprocal},
             {"add_scalar", [](const Tensor& t) { return AddScalar(t, 2.5); }},
             {"rsub", [](const Tensor& t) { return RSubScalar(t, 2.5); }},
             {"div_scalar", [](const Tensor& t) { return DivScalar(t, 3.0); }},
             {"pow", [](const Tensor& t) { return PowScalar(t, 1.7); }},
             {"relu", Relu}, {"gelu", [](const Tensor& t) { return Gelu(t); }},
             {"gelu_tanh", [](const Tensor& t) { return Gelu(t, "tanh"); }}}) {
      ExpectMatches(fn(G(x)), fn(x), Tol(d), name + " " + n);
    }
    const Tensor gx = Rand({5, 7}, d, 5);
    ExpectMatches(PowScalarBackward(G(gx), G(x), 1.7), PowScalarBackward(gx, x, 1.7), Tol(d), "pow_backward " + n);
    ExpectMatches(GeluBackward(G(gx), G(x)), GeluBackward(gx, x), Tol(d), "gelu_backward " + n);
    ExpectMatches(GeluBackward(G(gx), G(x), "tanh"), GeluBackward(gx, x, "tanh"), Tol(d), "gelu_backward tanh " + n);
    ExpectMatches(ReluBackward(G(gx), G(Relu(x))), ReluBackward(gx, Relu(x)), 0.0, "relu_backward " + n);
  }
  const Tensor i = Tensor::from_int64s({1, -2, 3, 4}, {2, 2});
  ExpectMatches(Add(G(i), G(i), 3.0), Add(i, i, 3.0), 0.0, "add int64");
  ExpectMatches(Mul(G(i), Tensor::from_doubles({2.5}, {}, DType::kFloat32)),
                Mul(i, Tensor::from_doubles({2.5}, {}, DType::kFloat32)), 0.0, "mul int64 by a CPU scalar");
}

TEST(CudaOps, DifferentDevicesAreRejectedNamingBoth) {
  SKIP_WITHOUT_GPU();
  const Tensor a = Rand({2, 3}, DType::kFloat32, 1);
  try {
    (void)Mul(G(a), a);
    FAIL() << "expected InvalidArgument";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("cuda:0"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("cpu"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Mm(G(a), a.view({3, 2})), Error);
}

TEST(CudaOps, CastsAndShapeOpsAreBitExact) {
  SKIP_WITHOUT_GPU();
  const DType all[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16, DType::kInt64};
  const Tensor src = Rand({3, 4, 5}, DType::kFloat64, 7, -300.0, 300.0);
  for (DType from : all) {
    const Tensor x = Cast(src, from);
    for (DType to : all) ExpectMatches(Cast(G(x), to), Cast(x, to), 0.0, std::string("cast ") + DTypeName(from) + "->" + DTypeName(to));
    ExpectMatches(Permute(G(x), {2, 0, 1}), Permute(x, {2, 0, 1}), 0.0, "permute");
    ExpectMatches(Transpose(G(x), 0, 2), Transpose(x, 0, 2), 0.0, "transpose");
    ExpectMatches(Narrow(G(x), 1, 1, 2), Narrow(x, 1, 1, 2), 0.0, "narrow");
    ExpectMatches(NarrowBackward(G(Narrow(x, 2, 1, 3)), x.sizes(), 2, 1), NarrowBackward(Narrow(x, 2, 1, 3), x.sizes(), 2, 1),
                  0.0, "narrow_backward");
    ExpectMatches(Cat({G(x), G(Narrow(x, 1, 0, 2))}, 1), Cat({x, Narrow(x, 1, 0, 2)}, 1), 0.0, "cat");
    ExpectMatches(Expand(G(x.narrow(0, 0, 1)), {2, 3, 4, 5}), Expand(x.narrow(0, 0, 1), {2, 3, 4, 5}), 0.0, "expand");
  }
}

TEST(CudaOps, Reductions) {
  SKIP_WITHOUT_GPU();
  for (DType d : kFloatTypes) {
    const Tensor x = Rand({3, 4, 70}, d, 8);
    const std::string n = DTypeName(d);
    ExpectMatches(Sum(G(x)), Sum(x), Tol(d) * 10, "sum " + n);
    ExpectMatches(Sum(G(x), {0, 2}, true), Sum(x, {0, 2}, true), Tol(d) * 10, "sum dims " + n);
    ExpectMatches(Sum(G(x), {1}), Sum(x, {1}), Tol(d), "sum dim 1 " + n);
    ExpectMatches(Mean(G(x)), Mean(x), Tol(d), "mean " + n);
    ExpectMatches(Mean(G(x), {-1}), Mean(x, {-1}), Tol(d), "mean last " + n);
    ExpectMatches(SumToShape(G(x), {4, 1}), SumToShape(x, {4, 1}), Tol(d) * 10, "sum_to_size " + n);
  }
  const Tensor i = Tensor::from_int64s({1, 2, 3, 4, 5, 6}, {2, 3});
  ExpectMatches(Sum(G(i), {1}), Sum(i, {1}), 0.0, "sum int64");
}

TEST(CudaOps, SoftmaxAndLosses) {
  SKIP_WITHOUT_GPU();
  for (DType d : kFloatTypes) {
    const Tensor x = Rand({6, 40}, d, 9, -4.0, 4.0), g = Rand({6, 40}, d, 10);
    const std::string n = DTypeName(d);
    for (int64_t dim : {0, 1}) {
      const Tensor y = Softmax(x, dim), ly = LogSoftmax(x, dim);
      ExpectMatches(Softmax(G(x), dim), y, Tol(d), "softmax " + n);
      ExpectMatches(LogSoftmax(G(x), dim), ly, Tol(d), "log_softmax " + n);
      ExpectMatches(SoftmaxBackward(G(g), G(y), dim), SoftmaxBackward(g, y, dim), Tol(d), "softmax_backward " + n);
      ExpectMatches(LogSoftmaxBackward(G(g), G(ly), dim), LogSoftmaxBackward(g, ly, dim), Tol(d) * 5,
                    "log_softmax_backward " + n);
    }
    const Tensor t = Tensor::from_int64s({3, -100, 0, 39, 7, 7}, {6});
    for (Reduction r : {Reduction::kMean, Reduction::kSum, Reduction::kNone}) {
      const Tensor loss = CrossEntropy(x, t, r);
      ExpectMatches(CrossEntropy(G(x), G(t), r), loss, Tol(d) * 5, "cross_entropy " + n);
      const Tensor up = r == Reduction::kNone ? Rand({6}, d, 11) : Tensor::ones({}, d);
      ExpectMatches(CrossEntropyBackward(G(up), G(x), G(t), r), CrossEntropyBackward(up, x, t, r), Tol(d),
                    "cross_entropy_backward " + n);
    }
  }
}

TEST(CudaOps, MatrixProducts) {
  SKIP_WITHOUT_GPU();
  for (DType d : kFloatTypes) {
    const std::string n = DTypeName(d);
    const Tensor a = Rand({5, 7}, d, 12), b = Rand({7, 3}, d, 13), bt = Rand({3, 7}, d, 14), at = Rand({7, 5}, d, 15);
    ExpectMatches(Mm(G(a), G(b)), Mm(a, b), Tol(d) * 5, "mm " + n);
    ExpectMatches(Mm(G(a), G(bt), false, true), Mm(a, bt, false, true), Tol(d) * 5, "mm nt " + n);
    ExpectMatches(Mm(G(at), G(b), true, false), Mm(at, b, true, false), Tol(d) * 5, "mm tn " + n);
    ExpectMatches(Mm(G(at), G(bt), true, true), Mm(at, bt, true, true), Tol(d) * 5, "mm tt " + n);
    const Tensor bias = Rand({3}, d, 16);
    ExpectMatches(Addmm(G(bias), G(a), G(b)), Addmm(bias, a, b), Tol(d) * 5, "addmm " + n);
    const Tensor x = Rand({2, 4, 7}, d, 17), w = Rand({3, 7}, d, 18);
    ExpectMatches(Linear(G(x), G(w), G(bias)), Linear(x, w, bias), Tol(d) * 5, "linear " + n);
    const Tensor gy = Rand({2, 4, 3}, d, 19);
    const LinearGrads cg = LinearBackward(gy, x, w, true), gg = LinearBackward(G(gy), G(x), G(w), true);
    ExpectMatches(gg.input, cg.input, Tol(d) * 5, "linear_backward input " + n);
    ExpectMatches(gg.weight, cg.weight, Tol(d) * 5, "linear_backward weight " + n);
    ExpectMatches(gg.bias, cg.bias, Tol(d) * 5, "linear_backward bias " + n);
    const Tensor p = Rand({2, 3, 4, 5}, d, 20), q = Rand({3, 5, 6}, d, 21);
    ExpectMatches(Matmul(G(p), G(q)), Matmul(p, q), Tol(d) * 5, "matmul broadcast " + n);
    const Tensor gm = Rand({2, 3, 4, 6}, d, 22);
    const MatmulGrads cm = MatmulBackward(gm, p, q), gmm = MatmulBackward(G(gm), G(p), G(q));
    ExpectMatches(gmm.a, cm.a, Tol(d) * 5, "matmul_backward a " + n);
    ExpectMatches(gmm.b, cm.b, Tol(d) * 10, "matmul_backward b " + n);
  }
  ExpectMatches(Mm(G(Tensor::zeros({3, 0})), G(Tensor::zeros({0, 2}))), Mm(Tensor::zeros({3, 0}), Tensor::zeros({0, 2})),
                0.0, "mm k=0");
}

TEST(CudaOps, EmbeddingIsBitExact) {
  SKIP_WITHOUT_GPU();
  const Tensor idx = Tensor::from_int64s({3, 1, 3, 0, 9, 3, 1, 2}, {2, 4});
  for (DType d : kFloatTypes) {
    const Tensor w = Rand({10, 6}, d, 23), g = Rand({2, 4, 6}, d, 24);
    ExpectMatches(Embedding(G(idx), G(w)), Embedding(idx, w), 0.0, std::string("embedding ") + DTypeName(d));
    ExpectMatches(EmbeddingBackward(G(g), G(idx), 10, 1), EmbeddingBackward(g, idx, 10, 1), 0.0,
                  std::string("embedding_backward ") + DTypeName(d));
  }
  EXPECT_THROW(Embedding(G(Tensor::from_int64s({10}, {1})), G(Rand({10, 2}, DType::kFloat32, 1))), Error);
}

TEST(CudaOps, Normalizations) {
  SKIP_WITHOUT_GPU();
  for (DType d : kFloatTypes) {
    const std::string n = DTypeName(d);
    const Tensor x = Rand({3, 5, 48}, d, 25), w = Rand({48}, d, 26, 0.5, 1.5), b = Rand({48}, d, 27), g = Rand({3, 5, 48}, d, 28);
    const LayerNormResult c = LayerNorm(x, {48}, w, b), r = LayerNorm(G(x), {48}, G(w), G(b));
    ExpectMatches(r.output, c.output, Tol(d) * 5, "layer_norm " + n);
    ExpectMatches(r.rstd, c.rstd, Tol(d) * 5, "layer_norm rstd " + n);
    const NormGrads cg = LayerNormBackward(g, x, {48}, c.mean, c.rstd, w);
    const NormGrads gg = LayerNormBackward(G(g), G(x), {48}, r.mean, r.rstd, G(w));
    ExpectMatches(gg.input, cg.input, Tol(d) * 10, "layer_norm_backward input " + n);
    ExpectMatches(gg.weight, cg.weight, Tol(d) * 10, "layer_norm_backward weight " + n);
    ExpectMatches(gg.bias, cg.bias, Tol(d) * 10, "layer_norm_backward bias " + n);
    const RmsNormResult rc = RmsNorm(x, {48}, w), rg = RmsNorm(G(x), {48}, G(w));
    ExpectMatches(rg.output, rc.output, Tol(d) * 5, "rms_norm " + n);
    const NormGrads rcg = RmsNormBackward(g, x, {48}, rc.rstd, w), rgg = RmsNormBackward(G(g), G(x), {48}, rg.rstd, G(w));
    ExpectMatches(rgg.input, rcg.input, Tol(d) * 10, "rms_norm_backward input " + n);
    ExpectMatches(rgg.weight, rcg.weight, Tol(d) * 10, "rms_norm_backward weight " + n);
    // batch_norm [N, C, L], training with running statistics, then eval.
    const Tensor bx = Rand({4, 3, 5}, d, 29), bw = Rand({3}, d, 30, 0.5, 1.5), bb = Rand({3}, d, 31);
    Tensor rm = Rand({3}, d, 32), rv = Rand({3}, d, 33, 0.5, 1.5);
    Tensor grm = G(rm), grv = G(rv);
    Tensor nbt = Tensor::from_int64s({2}, {}), gnbt = G(nbt);
    const BatchNormResult bc = BatchNorm(bx, bw, bb, rm, rv, nbt, true, std::nullopt);
    const BatchNormResult bgr = BatchNorm(G(bx), G(bw), G(bb), grm, grv, gnbt, true, std::nullopt);
    ExpectMatches(bgr.output, bc.output, Tol(d) * 5, "batch_norm " + n);
    ExpectMatches(grm, rm, Tol(d) * 5, "batch_norm running_mean " + n);
    ExpectMatches(grv, rv, Tol(d) * 5, "batch_norm running_var " + n);
    ExpectMatches(gnbt, nbt, 0.0, "batch_norm num_batches_tracked " + n);
    const Tensor bg = Rand({4, 3, 5}, d, 34);
    const NormGrads bcg = BatchNormBackward(bg, bx, bw, bc.save_mean, bc.save_invstd, true);
    const NormGrads bgg = BatchNormBackward(G(bg), G(bx), G(bw), bgr.save_mean, bgr.save_invstd, true);
    ExpectMatches(bgg.input, bcg.input, Tol(d) * 10, "batch_norm_backward input " + n);
    ExpectMatches(bgg.weight, bcg.weight, Tol(d) * 10, "batch_norm_backward weight " + n);
    ExpectMatches(bgg.bias, bcg.bias, Tol(d) * 10, "batch_norm_backward bias " + n);
    ExpectMatches(BatchNorm(G(bx), G(bw), G(bb), grm, grv, Tensor(), false).output,
                  BatchNorm(bx, bw, bb, rm, rv, Tensor(), false).output, Tol(d) * 5, "batch_norm eval " + n);
  }
}

TEST(CudaOps, DropoutMaskIsBitIdenticalToCpu) {
  SKIP_WITHOUT_GPU();
  for (DType d : kFloatTypes) {
    Generator cpu_gen(77), gpu_gen(77);
    const Tensor x = Rand({5, 13}, d, 35);
    const DropoutResult c = Dropout(x, 0.3, cpu_gen), g = Dropout(G(x), 0.3, gpu_gen);
    ExpectMatches(g.mask, c.mask, 0.0, std::string("dropout mask ") + DTypeName(d));
    ExpectMatches(g.output, c.output, 0.0, std::string("dropout output ") + DTypeName(d));
    EXPECT_EQ(gpu_gen.offset(), cpu_gen.offset());
  }
}

TEST(CudaOps, ScaledDotProductAttention) {
  SKIP_WITHOUT_GPU();
  for (DType d : kFloatTypes) {
    const std::string n = DTypeName(d);
    const Tensor q = Rand({2, 3, 5, 8}, d, 36), k = Rand({2, 3, 6, 8}, d, 37), v = Rand({2, 3, 6, 4}, d, 38);
    const Tensor mask = Rand({5, 6}, d, 39), g = Rand({2, 3, 5, 4}, d, 40);
    for (int mode = 0; mode < 3; ++mode) {
      const bool causal = mode == 1;
      const Tensor m = mode == 2 ? mask : Tensor();
      const double p = mode == 2 ? 0.25 : 0.0;
      Generator cg(5), gg(5);
      const AttentionResult c = ScaledDotProductAttention(q, k, v, m, p, causal, std::nullopt, &cg);
      const AttentionResult r = ScaledDotProductAttention(G(q), G(k), G(v), G(m), p, causal, std::nullopt, &gg);
      ExpectMatches(r.output, c.output, Tol(d) * 5, "sdpa " + n);
      ExpectMatches(r.attn, c.attn, Tol(d) * 5, "sdpa attn " + n);
      ExpectMatches(r.dropout_mask, c.dropout_mask, 0.0, "sdpa dropout mask " + n);
      const AttentionGrads cgr = ScaledDotProductAttentionBackward(g, q, k, v, c.attn, c.dropout_mask, c.scale, true,
                                                                   true, true, mode == 2, mask.sizes(), d);
      const AttentionGrads ggr = ScaledDotProductAttentionBackward(G(g), G(q), G(k), G(v), r.attn, r.dropout_mask,
                                                                   r.scale, true, true, true, mode == 2, mask.sizes(), d);
      ExpectMatches(ggr.q, cgr.q, Tol(d) * 10, "sdpa_backward q " + n);
      ExpectMatches(ggr.k, cgr.k, Tol(d) * 10, "sdpa_backward k " + n);
      ExpectMatches(ggr.v, cgr.v, Tol(d) * 10, "sdpa_backward v " + n);
      ExpectMatches(ggr.attn_mask, cgr.attn_mask, Tol(d) * 10, "sdpa_backward mask " + n);
    }
  }
}

TEST(CudaStreams, KernelsRunOnTheCurrentStreamAndEventsOrderThem) {
  SKIP_WITHOUT_GPU();
  CudaStream side(kGpu);
  const Tensor x = Rand({256, 256}, DType::kFloat32, 41);
  const Tensor gx = G(x);
  CudaEvent ready(/*enable_timing=*/true), done(/*enable_timing=*/true);
  ready.Record(kGpu);
  Tensor y;
  {
    CudaStreamGuard guard(side.ref());
    EXPECT_EQ(CurrentCudaStream(kGpu).handle, side.handle());
    ready.Wait(side.ref());
    y = Mm(gx, gx);
    done.Record(side.ref());
  }
  EXPECT_TRUE(CurrentCudaStream(kGpu).is_default());
  done.Wait(CurrentCudaStream(kGpu));
  done.Synchronize();
  EXPECT_TRUE(done.Query());
  EXPECT_GE(ready.ElapsedMs(done), 0.0f);
  ExpectMatches(y, Mm(x, x), 1e-4, "mm on a side stream");
  side.Synchronize();
  EXPECT_TRUE(side.Query());
}

}  // namespace
}  // namespace fsdp::ops::kernels
