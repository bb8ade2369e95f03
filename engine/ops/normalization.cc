#include "engine/ops/normalization.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "engine/ops/cuda/dispatch.h"
#include "engine/ops/kernel_util.h"

namespace fsdp::ops::kernels {

namespace {

using internal::HostAs;
using internal::Restore;

// Splits x into [rows, cols] where cols is the product of the normalised trailing dims.
struct NormLayout {
  int64_t rows;
  int64_t cols;
  Shape stat_shape;
};

NormLayout CheckNormalized(const char* op, const Tensor& x, const Shape& normalized_shape,
                           const Tensor& weight, const Tensor& bias) {
  internal::CheckFloating(op, "input", x);
  const int64_t nd = static_cast<int64_t>(normalized_shape.size());
  FSDP_CHECK(nd >= 1, op, ": normalized_shape must have at least one dimension");
  bool ok = x.dim() >= nd;
  for (int64_t i = 0; ok && i < nd; ++i) {
    ok = x.sizes()[static_cast<size_t>(x.dim() - nd + i)] == normalized_shape[static_cast<size_t>(i)];
  }
  FSDP_CHECK(ok, op, ": given normalized_shape=", ShapeStr(normalized_shape),
             ", expected input with shape [*, ", ShapeStr(normalized_shape).substr(1),
             ", but got input of size ", ShapeStr(x.sizes()));
  FSDP_CHECK(!weight.defined() || weight.sizes() == normalized_shape, op, ": expected weight of shape ",
             ShapeStr(normalized_shape), ", got ", ShapeStr(weight.sizes()));
  FSDP_CHECK(!bias.defined() || bias.sizes() == normalized_shape, op, ": expected bias of shape ",
             ShapeStr(normalized_shape), ", got ", ShapeStr(bias.sizes()));
  NormLayout l;
  l.cols = Numel(normalized_shape);
  l.rows = internal::ProdRange(x.sizes(), 0, x.dim() - nd);
  l.stat_shape = Shape(x.sizes().begin(), x.sizes().end() - nd);
  for (int64_t i = 0; i < nd; ++i) l.stat_shape.push_back(1);
  return l;
}

// Gradient dtype for weight/bias.
DType ParamGradDType(const Tensor& weight, const Tensor& grad) {
  return weight.defined() ? weight.dtype() : grad.dtype();
}

}  // namespace

// ---- layer_norm ------------------------------------------------------------------------------

LayerNormResult LayerNorm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight,
                          const Tensor& bias, double eps) {
  const NormLayout l = CheckNormalized("layer_norm", x, normalized_shape, weight, bias);
  if (internal::OnCuda("layer_norm", {&x, &weight, &bias})) {
    return FSDP_CUDA_KERNEL("layer_norm", LayerNorm(x, l.rows, l.cols, l.stat_shape, weight, bias, eps));
  }
  const DType cd = internal::ComputeDType(x.dtype());
  const Tensor hx = HostAs(x, cd), hw = HostAs(weight, cd), hb = HostAs(bias, cd);
  LayerNormResult r;
  r.mean = Tensor::empty(l.stat_shape, cd);
  r.rstd = Tensor::empty(l.stat_shape, cd);
  Tensor out = internal::DispatchFloat(cd, "layer_norm", [&](auto tag) {
    using T = decltype(tag);
    Tensor y = Tensor::empty(x.sizes(), cd);
    const T* px = hx.data<T>();
    const T* pw = hw.defined() ? hw.data<T>() : nullptr;
    const T* pb = hb.defined() ? hb.data<T>() : nullptr;
    T* py = y.data<T>();
    T* pm = r.mean.data<T>();
    T* ps = r.rstd.data<T>();
    for (int64_t i = 0; i < l.rows; ++i) {
      const T* xr = px + i * l.cols;
      T* yr = py + i * l.cols;
      T sum = T(0);
      for (int64_t j = 0; j < l.cols; ++j) sum += xr[j];
      const T mean = l.cols > 0 ? sum / static_cast<T>(l.cols) : T(0);
      T sq = T(0);
      for (int64_t j = 0; j < l.cols; ++j) sq += (xr[j] - mean) * (xr[j] - mean);
      const T var = l.cols > 0 ? sq / static_cast<T>(l.cols) : T(0);
      const T rstd = T(1) / std::sqrt(std::max(var, T(0)) + static_cast<T>(eps));
      pm[i] = mean;
      ps[i] = rstd;
      for (int64_t j = 0; j < l.cols; ++j) {
        const T g = pw ? pw[j] : T(1);
        const T b = pb ? pb[j] : T(0);
        yr[j] = (xr[j] - mean) * rstd * g + b;
      }
    }
    return y;
  });
  r.output = Restore(out, x.dtype(), x.device());
  return r;
}

NormGrads LayerNormBackward(const Tensor& grad, const Tensor& x, const Shape& normalized_shape,
                            const Tensor& mean, const Tensor& rstd, const Tensor& weight,
                            bool need_input, bool need_weight, bool need_bias) {
  const NormLayout l = CheckNormalized("layer_norm_backward", x, normalized_shape, weight, Tensor());
  FSDP_CHECK(grad.sizes() == x.sizes(), "layer_norm_backward: gradient ", ShapeStr(grad.sizes()),
             " does not match input ", ShapeStr(x.sizes()));
  FSDP_CHECK(mean.numel() == l.rows && rstd.numel() == l.rows, "layer_norm_backward: mean ",
             ShapeStr(mean.sizes()), " / rstd ", ShapeStr(rstd.sizes()), " do not have ", l.rows, " rows");
  if (internal::OnCuda("layer_norm_backward", {&grad, &x, &mean, &rstd, &weight})) {
    return FSDP_CUDA_KERNEL("layer_norm_backward",
                            LayerNormBackward(grad, x, l.rows, l.cols, normalized_shape, mean, rstd, weight,
                                              need_input, need_weight, need_bias));
  }
  const DType cd = internal::ComputeDType(x.dtype());
  const Tensor hg = HostAs(grad, cd), hx = HostAs(x, cd), hw = HostAs(weight, cd);
  const Tensor hm = HostAs(mean, cd), hs = HostAs(rstd, cd);
  const bool want_w = need_weight && weight.defined();
  NormGrads out;
  internal::DispatchFloat(cd, "layer_norm_backward", [&](auto tag) {
    using T = decltype(tag);
    Tensor dx = need_input ? Tensor::empty(x.sizes(), cd) : Tensor();
    Tensor dw = want_w ? Tensor::zeros(normalized_shape, cd) : Tensor();
    Tensor db = need_bias ? Tensor::zeros(normalized_shape, cd) : Tensor();
    const T* pg = hg.data<T>();
    const T* px = hx.data<T>();
    const T* pw = hw.defined() ? hw.data<T>() : nullptr;
    const T* pm = hm.data<T>();
    const T* ps = hs.data<T>();
    const T scale = l.cols > 0 ? T(1) / static_cast<T>(l.cols) : T(0);
    for (int64_t i = 0; i < l.rows; ++i) {
      const T* gr = pg + i * l.cols;
      const T* xr = px + i * l.cols;
      const T m = pm[i], a = ps[i];
      if (need_input) {
        // PyTorch's layer_norm_backward_frame: dx = a * dy * γ + b * x + c.
        T ds = T(0), dbs = T(0);
        for (int64_t j = 0; j < l.cols; ++j) {
          const T gg = gr[j] * (pw ? pw[j] : T(1));
          ds += gg * xr[j];
          dbs += gg;
        }
        const T b = (dbs * m - ds) * a * a * a * scale;
        const T c = -b * m - dbs * a * scale;
        T* dxr = dx.data<T>() + i * l.cols;
        for (int64_t j = 0; j < l.cols; ++j) dxr[j] = a * gr[j] * (pw ? pw[j] : T(1)) + b * xr[j] + c;
      }
      if (want_w) {
        T* pdw = dw.data<T>();
        for (int64_t j = 0; j < l.cols; ++j) pdw[j] += gr[j] * (xr[j] - m) * a;
      }
      if (need_bias) {
        T* pdb = db.data<T>();
        for (int64_t j = 0; j < l.cols; ++j) pdb[j] += gr[j];
      }
    }
    const DType pdt = ParamGradDType(weight, grad);
    out.input = Restore(dx, x.dtype(), x.device());
    out.weight = Restore(dw, pdt, x.device());
    out.bias = Restore(db, pdt, x.device());
  });
  return out;
}

// ---- rms_norm --------------------------------------------------------------------------------

RmsNormResult RmsNorm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight,
                      std::optional<double> eps) {
  const NormLayout l = CheckNormalized("rms_norm", x, normalized_shape, weight, Tensor());
  double e = 0.0;
  if (eps.has_value()) {
    e = *eps;
  } else {
    // PyTorch uses the epsilon of the op-math type: float for float16/bfloat16 inputs.
    e = x.dtype() == DType::kFloat64 ? std::numeric_limits<double>::epsilon()
                                     : static_cast<double>(std::numeric_limits<float>::epsilon());
  }
  if (internal::OnCuda("rms_norm", {&x, &weight})) {
    return FSDP_CUDA_KERNEL("rms_norm", RmsNorm(x, l.rows, l.cols, l.stat_shape, weight, e));
  }
  const DType cd = internal::ComputeDType(x.dtype());
  const Tensor hx = HostAs(x, cd), hw = HostAs(weight, cd);
  RmsNormResult r;
  r.rstd = Tensor::empty(l.stat_shape, cd);
  Tensor out = internal::DispatchFloat(cd, "rms_norm", [&](auto tag) {
    using T = decltype(tag);
    Tensor y = Tensor::empty(x.sizes(), cd);
    const T* px = hx.data<T>();
    const T* pw = hw.defined() ? hw.data<T>() : nullptr;
    T* py = y.data<T>();
    T* ps = r.rstd.data<T>();
    for (int64_t i = 0; i < l.rows; ++i) {
      const T* xr = px + i * l.cols;
      T sq = T(0);
      for (int64_t j = 0; j < l.cols; ++j) sq += xr[j] * xr[j];
      const T ms = l.cols > 0 ? sq / static_cast<T>(l.cols) : T(0);
      const T rstd = T(1) / std::sqrt(ms + static_cast<T>(e));
      ps[i] = rstd;
      for (int64_t j = 0; j < l.cols; ++j) py[i * l.cols + j] = xr[j] * rstd * (pw ? pw[j] : T(1));
    }
    return y;
  });
  r.output = Restore(out, x.dtype(), x.device());
  return r;
}

NormGrads RmsNormBackward(const Tensor& grad, const Tensor& x, const Shape& normalized_shape,
                          const Tensor& rstd, const Tensor& weight, bool need_input, bool need_weight) {
  const NormLayout l = CheckNormalized("rms_norm_backward", x, normalized_shape, weight, Tensor());
  FSDP_CHECK(grad.sizes() == x.sizes() && rstd.numel() == l.rows, "rms_norm_backward: gradient ",
             ShapeStr(grad.sizes()), " / rstd ", ShapeStr(rstd.sizes()), " do not match input ",
             ShapeStr(x.sizes()));
  if (internal::OnCuda("rms_norm_backward", {&grad, &x, &rstd, &weight})) {
    return FSDP_CUDA_KERNEL("rms_norm_backward", RmsNormBackward(grad, x, l.rows, l.cols, normalized_shape, rstd,
                                                                 weight, need_input, need_weight));
  }
  const DType cd = internal::ComputeDType(x.dtype());
  const Tensor hg = HostAs(grad, cd), hx = HostAs(x, cd), hw = HostAs(weight, cd), hs = HostAs(rstd, cd);
  const bool want_w = need_weight && weight.defined();
  NormGrads out;
  internal::DispatchFloat(cd, "rms_norm_backward", [&](auto tag) {
    using T = decltype(tag);
    Tensor dx = need_input ? Tensor::empty(x.sizes(), cd) : Tensor();
    Tensor dw = want_w ? Tensor::zeros(normalized_shape, cd) : Tensor();
    const T* pg = hg.data<T>();
    const T* px = hx.data<T>();
    const T* pw = hw.defined() ? hw.data<T>() : nullptr;
    const T* ps = hs.data<T>();
    const T scale = l.cols > 0 ? T(1) / static_cast<T>(l.cols) : T(0);
    for (int64_t i = 0; i < l.rows; ++i) {
      const T* gr = pg + i * l.cols;
      const T* xr = px + i * l.cols;
      const T a = ps[i];
      if (need_input) {
        T dot = T(0);
        for (int64_t j = 0; j < l.cols; ++j) dot += gr[j] * (pw ? pw[j] : T(1)) * xr[j];
        const T b = dot * a * a * a * scale;
        T* dxr = dx.data<T>() + i * l.cols;
        for (int64_t j = 0; j < l.cols; ++j) dxr[j] = a * gr[j] * (pw ? pw[j] : T(1)) - b * xr[j];
      }
      if (want_w) {
        T* pdw = dw.data<T>();
        for (int64_t j = 0; j < l.cols; ++j) pdw[j] += gr[j] * xr[j] * a;
      }
    }
    out.input = Restore(dx, x.dtype(), x.device());
    out.weight = Restore(dw, ParamGradDType(weight, grad), x.device());
  });
  return out;
}

// ---- batch_norm ------------------------------------------------------------------------------

namespace {

struct BnLayout {
  int64_t n;  // batch
  int64_t c;  // channels
  int64_t l;  // length (1 for [N, C])
};

BnLayout CheckBatchNorm(const char* op, const Tensor& x, const Tensor& weight, const Tensor& bias,
                        const Tensor& running_mean, const Tensor& running_var) {
  internal::CheckFloating(op, "input", x);
  FSDP_CHECK(x.dim() == 2 || x.dim() == 3, op, ": expected 2D or 3D input (got ", x.dim(),
             "D input of shape ", ShapeStr(x.sizes()), ")");
  BnLayout l{x.size(0), x.size(1), x.dim() == 3 ? x.size(2) : 1};
  auto check_c = [&](const Tensor& t, const char* name) {
    FSDP_CHECK(!t.defined() || (t.dim() == 1 && t.size(0) == l.c), op, ": ", name,
               " should contain ", l.c, " elements (input ", ShapeStr(x.sizes()), "), got ",
               t.defined() ? ShapeStr(t.sizes()) : "");
  };
  check_c(weight, "weight");
  check_c(bias, "bias");
  check_c(running_mean, "running_mean");
  check_c(running_var, "running_var");
  return l;
}

}  // namespace

BatchNormResult BatchNorm(const Tensor& x, const Tensor& weight, const Tensor& bias,
                          const Tensor& running_mean, const Tensor& running_var,
                          const Tensor& num_batches_tracked, bool training,
                          std::optional<double> momentum, double eps) {
  const BnLayout l = CheckBatchNorm("batch_norm", x, weight, bias, running_mean, running_var);
  FSDP_CHECK(running_mean.defined() == running_var.defined(),
             "batch_norm: running_mean and running_var must both be given or both be undefined");
  const int64_t count = l.n * l.l;
  if (training) {
    FSDP_CHECK(count > 1, "batch_norm: Expected more than 1 value per channel when training, got input size ",
               ShapeStr(x.sizes()));
  } else {
    FSDP_CHECK(running_mean.defined(), "batch_norm: running_mean and running_var must be defined in evaluation mode");
  }
  double factor = momentum.value_or(0.0);
  if (training && num_batches_tracked.defined()) {
    FSDP_CHECK(num_batches_tracked.numel() == 1 && num_batches_tracked.dtype() == DType::kInt64,
               "batch_norm: num_batches_tracked must be a single int64 element, got ", num_batches_tracked.str());
    const int64_t nbt = num_batches_tracked.to_int64s()[0] + 1;
    Tensor counter = num_batches_tracked;  // a handle to the caller's tensor, written in place
    counter.copy_(Tensor::from_int64s({nbt}, num_batches_tracked.sizes()));
    if (!momentum.has_value()) factor = 1.0 / static_cast<double>(nbt);
  } else {
    FSDP_CHECK(momentum.has_value() || !training || !running_mean.defined(),
               "batch_norm: momentum=None (cumulative average) needs num_batches_tracked");
  }
  if (internal::OnCuda("batch_norm", {&x, &weight, &bias, &running_mean, &running_var})) {
    return FSDP_CUDA_KERNEL("batch_norm", BatchNorm(x, l.n, l.c, l.l, weight, bias, running_mean, running_var,
                                                    training, factor, eps));
  }
  const DType cd = internal::ComputeDType(x.dtype());
  const Tensor hx = HostAs(x, cd), hw = HostAs(weight, cd), hb = HostAs(bias, cd);
  const Tensor hrm = HostAs(running_mean, cd), hrv = HostAs(running_var, cd);
  BatchNormResult r;
  r.save_mean = Tensor::empty({l.c}, cd);
  r.save_invstd = Tensor::empty({l.c}, cd);
  Tensor new_rm = running_mean.defined() && training ? Tensor::empty({l.c}, cd) : Tensor();
  Tensor new_rv = running_var.defined() && training ? Tensor::empty({l.c}, cd) : Tensor();
  Tensor out = internal::DispatchFloat(cd, "batch_norm", [&](auto tag) {
    using T = decltype(tag);
    Tensor y = Tensor::empty(x.sizes(), cd);
    const T* px = hx.data<T>();
    const T* pw = hw.defined() ? hw.data<T>() : nullptr;
    const T* pb = hb.defined() ? hb.data<T>() : nullptr;
    T* py = y.data<T>();
    T* pm = r.save_mean.data<T>();
    T* ps = r.save_invstd.data<T>();
    for (int64_t c = 0; c < l.c; ++c) {
      T mean, invstd;
      if (training) {
        T sum = T(0);
        for (int64_t i = 0; i < l.n; ++i) {
          for (int64_t k = 0; k < l.l; ++k) sum += px[(i * l.c + c) * l.l + k];
        }
        mean = sum / static_cast<T>(count);
        T sq = T(0);
        for (int64_t i = 0; i < l.n; ++i) {
          for (int64_t k = 0; k < l.l; ++k) {
            const T d = px[(i * l.c + c) * l.l + k] - mean;
            sq += d * d;
          }
        }
        const T var = sq / static_cast<T>(count);
        invstd = T(1) / std::sqrt(var + static_cast<T>(eps));
        if (new_rm.defined()) {
          const T m = static_cast<T>(factor);
          const T unbiased = sq / static_cast<T>(count - 1);
          new_rm.data<T>()[c] = m * mean + (T(1) - m) * hrm.data<T>()[c];
          new_rv.data<T>()[c] = m * unbiased + (T(1) - m) * hrv.data<T>()[c];
        }
      } else {
        mean = hrm.data<T>()[c];
        invstd = T(1) / std::sqrt(hrv.data<T>()[c] + static_cast<T>(eps));
      }
      pm[c] = mean;
      ps[c] = invstd;
      const T g = pw ? pw[c] : T(1);
      const T b = pb ? pb[c] : T(0);
      for (int64_t i = 0; i < l.n; ++i) {
        for (int64_t k = 0; k < l.l; ++k) {
          const int64_t idx = (i * l.c + c) * l.l + k;
          py[idx] = (px[idx] - mean) * invstd * g + b;
        }
      }
    }
    return y;
  });
  if (new_rm.defined()) {
    Tensor rm = running_mean, rv = running_var;  // handles to the caller's buffers
    rm.copy_(new_rm);
    rv.copy_(new_rv);
  }
  r.output = Restore(out, x.dtype(), x.device());
  return r;
}

NormGrads BatchNormBackward(const Tensor& grad, const Tensor& x, const Tensor& weight,
                            const Tensor& save_mean, const Tensor& save_invstd, bool training,
                            bool need_input, bool need_weight, bool need_bias) {
  const BnLayout l = CheckBatchNorm("batch_norm_backward", x, weight, Tensor(), save_mean, save_invstd);
  FSDP_CHECK(grad.sizes() == x.sizes(), "batch_norm_backward: gradient ", ShapeStr(grad.sizes()),
             " does not match input ", ShapeStr(x.sizes()));
  if (internal::OnCuda("batch_norm_backward", {&grad, &x, &weight, &save_mean, &save_invstd})) {
    return FSDP_CUDA_KERNEL("batch_norm_backward", BatchNormBackward(grad, x, l.n, l.c, l.l, weight, save_mean,
                                                                     save_invstd, training, need_input, need_weight,
                                                                     need_bias));
  }
  const int64_t count = l.n * l.l;
  const DType cd = internal::ComputeDType(x.dtype());
  const Tensor hg = HostAs(grad, cd), hx = HostAs(x, cd), hw = HostAs(weight, cd);
  const Tensor hm = HostAs(save_mean, cd), hs = HostAs(save_invstd, cd);
  const bool want_w = need_weight && weight.defined();
  NormGrads out;
  internal::DispatchFloat(cd, "batch_norm_backward", [&](auto tag) {
    using T = decltype(tag);
    Tensor dx = need_input ? Tensor::empty(x.sizes(), cd) : Tensor();
    Tensor dw = want_w ? Tensor::empty({l.c}, cd) : Tensor();
    Tensor db = need_bias ? Tensor::empty({l.c}, cd) : Tensor();
    const T* pg = hg.data<T>();
    const T* px = hx.data<T>();
    const T* pw = hw.defined() ? hw.data<T>() : nullptr;
    for (int64_t c = 0; c < l.c; ++c) {
      const T mean = hm.data<T>()[c], invstd = hs.data<T>()[c];
      T sum_g = T(0), dot = T(0);  // Σ dy, Σ dy * (x - mean)
      for (int64_t i = 0; i < l.n; ++i) {
        for (int64_t k = 0; k < l.l; ++k) {
          const int64_t idx = (i * l.c + c) * l.l + k;
          sum_g += pg[idx];
          dot += pg[idx] * (px[idx] - mean);
        }
      }
      const T g = pw ? pw[c] : T(1);
      if (want_w) dw.data<T>()[c] = dot * invstd;
      if (need_bias) db.data<T>()[c] = sum_g;
      if (!need_input) continue;
      T* pdx = dx.data<T>();
      if (training) {
        // dx = (dy - mean(dy) - xhat * mean(dy * xhat)) * invstd * γ, as PyTorch's
        // batch_norm_backward_cpu computes it (proj_scale = invstd² / count * Σ dy (x - mean)).
        const T proj = dot * invstd * invstd / static_cast<T>(count);
        const T grad_mean = sum_g / static_cast<T>(count);
        for (int64_t i = 0; i < l.n; ++i) {
          for (int64_t k = 0; k < l.l; ++k) {
            const int64_t idx = (i * l.c + c) * l.l + k;
            pdx[idx] = (pg[idx] - (px[idx] - mean) * proj - grad_mean) * invstd * g;
          }
        }
      } else {
        for (int64_t i = 0; i < l.n; ++i) {
          for (int64_t k = 0; k < l.l; ++k) {
            const int64_t idx = (i * l.c + c) * l.l + k;
            pdx[idx] = pg[idx] * invstd * g;
          }
        }
      }
    }
    const DType pdt = ParamGradDType(weight, grad);
    out.input = Restore(dx, x.dtype(), x.device());
    out.weight = Restore(dw, pdt, x.device());
    out.bias = Restore(db, pdt, x.device());
  });
  return out;
}

}  // namespace fsdp::ops::kernels
