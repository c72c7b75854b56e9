/* The one number parser: decimal only, whole string, ranges; limits formatted as typed. */
#include <string.h>

#include "check.h"
#include "core/number.h"

int main(void)
{
    int64_t i = 0;
    double d = 0;
    char buf[64];
    CHECK(kvs_parse_i64("12", 0, 100, &i) == 0 && i == 12);
    CHECK(kvs_parse_i64("-3", -5, 5, &i) == 0 && i == -3);
    CHECK(kvs_parse_i64("0", 0, 0, &i) == 0 && i == 0);
    const char *bad_int[] = {"", "0x10", "1e3", "+4", " 5", "5 ", "1.0", "--1", "-", "12a",
                             "99999999999999999999", "١٢"};
    for (size_t k = 0; k < sizeof bad_int / sizeof *bad_int; k++)
        CHECKF(kvs_parse_i64(bad_int[k], INT64_MIN, INT64_MAX, &i) == -1, "'%s'", bad_int[k]);
    CHECK(kvs_parse_i64("101", 0, 100, &i) == -1);
    CHECK(kvs_parse_i64(NULL, 0, 100, &i) == -1);

    CHECK(kvs_parse_f64("0.25", 0, 1, &d) == 0 && d == 0.25);
    CHECK(kvs_parse_f64(".5", 0, 1, &d) == 0 && d == 0.5);
    CHECK(kvs_parse_f64("3", 0, 10, &d) == 0 && d == 3);
    CHECK(kvs_parse_f64("1e-3", 0, 1, &d) == 0 && d == 1e-3);
    CHECK(kvs_parse_f64("-2.5E+1", -100, 0, &d) == 0 && d == -25);
    const char *bad_f[] = {"", "0x1p3", "inf", "nan", "1.", "+1", " 1", "1 ", ".", "e5", "1e",
                           "1e+", "1.2.3", "1e999", "0,5"};
    for (size_t k = 0; k < sizeof bad_f / sizeof *bad_f; k++)
        CHECKF(kvs_parse_f64(bad_f[k], -1e300, 1e300, &d) == -1, "'%s'", bad_f[k]);
    CHECK(kvs_parse_f64("1.5", 0, 1, &d) == -1);

    CHECK(kvs_number_has_point("1.0") && kvs_number_has_point("1e0") && kvs_number_has_point(".5"));
    CHECK(!kvs_number_has_point("1") && !kvs_number_has_point("abc") && !kvs_number_has_point(""));

    CHECK(!strcmp(kvs_format_number(buf, sizeof buf, 1048576), "1048576"));
    CHECK(!strcmp(kvs_format_number(buf, sizeof buf, 0.25), "0.25"));
    CHECK(!strcmp(kvs_format_number(buf, sizeof buf, -7), "-7"));
    CHECK(!strcmp(kvs_format_number(buf, sizeof buf, 2147483647.0), "2147483647"));
    return check_summary("number");
}
