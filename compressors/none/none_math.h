// none: the identity, as elementwise functions shared by the CPU loops and the CUDA kernels (none.cu). The wire value
// is the gradient value, so both directions are the identity; they exist so every compressor has the same shape
// (encode one value, decode one value) and the baseline's loops read like the others'.
#pragma once

#include "terse/hd.h"

namespace terse::compressors::none {

TERSE_HD float encodeValue(float g) {
  return g;
}

// out = decoded (accumulate == false) or out + decoded.
TERSE_HD float decodeValue(float wire, float out, bool accumulate) {
  return accumulate ? out + wire : wire;
}

}  // namespace terse::compressors::none
