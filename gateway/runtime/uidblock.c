/* runtime/uidblock: this gateway's claim on its block of host ids, host
 * wide. The block is SANDBOX_UID_BASE .. BASE + SANDBOX_UID_SLOTS *
 * SANDBOX_UID_RANGE - 1 (userns.c never hands out an id outside it).
 *
 * Every gateway of a host claims its block in SANDBOX_UID_LOCK_DIR: a file
 * named `<first>-<last>` that it holds an exclusive flock on for its life
 * (the kernel drops the lock when the gateway dies, however it dies). At
 * start, under the directory's own lock (`.claim`), a gateway looks at
 * every block file there: one still locked is another running gateway's,
 * and a block overlapping it is refused, naming the variables to change;
 * one nobody holds is left over from a gateway that is gone, and removed.
 * Two gateways with overlapping blocks would run sandboxes as the same
 * host ids: per-user kernel limits and files shared across tenants.
 *
 * Also warns (without refusing) when /etc/subuid or /etc/subgid gives part
 * of the block to a user other than the gateway's own: a container
 * runtime or newuidmap would hand those ids to someone else.
 *
 * Runs once, at start (and the release at the end), on one thread. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "common/log.h"
#include "gateway/runtime/internal.h"
#include "gateway/runtime/path.h"

/* Longest wait for the directory's lock (another gateway claiming). */
#define CLAIM_WAIT_MS 10000
/* Most entries the lock directory may hold: past it the claim fails. */
#define CLAIM_MAX_ENTRIES 4096
/* Most overlapping /etc/subuid or /etc/subgid entries warned about, each. */
#define SUBID_MAX_WARNINGS 16

typedef struct block_s
{
  uint64_t first, last; /* inclusive */
} block_t;

static bool
overlap (block_t a, block_t b)
{
  return a.first <= b.last && b.first <= a.last;
}

static block_t
block_of (const sbx_runtime_t *rt)
{
  block_t b = {(uint64_t) rt->cfg.uid_base,
               (uint64_t) rt->cfg.uid_base + (uint64_t) rt->cfg.uid_slots * (uint64_t) rt->cfg.uid_range - 1};
  return b;
}

/* `dir` and its parents, as root-only-writable directories. */
static int
make_dirs (const char *dir, err_t *err)
{
  char path[PATH_MAX];
  if (snprintf (path, sizeof path, "%s", dir) >= (int) sizeof path)
    return err_make (err, ENAMETOOLONG, "SANDBOX_UID_LOCK_DIR: `%s` is too long", dir);
  for (char *p = path + 1;; p++)
    if (*p == '/' || *p == '\0')
      {
        char c = *p;
        *p = '\0';
        if (mkdir (path, 0755) < 0 && errno != EEXIST)
          return err_make_sys (err, errno, "SANDBOX_UID_LOCK_DIR: create `%s`", path);
        if ((*p = c) == '\0')
          break;
      }
  /* Anyone else who could write there could plant claims and keep every
   * gateway from starting. */
  struct stat st;
  if (stat (dir, &st) < 0)
    return err_make_sys (err, errno, "SANDBOX_UID_LOCK_DIR: `%s`", dir);
  if (!S_ISDIR (st.st_mode) || st.st_uid != geteuid () || (st.st_mode & (S_IWGRP | S_IWOTH)) != 0)
    return err_make (err, EPERM, "SANDBOX_UID_LOCK_DIR: `%s` must be a directory only this user can write", dir);
  return 0;
}

/* The directory's lock, waited for up to CLAIM_WAIT_MS. */
static int
lock_dir (const char *dir, int *out, err_t *err)
{
  char path[PATH_MAX + 16];
  if (sbx_path_fmt (path, sizeof path, err, "%s/.claim", dir) < 0)
    return err_wrap (err, "SANDBOX_UID_LOCK_DIR");
  cleanup_close int fd = open (path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0)
    return err_make_sys (err, errno, "SANDBOX_UID_LOCK_DIR: open `%s`", path);
  for (int waited = 0; flock (fd, LOCK_EX | LOCK_NB) < 0; waited += 10)
    {
      if (errno != EWOULDBLOCK && errno != EINTR)
        return err_make_sys (err, errno, "SANDBOX_UID_LOCK_DIR: lock `%s`", path);
      if (waited >= CLAIM_WAIT_MS)
        return err_make (err, ETIMEDOUT, "SANDBOX_UID_LOCK_DIR: `%s` stayed locked for %d ms", path, CLAIM_WAIT_MS);
      struct timespec ts = {0, 10 * 1000 * 1000};
      nanosleep (&ts, NULL);
    }
  *out = take_fd (&fd);
  return 0;
}

/* A block file's name, `<first>-<last>`; false for any other name. */
static bool
parse_name (const char *name, block_t *b)
{
  char *end = NULL;
  if (name[0] < '0' || name[0] > '9')
    return false;
  b->first = strtoull (name, &end, 10);
  if (*end != '-' || end[1] < '0' || end[1] > '9')
    return false;
  b->last = strtoull (end + 1, &end, 10);
  return *end == '\0' && b->first <= b->last;
}

/* Whether the block file `name` is held by a running gateway; one that is
 * not is removed. */
static bool
held (int dfd, const char *name)
{
  cleanup_close int fd = openat (dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0)
    return false;
  if (flock (fd, LOCK_SH | LOCK_NB) < 0)
    return errno == EWOULDBLOCK;
  unlinkat (dfd, name, 0);
  return false;
}

/* Refuses when a running gateway's claim overlaps `mine`. */
static int
check_others (const sbx_runtime_t *rt, block_t mine, err_t *err)
{
  const char *dir = rt->cfg.uid_lock_dir;
  DIR *d = opendir (dir);
  if (d == NULL)
    return err_make_sys (err, errno, "SANDBOX_UID_LOCK_DIR: open `%s`", dir);
  int rc = 0;
  size_t n = 0;
  struct dirent *e;
  while (rc == 0 && (e = readdir (d)) != NULL)
    {
      block_t other;
      if (++n > CLAIM_MAX_ENTRIES)
        rc = err_make (err, E2BIG, "SANDBOX_UID_LOCK_DIR: `%s` holds more than %d entries", dir, CLAIM_MAX_ENTRIES);
      else if (parse_name (e->d_name, &other) && overlap (mine, other) && held (dirfd (d), e->d_name))
        rc = err_make (err, EADDRINUSE,
                       "uid block %" PRIu64 "-%" PRIu64 " (SANDBOX_UID_BASE %ld, SANDBOX_UID_SLOTS %ld ranges of "
                       "SANDBOX_UID_RANGE %ld) overlaps block %" PRIu64 "-%" PRIu64
                       " that another gateway on this host holds (`%s/%s`): give each gateway a block of its own "
                       "with SANDBOX_UID_BASE and SANDBOX_UID_SLOTS",
                       mine.first, mine.last, rt->cfg.uid_base, rt->cfg.uid_slots, rt->cfg.uid_range, other.first,
                       other.last, dir, e->d_name);
      else if (parse_name (e->d_name, &other))
        held (dirfd (d), e->d_name); /* removes it when stale */
    }
  closedir (d);
  return rc;
}

/* Warns about the entries of `file` (subuid/subgid format, name:first:count)
 * of users other than `me` (name) / `my_uid` that overlap `mine`. */
static void
warn_subids (const char *file, block_t mine, const char *me, const char *my_uid)
{
  FILE *f = fopen (file, "re");
  if (f == NULL)
    return;
  char line[512];
  int warned = 0;
  while (warned < SUBID_MAX_WARNINGS && fgets (line, sizeof line, f) != NULL)
    {
      char user[256];
      unsigned long long first = 0, count = 0;
      if (line[0] == '#' || sscanf (line, "%255[^:]:%llu:%llu", user, &first, &count) != 3 || count == 0)
        continue;
      block_t theirs = {first, first + count - 1};
      if (strcmp (user, me) == 0 || strcmp (user, my_uid) == 0 || !overlap (mine, theirs))
        continue;
      warned++;
      log_fields (SEV_WARNING,
                  json_pack ("{s:s, s:s, s:I, s:I, s:I, s:I}", "file", file, "user", user, "first",
                             (json_int_t) first, "count", (json_int_t) count, "block_first", (json_int_t) mine.first,
                             "block_last", (json_int_t) mine.last),
                  "the sandboxes' uid block (SANDBOX_UID_BASE, SANDBOX_UID_SLOTS) overlaps ids `%s` gives to user "
                  "`%s`: sandboxes may run as ids that user's containers use; reserve the block for this gateway "
                  "(docs/deploy.md)",
                  file, user);
    }
  fclose (f);
}

int
sbx_uid_block_claim (sbx_runtime_t *rt, err_t *err)
{
  rt->uid_claim_fd = -1;
  if (!rt->cfg.userns)
    return 0;
  block_t mine = block_of (rt);
  char me[256] = "", my_uid[24];
  snprintf (my_uid, sizeof my_uid, "%u", (unsigned) geteuid ());
  struct passwd pw, *found = NULL;
  char buf[4096];
  if (getpwuid_r (geteuid (), &pw, buf, sizeof buf, &found) == 0 && found != NULL)
    snprintf (me, sizeof me, "%s", pw.pw_name);
  warn_subids ("/etc/subuid", mine, me, my_uid);
  warn_subids ("/etc/subgid", mine, me, my_uid);

  const char *dir = rt->cfg.uid_lock_dir;
  cleanup_close int dir_lock = -1;
  if (make_dirs (dir, err) < 0 && err->status == EROFS)
    {
      /* A container's read-only root without the host directory mounted:
       * there is no host-wide view to claim in. */
      log_fields (SEV_WARNING, json_pack ("{s:s, s:s}", "uid_lock_dir", dir, "error", err_msg (err)),
                  "SANDBOX_UID_LOCK_DIR cannot be created: the uid block is not claimed host-wide, so nothing "
                  "keeps another gateway of this host from using the same ids; mount the host's directory there "
                  "(docs/deploy.md)");
      err_release (err);
      return 0;
    }
  if (err->status != 0 || lock_dir (dir, &dir_lock, err) < 0 || check_others (rt, mine, err) < 0)
    return -1;
  if (snprintf (rt->uid_claim_path, sizeof rt->uid_claim_path, "%s/%" PRIu64 "-%" PRIu64, dir, mine.first, mine.last)
      >= (int) sizeof rt->uid_claim_path)
    return err_make (err, ENAMETOOLONG, "SANDBOX_UID_LOCK_DIR: `%s` is too long", dir);
  cleanup_close int fd = open (rt->uid_claim_path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0)
    return err_make_sys (err, errno, "SANDBOX_UID_LOCK_DIR: create `%s`", rt->uid_claim_path);
  if (flock (fd, LOCK_EX | LOCK_NB) < 0)
    {
      int saved = errno;
      unlink (rt->uid_claim_path);
      return err_make_sys (err, saved, "SANDBOX_UID_LOCK_DIR: lock `%s`", rt->uid_claim_path);
    }
  /* For whoever looks: which gateway holds it. */
  char who[64];
  int len = snprintf (who, sizeof who, "pid %d\n", (int) getpid ());
  if (write (fd, who, (size_t) len) < 0)
    log_msg (SEV_DEBUG, "uid block: write `%s`: %s", rt->uid_claim_path, strerror (errno));
  rt->uid_claim_fd = take_fd (&fd);
  return 0;
}

void
sbx_uid_block_release (sbx_runtime_t *rt)
{
  if (rt->uid_claim_fd < 0)
    return;
  /* Removed while still locked: a gateway starting now either sees it
   * held or does not see it at all. */
  unlink (rt->uid_claim_path);
  close (rt->uid_claim_fd);
  rt->uid_claim_fd = -1;
}
