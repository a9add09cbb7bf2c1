/* snapshot/record: the image record beside a stored snapshot (see
 * record.h). No state. */
#include "gateway/snapshot/record.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cleanup.h"

static char *
record_name (const char *object)
{
  char *name = NULL;
  return asprintf (&name, "%s.image", object) < 0 ? NULL : name;
}

static bool
digest_valid (const char *d)
{
  if (strncmp (d, "sha256:", 7) != 0 || strlen (d) != 7 + 64)
    return false;
  for (const char *p = d + 7; *p != '\0'; p++)
    if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
      return false;
  return true;
}

int
snap_record_remove (snap_store_t *store, const char *object, err_t *err)
{
  cleanup_free char *name = record_name (object);
  if (name == NULL)
    return err_make (err, ENOMEM, "out of memory");
  if (store->ops->remove (store, name, err) < 0)
    {
      if (err->status != ENOENT)
        return -1;
      err_release (err);
    }
  return 0;
}

int
snap_record_put (snap_store_t *store, const char *object, const sbx_info_t *info, err_t *err)
{
  if (info->image_digest[0] == '\0')
    return snap_record_remove (store, object, err);
  cleanup_free char *name = record_name (object);
  json_t *j = json_pack ("{s:s, s:s}", "ref", info->image, "digest", info->image_digest);
  cleanup_free char *text = j != NULL ? json_dumps (j, JSON_COMPACT) : NULL;
  json_decref (j);
  if (name == NULL || text == NULL)
    return err_make (err, ENOMEM, "out of memory");
  snap_writer_t *w = NULL;
  if (store->ops->writer_open (store, name, &w, err) < 0)
    return err_wrap (err, "the image record `%s`", name);
  if (store->ops->writer_write (w, (const uint8_t *) text, strlen (text), err) < 0)
    {
      store->ops->writer_abort (w);
      return err_wrap (err, "the image record `%s`", name);
    }
  if (store->ops->writer_commit (w, err) < 0)
    return err_wrap (err, "the image record `%s`", name);
  return 0;
}

/* Reads all of `name` (at most SNAP_RECORD_MAX bytes) into buf. */
static int
read_small (snap_store_t *store, const char *name, char buf[SNAP_RECORD_MAX + 1], err_t *err)
{
  snap_reader_t *r = NULL;
  if (store->ops->reader_open (store, name, &r, err) < 0)
    return -1;
  size_t len = 0;
  int rc = 0;
  for (;;)
    {
      ssize_t got = store->ops->reader_read (r, (uint8_t *) buf + len, SNAP_RECORD_MAX + 1 - len, err);
      if (got < 0)
        rc = -1;
      if (got <= 0)
        break;
      len += (size_t) got;
      if (len > SNAP_RECORD_MAX)
        {
          rc = err_make (err, EBADMSG, "the image record `%s` is over %d bytes", name, SNAP_RECORD_MAX);
          break;
        }
    }
  store->ops->reader_close (r);
  buf[len <= SNAP_RECORD_MAX ? len : SNAP_RECORD_MAX] = '\0';
  return rc;
}

int
snap_record_get (snap_store_t *store, const char *object, snap_record_t *out, err_t *err)
{
  *out = (snap_record_t){{0}};
  cleanup_free char *name = record_name (object);
  if (name == NULL)
    return err_make (err, ENOMEM, "out of memory");
  char buf[SNAP_RECORD_MAX + 1];
  if (read_small (store, name, buf, err) < 0)
    {
      if (err->status != ENOENT)
        return -1;
      err_release (err);
      return 0;
    }
  json_t *j = json_loads (buf, 0, NULL);
  const char *ref = json_string_value (json_object_get (j, "ref"));
  const char *digest = json_string_value (json_object_get (j, "digest"));
  int rc = 1;
  if (ref == NULL || digest == NULL || strlen (ref) == 0 || strlen (ref) > SBX_IMAGE_REF_MAX
      || !digest_valid (digest))
    rc = err_make (err, EBADMSG, "the image record `%s` is not {\"ref\", \"digest\"} with a sha256 digest", name);
  else
    {
      snprintf (out->ref, sizeof out->ref, "%s", ref);
      snprintf (out->digest, sizeof out->digest, "%s", digest);
    }
  json_decref (j);
  return rc;
}
