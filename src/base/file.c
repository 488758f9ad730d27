#include "base/file.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

ag_status ag_file_read_all(const char *path, char **out, size_t *len) {
    *out = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return ag_errorf(AG_ERR_IO, "%s: %s", path, strerror(errno));
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    if (!buf) {
        fclose(f);
        return ag_errorf(AG_ERR_NOMEM, "%s: out of memory", path);
    }
    for (;;) {
        if (cap - n < 2) {
            char *p = realloc(buf, cap * 2);
            if (!p) {
                free(buf);
                fclose(f);
                return ag_errorf(AG_ERR_NOMEM, "%s: out of memory", path);
            }
            buf = p;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0) break;
    }
    int err = ferror(f);
    fclose(f);
    if (err) {
        free(buf);
        return ag_errorf(AG_ERR_IO, "%s: read error", path);
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return AG_OK;
}

ag_status ag_file_map(const char *path, ag_mapped_file *out) {
    out->data = NULL;
    out->size = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ag_errorf(AG_ERR_IO, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return ag_errorf(AG_ERR_IO, "%s: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return ag_errorf(AG_ERR_IO, "%s: not a regular file", path);
    }
    if (st.st_size > 0) {
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            return ag_errorf(AG_ERR_IO, "%s: mmap: %s", path, strerror(e));
        }
        out->data = p;
        out->size = (size_t)st.st_size;
    }
    close(fd);
    return AG_OK;
}

void ag_file_unmap(ag_mapped_file *m) {
    if (m->data) munmap((void *)m->data, m->size);
    m->data = NULL;
    m->size = 0;
}

ag_status ag_file_write_atomic(const char *path, const void *data, size_t len) {
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 32);
    char *dir = strdup(path);
    if (!tmp || !dir) {
        free(tmp);
        free(dir);
        return ag_errorf(AG_ERR_NOMEM, "out of memory");
    }
    snprintf(tmp, plen + 32, "%s.tmp.XXXXXX", path);
    int fd = mkstemp(tmp);
    ag_status st = AG_OK;
    if (fd < 0) {
        st = ag_errorf(AG_ERR_IO, "%s: %s", tmp, strerror(errno));
        goto done;
    }
    const char *p = data;
    size_t left = len;
    while (left) {
        ssize_t w = write(fd, p, left);
        if (w < 0) {
            if (errno == EINTR) continue;
            st = ag_errorf(AG_ERR_IO, "%s: write: %s", tmp, strerror(errno));
            break;
        }
        p += w;
        left -= (size_t)w;
    }
    if (!st && fsync(fd) != 0) st = ag_errorf(AG_ERR_IO, "%s: fsync: %s", tmp, strerror(errno));
    if (close(fd) != 0 && !st) st = ag_errorf(AG_ERR_IO, "%s: close: %s", tmp, strerror(errno));
    if (!st && rename(tmp, path) != 0) st = ag_errorf(AG_ERR_IO, "%s: rename: %s", path, strerror(errno));
    if (st) {
        unlink(tmp);
        goto done;
    }
    int dfd = open(dirname(dir), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
done:
    free(tmp);
    free(dir);
    return st;
}
