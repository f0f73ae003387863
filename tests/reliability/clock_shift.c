/* An LD_PRELOAD shim that shifts a process's wall clock (CLOCK_REALTIME, gettimeofday, time)
 * by the number of seconds written in the file $IDEMSTORE_CLOCK_SHIFT_FILE, re-read at most
 * every 20 ms of monotonic time, so a test can step the clock of a running engine.
 * libfaketime does the same for PostgreSQL and Python; it cannot start redis-server (its
 * jemalloc calls clock_gettime while libfaketime initialises, and libfaketime 0.9.10 gives
 * up on the recursion), so Redis gets this shim, which makes raw system calls only. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
#include <fcntl.h>

static double shift = 0.0;
static long long next_read_ns = 0;

static long long monotonic_ns(void) {
    struct timespec now;
    syscall(SYS_clock_gettime, CLOCK_MONOTONIC, &now);
    return (long long)now.tv_sec * 1000000000LL + now.tv_nsec;
}

static double current_shift(void) {
    long long now = monotonic_ns();
    if (now < next_read_ns) return shift;
    next_read_ns = now + 20000000LL;
    const char *path = getenv("IDEMSTORE_CLOCK_SHIFT_FILE");
    if (path == NULL) return shift;
    int fd = open(path, 0);
    if (fd < 0) return shift;
    char text[64];
    ssize_t got = read(fd, text, sizeof text - 1);
    close(fd);
    if (got > 0) {
        text[got] = 0;
        shift = strtod(text, NULL);
    }
    return shift;
}

static void shifted(struct timespec *ts) {
    double by = current_shift();
    long long ns = (long long)ts->tv_sec * 1000000000LL + ts->tv_nsec + (long long)(by * 1e9);
    ts->tv_sec = ns / 1000000000LL;
    ts->tv_nsec = ns % 1000000000LL;
}

int clock_gettime(clockid_t clock, struct timespec *ts) {
    int answer = (int)syscall(SYS_clock_gettime, clock, ts);
    if (answer == 0 && (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE)) shifted(ts);
    return answer;
}

int gettimeofday(struct timeval *tv, void *tz) {
    struct timespec now;
    int answer = clock_gettime(CLOCK_REALTIME, &now);
    if (answer == 0 && tv != NULL) {
        tv->tv_sec = now.tv_sec;
        tv->tv_usec = now.tv_nsec / 1000;
    }
    (void)tz;
    return answer;
}

time_t time(time_t *out) {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    if (out != NULL) *out = now.tv_sec;
    return now.tv_sec;
}
