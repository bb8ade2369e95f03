#include "engine/ops/embedding.h"

#include <cstring>

#include "engine/ops/cuda/dispatch.h"
#include "engine/ops/kernel_util.h"

namespace fsdp::ops::kernels {

Tensor Embedding(const Tensor& indices, const Tensor& weight) {
  internal::CheckDefined("embedding", "indices", indices);
  internal::CheckFloating("embedding", "weight", weight);
  FSDP_CHECK(indices.dtype() == DType::kInt64, "embedding: expected int64 indices, got ", indices.str());
  FSDP_CHECK(weight.dim() == 2, "embedding: 'weight' must be 2-D, got ", ShapeStr(weight.sizes()));
  const int64_t num = weight.size(0), d = weight.size(1);
  const std::vector<int64_t> idx = indices.to_int64s();
  for (int64_t i : idx) {
    FSDP_CHECK(i >= 0 && i < num, "embedding: index ", i, " out of range for weight ", ShapeStr(weight.sizes()),
               " (index out of range in self)");
  }
  if (internal::OnCuda("embedding", {&indices, &weight})) return FSDP_CUDA_KERNEL("embedding", Embedding(indices, weight));
  Shape out_shape = indices.sizes();
  out_shape.push_back(d);
  const Tensor hw = weight.device().is_cpu() ? weight : weight.to(Device::CPU());
  Tensor out = Tensor::empty(out_shape, weight.dtype());
  const size_t row_bytes = static_cast<size_t>(d) * weight.element_size();
  const char* src = static_cast<const char*>(hw.data_ptr());
  char* dst = static_cast<char*>(out.data_ptr());
  for (size_t i = 0; i < idx.size(); ++i) {
    if (row_bytes > 0) std::memcpy(dst + i * row_bytes, src + static_cast<size_t>(idx[i]) * row_bytes, row_bytes);
  }
  return out.device() == weight.device() ? out : out.to(weight.device());
}

Tensor EmbeddingBackward(const Tensor& grad, const Tensor& indices, int64_t num_weights,
                         std::optional<int64_t> padding_idx) {
  internal::CheckFloating("embedding_backward", "grad", grad);
  FSDP_CHECK(indices.dtype() == DType::kInt64, "embedding_backward: expected int64 indices, got ",
             indices.str());
  FSDP_CHECK(grad.dim() == indices.dim() + 1 && grad.numel() == indices.numel() * grad.size(-1),
             "embedding_backward: gradient ", ShapeStr(grad.sizes()), " does not match indices ",
             ShapeStr(indices.sizes()));
  const int64_t d = grad.size(-1);
  const std::vector<int64_t> idx = indices.to_int64s();
  for (int64_t i : idx) {
    FSDP_CHECK(i >= 0 && i < num_weights, "embedding_backward: index ", i, " out of range for ", num_weights,
               " embeddings");
  }
  if (internal::OnCuda("embedding_backward", {&grad, &indices})) {
    return FSDP_CUDA_KERNEL("embedding_backward", EmbeddingBackward(grad, idx, num_weights, padding_idx));
  }
  const DType cd = internal::ComputeDType(grad.dtype());
  const Tensor hg = internal::HostAs(grad, cd);
  Tensor out = internal::DispatchFloat(cd, "embedding_backward", [&](auto tag) {
    using T = decltype(tag);
    Tensor gw = Tensor::zeros({num_weights, d}, cd);
    const T* pg = hg.data<T>();
    T* pw = gw.data<T>();
    for (size_t i = 0; i < idx.size(); ++i) {
      if (padding_idx.has_value() && idx[i] == *padding_idx) continue;
      T* row = pw + idx[i] * d;
      const T* g = pg + static_cast<int64_t>(i) * d;
      for (int64_t j = 0; j < d; ++j) row[j] += g[j];
    }
    return gw;
  });
  return internal::Restore(out, grad.dtype(), grad.device());
}

}  // namespace fsdp::ops::kernels
