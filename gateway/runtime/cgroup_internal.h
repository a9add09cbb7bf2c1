/* runtime/cgroup_internal: what the files of the cgroup module share —
 * small file reads and writes on cgroupfs and the removal of a group
 * tree (cgroup_files.c). Paths are built with sbx_cg_path (cgroup.h).
 * No state.
 */
#ifndef SBX_GATEWAY_RUNTIME_CGROUP_INTERNAL_H
#define SBX_GATEWAY_RUNTIME_CGROUP_INTERNAL_H

#include <stddef.h>
#include <sys/types.h>

#include "common/err.h"
#include "gateway/runtime/cgroup.h"

/* Writes `value` to the file `path` (one write). err may be NULL. */
int sbx_cg_write_file (const char *path, const char *value, err_t *err);
/* Reads up to cap-1 bytes of a small file, NUL-terminated; -1 when it
 * cannot be read. */
ssize_t sbx_cg_read_file (const char *path, char *buf, size_t cap);
/* The number after `key ` in "key value" lines (buf, a file at `path`, or
 * one open at `fd`, read from offset 0: cgroup files are made anew then),
 * or 0. */
long sbx_cg_parse_keyed (const char *buf, const char *key);
long sbx_cg_read_keyed (const char *path, const char *key);
long sbx_cg_pread_keyed (int fd, const char *key);
/* mkdir 0755; an existing directory is fine. */
int sbx_cg_mkdir (const char *path, err_t *err);
/* Removes the group `dir` and, depth first, its sub-groups (at most
 * SBX_CG_TREE_DEPTH levels). 0, or -1 with errno. */
int sbx_cg_rmdir_tree (const char *dir);

/* The deepest sub-group tree the module walks (kill, removal, sums): the
 * gateway makes two levels; deeper ones are not its own. */
#define SBX_CG_TREE_DEPTH 8

#endif
