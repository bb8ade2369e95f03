// Umbrella header for the raw CPU kernels of engine/ops (namespace fsdp::ops::kernels): forward
// and backward functions on tensors, no autograd. The differentiable API is functional.h.
// Kernels compute on the host: float32/float64 natively, float16/bfloat16 through float32
// (rounded back once), and tensors on another device are staged through host memory
// (correct, not fast) and the result is returned on the input's device.
#pragma once

#include "engine/ops/activation.h"
#include "engine/ops/attention.h"
#include "engine/ops/broadcast.h"
#include "engine/ops/compare.h"
#include "engine/ops/dropout.h"
#include "engine/ops/elementwise.h"
#include "engine/ops/embedding.h"
#include "engine/ops/linalg.h"
#include "engine/ops/loss.h"
#include "engine/ops/normalization.h"
#include "engine/ops/reduction.h"
#include "engine/ops/shape_ops.h"
