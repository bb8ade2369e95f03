// Differentiable elementwise arithmetic, matrix products and reductions (see functional.h).
#include <algorithm>

#include "engine/functional/functional.h"
#include "engine/functional/functional_internal.h"
#include "engine/ops/broadcast.h"
#include "engine/ops/elementwise.h"
#include "engine/ops/linalg.h"
#include "engine/ops/reduction.h"
#include "engine/ops/shape_ops.h"

namespace fsdp {

namespace k = ops::kernels;
using autograd::record_function;
using functional_internal::AsDTypeOf;
using functional_internal::RequiresGrad;
using functional_internal::SavedTensor;
using functional_internal::ShouldRecord;
using functional_internal::TensorList;

namespace {

// Gradient of a broadcast input: summed to its shape and cast to its dtype.
Tensor Reduced(const Tensor& g, const Shape& shape, DType dtype) {
  return AsDTypeOf(k::SumToShape(g, shape), dtype);
}

// A unary op whose backward needs only the saved tensor `keep` (input or output).
template <typename Backward>
Tensor RecordUnary(const char* name, const Tensor& x, const Tensor& out, const Tensor& keep, Backward bw) {
  if (!ShouldRecord({&x})) return out;
  SavedTensor saved(keep);
  const DType dt = x.dtype();
  return record_function(name, {x}, out, [saved, dt, bw](const TensorList& g) -> TensorList {
    return {AsDTypeOf(bw(g[0], saved.unpack()), dt)};
  });
}

}  // namespace

// ---- Elementwise ------------------------------------------------------------------------------

Tensor add(const Tensor& a, const Tensor& b, double alpha) {
  Tensor out = k::Add(a, b, alpha);
  if (!ShouldRecord({&a, &b})) return out;
  const bool na = RequiresGrad(a), nb = RequiresGrad(b);
  const Shape sa = a.sizes(), sb = b.sizes();
  const DType da = a.dtype(), db = b.dtype();
  return record_function("AddBackward0", {a, b}, out, [=](const TensorList& g) -> TensorList {
    TensorList r(2);
    if (na) r[0] = Reduced(g[0], sa, da);
    if (nb) r[1] = Reduced(alpha == 1.0 ? g[0] : k::MulScalar(g[0], alpha), sb, db);
    return r;
  });
}

Tensor add(const Tensor& a, double b) {
  Tensor out = k::AddScalar(a, b);
  if (!ShouldRecord({&a})) return out;
  const DType da = a.dtype();
  return record_function("AddBackward0", {a}, out, [da](const TensorList& g) -> TensorList {
    return {AsDTypeOf(g[0], da)};
  });
}

Tensor sub(const Tensor& a, const Tensor& b, double alpha) {
  Tensor out = k::Sub(a, b, alpha);
  if (!ShouldRecord({&a, &b})) return out;
  const bool na = RequiresGrad(a), nb = RequiresGrad(b);
  const Shape sa = a.sizes(), sb = b.sizes();
  const DType da = a.dtype(), db = b.dtype();
  return record_function("SubBackward0", {a, b}, out, [=](const TensorList& g) -> TensorList {
    TensorList r(2);
    if (na) r[0] = Reduced(g[0], sa, da);
    if (nb) r[1] = Reduced(k::MulScalar(g[0], -alpha), sb, db);
    return r;
  });
}

Tensor sub(const Tensor& a, double b) {
  Tensor out = k::AddScalar(a, -b);
  if (!ShouldRecord({&a})) return out;
  const DType da = a.dtype();
  return record_function("SubBackward0", {a}, out, [da](const TensorList& g) -> TensorList {
    return {AsDTypeOf(g[0], da)};
  });
}

Tensor rsub(const Tensor& a, double b) {
  Tensor out = k::RSubScalar(a, b);
  return RecordUnary("RsubBackward1", a, out, Tensor(), [](const Tensor& g, const Tensor&) { return k::Neg(g); });
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor out = k::Mul(a, b);
  if (!ShouldRecord({&a, &b})) return out;
  const bool na = RequiresGrad(a), nb = RequiresGrad(b);
  const Shape sa = a.sizes(), sb = b.sizes();
  const DType da = a.dtype(), db = b.dtype();
  // Like PyTorch: `other` is saved when self needs a gradient and vice versa.
  SavedTensor saved_a(nb ? a : Tensor()), saved_b(na ? b : Tensor());
  return record_function("MulBackward0", {a, b}, out, [=](const TensorList& g) -> TensorList {
    TensorList r(2);
    if (na) r[0] = Reduced(k::Mul(g[0], saved_b.unpack()), sa, da);
    if (nb) r[1] = Reduced(k::Mul(g[0], saved_a.unpack()), sb, db);
    return r;
  });
}

Tensor mul(const Tensor& a, double b) {
  Tensor out = k::MulScalar(a, b);
  return RecordUnary("MulBackward0", a, out, Tensor(), [b](const Tensor& g, const Tensor&) { return k::MulScalar(g, b); });
}

Tensor div(const Tensor& a, const Tensor& b) {
  Tensor out = k::Div(a, b);
  if (!ShouldRecord({&a, &b})) return out;
  const bool na = RequiresGrad(a), nb = RequiresGrad(b);
  const Shape sa = a.sizes(), sb = b.sizes();
  const DType da = a.dtype(), db = b.dtype();
  SavedTensor saved_a(nb ? a : Tensor()), saved_b(b);
  return record_function("DivBackward0", {a, b}, out, [=](const TensorList& g) -> TensorList {
    TensorList r(2);
    const Tensor vb = saved_b.unpack();
    if (na) r[0] = Reduced(k::Div(g[0], vb), sa, da);
    if (nb) r[1] = Reduced(k::Neg(k::Mul(g[0], k::Div(k::Div(saved_a.unpack(), vb), vb))), sb, db);
    return r;
  });
}

Tensor div(const Tensor& a, double b) {
  Tensor out = k::DivScalar(a, b);
  return RecordUnary("DivBackward0", a, out, Tensor(), [b](const Tensor& g, const Tensor&) { return k::DivScalar(g, b); });
}

Tensor neg(const Tensor& x) {
  return RecordUnary("NegBackward0", x, k::Neg(x), Tensor(), [](const Tensor& g, const Tensor&) { return k::Neg(g); });
}

Tensor exp(const Tensor& x) {
  Tensor out = k::Exp(x);
  return RecordUnary("ExpBackward0", x, out, out, [](const Tensor& g, const Tensor& y) { return k::ExpBackward(g, y); });
}

Tensor log(const Tensor& x) {
  return RecordUnary("LogBackward0", x, k::Log(x), x, [](const Tensor& g, const Tensor& v) { return k::LogBackward(g, v); });
}

Tensor sqrt(const Tensor& x) {
  Tensor out = k::Sqrt(x);
  return RecordUnary("SqrtBackward0", x, out, out, [](const Tensor& g, const Tensor& y) { return k::SqrtBackward(g, y); });
}

Tensor rsqrt(const Tensor& x) {
  Tensor out = k::Rsqrt(x);
  return RecordUnary("RsqrtBackward0", x, out, out, [](const Tensor& g, const Tensor& y) { return k::RsqrtBackward(g, y); });
}

Tensor reciprocal(const Tensor& x) {
  Tensor out = k::Reciprocal(x);
  return RecordUnary("ReciprocalBackward0", x, out, out,
                     [](const Tensor& g, const Tensor& y) { return k::ReciprocalBackward(g, y); });
}

Tensor pow(const Tensor& x, double exponent) {
  return RecordUnary("PowBackward0", x, k::PowScalar(x, exponent), x,
                     [exponent](const Tensor& g, const Tensor& v) { return k::PowScalarBackward(g, v, exponent); });
}

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator+(const Tensor& a, double b) { return add(a, b); }
Tensor operator+(double a, const Tensor& b) { return add(b, a); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator-(const Tensor& a, double b) { return sub(a, b); }
Tensor operator-(double a, const Tensor& b) { return rsub(b, a); }
Tensor operator-(const Tensor& x) { return neg(x); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator*(const Tensor& a, double b) { return mul(a, b); }
Tensor operator*(double a, const Tensor& b) { return mul(b, a); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator/(const Tensor& a, double b) { return div(a, b); }
Tensor operator/(double a, const Tensor& b) { return mul(reciprocal(b), a); }

// ---- Matrix products --------------------------------------------------------------------------

Tensor t(const Tensor& x) {
  FSDP_CHECK(x.dim() <= 2, "t() expects a tensor with <= 2 dimensions, but self is ", x.dim(), "D (",
             ShapeStr(x.sizes()), ")");
  Tensor out = x.dim() < 2 ? x.clone() : k::Transpose(x, 0, 1);
  if (!ShouldRecord({&x})) return out;
  const DType dt = x.dtype();
  const bool two_d = x.dim() == 2;
  return record_function("TBackward0", {x}, out, [dt, two_d](const TensorList& g) -> TensorList {
    return {AsDTypeOf(two_d ? k::Transpose(g[0], 0, 1) : g[0], dt)};
  });
}

Tensor mm(const Tensor& a, const Tensor& b) {
  Tensor out = k::Mm(a, b);
  if (!ShouldRecord({&a, &b})) return out;
  const bool na = RequiresGrad(a), nb = RequiresGrad(b);
  const DType da = a.dtype(), db = b.dtype();
  SavedTensor saved_a(nb ? a : Tensor()), saved_b(na ? b : Tensor());
  return record_function("MmBackward0", {a, b}, out, [=](const TensorList& g) -> TensorList {
    TensorList r(2);
    if (na) r[0] = AsDTypeOf(k::Mm(g[0], saved_b.unpack(), false, true), da);
    if (nb) r[1] = AsDTypeOf(k::Mm(saved_a.unpack(), g[0], true, false), db);
    return r;
  });
}

Tensor bmm(const Tensor& a, const Tensor& b) {
  FSDP_CHECK(a.dim() == 3 && b.dim() == 3, "bmm: expected 3-D tensors, got ", ShapeStr(a.sizes()), " and ",
             ShapeStr(b.sizes()));
  Tensor out = k::Bmm(a, b);
  if (!ShouldRecord({&a, &b})) return out;
  const bool na = RequiresGrad(a), nb = RequiresGrad(b);
  const DType da = a.dtype(), db = b.dtype();
  SavedTensor saved_a(nb ? a : Tensor()), saved_b(na ? b : Tensor());
  return record_function("BmmBackward0", {a, b}, out, [=](const TensorList& g) -> TensorList {
    TensorList r(2);
    if (na) r[0] = AsDTypeOf(k::Bmm(g[0], saved_b.unpack(), false, true), da);
    if (nb) r[1] = AsDTypeOf(k::Bmm(saved_a.unpack(), g[0], true, false), db);
    return r;
  });
}

Tensor addmm(const Tensor& bias, const Tensor& a, const Tensor& b) {
  Tensor out = k::Addmm(bias, a, b);
  if (!ShouldRecord({&bias, &a, &b})) return out;
  const bool nbias = RequiresGrad(bias), na = RequiresGrad(a), nb = RequiresGrad(b);
  const Shape sbias = bias.sizes();
  const DType dbias = bias.dtype(), da = a.dtype(), db = b.dtype();
  SavedTensor saved_a(nb ? a : Tensor()), saved_b(na ? b : Tensor());
  return record_function("AddmmBackward0", {bias, a, b}, out, [=](const TensorList& g) -> TensorList {
    TensorList r(3);
    if (nbias) r[0] = Reduced(g[0], sbias, dbias);
    if (na) r[1] = AsDTypeOf(k::Mm(g[0], saved_b.unpack(), false, true), da);
    if (nb) r[2] = AsDTypeOf(k::Mm(saved_a.unpack(), g[0], true, false), db);
    return r;
  });
}

Tensor mv(const Tensor& a, const Tensor& v) {
  FSDP_CHECK(a.dim() == 2 && v.dim() == 1, "mv: expected a matrix and a vector, got ", ShapeStr(a.sizes()),
             " and ", ShapeStr(v.sizes()));
  FSDP_CHECK(a.size(1) == v.size(0), "mv: size mismatch, got input (", a.size(0), "x", a.size(1), "), vec (",
             v.size(0), ")");
  const int64_t m = a.size(0), n = v.size(0);
  Tensor out = k::Mm(a, v.view({n, 1})).view({m});
  if (!ShouldRecord({&a, &v})) return out;
  const bool na = RequiresGrad(a), nv = RequiresGrad(v);
  const DType da = a.dtype(), dv = v.dtype();
  SavedTensor saved_a(nv ? a : Tensor()), saved_v(na ? v : Tensor());
  return record_function("MvBackward0", {a, v}, out, [=](const TensorList& g) -> TensorList {
    TensorList r(2);
    const Tensor gc = g[0].view({m, 1});
    if (na) r[0] = AsDTypeOf(k::Mm(gc, saved_v.unpack().view({1, n})), da);
    if (nv) r[1] = AsDTypeOf(k::Mm(saved_a.unpack(), gc, true, false).view({n}), dv);
    return r;
  });
}

Tensor dot(const Tensor& a, const Tensor& b) {
  FSDP_CHECK(a.dim() == 1 && b.dim() == 1 && a.size(0) == b.size(0),
             "dot: 1D tensors expected with the same number of elements, got ", ShapeStr(a.sizes()), " and ",
             ShapeStr(b.sizes()));
  const int64_t n = a.size(0);
  Tensor out = k::Mm(a.view({1, n}), b.view({n, 1})).view({});
  if (!ShouldRecord({&a, &b})) return out;
  const bool na = RequiresGrad(a), nb = RequiresGrad(b);
  const DType da = a.dtype(), db = b.dtype();
  SavedTensor saved_a(nb ? a : Tensor()), saved_b(na ? b : Tensor());
  return record_function("DotBackward0", {a, b}, out, [=](const TensorList& g) -> TensorList {
    TensorList r(2);
    if (na) r[0] = AsDTypeOf(k::Mul(g[0], saved_b.unpack()), da);
    if (nb) r[1] = AsDTypeOf(k::Mul(g[0], saved_a.unpack()), db);
    return r;
  });
}

Tensor matmul(const Tensor& a, const Tensor& b) {
  const int64_t da = a.dim(), db = b.dim();
  FSDP_CHECK(da >= 1 && db >= 1, "both arguments to matmul need to be at least 1D, but they are ", da, "D and ",
             db, "D");
  if (da == 1 && db == 1) return dot(a, b);
  if (da == 2 && db == 1) return mv(a, b);
  if (da == 1 && db == 2) return squeeze(mm(unsqueeze(a, 0), b), 0);
  if (da == 2 && db == 2) return mm(a, b);
  if (da >= 3 && db <= 2) {
    // Fold the batch of `a` into the rows of one matrix product.
    Shape out_shape(a.sizes().begin(), a.sizes().end() - 1);
    const Tensor folded = reshape(a, {Numel(out_shape), a.size(-1)});
    if (db == 2) {
      out_shape.push_back(b.size(1));
      return functional_internal::unsafe_view(mm(folded, b), out_shape);
    }
    return functional_internal::unsafe_view(mv(folded, b), out_shape);
  }
  // Batched: expand both operands to the broadcast batch, flatten it, bmm.
  const int64_t n = da > 1 ? a.size(-2) : 1, m1 = a.size(-1);
  const int64_t m2 = db > 1 ? b.size(-2) : b.size(0), p = db > 1 ? b.size(-1) : 1;
  const Shape batch_a(a.sizes().begin(), a.sizes().end() - std::min<int64_t>(da, 2));
  const Shape batch_b(b.sizes().begin(), b.sizes().end() - std::min<int64_t>(db, 2));
  Shape out_shape = k::BroadcastShapes(batch_a, batch_b, "matmul");
  const int64_t batch = Numel(out_shape);
  Shape ea = out_shape;
  ea.push_back(n);
  ea.push_back(m1);
  const Tensor a3 = reshape(expand(a, ea), {batch, n, m1});
  Shape eb = out_shape;
  eb.push_back(m2);
  if (db == 1) {
    const Tensor b3 = unsqueeze(reshape(expand(b, eb), {batch, m2}), 2);
    if (da > 1) out_shape.push_back(n);
    return functional_internal::unsafe_view(squeeze(bmm(a3, b3), -1), out_shape);
  }
  eb.push_back(p);
  const Tensor b3 = reshape(expand(b, eb), {batch, m2, p});
  if (da > 1) out_shape.push_back(n);
  out_shape.push_back(p);
  return functional_internal::unsafe_view(bmm(a3, b3), out_shape);
}

namespace {

// linear's weight transpose, recorded as TBackward0 but stored as an alias of the weight in
// its own [out, in] layout (no copy, shares storage like w.t()). It is only consumed by
// LinearProduct below, which reads it as Wᵀ; its gradient is therefore in W's layout too.
Tensor WeightT(const Tensor& w) {
  Tensor alias = w.view(w.sizes());
  if (!ShouldRecord({&w})) return alias;
  return record_function("TBackward0", {w}, alias, [](const TensorList& g) -> TensorList { return {g[0]}; });
}

// x2 [R, in] @ wt + bias, with wt from WeightT: AddmmBackward0 (bias defined) or MmBackward0.
Tensor LinearProduct(const Tensor& bias, const Tensor& x2, const Tensor& wt) {
  Tensor out = k::Linear(x2, wt, bias);
  const bool has_bias = bias.defined();
  if (has_bias ? !ShouldRecord({&bias, &x2, &wt}) : !ShouldRecord({&x2, &wt})) return out;
  const bool nbias = RequiresGrad(bias), nx = RequiresGrad(x2), nw = RequiresGrad(wt);
  const Shape sbias = has_bias ? bias.sizes() : Shape();
  const DType dbias = has_bias ? bias.dtype() : x2.dtype(), dx = x2.dtype(), dw = wt.dtype();
  SavedTensor saved_x(nw ? x2 : Tensor()), saved_w(nx ? wt : Tensor());
  auto grads = [=](const Tensor& g, TensorList* r, size_t first) {
    if (nx) (*r)[first] = AsDTypeOf(k::Mm(g, saved_w.unpack()), dx);
    if (nw) (*r)[first + 1] = AsDTypeOf(k::Mm(g, saved_x.unpack(), true, false), dw);
  };
  if (has_bias) {
    return record_function("AddmmBackward0", {bias, x2, wt}, out, [=](const TensorList& g) -> TensorList {
      TensorList r(3);
      if (nbias) r[0] = Reduced(g[0], sbias, dbias);
      grads(g[0], &r, 1);
      return r;
    });
  }
  return record_function("MmBackward0", {x2, wt}, out, [=](const TensorList& g) -> TensorList {
    TensorList r(2);
    grads(g[0], &r, 0);
    return r;
  });
}

}  // namespace

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  FSDP_CHECK(x.defined() && weight.defined(), "linear: input and weight must be defined");
  FSDP_CHECK(x.dim() >= 1 && weight.dim() == 2, "linear: expected input of rank >= 1 and a 2-D weight, got input ",
             ShapeStr(x.sizes()), " and weight ", ShapeStr(weight.sizes()));
  FSDP_CHECK(x.size(-1) == weight.size(1), "linear: mat1 and mat2 shapes cannot be multiplied (input ",
             ShapeStr(x.sizes()), ", weight ", ShapeStr(weight.sizes()), ")");
  FSDP_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == weight.size(0)), "linear: bias ",
             bias.defined() ? ShapeStr(bias.sizes()) : "", " does not match weight ", ShapeStr(weight.sizes()));
  const int64_t in = x.size(-1), out_features = weight.size(0);
  Shape out_shape(x.sizes().begin(), x.sizes().end() - 1);
  const int64_t rows = Numel(out_shape);
  out_shape.push_back(out_features);
  if (bias.defined()) {
    if (x.dim() == 2) return LinearProduct(bias, x, WeightT(weight));
    const Tensor x2 = reshape(x, {rows, in});
    return view(LinearProduct(bias, x2, WeightT(weight)), out_shape);
  }
  const Tensor wt = WeightT(weight);
  if (x.dim() == 2) return LinearProduct(Tensor(), x, wt);
  if (x.dim() == 1) return squeeze(LinearProduct(Tensor(), unsqueeze(x, 0), wt), 0);
  const Tensor x2 = reshape(x, {rows, in});
  return functional_internal::unsafe_view(LinearProduct(Tensor(), x2, wt), out_shape);
}

// ---- Reductions -------------------------------------------------------------------------------

Tensor sum(const Tensor& x) {
  Tensor out = k::Sum(x);
  if (!ShouldRecord({&x})) return out;
  const Shape shape = x.sizes();
  const DType dt = x.dtype();
  return record_function("SumBackward0", {x}, out, [shape, dt](const TensorList& g) -> TensorList {
    return {AsDTypeOf(k::SumBackward(g[0], shape), dt)};
  });
}

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  Tensor out = k::Sum(x, dims, keepdim);
  if (!ShouldRecord({&x})) return out;
  const Shape shape = x.sizes();
  const DType dt = x.dtype();
  return record_function("SumBackward1", {x}, out, [=](const TensorList& g) -> TensorList {
    return {AsDTypeOf(k::SumBackward(g[0], shape, dims, keepdim), dt)};
  });
}

Tensor mean(const Tensor& x) {
  Tensor out = k::Mean(x);
  if (!ShouldRecord({&x})) return out;
  const Shape shape = x.sizes();
  const DType dt = x.dtype();
  return record_function("MeanBackward0", {x}, out, [shape, dt](const TensorList& g) -> TensorList {
    return {AsDTypeOf(k::MeanBackward(g[0], shape), dt)};
  });
}

Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  Tensor out = k::Mean(x, dims, keepdim);
  if (!ShouldRecord({&x})) return out;
  const Shape shape = x.sizes();
  const DType dt = x.dtype();
  return record_function("MeanBackward1", {x}, out, [=](const TensorList& g) -> TensorList {
    return {AsDTypeOf(k::MeanBackward(g[0], shape, dims, keepdim), dt)};
  });
}

}  // namespace fsdp
