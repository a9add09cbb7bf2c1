/* log: structured logs, one JSON object per line on stderr.
 *
 * Every line carries "severity" (DEBUG, INFO, WARNING, ERROR: the Cloud
 * Logging convention), "message", "time" (RFC 3339, UTC) and "program", plus
 * any fields the caller adds. Lines below the configured level are dropped.
 * Never log secrets: callers pass only what may be read by operators.
 *
 * Thread safety: every function may be called from any thread; a line is
 * written with a single write(2) under a mutex, so lines never interleave.
 */
#ifndef SBX_COMMON_LOG_H
#define SBX_COMMON_LOG_H

#include <jansson.h>

#include "common/err.h"

typedef enum log_level_e
{
  SEV_DEBUG = 0,
  SEV_INFO = 1,
  SEV_WARNING = 2,
  SEV_ERROR = 3,
} log_level_t;

/* Sets the program name written in every line (not copied; keep it static). */
void log_set_program (const char *program);

/* Sets the lowest level written. */
void log_set_level (log_level_t level);

/* Parses "debug", "info", "warning" or "error" (any case). 0 ok, -1 bad. */
int log_parse_level (const char *text, log_level_t *level);

/* True when a line at `level` would be written. */
int log_enabled (log_level_t level);

/* Writes a line with the formatted message. */
void log_msg (log_level_t level, const char *fmt, ...) __attribute__ ((format (printf, 2, 3)));

/* Writes a line with the formatted message and the members of `fields` (a
 * JSON object, may be NULL). Takes ownership of `fields`. */
/* For best-effort steps: when *err holds an error, logs "<context>:
 * <message of err>" as a warning; then releases *err (crun's crun_error_write_warning_and_release). */
void err_warn_release (err_t *err, const char *fmt, ...) __attribute__ ((format (printf, 2, 3)));

void log_fields (log_level_t level, json_t *fields, const char *fmt, ...) __attribute__ ((format (printf, 3, 4)));

#endif
