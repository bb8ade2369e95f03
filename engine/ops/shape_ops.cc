#include "engine/ops/shape_ops.h"

#include <algorithm>
#include <cstring>

#include "engine/ops/broadcast.h"
#include "engine/ops/cuda/dispatch.h"
#include "engine/ops/kernel_util.h"

namespace fsdp::ops::kernels {

namespace {

// Copies `block` elements-worth of rows: for each of `outer` rows, `len * inner` elements from
// src (row stride src_dim * inner, starting at src_start * inner) to dst likewise.
void CopySlabs(const char* src, int64_t src_dim, int64_t src_start, char* dst, int64_t dst_dim,
               int64_t dst_start, int64_t outer, int64_t len, int64_t inner, size_t es) {
  const size_t bytes = static_cast<size_t>(len * inner) * es;
  if (bytes == 0) return;
  for (int64_t o = 0; o < outer; ++o) {
    std::memcpy(dst + static_cast<size_t>((o * dst_dim + dst_start) * inner) * es,
                src + static_cast<size_t>((o * src_dim + src_start) * inner) * es, bytes);
  }
}

Tensor OnHost(const Tensor& t) { return t.device().is_cpu() ? t : t.to(Device::CPU()); }

}  // namespace

std::vector<int64_t> InversePermutation(const std::vector<int64_t>& dims) {
  const int64_t nd = static_cast<int64_t>(dims.size());
  std::vector<int64_t> inv(dims.size());
  for (int64_t i = 0; i < nd; ++i) inv[static_cast<size_t>(internal::WrapDim(dims[static_cast<size_t>(i)], nd, "permute"))] = i;
  return inv;
}

Tensor Permute(const Tensor& x, const std::vector<int64_t>& dims) {
  internal::CheckDefined("permute", "self", x);
  const int64_t nd = x.dim();
  FSDP_CHECK(static_cast<int64_t>(dims.size()) == nd, "permute: number of dims don't match in permute (",
             dims.size(), " dims for a tensor of shape ", ShapeStr(x.sizes()), ")");
  std::vector<int64_t> wrapped;
  std::vector<bool> seen(static_cast<size_t>(nd), false);
  for (int64_t d : dims) {
    const int64_t w = internal::WrapDim(d, nd, "permute");
    FSDP_CHECK(!seen[static_cast<size_t>(w)], "permute: repeated dim ", w, " in ", ShapeStr(Shape(dims)));
    seen[static_cast<size_t>(w)] = true;
    wrapped.push_back(w);
  }
  bool identity = true;
  for (int64_t i = 0; i < nd; ++i) identity = identity && wrapped[static_cast<size_t>(i)] == i;
  if (identity) return x.clone();
  if (internal::OnCuda("permute", {&x})) return FSDP_CUDA_KERNEL("permute", Permute(x, wrapped));
  // Input strides, then output shape and the input stride of each output dim.
  std::vector<int64_t> in_strides(static_cast<size_t>(nd), 1);
  for (int64_t i = nd - 2; i >= 0; --i) {
    in_strides[static_cast<size_t>(i)] = in_strides[static_cast<size_t>(i + 1)] * x.sizes()[static_cast<size_t>(i + 1)];
  }
  Shape out_shape(static_cast<size_t>(nd));
  std::array<std::vector<int64_t>, 1> strides;
  strides[0].resize(static_cast<size_t>(nd));
  for (int64_t i = 0; i < nd; ++i) {
    out_shape[static_cast<size_t>(i)] = x.sizes()[static_cast<size_t>(wrapped[static_cast<size_t>(i)])];
    strides[0][static_cast<size_t>(i)] = in_strides[static_cast<size_t>(wrapped[static_cast<size_t>(i)])];
  }
  const Tensor hx = OnHost(x);
  Tensor out = Tensor::empty(out_shape, x.dtype());
  const size_t es = x.element_size();
  const char* src = static_cast<const char*>(hx.data_ptr());
  char* dst = static_cast<char*>(out.data_ptr());
  internal::ForEachRow<1>(out_shape, strides, [&](int64_t row, const std::array<int64_t, 1>& off,
                                                  int64_t len, const std::array<int64_t, 1>& inner) {
    char* d = dst + static_cast<size_t>(row * len) * es;
    if (es == 4) {
      const uint32_t* s = reinterpret_cast<const uint32_t*>(src) + off[0];
      uint32_t* o = reinterpret_cast<uint32_t*>(d);
      for (int64_t j = 0; j < len; ++j) o[j] = s[j * inner[0]];
    } else if (es == 8) {
      const uint64_t* s = reinterpret_cast<const uint64_t*>(src) + off[0];
      uint64_t* o = reinterpret_cast<uint64_t*>(d);
      for (int64_t j = 0; j < len; ++j) o[j] = s[j * inner[0]];
    } else {
      for (int64_t j = 0; j < len; ++j) {
        std::memcpy(d + static_cast<size_t>(j) * es, src + static_cast<size_t>(off[0] + j * inner[0]) * es, es);
      }
    }
  });
  return out.device() == x.device() ? out : out.to(x.device());
}

Tensor Transpose(const Tensor& x, int64_t dim0, int64_t dim1) {
  internal::CheckDefined("transpose", "self", x);
  const int64_t nd = x.dim();
  if (nd == 0) {
    internal::WrapDim(dim0, nd, "transpose");
    internal::WrapDim(dim1, nd, "transpose");
    return x.clone();
  }
  std::vector<int64_t> dims(static_cast<size_t>(nd));
  for (int64_t i = 0; i < nd; ++i) dims[static_cast<size_t>(i)] = i;
  std::swap(dims[static_cast<size_t>(internal::WrapDim(dim0, nd, "transpose"))],
            dims[static_cast<size_t>(internal::WrapDim(dim1, nd, "transpose"))]);
  return Permute(x, dims);
}

Tensor Cat(const std::vector<Tensor>& tensors, int64_t dim) {
  FSDP_CHECK(!tensors.empty(), "cat: expected a non-empty list of tensors");
  std::vector<Tensor> parts;
  DType dt = DType::kInt64;
  bool first = true;
  for (const Tensor& t : tensors) {
    internal::CheckDefined("cat", "tensors", t);
    dt = first ? t.dtype() : PromoteTypes(dt, t.dtype());
    first = false;
    if (t.dim() == 1 && t.numel() == 0) continue;  // legacy: skipped
    parts.push_back(t);
  }
  if (parts.empty()) return Tensor::empty({0}, dt, tensors[0].device());
  const Tensor& ref = parts[0];
  FSDP_CHECK(ref.dim() >= 1, "cat: zero-dimensional tensor cannot be concatenated");
  const int64_t d = internal::WrapDim(dim, ref.dim(), "cat");
  int64_t total = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const Tensor& t = parts[i];
    bool ok = t.dim() == ref.dim();
    for (int64_t k = 0; ok && k < ref.dim(); ++k) ok = k == d || t.sizes()[static_cast<size_t>(k)] == ref.sizes()[static_cast<size_t>(k)];
    FSDP_CHECK(ok, "cat: sizes of tensors must match except in dimension ", d, "; tensor 0 has shape ",
               ShapeStr(ref.sizes()), " and tensor ", i, " has shape ", ShapeStr(t.sizes()));
    total += t.sizes()[static_cast<size_t>(d)];
  }
  // OnCuda takes a fixed list; cat's inputs are a vector, so the same rule is spelled out here.
  if (std::any_of(parts.begin(), parts.end(), [](const Tensor& t) { return t.device().is_cuda(); })) {
    for (const Tensor& t : parts) {
      FSDP_CHECK(t.device() == ref.device(), "cat: expected all tensors to be on the same device, but found at least "
                 "two devices, ", ref.device().str(), " and ", t.device().str());
    }
    return FSDP_CUDA_KERNEL("cat", Cat(parts, d, dt));
  }
  Shape out_shape = ref.sizes();
  out_shape[static_cast<size_t>(d)] = total;
  Tensor out = Tensor::empty(out_shape, dt);
  const int64_t outer = internal::ProdRange(out_shape, 0, d);
  const int64_t inner = internal::ProdRange(out_shape, d + 1, ref.dim());
  const size_t es = ElementSize(dt);
  int64_t offset = 0;
  for (const Tensor& t : parts) {
    const Tensor h = internal::HostAs(t, dt);
    const int64_t len = t.sizes()[static_cast<size_t>(d)];
    CopySlabs(static_cast<const char*>(h.data_ptr()), len, 0, static_cast<char*>(out.data_ptr()), total,
              offset, outer, len, inner, es);
    offset += len;
  }
  return out.device() == ref.device() ? out : out.to(ref.device());
}

Tensor Narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length) {
  internal::CheckDefined("narrow", "self", x);
  FSDP_CHECK(x.dim() > 0, "narrow() cannot be applied to a 0-dim tensor");
  const int64_t d = internal::WrapDim(dim, x.dim(), "narrow");
  const int64_t size = x.sizes()[static_cast<size_t>(d)];
  if (start < 0) start += size;
  FSDP_CHECK(start >= 0 && length >= 0 && start + length <= size, "narrow: start (", start, ") + length (",
             length, ") exceeds dimension size (", size, ") of ", ShapeStr(x.sizes()), " at dim ", d);
  if (internal::OnCuda("narrow", {&x})) return FSDP_CUDA_KERNEL("narrow", Narrow(x, d, start, length));
  Shape out_shape = x.sizes();
  out_shape[static_cast<size_t>(d)] = length;
  const Tensor hx = OnHost(x);
  Tensor out = Tensor::empty(out_shape, x.dtype());
  CopySlabs(static_cast<const char*>(hx.data_ptr()), size, start, static_cast<char*>(out.data_ptr()), length, 0,
            internal::ProdRange(x.sizes(), 0, d), length, internal::ProdRange(x.sizes(), d + 1, x.dim()),
            x.element_size());
  return out.device() == x.device() ? out : out.to(x.device());
}

Tensor NarrowBackward(const Tensor& grad, const Shape& input_shape, int64_t dim, int64_t start) {
  internal::CheckDefined("narrow_backward", "grad", grad);
  const int64_t nd = static_cast<int64_t>(input_shape.size());
  const int64_t d = internal::WrapDim(dim, nd, "narrow_backward");
  const int64_t size = input_shape[static_cast<size_t>(d)];
  if (start < 0) start += size;
  FSDP_CHECK(grad.dim() == nd && start >= 0 && start + grad.size(d) <= size, "narrow_backward: gradient ",
             ShapeStr(grad.sizes()), " does not fit input ", ShapeStr(input_shape), " at offset ", start,
             " of dim ", d);
  if (internal::OnCuda("narrow_backward", {&grad})) {
    return FSDP_CUDA_KERNEL("narrow_backward", NarrowBackward(grad, input_shape, d, start));
  }
  const int64_t len = grad.size(d);
  const Tensor hg = OnHost(grad);
  Tensor out = Tensor::zeros(input_shape, grad.dtype());
  CopySlabs(static_cast<const char*>(hg.data_ptr()), len, 0, static_cast<char*>(out.data_ptr()), size, start,
            internal::ProdRange(input_shape, 0, d), len, internal::ProdRange(input_shape, d + 1, nd),
            grad.element_size());
  return out.device() == grad.device() ? out : out.to(grad.device());
}

Tensor Cast(const Tensor& x, DType dtype) {
  internal::CheckDefined("to", "self", x);
  if (internal::OnCuda("to", {&x})) return FSDP_CUDA_KERNEL("to", Cast(x, dtype));
  return x.to(dtype);
}

}  // namespace fsdp::ops::kernels
