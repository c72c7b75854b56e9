/* Counters and the Prometheus text exposition (server_metrics.h). */
#include "server/server_metrics.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kvs_srv_metrics_init(kvs_srv_metrics *m)
{
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
}

void kvs_srv_metrics_destroy(kvs_srv_metrics *m)
{
    pthread_mutex_destroy(&m->mu);
    free(m->req);
    m->req = NULL;
}

void kvs_srv_metrics_request(kvs_srv_metrics *m, const char *endpoint, int status)
{
    pthread_mutex_lock(&m->mu);
    int i = 0;
    while (i < m->n_req && (m->req[i].status != status || strcmp(m->req[i].endpoint, endpoint)))
        i++;
    if (i == m->n_req && m->n_req == m->cap_req) {
        int cap = m->cap_req ? 2 * m->cap_req : 16;
        kvs_srv_req_count *p = realloc(m->req, sizeof *p * (size_t)cap);
        if (p)
            m->req = p, m->cap_req = cap;
    }
    if (i < m->cap_req) { /* out of memory: the request goes uncounted */
        if (i == m->n_req) {
            memset(&m->req[i], 0, sizeof m->req[i]);
            snprintf(m->req[i].endpoint, sizeof m->req[i].endpoint, "%s", endpoint);
            m->req[i].status = status;
            m->n_req++;
        }
        m->req[i].count++;
    }
    pthread_mutex_unlock(&m->mu);
}

/* The table row of policy kv, added if new; past the limit, the shared "other" row. */
static kvs_srv_policy_count *policy(kvs_srv_metrics *m, const char *kv)
{
    for (int i = 0; i < m->n_pol; i++)
        if (!strcmp(m->pol[i].kv, kv))
            return &m->pol[i];
    if (m->n_pol == KVS_SRV_MAX_POLICIES) {
        kvs_srv_policy_count *other = &m->pol[KVS_SRV_MAX_POLICIES];
        snprintf(other->kv, sizeof other->kv, "other");
        return other;
    }
    kvs_srv_policy_count *p = &m->pol[m->n_pol++];
    snprintf(p->kv, sizeof p->kv, "%s", kv);
    return p;
}

void kvs_srv_metrics_started(kvs_srv_metrics *m, const char *kv, int prompt_tokens)
{
    pthread_mutex_lock(&m->mu);
    policy(m, kv)->requests++;
    m->prompt_tokens += (uint64_t)prompt_tokens;
    pthread_mutex_unlock(&m->mu);
}

void kvs_srv_metrics_generated(kvs_srv_metrics *m, const char *kv, int n, int64_t second)
{
    pthread_mutex_lock(&m->mu);
    policy(m, kv)->generated += (uint64_t)n;
    m->generated_tokens += (uint64_t)n;
    int i = (int)(second % KVS_SRV_RATE_WINDOW);
    if (m->window[i].second != second) {
        m->window[i].second = second;
        m->window[i].tokens = 0;
    }
    m->window[i].tokens += (uint64_t)n;
    pthread_mutex_unlock(&m->mu);
}

int kvs_srv_prom_label(kvs_srv_buf *out, const char *s)
{
    for (; *s; s++) {
        const char *esc = *s == '\\' ? "\\\\" : *s == '"' ? "\\\"" : *s == '\n' ? "\\n" : NULL;
        if (esc ? kvs_srv_buf_puts(out, esc) : kvs_srv_buf_append(out, s, 1))
            return -1;
    }
    return 0;
}

static void header(kvs_srv_buf *out, const char *name, const char *type, const char *help)
{
    kvs_srv_buf_printf(out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void sample_kv(kvs_srv_buf *out, const char *name, const char *kv, uint64_t v)
{
    kvs_srv_buf_printf(out, "%s{kv=\"", name);
    kvs_srv_prom_label(out, kv);
    kvs_srv_buf_printf(out, "\"} %" PRIu64 "\n", v);
}

/* Bytes held now by the busy sequences running policy kv (NULL: all of them). */
static uint64_t held(const kvs_srv_metrics_now *now, const char *kv, int n_known,
                     const kvs_srv_policy_count *known)
{
    uint64_t sum = 0;
    for (int i = 0; i < now->max_sequences; i++) {
        const kvs_srv_slot *s = &now->slots[i];
        if (!s->busy)
            continue;
        int match = !kv || !strcmp(s->kv, kv);
        if (kv && !strcmp(kv, "other")) { /* the policies past the table's limit */
            match = 1;
            for (int j = 0; j < n_known && match; j++)
                match = strcmp(known[j].kv, s->kv) != 0;
        }
        sum += match ? s->kv_bytes : 0;
    }
    return sum;
}

int kvs_srv_metrics_render(kvs_srv_metrics *m, const kvs_srv_metrics_now *now, kvs_srv_buf *out)
{
    pthread_mutex_lock(&m->mu);
    header(out, "kvslim_requests_total", "counter", "HTTP requests answered, by endpoint and status.");
    for (int i = 0; i < m->n_req; i++) {
        kvs_srv_buf_puts(out, "kvslim_requests_total{endpoint=\"");
        kvs_srv_prom_label(out, m->req[i].endpoint);
        kvs_srv_buf_printf(out, "\",status=\"%d\"} %" PRIu64 "\n", m->req[i].status,
                           m->req[i].count);
    }
    header(out, "kvslim_prompt_tokens_total", "counter", "Prompt tokens prefilled.");
    kvs_srv_buf_printf(out, "kvslim_prompt_tokens_total %" PRIu64 "\n", m->prompt_tokens);
    header(out, "kvslim_generated_tokens_total", "counter", "Tokens generated.");
    kvs_srv_buf_printf(out, "kvslim_generated_tokens_total %" PRIu64 "\n", m->generated_tokens);
    uint64_t recent = 0;
    for (int i = 0; i < KVS_SRV_RATE_WINDOW; i++)
        if (now->second - m->window[i].second < KVS_SRV_RATE_WINDOW)
            recent += m->window[i].tokens;
    header(out, "kvslim_decode_tokens_per_second", "gauge",
           "Tokens generated over the last 60 seconds, per second.");
    kvs_srv_buf_printf(out, "kvslim_decode_tokens_per_second %.6g\n",
                       (double)recent / KVS_SRV_RATE_WINDOW);
    header(out, "kvslim_kv_bytes_held", "gauge", "KV cache bytes held now by all sequences.");
    kvs_srv_buf_printf(out, "kvslim_kv_bytes_held %" PRIu64 "\n", held(now, NULL, 0, NULL));
    header(out, "kvslim_kv_bytes_bound", "gauge",
           "The most KV bytes the sequences can hold: each a full F16 cache of the context.");
    kvs_srv_buf_printf(out, "kvslim_kv_bytes_bound %" PRIu64 "\n", now->kv_bytes_bound);
    header(out, "kvslim_queue_depth", "gauge", "Requests waiting for a sequence.");
    kvs_srv_buf_printf(out, "kvslim_queue_depth %d\n", now->waiting);
    header(out, "kvslim_sequences_busy", "gauge", "Sequences generating now.");
    kvs_srv_buf_printf(out, "kvslim_sequences_busy %d\n", now->busy);
    header(out, "kvslim_sequences_max", "gauge", "Sequences that may generate at once.");
    kvs_srv_buf_printf(out, "kvslim_sequences_max %d\n", now->max_sequences);
    int n_pol = m->n_pol + (m->pol[KVS_SRV_MAX_POLICIES].kv[0] != 0);
    const kvs_srv_policy_count *pol[KVS_SRV_MAX_POLICIES + 1];
    for (int i = 0; i < m->n_pol; i++)
        pol[i] = &m->pol[i];
    if (n_pol > m->n_pol)
        pol[m->n_pol] = &m->pol[KVS_SRV_MAX_POLICIES];
    header(out, "kvslim_policy_requests_total", "counter",
           "Generation requests that got a sequence, by KV policy.");
    for (int i = 0; i < n_pol; i++)
        sample_kv(out, "kvslim_policy_requests_total", pol[i]->kv, pol[i]->requests);
    header(out, "kvslim_policy_generated_tokens_total", "counter",
           "Tokens generated, by KV policy.");
    for (int i = 0; i < n_pol; i++)
        sample_kv(out, "kvslim_policy_generated_tokens_total", pol[i]->kv, pol[i]->generated);
    header(out, "kvslim_policy_kv_bytes_held", "gauge", "KV cache bytes held now, by KV policy.");
    for (int i = 0; i < n_pol; i++)
        sample_kv(out, "kvslim_policy_kv_bytes_held", pol[i]->kv,
                  held(now, pol[i]->kv, m->n_pol, m->pol));
    pthread_mutex_unlock(&m->mu);
    return out->failed ? -1 : 0;
}
