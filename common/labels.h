/* labels: Kubernetes-style labels and equality-based label selectors.
 *
 * Owns the syntax only: whether a key or a value is a valid label, whether
 * a set of labels stays within the caps, parsing a selector
 * (`k=v,k2!=v2,k3,!k4`) and matching it against a set of labels. Holds no
 * labels itself (the runtime keeps a sandbox's, the shim passes selectors
 * through). Pure: no I/O, no state, no allocation; any thread.
 *
 * Syntax (as Kubernetes):
 *   key   = [prefix "/"] name
 *   prefix: a DNS subdomain, at most LBL_PREFIX_MAX characters, lowercase
 *           [a-z0-9] labels of at most 63 joined by '.', '-' inside a label
 *   name  : at most LBL_NAME_MAX characters, [A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?
 *   value : empty, or as name
 *
 * Selector: requirements separated by ',', spaces around tokens ignored;
 * each is `k=v`, `k==v`, `k!=v` (true also when k is absent), `k` (k is
 * present) or `!k` (k is absent). Set-based forms (`in`, `notin`) are
 * refused as malformed. An empty selector matches everything.
 */
#ifndef SBX_COMMON_LABELS_H
#define SBX_COMMON_LABELS_H

#include <stdbool.h>
#include <stddef.h>

#include "common/err.h"

/* Most labels one sandbox may have. */
#define LBL_MAX 64
/* Longest label name (the key's part after the prefix) and value. */
#define LBL_NAME_MAX 63
#define LBL_VALUE_MAX 63
/* Longest key prefix (a DNS subdomain). */
#define LBL_PREFIX_MAX 253
/* Longest key: prefix, '/', name. */
#define LBL_KEY_MAX (LBL_PREFIX_MAX + 1 + LBL_NAME_MAX)
/* Longest selector, in bytes, and most requirements in one. */
#define LBL_SELECTOR_MAX 4096
#define LBL_SELECTOR_REQS 64

/* Whether `key` is a valid label key; when not, *why (may be NULL) says why
 * (a static string). */
bool lbl_key_valid (const char *key, const char **why);
/* Whether `value` is a valid label value (empty is). */
bool lbl_value_valid (const char *value);

/* Checks a whole set (n pairs): the count (LBL_MAX), each key and value.
 * EINVAL naming the first bad one (its text quoted, cut to 80 bytes). Keys
 * of a map are distinct by construction; a repeated key is refused too. */
int lbl_check (const char *const *keys, const char *const *values, size_t n, err_t *err);

typedef enum lbl_op_e
{
  LBL_OP_EQ,     /* k=v, k==v */
  LBL_OP_NE,     /* k!=v */
  LBL_OP_EXISTS, /* k */
  LBL_OP_ABSENT, /* !k */
} lbl_op_t;

typedef struct lbl_req_s
{
  lbl_op_t op;
  char key[LBL_KEY_MAX + 1];
  char value[LBL_VALUE_MAX + 1];
} lbl_req_t;

typedef struct lbl_selector_s
{
  size_t n;
  lbl_req_t reqs[LBL_SELECTOR_REQS];
} lbl_selector_t;

/* Parses `text` (NULL or "" : the empty selector) into *out. EINVAL
 * naming what is malformed: a bad key or value, a missing key, an
 * operator without a value, a set-based form, more than LBL_SELECTOR_REQS
 * requirements or LBL_SELECTOR_MAX bytes. */
int lbl_selector_parse (const char *text, lbl_selector_t *out, err_t *err);

/* Whether labels `kv` ("key=value" strings, NULL-terminated; NULL: none)
 * satisfy every requirement of `sel`. */
bool lbl_selector_matches (const lbl_selector_t *sel, const char *const *kv);

#endif
