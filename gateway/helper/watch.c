/* helper/watch: Watch, in the file API's child inside the sandbox (see
 * files.h): inotify on a path (with `recursive`, on every directory of its
 * tree, new ones as they appear, up to a limit), its events turned into
 * EVENT frames: created, modified (closed after a write), removed, renamed
 * (a move within the watched tree; a move out is a removal, a move in a
 * creation). Events are never dropped silently: when the kernel's queue
 * overflows (the client reads too slowly) or a directory cannot be
 * watched, an OVERFLOW event says so. Ends when the gateway closes the
 * stream. Single-threaded. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "gateway/helper/files.h"
#include "gateway/runtime/path.h"

#define WATCH_MASK                                                                                                   \
  (IN_CREATE | IN_CLOSE_WRITE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF              \
   | IN_EXCL_UNLINK)

typedef struct watch_s
{
  int wd;
  char *path;
} watch_t;

static int ifd = -1;
static watch_t *watches;
static size_t n_watches, cap_watches;
static uint32_t max_watches;
static bool recursive;
static const char *top;

static int
send_event (uint32_t kind, bool is_dir, const char *path, const char *old)
{
  sbx_event_wire_t w = {.kind = kind,
                        .is_dir = is_dir,
                        .path_len = (uint32_t) strlen (path),
                        .old_len = old != NULL ? (uint32_t) strlen (old) : 0};
  return file_send (SBX_FRAME_EVENT, &w, sizeof w, path, w.path_len, old, w.old_len);
}

static watch_t *
find_wd (int wd)
{
  for (size_t i = 0; i < n_watches; i++)
    if (watches[i].wd == wd)
      return &watches[i];
  return NULL;
}

/* Watches `path`. 0, 1 over the limit, -1 with errno. */
static int
add_watch (const char *path)
{
  if (n_watches >= max_watches)
    return 1;
  int wd = inotify_add_watch (ifd, path, WATCH_MASK);
  if (wd < 0)
    return -1;
  if (find_wd (wd) != NULL)
    return 0; /* already watched (the same directory by another name) */
  if (n_watches == cap_watches)
    {
      size_t cap = cap_watches ? cap_watches * 2 : 64;
      watch_t *g = realloc (watches, cap * sizeof *g);
      if (g == NULL)
        {
          errno = ENOMEM;
          return -1;
        }
      watches = g;
      cap_watches = cap;
    }
  char *copy = strdup (path);
  if (copy == NULL)
    {
      errno = ENOMEM;
      return -1;
    }
  watches[n_watches++] = (watch_t){wd, copy};
  return 0;
}

/* Watches directory `root` and every directory below it, breadth first
 * (no recursion on the tree's depth). With `announce`, what is found below
 * is reported as created (it appeared before its directory was watched).
 * 0, 1 over the limit, -1 with errno. */
static int
add_tree (const char *root, bool announce)
{
  char **queue = malloc (sizeof *queue);
  size_t head = 0, n = 0, cap = 1;
  int rc = 0;
  if (queue == NULL || (queue[n++] = strdup (root)) == NULL)
    rc = -1;
  for (; head < n && rc == 0; head++)
    {
      rc = add_watch (queue[head]);
      DIR *d = rc == 0 ? opendir (queue[head]) : NULL;
      struct dirent *e;
      while (d != NULL && rc == 0 && (e = readdir (d)) != NULL)
        {
          if (strcmp (e->d_name, ".") == 0 || strcmp (e->d_name, "..") == 0)
            continue;
          char path[SBX_FILE_PATH_MAX + NAME_MAX + 2];
          if (sbx_path_fmt (path, sizeof path, NULL, "%s/%s", strcmp (queue[head], "/") == 0 ? "" : queue[head],
                            e->d_name)
              < 0)
            {
              /* A path too long to name: not watched, and the caller told
               * that what changes there goes unseen. */
              if (send_event (SBX_EVENT_OVERFLOW, true, queue[head], NULL) < 0)
                rc = -1;
              continue;
            }
          bool dir = e->d_type == DT_DIR;
          if (announce && send_event (SBX_EVENT_CREATED, dir, path, NULL) < 0)
            rc = -1;
          /* A file written before its new directory came under watch:
           * its write was missed, so it is reported as well. */
          struct stat fst;
          if (announce && rc == 0 && e->d_type == DT_REG
              && fstatat (dirfd (d), e->d_name, &fst, AT_SYMLINK_NOFOLLOW) == 0 && fst.st_size > 0
              && send_event (SBX_EVENT_MODIFIED, false, path, NULL) < 0)
            rc = -1;
          if (dir && rc == 0)
            {
              if (n == cap)
                {
                  cap *= 2;
                  char **g = realloc (queue, cap * sizeof *g);
                  if (g == NULL)
                    {
                      rc = -1;
                      break;
                    }
                  queue = g;
                }
              queue[n++] = strdup (path);
            }
        }
      if (d != NULL)
        closedir (d);
    }
  for (size_t i = 0; i < n; i++)
    free (queue[i]);
  free (queue);
  return rc;
}

/* Forgets the watches of `path` and below (moved out of the tree or gone). */
static void
drop_tree (const char *path)
{
  size_t len = strlen (path);
  for (size_t i = 0; i < n_watches;)
    if (strncmp (watches[i].path, path, len) == 0 && (watches[i].path[len] == '\0' || watches[i].path[len] == '/'))
      {
        inotify_rm_watch (ifd, watches[i].wd);
        free (watches[i].path);
        watches[i] = watches[--n_watches];
      }
    else
      i++;
}

/* Renames the watches of `from` and below to `to` (a move inside the tree). */
static void
move_tree (const char *from, const char *to)
{
  size_t len = strlen (from);
  for (size_t i = 0; i < n_watches; i++)
    if (strncmp (watches[i].path, from, len) == 0 && (watches[i].path[len] == '\0' || watches[i].path[len] == '/'))
      {
        char path[SBX_FILE_PATH_MAX + NAME_MAX + 2];
        snprintf (path, sizeof path, "%s%s", to, watches[i].path + len);
        char *copy = strdup (path);
        if (copy != NULL)
          {
            free (watches[i].path);
            watches[i].path = copy;
          }
      }
}

/* A new directory in the tree: watched, with what it already holds. */
static int
grow (const char *path)
{
  int rc = add_tree (path, true);
  if (rc == 1)
    return send_event (SBX_EVENT_OVERFLOW, true, path, NULL); /* over the limit: not watched */
  return rc < 0 && errno == ENOMEM ? -1 : 0;
}

/* Turns one inotify event (and its MOVED_TO partner `next`, when it is
 * one) into frames. Sets *paired when `next` was used. */
static int
translate (const struct inotify_event *ev, const struct inotify_event *next, bool *paired)
{
  if (ev->mask & IN_Q_OVERFLOW)
    return send_event (SBX_EVENT_OVERFLOW, false, top, NULL);
  watch_t *w = find_wd (ev->wd);
  if (w == NULL)
    return 0;
  char path[SBX_FILE_PATH_MAX + NAME_MAX + 2];
  int plen = ev->len > 0 ? sbx_path_fmt (path, sizeof path, NULL, "%s/%s", strcmp (w->path, "/") == 0 ? "" : w->path,
                                         ev->name)
                         : sbx_path_fmt (path, sizeof path, NULL, "%s", w->path);
  if (plen < 0 && !(ev->mask & IN_IGNORED))
    return send_event (SBX_EVENT_OVERFLOW, true, w->path, NULL); /* a name too long to report */
  bool dir = (ev->mask & IN_ISDIR) != 0;
  if (ev->mask & IN_IGNORED)
    {
      free (w->path);
      *w = watches[--n_watches];
      return 0;
    }
  if (ev->mask & (IN_DELETE_SELF | IN_MOVE_SELF))
    return strcmp (w->path, top) == 0 ? send_event (SBX_EVENT_REMOVED, dir, path, NULL) : 0;
  if (ev->mask & IN_CREATE)
    {
      if (send_event (SBX_EVENT_CREATED, dir, path, NULL) < 0)
        return -1;
      return dir && recursive ? grow (path) : 0;
    }
  if (ev->mask & IN_CLOSE_WRITE)
    return send_event (SBX_EVENT_MODIFIED, false, path, NULL);
  if (ev->mask & IN_DELETE)
    return send_event (SBX_EVENT_REMOVED, dir, path, NULL);
  if (ev->mask & IN_MOVED_FROM)
    {
      watch_t *nw
          = next != NULL && (next->mask & IN_MOVED_TO) && next->cookie == ev->cookie ? find_wd (next->wd) : NULL;
      if (nw == NULL)
        {
          if (dir)
            drop_tree (path);
          return send_event (SBX_EVENT_REMOVED, dir, path, NULL);
        }
      *paired = true;
      char to[sizeof path];
      if (sbx_path_fmt (to, sizeof to, NULL, "%s/%s", strcmp (nw->path, "/") == 0 ? "" : nw->path, next->name) < 0)
        return send_event (SBX_EVENT_OVERFLOW, true, nw->path, NULL);
      if (dir)
        move_tree (path, to);
      return send_event (SBX_EVENT_RENAMED, dir, to, path);
    }
  if (ev->mask & IN_MOVED_TO)
    {
      if (send_event (SBX_EVENT_CREATED, dir, path, NULL) < 0)
        return -1;
      return dir && recursive ? grow (path) : 0;
    }
  return 0;
}

/* How long a MOVED_FROM that ends a read waits for its MOVED_TO: the
 * rename queues the two an instant apart, and a reader woken by the first
 * can read before the second is there. A move out of the watched tree
 * (no MOVED_TO ever) is reported that much later. */
#define MOVE_PAIR_WAIT_MS 20

/* Reads and forwards what inotify has. -1 when the gateway has gone. */
static int
pump (char *buf, size_t cap)
{
  ssize_t n = read (ifd, buf, cap);
  if (n <= 0)
    return 0;
  char *end = buf + n;
  for (char *p = buf; p < end;)
    {
      char *after = p + sizeof (struct inotify_event) + ((const struct inotify_event *) (void *) p)->len;
      if (after >= end && (((const struct inotify_event *) (void *) p)->mask & IN_MOVED_FROM))
        {
          /* Its partner may be an instant behind: moved to the front of
           * the buffer, the event waits briefly for what follows. */
          size_t keep = (size_t) (after - p);
          memmove (buf, p, keep);
          p = buf;
          after = buf + keep;
          end = after;
          struct pollfd pf = {.fd = ifd, .events = POLLIN};
          ssize_t m = poll (&pf, 1, MOVE_PAIR_WAIT_MS) > 0 ? read (ifd, after, cap - keep) : 0;
          if (m > 0)
            end += m;
        }
      const struct inotify_event *ev = (const struct inotify_event *) (void *) p;
      const struct inotify_event *next = after < end ? (const struct inotify_event *) (void *) after : NULL;
      bool paired = false;
      if (translate (ev, next, &paired) < 0)
        return -1;
      p = after;
      if (paired)
        p += sizeof *next + next->len;
    }
  return 0;
}

int
file_op_watch (const char *path, uint32_t flags, uint32_t limit)
{
  recursive = (flags & SBX_FILE_F_RECURSIVE) != 0;
  max_watches = limit > 0 ? limit : 1;
  top = path;
  ifd = inotify_init1 (IN_CLOEXEC | IN_NONBLOCK);
  if (ifd < 0)
    return file_send_error (errno, "watch `%s`: inotify: %s", path, strerror (errno));
  struct stat st;
  if (stat (path, &st) < 0)
    return file_send_error (errno, "watch `%s`: %s", path, strerror (errno));
  int rc = recursive && S_ISDIR (st.st_mode) ? add_tree (path, false) : add_watch (path);
  if (rc == 1)
    return file_send_error (ENOSPC, "watch `%s`: more than %u directories to watch", path, max_watches);
  if (rc < 0)
    return file_send_error (errno, "watch `%s`: %s", path, strerror (errno));
  if (send_event (SBX_EVENT_WATCHING, S_ISDIR (st.st_mode), path, NULL) < 0)
    return -1;
  /* Aligned for struct inotify_event, room for many at once. */
  static char buf[64 * 1024] __attribute__ ((aligned (__alignof__(struct inotify_event))));
  for (;;)
    {
      struct pollfd p[2] = {{.fd = ifd, .events = POLLIN}, {.fd = file_sock, .events = POLLIN}};
      if (poll (p, 2, -1) < 0)
        {
          if (errno == EINTR)
            continue;
          return -1;
        }
      if (p[1].revents != 0)
        return 0; /* the gateway closed the stream: the call is over */
      if (p[0].revents != 0 && pump (buf, sizeof buf) < 0)
        return -1;
      /* The watched path itself is gone (its REMOVED event sent): nothing
       * more can come, the watch ends. */
      if (n_watches == 0)
        return file_send (SBX_FRAME_END, NULL, 0, NULL, 0, NULL, 0);
    }
}
