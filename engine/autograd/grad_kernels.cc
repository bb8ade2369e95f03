#include "engine/autograd/grad_kernels.h"

#include <vector>

namespace fsdp::autograd::kernels {
namespace {

// out[i] = a[i] + b[i] on host pointers of one dtype; `out` may alias `a`.
void AddHost(const void* a, const void* b, void* out, DType dtype, int64_t n) {
  DispatchDType(dtype, [&](auto tag) {
    using T = decltype(tag);
    using A = OpMath<T>;  // 16-bit floats are summed in float ([Note: opmath type])
    const T* pa = static_cast<const T*>(a);
    const T* pb = static_cast<const T*>(b);
    T* po = static_cast<T*>(out);
    for (int64_t i = 0; i < n; ++i) {
      po[i] = T(static_cast<A>(pa[i]) + static_cast<A>(pb[i]));
    }
  });
}

void CheckSameShape(const Tensor& a, const Tensor& b, const char* what) {
  FSDP_CHECK(a.sizes() == b.sizes(), "autograd ", what, ": shape ", ShapeStr(a.sizes()),
             " does not match ", ShapeStr(b.sizes()));
}

}  // namespace

Tensor Add(const Tensor& a, const Tensor& b) {
  CheckSameShape(a, b, "gradient sum");
  const Tensor rhs = b.dtype() == a.dtype() ? b : b.to(a.dtype());
  if (a.device().is_cpu() && rhs.device().is_cpu()) {
    Tensor out = Tensor::empty(a.sizes(), a.dtype());
    if (a.numel() > 0) AddHost(a.data_ptr(), rhs.data_ptr(), out.data_ptr(), a.dtype(), a.numel());
    return out;
  }
  Tensor out = Add(a.to(Device::CPU()), rhs.to(Device::CPU()));
  return out.to(a.device());
}

void AddInPlace(const Tensor& a, const Tensor& b) {
  CheckSameShape(a, b, "gradient accumulation");
  const Tensor rhs = b.dtype() == a.dtype() ? b : b.to(a.dtype());
  if (a.device().is_cpu() && rhs.device().is_cpu()) {
    if (a.numel() > 0) AddHost(a.data_ptr(), rhs.data_ptr(), a.data_ptr(), a.dtype(), a.numel());
    a.bump_version();
    return;
  }
  Tensor sum = Add(a.to(Device::CPU()), rhs.to(Device::CPU()));
  Tensor target = a;
  target.copy_(sum);
}

Tensor Clone(const Tensor& t) { return t.clone(); }

Tensor ZerosLike(const Shape& shape, DType dtype, Device device) {
  return Tensor::zeros(shape, dtype, device);
}

Tensor OnesLike(const Tensor& t) { return Tensor::ones(t.sizes(), t.dtype(), t.device()); }

bool IsExpandableTo(const Shape& shape, const Shape& target) {
  if (shape.size() > target.size()) return false;
  const size_t offset = target.size() - shape.size();
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] != target[offset + i] && shape[i] != 1) return false;
  }
  return true;
}

Tensor SumTo(const Tensor& grad, const Shape& shape) {
  if (grad.sizes() == shape) return grad;
  FSDP_CHECK(IsExpandableTo(shape, grad.sizes()), "sum_to: shape ", ShapeStr(shape),
             " is not expandable to ", ShapeStr(grad.sizes()));
  const Shape& full = grad.sizes();
  const size_t ndim = full.size();
  const size_t offset = ndim - shape.size();
  // Sum in double on the host, then convert once.
  std::vector<double> in = grad.to_doubles();
  std::vector<double> out(static_cast<size_t>(Numel(shape)), 0.0);
  std::vector<int64_t> index(ndim, 0);
  for (size_t flat = 0; flat < in.size(); ++flat) {
    int64_t target = 0;
    for (size_t d = offset; d < ndim; ++d) {
      const int64_t extent = shape[d - offset];
      target = target * extent + (extent == 1 ? 0 : index[d]);
    }
    out[static_cast<size_t>(target)] += in[flat];
    for (size_t d = ndim; d-- > 0;) {
      if (++index[d] < full[d]) break;
      index[d] = 0;
    }
  }
  return Tensor::from_doubles(out, shape, grad.dtype(), grad.device());
}

}  // namespace fsdp::autograd::kernels
