/* Compares two logits files (rows of n_vocab float32): max |diff|, top-1 agreement and mean
 * KL(reference || candidate). Exits 1 if a given threshold is violated, 2 on bad input. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static float *read_f32(const char *path, long *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "logits_compare: cannot open %s\n", path);
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    long bytes = ftell(f);
    fseek(f, 0, SEEK_SET);
    float *d = malloc(bytes > 0 ? (size_t)bytes : 1);
    if (!d || bytes % 4 || fread(d, 1, (size_t)bytes, f) != (size_t)bytes) {
        fprintf(stderr, "logits_compare: cannot read %s\n", path);
        free(d);
        fclose(f);
        return NULL;
    }
    fclose(f);
    *n = bytes / 4;
    return d;
}

static int argmax(const float *x, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

/* log-softmax normaliser */
static double log_sum_exp(const float *x, int n)
{
    double m = x[0], s = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > m)
            m = x[i];
    for (int i = 0; i < n; i++)
        s += exp(x[i] - m);
    return m + log(s);
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: logits_compare REF.f32 CAND.f32 N_VOCAB [--max-abs X] "
                        "[--min-top1 F] [--label TEXT]\n");
        return 2;
    }
    int vocab = atoi(argv[3]);
    double max_abs_limit = -1, min_top1 = -1;
    const char *label = argv[2];
    for (int i = 4; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--max-abs"))
            max_abs_limit = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--min-top1"))
            min_top1 = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--label"))
            label = argv[i + 1];
    }
    long na, nb;
    float *a = read_f32(argv[1], &na), *b = read_f32(argv[2], &nb);
    if (!a || !b || vocab <= 0 || na != nb || na % vocab) {
        fprintf(stderr, "logits_compare: size mismatch (%ld vs %ld floats, vocab %d)\n", na, nb,
                vocab);
        return 2;
    }
    long rows = na / vocab, agree = 0;
    double max_abs = 0, kl_sum = 0;
    long worst_row = 0;
    for (long r = 0; r < rows; r++) {
        const float *x = a + r * vocab, *y = b + r * vocab;
        for (int i = 0; i < vocab; i++) {
            double d = fabs((double)x[i] - y[i]);
            if (d > max_abs || isnan(d)) {
                max_abs = isnan(d) ? INFINITY : d;
                worst_row = r;
            }
        }
        agree += argmax(x, vocab) == argmax(y, vocab);
        double lx = log_sum_exp(x, vocab), ly = log_sum_exp(y, vocab), kl = 0;
        for (int i = 0; i < vocab; i++) {
            double lp = x[i] - lx, lq = y[i] - ly;
            kl += exp(lp) * (lp - lq);
        }
        kl_sum += kl;
    }
    double top1 = (double)agree / rows;
    printf("%s: rows %ld, max |diff| %.3g (row %ld), top-1 agreement %.2f%%, mean KL %.3g\n",
           label, rows, max_abs, worst_row, 100 * top1, kl_sum / rows);
    int fail = 0;
    if (max_abs_limit >= 0 && !(max_abs <= max_abs_limit)) {
        printf("FAIL: max |diff| %.3g > %.3g\n", max_abs, max_abs_limit);
        fail = 1;
    }
    if (min_top1 >= 0 && top1 < min_top1) {
        printf("FAIL: top-1 agreement %.4f < %.4f\n", top1, min_top1);
        fail = 1;
    }
    free(a);
    free(b);
    return fail;
}
