#include "core/compress/make_codec.h"

#include <utility>

#include "core/common/error.h"
#include "core/compress/ef21.h"
#include "core/compress/error_feedback.h"
#include "core/compress/momentum_correction.h"

namespace terse {

void validateCodecOptions(const CodecOptions& options) {
  const double m = options.momentum_correction;
  // Written so that NaN fails too. m = 1 never decays (u grows without bound); m < 0 flips the update's sign each step.
  TERSE_CHECK(m >= 0.0 && m < 1.0 && static_cast<float>(m) < 1.0f, InvalidArgument,
              "codec option 'momentum_correction' must be in [0, 1) (0 = off), got " << m);
  if (options.error_feedback_rule != ErrorFeedbackRule::kEf21) return;
  const double eta = options.ef21_momentum;
  // The float check catches a value that rounds to 0, whose momentum would never move.
  TERSE_CHECK(eta > 0.0 && eta <= 1.0, InvalidArgument,
              "codec option 'ef21_momentum' must be in (0, 1] (1 = plain EF21), got " << eta);
  TERSE_CHECK(static_cast<float>(eta) > 0.0f, InvalidArgument,
              "codec option 'ef21_momentum' " << eta << " rounds to 0 as a float: the momentum would never move");
  TERSE_CHECK(m == 0.0, InvalidArgument,
              "codec option 'momentum_correction' (" << m
                                                     << ") cannot be combined with EF21: DGC's velocity is error "
                                                        "feedback's residual, which EF21 does not keep");
}

std::unique_ptr<TensorCodec> makeCodec(std::shared_ptr<const Compressor> compressor, const TensorInfo& tensor,
                                       uint64_t run_seed, const CodecOptions& options, void* stream) {
  validateCodecOptions(options);
  std::unique_ptr<TensorCodec> codec = makePluginCodec(std::move(compressor), tensor, run_seed, stream);
  if (options.momentum_correction > 0.0) {
    // Momentum correction implies error feedback (see CodecOptions).
    auto ef = std::make_unique<ErrorFeedback>(std::move(codec));
    return std::make_unique<MomentumCorrection>(std::move(ef), options.momentum_correction, options.momentum_masking,
                                                options.momentum_nesterov);
  }
  if (options.error_feedback && options.error_feedback_rule == ErrorFeedbackRule::kEf21)
    return std::make_unique<Ef21>(std::move(codec), options.ef21_momentum);
  if (options.error_feedback) return std::make_unique<ErrorFeedback>(std::move(codec));
  return codec;
}

}  // namespace terse
