// CUDA layer_norm, rms_norm and batch_norm with their backward. Row statistics use one warp
// per row (layer/rms norm) or per channel (batch norm) with fixed-order warp reductions;
// weight/bias gradients of layer/rms norm use one thread per column summing rows in order.
// Formulas are those of the CPU kernels (PyTorch's), in the compute dtype.
#include <cuda_runtime.h>

#include "engine/ops/cuda/cuda_kernels.h"
#include "engine/ops/cuda/cuda_util.cuh"
#include "engine/ops/kernel_util.h"

namespace fsdp::ops::kernels::cuda {

namespace {

// An optional operand: data == nullptr means absent (weight 1, bias 0).
struct Opt {
  const void* data = nullptr;
  ElemType type = ElemType::kFloat32;
};
Opt OptOf(const Tensor& t) { return t.defined() ? Opt{t.data_ptr(), Elem(t.dtype())} : Opt{}; }

template <typename T>
__device__ __forceinline__ T OrOne(const Opt& o, int64_t i) { return o.data ? Load<T>(o.data, o.type, i) : T(1); }
template <typename T>
__device__ __forceinline__ T OrZero(const Opt& o, int64_t i) { return o.data ? Load<T>(o.data, o.type, i) : T(0); }

// ---- layer_norm ----

template <typename T>
__global__ void LayerNormKernel(const void* x, ElemType tx, Opt w, Opt b, void* y, ElemType ty, T* mean_out,
                                T* rstd_out, int64_t rows, int64_t cols, T eps) {
  for (int64_t r = GlobalWarp(); r < rows; r += WarpCount()) {
    const int64_t base = r * cols;
    T sum = T(0);
    for (int64_t j = Lane(); j < cols; j += kWarpSize) sum += Load<T>(x, tx, base + j);
    sum = WarpSum(sum);
    const T mean = cols > 0 ? sum / static_cast<T>(cols) : T(0);
    T sq = T(0);
    for (int64_t j = Lane(); j < cols; j += kWarpSize) {
      const T dv = Load<T>(x, tx, base + j) - mean;
      sq += dv * dv;
    }
    sq = WarpSum(sq);
    const T var = cols > 0 ? sq / static_cast<T>(cols) : T(0);
    const T rstd = T(1) / Sqrt((var > T(0) ? var : T(0)) + eps);
    if (Lane() == 0) {
      mean_out[r] = mean;
      rstd_out[r] = rstd;
    }
    for (int64_t j = Lane(); j < cols; j += kWarpSize) {
      Store<T>(y, ty, base + j, (Load<T>(x, tx, base + j) - mean) * rstd * OrOne<T>(w, j) + OrZero<T>(b, j));
    }
  }
}

template <typename T>
__global__ void LayerNormInputGradKernel(const void* g, ElemType tg, const void* x, ElemType tx, Opt w,
                                         const T* mean, const T* rstd, void* dx, ElemType tdx, int64_t rows,
                                         int64_t cols) {
  const T scale = cols > 0 ? T(1) / static_cast<T>(cols) : T(0);
  for (int64_t r = GlobalWarp(); r < rows; r += WarpCount()) {
    const int64_t base = r * cols;
    const T m = mean[r], a = rstd[r];
    T ds = T(0), dbs = T(0);
    for (int64_t j = Lane(); j < cols; j += kWarpSize) {
      const T gg = Load<T>(g, tg, base + j) * OrOne<T>(w, j);
      ds += gg * Load<T>(x, tx, base + j);
      dbs += gg;
    }
    ds = WarpSum(ds);
    dbs = WarpSum(dbs);
    const T bb = (dbs * m - ds) * a * a * a * scale;
    const T cc = -bb * m - dbs * a * scale;
    for (int64_t j = Lane(); j < cols; j += kWarpSize) {
      Store<T>(dx, tdx, base + j, a * Load<T>(g, tg, base + j) * OrOne<T>(w, j) + bb * Load<T>(x, tx, base + j) + cc);
    }
  }
}

// dw[j] = Σ_r g * (x - mean) * rstd (layer norm) or Σ_r g * x * rstd (rms norm, mean == nullptr);
// db[j] = Σ_r g. One thread per column.
template <typename T>
__global__ void NormParamGradKernel(const void* g, ElemType tg, const void* x, ElemType tx, const T* mean,
                                    const T* rstd, void* dw, ElemType tdw, void* db, ElemType tdb, int64_t rows,
                                    int64_t cols) {
  FSDP_GRID_STRIDE_LOOP(j, cols) {
    T acc_w = T(0), acc_b = T(0);
    for (int64_t r = 0; r < rows; ++r) {
      const T gr = Load<T>(g, tg, r * cols + j);
      const T xr = Load<T>(x, tx, r * cols + j);
      acc_w += gr * (xr - (mean ? mean[r] : T(0))) * rstd[r];
      acc_b += gr;
    }
    if (dw) Store<T>(dw, tdw, j, acc_w);
    if (db) Store<T>(db, tdb, j, acc_b);
  }
}

// ---- rms_norm ----

template <typename T>
__global__ void RmsNormKernel(const void* x, ElemType tx, Opt w, void* y, ElemType ty, T* rstd_out, int64_t rows,
                              int64_t cols, T eps) {
  for (int64_t r = GlobalWarp(); r < rows; r += WarpCount()) {
    const int64_t base = r * cols;
    T sq = T(0);
    for (int64_t j = Lane(); j < cols; j += kWarpSize) {
      const T v = Load<T>(x, tx, base + j);
      sq += v * v;
    }
    sq = WarpSum(sq);
    const T ms = cols > 0 ? sq / static_cast<T>(cols) : T(0);
    const T rstd = T(1) / Sqrt(ms + eps);
    if (Lane() == 0) rstd_out[r] = rstd;
    for (int64_t j = Lane(); j < cols; j += kWarpSize) {
      Store<T>(y, ty, base + j, Load<T>(x, tx, base + j) * rstd * OrOne<T>(w, j));
    }
  }
}

template <typename T>
__global__ void RmsNormInputGradKernel(const void* g, ElemType tg, const void* x, ElemType tx, Opt w, const T* rstd,
                                       void* dx, ElemType tdx, int64_t rows, int64_t cols) {
  const T scale = cols > 0 ? T(1) / static_cast<T>(cols) : T(0);
  for (int64_t r = GlobalWarp(); r < rows; r += WarpCount()) {
    const int64_t base = r * cols;
    const T a = rstd[r];
    T dot = T(0);
    for (int64_t j = Lane(); j < cols; j += kWarpSize) {
      dot += Load<T>(g, tg, base + j) * OrOne<T>(w, j) * Load<T>(x, tx, base + j);
    }
    dot = WarpSum(dot);
    const T bb = dot * a * a * a * scale;
    for (int64_t j = Lane(); j < cols; j += kWarpSize) {
      Store<T>(dx, tdx, base + j, a * Load<T>(g, tg, base + j) * OrOne<T>(w, j) - bb * Load<T>(x, tx, base + j));
    }
  }
}

// ---- batch_norm ([n, c, l]; one warp per channel) ----

struct BnDims {
  int64_t n, c, l;
};
__device__ __forceinline__ int64_t BnIndex(const BnDims& d, int64_t ch, int64_t e) {
  const int64_t i = e / d.l, k = e % d.l;
  return (i * d.c + ch) * d.l + k;
}

template <typename T>
__global__ void BatchNormKernel(const void* x, ElemType tx, Opt w, Opt b, void* rm, ElemType trm, void* rv,
                                ElemType trv, void* y, ElemType ty, T* save_mean, T* save_invstd, BnDims d,
                                bool training, T factor, T eps) {
  const int64_t count = d.n * d.l;
  for (int64_t ch = GlobalWarp(); ch < d.c; ch += WarpCount()) {
    T mean, invstd;
    if (training) {
      T sum = T(0);
      for (int64_t e = Lane(); e < count; e += kWarpSize) sum += Load<T>(x, tx, BnIndex(d, ch, e));
      sum = WarpSum(sum);
      mean = sum / static_cast<T>(count);
      T sq = T(0);
      for (int64_t e = Lane(); e < count; e += kWarpSize) {
        const T dv = Load<T>(x, tx, BnIndex(d, ch, e)) - mean;
        sq += dv * dv;
      }
      sq = WarpSum(sq);
      invstd = T(1) / Sqrt(sq / static_cast<T>(count) + eps);
      if (rm != nullptr && Lane() == 0) {
        const T unbiased = sq / static_cast<T>(count - 1);
        const T old_m = Load<T>(rm, trm, ch), old_v = Load<T>(rv, trv, ch);
        Store<T>(rm, trm, ch, factor * mean + (T(1) - factor) * old_m);
        Store<T>(rv, trv, ch, factor * unbiased + (T(1) - factor) * old_v);
      }
    } else {
      mean = Load<T>(rm, trm, ch);
      invstd = T(1) / Sqrt(Load<T>(rv, trv, ch) + eps);
    }
    if (Lane() == 0) {
      save_mean[ch] = mean;
      save_invstd[ch] = invstd;
    }
    const T g = OrOne<T>(w, ch), bias = OrZero<T>(b, ch);
    for (int64_t e = Lane(); e < count; e += kWarpSize) {
      const int64_t idx = BnIndex(d, ch, e);
      Store<T>(y, ty, idx, (Load<T>(x, tx, idx) - mean) * invstd * g + bias);
    }
  }
}

template <typename T>
__global__ void BatchNormBackwardKernel(const void* gr, ElemType tg, const void* x, ElemType tx, Opt w,
                                        const void* sm, ElemType tsm, const void* si, ElemType tsi, void* dx,
                                        ElemType tdx, void* dw, ElemType tdw, void* db, ElemType tdb, BnDims d,
                                        bool training) {
  const int64_t count = d.n * d.l;
  for (int64_t ch = GlobalWarp(); ch < d.c; ch += WarpCount()) {
    const T mean = Load<T>(sm, tsm, ch), invstd = Load<T>(si, tsi, ch);
    T sum_g = T(0), dot = T(0);
    for (int64_t e = Lane(); e < count; e += kWarpSize) {
      const int64_t idx = BnIndex(d, ch, e);
      const T g = Load<T>(gr, tg, idx);
      sum_g += g;
      dot += g * (Load<T>(x, tx, idx) - mean);
    }
    sum_g = WarpSum(sum_g);
    dot = WarpSum(dot);
    if (Lane() == 0) {
      if (dw) Store<T>(dw, tdw, ch, dot * invstd);
      if (db) Store<T>(db, tdb, ch, sum_g);
    }
    if (dx == nullptr) continue;
    const T wc = OrOne<T>(w, ch);
    const T proj = dot * invstd * invstd / static_cast<T>(count);
    const T grad_mean = sum_g / static_cast<T>(count);
    for (int64_t e = Lane(); e < count; e += kWarpSize) {
      const int64_t idx = BnIndex(d, ch, e);
      const T g = Load<T>(gr, tg, idx);
      const T v = training ? (g - (Load<T>(x, tx, idx) - mean) * proj - grad_mean) * invstd * wc : g * invstd * wc;
      Store<T>(dx, tdx, idx, v);
    }
  }
}

void* PtrOr(const Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }
ElemType TypeOr(const Tensor& t) { return t.defined() ? Elem(t.dtype()) : ElemType::kFloat32; }

}  // namespace

LayerNormResult LayerNorm(const Tensor& x, int64_t rows, int64_t cols, const Shape& stat_shape, const Tensor& weight,
                          const Tensor& bias, double eps) {
  const DType cd = internal::ComputeDType(x.dtype());
  LayerNormResult r;
  r.output = Tensor::empty(x.sizes(), x.dtype(), x.device());
  r.mean = Tensor::empty(stat_shape, cd, x.device());
  r.rstd = Tensor::empty(stat_shape, cd, x.device());
  if (rows == 0) return r;
  DeviceGuard guard(x.device());
  const LaunchConfig c = WarpPerRow(rows);
  DispatchFloatCompute(cd, "layer_norm", [&](auto tag) {
    using T = decltype(tag);
    LayerNormKernel<T><<<c.blocks, c.threads, 0, StreamOf(x.device())>>>(
        x.data_ptr(), Elem(x.dtype()), OptOf(weight), OptOf(bias), r.output.data_ptr(), Elem(x.dtype()),
        r.mean.data<T>(), r.rstd.data<T>(), rows, cols, static_cast<T>(eps));
  });
  CheckLaunch("layer_norm kernel");
  return r;
}

NormGrads LayerNormBackward(const Tensor& grad, const Tensor& x, int64_t rows, int64_t cols,
                            const Shape& normalized_shape, const Tensor& mean, const Tensor& rstd,
                            const Tensor& weight, bool need_input, bool need_weight, bool need_bias) {
  const DType cd = internal::ComputeDType(x.dtype());
  const DType pdt = weight.defined() ? weight.dtype() : grad.dtype();
  const bool want_w = need_weight && weight.defined();
  const Tensor m = Cast(mean, cd), s = Cast(rstd, cd);
  NormGrads out;
  if (need_input) out.input = Tensor::empty(x.sizes(), x.dtype(), x.device());
  if (want_w) out.weight = Tensor::zeros(normalized_shape, pdt, x.device());
  if (need_bias) out.bias = Tensor::zeros(normalized_shape, pdt, x.device());
  DeviceGuard guard(x.device());
  cudaStream_t stream = StreamOf(x.device());
  DispatchFloatCompute(cd, "layer_norm_backward", [&](auto tag) {
    using T = decltype(tag);
    if (need_input && rows > 0) {
      const LaunchConfig c = WarpPerRow(rows);
      LayerNormInputGradKernel<T><<<c.blocks, c.threads, 0, stream>>>(
          grad.data_ptr(), Elem(grad.dtype()), x.data_ptr(), Elem(x.dtype()), OptOf(weight), m.data<T>(),
          s.data<T>(), out.input.data_ptr(), Elem(x.dtype()), rows, cols);
      CheckLaunch("layer_norm_backward kernel");
    }
    if ((want_w || need_bias) && cols > 0) {
      const LaunchConfig c = GridFor(cols);
      NormParamGradKernel<T><<<c.blocks, c.threads, 0, stream>>>(
          grad.data_ptr(), Elem(grad.dtype()), x.data_ptr(), Elem(x.dtype()), m.data<T>(), s.data<T>(),
          PtrOr(out.weight), TypeOr(out.weight), PtrOr(out.bias), TypeOr(out.bias), rows, cols);
      CheckLaunch("layer_norm_backward parameter kernel");
    }
  });
  return out;
}

RmsNormResult RmsNorm(const Tensor& x, int64_t rows, int64_t cols, const Shape& stat_shape, const Tensor& weight,
                      double eps) {
  const DType cd = internal::ComputeDType(x.dtype());
  RmsNormResult r;
  r.output = Tensor::empty(x.sizes(), x.dtype(), x.device());
  r.rstd = Tensor::empty(stat_shape, cd, x.device());
  if (rows == 0) return r;
  DeviceGuard guard(x.device());
  const LaunchConfig c = WarpPerRow(rows);
  DispatchFloatCompute(cd, "rms_norm", [&](auto tag) {
    using T = decltype(tag);
    RmsNormKernel<T><<<c.blocks, c.threads, 0, StreamOf(x.device())>>>(x.data_ptr(), Elem(x.dtype()), OptOf(weight),
                                                                       r.output.data_ptr(), Elem(x.dtype()),
                                                                       r.rstd.data<T>(), rows, cols, static_cast<T>(eps));
  });
  CheckLaunch("rms_norm kernel");
  return r;
}

NormGrads RmsNormBackward(const Tensor& grad, const Tensor& x, int64_t rows, int64_t cols,
                          const Shape& normalized_shape, const Tensor& rstd, const Tensor& weight, bool need_input,
                          bool need_weight) {
  const DType cd = internal::ComputeDType(x.dtype());
  const DType pdt = weight.defined() ? weight.dtype() : grad.dtype();
  const bool want_w = need_weight && weight.defined();
  const Tensor s = Cast(rstd, cd);
  NormGrads out;
  if (need_input) out.input = Tensor::empty(x.sizes(), x.dtype(), x.device());
  if (want_w) out.weight = Tensor::zeros(normalized_shape, pdt, x.device());
  DeviceGuard guard(x.device());
  cudaStream_t stream = StreamOf(x.device());
  DispatchFloatCompute(cd, "rms_norm_backward", [&](auto tag) {
    using T = decltype(tag);
    if (need_input && rows > 0) {
      const LaunchConfig c = WarpPerRow(rows);
      RmsNormInputGradKernel<T><<<c.blocks, c.threads, 0, stream>>>(grad.data_ptr(), Elem(grad.dtype()), x.data_ptr(),
                                                                    Elem(x.dtype()), OptOf(weight), s.data<T>(),
                                                                    out.input.data_ptr(), Elem(x.dtype()), rows, cols);
      CheckLaunch("rms_norm_backward kernel");
    }
    if (want_w && cols > 0) {
      const LaunchConfig c = GridFor(cols);
      NormParamGradKernel<T><<<c.blocks, c.threads, 0, stream>>>(
          grad.data_ptr(), Elem(grad.dtype()), x.data_ptr(), Elem(x.dtype()), nullptr, s.data<T>(),
          out.weight.data_ptr(), Elem(pdt), nullptr, ElemType::kFloat32, rows, cols);
      CheckLaunch("rms_norm_backward parameter kernel");
    }
  });
  return out;
}

BatchNormResult BatchNorm(const Tensor& x, int64_t n, int64_t c, int64_t l, const Tensor& weight, const Tensor& bias,
                          const Tensor& running_mean, const Tensor& running_var, bool training, double factor,
                          double eps) {
  const DType cd = internal::ComputeDType(x.dtype());
  BatchNormResult r;
  r.output = Tensor::empty(x.sizes(), x.dtype(), x.device());
  r.save_mean = Tensor::empty({c}, cd, x.device());
  r.save_invstd = Tensor::empty({c}, cd, x.device());
  if (c == 0) return r;
  DeviceGuard guard(x.device());
  const LaunchConfig cfg = WarpPerRow(c);
  DispatchFloatCompute(cd, "batch_norm", [&](auto tag) {
    using T = decltype(tag);
    BatchNormKernel<T><<<cfg.blocks, cfg.threads, 0, StreamOf(x.device())>>>(
        x.data_ptr(), Elem(x.dtype()), OptOf(weight), OptOf(bias), PtrOr(running_mean), TypeOr(running_mean),
        PtrOr(running_var), TypeOr(running_var), r.output.data_ptr(), Elem(x.dtype()), r.save_mean.data<T>(),
        r.save_invstd.data<T>(), BnDims{n, c, l}, training, static_cast<T>(factor), static_cast<T>(eps));
  });
  CheckLaunch("batch_norm kernel");
  if (running_mean.defined() && training) {
    running_mean.bump_version();
    running_var.bump_version();
  }
  return r;
}

NormGrads BatchNormBackward(const Tensor& grad, const Tensor& x, int64_t n, int64_t c, int64_t l, const Tensor& weight,
                            const Tensor& save_mean, const Tensor& save_invstd, bool training, bool need_input,
                            bool need_weight, bool need_bias) {
  const DType cd = internal::ComputeDType(x.dtype());
  const DType pdt = weight.defined() ? weight.dtype() : grad.dtype();
  const bool want_w = need_weight && weight.defined();
  NormGrads out;
  if (need_input) out.input = Tensor::empty(x.sizes(), x.dtype(), x.device());
  if (want_w) out.weight = Tensor::empty({c}, pdt, x.device());
  if (need_bias) out.bias = Tensor::empty({c}, pdt, x.device());
  if (c == 0) return out;
  DeviceGuard guard(x.device());
  const LaunchConfig cfg = WarpPerRow(c);
  DispatchFloatCompute(cd, "batch_norm_backward", [&](auto tag) {
    using T = decltype(tag);
    BatchNormBackwardKernel<T><<<cfg.blocks, cfg.threads, 0, StreamOf(x.device())>>>(
        grad.data_ptr(), Elem(grad.dtype()), x.data_ptr(), Elem(x.dtype()), OptOf(weight), save_mean.data_ptr(),
        Elem(save_mean.dtype()), save_invstd.data_ptr(), Elem(save_invstd.dtype()), PtrOr(out.input),
        TypeOr(out.input), PtrOr(out.weight), TypeOr(out.weight), PtrOr(out.bias), TypeOr(out.bias), BnDims{n, c, l},
        training);
  });
  CheckLaunch("batch_norm_backward kernel");
  return out;
}

}  // namespace fsdp::ops::kernels::cuda
