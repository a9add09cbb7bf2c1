/* code/jmsg: the Jupyter messaging protocol's wire format (v5) over ZMQ
 * sockets — signing and sending a message, receiving one with every frame
 * size-bounded and its HMAC-SHA256 signature verified before any of it is
 * parsed.
 *
 * A message on the wire is: routing identities, "<IDS|MSG>", the hex
 * signature, then four JSON frames (header, parent_header, metadata,
 * content) and optional binary buffers (ignored here). The signature is
 * HMAC-SHA256, keyed by the connection file's key, over the four JSON
 * frames.
 *
 * Threading: none of its own; a socket is used by one thread at a time.
 */
#ifndef SBX_GATEWAY_CODE_JMSG_H
#define SBX_GATEWAY_CODE_JMSG_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "common/err.h"

/* The largest frame the gateway accepts from a kernel (ZMQ_MAXMSGSIZE: a
 * bigger one drops the connection for good, which code_kernel_links
 * notices): a 1-megapixel PNG in base64 fits. */
#define JMSG_FRAME_MAX (8 * 1024 * 1024)
/* The most frames of one message (identities and buffers included). */
#define JMSG_FRAMES_MAX 32
/* The key's most bytes (a hex UUID has 32 or 36). */
#define JMSG_KEY_MAX 128

typedef struct jmsg_s
{
  json_t *header, *parent, *metadata, *content;
  const char *msg_type;  /* in header */
  const char *parent_id; /* parent_header.msg_id, "" when none */
} jmsg_t;

void jmsg_clear (jmsg_t *m);

/* HMAC-SHA256 of the four frames as 64 lowercase hex digits into hex[65]. */
void jmsg_sign (const char *key, const void *const frames[4], const size_t lens[4], char hex[65]);

/* Sends a message of `msg_type` with `content` (borrowed) on `sock`, its
 * session `session`; the new msg_id into id_out[37]. */
int jmsg_send (void *sock, const char *key, const char *session, const char *msg_type, json_t *content,
               char id_out[37], err_t *err);

/* Receives one message without waiting (the caller polled): 1 with *out,
 * 0 when none is there, -1 with *err — EPROTO (INTERNAL at the edge) for
 * a wrong signature or a message that is not the protocol's (too many
 * frames, no delimiter, JSON that does not parse or is not an object, no
 * msg_type).
 * A message that fails is consumed whole. */
int jmsg_recv (void *sock, const char *key, jmsg_t *out, err_t *err);

/* Checks and parses a received message's frames (the part of jmsg_recv
 * that needs no socket; unit-tested). */
int jmsg_parse (const char *key, const void *const *frames, const size_t *lens, size_t n, jmsg_t *out, err_t *err);

/* A random version-4 UUID, as text, into out[37]. */
void jmsg_uuid (char out[37]);

#endif
