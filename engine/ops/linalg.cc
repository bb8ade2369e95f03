#include "engine/ops/linalg.h"

#include <algorithm>
#include <initializer_list>
#include <string>

#include <Eigen/Core>

#include "engine/ops/broadcast.h"
#include "engine/ops/cuda/dispatch.h"
#include "engine/ops/kernel_util.h"

namespace fsdp::ops::kernels {

namespace {

using internal::HostAs;
using internal::Restore;

template <typename T>
using RowMat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// out (M x N, row-major) = [out +] op(A) * op(B), A stored ar x ac, B stored br x bc.
template <typename T>
void Gemm(const T* a, int64_t ar, int64_t ac, bool ta, const T* b, int64_t br, int64_t bc, bool tb,
          T* out, bool accumulate) {
  const int64_t m = ta ? ac : ar, n = tb ? br : bc, k = ta ? ar : ac;
  Eigen::Map<RowMat<T>> o(out, m, n);
  if (!accumulate) o.setZero();
  if (k == 0 || m == 0 || n == 0) return;
  Eigen::Map<const RowMat<T>> ma(a, ar, ac), mb(b, br, bc);
  if (!ta && !tb) {
    o.noalias() += ma * mb;
  } else if (ta && !tb) {
    o.noalias() += ma.transpose() * mb;
  } else if (!ta && tb) {
    o.noalias() += ma * mb.transpose();
  } else {
    o.noalias() += ma.transpose() * mb.transpose();
  }
}

struct MatDims {
  int64_t rows;  // stored
  int64_t cols;  // stored
  int64_t m;     // effective rows after the transpose flag
  int64_t k;     // effective cols
};

MatDims Dims(const Tensor& t, bool transpose) {
  const int64_t r = t.size(-2), c = t.size(-1);
  return transpose ? MatDims{r, c, c, r} : MatDims{r, c, r, c};
}

std::string MatStr(const Tensor& t, bool transpose) {
  return ShapeStr(t.sizes()) + (transpose ? "ᵀ" : "");
}

DType CommonFloat(const char* op, std::initializer_list<const Tensor*> ts) {
  DType dt = DType::kInt64;
  bool first = true;
  for (const Tensor* t : ts) {
    if (!t->defined()) continue;
    internal::CheckFloating(op, "input", *t);
    dt = first ? t->dtype() : PromoteTypes(dt, t->dtype());
    first = false;
  }
  return dt;
}

}  // namespace

Tensor Mm(const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b) {
  const DType dt = CommonFloat("mm", {&a, &b});
  FSDP_CHECK(a.dim() == 2 && b.dim() == 2, "mm: expected 2-D tensors, got ", ShapeStr(a.sizes()),
             " and ", ShapeStr(b.sizes()));
  const MatDims da = Dims(a, transpose_a), db = Dims(b, transpose_b);
  FSDP_CHECK(da.k == db.m, "mm: mat1 and mat2 shapes cannot be multiplied (", da.m, "x", da.k, " and ",
             db.m, "x", db.k, "; operands ", MatStr(a, transpose_a), " and ", MatStr(b, transpose_b), ")");
  if (internal::OnCuda("mm", {&a, &b})) return FSDP_CUDA_KERNEL("mm", Mm(a, b, transpose_a, transpose_b, dt));
  const DType cd = internal::ComputeDType(dt);
  const Tensor ha = HostAs(a, cd), hb = HostAs(b, cd);
  Tensor out = internal::DispatchFloat(cd, "mm", [&](auto tag) {
    using T = decltype(tag);
    Tensor r = Tensor::empty({da.m, db.k}, cd);
    Gemm<T>(ha.data<T>(), da.rows, da.cols, transpose_a, hb.data<T>(), db.rows, db.cols, transpose_b,
            r.data<T>(), false);
    return r;
  });
  return Restore(out, dt, a.device());
}

Tensor Bmm(const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b) {
  const DType dt = CommonFloat("bmm", {&a, &b});
  FSDP_CHECK(a.dim() >= 3 && a.dim() == b.dim(), "bmm: expected operands of equal rank >= 3, got ",
             ShapeStr(a.sizes()), " and ", ShapeStr(b.sizes()));
  const Shape batch(a.sizes().begin(), a.sizes().end() - 2);
  FSDP_CHECK(Shape(b.sizes().begin(), b.sizes().end() - 2) == batch, "bmm: batch dimensions of ",
             ShapeStr(a.sizes()), " and ", ShapeStr(b.sizes()), " differ");
  const MatDims da = Dims(a, transpose_a), db = Dims(b, transpose_b);
  FSDP_CHECK(da.k == db.m, "bmm: batch1 and batch2 shapes cannot be multiplied (", da.m, "x", da.k,
             " and ", db.m, "x", db.k, "; operands ", MatStr(a, transpose_a), " and ",
             MatStr(b, transpose_b), ")");
  if (internal::OnCuda("bmm", {&a, &b})) return FSDP_CUDA_KERNEL("bmm", Bmm(a, b, transpose_a, transpose_b, dt));
  const DType cd = internal::ComputeDType(dt);
  const Tensor ha = HostAs(a, cd), hb = HostAs(b, cd);
  Shape out_shape = batch;
  out_shape.push_back(da.m);
  out_shape.push_back(db.k);
  const int64_t nb = Numel(batch);
  Tensor out = internal::DispatchFloat(cd, "bmm", [&](auto tag) {
    using T = decltype(tag);
    Tensor r = Tensor::empty(out_shape, cd);
    const T* pa = ha.data<T>();
    const T* pb = hb.data<T>();
    T* po = r.data<T>();
    for (int64_t i = 0; i < nb; ++i) {
      Gemm<T>(pa + i * da.rows * da.cols, da.rows, da.cols, transpose_a, pb + i * db.rows * db.cols,
              db.rows, db.cols, transpose_b, po + i * da.m * db.k, false);
    }
    return r;
  });
  return Restore(out, dt, a.device());
}

Tensor Addmm(const Tensor& bias, const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b) {
  const DType dt = CommonFloat("addmm", {&bias, &a, &b});
  FSDP_CHECK(a.dim() == 2 && b.dim() == 2, "addmm: expected 2-D matrices, got ", ShapeStr(a.sizes()),
             " and ", ShapeStr(b.sizes()));
  const MatDims da = Dims(a, transpose_a), db = Dims(b, transpose_b);
  FSDP_CHECK(da.k == db.m, "addmm: mat1 and mat2 shapes cannot be multiplied (", da.m, "x", da.k,
             " and ", db.m, "x", db.k, ")");
  const Shape out_shape = {da.m, db.k};
  FSDP_CHECK(bias.dim() <= 2 && BroadcastShapes(bias.sizes(), out_shape, "addmm") == out_shape,
             "addmm: bias ", ShapeStr(bias.sizes()), " cannot be broadcast to ", ShapeStr(out_shape));
  if (internal::OnCuda("addmm", {&bias, &a, &b})) {
    return FSDP_CUDA_KERNEL("addmm", Addmm(bias, a, b, transpose_a, transpose_b, dt));
  }
  const DType cd = internal::ComputeDType(dt);
  const Tensor ha = HostAs(a, cd), hb = HostAs(b, cd);
  Tensor out = Expand(HostAs(bias, cd), out_shape).clone();
  internal::DispatchFloat(cd, "addmm", [&](auto tag) {
    using T = decltype(tag);
    Gemm<T>(ha.data<T>(), da.rows, da.cols, transpose_a, hb.data<T>(), db.rows, db.cols, transpose_b,
            out.data<T>(), true);
  });
  return Restore(out, dt, a.device());
}

Tensor Matmul(const Tensor& a, const Tensor& b) {
  FSDP_CHECK(a.dim() >= 2 && b.dim() >= 2, "matmul kernel: expected operands of rank >= 2, got ",
             ShapeStr(a.sizes()), " and ", ShapeStr(b.sizes()));
  if (a.dim() == 2 && b.dim() == 2) return Mm(a, b);
  const Shape ba(a.sizes().begin(), a.sizes().end() - 2), bb(b.sizes().begin(), b.sizes().end() - 2);
  Shape batch = BroadcastShapes(ba, bb, "matmul");
  Shape sa = batch, sb = batch;
  sa.push_back(a.size(-2));
  sa.push_back(a.size(-1));
  sb.push_back(b.size(-2));
  sb.push_back(b.size(-1));
  return Bmm(Expand(a, sa), Expand(b, sb));
}

MatmulGrads MmBackward(const Tensor& grad, const Tensor& a, const Tensor& b, bool need_a, bool need_b) {
  MatmulGrads g;
  if (need_a) g.a = Restore(Mm(grad, b, false, true), a.dtype(), a.device());
  if (need_b) g.b = Restore(Mm(a, grad, true, false), b.dtype(), b.device());
  return g;
}

MatmulGrads BmmBackward(const Tensor& grad, const Tensor& a, const Tensor& b, bool need_a, bool need_b) {
  MatmulGrads g;
  if (need_a) g.a = Restore(Bmm(grad, b, false, true), a.dtype(), a.device());
  if (need_b) g.b = Restore(Bmm(a, grad, true, false), b.dtype(), b.device());
  return g;
}

MatmulGrads MatmulBackward(const Tensor& grad, const Tensor& a, const Tensor& b, bool need_a, bool need_b) {
  if (a.dim() == 2 && b.dim() == 2) return MmBackward(grad, a, b, need_a, need_b);
  Shape batch(grad.sizes().begin(), grad.sizes().end() - 2);
  Shape sa = batch, sb = batch;
  sa.push_back(a.size(-2));
  sa.push_back(a.size(-1));
  sb.push_back(b.size(-2));
  sb.push_back(b.size(-1));
  const Tensor ea = Expand(a, sa), eb = Expand(b, sb);
  MatmulGrads g;
  if (need_a) g.a = Restore(SumToShape(Bmm(grad, eb, false, true), a.sizes()), a.dtype(), a.device());
  if (need_b) g.b = Restore(SumToShape(Bmm(ea, grad, true, false), b.sizes()), b.dtype(), b.device());
  return g;
}

Tensor Linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  const DType dt = CommonFloat("linear", {&x, &weight, &bias});
  FSDP_CHECK(x.dim() >= 1 && weight.dim() == 2, "linear: expected input of rank >= 1 and a 2-D weight, got ",
             ShapeStr(x.sizes()), " and ", ShapeStr(weight.sizes()));
  const int64_t in = x.size(-1), out_features = weight.size(0);
  FSDP_CHECK(weight.size(1) == in, "linear: mat1 and mat2 shapes cannot be multiplied (input ",
             ShapeStr(x.sizes()), ", weight ", ShapeStr(weight.sizes()), ")");
  FSDP_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == out_features), "linear: bias ",
             bias.defined() ? ShapeStr(bias.sizes()) : "", " does not match weight ", ShapeStr(weight.sizes()));
  if (internal::OnCuda("linear", {&x, &weight, &bias})) return FSDP_CUDA_KERNEL("linear", Linear(x, weight, bias, dt));
  const int64_t nrows = internal::ProdRange(x.sizes(), 0, x.dim() - 1);
  Shape out_shape = x.sizes();
  out_shape.back() = out_features;
  const DType cd = internal::ComputeDType(dt);
  const Tensor hx = HostAs(x, cd), hw = HostAs(weight, cd), hb = HostAs(bias, cd);
  Tensor out = internal::DispatchFloat(cd, "linear", [&](auto tag) {
    using T = decltype(tag);
    Tensor r = Tensor::empty(out_shape, cd);
    T* po = r.data<T>();
    if (hb.defined()) {
      const T* pb = hb.data<T>();
      for (int64_t i = 0; i < nrows; ++i) std::copy(pb, pb + out_features, po + i * out_features);
    }
    Gemm<T>(hx.data<T>(), nrows, in, false, hw.data<T>(), out_features, in, true, po, hb.defined());
    return r;
  });
  return Restore(out, dt, x.device());
}

LinearGrads LinearBackward(const Tensor& grad, const Tensor& x, const Tensor& weight, bool has_bias,
                           bool need_input, bool need_weight, bool need_bias) {
  const int64_t in = x.size(-1), out_features = weight.size(0);
  const int64_t nrows = internal::ProdRange(x.sizes(), 0, x.dim() - 1);
  FSDP_CHECK(grad.numel() == nrows * out_features, "linear_backward: gradient ", grad.str(),
             " does not match input ", ShapeStr(x.sizes()), " and weight ", ShapeStr(weight.sizes()));
  const Tensor g2 = grad.view({nrows, out_features});
  LinearGrads g;
  if (need_input) g.input = Restore(Mm(g2, weight), x.dtype(), x.device()).view(x.sizes());
  if (need_weight) g.weight = Restore(Mm(g2, x.view({nrows, in}), true, false), weight.dtype(), weight.device());
  if (has_bias && need_bias) {
    g.bias = Restore(SumToShape(g2, {out_features}), grad.dtype(), grad.device());
  }
  return g;
}

}  // namespace fsdp::ops::kernels
