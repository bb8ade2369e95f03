// Differentiable shape operations, concatenation and casts (see functional.h).
#include <algorithm>

#include "engine/functional/functional.h"
#include "engine/functional/functional_internal.h"
#include "engine/ops/broadcast.h"
#include "engine/ops/kernel_util.h"
#include "engine/ops/shape_ops.h"

namespace fsdp {

namespace k = ops::kernels;
using autograd::record_function;
using functional_internal::AsDTypeOf;
using functional_internal::RequiresGrad;
using functional_internal::ShouldRecord;
using functional_internal::TensorList;
using ops::kernels::internal::WrapDim;

namespace {

// Records a view-like op whose backward reshapes the gradient back to the input's shape.
Tensor RecordReshape(const char* name, const Tensor& x, Tensor out) {
  if (!ShouldRecord({&x})) return out;
  const Shape shape = x.sizes();
  return record_function(name, {x}, std::move(out), [shape](const TensorList& g) -> TensorList {
    return {g[0].view(shape)};
  });
}

// True when a slice along `dim` is contiguous (all earlier dims have size 1), i.e. can alias.
bool SliceIsContiguous(const Tensor& x, int64_t dim) {
  for (int64_t i = 0; i < dim; ++i) {
    if (x.sizes()[static_cast<size_t>(i)] != 1) return false;
  }
  return true;
}

// x[..., start:start+length, ...] along dim: an alias when contiguous, else a copy.
Tensor Slice(const Tensor& x, int64_t dim, int64_t start, int64_t length) {
  if (SliceIsContiguous(x, dim)) return x.narrow(dim, start, length);
  return k::Narrow(x, dim, start, length);
}

// Splits along `dim` into pieces of the given sizes under one node.
std::vector<Tensor> SplitImpl(const char* name, const Tensor& x, const std::vector<int64_t>& sizes, int64_t d) {
  std::vector<Tensor> outs;
  int64_t start = 0;
  for (int64_t s : sizes) {
    outs.push_back(Slice(x, d, start, s));
    start += s;
  }
  if (!ShouldRecord({&x})) return outs;
  const DType dt = x.dtype();
  return record_function(name, {x}, std::move(outs), [d, dt](const TensorList& g) -> TensorList {
    return {AsDTypeOf(k::Cat(g, d), dt)};
  });
}

}  // namespace

Tensor functional_internal::unsafe_view(const Tensor& x, const Shape& shape) {
  return RecordReshape("UnsafeViewBackward0", x, x.view(shape));
}

Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1) {
  Tensor out = k::Transpose(x, dim0, dim1);
  if (!ShouldRecord({&x})) return out;
  return record_function("TransposeBackward0", {x}, out, [dim0, dim1](const TensorList& g) -> TensorList {
    return {k::Transpose(g[0], dim0, dim1)};
  });
}

Tensor permute(const Tensor& x, const std::vector<int64_t>& dims) {
  Tensor out = k::Permute(x, dims);
  if (!ShouldRecord({&x})) return out;
  const std::vector<int64_t> inverse = k::InversePermutation(dims);
  return record_function("PermuteBackward0", {x}, out, [inverse](const TensorList& g) -> TensorList {
    return {k::Permute(g[0], inverse)};
  });
}

Tensor view(const Tensor& x, const Shape& shape) { return RecordReshape("ViewBackward0", x, x.view(shape)); }

Tensor reshape(const Tensor& x, const Shape& shape) { return RecordReshape("ViewBackward0", x, x.view(shape)); }

Tensor flatten(const Tensor& x, int64_t start_dim, int64_t end_dim) {
  FSDP_CHECK(x.defined(), "flatten: input is undefined");
  if (x.dim() == 0) return reshape(x, {1});
  const int64_t s = WrapDim(start_dim, x.dim(), "flatten"), e = WrapDim(end_dim, x.dim(), "flatten");
  FSDP_CHECK(s <= e, "flatten() has invalid args: start_dim cannot come after end_dim");
  if (s == e) return x;
  Shape shape(x.sizes().begin(), x.sizes().begin() + s);
  shape.push_back(k::internal::ProdRange(x.sizes(), s, e + 1));
  shape.insert(shape.end(), x.sizes().begin() + e + 1, x.sizes().end());
  return reshape(x, shape);
}

Tensor unsqueeze(const Tensor& x, int64_t dim) { return RecordReshape("UnsqueezeBackward0", x, x.unsqueeze(dim)); }

Tensor squeeze(const Tensor& x) {
  Shape shape;
  for (int64_t s : x.sizes()) {
    if (s != 1) shape.push_back(s);
  }
  return RecordReshape("SqueezeBackward0", x, x.view(shape));
}

Tensor squeeze(const Tensor& x, int64_t dim) {
  const int64_t d = WrapDim(dim, x.dim(), "squeeze");
  Tensor out = x.dim() == 0 ? x.view({}) : x.squeeze(d);
  return RecordReshape("SqueezeBackward1", x, out);
}

Tensor expand(const Tensor& x, const Shape& shape) {
  FSDP_CHECK(x.defined(), "expand: input is undefined");
  FSDP_CHECK(static_cast<int64_t>(shape.size()) >= x.dim(), "expand: the number of sizes provided (", shape.size(),
             ") must be greater or equal to the number of dimensions in the tensor (", x.dim(), ")");
  Shape target = shape;
  const size_t lead = shape.size() - static_cast<size_t>(x.dim());
  for (size_t i = 0; i < target.size(); ++i) {
    if (target[i] != -1) continue;
    FSDP_CHECK(i >= lead, "expand: -1 is not allowed in a leading, non-existing dimension (", ShapeStr(shape), ")");
    target[i] = x.sizes()[i - lead];
  }
  Tensor out = target == x.sizes() ? x.view(target) : k::Expand(x, target);
  if (!ShouldRecord({&x})) return out;
  const Shape in_shape = x.sizes();
  return record_function("ExpandBackward0", {x}, out, [in_shape](const TensorList& g) -> TensorList {
    return {k::SumToShape(g[0], in_shape)};
  });
}

Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length) {
  FSDP_CHECK(x.defined() && x.dim() > 0, "narrow() cannot be applied to a 0-dim tensor");
  const int64_t d = WrapDim(dim, x.dim(), "narrow");
  const int64_t size = x.sizes()[static_cast<size_t>(d)];
  if (start < 0) start += size;
  FSDP_CHECK(start >= 0 && length >= 0 && start + length <= size, "narrow: start (", start, ") + length (", length,
             ") exceeds dimension size (", size, ") of ", ShapeStr(x.sizes()), " at dim ", d);
  Tensor out = Slice(x, d, start, length);
  if (!ShouldRecord({&x})) return out;
  const Shape in_shape = x.sizes();
  return record_function("SliceBackward0", {x}, out, [in_shape, d, start](const TensorList& g) -> TensorList {
    return {k::NarrowBackward(g[0], in_shape, d, start)};
  });
}

Tensor select(const Tensor& x, int64_t dim, int64_t index) {
  FSDP_CHECK(x.defined() && x.dim() > 0, "select() cannot be applied to a 0-dim tensor");
  const int64_t d = WrapDim(dim, x.dim(), "select");
  const int64_t size = x.sizes()[static_cast<size_t>(d)];
  FSDP_CHECK(index >= -size && index < size, "select(): index ", index, " out of range for tensor of size ",
             ShapeStr(x.sizes()), " at dimension ", d);
  if (index < 0) index += size;
  Shape out_shape = x.sizes();
  out_shape.erase(out_shape.begin() + d);
  Tensor out = Slice(x, d, index, 1).view(out_shape);
  if (!ShouldRecord({&x})) return out;
  const Shape in_shape = x.sizes();
  return record_function("SelectBackward0", {x}, out, [in_shape, d, index](const TensorList& g) -> TensorList {
    return {k::NarrowBackward(g[0].unsqueeze(d), in_shape, d, index)};
  });
}

std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim) {
  FSDP_CHECK(x.defined() && x.dim() > 0, "split expects at least a 1-dimensional tensor");
  const int64_t d = WrapDim(dim, x.dim(), "split");
  const int64_t size = x.sizes()[static_cast<size_t>(d)];
  FSDP_CHECK(split_size > 0 || (split_size == 0 && size == 0), "split expects split_size be non-negative, but got ",
             "split_size=", split_size, " for dimension of size ", size);
  std::vector<int64_t> sizes;
  if (size == 0) {
    sizes.push_back(0);
  } else {
    for (int64_t s = 0; s < size; s += split_size) sizes.push_back(std::min(split_size, size - s));
  }
  return SplitImpl("SplitBackward0", x, sizes, d);
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& split_sizes, int64_t dim) {
  FSDP_CHECK(x.defined() && x.dim() > 0, "split_with_sizes expects at least a 1-dimensional tensor");
  const int64_t d = WrapDim(dim, x.dim(), "split_with_sizes");
  int64_t total = 0;
  for (int64_t s : split_sizes) {
    FSDP_CHECK(s >= 0, "split_with_sizes expects split_sizes have only non-negative entries, but got ",
               ShapeStr(Shape(split_sizes)));
    total += s;
  }
  FSDP_CHECK(total == x.sizes()[static_cast<size_t>(d)], "split_with_sizes expects split_sizes to sum exactly to ",
             x.sizes()[static_cast<size_t>(d)], " (input tensor's size at dimension ", d, "), but got split_sizes=",
             ShapeStr(Shape(split_sizes)));
  return SplitImpl("SplitWithSizesBackward0", x, split_sizes, d);
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  FSDP_CHECK(chunks > 0, "chunk expects `chunks` to be greater than 0, got: ", chunks);
  FSDP_CHECK(x.defined() && x.dim() > 0, "chunk expects at least a 1-dimensional tensor");
  const int64_t d = WrapDim(dim, x.dim(), "chunk");
  const int64_t size = x.sizes()[static_cast<size_t>(d)];
  const int64_t split_size = (size + chunks - 1) / chunks;
  if (split_size == 0 && size == 0) {
    // torch.chunk of an empty dimension returns `chunks` empty pieces.
    return SplitImpl("SplitWithSizesBackward0", x, std::vector<int64_t>(static_cast<size_t>(chunks), 0), d);
  }
  return split(x, split_size, d);
}

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  Tensor out = k::Cat(tensors, dim);
  if (!ShouldRecord(tensors)) return out;
  struct Piece {
    bool need;
    bool skipped;  // legacy empty 1-D input
    Shape shape;
    DType dtype;
  };
  std::vector<Piece> pieces;
  int64_t d = 0;
  for (const Tensor& t : tensors) {
    const bool skipped = t.dim() == 1 && t.numel() == 0;
    pieces.push_back({RequiresGrad(t), skipped, t.sizes(), t.dtype()});
    if (!skipped) d = WrapDim(dim, t.dim(), "cat");
  }
  return record_function("CatBackward0", tensors, out, [pieces, d](const TensorList& g) -> TensorList {
    TensorList r(pieces.size());
    int64_t offset = 0;
    for (size_t i = 0; i < pieces.size(); ++i) {
      const Piece& p = pieces[i];
      if (p.skipped) {
        if (p.need) r[i] = Tensor::zeros(p.shape, p.dtype, g[0].device());
        continue;
      }
      const int64_t len = p.shape[static_cast<size_t>(d)];
      if (p.need) r[i] = AsDTypeOf(k::Narrow(g[0], d, offset, len), p.dtype);
      offset += len;
    }
    return r;
  });
}

Tensor clone(const Tensor& x) {
  Tensor out = x.clone();
  if (!ShouldRecord({&x})) return out;
  return record_function("CloneBackward0", {x}, out, [](const TensorList& g) -> TensorList { return {g[0]}; });
}

Tensor to(const Tensor& x, DType dtype) {
  FSDP_CHECK(x.defined(), "to: input is undefined");
  if (x.dtype() == dtype) return x;
  Tensor out = k::Cast(x, dtype);
  if (!ShouldRecord({&x}) || !IsFloatingPoint(dtype)) return out;
  const DType in = x.dtype();
  return record_function("ToCopyBackward0", {x}, out, [in](const TensorList& g) -> TensorList {
    return {g[0].to(in)};
  });
}

}  // namespace fsdp
