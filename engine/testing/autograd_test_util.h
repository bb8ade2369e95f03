// Test-only helpers for the autograd tests: tiny float64 ops written with raw loops on top of
// record_function (so the tests do not depend on engine/ops), named like PyTorch's nodes
// (TBackward0, AddmmBackward0, ...), and an OrderRecorder that logs node execution through
// node pre-hooks. Linear follows PyTorch's 2-D decomposition: T(W) then Addmm(b, x, W^T)
// (or Mm(x, W^T) without bias).
// Test-only (library fsdp_testing, engine/testing/; never part of fsdp_engine). Ownership: the
// helpers return new tensors; an OrderRecorder owns its log.
// Thread-safety: none; each test thread uses its own tensors and recorder.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include "engine/autograd/autograd.h"
#include "engine/core/rank_context.h"

namespace fsdp::autograd::testing {

inline Tensor Mat(int64_t rows, int64_t cols, const std::vector<double>& values) {
  return Tensor::from_doubles(values, {rows, cols}, DType::kFloat64);
}

// Deterministic values in [-1, 1) from a small LCG (independent of the rank generator).
inline Tensor Filled(int64_t rows, int64_t cols, uint64_t seed) {
  std::vector<double> v(static_cast<size_t>(rows * cols));
  uint64_t s = seed * 6364136223846793005ULL + 1442695040888963407ULL;
  for (double& x : v) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    x = static_cast<double>((s >> 11) % 2000) / 1000.0 - 1.0;
  }
  return Mat(rows, cols, v);
}

inline Tensor Param(int64_t rows, int64_t cols, uint64_t seed) {
  Tensor t = Filled(rows, cols, seed);
  t.set_requires_grad(true);
  return t;
}

// ---- raw kernels (no autograd) ----
inline Tensor RawTranspose(const Tensor& a) {
  const int64_t r = a.size(0), c = a.size(1);
  Tensor out = Tensor::empty({c, r}, DType::kFloat64);
  const double* pa = a.data<double>();
  double* po = out.data<double>();
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) po[j * r + i] = pa[i * c + j];
  return out;
}

inline Tensor RawMatmul(const Tensor& a, const Tensor& b) {
  const int64_t n = a.size(0), k = a.size(1), m = b.size(1);
  FSDP_CHECK(b.size(0) == k, "RawMatmul: inner sizes differ");
  Tensor out = Tensor::zeros({n, m}, DType::kFloat64);
  const double* pa = a.data<double>();
  const double* pb = b.data<double>();
  double* po = out.data<double>();
  for (int64_t i = 0; i < n; ++i)
    for (int64_t p = 0; p < k; ++p)
      for (int64_t j = 0; j < m; ++j) po[i * m + j] += pa[i * k + p] * pb[p * m + j];
  return out;
}

// a (shape s) op b (shape s) elementwise.
template <typename F>
Tensor RawZip(const Tensor& a, const Tensor& b, F f) {
  Tensor out = Tensor::empty(a.sizes(), DType::kFloat64);
  const double* pa = a.data<double>();
  const double* pb = b.data<double>();
  double* po = out.data<double>();
  for (int64_t i = 0; i < a.numel(); ++i) po[i] = f(pa[i], pb[i]);
  return out;
}

template <typename F>
Tensor RawMap(const Tensor& a, F f) {
  Tensor out = Tensor::empty(a.sizes(), DType::kFloat64);
  const double* pa = a.data<double>();
  double* po = out.data<double>();
  for (int64_t i = 0; i < a.numel(); ++i) po[i] = f(pa[i]);
  return out;
}

// ---- differentiable tiny ops ----
inline Tensor T(const Tensor& w) {
  return record_function("TBackward0", {w}, RawTranspose(w),
                         [](const TensorList& g) { return TensorList{RawTranspose(g[0])}; });
}

// bias [1, m] broadcast over the rows of x @ wt.
inline Tensor Addmm(const Tensor& bias, const Tensor& x, const Tensor& wt) {
  Tensor mm = RawMatmul(x, wt);
  Tensor out = Tensor::empty(mm.sizes(), DType::kFloat64);
  const int64_t n = mm.size(0), m = mm.size(1);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j)
      out.data<double>()[i * m + j] = mm.data<double>()[i * m + j] + bias.data<double>()[j];
  if (!compute_requires_grad({bias, x, wt})) return out;
  SavedTensor saved_x(x), saved_wt(wt);
  return record_function("AddmmBackward0", {bias, x, wt}, out,
                         [saved_x, saved_wt, n, m](const TensorList& g) {
                           const Tensor sx = saved_x.unpack();
                           const Tensor swt = saved_wt.unpack();
                           Tensor gb = Tensor::zeros({1, m}, DType::kFloat64);
                           for (int64_t i = 0; i < n; ++i)
                             for (int64_t j = 0; j < m; ++j)
                               gb.data<double>()[j] += g[0].data<double>()[i * m + j];
                           return TensorList{gb, RawMatmul(g[0], RawTranspose(swt)),
                                             RawMatmul(RawTranspose(sx), g[0])};
                         });
}

inline Tensor Mm(const Tensor& a, const Tensor& b) {
  Tensor out = RawMatmul(a, b);
  if (!compute_requires_grad({a, b})) return out;
  SavedTensor saved_a(a), saved_b(b);
  return record_function("MmBackward0", {a, b}, out, [saved_a, saved_b](const TensorList& g) {
    return TensorList{RawMatmul(g[0], RawTranspose(saved_b.unpack())),
                      RawMatmul(RawTranspose(saved_a.unpack()), g[0])};
  });
}

inline Tensor Relu(const Tensor& x) {
  Tensor out = RawMap(x, [](double v) { return v > 0 ? v : 0.0; });
  if (!compute_requires_grad({x})) return out;
  SavedTensor saved_out(out);
  return record_function("ReluBackward0", {x}, out, [saved_out](const TensorList& g) {
    return TensorList{RawZip(g[0], saved_out.unpack(), [](double gv, double o) { return o > 0 ? gv : 0.0; })};
  });
}

inline Tensor Sum(const Tensor& x) {
  double total = 0;
  for (int64_t i = 0; i < x.numel(); ++i) total += x.data<double>()[i];
  Tensor out = Tensor::from_doubles({total}, {}, DType::kFloat64);
  const Shape shape = x.sizes();
  return record_function("SumBackward0", {x}, out, [shape](const TensorList& g) {
    return TensorList{Tensor::full(shape, g[0].item(), DType::kFloat64)};
  });
}

inline Tensor Add(const Tensor& a, const Tensor& b) {
  return record_function("AddBackward0", {a, b}, RawZip(a, b, [](double x, double y) { return x + y; }),
                         [](const TensorList& g) { return TensorList{g[0], g[0]}; });
}

inline Tensor Mul(const Tensor& a, const Tensor& b) {
  Tensor out = RawZip(a, b, [](double x, double y) { return x * y; });
  if (!compute_requires_grad({a, b})) return out;
  SavedTensor saved_a(a), saved_b(b);
  return record_function("MulBackward0", {a, b}, out, [saved_a, saved_b](const TensorList& g) {
    auto mul = [](double x, double y) { return x * y; };
    return TensorList{RawZip(g[0], saved_b.unpack(), mul), RawZip(g[0], saved_a.unpack(), mul)};
  });
}

// Concatenation of the flattened inputs into a [1, total] row.
inline Tensor Cat(const TensorList& parts) {
  std::vector<double> values;
  std::vector<Shape> shapes;
  for (const Tensor& p : parts) {
    for (double v : p.to_doubles()) values.push_back(v);
    shapes.push_back(p.sizes());
  }
  const int64_t total = static_cast<int64_t>(values.size());
  return record_function("CatBackward0", parts, Mat(1, total, values), [shapes](const TensorList& g) {
    TensorList out;
    const std::vector<double> grad = g[0].to_doubles();
    size_t offset = 0;
    for (const Shape& s : shapes) {
      const size_t n = static_cast<size_t>(Numel(s));
      out.push_back(Tensor::from_doubles(
          std::vector<double>(grad.begin() + static_cast<std::ptrdiff_t>(offset),
                              grad.begin() + static_cast<std::ptrdiff_t>(offset + n)),
          s, DType::kFloat64));
      offset += n;
    }
    return out;
  });
}

// Inverted dropout drawing from the current rank's generator; saves its mask.
inline Tensor Dropout(const Tensor& x, double p) {
  Generator& gen = RankContext::Current().generator();
  Tensor mask = Tensor::empty(x.sizes(), DType::kFloat64);
  for (int64_t i = 0; i < x.numel(); ++i) {
    mask.data<double>()[i] = gen.uniform_double() < p ? 0.0 : 1.0 / (1.0 - p);
  }
  Tensor out = RawZip(x, mask, [](double a, double b) { return a * b; });
  if (!compute_requires_grad({x})) return out;
  SavedTensor saved_mask(mask);
  return record_function("NativeDropoutBackward0", {x}, out, [saved_mask](const TensorList& g) {
    return TensorList{RawZip(g[0], saved_mask.unpack(), [](double a, double b) { return a * b; })};
  });
}

// Labels nodes and logs the label of every labelled node that runs, through node pre-hooks.
class OrderRecorder {
 public:
  void Label(const std::shared_ptr<Node>& node, const std::string& label) {
    FSDP_CHECK(node != nullptr, "OrderRecorder: no node to label ", label);
    labels_[node.get()] = label;
    handles_.push_back(node->register_prehook([this, label](const TensorList&) { log.push_back(label); }));
    keep_.push_back(node);
  }
  void Label(const Tensor& t, const std::string& label) { Label(t.grad_fn(), label); }
  // Labels a leaf's AccumulateGrad "Acc(<name>)" (the leaf must already be in a graph).
  void LabelLeaf(const Tensor& leaf, const std::string& name) {
    Label(try_get_grad_accumulator(leaf), "Acc(" + name + ")");
  }
  void Clear() { log.clear(); }

  std::vector<std::string> log;

 private:
  std::map<Node*, std::string> labels_;
  std::vector<RemovableHandle> handles_;
  std::vector<std::shared_ptr<Node>> keep_;
};

// Linear on 2-D input: T(W) then Addmm(b, x, W^T), labelled T<tag>, Addmm<tag>, Acc(W<tag>),
// Acc(b<tag>).
struct LinearParams {
  Tensor weight;  // [out, in]
  Tensor bias;    // [1, out]
};

inline LinearParams MakeLinear(int64_t in, int64_t out, uint64_t seed, bool bias = true) {
  LinearParams p;
  p.weight = Param(out, in, seed);
  if (bias) p.bias = Param(1, out, seed + 1000);
  return p;
}

inline Tensor Linear(const Tensor& x, const LinearParams& p, OrderRecorder* rec = nullptr,
                     const std::string& tag = "") {
  Tensor wt = T(p.weight);
  Tensor y = p.bias.defined() ? Addmm(p.bias, x, wt) : Mm(x, wt);
  if (rec != nullptr) {
    rec->Label(wt, "T" + tag);
    rec->Label(y, (p.bias.defined() ? "Addmm" : "Mm") + tag);
    rec->LabelLeaf(p.weight, "W" + tag);
    if (p.bias.defined()) rec->LabelLeaf(p.bias, "b" + tag);
  }
  return y;
}

inline std::string Join(const std::vector<std::string>& items) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + items[i];
  return out;
}

}  // namespace fsdp::autograd::testing
