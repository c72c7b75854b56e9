#include "error.h"

#include <stdarg.h>
#include <stdio.h>

kvs_status kvs_fail(kvs_error *err, kvs_status code, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}
