/* The current scheduler ABI. Include this to build against the newest version; include scheduler_v1.h to pin v1. */
#ifndef TERSE_SCHEDULER_H_
#define TERSE_SCHEDULER_H_

#include "terse/scheduler_v1.h"

#define TERSE_SCHEDULER_ABI_VERSION TERSE_SCHEDULER_ABI_V1
#define TERSE_SCHEDULER_PLUGIN_SYMBOL TERSE_SCHEDULER_PLUGIN_V1_SYMBOL
typedef terse_scheduler_v1 terse_scheduler_t;
typedef terse_sched_tensor_v1 terse_sched_tensor_t;
typedef terse_chunk_v1 terse_chunk_t;
typedef terse_scheduler_caps_v1 terse_scheduler_caps_t;

#endif /* TERSE_SCHEDULER_H_ */
