// Host unit tests of everything in the CUDA backend that is not a device launch: launch
// geometry, strided index math, reduction layouts, the cuBLAS plan for row-major products,
// the device-side dtype conversions and Philox (the same source the kernels compile), the
// current-stream bookkeeping and the dtype -> cuBLAS type mapping. They run on every machine.
#include <gtest/gtest.h>

#include <cstring>
#include <thread>
#include <vector>

#include "engine/core/allocator.h"
#include "engine/core/cuda_stream.h"
#include "engine/core/rng.h"
#include "engine/ops/cuda/launch_plan.h"
#include "engine/ops/cuda/numerics.h"
#include "engine/ops/dropout.h"
#include "engine/ops/kernel_util.h"
#include "engine/ops/shape_ops.h"
#include "fsdp/config.h"

#if FSDP_HAVE_CUDA
#include "engine/ops/cuda/blas_types.h"
#endif

namespace fsdp::ops::kernels::cuda {
namespace {

// ---- Launch geometry ----------------------------------------------------------------------------

TEST(CudaLaunchPlan, GridCoversEveryItemAndIsCapped) {
  EXPECT_EQ(GridFor(0).blocks, 0);
  EXPECT_EQ(GridFor(1).blocks, 1);
  EXPECT_EQ(GridFor(kThreadsPerBlock).blocks, 1);
  EXPECT_EQ(GridFor(kThreadsPerBlock + 1).blocks, 2);
  EXPECT_EQ(GridFor(int64_t{1} << 40).blocks, kMaxBlocks);  // grid-stride loops cover the rest
  EXPECT_EQ(GridFor(1000, 128).threads, 128);
  EXPECT_EQ(GridFor(1000, 128).blocks, 8);
  // One warp per row: 8 warps per 256-thread block.
  EXPECT_EQ(WarpPerRow(8).blocks, 1);
  EXPECT_EQ(WarpPerRow(9).blocks, 2);
  EXPECT_THROW(GridFor(-1), Error);
}

// ---- Strided index math ---------------------------------------------------------------------------

// The offset of output element `linear` computed directly from the multi-index.
int64_t NaiveOffset(const Shape& out, const std::vector<int64_t>& strides, int64_t linear) {
  int64_t off = 0;
  for (size_t d = out.size(); d-- > 0;) {
    off += (linear % out[d]) * strides[d];
    linear /= out[d];
  }
  return off;
}

TEST(CudaLaunchPlan, BroadcastIndexerMatchesMultiIndexMath) {
  const std::vector<std::pair<Shape, Shape>> cases = {
      {{3, 1, 5}, {2, 3, 4, 5}}, {{1}, {4, 2}}, {{}, {3}}, {{4, 1}, {4, 6}}, {{2, 3}, {2, 3}}, {{1, 1}, {1, 1}}};
  for (const auto& [in, out] : cases) {
    const std::vector<int64_t> strides = internal::BroadcastStrides(in, out);
    const StridedIndexer ix = MakeIndexer(out, strides);
    for (int64_t i = 0; i < Numel(out); ++i) {
      ASSERT_EQ(ix.Offset(i), NaiveOffset(out, strides, i)) << ShapeStr(in) << " -> " << ShapeStr(out) << " @" << i;
      ASSERT_LT(ix.Offset(i), std::max<int64_t>(Numel(in), 1));
    }
  }
}

TEST(CudaLaunchPlan, PermuteIndexerReproducesCpuPermute) {
  const Shape shape = {2, 3, 4, 5};
  Tensor x = Tensor::arange(Numel(shape), DType::kFloat64).view(shape);
  const std::vector<int64_t> dims = {2, 0, 3, 1};
  const Tensor expected = Permute(x, dims);
  const StridedIndexer ix = MakeIndexer(expected.sizes(), PermutedStrides(shape, dims));
  const double* src = x.data<double>();
  const std::vector<double> want = expected.to_doubles();
  for (int64_t i = 0; i < expected.numel(); ++i) ASSERT_EQ(src[ix.Offset(i)], want[static_cast<size_t>(i)]) << i;
}

TEST(CudaLaunchPlan, IndexerRejectsTooManyDimensions) {
  const Shape big(kMaxDims + 1, 2);
  EXPECT_THROW(MakeIndexer(big, ContiguousStrides(big)), Error);
  EXPECT_EQ(MakeIndexer(Shape(20, 1), std::vector<int64_t>(20, 1)).ndim, 0);  // size-1 dims dropped
}

TEST(CudaLaunchPlan, SliceLayoutEnumeratesEverySliceOnce) {
  const Shape shape = {2, 3, 4};
  for (int64_t dim = 0; dim < 3; ++dim) {
    const SliceLayout l = LayoutAround(shape, dim);
    EXPECT_EQ(l.outer * l.n * l.inner, Numel(shape));
    std::vector<int> seen(static_cast<size_t>(Numel(shape)), 0);
    for (int64_t s = 0; s < l.slices(); ++s) {
      for (int64_t j = 0; j < l.n; ++j) ++seen[static_cast<size_t>(l.Base(s) + j * l.inner)];
    }
    for (int c : seen) EXPECT_EQ(c, 1) << "dim " << dim;
  }
  const SliceLayout scalar = LayoutAround({}, 0);
  EXPECT_EQ(scalar.slices(), 1);
  EXPECT_EQ(scalar.n, 1);
}

// ---- cuBLAS plan --------------------------------------------------------------------------------

// Reference column-major GEMM with BLAS semantics: C = op(A) op(B), A is lda-strided.
void ColumnMajorGemm(BlasTranspose ta, BlasTranspose tb, int64_t m, int64_t n, int64_t k, const double* a,
                     int64_t lda, const double* b, int64_t ldb, double* c, int64_t ldc) {
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t i = 0; i < m; ++i) {
      double acc = 0;
      for (int64_t p = 0; p < k; ++p) {
        const double av = ta == BlasTranspose::kNo ? a[i + p * lda] : a[p + i * lda];
        const double bv = tb == BlasTranspose::kNo ? b[p + j * ldb] : b[j + p * ldb];
        acc += av * bv;
      }
      c[i + j * ldc] = acc;
    }
  }
}

TEST(CudaLaunchPlan, RowMajorGemmPlanComputesTheRowMajorProduct) {
  const int64_t m = 3, n = 4, k = 5;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      const int64_t ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
      std::vector<double> a(static_cast<size_t>(ar * ac)), b(static_cast<size_t>(br * bc));
      for (size_t i = 0; i < a.size(); ++i) a[i] = 0.5 * static_cast<double>(i) - 3.0;
      for (size_t i = 0; i < b.size(); ++i) b[i] = 1.0 + static_cast<double>(i % 7);
      const GemmPlan p = PlanRowMajorGemm(ar, ac, ta, br, bc, tb);
      EXPECT_EQ(p.m, n);
      EXPECT_EQ(p.n, m);
      EXPECT_EQ(p.k, k);
      std::vector<double> c(static_cast<size_t>(m * n), -1.0);
      ColumnMajorGemm(p.trans_first, p.trans_second, p.m, p.n, p.k, b.data(), p.ld_first, a.data(), p.ld_second,
                      c.data(), p.ldc);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          double want = 0;
          for (int64_t q = 0; q < k; ++q) {
            const double av = ta ? a[static_cast<size_t>(q * ac + i)] : a[static_cast<size_t>(i * ac + q)];
            const double bv = tb ? b[static_cast<size_t>(j * bc + q)] : b[static_cast<size_t>(q * bc + j)];
            want += av * bv;
          }
          EXPECT_EQ(c[static_cast<size_t>(i * n + j)], want) << "ta=" << ta << " tb=" << tb;
        }
      }
      EXPECT_EQ(p.stride_a, ar * ac);
      EXPECT_EQ(p.stride_b, br * bc);
      EXPECT_EQ(p.stride_c, m * n);
    }
  }
}

TEST(CudaLaunchPlan, GemmPlanRejectsMismatchAndKeepsLeadingDimensionsValid) {
  EXPECT_THROW(PlanRowMajorGemm(2, 3, false, 4, 5, false), Error);
  const GemmPlan empty = PlanRowMajorGemm(0, 0, false, 0, 0, false);
  EXPECT_GE(empty.ld_first, 1);
  EXPECT_GE(empty.ld_second, 1);
  EXPECT_GE(empty.ldc, 1);
}

// ---- Numerics (the device code, compiled for the host) ---------------------------------------------

std::vector<float> SampleFloats() {
  std::vector<float> v = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65519.0f, 65520.0f, 1e-8f, 5.96e-8f, 2.98e-8f,
                          6.1e-5f, 3.0e38f, 1e-40f};
  uint32_t state = 12345u;
  for (int i = 0; i < 200000; ++i) {
    state = state * 1664525u + 1013904223u;
    float f;
    std::memcpy(&f, &state, 4);
    v.push_back(f);  // every exponent, NaNs and infinities included
  }
  const float specials[] = {1.0f / 0.0f, -1.0f / 0.0f};
  v.insert(v.end(), std::begin(specials), std::end(specials));
  return v;
}

TEST(CudaNumerics, HalfAndBFloat16ConversionsAreBitIdenticalToCore) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const uint16_t h = static_cast<uint16_t>(b);
    // Bit patterns, not values: NaN payloads must match too.
    ASSERT_EQ(FloatBits(FloatFromHalfBits(h)), FloatBits(HalfBitsToFloat(h))) << b;
    ASSERT_EQ(FloatBits(FloatFromBFloat16Bits(h)), FloatBits(BFloat16BitsToFloat(h))) << b;
  }
  for (float f : SampleFloats()) {
    ASSERT_EQ(HalfBitsFromFloat(f), FloatToHalfBits(f)) << f;
    ASSERT_EQ(BFloat16BitsFromFloat(f), FloatToBFloat16Bits(f)) << f;
  }
}

TEST(CudaNumerics, ElementConversionsMatchConvertElements) {
  const std::vector<double> values = {0.0, -0.0, 1.5, -2.75, 3.14159265358979, 1e-6, -1e5, 65519.0, 70000.0,
                                      123456789.0, -7.9};
  const DType all[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16, DType::kInt64};
  for (DType src : all) {
    // Source elements as the core would store them.
    std::vector<char> in(values.size() * ElementSize(src));
    ConvertElements(values.data(), DType::kFloat64, in.data(), src, values.size());
    for (DType dst : all) {
      std::vector<char> want(values.size() * ElementSize(dst)), got(want.size());
      ConvertElements(in.data(), src, want.data(), dst, values.size());
      for (size_t i = 0; i < values.size(); ++i) {
        const auto et = static_cast<ElemType>(src), dt = static_cast<ElemType>(dst);
        if (src == DType::kFloat32 && (dst == DType::kFloat16 || dst == DType::kBFloat16)) {
          StoreFloat(got.data(), dt, static_cast<int64_t>(i), LoadFloat(in.data(), et, static_cast<int64_t>(i)));
        } else {
          StoreDouble(got.data(), dt, static_cast<int64_t>(i), LoadDouble(in.data(), et, static_cast<int64_t>(i)));
        }
      }
      EXPECT_EQ(got, want) << DTypeName(src) << " -> " << DTypeName(dst);
    }
  }
}

TEST(CudaNumerics, PhiloxMatchesTheGenerator) {
  for (uint64_t key : {uint64_t{0}, uint64_t{42}, uint64_t{0xDEADBEEFCAFEF00Dull}}) {
    for (uint64_t counter : {uint64_t{0}, uint64_t{1}, uint64_t{1} << 33, ~uint64_t{0}}) {
      const auto want = Generator::Philox(key, 7, counter);
      const PhiloxBlock got = Philox4x32(key, 7, counter);
      for (int w = 0; w < 4; ++w) EXPECT_EQ(got.w[w], want[static_cast<size_t>(w)]);
    }
  }
}

TEST(CudaNumerics, DropoutDecisionReproducesTheCpuMask) {
  for (double p : {0.1, 0.5, 0.9}) {
    Generator gen(2024);
    gen.set_offset(5);
    const Shape shape = {7, 9};  // 63 elements: a partial last Philox block
    const Tensor mask = DropoutMask(shape, p, DType::kFloat32, gen);
    EXPECT_EQ(gen.offset(), 5u + 16u);
    const std::vector<double> m = mask.to_doubles();
    for (int64_t i = 0; i < Numel(shape); ++i) {
      const PhiloxBlock b = Philox4x32(2024, 0, 5 + static_cast<uint64_t>(i / 4));
      const bool keep = DropoutKeeps(b.w[i % 4], 1.0 - p);
      EXPECT_EQ(m[static_cast<size_t>(i)] != 0.0, keep) << "p=" << p << " i=" << i;
    }
  }
}

// ---- Streams (thread-local bookkeeping; no device needed) --------------------------------------

// Distinct non-null handles that are never dereferenced (only stored by the guard).
CudaStreamHandle FakeStream(uintptr_t v) { return reinterpret_cast<CudaStreamHandle>(v); }  // NOLINT(performance-no-int-to-ptr)

TEST(CudaStreamGuard, SetsAndRestoresTheCurrentStreamPerDeviceAndThread) {
  const Device d0 = Device::CUDA(0), d3 = Device::CUDA(3);
  EXPECT_TRUE(CurrentCudaStream(d0).is_default());
  EXPECT_TRUE(CurrentCudaStream(d3).is_default());
  {
    CudaStreamGuard outer({FakeStream(0x100), 0});
    EXPECT_EQ(CurrentCudaStream(d0).handle, FakeStream(0x100));
    EXPECT_TRUE(CurrentCudaStream(d3).is_default());
    {
      CudaStreamGuard inner({FakeStream(0x200), 0});
      CudaStreamGuard other({FakeStream(0x300), 3});
      EXPECT_EQ(CurrentCudaStream(d0).handle, FakeStream(0x200));
      EXPECT_EQ(CurrentCudaStream(d3).handle, FakeStream(0x300));
      std::thread t([&] {
        EXPECT_TRUE(CurrentCudaStream(d0).is_default());  // thread-local
      });
      t.join();
    }
    EXPECT_EQ(CurrentCudaStream(d0).handle, FakeStream(0x100));
    EXPECT_TRUE(CurrentCudaStream(d3).is_default());
  }
  EXPECT_TRUE(CurrentCudaStream(d0).is_default());
  EXPECT_THROW(CurrentCudaStream(Device::CPU()), Error);
}

TEST(CudaEvent, UnrecordedEventIsCompleteAndTimingNeedsFlags) {
  CudaEvent e;
  EXPECT_FALSE(e.was_recorded());
  EXPECT_TRUE(e.Query());
  e.Synchronize();
  e.Wait(CudaStreamRef{});
  CudaEvent timed(true), untimed;
  EXPECT_THROW(untimed.ElapsedMs(timed), Error);
  try {
    (void)timed.ElapsedMs(CudaEvent(true));
    FAIL() << "expected FailedPrecondition";
  } catch (const Error& err) {
    EXPECT_EQ(err.code(), ErrorCode::kFailedPrecondition);
  }
}

TEST(CudaStream, CreationWithoutADeviceIsUnavailable) {
  if (CudaDeviceCount() > 0) GTEST_SKIP() << "a CUDA device is visible; this checks the no-device error";
  try {
    CudaStream s(Device::CUDA(0));
    FAIL() << "expected Unavailable";
  } catch (const Error& err) {
    EXPECT_EQ(err.code(), ErrorCode::kUnavailable) << err.what();
  }
  EXPECT_THROW(CudaStream{Device::CPU()}, Error);
}

#if FSDP_HAVE_CUDA
TEST(CudaBlasTypes, DTypesMapToCublasTypes) {
  EXPECT_EQ(BlasDataType(DType::kFloat32), CUDA_R_32F);
  EXPECT_EQ(BlasDataType(DType::kFloat64), CUDA_R_64F);
  EXPECT_EQ(BlasDataType(DType::kFloat16), CUDA_R_16F);
  EXPECT_EQ(BlasDataType(DType::kBFloat16), CUDA_R_16BF);
  EXPECT_EQ(BlasComputeType(DType::kFloat16), CUBLAS_COMPUTE_32F);
  EXPECT_EQ(BlasComputeType(DType::kBFloat16), CUBLAS_COMPUTE_32F);
  EXPECT_EQ(BlasComputeType(DType::kFloat32), CUBLAS_COMPUTE_32F);
  EXPECT_EQ(BlasComputeType(DType::kFloat64), CUBLAS_COMPUTE_64F);
  EXPECT_EQ(BlasOp(BlasTranspose::kYes), CUBLAS_OP_T);
  EXPECT_EQ(BlasOp(BlasTranspose::kNo), CUBLAS_OP_N);
  EXPECT_THROW(BlasDataType(DType::kInt64), Error);
}
#endif

}  // namespace
}  // namespace fsdp::ops::kernels::cuda
