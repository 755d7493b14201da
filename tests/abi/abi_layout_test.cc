// The layout is locked at compile time by abi_layout_asserts.h (for C++ here and for C in abi_layout_c.c); the test
// cases check that both compilers agree and that the unversioned headers name the current version.
#include <gtest/gtest.h>

#include <cstring>

#include "abi_layout_asserts.h"
#include "terse/compressor.h"
#include "terse/scheduler.h"

#include <type_traits>

// The deferred decompress's signature (terse/device_verdict_v1.h), as released: decompress's arguments with the verdict
// word before the stream.
static_assert(std::is_same_v<terse_decompress_deferred_fn_v1,
                             terse_status_v1 (*)(void*, const terse_tensor_info_v1*, const void*, uint64_t,
                                                 const terse_scratch_v1*, void*, int32_t, uint32_t*, void*)>);
// The deferred compress's: compress's arguments with the verdict word before the stream.
static_assert(
    std::is_same_v<terse_compress_deferred_fn_v1,
                   terse_status_v1 (*)(void*, const terse_tensor_info_v1*, const void*, const void*, uint64_t,
                                       const terse_scratch_v1*, void*, uint64_t, uint64_t*, uint32_t*, void*)>);
// The phases' (terse/phases_v1.h): the instance, then where to put the array and its length.
static_assert(std::is_same_v<terse_compressor_phases_fn_v1, terse_status_v1 (*)(void*, const uint64_t**, size_t*)>);

extern "C" {
size_t terse_test_c_sizeof_compressor(void);
size_t terse_test_c_sizeof_scheduler(void);
size_t terse_test_c_sizeof_tensor_info(void);
size_t terse_test_c_sizeof_chunk(void);
}

TEST(AbiLayout, CAndCxxAgree) {
  EXPECT_EQ(terse_test_c_sizeof_compressor(), sizeof(terse_compressor_v1));
  EXPECT_EQ(terse_test_c_sizeof_scheduler(), sizeof(terse_scheduler_v1));
  EXPECT_EQ(terse_test_c_sizeof_tensor_info(), sizeof(terse_tensor_info_v1));
  EXPECT_EQ(terse_test_c_sizeof_chunk(), sizeof(terse_chunk_v1));
}

TEST(AbiLayout, UnversionedHeadersNameV1) {
  EXPECT_EQ(TERSE_COMPRESSOR_ABI_VERSION, 1u);
  EXPECT_EQ(TERSE_SCHEDULER_ABI_VERSION, 1u);
  EXPECT_STREQ(TERSE_COMPRESSOR_PLUGIN_SYMBOL, "terse_compressor_plugin_v1");
  EXPECT_STREQ(TERSE_SCHEDULER_PLUGIN_SYMBOL, "terse_scheduler_plugin_v1");
  EXPECT_EQ(sizeof(terse_compressor_t), sizeof(terse_compressor_v1));
  EXPECT_EQ(sizeof(terse_scheduler_t), sizeof(terse_scheduler_v1));
}
