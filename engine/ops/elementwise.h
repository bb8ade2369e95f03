// Elementwise CPU kernels (namespace fsdp::ops::kernels): binary arithmetic with broadcasting
// and type promotion, scalar arithmetic, and unary math, each with its backward formula as in
// PyTorch's derivatives.yaml. No autograd: the differentiable versions are in functional.h.
//
// Dtypes: float32/float64 compute in their own precision, float16/bfloat16 through float32
// with the result rounded back (nearest even); add/sub/mul/neg also accept int64. Backward
// functions return gradients in the dtype and shape of the corresponding input.
// Thread-safety: stateless functions.
#pragma once

#include "engine/core/tensor.h"

namespace fsdp::ops::kernels {

// ---- Binary (broadcasting) --------------------------------------------------------------------
Tensor Add(const Tensor& a, const Tensor& b, double alpha = 1.0);  // a + alpha * b
Tensor Sub(const Tensor& a, const Tensor& b, double alpha = 1.0);  // a - alpha * b
Tensor Mul(const Tensor& a, const Tensor& b);
Tensor Div(const Tensor& a, const Tensor& b);  // true division (int64 inputs give float32)

// Gradients of a binary op with respect to each input, reduced to the input's shape and cast to
// its dtype; a gradient is left undefined when its `need_*` flag is false.
struct BinaryGrads {
  Tensor a;
  Tensor b;
};
BinaryGrads AddBackward(const Tensor& grad, const Tensor& a, const Tensor& b, double alpha,
                        bool need_a = true, bool need_b = true);
BinaryGrads SubBackward(const Tensor& grad, const Tensor& a, const Tensor& b, double alpha,
                        bool need_a = true, bool need_b = true);
BinaryGrads MulBackward(const Tensor& grad, const Tensor& a, const Tensor& b, bool need_a = true,
                        bool need_b = true);
// grad / b and -grad * ((a / b) / b).
BinaryGrads DivBackward(const Tensor& grad, const Tensor& a, const Tensor& b, bool need_a = true,
                        bool need_b = true);

// ---- Scalar ------------------------------------------------------------------------------------
Tensor AddScalar(const Tensor& x, double s);   // x + s
Tensor MulScalar(const Tensor& x, double s);   // x * s
Tensor DivScalar(const Tensor& x, double s);   // x / s
Tensor RSubScalar(const Tensor& x, double s);  // s - x
Tensor PowScalar(const Tensor& x, double exponent);
// grad * exponent * x^(exponent - 1); zeros for exponent 0.
Tensor PowScalarBackward(const Tensor& grad, const Tensor& x, double exponent);

// ---- Unary -------------------------------------------------------------------------------------
Tensor Neg(const Tensor& x);
Tensor Exp(const Tensor& x);
Tensor Log(const Tensor& x);
Tensor Sqrt(const Tensor& x);
Tensor Rsqrt(const Tensor& x);
Tensor Reciprocal(const Tensor& x);

// Backward formulas; `result` is the forward output.
Tensor ExpBackward(const Tensor& grad, const Tensor& result);         // grad * result
Tensor LogBackward(const Tensor& grad, const Tensor& x);              // grad / x
Tensor SqrtBackward(const Tensor& grad, const Tensor& result);        // grad / (2 * result)
Tensor RsqrtBackward(const Tensor& grad, const Tensor& result);       // -0.5 * grad * result^3
Tensor ReciprocalBackward(const Tensor& grad, const Tensor& result);  // -grad * result^2

}  // namespace fsdp::ops::kernels
