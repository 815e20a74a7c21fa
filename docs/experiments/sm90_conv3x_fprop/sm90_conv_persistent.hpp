// The persistent conv wrapper now lives in the library (the family-90 persistent conv2d_fused
// instances use it): kernels/conv2d_fused/conv2d_fused_sm90_persistent.hpp.  This experiment
// keeps its old name for it.
#pragma once

#include "../../../kernels/conv2d_fused/conv2d_fused_sm90_persistent.hpp"

namespace sweep_persistent = cutlass_ops::sm90_persistent;
