/* validate_internal: the field parsers validate.c shares with
 * validate_routes.c; nothing outside the validate library sees them. Each
 * adds its errors to `e` (loc ["body", ...]) and leaves its output as it
 * was on a missing field. Pure; any thread. */
#ifndef SBX_SHIM_VALIDATE_INTERNAL_H
#define SBX_SHIM_VALIDATE_INTERNAL_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "shim/validate.h"

/* The body as a JSON object (the caller's reference), or NULL with the
 * error FastAPI gives. */
json_t *shim_parse_object (const char *content_type, const char *body, size_t len, shim_errors_t *e);
/* A boolean as pydantic takes it in lax mode; false when `v` is none. */
bool shim_lax_bool (json_t *v, bool *out);
/* An integer as pydantic takes it in lax mode; false when `v` is none. */
bool shim_lax_int (json_t *v, long *out);
/* Adds an error at loc ["body", field, sub]. */
void shim_errors_add_in (shim_errors_t *e, const char *type, const char *field, const char *sub, const char *msg);
/* Integer member `field` of `root` (of its member `in` when not NULL)
 * within [min, max] into *out. */
void shim_parse_int_field (json_t *root, const char *in, const char *field, long min, long max, long *out,
                           shim_errors_t *e);
/* "argv": *out owned by the caller (NULL ended, *n_out strings), freed
 * with shim_free_command. */
void shim_parse_argv (json_t *root, char ***out, size_t *n_out, shim_errors_t *e);
/* "env": *keys and *values owned by the caller (*n_out of each), freed
 * with shim_free_command; with `check_names`, names the gateway refuses
 * are errors. */
void shim_parse_env (json_t *root, bool check_names, char ***keys, char ***values, size_t *n_out, shim_errors_t *e);
/* Frees what shim_parse_argv and shim_parse_env made (any may be NULL). */
void shim_free_command (char **argv, size_t argc, char **keys, char **values, size_t n_env);

#endif
