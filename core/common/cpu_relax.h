// The CPU's spin-wait hint, one definition for every room that spins: the runtime's adaptive mutex (runtime.cc), the
// transports' waits (core/comm/spin_wait.h) and the link emulation's precise sleep (link_emulation.cc).
#pragma once

namespace terse {

// One step of a pure spin-wait: the CPU's pause hint, which yields the core's pipeline to its sibling hyperthread and
// saves power without giving up the time slice.
inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

}  // namespace terse
