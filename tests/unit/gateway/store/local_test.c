/* local_test: the local-directory snapshot store (gateway/store/local.c)
 * through the store interface, and object names (snap_object_name): write,
 * commit and read back; abort leaves nothing; nothing is visible before
 * commit; exists and remove (ENOENT); prefixes with '/' become directories;
 * absolute and ".." object names refused; temporary files a crash left are
 * removed when the store opens (only once stale).
 *
 * Each test gets a fresh mkdtemp directory, removed afterwards.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/cleanup.h"
#include "common/err.h"
#include "gateway/store/local.h"
#include "gateway/store/store.h"

/* ---- fixture -------------------------------------------------------------- */

typedef struct fixture_s
{
  char dir[PATH_MAX]; /* the test's directory */
  char *store_dir;    /* dir/store: the store's (made by the store) */
  snap_store_t *store;
} fixture_t;

static int
remove_entry (const char *path, const struct stat *st, int type, struct FTW *ftw)
{
  return remove (path) < 0 && errno != ENOENT ? -1 : 0;
}

static char *
fmt (const char *format, ...)
{
  va_list ap;
  va_start (ap, format);
  char *out = NULL;
  int n = vasprintf (&out, format, ap);
  va_end (ap);
  assert_true (n >= 0);
  return out;
}

static int
setup (void **state)
{
  fixture_t *f = calloc (1, sizeof *f);
  if (f == NULL)
    return -1;
  const char *tmp = getenv ("TEST_TMPDIR");
  snprintf (f->dir, sizeof f->dir, "%s/local_test.XXXXXX", tmp != NULL && tmp[0] != '\0' ? tmp : "/tmp");
  if (mkdtemp (f->dir) == NULL)
    return -1;
  if (asprintf (&f->store_dir, "%s/store", f->dir) < 0)
    return -1;
  *state = f;
  return 0;
}

static int
teardown (void **state)
{
  fixture_t *f = *state;
  if (f->store != NULL)
    f->store->ops->destroy (f->store);
  int rc = nftw (f->dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  free (f->store_dir);
  free (f);
  return rc == 0 ? 0 : -1;
}

/* Opens the fixture's store with `prefix`. */
static snap_store_t *
open_store (fixture_t *f, const char *prefix)
{
  err_t err = ERR_INIT;
  if (snap_store_local_new (f->store_dir, prefix, &f->store, &err) < 0)
    fail_msg ("snap_store_local_new: %s", err_msg (&err));
  assert_string_equal (f->store->kind, "local");
  return f->store;
}

static void
write_object (snap_store_t *s, const char *object, const void *data, size_t len)
{
  err_t err = ERR_INIT;
  snap_writer_t *w = NULL;
  if (s->ops->writer_open (s, object, &w, &err) < 0)
    fail_msg ("writer_open `%s`: %s", object, err_msg (&err));
  /* In two pieces, so appends are exercised. */
  size_t half = len / 2;
  assert_int_equal (s->ops->writer_write (w, data, half, &err), 0);
  assert_int_equal (s->ops->writer_write (w, (const uint8_t *) data + half, len - half, &err), 0);
  if (s->ops->writer_commit (w, &err) < 0)
    fail_msg ("writer_commit `%s`: %s", object, err_msg (&err));
}

/* Reads an object whole (caller frees), with a small buffer so reads loop. */
static uint8_t *
read_object (snap_store_t *s, const char *object, size_t *len)
{
  err_t err = ERR_INIT;
  snap_reader_t *r = NULL;
  if (s->ops->reader_open (s, object, &r, &err) < 0)
    fail_msg ("reader_open `%s`: %s", object, err_msg (&err));
  size_t cap = 16, n = 0;
  uint8_t *buf = malloc (cap);
  assert_non_null (buf);
  for (;;)
    {
      if (cap - n < 7)
        {
          cap *= 2;
          buf = realloc (buf, cap);
          assert_non_null (buf);
        }
      ssize_t got = s->ops->reader_read (r, buf + n, 7, &err);
      assert_true (got >= 0);
      if (got == 0)
        break;
      n += (size_t) got;
    }
  s->ops->reader_close (r);
  *len = n;
  return buf;
}

/* The names in `dir` (not . and ..), sorted and joined by spaces; caller frees. */
static char *
listing (const char *dir)
{
  struct dirent **names = NULL;
  int n = scandir (dir, &names, NULL, alphasort);
  assert_true (n >= 0);
  char *out = fmt ("%s", "");
  for (int i = 0; i < n; i++)
    {
      if (strcmp (names[i]->d_name, ".") != 0 && strcmp (names[i]->d_name, "..") != 0)
        {
          char *longer = fmt ("%s%s%s", out, out[0] ? " " : "", names[i]->d_name);
          free (out);
          out = longer;
        }
      free (names[i]);
    }
  free (names);
  return out;
}

/* ---- object names --------------------------------------------------------- */

static void
test_object_name_is_prefix_id_dot_tar (void **state)
{
  snap_store_t s = {.prefix = (char *) "sandbox-snapshots/"};
  cleanup_free char *name = snap_object_name (&s, "abc-1");
  assert_string_equal (name, "sandbox-snapshots/abc-1.tar");

  snap_store_t bare = {.prefix = (char *) ""};
  cleanup_free char *plain = snap_object_name (&bare, "x");
  assert_string_equal (plain, "x.tar");

  fixture_t *f = *state;
  snap_store_t *local = open_store (f, "tenant/a/");
  cleanup_free char *nested = snap_object_name (local, "sbx");
  assert_string_equal (nested, "tenant/a/sbx.tar");
}

/* ---- write, read, abort ----------------------------------------------------- */

static void
test_committed_object_reads_back_byte_for_byte (void **state)
{
  fixture_t *f = *state;
  snap_store_t *s = open_store (f, "sandbox-snapshots/");
  uint8_t data[1000];
  for (size_t i = 0; i < sizeof data; i++)
    data[i] = (uint8_t) (i * 7 + 3);
  cleanup_free char *object = snap_object_name (s, "one");
  write_object (s, object, data, sizeof data);

  size_t len = 0;
  cleanup_free uint8_t *back = read_object (s, object, &len);
  assert_int_equal (len, sizeof data);
  assert_memory_equal (back, data, sizeof data);

  /* On disk: the file under its name, nothing else beside it. */
  cleanup_free char *in_prefix = fmt ("%s/sandbox-snapshots", f->store_dir);
  cleanup_free char *names = listing (in_prefix);
  assert_string_equal (names, "one.tar");

  /* A second commit replaces the object whole. */
  write_object (s, object, "new", 3);
  cleanup_free uint8_t *again = read_object (s, object, &len);
  assert_int_equal (len, 3);
  assert_memory_equal (again, "new", 3);
}

static void
test_empty_object_reads_back_empty (void **state)
{
  fixture_t *f = *state;
  snap_store_t *s = open_store (f, "");
  write_object (s, "empty.tar", "", 0);
  err_t err = ERR_INIT;
  assert_int_equal (s->ops->exists (s, "empty.tar", &err), 1);
  size_t len = 99;
  cleanup_free uint8_t *back = read_object (s, "empty.tar", &len);
  assert_int_equal (len, 0);
}

static void
test_object_is_invisible_until_commit (void **state)
{
  fixture_t *f = *state;
  snap_store_t *s = open_store (f, "p/");
  err_t err = ERR_INIT;
  snap_writer_t *w = NULL;
  assert_int_equal (s->ops->writer_open (s, "p/x.tar", &w, &err), 0);
  assert_int_equal (s->ops->writer_write (w, (const uint8_t *) "partial", 7, &err), 0);

  assert_int_equal (s->ops->exists (s, "p/x.tar", &err), 0);
  snap_reader_t *r = NULL;
  assert_int_equal (s->ops->reader_open (s, "p/x.tar", &r, &err), -1);
  assert_int_equal (err.status, ENOENT);
  err_release (&err);
  /* Only a hidden temporary file so far. */
  cleanup_free char *pdir = fmt ("%s/p", f->store_dir);
  cleanup_free char *names = listing (pdir);
  assert_int_equal (strncmp (names, ".x.tar.tmp-", 11), 0);
  assert_null (strchr (names, ' '));

  assert_int_equal (s->ops->writer_commit (w, &err), 0);
  assert_int_equal (s->ops->exists (s, "p/x.tar", &err), 1);
  cleanup_free char *after = listing (pdir);
  assert_string_equal (after, "x.tar");
}

static void
test_abort_leaves_nothing (void **state)
{
  fixture_t *f = *state;
  snap_store_t *s = open_store (f, "");
  err_t err = ERR_INIT;
  snap_writer_t *w = NULL;
  assert_int_equal (s->ops->writer_open (s, "gone.tar", &w, &err), 0);
  assert_int_equal (s->ops->writer_write (w, (const uint8_t *) "bytes", 5, &err), 0);
  s->ops->writer_abort (w);

  assert_int_equal (s->ops->exists (s, "gone.tar", &err), 0);
  cleanup_free char *names = listing (f->store_dir);
  assert_string_equal (names, "");

  /* Aborting a replacement keeps the committed object as it was. */
  write_object (s, "kept.tar", "old", 3);
  assert_int_equal (s->ops->writer_open (s, "kept.tar", &w, &err), 0);
  assert_int_equal (s->ops->writer_write (w, (const uint8_t *) "newer", 5, &err), 0);
  s->ops->writer_abort (w);
  size_t len = 0;
  cleanup_free uint8_t *back = read_object (s, "kept.tar", &len);
  assert_int_equal (len, 3);
  assert_memory_equal (back, "old", 3);
  cleanup_free char *after = listing (f->store_dir);
  assert_string_equal (after, "kept.tar");
}

/* ---- exists, remove ------------------------------------------------------- */

static void
test_exists_and_remove (void **state)
{
  fixture_t *f = *state;
  snap_store_t *s = open_store (f, "sandbox-snapshots/");
  err_t err = ERR_INIT;
  assert_int_equal (s->ops->exists (s, "sandbox-snapshots/a.tar", &err), 0);
  assert_int_equal (s->ops->remove (s, "sandbox-snapshots/a.tar", &err), -1);
  assert_int_equal (err.status, ENOENT);
  assert_non_null (strstr (err_msg (&err), "sandbox-snapshots/a.tar"));
  err_release (&err);

  write_object (s, "sandbox-snapshots/a.tar", "A", 1);
  write_object (s, "sandbox-snapshots/b.tar", "B", 1);
  assert_int_equal (s->ops->exists (s, "sandbox-snapshots/a.tar", &err), 1);
  assert_int_equal (s->ops->remove (s, "sandbox-snapshots/a.tar", &err), 0);
  assert_int_equal (s->ops->exists (s, "sandbox-snapshots/a.tar", &err), 0);
  snap_reader_t *r = NULL;
  assert_int_equal (s->ops->reader_open (s, "sandbox-snapshots/a.tar", &r, &err), -1);
  assert_int_equal (err.status, ENOENT);
  err_release (&err);
  /* Removed once: a second remove is ENOENT; the other object stays. */
  assert_int_equal (s->ops->remove (s, "sandbox-snapshots/a.tar", &err), -1);
  assert_int_equal (err.status, ENOENT);
  err_release (&err);
  assert_int_equal (s->ops->exists (s, "sandbox-snapshots/b.tar", &err), 1);

  /* A directory is not an object. */
  assert_int_equal (s->ops->exists (s, "sandbox-snapshots", &err), 0);
}

/* Every write is a new version; reading does not change it. */
static void
test_stat_tells_versions_apart (void **state)
{
  fixture_t *f = *state;
  snap_store_t *s = open_store (f, "sandbox-snapshots/");
  err_t err = ERR_INIT;
  snap_gen_t g0, g1, g2, again;
  assert_int_equal (s->ops->stat (s, "sandbox-snapshots/v.tar", &g0, &err), 0);
  assert_string_equal (g0.gen, "");
  write_object (s, "sandbox-snapshots/v.tar", "A", 1);
  assert_int_equal (s->ops->stat (s, "sandbox-snapshots/v.tar", &g1, &err), 1);
  assert_true (g1.gen[0] != '\0');
  assert_true (g1.mtime_ms > 1700000000000LL);
  assert_int_equal (s->ops->stat (s, "sandbox-snapshots/v.tar", &again, &err), 1);
  assert_string_equal (again.gen, g1.gen);
  write_object (s, "sandbox-snapshots/v.tar", "A", 1); /* the same bytes */
  assert_int_equal (s->ops->stat (s, "sandbox-snapshots/v.tar", &g2, &err), 1);
  assert_string_not_equal (g2.gen, g1.gen);
  assert_int_equal (s->ops->stat (s, "sandbox-snapshots", &again, &err), 0);
}

/* ---- names ---------------------------------------------------------------- */

static void
test_prefix_with_slashes_makes_directories (void **state)
{
  fixture_t *f = *state;
  snap_store_t *s = open_store (f, "tenant/a/b/");
  cleanup_free char *object = snap_object_name (s, "deep");
  write_object (s, object, "D", 1);
  cleanup_free char *path = fmt ("%s/tenant/a/b/deep.tar", f->store_dir);
  struct stat st;
  assert_int_equal (lstat (path, &st), 0);
  assert_true (S_ISREG (st.st_mode));
  size_t len = 0;
  cleanup_free uint8_t *back = read_object (s, object, &len);
  assert_int_equal (len, 1);
  err_t err = ERR_INIT;
  assert_int_equal (s->ops->remove (s, object, &err), 0);
}

static void
test_absolute_and_dotdot_object_names_are_refused (void **state)
{
  fixture_t *f = *state;
  snap_store_t *s = open_store (f, "");
  static const char *const bad[] = {"/etc/passwd", "../outside.tar", "a/../../outside.tar", "a/..", ".."};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    {
      err_t err = ERR_INIT;
      snap_writer_t *w = NULL;
      snap_reader_t *r = NULL;
      assert_int_equal (s->ops->writer_open (s, bad[i], &w, &err), -1);
      assert_int_equal (err.status, EINVAL);
      assert_non_null (strstr (err_msg (&err), bad[i]));
      err_release (&err);
      assert_int_equal (s->ops->reader_open (s, bad[i], &r, &err), -1);
      assert_int_equal (err.status, EINVAL);
      err_release (&err);
      assert_int_equal (s->ops->exists (s, bad[i], &err), -1);
      assert_int_equal (err.status, EINVAL);
      err_release (&err);
      assert_int_equal (s->ops->remove (s, bad[i], &err), -1);
      assert_int_equal (err.status, EINVAL);
      err_release (&err);
    }
  /* Nothing was made beside the store. */
  cleanup_free char *names = listing (f->dir);
  assert_string_equal (names, "store");
}

static void
test_relative_store_directory_is_refused (void **state)
{
  err_t err = ERR_INIT;
  snap_store_t *s = NULL;
  assert_int_equal (snap_store_local_new ("relative/dir", "", &s, &err), -1);
  assert_int_equal (err.status, EINVAL);
  assert_null (s);
  err_release (&err);
}

/* ---- opening -------------------------------------------------------------- */

/* Writes a file with `age_seconds` old times. */
static void
make_file (const char *path, time_t age_seconds)
{
  int fd = open (path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  assert_true (fd >= 0);
  assert_int_equal (write (fd, "t", 1), 1);
  close (fd);
  struct timespec times[2] = {{.tv_sec = time (NULL) - age_seconds}, {.tv_sec = time (NULL) - age_seconds}};
  assert_int_equal (utimensat (AT_FDCWD, path, times, 0), 0);
}

static void
test_stale_temporary_files_are_removed_when_the_store_opens (void **state)
{
  fixture_t *f = *state;
  cleanup_free char *nested = fmt ("%s/p", f->store_dir);
  assert_int_equal (mkdir (f->store_dir, 0700), 0);
  assert_int_equal (mkdir (nested, 0700), 0);
  /* Left by a crash two hours ago, at the top and under a prefix. */
  cleanup_free char *stale_top = fmt ("%s/.a.tar.tmp-AbC123", f->store_dir);
  cleanup_free char *stale_nested = fmt ("%s/.b.tar.tmp-XyZ789", nested);
  make_file (stale_top, 7200);
  make_file (stale_nested, 7200);
  /* Being written right now (by another gateway sharing the directory). */
  cleanup_free char *fresh = fmt ("%s/.c.tar.tmp-Fresh1", nested);
  make_file (fresh, 0);
  /* Objects, old or not, are kept. */
  cleanup_free char *object = fmt ("%s/old.tar", nested);
  make_file (object, 7200);

  open_store (f, "p/");
  cleanup_free char *top = listing (f->store_dir);
  assert_string_equal (top, "p");
  cleanup_free char *below = listing (nested);
  assert_string_equal (below, ".c.tar.tmp-Fresh1 old.tar");
  err_t err = ERR_INIT;
  assert_int_equal (f->store->ops->exists (f->store, "p/old.tar", &err), 1);
}

static void
test_store_directory_is_made_with_its_parents (void **state)
{
  fixture_t *f = *state;
  free (f->store_dir);
  f->store_dir = fmt ("%s/a/b/c", f->dir);
  snap_store_t *s = open_store (f, "");
  write_object (s, "x.tar", "x", 1);
  struct stat st;
  assert_int_equal (stat (f->store_dir, &st), 0);
  assert_true (S_ISDIR (st.st_mode));
  assert_int_equal (st.st_mode & 0777, 0700);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown (test_object_name_is_prefix_id_dot_tar, setup, teardown),
      cmocka_unit_test_setup_teardown (test_committed_object_reads_back_byte_for_byte, setup, teardown),
      cmocka_unit_test_setup_teardown (test_empty_object_reads_back_empty, setup, teardown),
      cmocka_unit_test_setup_teardown (test_object_is_invisible_until_commit, setup, teardown),
      cmocka_unit_test_setup_teardown (test_abort_leaves_nothing, setup, teardown),
      cmocka_unit_test_setup_teardown (test_exists_and_remove, setup, teardown),
      cmocka_unit_test_setup_teardown (test_stat_tells_versions_apart, setup, teardown),
      cmocka_unit_test_setup_teardown (test_prefix_with_slashes_makes_directories, setup, teardown),
      cmocka_unit_test_setup_teardown (test_absolute_and_dotdot_object_names_are_refused, setup, teardown),
      cmocka_unit_test_setup_teardown (test_relative_store_directory_is_refused, setup, teardown),
      cmocka_unit_test_setup_teardown (test_stale_temporary_files_are_removed_when_the_store_opens, setup, teardown),
      cmocka_unit_test_setup_teardown (test_store_directory_is_made_with_its_parents, setup, teardown),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
