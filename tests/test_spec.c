/* --kv spec syntax: budget=F / budget=P% (fractions), slots=N (counts), the ambiguous budget=N,
 * duplicate keys, decimal-only numbers, shift=on|off, canonical text, and the budget clamp. */
#include <string.h>

#include "check.h"
#include "kv/policy.h"
#include "policies/registry.h"
#include "policy_check.h"

/* Parses spec; 1 if it is accepted with canonical text `text` (NULL: any) */
static int parses_to(const char *spec, const char *text)
{
    kvs_policy_spec s;
    kvs_error err = {0};
    if (kvs_policy_parse(spec, &s, &err) != KVS_OK) {
        fprintf(stderr, "spec '%s' rejected: %s\n", spec, err.msg);
        return 0;
    }
    if (text && strcmp(s.text, text)) {
        fprintf(stderr, "spec '%s' gives '%s' (want '%s')\n", spec, s.text, text);
        return 0;
    }
    return 1;
}

static int slots_for(const char *spec, int n_prompt)
{
    kvs_policy_spec s;
    kvs_error err = {0};
    if (kvs_policy_parse(spec, &s, &err) != KVS_OK)
        return -1;
    return kvs_policy_budget_slots(&s, n_prompt);
}

int main(void)
{
    /* Fractions: a decimal point or a percent; counts: slots=N. */
    CHECK(parses_to("h2o:budget=0.25", "h2o:budget=0.25"));
    CHECK(parses_to("h2o:budget=25%", "h2o:budget=0.25"));
    CHECK(parses_to("h2o:budget=100%", "h2o:budget=1.0"));
    CHECK(parses_to("h2o:budget=1.0", "h2o:budget=1.0"));
    CHECK(parses_to("h2o:slots=96", "h2o:slots=96"));
    CHECK(parses_to("streaming:slots=64,sinks=2", "streaming:slots=64,sinks=2"));
    CHECK(slots_for("h2o:budget=25%", 100) == 25);
    CHECK(slots_for("h2o:slots=7", 100) == 7);

    /* budget=N without a point is ambiguous: the message shows both spellings. */
    CHECK(error_mentions("h2o:budget=1", "h2o:budget=1: budget=1 is ambiguous: write budget=1.0 "
                                         "or budget=100% for the whole prompt, or slots=1 for "
                                         "one slot"));
    CHECK(error_mentions("h2o:budget=96", "ambiguous"));
    CHECK(error_mentions("h2o:budget=96", "slots=96"));
    CHECK(error_mentions("h2o:budget=96", "budget=0.25"));
    CHECK(error_mentions("h2o:budget=0", "budget=0"));
    CHECK(error_mentions("h2o:budget=0.0", "(0, 1]"));
    CHECK(error_mentions("h2o:budget=1.5", "(0, 1]"));
    CHECK(error_mentions("h2o:budget=0%", "(0, 100]"));
    CHECK(error_mentions("h2o:budget=101%", "(0, 100]"));
    CHECK(error_mentions("h2o:budget=x%", "budget=x%"));
    CHECK(error_mentions("h2o:slots=0", "slots=0"));
    CHECK(error_mentions("h2o:slots=1.0", "whole number"));
    CHECK(error_mentions("h2o:slots=3000000000", "[1, 2147483647]"));
    CHECK(error_mentions("h2o:budget=0.5,slots=4", "not both"));
    CHECK(error_mentions("h2o", "needs budget="));
    CHECK(error_mentions("full:slots=4", "unknown parameter 'slots'"));

    /* Duplicate keys are rejected, not resolved last-wins. */
    CHECK(error_mentions("h2o:budget=0.1,budget=0.2", "budget is given twice"));
    CHECK(error_mentions("h2o:slots=4,slots=5", "slots is given twice"));
    CHECK(error_mentions("streaming:budget=0.5,sinks=2,sinks=3", "sinks is given twice"));
    CHECK(error_mentions("streaming:budget=0.5,shift=on,shift=off", "shift is given twice"));

    /* Decimal only: no hex, no inf/nan, wherever a number appears in a spec. */
    CHECK(error_mentions("h2o:budget=0x1p-2", "budget=0x1p-2"));
    CHECK(error_mentions("random:budget=0.5,seed=0x10", "seed=0x10"));
    CHECK(error_mentions("h2o:budget=inf", "budget=inf"));
    CHECK(error_mentions("snapkv:budget=0.5,window=nan", "window=nan"));
    /* Limits are printed as a user writes them (no %g), the spec as typed. */
    CHECK(error_mentions("streaming:budget=0.5,sinks=99999999", "[0, 1048576]"));
    CHECK(error_mentions("streaming:budget=0.50,sinks=99999999", "streaming:budget=0.50,"));
    /* Canonical parameters print in full. */
    CHECK(parses_to("random:budget=0.5,seed=123456789", "random:budget=0.5,seed=123456789"));

    /* shift=on|off: every evicting policy, nothing else. */
    {
        kvs_policy_spec s;
        kvs_error err = {0};
        CHECK(kvs_policy_parse("streaming:slots=64,shift=on", &s, &err) == KVS_OK && s.shift);
        CHECK(kvs_policy_parse("h2o:budget=0.5,shift=off", &s, &err) == KVS_OK && !s.shift);
        CHECK(!strcmp(s.text, "h2o:budget=0.5"));
    }
    CHECK(parses_to("streaming:slots=64,shift=on", "streaming:slots=64,shift=on"));
    CHECK(error_mentions("streaming:slots=64,shift=yes", "shift=yes is not one of on|off"));
    CHECK(error_mentions("snapkv:budget=0.5,shift=on", "only for evicting policies"));
    CHECK(error_mentions("quest:budget=0.5,shift=on", "only for evicting policies"));
    CHECK(error_mentions("full:shift=on", "only for evicting policies"));
    int n;
    const kvs_policy_type *const *types = kvs_policy_types(&n);
    for (int i = 0; i < n; i++) {
        char spec[64];
        snprintf(spec, sizeof spec, "%s:budget=0.5,shift=on", types[i]->name);
        kvs_error err = {0};
        kvs_status st = kvs_kv_policy_check(types[i]->kind == KVS_KIND_FULL ? "full:shift=on" : spec, &err);
        CHECKF((st == KVS_OK) == (types[i]->kind == KVS_KIND_EVICTING), "%s: %s", spec, err.msg);
    }

    /* The smallest budget a policy accepts: a fraction below it is raised, a count is not. */
    {
        kvs_policy_spec s;
        kvs_error err = {0};
        CHECK(kvs_policy_parse("streaming:budget=0.5", &s, &err) == KVS_OK);
        CHECK(kvs_policy_min_budget(&s) == 5);
        CHECK(kvs_policy_budget_slots(&s, 6) == 5);
        char note[256];
        CHECK(kvs_policy_budget_notice(&s, 6, note, sizeof note) == 1);
        CHECKF(strstr(note, "streaming") && strstr(note, "0.5") && strstr(note, "5 slots"), "%s",
               note);
        CHECK(kvs_policy_budget_notice(&s, 100, note, sizeof note) == 0);
        CHECK(kvs_policy_budget_slots(&s, 100) == 50);
        CHECK(kvs_policy_parse("streaming:slots=3", &s, &err) == KVS_OK);
        CHECK(kvs_policy_budget_slots(&s, 6) == 3); /* a count stays: start rejects it */
        CHECK(kvs_policy_budget_notice(&s, 6, note, sizeof note) == 0);
        CHECK(kvs_policy_parse("hashevict:budget=0.1", &s, &err) == KVS_OK);
        CHECK(kvs_policy_min_budget(&s) == 15);
        CHECK(kvs_policy_parse("l2evict:budget=0.1,sinks=1,recent=2", &s, &err) == KVS_OK);
        CHECK(kvs_policy_min_budget(&s) == 4);
        CHECK(kvs_policy_parse("h2o:budget=0.1", &s, &err) == KVS_OK);
        CHECK(kvs_policy_min_budget(&s) == 1);
    }
    return check_summary("spec");
}
