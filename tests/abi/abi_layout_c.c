/* The ABI headers compile as strict C11 and lay out as the assertions say; abiSizesFromC() reports the C compiler's
 * view at run time so the C++ test can compare the two languages. */
#include "abi_layout_asserts.h"

size_t terse_test_c_sizeof_compressor(void) {
  return sizeof(terse_compressor_v1);
}
size_t terse_test_c_sizeof_scheduler(void) {
  return sizeof(terse_scheduler_v1);
}
size_t terse_test_c_sizeof_tensor_info(void) {
  return sizeof(terse_tensor_info_v1);
}
size_t terse_test_c_sizeof_chunk(void) {
  return sizeof(terse_chunk_v1);
}
