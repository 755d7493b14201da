/* fail_at_step: identity for fp32 (SUM, fixed size, like tests/fixtures/good_c.c) that fails compress from step
 * `fail_step` on, on rank `fail_rank` (default 0; -1: every rank): a run that breaks in the middle, for the runner's
 * failure tests. With fail_in=decompress it is decompress that fails instead, which the PyTorch hook's chained path
 * meets on a collective's callback thread (tests/python/ddp_hook_test.py, chained_one_round).
 * Parameters: fail_step (required, integer >= 0), fail_rank (optional), fail_in (compress or decompress). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "terse/compressor_v1.h"

typedef struct {
  const terse_host_v1* host;
  unsigned long long fail_step;
  long fail_rank;
  int fail_decompress;
} fail_ctx;

static void report(const terse_host_v1* host, const char* message) {
  host->log(host->user, TERSE_LOG_ERROR, message);
}

static terse_status_v1 fail_at_step_init(const terse_param_v1* params, size_t num_params, const terse_host_v1* host,
                                         void** ctx) {
  fail_ctx* c;
  char message[256];
  size_t i;
  int have_step = 0;
  c = (fail_ctx*)malloc(sizeof *c);
  if (c == NULL) return TERSE_ERR_OUT_OF_MEMORY;
  c->host = host;
  c->fail_step = 0;
  c->fail_rank = 0;
  c->fail_decompress = 0;
  for (i = 0; i < num_params; ++i) {
    if (strcmp(params[i].key, "fail_step") == 0) {
      c->fail_step = strtoull(params[i].value, NULL, 10);
      have_step = 1;
    } else if (strcmp(params[i].key, "fail_rank") == 0) {
      c->fail_rank = strtol(params[i].value, NULL, 10);
    } else if (strcmp(params[i].key, "fail_in") == 0 &&
               (strcmp(params[i].value, "compress") == 0 || strcmp(params[i].value, "decompress") == 0)) {
      c->fail_decompress = strcmp(params[i].value, "decompress") == 0;
    } else if (strcmp(params[i].key, "fail_in") == 0) {
      snprintf(message, sizeof message, "fail_at_step: fail_in must be compress or decompress, got '%.64s'",
               params[i].value);
      report(host, message);
      free(c);
      return TERSE_ERR_INVALID_ARGUMENT;
    } else {
      snprintf(message, sizeof message, "fail_at_step: unknown parameter '%s'", params[i].key);
      report(host, message);
      free(c);
      return TERSE_ERR_INVALID_ARGUMENT;
    }
  }
  if (!have_step) {
    report(host, "fail_at_step: parameter 'fail_step' is required");
    free(c);
    return TERSE_ERR_INVALID_ARGUMENT;
  }
  *ctx = c;
  return TERSE_OK;
}

static terse_status_v1 fail_at_step_finalize(void* ctx) {
  free(ctx);
  return TERSE_OK;
}

static terse_status_v1 fail_at_step_get_caps(void* ctx, terse_dtype_v1 dtype, terse_compressor_caps_v1* caps) {
  const fail_ctx* c = (const fail_ctx*)ctx;
  if (dtype != TERSE_DTYPE_F32) {
    char message[128];
    snprintf(message, sizeof message, "fail_at_step: only f32 gradients are supported, got dtype %d", (int)dtype);
    report(c->host, message);
    return TERSE_ERR_UNSUPPORTED;
  }
  caps->devices = TERSE_DEVICE_HOST;
  caps->aggregation = TERSE_AGG_SUM;
  caps->wire_dtype = TERSE_DTYPE_F32;
  caps->flags = TERSE_CAP_FIXED_SIZE;
  caps->num_rounds = 1;
  return TERSE_OK;
}

static terse_status_v1 fail_at_step_get_sizes(void* ctx, const terse_tensor_info_v1* info,
                                              terse_compressor_sizes_v1* s) {
  (void)ctx;
  if (info->dtype != TERSE_DTYPE_F32) return TERSE_ERR_UNSUPPORTED;
  s->max_output_bytes = info->numel * 4u;
  s->workspace_bytes = 0;
  s->state_bytes = 0;
  s->sum_header_bytes = 0;
  s->max_reduced_bytes = 0;
  return TERSE_OK;
}

static int fails(const fail_ctx* c, const terse_tensor_info_v1* info) {
  return info->step >= c->fail_step && (c->fail_rank == -1 || (long)info->rank == c->fail_rank);
}

static terse_status_v1 fail_at_step_compress(void* ctx, const terse_tensor_info_v1* info, const void* input,
                                             const void* prev, uint64_t prev_bytes, const terse_scratch_v1* scratch,
                                             void* output, uint64_t output_capacity, uint64_t* output_bytes,
                                             void* stream) {
  const fail_ctx* c = (const fail_ctx*)ctx;
  (void)prev, (void)prev_bytes, (void)scratch, (void)stream;
  if (!c->fail_decompress && fails(c, info)) {
    char message[128];
    snprintf(message, sizeof message, "fail_at_step: failing on purpose at step %llu", (unsigned long long)info->step);
    report(c->host, message);
    return TERSE_ERR_INTERNAL;
  }
  if (output_capacity < info->numel * 4u) return TERSE_ERR_INVALID_ARGUMENT;
  if (info->numel > 0) memcpy(output, input, (size_t)info->numel * 4u);
  *output_bytes = info->numel * 4u;
  return TERSE_OK;
}

static terse_status_v1 fail_at_step_decompress(void* ctx, const terse_tensor_info_v1* info, const void* payload,
                                               uint64_t payload_bytes, const terse_scratch_v1* scratch, void* output,
                                               int32_t accumulate, void* stream) {
  const fail_ctx* c = (const fail_ctx*)ctx;
  const float* in = (const float*)payload;
  float* out = (float*)output;
  uint64_t i;
  (void)scratch, (void)stream;
  if (c->fail_decompress && fails(c, info)) {
    char message[128];
    snprintf(message, sizeof message, "fail_at_step: decompress failing on purpose at step %llu",
             (unsigned long long)info->step);
    report(c->host, message);
    return TERSE_ERR_INTERNAL;
  }
  if (payload_bytes != info->numel * 4u) {
    char message[256];
    snprintf(message, sizeof message, "fail_at_step: payload of %llu bytes, expected %llu for numel %llu",
             (unsigned long long)payload_bytes, (unsigned long long)(info->numel * 4u),
             (unsigned long long)info->numel);
    report(c->host, message);
    return TERSE_ERR_INVALID_PAYLOAD;
  }
  for (i = 0; i < info->numel; ++i) out[i] = accumulate ? out[i] + in[i] : in[i];
  return TERSE_OK;
}

TERSE_PLUGIN_V1_EXPORT const terse_compressor_v1 terse_compressor_plugin_v1 = {
    TERSE_COMPRESSOR_ABI_V1,
    sizeof(terse_compressor_v1),
    "fail_at_step",
    "identity fp32 that fails from a given step (runner tests)",
    "1.0.0",
    fail_at_step_init,
    fail_at_step_finalize,
    fail_at_step_get_caps,
    fail_at_step_get_sizes,
    fail_at_step_compress,
    fail_at_step_decompress,
    NULL, /* reduce: SUM aggregation needs none */
};
