/* Next-token sampling: greedy, temperature, top-k, top-p; seeded and reproducible. The API is
 * public (kvs_sampler_* in kvslim.h); this header remains for the library's own includes. */
#ifndef KVS_SAMPLER_H
#define KVS_SAMPLER_H

#include "kvslim.h"

#endif
