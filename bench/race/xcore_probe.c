/* Cross-core probe for the race: how fast freshly written bytes move from one core to
 * another right now. Two threads on the first two CPUs this process may use pass 64 KiB
 * pieces through a 1 MiB ring (memcpy in, memcpy out), 256 MiB in all, three times; prints
 * the median in GB/s. On the development VM this reads about 11 in good spells and 2-4 in
 * slow ones, and every transport that moves bytes between cores follows it.
 *   xcore_probe            (one number; 0 where fewer than two CPUs are usable) */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define RING (1 << 20)
#define PIECE (64 << 10)
#define SPAN (32 << 20)
#define TOTAL (256ul << 20)

static char *ring, *src, *dst;
static _Atomic size_t head, tail;
static int cpu[2];

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void pin(int c) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(c, &s);
    sched_setaffinity(0, sizeof s, &s);
}

static void *producer(void *arg) {
    (void)arg;
    pin(cpu[0]);
    for (size_t p = 0; p < TOTAL; p += PIECE) {
        while (p + PIECE - atomic_load(&tail) > RING) {
        }
        memcpy(ring + p % RING, src + p % SPAN, PIECE);
        atomic_store(&head, p + PIECE);
    }
    return NULL;
}

static void *consumer(void *arg) {
    (void)arg;
    pin(cpu[1]);
    for (size_t p = 0; p < TOTAL; p += PIECE) {
        while (atomic_load(&head) < p + PIECE) {
        }
        memcpy(dst + p % SPAN, ring + p % RING, PIECE);
        atomic_store(&tail, p + PIECE);
    }
    return NULL;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(void) {
    cpu_set_t allowed;
    sched_getaffinity(0, sizeof allowed, &allowed);
    int n = 0;
    for (int c = 0; c < CPU_SETSIZE && n < 2; c++)
        if (CPU_ISSET(c, &allowed)) cpu[n++] = c;
    if (n < 2) {
        printf("0\n");
        return 0;
    }
    ring = aligned_alloc(4096, RING);
    src = aligned_alloc(4096, SPAN);
    dst = aligned_alloc(4096, SPAN);
    if (!ring || !src || !dst) return 1;
    memset(ring, 0, RING);
    memset(src, 1, SPAN);
    memset(dst, 0, SPAN);
    double gbs[3];
    for (int k = 0; k < 3; k++) {
        head = 0;
        tail = 0;
        pthread_t a, b;
        double t = now();
        pthread_create(&a, NULL, producer, NULL);
        pthread_create(&b, NULL, consumer, NULL);
        pthread_join(a, NULL);
        pthread_join(b, NULL);
        gbs[k] = TOTAL / (now() - t) / 1e9;
    }
    qsort(gbs, 3, sizeof gbs[0], cmp);
    printf("%.1f\n", gbs[1]);
    return 0;
}
