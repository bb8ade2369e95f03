#include "engine/ops/dropout.h"

#include <vector>

#include "engine/ops/elementwise.h"
#include "engine/ops/cuda/dispatch.h"
#include "engine/ops/kernel_util.h"

namespace fsdp::ops::kernels {

Tensor DropoutMask(const Shape& shape, double p, DType dtype, Generator& generator) {
  FSDP_CHECK(p >= 0.0 && p <= 1.0, "dropout probability has to be between 0 and 1, but got ", p);
  FSDP_CHECK(IsFloatingPoint(dtype), "dropout: mask dtype must be floating point, got ", DTypeName(dtype));
  const int64_t n = Numel(shape);
  const auto [seed, offset] = generator.reserve_philox(n);
  const double keep = 1.0 - p;
  const double scale = p == 1.0 ? 0.0 : 1.0 / keep;
  std::vector<double> values(static_cast<size_t>(n));
  std::array<uint32_t, 4> block{};
  for (int64_t i = 0; i < n; ++i) {
    if (i % 4 == 0) block = Generator::Philox(seed, 0, offset + static_cast<uint64_t>(i / 4));
    const double u = static_cast<double>(block[static_cast<size_t>(i % 4)] >> 8) * (1.0 / 16777216.0);
    values[static_cast<size_t>(i)] = u < keep ? scale : 0.0;
  }
  // from_doubles rounds 1 / (1 - p) to `dtype` (nearest even), like PyTorch's noise.div_.
  return Tensor::from_doubles(values, shape, dtype);
}

DropoutResult Dropout(const Tensor& x, double p, Generator& generator) {
  internal::CheckFloating("dropout", "input", x);
  FSDP_CHECK(p >= 0.0 && p <= 1.0, "dropout probability has to be between 0 and 1, but got ", p);
  if (internal::OnCuda("dropout", {&x})) return FSDP_CUDA_KERNEL("dropout", Dropout(x, p, generator));
  DropoutResult r;
  r.mask = DropoutMask(x.sizes(), p, x.dtype(), generator);
  if (!x.device().is_cpu()) r.mask = r.mask.to(x.device());
  r.output = Mul(x, r.mask);
  return r;
}

Tensor DropoutBackward(const Tensor& grad, const Tensor& mask) {
  FSDP_CHECK(grad.sizes() == mask.sizes(), "dropout_backward: gradient ", ShapeStr(grad.sizes()),
             " does not match mask ", ShapeStr(mask.sizes()));
  return Mul(grad, mask);
}

}  // namespace fsdp::ops::kernels
