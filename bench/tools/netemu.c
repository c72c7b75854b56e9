/* A userspace network emulator for bench/mpc_netem.sh on kernels without sch_netem: a tun
 * device in each of two network namespaces; every IP packet read from one is written to the
 * other after serialisation at a rate (per direction, FIFO) plus a fixed delay.
 *   netemu NS_A IF_A NS_B IF_B DELAY_NS RATE_BYTES_PER_S STATE_FILE
 * SIGUSR1: emulate (the start), SIGUSR2: forward at once; the current mode is written to
 * STATE_FILE. It sleeps until 100 us before a packet is due and spins the rest (timer wake-ups
 * in a VM guest overshoot), so it burns some CPU while emulating. A benchmark tool, built by
 * the script, not by CMake. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>
#define SPIN_NS 100000u /* sleep until 100 us before a due packet, then poll without sleeping:
                          a guest vCPU's timer wake-up overshoots by tens of microseconds */
#define QCAP 4096
#define PMAX 2048 /* > the tun MTU (1500): no GSO on a plain tun */
struct queue {
    uint64_t due[QCAP], link_free, last_due;
    uint32_t len[QCAP];
    unsigned char *buf; /* QCAP slots of PMAX bytes */
    unsigned head, n;
};
static volatile sig_atomic_t want = 1, quit;
static void on_usr1(int s) { (void)s; want = 1; }
static void on_usr2(int s) { (void)s; want = 0; }
static void on_term(int s) { (void)s; quit = 1; }
static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}
static int tun_in(const char *ns, const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "/run/netns/%s", ns);
    int nfd = open(path, O_RDONLY | O_CLOEXEC);
    if (nfd < 0 || setns(nfd, CLONE_NEWNET) != 0) {
        perror(path);
        exit(1);
    }
    close(nfd);
    int fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    ifr.ifr_flags = IFF_TUN | IFF_NO_PI;
    strncpy(ifr.ifr_name, name, IFNAMSIZ - 1);
    if (fd < 0 || ioctl(fd, TUNSETIFF, &ifr) != 0) {
        perror("tun");
        exit(1);
    }
    return fd;
}
int main(int argc, char **argv)
{
    if (argc != 8) {
        fprintf(stderr, "usage: netemu NS_A IF_A NS_B IF_B DELAY_NS RATE_BYTES_PER_S STATE\n");
        return 2;
    }
    int fd[2] = {tun_in(argv[1], argv[2]), tun_in(argv[3], argv[4])};
    const uint64_t delay = strtoull(argv[5], NULL, 10);
    const double rate = strtod(argv[6], NULL);
    const char *state = argv[7];
    prctl(PR_SET_TIMERSLACK, 1UL); /* ns-precise wake-ups, not the default 50 us slack */
    struct sched_param sp = {.sched_priority = 10};
    (void)sched_setscheduler(0, SCHED_FIFO, &sp); /* like softirq work: ahead of the parties */
    sigset_t block, none;
    sigemptyset(&block);
    sigemptyset(&none);
    sigaddset(&block, SIGUSR1);
    sigaddset(&block, SIGUSR2);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGINT);
    sigprocmask(SIG_BLOCK, &block, NULL);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sigaction(SIGUSR1, &sa, NULL);
    sa.sa_handler = on_usr2;
    sigaction(SIGUSR2, &sa, NULL);
    sa.sa_handler = on_term;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    static struct queue q[2];
    for (int d = 0; d < 2; d++)
        if (!(q[d].buf = malloc((size_t)QCAP * PMAX))) {
            perror("malloc");
            return 1;
        }
    int cur = -1;
    while (!quit) {
        if (want != cur) {
            cur = want;
            char tmp[600];
            snprintf(tmp, sizeof tmp, "%s.new", state);
            FILE *f = fopen(tmp, "w");
            if (f) {
                fputs(cur ? "on\n" : "off\n", f);
                fclose(f);
                rename(tmp, state);
            }
        }
        uint64_t t = now_ns(), next = UINT64_MAX;
        for (int d = 0; d < 2; d++) {
            struct queue *Q = &q[d];
            while (Q->n && Q->due[Q->head] <= t) {
                /* a tun write hands the packet to the peer's stack; it does not block */
                if (write(fd[1 - d], Q->buf + (size_t)Q->head * PMAX, Q->len[Q->head]) < 0 &&
                    errno != EAGAIN && errno != EIO)
                    perror("write");
                Q->head = (Q->head + 1) % QCAP;
                Q->n--;
            }
            if (Q->n && Q->due[Q->head] < next)
                next = Q->due[Q->head];
        }
        struct pollfd pf[2] = {{fd[0], q[0].n < QCAP ? POLLIN : 0, 0},
                               {fd[1], q[1].n < QCAP ? POLLIN : 0, 0}};
        struct timespec ts, *tp = NULL;
        if (next != UINT64_MAX) {
            uint64_t dt = next > t + SPIN_NS ? next - t - SPIN_NS : 0;
            ts.tv_sec = (time_t)(dt / 1000000000u);
            ts.tv_nsec = (long)(dt % 1000000000u);
            tp = &ts;
        }
        int r = ppoll(pf, 2, tp, &none);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            perror("ppoll");
            return 1;
        }
        t = now_ns();
        for (int d = 0; d < 2; d++) {
            struct queue *Q = &q[d];
            if (!(pf[d].revents & POLLIN))
                continue;
            while (Q->n < QCAP) {
                unsigned slot = (Q->head + Q->n) % QCAP;
                ssize_t k = read(fd[d], Q->buf + (size_t)slot * PMAX, PMAX);
                if (k <= 0)
                    break;
                uint64_t due = t;
                if (cur) {
                    uint64_t start = Q->link_free > t ? Q->link_free : t;
                    Q->link_free = start + (rate > 0 ? (uint64_t)((double)k * 1e9 / rate) : 0);
                    due = Q->link_free + delay;
                }
                if (due < Q->last_due)
                    due = Q->last_due; /* FIFO across a mode switch */
                Q->last_due = due;
                Q->due[slot] = due;
                Q->len[slot] = (uint32_t)k;
                Q->n++;
            }
        }
    }
    return 0;
}
