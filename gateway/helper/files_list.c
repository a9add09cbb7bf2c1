/* helper/files_list: ListDir's walk, in the file API's child inside the
 * sandbox (see files.h): breadth first with a queue on the heap (no
 * recursion on the tree's depth), each directory's names sorted, symlinks
 * reported and never descended into. A later page of a listing walks the
 * same way and skips (does not send) the entries of the earlier pages; the
 * gateway ends the child once its page is full. Single-threaded. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "gateway/helper/files.h"

/* A directory waiting to be listed, and its level (1: the top's). */
typedef struct pending_s
{
  char *path;
  uint32_t level;
} pending_t;

/* The walk's progress: entries still to skip (those of earlier pages). */
typedef struct walk_s
{
  uint32_t depth;
  uint64_t skip;
} walk_t;

static int
by_name (const void *a, const void *b)
{
  return strcmp (*(char *const *) a, *(char *const *) b);
}

/* The names in directory `dfd` (not . and ..), sorted, in *out (each and
 * the array freed by the caller). -1 with errno. */
static int
read_names (int dfd, char ***out, size_t *n)
{
  DIR *d = fdopendir (dfd);
  if (d == NULL)
    {
      close (dfd);
      return -1;
    }
  char **names = NULL;
  size_t count = 0, cap = 0;
  struct dirent *e;
  errno = 0;
  while ((e = readdir (d)) != NULL)
    {
      if (strcmp (e->d_name, ".") == 0 || strcmp (e->d_name, "..") == 0)
        continue;
      if (count == cap)
        {
          cap = cap ? cap * 2 : 64;
          char **g = realloc (names, cap * sizeof *g);
          if (g == NULL)
            break;
          names = g;
        }
      if ((names[count] = strdup (e->d_name)) == NULL)
        break;
      count++;
    }
  closedir (d);
  qsort (names, count, sizeof *names, by_name);
  *out = names;
  *n = count;
  return 0;
}

/* Lists one directory: INFO per entry (once w->skip entries were
 * skipped), its subdirectories queued when below the depth. -1 when the
 * gateway has gone. */
static int
list_one (const pending_t *dir, walk_t *w, pending_t **queue, size_t *n_queue, size_t *cap_queue)
{
  uint32_t depth = w->depth;
  int dfd = open (dir->path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0)
    return 0; /* gone or unreadable since it was seen: its entry was reported */
  cleanup_close int keep = fcntl (dfd, F_DUPFD_CLOEXEC, 3);
  char **names = NULL;
  size_t n = 0;
  if (read_names (dfd, &names, &n) < 0)
    return 0;
  int rc = 0;
  for (size_t i = 0; i < n; i++)
    {
      struct stat st;
      char path[SBX_FILE_PATH_MAX + NAME_MAX + 2];
      snprintf (path, sizeof path, "%s/%s", strcmp (dir->path, "/") == 0 ? "" : dir->path, names[i]);
      /* A skipped entry is looked at only when it may be a directory to
       * descend into. */
      if (rc == 0 && w->skip > 0 && dir->level >= depth)
        w->skip--;
      else if (rc == 0 && keep >= 0 && fstatat (keep, names[i], &st, AT_SYMLINK_NOFOLLOW) == 0)
        {
          char target[PATH_MAX] = "";
          if (w->skip > 0)
            w->skip--;
          else
            {
              if (S_ISLNK (st.st_mode))
                {
                  ssize_t k = readlinkat (keep, names[i], target, sizeof target - 1);
                  target[k > 0 ? k : 0] = '\0';
                }
              rc = file_send_info (path, &st, S_ISLNK (st.st_mode) ? target : NULL);
            }
          if (rc == 0 && S_ISDIR (st.st_mode) && dir->level < depth)
            {
              if (*n_queue == *cap_queue)
                {
                  *cap_queue = *cap_queue ? *cap_queue * 2 : 64;
                  pending_t *g = realloc (*queue, *cap_queue * sizeof *g);
                  if (g == NULL)
                    rc = file_send_error (ENOMEM, "list: out of memory");
                  else
                    *queue = g;
                }
              if (rc == 0)
                (*queue)[(*n_queue)++] = (pending_t){strdup (path), dir->level + 1};
            }
        }
      free (names[i]);
    }
  free (names);
  return rc;
}

int
file_op_list (const char *path, uint32_t depth, uint64_t skip)
{
  walk_t w = {.depth = depth, .skip = skip};
  struct stat st;
  if (stat (path, &st) < 0)
    return file_send_error (errno, "list `%s`: %s", path, strerror (errno));
  if (!S_ISDIR (st.st_mode))
    return file_send_error (ENOTDIR, "list `%s`: not a directory", path);
  pending_t *queue = malloc (sizeof *queue);
  if (queue == NULL)
    return file_send_error (ENOMEM, "list: out of memory");
  size_t head = 0, n = 1, cap = 1;
  queue[0] = (pending_t){strdup (path), 1};
  int rc = 0;
  for (; head < n && rc == 0; head++)
    {
      pending_t dir = queue[head];
      if (dir.path != NULL)
        rc = list_one (&dir, &w, &queue, &n, &cap);
      free (dir.path);
    }
  for (; head < n; head++)
    free (queue[head].path);
  free (queue);
  if (rc < 0)
    return -1;
  return file_send (SBX_FRAME_END, NULL, 0, NULL, 0, NULL, 0);
}
