/* Files: whole-file reads, read-only mappings, atomic writes. */
#ifndef AG_BASE_FILE_H
#define AG_BASE_FILE_H

#include <stddef.h>

#include "base/status.h"

/* Reads all of `path` into a fresh heap buffer (NUL-terminated, the NUL not
 * counted in *len). The caller frees *out. */
ag_status ag_file_read_all(const char *path, char **out, size_t *len);

/* A read-only, private mapping of a whole file. */
typedef struct {
    const void *data; /* NULL for an empty file */
    size_t      size;
} ag_mapped_file;

ag_status ag_file_map(const char *path, ag_mapped_file *out);
void      ag_file_unmap(ag_mapped_file *m); /* safe on a zeroed struct */

/* Writes `len` bytes to `path` atomically: a temp file in the same folder,
 * fsync, rename, fsync of the folder. On failure `path` is untouched and the
 * temp file is removed. */
ag_status ag_file_write_atomic(const char *path, const void *data, size_t len);

#endif
