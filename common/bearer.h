/* bearer: checking "Authorization: Bearer <secret>" values.
 *
 * Both programs guard their APIs with a shared secret. The comparison runs
 * in constant time with respect to the contents of both strings (each is
 * hashed with SHA-256 and the digests compared with CRYPTO_memcmp), so the
 * time taken reveals neither the secret nor how much of it a guess matched.
 * No state; thread-safe.
 */
#ifndef SBX_COMMON_BEARER_H
#define SBX_COMMON_BEARER_H

#include <stdbool.h>

/* True when `header` is "Bearer <token>" (scheme case-insensitive, one or
 * more spaces) and <token> equals `secret`. False for a NULL or empty
 * secret: an unset secret never matches anything. */
bool bearer_matches (const char *header, const char *secret);

#endif
