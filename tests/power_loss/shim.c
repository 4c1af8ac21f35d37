/*
 * Power-loss shim for tests/power_loss.rs, loaded into the daemon with
 * LD_PRELOAD. SIGKILL keeps the page cache, so it never tests an fsync; a
 * power cut does not. This shim writes, before every write to a ledger file
 * (name ending in .db, .db-wal or .db-journal, opened while
 * ASTRAEUS_POWER_LOSS_LOG is set), a record of what the write replaces and
 * what it writes; after every successful fsync or fdatasync of such a file,
 * a record that the file is on disk. After the kill the test rolls each file
 * back to its last sync and lets a chosen subset of the later writes "reach
 * the disk", as a power cut would (the approach of SQLite's own crash tests,
 * test6.c, at the level of system calls).
 *
 * Record (little-endian): kind u8 ('W' write, 'T' truncate, 'S' synced),
 * path_len u32, path, then for W: offset u64, size_before u64, old_len u64,
 * old bytes, new_len u64, new bytes; for T: new_size u64, size_before u64,
 * old_len u64, old bytes (what the truncation cut); for S: nothing.
 * Each record is one write(2) to the log, taken under one lock.
 *
 * Syncs made while a file PATH exists (a test creates and removes it) can
 * be made to fail: ASTRAEUS_POWER_LOSS_SYNC=kill@N:PATH makes the process
 * SIGKILL itself at the N-th such sync of a ledger file, before the disk is
 * asked (the moment between SQLite's COMMIT writing the log and its fsync,
 * which no failpoint in the daemon's own code can reach);
 * ASTRAEUS_POWER_LOSS_SYNC=fail:PATH makes each such sync fail with EIO,
 * syncing nothing, as a failing disk does.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_FD 4096

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char *tracked[MAX_FD];
static int log_fd = -1;
/* ASTRAEUS_POWER_LOSS_SYNC: while `armed` exists, kill at the kill_at-th
 * sync of a ledger file (1-based), or (kill_at 0) fail each. */
static const char *armed;
static long kill_at, syncs;

static ssize_t (*real_write)(int, const void *, size_t);
static ssize_t (*real_pwrite)(int, const void *, size_t, off_t);
static ssize_t (*real_pwrite64)(int, const void *, size_t, off_t);
static int (*real_ftruncate)(int, off_t);
static int (*real_ftruncate64)(int, off_t);

static void *next(const char *name) { return dlsym(RTLD_NEXT, name); }

static int ledger_file(const char *path) {
    static const char *ends[] = {".db", ".db-wal", ".db-journal"};
    size_t n = strlen(path);
    for (size_t i = 0; i < sizeof ends / sizeof *ends; i++) {
        size_t e = strlen(ends[i]);
        if (n >= e && strcmp(path + n - e, ends[i]) == 0) return 1;
    }
    return 0;
}

__attribute__((constructor)) static void init(void) {
    real_write = next("write");
    real_pwrite = next("pwrite");
    real_pwrite64 = next("pwrite64");
    real_ftruncate = next("ftruncate");
    real_ftruncate64 = next("ftruncate64");
    const char *p = getenv("ASTRAEUS_POWER_LOSS_LOG");
    int (*real_open)(const char *, int, ...) = next("open");
    log_fd = p ? real_open(p, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600) : -1;
    const char *s = getenv("ASTRAEUS_POWER_LOSS_SYNC");
    if (s && strncmp(s, "kill@", 5) == 0 && strchr(s, ':')) {
        kill_at = atol(s + 5);
        armed = strchr(s, ':') + 1;
    }
    if (s && strncmp(s, "fail:", 5) == 0) armed = s + 5;
}

static void track(int fd, const char *path) {
    if (fd < 0 || fd >= MAX_FD || !ledger_file(path)) return;
    pthread_mutex_lock(&lock);
    if (log_fd >= 0) {
        char *abs = realpath(path, NULL);
        free(tracked[fd]);
        tracked[fd] = abs;
    }
    pthread_mutex_unlock(&lock);
}

struct buf {
    char *p;
    size_t len, cap;
};

static void put(struct buf *b, const void *data, size_t n) {
    if (b->len + n > b->cap) {
        b->cap = (b->len + n) * 2;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->len, data, n);
    b->len += n;
}

static void put_u64(struct buf *b, uint64_t v) { put(b, &v, 8); }

static void head(struct buf *b, char kind, const char *path) {
    uint32_t n = strlen(path);
    put(b, &kind, 1);
    put(b, &n, 4);
    put(b, path, n);
}

/* The bytes [from, to) of the file as they are now (short at its end). */
static void put_old(struct buf *b, int fd, uint64_t from, uint64_t to) {
    uint64_t len = to > from ? to - from : 0;
    char *old = malloc(len ? len : 1);
    ssize_t got = len ? pread(fd, old, len, from) : 0;
    if (got < 0) got = 0;
    put_u64(b, got);
    put(b, old, got);
    free(old);
}

static void emit(struct buf *b) {
    real_write(log_fd, b->p, b->len);
    free(b->p);
}

/* Under the lock: the record of a write of n bytes at off. */
static void before_write(int fd, const void *data, size_t n, off_t off) {
    struct stat st;
    if (fstat(fd, &st) != 0) return;
    struct buf b = {0};
    head(&b, 'W', tracked[fd]);
    put_u64(&b, off);
    put_u64(&b, st.st_size);
    uint64_t end = (uint64_t)off + n, size = st.st_size;
    put_old(&b, fd, off, end < size ? end : size);
    put_u64(&b, n);
    put(&b, data, n);
    emit(&b);
}

static int is_tracked(int fd) {
    return fd >= 0 && fd < MAX_FD && tracked[fd] != NULL && log_fd >= 0;
}

/* open, open64, openat, openat64: the mode argument is there only with
 * O_CREAT or O_TMPFILE; a path relative to another directory is not ours. */
#define MODE(flags)                                                          \
    va_list ap;                                                              \
    va_start(ap, flags);                                                     \
    mode_t mode = (flags & (O_CREAT | O_TMPFILE)) ? va_arg(ap, mode_t) : 0;  \
    va_end(ap)

#define OPEN(fn)                                                             \
    int fn(const char *path, int flags, ...) {                               \
        static int (*real)(const char *, int, ...);                          \
        if (!real) real = next(#fn);                                         \
        MODE(flags);                                                         \
        int fd = real(path, flags, mode);                                    \
        track(fd, path);                                                     \
        return fd;                                                           \
    }

#define OPENAT(fn)                                                           \
    int fn(int dir, const char *path, int flags, ...) {                      \
        static int (*real)(int, const char *, int, ...);                     \
        if (!real) real = next(#fn);                                         \
        MODE(flags);                                                         \
        int fd = real(dir, path, flags, mode);                               \
        if (dir == AT_FDCWD || path[0] == '/') track(fd, path);              \
        return fd;                                                           \
    }

OPEN(open)
OPEN(open64)
OPENAT(openat)
OPENAT(openat64)

int close(int fd) {
    static int (*real)(int);
    if (!real) real = next("close");
    if (fd >= 0 && fd < MAX_FD) {
        pthread_mutex_lock(&lock);
        free(tracked[fd]);
        tracked[fd] = NULL;
        pthread_mutex_unlock(&lock);
    }
    return real(fd);
}

/* Unlocked first look (a test's benign race): most writes are not ours. */
static int maybe_tracked(int fd) { return log_fd >= 0 && fd >= 0 && fd < MAX_FD && tracked[fd]; }

ssize_t write(int fd, const void *data, size_t n) {
    if (!maybe_tracked(fd)) return real_write(fd, data, n);
    pthread_mutex_lock(&lock);
    if (is_tracked(fd)) before_write(fd, data, n, lseek(fd, 0, SEEK_CUR));
    ssize_t r = real_write(fd, data, n);
    pthread_mutex_unlock(&lock);
    return r;
}

static ssize_t positioned(ssize_t (*real)(int, const void *, size_t, off_t), int fd,
                          const void *data, size_t n, off_t off) {
    if (!maybe_tracked(fd)) return real(fd, data, n, off);
    pthread_mutex_lock(&lock);
    if (is_tracked(fd)) before_write(fd, data, n, off);
    ssize_t r = real(fd, data, n, off);
    pthread_mutex_unlock(&lock);
    return r;
}

ssize_t pwrite(int fd, const void *data, size_t n, off_t off) {
    return positioned(real_pwrite, fd, data, n, off);
}

ssize_t pwrite64(int fd, const void *data, size_t n, off_t off) {
    return positioned(real_pwrite64, fd, data, n, off);
}

static int truncated(int (*real)(int, off_t), int fd, off_t size) {
    if (!maybe_tracked(fd)) return real(fd, size);
    pthread_mutex_lock(&lock);
    struct stat st;
    if (is_tracked(fd) && fstat(fd, &st) == 0) {
        struct buf b = {0};
        head(&b, 'T', tracked[fd]);
        put_u64(&b, size);
        put_u64(&b, st.st_size);
        put_old(&b, fd, size, st.st_size);
        emit(&b);
    }
    int r = real(fd, size);
    pthread_mutex_unlock(&lock);
    return r;
}

int ftruncate(int fd, off_t size) { return truncated(real_ftruncate, fd, size); }

int ftruncate64(int fd, off_t size) { return truncated(real_ftruncate64, fd, size); }

/* After the disk confirmed it: the file is whole up to here. */
static int synced(int (*real)(int), int fd) {
    if (!maybe_tracked(fd)) return real(fd);
    /* Held through the sync: a write racing it counts as after it. */
    pthread_mutex_lock(&lock);
    if (is_tracked(fd) && armed && access(armed, F_OK) == 0) {
        if (kill_at && ++syncs == kill_at) kill(getpid(), SIGKILL);
        if (!kill_at) {
            pthread_mutex_unlock(&lock);
            errno = EIO;
            return -1;
        }
    }
    int r = real(fd);
    if (r == 0 && is_tracked(fd)) {
        struct buf b = {0};
        head(&b, 'S', tracked[fd]);
        emit(&b);
    }
    pthread_mutex_unlock(&lock);
    return r;
}

int fsync(int fd) {
    static int (*real)(int);
    if (!real) real = next("fsync");
    return synced(real, fd);
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (!real) real = next("fdatasync");
    return synced(real, fd);
}
