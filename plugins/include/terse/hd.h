/* One kernel body, two launchers (DESIGN.md section 5): elementwise math written once as small inline functions
 * marked TERSE_HD, called from plain CPU loops (which the compiler vectorizes) and from CUDA kernels alike, so the CPU
 * tests check the math the GPU runs. */
#ifndef TERSE_HD_H_
#define TERSE_HD_H_

#if defined(__CUDACC__)
#define TERSE_HD __host__ __device__ __forceinline__
#define TERSE_DEVICE_CODE 1
#else
#define TERSE_HD inline
#define TERSE_DEVICE_CODE 0
#endif

#endif /* TERSE_HD_H_ */
