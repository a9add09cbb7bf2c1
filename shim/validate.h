/* validate: checks of REST inputs, answering as the reference service does.
 *
 * Validation failures are reported FastAPI-style, since that is what agent
 * backends already parse: a 422 whose "detail" is a list of
 * {"type", "loc", "msg"} objects. Pure functions over their inputs, no
 * state; safe from any thread (and fuzzed).
 */
#ifndef SBX_SHIM_VALIDATE_H
#define SBX_SHIM_VALIDATE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#define SHIM_ID_MAX 64
/* Longest image reference a launch may name. */
#define SHIM_IMAGE_REF_MAX 255
#define SHIM_TIMEOUT_DEFAULT 1800
#define SHIM_TIMEOUT_MAX 3600

/* A validation error list (a JSON array) under construction. */
typedef struct shim_errors_s
{
  json_t *list;
} shim_errors_t;

void shim_errors_init (shim_errors_t *e);
void shim_errors_add (shim_errors_t *e, const char *type, const char *where, const char *field, const char *msg);
bool shim_errors_any (const shim_errors_t *e);
/* {"detail": [...]} — takes the list; the caller owns the result. */
json_t *shim_errors_take (shim_errors_t *e);
void shim_errors_release (shim_errors_t *e);

/* Checks a sandbox id (the pattern and the 64-character limit), adding an
 * error at loc [where, field] when it fails. */
bool shim_check_id (const char *id, const char *where, const char *field, shim_errors_t *e);

/* Decodes standard, padded base64 (`len` a multiple of 4, '=' only as the
 * last one or two characters) into `out` (room for 3 * len / 4 bytes).
 * The decoded length, or -1 when `text` is not such base64. */
long shim_base64_decode (const char *text, size_t len, unsigned char *out);

/* Parses a boolean as pydantic does in lax mode (true/false, 1/0, "yes",
 * "on", ...). 0 ok, -1 not a boolean. */
int shim_parse_bool_text (const char *text, bool *out);

/* Most "env" and "labels" entries a POST /sandboxes body may carry (the
 * gateway's caps: SBX_LAUNCH_ENV_MAX, LBL_MAX); the gateway checks sizes
 * and totals. */
#define SHIM_LAUNCH_ENV_MAX 128
#define SHIM_LAUNCH_LABELS_MAX 64
/* The largest idle_ttl / max_lifetime / resource number a body may carry
 * (a uint32); the gateway's maxima are smaller. */
#define SHIM_SPEC_UINT_MAX 4294967295L

/* POST /sandboxes body. The launch spec's fields are additive: absent, the
 * gateway's defaults. */
typedef struct shim_launch_body_s
{
  char id[SHIM_ID_MAX + 1];
  bool allow_egress;
  /* "image": an OCI reference or "" (absent: the gateway's default). */
  char image[SHIM_IMAGE_REF_MAX + 1];
  /* "resources": {memory_mb, cpus, disk_mb, pids_max}, 0: the default. */
  long memory_mb, disk_mb, pids_max;
  double cpus;
  /* "env", "labels": objects of strings (references owned: release with
   * shim_launch_body_release), NULL when absent. */
  json_t *env, *labels;
  long idle_ttl, max_lifetime; /* seconds, 0: the defaults */
} shim_launch_body_t;
void shim_launch_body_release (shim_launch_body_t *b);

/* Integer member `field` of `root` (of its member `in` when not NULL)
 * into *out (unchanged when absent or null), within [min, max], as
 * pydantic's lax mode takes integers; else an error in `e`. */
void shim_parse_int_member (json_t *root, const char *in, const char *field, long min, long max, long *out,
                            shim_errors_t *e);

/* The launch spec's members of a POST /sandboxes body `root` into *out,
 * errors into `e` (validate_spec.c). */
void shim_parse_launch_spec (json_t *root, shim_launch_body_t *out, shim_errors_t *e);

/* POST /sandboxes/{id}/extend body: {"idle_ttl", "max_lifetime"} in
 * seconds, at least one of them. */
typedef struct shim_extend_body_s
{
  long idle_ttl, max_lifetime;
} shim_extend_body_t;
bool shim_parse_extend (const char *content_type, const char *body, size_t len, shim_extend_body_t *out,
                        shim_errors_t *e);

/* GET /sandboxes?labels=<selector>: a label selector as the gateway takes
 * it (common/labels.h); false with the error in `e`. */
bool shim_check_selector (const char *selector, shim_errors_t *e);

/* POST /sandboxes/{id}/exec body; every pointer owned (free with
 * shim_exec_body_release). Beyond the contract's argv and timeout, the
 * optional "cwd" (absolute), "env" (names as the gateway takes them: not
 * empty, no '=') and "stdin_b64" (standard base64, padded; bounded by the
 * JSON body cap). */
typedef struct shim_exec_body_s
{
  char **argv;
  size_t argc;
  long timeout;
  char *cwd; /* NULL: the gateway's default */
  char **env_keys, **env_values;
  size_t n_env;
  unsigned char *stdin_data; /* NULL: no input */
  size_t stdin_len;
} shim_exec_body_t;

/* Parses and validates a JSON body. `content_type` may be NULL (taken as
 * JSON). Returns true when valid; otherwise fills `e`. */
bool shim_parse_launch (const char *content_type, const char *body, size_t len, shim_launch_body_t *out,
                        shim_errors_t *e);
bool shim_parse_exec (const char *content_type, const char *body, size_t len, shim_exec_body_t *out,
                      shim_errors_t *e);
void shim_exec_body_release (shim_exec_body_t *b);

/* POST /sandboxes/{id}/processes body; every pointer owned (free with
 * shim_process_body_release). */
typedef struct shim_process_body_s
{
  char **argv;
  size_t argc;
  char **env_keys, **env_values;
  size_t n_env;
  char *cwd;                        /* NULL: the gateway's default */
  long timeout;                     /* seconds, 0 (the default): none; at most SHIM_TIMEOUT_MAX */
  unsigned rows, cols;              /* both 0: no terminal */
  char process_id[SHIM_ID_MAX + 1]; /* "": the gateway names it */
} shim_process_body_t;

bool shim_parse_process (const char *content_type, const char *body, size_t len, shim_process_body_t *out,
                         shim_errors_t *e);
void shim_process_body_release (shim_process_body_t *b);

/* The highest signal number (SIGRTMAX on Linux). */
#define SHIM_SIGNAL_MAX 64

/* A signal's number from its name ("SIGTERM", "term": the SIG prefix is
 * optional, case does not matter), or -1. */
int shim_signal_number (const char *name);

/* POST .../processes/{pid}/signal body: {"signal": a name or a number from
 * 1 to SHIM_SIGNAL_MAX}. */
bool shim_parse_signal (const char *content_type, const char *body, size_t len, int *sig, shim_errors_t *e);

/* POST .../processes/{pid}/resize body: {"rows", "cols"}, each 1..65535. */
bool shim_parse_resize (const char *content_type, const char *body, size_t len, unsigned *rows, unsigned *cols,
                        shim_errors_t *e);

#endif
