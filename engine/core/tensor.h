// Tensor: a contiguous, row-major n-d array viewing a Storage at an element offset.
//
// Member functions never record autograd history: views (narrow/select/split/chunk on dim 0,
// view/reshape/flatten/unsqueeze/squeeze) share storage and alias data; copies (clone, to,
// copy_) move bytes. The differentiable operations are the free functions of
// engine/functional/functional.h. The autograd accessors declared at the bottom (requires_grad, grad,
// grad_fn, backward, ...) are implemented by engine/autograd.
//
// Ownership: Tensor is a cheap handle (shared_ptr<TensorImpl>); copies of a handle are the
// same tensor (is_same), views are distinct tensors over the same Storage.
// Thread-safety: like torch.Tensor, none; a rank's tensors are used by its thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/device.h"
#include "engine/core/dtype.h"
#include "engine/core/error.h"
#include "engine/core/storage.h"

namespace fsdp {

namespace autograd {
struct AutogradMeta;
class Node;
}  // namespace autograd

class Generator;

using Shape = std::vector<int64_t>;

// "[2, 3]", as torch.Size prints without the prefix.
std::string ShapeStr(const Shape& shape);
int64_t Numel(const Shape& shape);

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  int64_t storage_offset = 0;  // in elements
  Shape sizes;
  DType dtype = DType::kFloat32;
  uint64_t version = 0;  // bumped by in-place writes made through the functional API
  std::shared_ptr<autograd::AutogradMeta> autograd_meta;  // null: no autograd information
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // Factories. `device` defaults to the CPU; random factories draw from `generator`, or from
  // the current rank's generator when it is null. `empty` is zero-filled, like every
  // allocation ([Note: allocations are zero-filled] in docs/decisions.md);
  // `empty_uninitialized` is torch.empty's own contract (the contents are whatever the
  // allocator returns), for a caller that overwrites every element before anything reads it.
  static Tensor empty(const Shape& shape, DType dtype = DType::kFloat32, Device device = Device::CPU());
  static Tensor empty_uninitialized(const Shape& shape, DType dtype = DType::kFloat32,
                                    Device device = Device::CPU());
  static Tensor zeros(const Shape& shape, DType dtype = DType::kFloat32, Device device = Device::CPU());
  static Tensor ones(const Shape& shape, DType dtype = DType::kFloat32, Device device = Device::CPU());
  static Tensor full(const Shape& shape, double value, DType dtype = DType::kFloat32,
                     Device device = Device::CPU());
  // Values converted to `dtype` (e.g. doubles written as float32).
  static Tensor from_doubles(const std::vector<double>& values, const Shape& shape,
                             DType dtype = DType::kFloat32, Device device = Device::CPU());
  static Tensor from_int64s(const std::vector<int64_t>& values, const Shape& shape,
                            Device device = Device::CPU());
  static Tensor arange(int64_t n, DType dtype = DType::kInt64, Device device = Device::CPU());
  static Tensor randn(const Shape& shape, DType dtype = DType::kFloat32, Generator* generator = nullptr);
  static Tensor rand(const Shape& shape, DType dtype = DType::kFloat32, Generator* generator = nullptr);
  // Uniform integers in [low, high), int64.
  static Tensor randint(int64_t low, int64_t high, const Shape& shape, Generator* generator = nullptr);

  bool defined() const { return impl_ != nullptr; }
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  // Identity (the same TensorImpl), not value equality.
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }

  const Shape& sizes() const { return checked().sizes; }
  // Size of dimension `dim`; negative dims count from the end.
  int64_t size(int64_t dim) const;
  int64_t dim() const { return static_cast<int64_t>(sizes().size()); }
  int64_t numel() const { return Numel(sizes()); }
  DType dtype() const { return checked().dtype; }
  Device device() const { return checked().storage->device(); }
  size_t element_size() const { return ElementSize(dtype()); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * element_size(); }
  const std::shared_ptr<Storage>& storage() const { return checked().storage; }
  int64_t storage_offset() const { return checked().storage_offset; }
  uint64_t version() const { return checked().version; }
  void bump_version() const { ++checked().version; }
  // False when the storage is freed (Resize(0)) or too small for this view.
  bool has_storage() const;

  // Pointer to the first element. Throws FailedPrecondition when the storage has been freed
  // (a resized-to-0 unsharded parameter, for example).
  void* data_ptr() const;
  template <typename T>
  T* data() const {
    FSDP_CHECK(DTypeOf<T>::value == dtype(), "Tensor::data<", DTypeName(DTypeOf<T>::value),
               ">() called on a ", DTypeName(dtype()), " tensor");
    return static_cast<T*>(data_ptr());
  }
  // "Tensor([2, 3], float32, cpu)".
  std::string str() const;

  // Views (share storage).
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor select(int64_t index) const;  // along dim 0, which is removed
  std::vector<Tensor> split(int64_t split_size) const;  // along dim 0, last piece may be short
  std::vector<Tensor> split_with_sizes(const std::vector<int64_t>& sizes) const;  // along dim 0
  // torch.chunk along dim 0: pieces of ceil(size(0) / chunks) rows; may return FEWER than
  // `chunks` tensors (e.g. 6 rows in 4 chunks gives 2, 2, 2).
  std::vector<Tensor> chunk(int64_t chunks) const;
  Tensor view(const Shape& shape) const;  // one -1 allowed
  Tensor reshape(const Shape& shape) const { return view(shape); }
  Tensor flatten() const { return view({numel()}); }
  Tensor unsqueeze(int64_t dim) const;
  Tensor squeeze(int64_t dim) const;

  // Copies (no autograd).
  Tensor clone() const;
  Tensor to(DType dtype) const;  // returns *this when the dtype already matches
  // Returns *this when the device already matches. With non_blocking, a copy from pinned host
  // memory to the device, or from the device into new pinned host memory (PyTorch pins the
  // output of a non-blocking device-to-host copy), returns before it finished: the caller
  // orders later use with an event of the current stream.
  Tensor to(Device device, bool non_blocking = false) const;
  // Copies `src` into this tensor: same numel, any dtype/device (converted). non_blocking
  // takes effect only between a CUDA device and pinned host memory, as in PyTorch.
  Tensor& copy_(const Tensor& src, bool non_blocking = false);
  // A copy in pinned (page-locked) host memory; *this when already pinned. Requires a CPU
  // tensor (InvalidArgument) and a visible CUDA device (Unavailable).
  Tensor pin_memory() const;
  bool is_pinned() const;
  Tensor& fill_(double value);
  Tensor& zero_();
  // The single element as double (numel must be 1).
  double item() const;
  std::vector<double> to_doubles() const;
  std::vector<int64_t> to_int64s() const;

  // ---- Autograd (implemented in engine/autograd) --------------------------------------------
  bool requires_grad() const;
  // Only on leaves, and only for floating-point tensors.
  Tensor& set_requires_grad(bool requires_grad);
  // The accumulated gradient of a leaf (undefined Tensor = None).
  Tensor grad() const;
  void set_grad(const Tensor& grad) const;
  std::shared_ptr<autograd::Node> grad_fn() const;
  bool is_leaf() const;
  uint32_t output_nr() const;
  // A new tensor sharing storage, with no autograd history and requires_grad false.
  Tensor detach() const;
  // Runs the backward pass from this tensor. `gradient` may be omitted for a single-element
  // tensor (ones). Without retain_graph, saved state is released as nodes run.
  void backward(const Tensor& gradient = Tensor(), bool retain_graph = false) const;

 private:
  TensorImpl& checked() const {
    FSDP_CHECK(impl_ != nullptr, "operation on an undefined tensor");
    return *impl_;
  }
  std::shared_ptr<TensorImpl> impl_;
};

}  // namespace fsdp
