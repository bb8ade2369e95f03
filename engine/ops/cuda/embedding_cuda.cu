// CUDA embedding: a row gather, and a backward that is deterministic and bit-for-bit equal to
// the CPU kernel: the host (which already holds the validated indices) groups the positions of
// each weight row in their original order (a stable counting sort), and one thread per
// (row, column) adds that row's gradient rows in that order, starting from zero in the
// compute dtype, exactly like the CPU loop. No atomics.
#include <cuda_runtime.h>

#include <vector>

#include "engine/ops/cuda/cuda_kernels.h"
#include "engine/ops/cuda/cuda_util.cuh"
#include "engine/ops/kernel_util.h"

namespace fsdp::ops::kernels::cuda {

namespace {

template <typename Word>
__global__ void GatherRowsKernel(const Word* weight, const int64_t* indices, Word* out, int64_t rows, int64_t d) {
  FSDP_GRID_STRIDE_LOOP(i, rows * d) { out[i] = weight[indices[i / d] * d + i % d]; }
}

template <typename T>
__global__ void EmbeddingBackwardKernel(const void* grad, ElemType tg, const int64_t* weight_rows, const int64_t* starts,
                                        const int64_t* positions, void* out, ElemType to, int64_t unique, int64_t d) {
  FSDP_GRID_STRIDE_LOOP(i, unique * d) {
    const int64_t u = i / d, j = i % d;
    T acc = T(0);
    for (int64_t p = starts[u]; p < starts[u + 1]; ++p) acc += Load<T>(grad, tg, positions[p] * d + j);
    Store<T>(out, to, weight_rows[u] * d + j, acc);
  }
}

}  // namespace

Tensor Embedding(const Tensor& indices, const Tensor& weight) {
  const int64_t d = weight.size(1);
  Shape out_shape = indices.sizes();
  out_shape.push_back(d);
  Tensor out = Tensor::empty(out_shape, weight.dtype(), weight.device());
  const int64_t n = indices.numel();
  if (n == 0 || d == 0) return out;
  DeviceGuard guard(weight.device());
  const LaunchConfig c = GridFor(n * d);
  cudaStream_t stream = StreamOf(weight.device());
  const int64_t* idx = indices.data<int64_t>();
  switch (weight.element_size()) {
    case 2:
      GatherRowsKernel<uint16_t><<<c.blocks, c.threads, 0, stream>>>(
          static_cast<const uint16_t*>(weight.data_ptr()), idx, static_cast<uint16_t*>(out.data_ptr()), n, d);
      break;
    case 4:
      GatherRowsKernel<uint32_t><<<c.blocks, c.threads, 0, stream>>>(
          static_cast<const uint32_t*>(weight.data_ptr()), idx, static_cast<uint32_t*>(out.data_ptr()), n, d);
      break;
    default:
      GatherRowsKernel<uint64_t><<<c.blocks, c.threads, 0, stream>>>(
          static_cast<const uint64_t*>(weight.data_ptr()), idx, static_cast<uint64_t*>(out.data_ptr()), n, d);
      break;
  }
  CheckLaunch("embedding kernel");
  return out;
}

Tensor EmbeddingBackward(const Tensor& grad, const std::vector<int64_t>& host_indices, int64_t num_weights,
                         std::optional<int64_t> padding_idx) {
  const int64_t d = grad.size(-1);
  Tensor out = Tensor::zeros({num_weights, d}, grad.dtype(), grad.device());
  // Stable counting sort of positions by weight row, skipping padding_idx.
  std::vector<int64_t> counts(static_cast<size_t>(num_weights) + 1, 0);
  for (int64_t w : host_indices) {
    if (!(padding_idx.has_value() && w == *padding_idx)) ++counts[static_cast<size_t>(w)];
  }
  std::vector<int64_t> rows, starts{0};
  for (int64_t w = 0; w < num_weights; ++w) {
    if (counts[static_cast<size_t>(w)] == 0) continue;
    rows.push_back(w);
    starts.push_back(starts.back() + counts[static_cast<size_t>(w)]);
  }
  const int64_t unique = static_cast<int64_t>(rows.size());
  if (unique == 0 || d == 0) return out;
  std::vector<int64_t> slot(static_cast<size_t>(num_weights), -1);
  for (int64_t u = 0; u < unique; ++u) slot[static_cast<size_t>(rows[static_cast<size_t>(u)])] = starts[static_cast<size_t>(u)];
  std::vector<int64_t> positions(static_cast<size_t>(starts.back()));
  for (size_t i = 0; i < host_indices.size(); ++i) {
    const int64_t w = host_indices[i];
    if (padding_idx.has_value() && w == *padding_idx) continue;
    positions[static_cast<size_t>(slot[static_cast<size_t>(w)]++)] = static_cast<int64_t>(i);
  }
  const Device device = grad.device();
  const Tensor d_rows = Tensor::from_int64s(rows, {unique}, device);
  const Tensor d_starts = Tensor::from_int64s(starts, {unique + 1}, device);
  const Tensor d_positions = Tensor::from_int64s(positions, {static_cast<int64_t>(positions.size())}, device);
  const DType cd = internal::ComputeDType(grad.dtype());
  DeviceGuard guard(device);
  const LaunchConfig c = GridFor(unique * d);
  DispatchFloatCompute(cd, "embedding_backward", [&](auto tag) {
    using T = decltype(tag);
    EmbeddingBackwardKernel<T><<<c.blocks, c.threads, 0, StreamOf(device)>>>(
        grad.data_ptr(), Elem(grad.dtype()), d_rows.data<int64_t>(), d_starts.data<int64_t>(),
        d_positions.data<int64_t>(), out.data_ptr(), Elem(out.dtype()), unique, d);
  });
  CheckLaunch("embedding_backward kernel");
  return out;
}

}  // namespace fsdp::ops::kernels::cuda
