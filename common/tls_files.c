/* tls_files: start-up checks of TLS PEM files (see tls_files.h). */
#include "common/tls_files.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/cleanup.h"

/* Larger than any certificate chain or key; gRPC's reader has the same cap. */
#define PEM_MAX_BYTES (1024 * 1024)

/* Reads `path` (the value of `var`) into a memory BIO. */
static int
read_file (const char *var, const char *path, BIO **out, err_t *err)
{
  cleanup_close int fd = open (path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return err_make_sys (err, errno, "%s: open `%s`", var, path);
  struct stat st;
  if (fstat (fd, &st) < 0)
    return err_make_sys (err, errno, "%s: stat `%s`", var, path);
  if (!S_ISREG (st.st_mode))
    return err_make (err, EINVAL, "%s: `%s` is not a regular file", var, path);
  if (st.st_size > PEM_MAX_BYTES)
    return err_make (err, EFBIG, "%s: `%s` is larger than %d bytes: not a PEM file", var, path, PEM_MAX_BYTES);
  cleanup_free char *buf = malloc ((size_t) st.st_size + 1);
  if (buf == NULL)
    return err_make (err, ENOMEM, "%s: out of memory", var);
  size_t off = 0;
  while (off < (size_t) st.st_size)
    {
      ssize_t r = TEMP_FAILURE_RETRY (read (fd, buf + off, (size_t) st.st_size - off));
      if (r < 0)
        return err_make_sys (err, errno, "%s: read `%s`", var, path);
      if (r == 0)
        break;
      off += (size_t) r;
    }
  BIO *bio = BIO_new (BIO_s_mem ());
  if (bio == NULL || BIO_write (bio, buf, (int) off) != (int) off)
    {
      BIO_free (bio);
      return err_make (err, ENOMEM, "%s: out of memory", var);
    }
  *out = bio;
  return 0;
}

/* The first certificate of `path`, or NULL with *err set. */
static X509 *
load_cert (const char *var, const char *path, err_t *err)
{
  BIO *bio = NULL;
  if (read_file (var, path, &bio, err) < 0)
    return NULL;
  X509 *cert = PEM_read_bio_X509 (bio, NULL, NULL, NULL);
  BIO_free (bio);
  ERR_clear_error ();
  if (cert == NULL)
    err_make (err, EINVAL, "%s: `%s` holds no PEM certificate", var, path);
  return cert;
}

int
tls_files_check (const tls_files_t *f, err_t *err)
{
  X509 *cert = NULL;
  EVP_PKEY *key = NULL;
  int rc = 0;
  if (f->cert != NULL && (cert = load_cert (f->cert_var, f->cert, err)) == NULL)
    rc = -1;
  if (rc == 0 && f->key != NULL)
    {
      BIO *bio = NULL;
      rc = read_file (f->key_var, f->key, &bio, err);
      if (rc == 0)
        {
          /* No passphrase callback: an encrypted key fails here, as it would in gRPC. */
          key = PEM_read_bio_PrivateKey (bio, NULL, NULL, (void *) "");
          BIO_free (bio);
          ERR_clear_error ();
          if (key == NULL)
            rc = err_make (err, EINVAL, "%s: `%s` holds no unencrypted PEM private key", f->key_var, f->key);
        }
    }
  if (rc == 0 && cert != NULL && key != NULL && X509_check_private_key (cert, key) != 1)
    {
      ERR_clear_error ();
      rc = err_make (err, EINVAL, "%s: `%s` is not the key of the certificate in %s `%s`", f->key_var, f->key,
                     f->cert_var, f->cert);
    }
  if (rc == 0 && f->ca != NULL)
    {
      X509 *ca = load_cert (f->ca_var, f->ca, err);
      if (ca == NULL)
        rc = -1;
      X509_free (ca);
    }
  X509_free (cert);
  EVP_PKEY_free (key);
  return rc;
}
