/* tls_files: checks, at start-up, the PEM files one end of a TLS hop is
 * configured with, so that a wrong file is refused under the name of its
 * variable instead of surfacing later as a listen or connect failure (gRPC
 * reads them only when it builds its credentials, and says little).
 *
 * Each file must be a readable regular file (at most 1 MiB) that OpenSSL
 * parses: a certificate chain, a private key, CA certificates; a key must
 * match its certificate. No state; thread-safe.
 */
#ifndef SBX_COMMON_TLS_FILES_H
#define SBX_COMMON_TLS_FILES_H

#include "common/err.h"

/* The files of one end, each with the variable it came from; a NULL path is
 * not configured and not checked. All borrowed. */
typedef struct tls_files_s
{
  const char *cert_var, *cert; /* PEM certificate chain */
  const char *key_var, *key;   /* PEM private key of cert */
  const char *ca_var, *ca;     /* PEM CA bundle */
} tls_files_t;

/* 0 when every configured file is usable; -1 with *err naming the variable
 * and the path. */
int tls_files_check (const tls_files_t *files, err_t *err);

#endif
