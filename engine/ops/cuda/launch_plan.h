// Host-side planning for the CUDA kernels of engine/ops/cuda, kept free of CUDA headers so it
// is unit-tested on any machine (engine/ops/cuda_plan_test.cc): launch geometry, the index
// math that maps an output element to input offsets (broadcast, permute), reduction layouts,
// and the cuBLAS operand/transpose/leading-dimension choice for row-major products.
// Thread-safety: value types and stateless functions.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "engine/core/error.h"
#include "engine/ops/cuda/host_device.h"

namespace fsdp::ops::kernels::cuda {

// ---- Launch geometry ----------------------------------------------------------------------------

inline constexpr int kThreadsPerBlock = 256;
inline constexpr int kWarpSize = 32;
// Grid-stride loops cover any size with at most this many blocks (plenty for an H100's 132 SMs).
inline constexpr int64_t kMaxBlocks = 65535;

// A 1-D launch: `blocks` x `threads`. blocks == 0 means "nothing to launch".
struct LaunchConfig {
  int64_t blocks = 0;
  int threads = kThreadsPerBlock;
};

// One thread per work item (kernels use a grid-stride loop, so capping is safe).
inline LaunchConfig GridFor(int64_t items, int threads = kThreadsPerBlock) {
  FSDP_CHECK(threads > 0 && items >= 0, "GridFor: invalid items ", items, " / threads ", threads);
  LaunchConfig c;
  c.threads = threads;
  const int64_t want = (items + threads - 1) / threads;
  c.blocks = want < kMaxBlocks ? want : kMaxBlocks;
  return c;
}

// One warp per row (row-wise softmax, norms): `rows` warps packed kThreadsPerBlock / 32 per block.
inline LaunchConfig WarpPerRow(int64_t rows) {
  return GridFor(rows * kWarpSize, kThreadsPerBlock);
}

// ---- Strided index math -----------------------------------------------------------------------

inline constexpr int kMaxDims = 12;

// Maps a linear index of a contiguous output of shape `sizes` to the element offset of an
// operand with per-dimension element `strides` (0 on broadcast dimensions; permuted strides
// for a permute). Passed to kernels by value.
struct StridedIndexer {
  int ndim = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};

  FSDP_HOST_DEVICE int64_t Offset(int64_t linear) const {
    int64_t off = 0;
    for (int d = ndim - 1; d >= 0; --d) {
      const int64_t s = sizes[d];
      const int64_t i = linear % s;
      linear /= s;
      off += i * strides[d];
    }
    return off;
  }
};

// `out_sizes` with the operand's `strides` (one per output dimension). Dimensions of size 1
// are dropped (their index is always 0), so 0-d and all-ones shapes give ndim == 0.
inline StridedIndexer MakeIndexer(const std::vector<int64_t>& out_sizes, const std::vector<int64_t>& strides) {
  FSDP_CHECK(out_sizes.size() == strides.size(), "MakeIndexer: ", out_sizes.size(), " sizes but ",
             strides.size(), " strides");
  StridedIndexer ix;
  for (size_t d = 0; d < out_sizes.size(); ++d) {
    if (out_sizes[d] == 1) continue;
    FSDP_CHECK(ix.ndim < kMaxDims, "CUDA kernels support at most ", kMaxDims,
               " non-trivial dimensions, got a shape with more");
    ix.sizes[ix.ndim] = out_sizes[d];
    ix.strides[ix.ndim] = strides[d];
    ++ix.ndim;
  }
  return ix;
}

// Row-major element strides of a contiguous tensor of `sizes`.
inline std::vector<int64_t> ContiguousStrides(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> s(sizes.size(), 1);
  for (size_t i = sizes.size(); i-- > 1;) s[i - 1] = s[i] * sizes[i];
  return s;
}

// Input strides, per output dimension, of out = x.permute(dims) (dims already wrapped).
inline std::vector<int64_t> PermutedStrides(const std::vector<int64_t>& in_sizes, const std::vector<int64_t>& dims) {
  const std::vector<int64_t> in = ContiguousStrides(in_sizes);
  std::vector<int64_t> out(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) out[i] = in[static_cast<size_t>(dims[i])];
  return out;
}

// ---- Reduction layouts ------------------------------------------------------------------------

// A contiguous tensor seen as [outer, n, inner] around one dimension (softmax over `dim`,
// one reduction step of a sum).
struct SliceLayout {
  int64_t outer = 1;
  int64_t n = 1;
  int64_t inner = 1;

  // Element offset of slice `s` (in [0, outer * inner)); its elements are at base + j * inner.
  FSDP_HOST_DEVICE int64_t Base(int64_t s) const { return (s / inner) * n * inner + s % inner; }
  int64_t slices() const { return outer * inner; }
};

inline SliceLayout LayoutAround(const std::vector<int64_t>& sizes, int64_t dim) {
  SliceLayout l;
  if (sizes.empty()) return l;
  for (int64_t i = 0; i < dim; ++i) l.outer *= sizes[static_cast<size_t>(i)];
  l.n = sizes[static_cast<size_t>(dim)];
  for (size_t i = static_cast<size_t>(dim) + 1; i < sizes.size(); ++i) l.inner *= sizes[i];
  return l;
}

// ---- cuBLAS planning for row-major products -----------------------------------------------------

enum class BlasTranspose { kNo, kYes };

// One cuBLAS (column-major) call computing the row-major C[M, N] = op(A) op(B), where A is
// stored row-major [a_rows, a_cols] (op(A) = Aᵀ when transpose_a) and likewise B.
// A row-major matrix is its column-major transpose, so Cᵀ = op(B)ᵀ op(A)ᵀ is computed with B's
// buffer as cuBLAS's first operand: first = B, second = A, m = N, n = M, k = K, ldc = N.
struct GemmPlan {
  BlasTranspose trans_first = BlasTranspose::kNo;   // applied to B's buffer
  BlasTranspose trans_second = BlasTranspose::kNo;  // applied to A's buffer
  int64_t m = 0;  // = N (columns of C)
  int64_t n = 0;  // = M (rows of C)
  int64_t k = 0;
  int64_t ld_first = 1;   // leading dimension of B's buffer (its stored columns)
  int64_t ld_second = 1;  // leading dimension of A's buffer (its stored columns)
  int64_t ldc = 1;
  int64_t stride_a = 0;  // elements between batch entries (strided batched calls)
  int64_t stride_b = 0;
  int64_t stride_c = 0;
};

inline GemmPlan PlanRowMajorGemm(int64_t a_rows, int64_t a_cols, bool transpose_a, int64_t b_rows,
                                 int64_t b_cols, bool transpose_b) {
  const int64_t m = transpose_a ? a_cols : a_rows;
  const int64_t ka = transpose_a ? a_rows : a_cols;
  const int64_t kb = transpose_b ? b_cols : b_rows;
  const int64_t n = transpose_b ? b_rows : b_cols;
  FSDP_CHECK(ka == kb, "gemm: inner dimensions differ (", m, "x", ka, " and ", kb, "x", n, ")");
  GemmPlan p;
  p.trans_first = transpose_b ? BlasTranspose::kYes : BlasTranspose::kNo;
  p.trans_second = transpose_a ? BlasTranspose::kYes : BlasTranspose::kNo;
  p.m = n;
  p.n = m;
  p.k = ka;
  // cuBLAS requires ld >= max(1, rows of the stored column-major matrix).
  p.ld_first = b_cols > 0 ? b_cols : 1;
  p.ld_second = a_cols > 0 ? a_cols : 1;
  p.ldc = n > 0 ? n : 1;
  p.stride_a = a_rows * a_cols;
  p.stride_b = b_rows * b_cols;
  p.stride_c = m * n;
  return p;
}

}  // namespace fsdp::ops::kernels::cuda
