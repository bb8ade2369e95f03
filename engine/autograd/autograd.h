// Umbrella header of the autograd engine (namespace fsdp::autograd). See docs/autograd.md
// for the ordering rules it implements.
#pragma once

#include "engine/autograd/accumulate_grad.h"
#include "engine/autograd/checkpoint.h"
#include "engine/autograd/engine.h"
#include "engine/autograd/function.h"
#include "engine/autograd/grad_mode.h"
#include "engine/autograd/graph.h"
#include "engine/autograd/hooks.h"
#include "engine/autograd/node.h"
#include "engine/autograd/record.h"
#include "engine/autograd/saved_tensor_hooks.h"
#include "engine/autograd/variable.h"
