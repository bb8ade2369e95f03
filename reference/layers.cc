#include "reference/layers.h"

#include <cmath>
#include <numbers>
#include <stdexcept>
#include <string>

namespace fsdp::reference {
namespace {

void Require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument(message);
}

std::string Dims(int64_t rows, int64_t cols) {
  return "[" + std::to_string(rows) + ", " + std::to_string(cols) + "]";
}

}  // namespace

// ---- Tensor <-> Eigen --------------------------------------------------------------------------

template <typename T>
Matrix<T> ToMatrix(const BasicRefTensor<T>& t) {
  Require(t.ndim() >= 1, "ToMatrix: 0-d tensor");
  const int64_t cols = t.shape.back();
  const int64_t rows = cols == 0 ? 0 : t.numel() / cols;
  Matrix<T> m(rows, cols);
  for (int64_t i = 0; i < t.numel(); ++i) m.data()[i] = t[i];
  return m;
}

template <typename T>
Vector<T> ToVector(const BasicRefTensor<T>& t) {
  Vector<T> v(t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = t[i];
  return v;
}

template <typename T>
BasicRefTensor<T> FromMatrix(const Matrix<T>& m, const Shape& shape) {
  Require(NumelOf(shape) == m.size(), "FromMatrix: shape " + ShapeToString(shape) +
                                          " does not hold a " + Dims(m.rows(), m.cols()) +
                                          " matrix");
  return BasicRefTensor<T>(shape, std::vector<T>(m.data(), m.data() + m.size()));
}

template <typename T>
BasicRefTensor<T> FromVector(const Vector<T>& v, const Shape& shape) {
  Require(NumelOf(shape) == v.size(), "FromVector: shape " + ShapeToString(shape) +
                                          " does not hold " + std::to_string(v.size()) + " values");
  return BasicRefTensor<T>(shape, std::vector<T>(v.data(), v.data() + v.size()));
}

// ---- Linear ------------------------------------------------------------------------------------

template <typename T>
Matrix<T> LinearForward(const Matrix<T>& x, const Matrix<T>& weight, const Vector<T>* bias) {
  Require(x.cols() == weight.cols(), "Linear: input " + Dims(x.rows(), x.cols()) + " vs weight " +
                                         Dims(weight.rows(), weight.cols()));
  Matrix<T> y = x * weight.transpose();
  if (bias != nullptr) {
    Require(bias->size() == weight.rows(), "Linear: bias size does not match weight rows");
    y.rowwise() += bias->transpose();
  }
  return y;
}

template <typename T>
LinearGrads<T> LinearBackward(const Matrix<T>& x, const Matrix<T>& weight, bool has_bias,
                              const Matrix<T>& grad_out) {
  Require(grad_out.rows() == x.rows() && grad_out.cols() == weight.rows(),
          "LinearBackward: grad_out " + Dims(grad_out.rows(), grad_out.cols()));
  LinearGrads<T> g;
  g.input = grad_out * weight;                                  // dL/dx = dy W
  g.weight = grad_out.transpose() * x;                          // dL/dW = dyᵀ x
  if (has_bias) g.bias = grad_out.colwise().sum().transpose();  // dL/db = Σ_rows dy
  return g;
}

// ---- Embedding ---------------------------------------------------------------------------------

template <typename T>
Matrix<T> EmbeddingForward(const Matrix<T>& table, const std::vector<int64_t>& ids) {
  Matrix<T> out(static_cast<int64_t>(ids.size()), table.cols());
  for (size_t i = 0; i < ids.size(); ++i) {
    Require(ids[i] >= 0 && ids[i] < table.rows(), "Embedding: index " + std::to_string(ids[i]) +
                                                      " out of range for " +
                                                      std::to_string(table.rows()) + " embeddings");
    out.row(static_cast<int64_t>(i)) = table.row(ids[i]);
  }
  return out;
}

template <typename T>
Matrix<T> EmbeddingBackward(int64_t num_embeddings, const std::vector<int64_t>& ids,
                            const Matrix<T>& grad_out) {
  Require(grad_out.rows() == static_cast<int64_t>(ids.size()),
          "EmbeddingBackward: one grad row per id expected");
  Matrix<T> g = Matrix<T>::Zero(num_embeddings, grad_out.cols());
  for (size_t i = 0; i < ids.size(); ++i) g.row(ids[i]) += grad_out.row(static_cast<int64_t>(i));
  return g;
}

// ---- LayerNorm ---------------------------------------------------------------------------------

template <typename T>
Matrix<T> LayerNormForward(const Matrix<T>& x, const Vector<T>* weight, const Vector<T>* bias,
                           double eps) {
  const int64_t d = x.cols();
  Matrix<T> y(x.rows(), d);
  for (int64_t r = 0; r < x.rows(); ++r) {
    const T mean = x.row(r).sum() / T(d);
    const auto centered = (x.row(r).array() - mean).eval();
    const T var = centered.square().sum() / T(d);  // biased
    const T rstd = T(1) / std::sqrt(var + T(eps));
    auto yr = (centered * rstd).eval();
    if (weight != nullptr) yr *= weight->transpose().array();
    if (bias != nullptr) yr += bias->transpose().array();
    y.row(r) = yr.matrix();
  }
  return y;
}

template <typename T>
NormGrads<T> LayerNormBackward(const Matrix<T>& x, const Vector<T>* weight, bool has_bias,
                               const Matrix<T>& grad_out, double eps) {
  const int64_t d = x.cols();
  NormGrads<T> g;
  g.input.resize(x.rows(), d);
  if (weight != nullptr) g.weight = Vector<T>::Zero(d);
  if (has_bias) g.bias = Vector<T>::Zero(d);
  for (int64_t r = 0; r < x.rows(); ++r) {
    const T mean = x.row(r).sum() / T(d);
    const auto centered = (x.row(r).array() - mean).eval();
    const T var = centered.square().sum() / T(d);
    const T rstd = T(1) / std::sqrt(var + T(eps));
    const auto xhat = (centered * rstd).eval();
    const auto dy = grad_out.row(r).array();
    // dxhat = dy * w; dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)).
    Eigen::Array<T, 1, Eigen::Dynamic> dxhat = dy;
    if (weight != nullptr) dxhat *= weight->transpose().array();
    const T mean_dxhat = dxhat.sum() / T(d);
    const T mean_dxhat_xhat = (dxhat * xhat).sum() / T(d);
    g.input.row(r) = (rstd * (dxhat - mean_dxhat - xhat * mean_dxhat_xhat)).matrix();
    if (weight != nullptr) g.weight += (dy * xhat).matrix().transpose();
    if (has_bias) g.bias += dy.matrix().transpose();
  }
  return g;
}

// ---- RMSNorm -----------------------------------------------------------------------------------

template <typename T>
Matrix<T> RmsNormForward(const Matrix<T>& x, const Vector<T>& weight, double eps) {
  Require(weight.size() == x.cols(), "RMSNorm: weight size does not match the last dim");
  Matrix<T> y(x.rows(), x.cols());
  for (int64_t r = 0; r < x.rows(); ++r) {
    const T ms = x.row(r).array().square().sum() / T(x.cols());
    const T rinv = T(1) / std::sqrt(ms + T(eps));
    y.row(r) = ((x.row(r).array() * rinv) * weight.transpose().array()).matrix();
  }
  return y;
}

template <typename T>
NormGrads<T> RmsNormBackward(const Matrix<T>& x, const Vector<T>& weight, const Matrix<T>& grad_out,
                             double eps) {
  const int64_t d = x.cols();
  NormGrads<T> g;
  g.input.resize(x.rows(), d);
  g.weight = Vector<T>::Zero(d);
  for (int64_t r = 0; r < x.rows(); ++r) {
    const auto xr = x.row(r).array();
    const T ms = xr.square().sum() / T(d);
    const T rinv = T(1) / std::sqrt(ms + T(eps));
    const auto dy = grad_out.row(r).array();
    // y_j = x_j r w_j with r = (mean(x²)+eps)^(-1/2), dr/dx_i = -r³ x_i / d.
    const auto gw = (dy * weight.transpose().array()).eval();
    const T mean_gx = (gw * xr).sum() / T(d);
    g.input.row(r) = (rinv * gw - xr * (rinv * rinv * rinv * mean_gx)).matrix();
    g.weight += (dy * xr * rinv).matrix().transpose();
  }
  return g;
}

// ---- BatchNorm1d -------------------------------------------------------------------------------

namespace {

struct BnDims {
  int64_t n, c, l;
};

BnDims BatchNormDims(const Shape& shape) {
  Require(shape.size() == 2 || shape.size() == 3,
          "BatchNorm1d: expected 2D or 3D input, got " + ShapeToString(shape));
  return {shape[0], shape[1], shape.size() == 3 ? shape[2] : 1};
}

// Flat index of element (n, c, l) of a [N, C, L] tensor.
int64_t BnIndex(const BnDims& d, int64_t n, int64_t c, int64_t l) {
  return (n * d.c + c) * d.l + l;
}

}  // namespace

template <typename T>
BasicRefTensor<T> BatchNormForward(const BasicRefTensor<T>& x, const Vector<T>* weight,
                                   const Vector<T>* bias, BatchNormStats<T>* stats,
                                   const BatchNormOptions& options) {
  const BnDims d = BatchNormDims(x.shape);
  const int64_t count = d.n * d.l;
  if (options.training) {
    Require(count > 1,
            "BatchNorm1d: expected more than 1 value per channel when training, got "
            "input of shape " +
                ShapeToString(x.shape));
  } else {
    Require(stats != nullptr, "BatchNorm1d: eval mode needs running statistics");
  }
  BasicRefTensor<T> y(x.shape);
  for (int64_t c = 0; c < d.c; ++c) {
    T mean, var;
    if (options.training) {
      T sum = 0;
      for (int64_t n = 0; n < d.n; ++n)
        for (int64_t l = 0; l < d.l; ++l) sum += x[BnIndex(d, n, c, l)];
      mean = sum / T(count);
      T sq = 0;
      for (int64_t n = 0; n < d.n; ++n)
        for (int64_t l = 0; l < d.l; ++l)
          sq += (x[BnIndex(d, n, c, l)] - mean) * (x[BnIndex(d, n, c, l)] - mean);
      var = sq / T(count);  // biased: used to normalise
      if (stats != nullptr) {
        const T m = T(options.momentum);
        const T unbiased = sq / T(count - 1);
        stats->running_mean[c] = (T(1) - m) * stats->running_mean[c] + m * mean;
        stats->running_var[c] = (T(1) - m) * stats->running_var[c] + m * unbiased;
      }
    } else {
      mean = stats->running_mean[c];
      var = stats->running_var[c];
    }
    const T rstd = T(1) / std::sqrt(var + T(options.eps));
    const T w = weight != nullptr ? (*weight)[c] : T(1);
    const T b = bias != nullptr ? (*bias)[c] : T(0);
    for (int64_t n = 0; n < d.n; ++n) {
      for (int64_t l = 0; l < d.l; ++l) {
        const int64_t i = BnIndex(d, n, c, l);
        y[i] = (x[i] - mean) * rstd * w + b;
      }
    }
  }
  if (options.training && stats != nullptr) ++stats->num_batches_tracked;
  return y;
}

template <typename T>
BatchNormGrads<T> BatchNormBackward(const BasicRefTensor<T>& x, const Vector<T>* weight,
                                    bool has_bias, const BatchNormStats<T>* stats,
                                    const BatchNormOptions& options,
                                    const BasicRefTensor<T>& grad_out) {
  const BnDims d = BatchNormDims(x.shape);
  Require(grad_out.shape == x.shape, "BatchNormBackward: grad_out shape differs from input");
  Require(options.training || stats != nullptr, "BatchNorm1d: eval mode needs running stats");
  const int64_t count = d.n * d.l;
  BatchNormGrads<T> g;
  g.input = BasicRefTensor<T>(x.shape);
  if (weight != nullptr) g.weight = Vector<T>::Zero(d.c);
  if (has_bias) g.bias = Vector<T>::Zero(d.c);
  for (int64_t c = 0; c < d.c; ++c) {
    T mean, var;
    if (options.training) {
      T sum = 0;
      for (int64_t n = 0; n < d.n; ++n)
        for (int64_t l = 0; l < d.l; ++l) sum += x[BnIndex(d, n, c, l)];
      mean = sum / T(count);
      T sq = 0;
      for (int64_t n = 0; n < d.n; ++n)
        for (int64_t l = 0; l < d.l; ++l)
          sq += (x[BnIndex(d, n, c, l)] - mean) * (x[BnIndex(d, n, c, l)] - mean);
      var = sq / T(count);
    } else {
      mean = stats->running_mean[c];
      var = stats->running_var[c];
    }
    const T rstd = T(1) / std::sqrt(var + T(options.eps));
    const T w = weight != nullptr ? (*weight)[c] : T(1);
    T sum_dy = 0, sum_dy_xhat = 0;
    for (int64_t n = 0; n < d.n; ++n) {
      for (int64_t l = 0; l < d.l; ++l) {
        const int64_t i = BnIndex(d, n, c, l);
        sum_dy += grad_out[i];
        sum_dy_xhat += grad_out[i] * (x[i] - mean) * rstd;
      }
    }
    if (weight != nullptr) g.weight[c] = sum_dy_xhat;
    if (has_bias) g.bias[c] = sum_dy;
    for (int64_t n = 0; n < d.n; ++n) {
      for (int64_t l = 0; l < d.l; ++l) {
        const int64_t i = BnIndex(d, n, c, l);
        if (options.training) {
          // Batch statistics depend on x: dx = w rstd (dy - mean(dy) - xhat mean(dy xhat)).
          const T xhat = (x[i] - mean) * rstd;
          g.input[i] = w * rstd * (grad_out[i] - sum_dy / T(count) - xhat * sum_dy_xhat / T(count));
        } else {
          g.input[i] = w * rstd * grad_out[i];
        }
      }
    }
  }
  return g;
}

// ---- Activations -------------------------------------------------------------------------------

template <typename T>
Matrix<T> ReluForward(const Matrix<T>& x) {
  return x.cwiseMax(T(0));
}

template <typename T>
Matrix<T> ReluBackward(const Matrix<T>& x, const Matrix<T>& grad_out) {
  return (x.array() > T(0)).select(grad_out, Matrix<T>::Zero(x.rows(), x.cols()));
}

template <typename T>
Matrix<T> GeluForward(const Matrix<T>& x) {
  const T inv_sqrt2 = T(1) / std::sqrt(T(2));
  return x.unaryExpr([inv_sqrt2](T v) { return T(0.5) * v * (T(1) + std::erf(v * inv_sqrt2)); });
}

template <typename T>
Matrix<T> GeluBackward(const Matrix<T>& x, const Matrix<T>& grad_out) {
  const T inv_sqrt2 = T(1) / std::sqrt(T(2));
  const T inv_sqrt_2pi = T(1) / std::sqrt(T(2) * std::numbers::pi_v<T>);
  // d/dx [x Φ(x)] = Φ(x) + x φ(x).
  const Matrix<T> deriv = x.unaryExpr([=](T v) {
    return T(0.5) * (T(1) + std::erf(v * inv_sqrt2)) + v * inv_sqrt_2pi * std::exp(T(-0.5) * v * v);
  });
  return grad_out.cwiseProduct(deriv);
}

// ---- Attention ---------------------------------------------------------------------------------

template <typename T>
Matrix<T> SoftmaxRows(const Matrix<T>& scores, bool causal) {
  Matrix<T> p = Matrix<T>::Zero(scores.rows(), scores.cols());
  for (int64_t i = 0; i < scores.rows(); ++i) {
    const int64_t n = causal ? std::min<int64_t>(i + 1, scores.cols()) : scores.cols();
    if (n == 0) continue;
    const T mx = scores.row(i).head(n).maxCoeff();
    T sum = 0;
    for (int64_t j = 0; j < n; ++j) {
      p(i, j) = std::exp(scores(i, j) - mx);
      sum += p(i, j);
    }
    p.row(i).head(n) /= sum;
  }
  return p;
}

template <typename T>
Matrix<T> AttentionForward(const Matrix<T>& q, const Matrix<T>& k, const Matrix<T>& v, bool causal,
                           double scale) {
  Require(q.cols() == k.cols() && k.rows() == v.rows(), "Attention: q/k/v shapes disagree");
  const Matrix<T> p = SoftmaxRows<T>((q * k.transpose()) * T(scale), causal);
  return p * v;
}

template <typename T>
AttentionGrads<T> AttentionBackward(const Matrix<T>& q, const Matrix<T>& k, const Matrix<T>& v,
                                    bool causal, double scale, const Matrix<T>& grad_out) {
  const Matrix<T> p = SoftmaxRows<T>((q * k.transpose()) * T(scale), causal);
  AttentionGrads<T> g;
  g.v = p.transpose() * grad_out;  // O = P V
  const Matrix<T> dp = grad_out * v.transpose();
  // Softmax: dS_ij = P_ij (dP_ij - Σ_k P_ik dP_ik); masked entries have P = 0.
  const Vector<T> row_dot = p.cwiseProduct(dp).rowwise().sum();
  const Matrix<T> ds = p.cwiseProduct(dp - row_dot.replicate(1, dp.cols()));
  g.q = (ds * k) * T(scale);
  g.k = (ds.transpose() * q) * T(scale);
  return g;
}

namespace {

int64_t SeqRow(SequenceLayout layout, int64_t batch, int64_t seq_len, int64_t b, int64_t s) {
  return layout == SequenceLayout::kBatchFirst ? b * seq_len + s : s * batch + b;
}

// Copies the [len, cols] block of sequence b, columns [c0, c0 + cols), out of m.
template <typename T>
Matrix<T> Gather(const Matrix<T>& m, SequenceLayout layout, int64_t batch, int64_t b, int64_t c0,
                 int64_t cols) {
  const int64_t len = m.rows() / batch;
  Matrix<T> out(len, cols);
  for (int64_t s = 0; s < len; ++s)
    out.row(s) = m.row(SeqRow(layout, batch, len, b, s)).segment(c0, cols);
  return out;
}

template <typename T>
void Scatter(const Matrix<T>& block, SequenceLayout layout, int64_t batch, int64_t b, int64_t c0,
             Matrix<T>* m) {
  const int64_t len = m->rows() / batch;
  for (int64_t s = 0; s < len; ++s) {
    m->row(SeqRow(layout, batch, len, b, s)).segment(c0, block.cols()) = block.row(s);
  }
}

void CheckHeads(int64_t rows_q, int64_t rows_k, int64_t rows_v, int64_t cols_q, int64_t cols_k,
                int64_t batch, int64_t num_heads) {
  Require(batch > 0 && num_heads > 0, "MultiHeadAttention: batch and heads must be positive");
  Require(rows_q % batch == 0 && rows_k % batch == 0 && rows_v == rows_k,
          "MultiHeadAttention: rows are not a multiple of the batch");
  Require(cols_q == cols_k && cols_q % num_heads == 0,
          "MultiHeadAttention: embed dim " + std::to_string(cols_q) + " not divisible by " +
              std::to_string(num_heads) + " heads");
}

}  // namespace

template <typename T>
Matrix<T> MultiHeadAttentionForward(const Matrix<T>& q, const Matrix<T>& k, const Matrix<T>& v,
                                    int64_t batch, int64_t num_heads, SequenceLayout layout,
                                    bool causal) {
  CheckHeads(q.rows(), k.rows(), v.rows(), q.cols(), k.cols(), batch, num_heads);
  const int64_t hd = q.cols() / num_heads;
  const int64_t hdv = v.cols() / num_heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  Matrix<T> out(q.rows(), v.cols());
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < num_heads; ++h) {
      const Matrix<T> o = AttentionForward<T>(
          Gather(q, layout, batch, b, h * hd, hd), Gather(k, layout, batch, b, h * hd, hd),
          Gather(v, layout, batch, b, h * hdv, hdv), causal, scale);
      Scatter(o, layout, batch, b, h * hdv, &out);
    }
  }
  return out;
}

template <typename T>
AttentionGrads<T> MultiHeadAttentionBackward(const Matrix<T>& q, const Matrix<T>& k,
                                             const Matrix<T>& v, int64_t batch, int64_t num_heads,
                                             SequenceLayout layout, bool causal,
                                             const Matrix<T>& grad_out) {
  CheckHeads(q.rows(), k.rows(), v.rows(), q.cols(), k.cols(), batch, num_heads);
  const int64_t hd = q.cols() / num_heads;
  const int64_t hdv = v.cols() / num_heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  AttentionGrads<T> g;
  g.q.resize(q.rows(), q.cols());
  g.k.resize(k.rows(), k.cols());
  g.v.resize(v.rows(), v.cols());
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < num_heads; ++h) {
      const AttentionGrads<T> gh = AttentionBackward<T>(
          Gather(q, layout, batch, b, h * hd, hd), Gather(k, layout, batch, b, h * hd, hd),
          Gather(v, layout, batch, b, h * hdv, hdv), causal, scale,
          Gather(grad_out, layout, batch, b, h * hdv, hdv));
      Scatter(gh.q, layout, batch, b, h * hd, &g.q);
      Scatter(gh.k, layout, batch, b, h * hd, &g.k);
      Scatter(gh.v, layout, batch, b, h * hdv, &g.v);
    }
  }
  return g;
}

#define FSDP_REFERENCE_INSTANTIATE(T)                                                              \
  template Matrix<T> ToMatrix<T>(const BasicRefTensor<T>&);                                        \
  template Vector<T> ToVector<T>(const BasicRefTensor<T>&);                                        \
  template BasicRefTensor<T> FromMatrix<T>(const Matrix<T>&, const Shape&);                        \
  template BasicRefTensor<T> FromVector<T>(const Vector<T>&, const Shape&);                        \
  template Matrix<T> LinearForward<T>(const Matrix<T>&, const Matrix<T>&, const Vector<T>*);       \
  template LinearGrads<T> LinearBackward<T>(const Matrix<T>&, const Matrix<T>&, bool,              \
                                            const Matrix<T>&);                                     \
  template Matrix<T> EmbeddingForward<T>(const Matrix<T>&, const std::vector<int64_t>&);           \
  template Matrix<T> EmbeddingBackward<T>(int64_t, const std::vector<int64_t>&, const Matrix<T>&); \
  template Matrix<T> LayerNormForward<T>(const Matrix<T>&, const Vector<T>*, const Vector<T>*,     \
                                         double);                                                  \
  template NormGrads<T> LayerNormBackward<T>(const Matrix<T>&, const Vector<T>*, bool,             \
                                             const Matrix<T>&, double);                            \
  template Matrix<T> RmsNormForward<T>(const Matrix<T>&, const Vector<T>&, double);                \
  template NormGrads<T> RmsNormBackward<T>(const Matrix<T>&, const Vector<T>&, const Matrix<T>&,   \
                                           double);                                                \
  template BasicRefTensor<T> BatchNormForward<T>(const BasicRefTensor<T>&, const Vector<T>*,       \
                                                 const Vector<T>*, BatchNormStats<T>*,             \
                                                 const BatchNormOptions&);                         \
  template BatchNormGrads<T> BatchNormBackward<T>(                                                 \
      const BasicRefTensor<T>&, const Vector<T>*, bool, const BatchNormStats<T>*,                  \
      const BatchNormOptions&, const BasicRefTensor<T>&);                                          \
  template Matrix<T> ReluForward<T>(const Matrix<T>&);                                             \
  template Matrix<T> ReluBackward<T>(const Matrix<T>&, const Matrix<T>&);                          \
  template Matrix<T> GeluForward<T>(const Matrix<T>&);                                             \
  template Matrix<T> GeluBackward<T>(const Matrix<T>&, const Matrix<T>&);                          \
  template Matrix<T> SoftmaxRows<T>(const Matrix<T>&, bool);                                       \
  template Matrix<T> AttentionForward<T>(const Matrix<T>&, const Matrix<T>&, const Matrix<T>&,     \
                                         bool, double);                                            \
  template AttentionGrads<T> AttentionBackward<T>(                                                 \
      const Matrix<T>&, const Matrix<T>&, const Matrix<T>&, bool, double, const Matrix<T>&);       \
  template Matrix<T> MultiHeadAttentionForward<T>(const Matrix<T>&, const Matrix<T>&,              \
                                                  const Matrix<T>&, int64_t, int64_t,              \
                                                  SequenceLayout, bool);                           \
  template AttentionGrads<T> MultiHeadAttentionBackward<T>(                                        \
      const Matrix<T>&, const Matrix<T>&, const Matrix<T>&, int64_t, int64_t, SequenceLayout,      \
      bool, const Matrix<T>&);

FSDP_REFERENCE_INSTANTIATE(float)
FSDP_REFERENCE_INSTANTIATE(double)
#undef FSDP_REFERENCE_INSTANTIATE

}  // namespace fsdp::reference
