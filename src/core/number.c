/* Strict decimal number parsing (see number.h): one grammar for every number a user types. */
#include "core/number.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* Length of the decimal-number prefix of s under the grammar, 0 if none; *point says whether
 * it had a '.' or an exponent. Checked before strtod, which would also take hex, inf and nan. */
static size_t scan(const char *s, int integer_only, int *point)
{
    size_t i = 0, digits = 0;
    *point = 0;
    if (s[i] == '-')
        i++;
    while (s[i] >= '0' && s[i] <= '9')
        i++, digits++;
    if (integer_only)
        return digits ? i : 0;
    if (s[i] == '.') {
        size_t frac = 0;
        i++;
        while (s[i] >= '0' && s[i] <= '9')
            i++, frac++;
        if (!frac) /* "1." is a typo more often than a number */
            return 0;
        digits += frac;
        *point = 1;
    }
    if (!digits)
        return 0;
    if (s[i] == 'e' || s[i] == 'E') {
        size_t j = i + 1, exp = 0;
        if (s[j] == '-' || s[j] == '+')
            j++;
        while (s[j] >= '0' && s[j] <= '9')
            j++, exp++;
        if (!exp)
            return 0;
        i = j;
        *point = 1;
    }
    return i;
}

int kvs_parse_i64(const char *s, int64_t min, int64_t max, int64_t *out)
{
    int point;
    size_t n = s ? scan(s, 1, &point) : 0;
    if (!n || s[n])
        return -1;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || v < min || v > max)
        return -1;
    *out = (int64_t)v;
    return 0;
}

int kvs_parse_f64(const char *s, double min, double max, double *out)
{
    int point;
    size_t n = s ? scan(s, 0, &point) : 0;
    if (!n || s[n])
        return -1;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno == ERANGE && fabs(v) > 1.0) /* overflow; underflow to a tiny value is fine */
        return -1;
    if (*end || !isfinite(v) || v < min || v > max)
        return -1;
    *out = v;
    return 0;
}

int kvs_number_has_point(const char *s)
{
    int point;
    size_t n = s ? scan(s, 0, &point) : 0;
    return n && point;
}

const char *kvs_format_number(char *buf, size_t size, double v)
{
    if (v == floor(v) && fabs(v) < 1e18)
        snprintf(buf, size, "%.0f", v);
    else
        snprintf(buf, size, "%.6g", v);
    return buf;
}
