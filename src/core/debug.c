#include "debug.h"

#include <stdio.h>
#include <stdlib.h>

_Noreturn void kvs_assert_fail(const char *cond, const char *file, int line, const char *func)
{
    fprintf(stderr, "kvslim: internal error: assertion '%s' failed in %s (%s:%d)\n", cond, func,
            file, line);
    abort();
}
