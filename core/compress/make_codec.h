// Builds one tensor's codec chain from the experiment's options: the plugin codec innermost, then the decorators
// (docs/STYLE.md 8), outermost last:
//
//   momentum_correction > 0:        MomentumCorrection(ErrorFeedback(PluginCodec))
//   error_feedback, rule kEf:       ErrorFeedback(PluginCodec)
//   error_feedback, rule kEf21:     Ef21(PluginCodec)
//   neither:                        PluginCodec
#pragma once

#include <cstdint>
#include <memory>

#include "core/compress/codec.h"

namespace terse {

// Which error feedback CodecOptions::error_feedback turns on.
enum class ErrorFeedbackRule {
  kEf,    // residual memory (error_feedback.h): Seide et al. 2014, Karimireddy et al. 2019
  kEf21,  // running estimates of each rank's gradient (ef21.h): Richtárik et al. 2021, with EF21-SGDM's momentum
};

struct CodecOptions {
  // Error feedback around the compressor, by `error_feedback_rule`.
  bool error_feedback = false;
  ErrorFeedbackRule error_feedback_rule = ErrorFeedbackRule::kEf;
  // kEf21 only: EF21-SGDM's momentum eta in (0, 1]; 1 = plain EF21.
  double ef21_momentum = 1.0;
  // DGC momentum correction with this momentum factor m in [0, 1); 0 = off (momentum_correction.h). It implies error
  // feedback whatever error_feedback says: DGC's velocity accumulation v_t = v_{t-1} + u_t IS the residual memory, so
  // momentum correction without it would drop every unsent coordinate's momentum. The optimizer must then run without
  // its own momentum.
  double momentum_correction = 0;
  // DGC momentum factor masking (only with momentum_correction > 0).
  bool momentum_masking = true;
  // DGC's Nesterov variant of momentum correction (only with momentum_correction > 0).
  bool momentum_nesterov = false;
};

// Throws InvalidArgument naming the option and its value, e.g. "codec option 'momentum_correction' must be in [0, 1),
// got 1"; also, with error_feedback_rule kEf21 (whether error_feedback is on or not), for momentum correction beside
// it or an ef21_momentum outside (0, 1].
void validateCodecOptions(const CodecOptions& options);

// Validates the options before anything is built, then builds the chain (makePluginCodec, ErrorFeedback, Ef21,
// MomentumCorrection throw as documented there: Unsupported for a device the plugin lacks, for error feedback on
// non-f32, or for EF21 around a CUSTOM compressor or a SUM one whose wire is not f32). `stream`: a CUDA tensor's stream
// (codec.h, makePluginCodec); null for a host tensor.
std::unique_ptr<TensorCodec> makeCodec(std::shared_ptr<const Compressor> compressor, const TensorInfo& tensor,
                                       uint64_t run_seed, const CodecOptions& options, void* stream = nullptr);

}  // namespace terse
