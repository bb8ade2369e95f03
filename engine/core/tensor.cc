#include "engine/core/tensor.h"

#include <cmath>
#include <sstream>

#include "engine/core/cuda_convert.h"
#include "engine/core/rank_context.h"
#include "engine/core/rng.h"
#include "fsdp/config.h"

namespace fsdp {

std::string ShapeStr(const Shape& shape) {
  std::string out = "[";  // no stream: collectives format shapes on every call
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

int64_t Numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

namespace {

std::shared_ptr<TensorImpl> MakeImpl(const Shape& shape, DType dtype, Device device,
                                     bool pinned = false, AllocInit init = AllocInit::kZeros) {
  for (int64_t s : shape) FSDP_CHECK(s >= 0, "negative dimension in shape ", ShapeStr(shape));
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(
      static_cast<size_t>(Numel(shape)) * ElementSize(dtype), device, pinned, init);
  impl->sizes = shape;
  impl->dtype = dtype;
  return impl;
}

Tensor MakeView(const Tensor& base, int64_t offset_elements, Shape shape) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = base.storage();
  impl->storage_offset = base.storage_offset() + offset_elements;
  impl->sizes = std::move(shape);
  impl->dtype = base.dtype();
  return Tensor(std::move(impl));
}

int64_t WrapDim(int64_t dim, int64_t ndim, const char* op) {
  const int64_t wrapped = dim < 0 ? dim + ndim : dim;
  FSDP_CHECK(wrapped >= 0 && wrapped < ndim, op, ": dimension ", dim, " out of range for a ",
             ndim, "-d tensor");
  return wrapped;
}

// dst = src converted to dst's dtype, both on the same CUDA device: the cast kernel on the current
// stream (engine/core/cuda_convert.h); a CPU-only build has no CUDA tensors to get here with.
void ConvertOnCuda(const Tensor& src, const Tensor& dst) {
#if FSDP_HAVE_CUDA
  internal::CudaConvertElements(src.data_ptr(), src.dtype(), dst.data_ptr(), dst.dtype(),
                                dst.numel(), dst.device());
#else
  FSDP_THROW(ErrorCode::kUnavailable, "copy_ from ", src.str(), " to ", dst.str(),
             ": this build has no CUDA kernels");
#endif
}

// Host copy of a tensor's bytes (for item/to_doubles on any device).
std::vector<char> HostBytes(const Tensor& t) {
  std::vector<char> bytes(t.nbytes());
  if (!bytes.empty()) {
    GetDeviceBackend(t.device().type)
        .Copy(bytes.data(), Device::CPU(), t.data_ptr(), t.device(), bytes.size(),
              /*non_blocking=*/false);
  }
  return bytes;
}

}  // namespace

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  return Tensor(MakeImpl(shape, dtype, device));
}

Tensor Tensor::empty_uninitialized(const Shape& shape, DType dtype, Device device) {
  return Tensor(MakeImpl(shape, dtype, device, /*pinned=*/false, AllocInit::kUninitialized));
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  return empty(shape, dtype, device);  // allocations are zero-filled
}

Tensor Tensor::ones(const Shape& shape, DType dtype, Device device) {
  return full(shape, 1.0, dtype, device);
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.fill_(value);
  return t;
}

Tensor Tensor::from_doubles(const std::vector<double>& values, const Shape& shape, DType dtype,
                            Device device) {
  FSDP_CHECK(static_cast<int64_t>(values.size()) == Numel(shape), "from_doubles: ", values.size(),
             " values for shape ", ShapeStr(shape));
  Tensor host = empty(shape, dtype);
  ConvertElements(values.data(), DType::kFloat64, host.data_ptr(), dtype, values.size());
  return host.to(device);
}

Tensor Tensor::from_int64s(const std::vector<int64_t>& values, const Shape& shape, Device device) {
  FSDP_CHECK(static_cast<int64_t>(values.size()) == Numel(shape), "from_int64s: ", values.size(),
             " values for shape ", ShapeStr(shape));
  Tensor host = empty(shape, DType::kInt64);
  if (!values.empty()) std::memcpy(host.data_ptr(), values.data(), values.size() * sizeof(int64_t));
  return host.to(device);
}

Tensor Tensor::arange(int64_t n, DType dtype, Device device) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<double>(i);
  return from_doubles(v, {n}, dtype, device);
}

Tensor Tensor::randn(const Shape& shape, DType dtype, Generator* generator) {
  Generator& g = generator ? *generator : RankContext::Current().generator();
  std::vector<double> v(static_cast<size_t>(Numel(shape)));
  for (double& x : v) x = g.normal();
  return from_doubles(v, shape, dtype);
}

Tensor Tensor::rand(const Shape& shape, DType dtype, Generator* generator) {
  Generator& g = generator ? *generator : RankContext::Current().generator();
  std::vector<double> v(static_cast<size_t>(Numel(shape)));
  for (double& x : v) x = g.uniform_double();
  return from_doubles(v, shape, dtype);
}

Tensor Tensor::randint(int64_t low, int64_t high, const Shape& shape, Generator* generator) {
  FSDP_CHECK(high > low, "randint: empty range [", low, ", ", high, ")");
  Generator& g = generator ? *generator : RankContext::Current().generator();
  std::vector<int64_t> v(static_cast<size_t>(Numel(shape)));
  const uint64_t range = static_cast<uint64_t>(high - low);
  for (int64_t& x : v) x = low + static_cast<int64_t>(g.next_u64() % range);
  return from_int64s(v, shape);
}

int64_t Tensor::size(int64_t dim) const { return sizes()[WrapDim(dim, this->dim(), "size")]; }

bool Tensor::has_storage() const {
  const TensorImpl& impl = checked();
  const size_t end = static_cast<size_t>(impl.storage_offset + numel()) * element_size();
  return impl.storage->data() != nullptr && impl.storage->nbytes() >= end;
}

void* Tensor::data_ptr() const {
  const TensorImpl& impl = checked();
  if (numel() == 0) {
    return impl.storage->data() == nullptr
               ? nullptr
               : static_cast<char*>(impl.storage->data()) + impl.storage_offset * element_size();
  }
  FSDP_CHECK_CODE(ErrorCode::kFailedPrecondition, has_storage(), "tensor ", str(),
                  " has no allocated storage (storage is ", impl.storage->nbytes(),
                  " bytes, view needs ", (impl.storage_offset + numel()) * element_size(),
                  "); was it freed by a reshard?");
  return static_cast<char*>(impl.storage->data()) + impl.storage_offset * element_size();
}

std::string Tensor::str() const {
  if (!defined()) return "Tensor(undefined)";
  std::ostringstream os;
  os << "Tensor(" << ShapeStr(sizes()) << ", " << DTypeName(dtype()) << ", " << device().str() << ")";
  return os.str();
}

Tensor Tensor::narrow(int64_t dim, int64_t start, int64_t length) const {
  const int64_t d = WrapDim(dim, this->dim(), "narrow");
  FSDP_CHECK(start >= 0 && length >= 0 && start + length <= sizes()[d], "narrow: range [", start,
             ", ", start + length, ") out of bounds for dimension ", d, " of size ", sizes()[d]);
  for (int64_t i = 0; i < d; ++i) {
    FSDP_CHECK(sizes()[i] == 1, "narrow on dimension ", d, " of ", ShapeStr(sizes()),
               " would not be contiguous; only leading dimensions of size 1 are allowed");
  }
  Shape shape = sizes();
  shape[d] = length;
  int64_t inner = 1;
  for (int64_t i = d + 1; i < this->dim(); ++i) inner *= sizes()[i];
  return MakeView(*this, start * inner, shape);
}

Tensor Tensor::select(int64_t index) const {
  FSDP_CHECK(dim() >= 1, "select on a 0-d tensor");
  FSDP_CHECK(index >= 0 && index < size(0), "select: index ", index, " out of range for size ", size(0));
  Shape shape(sizes().begin() + 1, sizes().end());
  return MakeView(*this, index * Numel(shape), shape);
}

std::vector<Tensor> Tensor::split(int64_t split_size) const {
  FSDP_CHECK(dim() >= 1, "split on a 0-d tensor");
  FSDP_CHECK(split_size > 0 || size(0) == 0, "split: split_size must be positive, got ", split_size);
  std::vector<Tensor> out;
  if (size(0) == 0) {
    out.push_back(*this);
    return out;
  }
  for (int64_t start = 0; start < size(0); start += split_size) {
    out.push_back(narrow(0, start, std::min(split_size, size(0) - start)));
  }
  return out;
}

std::vector<Tensor> Tensor::split_with_sizes(const std::vector<int64_t>& split_sizes) const {
  FSDP_CHECK(dim() >= 1, "split_with_sizes on a 0-d tensor");
  int64_t total = 0;
  for (int64_t s : split_sizes) {
    FSDP_CHECK(s >= 0, "split_with_sizes: negative size ", s);
    total += s;
  }
  FSDP_CHECK(total == size(0), "split_with_sizes: sizes sum to ", total, " but dimension 0 is ", size(0));
  std::vector<Tensor> out;
  int64_t start = 0;
  for (int64_t s : split_sizes) {
    out.push_back(narrow(0, start, s));
    start += s;
  }
  return out;
}

std::vector<Tensor> Tensor::chunk(int64_t chunks) const {
  FSDP_CHECK(chunks > 0, "chunk: number of chunks must be positive, got ", chunks);
  FSDP_CHECK(dim() >= 1, "chunk on a 0-d tensor");
  const int64_t split_size = (size(0) + chunks - 1) / chunks;
  if (split_size == 0) {
    // torch.chunk of an empty dimension returns `chunks` empty tensors.
    return std::vector<Tensor>(static_cast<size_t>(chunks), *this);
  }
  return split(split_size);
}

Tensor Tensor::view(const Shape& shape) const {
  Shape out = shape;
  int64_t infer = -1;
  int64_t known = 1;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      FSDP_CHECK(infer < 0, "view: only one dimension can be inferred in ", ShapeStr(shape));
      infer = static_cast<int64_t>(i);
    } else {
      FSDP_CHECK(out[i] >= 0, "view: invalid shape ", ShapeStr(shape));
      known *= out[i];
    }
  }
  if (infer >= 0) {
    FSDP_CHECK(known != 0 && numel() % known == 0, "view: shape ", ShapeStr(shape),
               " is invalid for input of size ", numel());
    out[static_cast<size_t>(infer)] = numel() / known;
  }
  FSDP_CHECK(Numel(out) == numel(), "view: shape ", ShapeStr(shape), " is invalid for input of size ",
             numel(), " (", ShapeStr(sizes()), ")");
  return MakeView(*this, 0, out);
}

Tensor Tensor::unsqueeze(int64_t dim) const {
  const int64_t d = WrapDim(dim, this->dim() + 1, "unsqueeze");
  Shape shape = sizes();
  shape.insert(shape.begin() + d, 1);
  return MakeView(*this, 0, shape);
}

Tensor Tensor::squeeze(int64_t dim) const {
  const int64_t d = WrapDim(dim, this->dim(), "squeeze");
  Shape shape = sizes();
  if (shape[d] == 1) shape.erase(shape.begin() + d);
  return MakeView(*this, 0, shape);
}

// The copies below allocate uninitialised storage: copy_ writes every element.
Tensor Tensor::clone() const {
  Tensor out = empty_uninitialized(sizes(), dtype(), device());
  out.copy_(*this);
  return out;
}

Tensor Tensor::to(DType target) const {
  if (target == dtype()) return *this;
  Tensor out = empty_uninitialized(sizes(), target, device());
  out.copy_(*this);
  return out;
}

Tensor Tensor::to(Device target, bool non_blocking) const {
  if (target == device()) return *this;
  const bool pin_output = non_blocking && device().is_cuda() && target.is_cpu();
  Tensor out(MakeImpl(sizes(), dtype(), target, pin_output, AllocInit::kUninitialized));
  out.copy_(*this, non_blocking);
  return out;
}

Tensor Tensor::pin_memory() const {
  FSDP_CHECK(device().is_cpu(), "pin_memory: only CPU tensors can be pinned, got ", str());
  if (is_pinned()) return *this;
  Tensor out(MakeImpl(sizes(), dtype(), device(), /*pinned=*/true, AllocInit::kUninitialized));
  out.copy_(*this);
  return out;
}

bool Tensor::is_pinned() const { return defined() && storage() != nullptr && storage()->pinned(); }

Tensor& Tensor::copy_(const Tensor& src, bool non_blocking) {
  FSDP_CHECK(src.numel() == numel(), "copy_: source ", src.str(), " has ", src.numel(),
             " elements but destination ", str(), " has ", numel());
  if (numel() == 0) return *this;
  if (src.dtype() == dtype()) {
    // Asynchronous only when the host side (if any) is pinned memory.
    const bool async = non_blocking && (device().is_cuda() || is_pinned()) &&
                       (src.device().is_cuda() || src.is_pinned());
    GetDeviceBackend(device().is_cuda() ? DeviceType::kCUDA : src.device().type)
        .Copy(data_ptr(), device(), src.data_ptr(), src.device(), nbytes(), async);
  } else if (device().is_cpu() && src.device().is_cpu()) {
    ConvertElements(src.data_ptr(), src.dtype(), data_ptr(), dtype(), static_cast<size_t>(numel()));
  } else if (device() == src.device()) {
    ConvertOnCuda(src, *this);
  } else {
    // Cross-device with a cast: stage through host memory.
    std::vector<char> in = HostBytes(src);
    std::vector<char> out(nbytes());
    ConvertElements(in.data(), src.dtype(), out.data(), dtype(), static_cast<size_t>(numel()));
    GetDeviceBackend(device().type)
        .Copy(data_ptr(), device(), out.data(), Device::CPU(), out.size(), /*non_blocking=*/false);
  }
  bump_version();
  return *this;
}

Tensor& Tensor::fill_(double value) {
  if (numel() == 0) return *this;
  std::vector<double> v(static_cast<size_t>(numel()), value);
  Tensor host = from_doubles(v, sizes(), dtype());
  copy_(host);
  return *this;
}

Tensor& Tensor::zero_() {
  if (numel() == 0) return *this;
  GetDeviceBackend(device().type).Zero(data_ptr(), nbytes(), device().index);
  bump_version();
  return *this;
}

double Tensor::item() const {
  FSDP_CHECK(numel() == 1, "item() on a tensor with ", numel(), " elements ", str());
  return to_doubles()[0];
}

std::vector<double> Tensor::to_doubles() const {
  std::vector<char> bytes = HostBytes(*this);
  std::vector<double> out(static_cast<size_t>(numel()));
  ConvertElements(bytes.data(), dtype(), out.data(), DType::kFloat64, out.size());
  return out;
}

std::vector<int64_t> Tensor::to_int64s() const {
  std::vector<char> bytes = HostBytes(*this);
  std::vector<int64_t> out(static_cast<size_t>(numel()));
  ConvertElements(bytes.data(), dtype(), out.data(), DType::kInt64, out.size());
  return out;
}

}  // namespace fsdp
