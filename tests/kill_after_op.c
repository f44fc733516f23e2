/* LD_PRELOAD shim for the crash tests: SIGKILL this process right after its K-th change to a file under a folder.

   Environment:
     KILL_DIR    absolute folder; only files whose path starts with it count
     KILL_AFTER  K >= 1: the process kills itself (SIGKILL) right after the K-th counted call returns;
                 0 or unset: nothing is killed
     KILL_LOG    optional file: one line per counted call ("K call path"; the call named "thread-CALL" when a
                 thread other than the main one made it), written with raw syscalls

   Counted calls, each one step the file system sees: open/openat that may create or truncate (O_CREAT,
   O_TRUNC), write/pwrite, ftruncate/truncate, fallocate/posix_fallocate, fsync/fdatasync, rename,
   unlink.  Build: cc -shared -fPIC -O1 -o kill_after_op.so kill_after_op.c -ldl */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

static const char *dir;
static size_t dir_len;
static long kill_after;
static long counted;
static int log_fd = -1;

__attribute__((constructor)) static void setup(void) {
    dir = getenv("KILL_DIR");
    dir_len = dir ? strlen(dir) : 0;
    const char *k = getenv("KILL_AFTER");
    kill_after = k ? atol(k) : 0;
    const char *log = getenv("KILL_LOG");
    if (log && *log)
        log_fd = (int)syscall(SYS_openat, AT_FDCWD, log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
}

static int under_dir(const char *path) {
    return dir_len && path && strncmp(path, dir, dir_len) == 0;
}

static int fd_path(int fd, char *buf, size_t size) {
    char link[64];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = (ssize_t)syscall(SYS_readlinkat, AT_FDCWD, link, buf, size - 1);
    if (n < 0)
        return 0;
    buf[n] = '\0';
    return under_dir(buf);
}

static void step(const char *call, const char *path) {
    long k = __atomic_add_fetch(&counted, 1, __ATOMIC_SEQ_CST);
    if (log_fd >= 0) {
        char line[4200];
        const char *who = syscall(SYS_gettid) == getpid() ? "" : "thread-";
        int n = snprintf(line, sizeof line, "%ld %s%s %s\n", k, who, call, path);
        if (n > 0)
            syscall(SYS_write, log_fd, line, (size_t)(n < (int)sizeof line ? n : (int)sizeof line - 1));
    }
    if (kill_after > 0 && k == kill_after)
        syscall(SYS_kill, (long)getpid(), SIGKILL);
}

static void fd_step(const char *call, int fd, long result) {
    char path[4096];
    if (result >= 0 && fd_path(fd, path, sizeof path))
        step(call, path);
}

#define REAL(name) static __typeof__(&name) real_##name; if (!real_##name) real_##name = dlsym(RTLD_NEXT, #name)

static int creates(int flags) { return (flags & (O_CREAT | O_TRUNC)) != 0; }

int open(const char *path, int flags, ...) {
    REAL(open);
    va_list ap; va_start(ap, flags); mode_t mode = va_arg(ap, mode_t); va_end(ap);
    int r = real_open(path, flags, mode);
    if (r >= 0 && creates(flags)) fd_step("open", r, r);
    return r;
}

int open64(const char *path, int flags, ...) {
    REAL(open64);
    va_list ap; va_start(ap, flags); mode_t mode = va_arg(ap, mode_t); va_end(ap);
    int r = real_open64(path, flags, mode);
    if (r >= 0 && creates(flags)) fd_step("open", r, r);
    return r;
}

int openat(int at, const char *path, int flags, ...) {
    REAL(openat);
    va_list ap; va_start(ap, flags); mode_t mode = va_arg(ap, mode_t); va_end(ap);
    int r = real_openat(at, path, flags, mode);
    if (r >= 0 && creates(flags)) fd_step("open", r, r);
    return r;
}

int openat64(int at, const char *path, int flags, ...) {
    REAL(openat64);
    va_list ap; va_start(ap, flags); mode_t mode = va_arg(ap, mode_t); va_end(ap);
    int r = real_openat64(at, path, flags, mode);
    if (r >= 0 && creates(flags)) fd_step("open", r, r);
    return r;
}

ssize_t write(int fd, const void *buf, size_t n) {
    REAL(write);
    ssize_t r = real_write(fd, buf, n);
    fd_step("write", fd, r);
    return r;
}

ssize_t pwrite(int fd, const void *buf, size_t n, off_t off) {
    REAL(pwrite);
    ssize_t r = real_pwrite(fd, buf, n, off);
    fd_step("pwrite", fd, r);
    return r;
}

ssize_t pwrite64(int fd, const void *buf, size_t n, off_t off) {
    REAL(pwrite64);
    ssize_t r = real_pwrite64(fd, buf, n, off);
    fd_step("pwrite", fd, r);
    return r;
}

int ftruncate(int fd, off_t len) {
    REAL(ftruncate);
    int r = real_ftruncate(fd, len);
    fd_step("ftruncate", fd, r);
    return r;
}

int ftruncate64(int fd, off_t len) {
    REAL(ftruncate64);
    int r = real_ftruncate64(fd, len);
    fd_step("ftruncate", fd, r);
    return r;
}

int truncate(const char *path, off_t len) {
    REAL(truncate);
    int r = real_truncate(path, len);
    if (r == 0 && under_dir(path)) step("truncate", path);
    return r;
}

int truncate64(const char *path, off_t len) {
    REAL(truncate64);
    int r = real_truncate64(path, len);
    if (r == 0 && under_dir(path)) step("truncate", path);
    return r;
}

int fallocate(int fd, int mode, off_t off, off_t len) {
    REAL(fallocate);
    int r = real_fallocate(fd, mode, off, len);
    fd_step("fallocate", fd, r);
    return r;
}

int fallocate64(int fd, int mode, off_t off, off_t len) {
    REAL(fallocate64);
    int r = real_fallocate64(fd, mode, off, len);
    fd_step("fallocate", fd, r);
    return r;
}

int posix_fallocate(int fd, off_t off, off_t len) {
    REAL(posix_fallocate);
    int r = real_posix_fallocate(fd, off, len);
    fd_step("fallocate", fd, r == 0 ? 0 : -1);
    return r;
}

int posix_fallocate64(int fd, off_t off, off_t len) {
    REAL(posix_fallocate64);
    int r = real_posix_fallocate64(fd, off, len);
    fd_step("fallocate", fd, r == 0 ? 0 : -1);
    return r;
}

int fsync(int fd) {
    REAL(fsync);
    int r = real_fsync(fd);
    fd_step("fsync", fd, r);
    return r;
}

int fdatasync(int fd) {
    REAL(fdatasync);
    int r = real_fdatasync(fd);
    fd_step("fsync", fd, r);
    return r;
}

int rename(const char *from, const char *to) {
    REAL(rename);
    int r = real_rename(from, to);
    if (r == 0 && (under_dir(from) || under_dir(to))) step("rename", to);
    return r;
}

int renameat(int a, const char *from, int b, const char *to) {
    REAL(renameat);
    int r = real_renameat(a, from, b, to);
    if (r == 0 && (under_dir(from) || under_dir(to))) step("rename", to);
    return r;
}

int unlink(const char *path) {
    REAL(unlink);
    int r = real_unlink(path);
    if (r == 0 && under_dir(path)) step("unlink", path);
    return r;
}

int unlinkat(int at, const char *path, int flags) {
    REAL(unlinkat);
    int r = real_unlinkat(at, path, flags);
    if (r == 0 && under_dir(path)) step("unlink", path);
    return r;
}
