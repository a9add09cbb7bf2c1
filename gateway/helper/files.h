/* helper/files: what the files of the file API's child share (files.c: the
 * child and the operations on single files; files_list.c: listing;
 * watch.c: watching). The child runs inside the sandbox and answers in
 * frames on its stream socket (wire.h). Single-threaded. */
#ifndef SBX_GATEWAY_HELPER_FILES_H
#define SBX_GATEWAY_HELPER_FILES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#include "gateway/helper/confine.h"
#include "gateway/runtime/wire.h"

/* The stream socket to the gateway. */
extern int file_sock;

/* One frame of up to three parts. 0, or -1 when the gateway has gone. */
int file_send (uint32_t kind, const void *a, size_t alen, const void *b, size_t blen, const void *c, size_t clen);
/* An ERROR frame; returns -1. */
int file_send_error (int status, const char *fmt, ...) __attribute__ ((format (printf, 2, 3)));
/* An INFO frame describing `path` (target: a symlink's, else NULL). */
int file_send_info (const char *path, const struct stat *st, const char *target);

/* files_list.c: INFO for every entry of directory `path` down to `depth`
 * levels (1: its own entries), breadth first, names sorted, then END;
 * the first `skip` entries (earlier pages) are not sent. */
int file_op_list (const char *path, uint32_t depth, uint64_t skip);

/* watch.c: EVENT frames for changes under `path` (SBX_FILE_F_RECURSIVE: in
 * its whole tree, at most `limit` directories) until the gateway closes the
 * stream. */
int file_op_watch (const char *path, uint32_t flags, uint32_t limit);

/* The child: performs the request in buf (its descriptors: stream, report,
 * cgroup.procs) and exits. */
void helper_file_child (const sbx_confine_t *confine, char *buf, size_t len, const int *fds)
    __attribute__ ((noreturn));

#endif
