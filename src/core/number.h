/* The one number parser: plain decimal text only (no hex, no inf/nan, no leading or trailing
 * space), the whole string. Used for every number a user writes: CLI flags, --kv specs,
 * --synthetic shapes, token files. */
#ifndef KVS_NUMBER_H
#define KVS_NUMBER_H

#include <stddef.h>
#include <stdint.h>

/* A whole number: optional '-', then decimal digits ("12", "-3"; not "0x10", "1e3", "+4",
 * " 5", "1.0"). Returns 0, or -1 if s is not one or it lies outside [min, max]. */
int kvs_parse_i64(const char *s, int64_t min, int64_t max, int64_t *out);
/* A decimal number: optional '-', digits with at most one '.', optional exponent e[+-]digits
 * ("0.25", ".5", "3", "1e-3"; not "0x1p3", "inf", "nan", "1.", "+1"). Returns 0, or -1 if s
 * is not one, is not finite, or lies outside [min, max]. */
int kvs_parse_f64(const char *s, double min, double max, double *out);
/* Whether s contains a '.' or an exponent, i.e. was written as a fraction ("1.0", "1e0"). */
int kvs_number_has_point(const char *s);
/* A limit as a user writes it: whole numbers in full ("1048576", not "1.04858e+06"), others
 * with up to 6 significant digits ("0.25"). Writes into buf and returns it. */
const char *kvs_format_number(char *buf, size_t size, double v);

#endif
