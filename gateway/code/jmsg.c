/* code/jmsg: see jmsg.h. */
#include "gateway/code/jmsg.h"

#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/core_names.h>
#include <openssl/params.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "common/cleanup.h"

#define DELIM "<IDS|MSG>"

void
jmsg_clear (jmsg_t *m)
{
  json_decref (m->header);
  json_decref (m->parent);
  json_decref (m->metadata);
  json_decref (m->content);
  *m = (jmsg_t){0};
}

void
jmsg_uuid (char out[37])
{
  unsigned char b[16];
  if (RAND_bytes (b, sizeof b) != 1)
    {
      /* Ids, not secrets: a weaker source still makes them unique. */
      struct timespec ts;
      clock_gettime (CLOCK_REALTIME, &ts);
      for (size_t i = 0; i < sizeof b; i++)
        b[i] = (unsigned char) ((ts.tv_nsec >> (i % 8)) ^ rand ());
    }
  b[6] = (unsigned char) ((b[6] & 0x0f) | 0x40);
  b[8] = (unsigned char) ((b[8] & 0x3f) | 0x80);
  snprintf (out, 37, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2], b[3],
            b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

void
jmsg_sign (const char *key, const void *const frames[4], const size_t lens[4], char hex[65])
{
  unsigned char mac[EVP_MAX_MD_SIZE];
  size_t mac_len = 0;
  hex[0] = '\0';
  EVP_MAC *alg = EVP_MAC_fetch (NULL, "HMAC", NULL);
  EVP_MAC_CTX *h = alg ? EVP_MAC_CTX_new (alg) : NULL;
  OSSL_PARAM params[]
      = {OSSL_PARAM_construct_utf8_string ("digest", (char *) "SHA256", 0), OSSL_PARAM_construct_end ()};
  if (h != NULL && EVP_MAC_init (h, (const unsigned char *) key, strlen (key), params) == 1)
    {
      bool ok = true;
      for (int i = 0; i < 4 && ok; i++)
        ok = EVP_MAC_update (h, frames[i], lens[i]) == 1;
      if (!ok || EVP_MAC_final (h, mac, &mac_len, sizeof mac) != 1)
        mac_len = 0;
    }
  EVP_MAC_CTX_free (h);
  EVP_MAC_free (alg);
  for (size_t i = 0; i < mac_len && i < 32; i++)
    snprintf (hex + 2 * i, 3, "%02x", mac[i]);
}

static void
iso_now (char out[40])
{
  struct timespec ts;
  clock_gettime (CLOCK_REALTIME, &ts);
  struct tm tm;
  gmtime_r (&ts.tv_sec, &tm);
  char base[24];
  strftime (base, sizeof base, "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf (out, 40, "%.19s.%06dZ", base, (int) (ts.tv_nsec / 1000) % 1000000);
}

static void
free_str (char **s)
{
  free (*s);
}

int
jmsg_send (void *sock, const char *key, const char *session, const char *msg_type, json_t *content, char id_out[37],
           err_t *err)
{
  char date[40];
  iso_now (date);
  jmsg_uuid (id_out);
  json_t *hdr = json_pack ("{s:s, s:s, s:s, s:s, s:s, s:s}", "msg_id", id_out, "session", session, "username",
                           "sandbox-gateway", "date", date, "msg_type", msg_type, "version", "5.3");
  __attribute__ ((cleanup (free_str))) char *h = hdr ? json_dumps (hdr, JSON_COMPACT) : NULL;
  json_decref (hdr);
  __attribute__ ((cleanup (free_str))) char *c = json_dumps (content, JSON_COMPACT);
  if (h == NULL || c == NULL)
    return err_make (err, ENOMEM, "kernel message `%s`: out of memory", msg_type);
  const void *frames[4] = {h, "{}", "{}", c};
  size_t lens[4] = {strlen (h), 2, 2, strlen (c)};
  char sig[65];
  jmsg_sign (key, frames, lens, sig);
  if (zmq_send (sock, DELIM, strlen (DELIM), ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0
      || zmq_send (sock, sig, strlen (sig), ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0)
    return err_make_sys (err, errno == EAGAIN ? EPIPE : errno, "send `%s` to the kernel", msg_type);
  for (int i = 0; i < 4; i++)
    if (zmq_send (sock, frames[i], lens[i], (i < 3 ? ZMQ_SNDMORE : 0) | ZMQ_DONTWAIT) < 0)
      return err_make_sys (err, errno == EAGAIN ? EPIPE : errno, "send `%s` to the kernel", msg_type);
  return 0;
}

static json_t *
parse_object (const void *data, size_t len)
{
  json_t *j = json_loadb (data, len, JSON_REJECT_DUPLICATES, NULL);
  if (j != NULL && !json_is_object (j))
    {
      json_decref (j);
      return NULL;
    }
  return j;
}

int
jmsg_parse (const char *key, const void *const *frames, const size_t *lens, size_t n, jmsg_t *out, err_t *err)
{
  size_t d = 0;
  while (d < n && !(lens[d] == strlen (DELIM) && memcmp (frames[d], DELIM, lens[d]) == 0))
    d++;
  if (d == n || n - d < 6)
    return err_make (err, EPROTO, "the kernel sent a message that is not a Jupyter message (%zu frames)", n);
  const void *const *f = frames + d + 2;
  const size_t *fl = lens + d + 2;
  char want[65];
  jmsg_sign (key, f, fl, want);
  if (lens[d + 1] != 64 || CRYPTO_memcmp (frames[d + 1], want, 64) != 0)
    return err_make (err, EPROTO, "the kernel sent a message with a wrong signature");
  jmsg_t m = {0};
  m.header = parse_object (f[0], fl[0]);
  m.parent = parse_object (f[1], fl[1]);
  m.metadata = parse_object (f[2], fl[2]);
  m.content = parse_object (f[3], fl[3]);
  m.msg_type = json_string_value (json_object_get (m.header, "msg_type"));
  if (m.header == NULL || m.parent == NULL || m.metadata == NULL || m.content == NULL || m.msg_type == NULL)
    {
      jmsg_clear (&m);
      return err_make (err, EPROTO, "the kernel sent a message whose JSON is not the protocol's");
    }
  m.parent_id = json_string_value (json_object_get (m.parent, "msg_id"));
  if (m.parent_id == NULL)
    m.parent_id = "";
  *out = m;
  return 0;
}

int
jmsg_recv (void *sock, const char *key, jmsg_t *out, err_t *err)
{
  zmq_msg_t parts[JMSG_FRAMES_MAX];
  const void *frames[JMSG_FRAMES_MAX];
  size_t lens[JMSG_FRAMES_MAX];
  size_t n = 0;
  bool too_many = false;
  int more = 1;
  int rc = 0;
  while (more)
    {
      zmq_msg_t scratch, *msg = n < JMSG_FRAMES_MAX ? &parts[n] : &scratch;
      zmq_msg_init (msg);
      if (zmq_msg_recv (msg, sock, ZMQ_DONTWAIT) < 0)
        {
          int e = errno;
          zmq_msg_close (msg);
          if (n == 0 && e == EAGAIN)
            return 0;
          rc = err_make_sys (err, e, "receive from the kernel");
          break;
        }
      more = zmq_msg_more (msg);
      if (msg == &scratch)
        {
          /* The rest of an over-long message is read and dropped. */
          too_many = true;
          zmq_msg_close (msg);
          continue;
        }
      frames[n] = zmq_msg_data (msg);
      lens[n] = zmq_msg_size (msg);
      n++;
    }
  if (rc == 0 && too_many)
    rc = err_make (err, EPROTO, "the kernel sent a message of more than %d frames", JMSG_FRAMES_MAX);
  if (rc == 0)
    rc = jmsg_parse (key, frames, lens, n, out, err);
  for (size_t i = 0; i < n; i++)
    zmq_msg_close (&parts[i]);
  return rc < 0 ? -1 : 1;
}
