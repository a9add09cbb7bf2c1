/* router: matching a request's method and path against a route table.
 * Pure functions over caller buffers (the fuzzer drives them too).
 */
#ifndef SBX_SHIM_ROUTER_H
#define SBX_SHIM_ROUTER_H

#include <stdbool.h>
#include <stddef.h>

#include "shim/shim.h"

/* Matches `url` against a route template with at most one "{id}" component
 * ("/sandboxes/{id}/exec"). On a match the component is copied into `id`
 * (`id_cap` bytes, truncated and *id_too_long set when it does not fit: the
 * length check is left to validation); a template without "{id}" matches
 * only the same string and leaves `id` and *id_too_long alone. An empty
 * component does not match. `id_cap` must be at least 1. */
bool shim_match_path (const char *tmpl, const char *url, char *id, size_t id_cap, bool *id_too_long);

/* shim_match_path for templates that may also hold a "{pid}" or "{port}"
 * component after "{id}" ("/sandboxes/{id}/processes/{pid}"), copied into
 * `pid` (`cap` bytes too; *too_long when either was cut), and end in "{*}",
 * which matches the rest of the path (any components, or none; not
 * copied: a route reads it from the request). A template with "{pid}" or
 * "{port}" never matches when `pid` is NULL. */
bool shim_match_path2 (const char *tmpl, const char *url, char *id, char *pid, size_t cap, bool *too_long);

/* The route of `table` for `method` (a route's method "*" takes any) and `url`, with the path's id copied
 * to id and its process id (if any) to pid (SHIM_ID_MAX + 1 bytes each;
 * cut, with *id_too_long, when longer).
 * NULL when none matches; *path_known then says whether another method
 * would have matched (405 rather than 404). */
const shim_route_t *shim_route_find (const shim_route_t *table, size_t n, const char *url, const char *method,
                                     char *id, char *pid, bool *path_known, bool *id_too_long);

#endif
