/* Checked parameter access: a policy's code reads its parameters by name, and a name its type
 * does not declare (a typo) must not pass as 0.0. */
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "kv/policy.h"
#include "policies/registry.h"

/* Every registered policy: each declared name maps to its own index, undeclared names to -1. */
static void declared_names(void)
{
    int n;
    const kvs_policy_type *const *t = kvs_policy_types(&n);
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < t[i]->n_params; j++)
            CHECKF(kvs_policy_param_index(t[i], t[i]->params[j].name) == j, "%s: %s", t[i]->name,
                   t[i]->params[j].name);
        CHECK(kvs_policy_param_index(t[i], "budget") == -1); /* not a declared parameter */
        CHECK(kvs_policy_param_index(t[i], "") == -1);
    }
    const kvs_policy_type *s = kvs_policy_find("streaming");
    CHECK(s && kvs_policy_param_index(s, "sinks") == 0);
    CHECK(s && kvs_policy_param_index(s, "sink") == -1 && kvs_policy_param_index(s, "Sinks") == -1);
}

static void values(void)
{
    kvs_error err = {0};
    kvs_policy p;
    memset(&p, 0, sizeof p);
    CHECK(kvs_policy_parse("streaming:budget=0.5,sinks=7", &p.spec, &err) == KVS_OK);
    p.type = p.spec.type;
    CHECK(kvs_policy_param(&p, "sinks") == 7.0);
    CHECK(kvs_policy_spec_param(&p.spec, "sinks") == 7.0);
    CHECK(kvs_policy_param_or(&p, "sinks", -1.0) == 7.0);
    CHECK(kvs_policy_param_or(&p, "recent", -1.0) == -1.0); /* streaming declares no recent */
}

/* In a debug build a misspelt name stops the program (in a child process here). */
static void misspelt_name_asserts(void)
{
#ifndef NDEBUG
    kvs_error err = {0};
    kvs_policy p;
    memset(&p, 0, sizeof p);
    CHECK(kvs_policy_parse("streaming:budget=0.5", &p.spec, &err) == KVS_OK);
    p.type = p.spec.type;
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        fclose(stderr); /* the assertion's message is expected */
        double v = kvs_policy_param(&p, "sink");
        _exit(v == 0.0 ? 3 : 4);
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    CHECKF(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT,
           "kvs_policy_param(\"sink\") on streaming: %s %d (want SIGABRT)",
           WIFSIGNALED(status) ? "signal" : "exit", WIFSIGNALED(status) ? WTERMSIG(status)
                                                                       : WEXITSTATUS(status));
#endif
}

int main(void)
{
    declared_names();
    values();
    misspelt_name_asserts();
    return check_summary("test_policy_param");
}
