// CUDA dropout with the project's counter-based Philox (numerics.h mirrors
// Generator::Philox): element i is kept iff its uniform from word (i mod 4) of
// Philox(seed, 0, offset + i / 4) is below 1 - p, so the mask equals the CPU mask bit for bit
// and the generator advances by the same ceil(numel / 4) (both reserve their counters with
// Generator::reserve_philox).
#include <cuda_runtime.h>

#include "engine/ops/cuda/cuda_kernels.h"
#include "engine/ops/cuda/cuda_util.cuh"
#include "engine/ops/kernel_util.h"

namespace fsdp::ops::kernels::cuda {

namespace {

// One thread per Philox block (4 elements).
__global__ void DropoutMaskKernel(void* out, ElemType to, int64_t n, uint64_t seed, uint64_t offset, double keep,
                                  double scale) {
  FSDP_GRID_STRIDE_LOOP(q, (n + 3) / 4) {
    const PhiloxBlock block = Philox4x32(seed, 0, offset + static_cast<uint64_t>(q));
    for (int r = 0; r < 4; ++r) {
      const int64_t i = q * 4 + r;
      if (i >= n) break;
      StoreDouble(out, to, i, DropoutKeeps(block.w[r], keep) ? scale : 0.0);
    }
  }
}

}  // namespace

Tensor DropoutMask(const Shape& shape, double p, DType dtype, Device device, Generator& generator) {
  const int64_t n = Numel(shape);
  const auto [seed, offset] = generator.reserve_philox(n);
  const double keep = 1.0 - p;
  const double scale = p == 1.0 ? 0.0 : 1.0 / keep;
  Tensor mask = Tensor::empty(shape, dtype, device);
  if (n == 0) return mask;
  DeviceGuard guard(device);
  const LaunchConfig c = GridFor((n + 3) / 4);
  DropoutMaskKernel<<<c.blocks, c.threads, 0, StreamOf(device)>>>(mask.data_ptr(), Elem(dtype), n, seed, offset, keep,
                                                                    scale);
  CheckLaunch("dropout mask kernel");
  return mask;
}

DropoutResult Dropout(const Tensor& x, double p, Generator& generator) {
  DropoutResult r;
  r.mask = DropoutMask(x.sizes(), p, x.dtype(), x.device(), generator);
  r.output = Binary("dropout", BinaryOp::kMul, 1.0, x, r.mask, x.dtype());
  return r;
}

}  // namespace fsdp::ops::kernels::cuda
