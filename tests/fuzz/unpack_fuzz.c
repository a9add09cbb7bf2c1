/* Fuzz target: the snapshot tar importer (gateway/snapshot/unpack.h).
 *
 * Each input is a tar (or compressed tar) extracted with snap_unpack
 * (max_entries 1000) into a fresh directory, WITHOUT the chroot that
 * sandbox-unpack adds in production: snap_unpack's own checks are what is
 * tested, and every run must leave everything outside its directory alone.
 *
 * Layout, made once under $TMPDIR (or /tmp):
 *
 *   unpack-fuzz.XXXXXX/          the base
 *     sentinel/                  must stay empty
 *     run/                       made, extracted into and removed per input
 *
 * After each input the harness checks that the sentinel is still an empty
 * directory and that the base holds nothing but sentinel/ (an escape
 * through "..", a relative symlink or a parent made through one lands
 * there) and aborts (a crash for libFuzzer) otherwise. Absolute escapes
 * cannot be watched this way: snap_unpack refuses absolute paths and
 * writing through symlinks, and the regressions include such tars.
 */
#include <dirent.h>
#include <stdbool.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gateway/snapshot/unpack.h"

static char base[4096];
static char run[4200];
static char sentinel[4200];
static int home_fd = -1;

static void
die (const char *what)
{
  fprintf (stderr, "unpack_fuzz: %s: %s\n", what, strerror (errno));
  abort ();
}

static int
make_writable (const char *path, const struct stat *st, int type, struct FTW *ftw)
{
  if (type == FTW_D || type == FTW_DNR)
    chmod (path, 0700);
  return 0;
}

static int
remove_one (const char *path, const struct stat *st, int type, struct FTW *ftw)
{
  if (remove (path) < 0 && errno != ENOENT)
    {
      fprintf (stderr, "unpack_fuzz: remove `%s`: %s\n", path, strerror (errno));
      abort ();
    }
  return 0;
}

static void
remove_tree (const char *path)
{
  struct stat st;
  if (lstat (path, &st) < 0)
    return;
  /* A tar may leave directories without write or search permission: open
   * them up first (root does not need it, other users do). */
  nftw (path, make_writable, 64, FTW_PHYS);
  nftw (path, remove_one, 64, FTW_DEPTH | FTW_PHYS);
}

/* Aborts unless `dir` is a directory holding exactly the names in `allowed`
 * (NULL-terminated). */
static void
expect_only (const char *dir, const char *const *allowed)
{
  struct stat st;
  if (lstat (dir, &st) < 0 || !S_ISDIR (st.st_mode))
    {
      fprintf (stderr, "unpack_fuzz: ESCAPE: `%s` was replaced or removed\n", dir);
      abort ();
    }
  DIR *d = opendir (dir);
  if (d == NULL)
    die ("opendir");
  struct dirent *de;
  while ((de = readdir (d)) != NULL)
    {
      if (strcmp (de->d_name, ".") == 0 || strcmp (de->d_name, "..") == 0)
        continue;
      bool ok = false;
      for (size_t i = 0; allowed[i] != NULL; i++)
        ok = ok || strcmp (de->d_name, allowed[i]) == 0;
      if (!ok)
        {
          fprintf (stderr, "unpack_fuzz: ESCAPE: the tar created `%s/%s` outside its directory\n", dir, de->d_name);
          abort ();
        }
    }
  closedir (d);
}

int
LLVMFuzzerInitialize (int *argc, char ***argv)
{
  const char *tmp = getenv ("TMPDIR");
  snprintf (base, sizeof base, "%s/unpack-fuzz.XXXXXX", tmp != NULL && tmp[0] != '\0' ? tmp : "/tmp");
  if (mkdtemp (base) == NULL)
    die ("mkdtemp");
  snprintf (run, sizeof run, "%s/run", base);
  snprintf (sentinel, sizeof sentinel, "%s/sentinel", base);
  if (mkdir (sentinel, 0755) < 0)
    die ("mkdir sentinel");
  home_fd = open (".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (home_fd < 0)
    die ("open cwd");
  return 0;
}

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
  int fd = memfd_create ("tar", MFD_CLOEXEC);
  if (fd < 0)
    die ("memfd_create");
  for (size_t off = 0; off < size;)
    {
      ssize_t w = write (fd, data + off, size - off);
      if (w < 0)
        die ("write memfd");
      off += (size_t) w;
    }
  if (lseek (fd, 0, SEEK_SET) < 0)
    die ("lseek");
  if (mkdir (run, 0755) < 0)
    die ("mkdir run");
  if (chdir (run) < 0)
    die ("chdir run");

  err_t err = ERR_INIT;
  int rc = snap_unpack (fd, 1000, 64LL << 20, false, &err);
  if (rc < 0 && (err.status == 0 || err.msg == NULL))
    {
      fprintf (stderr, "unpack_fuzz: snap_unpack failed without an error\n");
      abort ();
    }
  if (rc == 0 && err.msg != NULL)
    {
      fprintf (stderr, "unpack_fuzz: snap_unpack succeeded with an error: %s\n", err.msg);
      abort ();
    }
  if (getenv ("UNPACK_FUZZ_VERBOSE") != NULL)
    fprintf (stderr, "unpack_fuzz: rc %d: %s\n", rc, err_msg (&err));
  err_release (&err);
  close (fd);

  if (fchdir (home_fd) < 0)
    die ("fchdir back");
  static const char *const in_base[] = {"sentinel", "run", NULL};
  static const char *const nothing[] = {NULL};
  expect_only (base, in_base);
  expect_only (sentinel, nothing);
  remove_tree (run);
  return 0;
}
