// TERSE_CPU_CLONES: compile a hot loop for baseline x86-64 and for x86-64-v3/v4 (AVX2, AVX-512), the best picked when
// the plugin loads (GCC function multiversioning), so a portable build still gets wide vectors on a modern CPU.
// `flatten` inlines the TERSE_HD helpers into each clone, so they too are compiled for the clone's instruction set.
// The clones must round alike: terse builds with -ffp-contract=off (no a*b+c fused into FMA in one clone only).
#pragma once

#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#define TERSE_CPU_CLONES __attribute__((flatten, target_clones("default", "arch=x86-64-v3", "arch=x86-64-v4")))
#else
#define TERSE_CPU_CLONES
#endif
