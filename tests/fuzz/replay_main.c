/* replay_main: runs a fuzz target's LLVMFuzzerTestOneInput once over every
 * file of the files and directories named on the command line (directories
 * recursively, in sorted order), without libFuzzer. Bazel's <name>_replay
 * tests link it with one fuzzer library and pass the fuzzer's corpus and
 * regressions, so every committed input is replayed by `bazel test`, under
 * the plain compiler and under --config=asan.
 *
 * A crash, a sanitizer report or a failed check in the target ends the
 * process as it would under libFuzzer: the test fails. The name of each
 * input is printed to stderr before it runs, so the last one printed is the
 * culprit. A missing argument or no input at all fails too (a corpus that
 * went missing must not pass as an empty one).
 *
 * Each input is handed over in an allocation of exactly its size, so reads
 * past its end show under AddressSanitizer. LLVMFuzzerInitialize runs first
 * when the target defines it. Under `bazel test`, TMPDIR defaults to the
 * test's own TEST_TMPDIR. Single-threaded.
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput (const uint8_t *data, size_t size);
int LLVMFuzzerInitialize (int *argc, char ***argv) __attribute__ ((weak));

/* The inputs found, in the order given and sorted within each directory walk. */
static char **inputs;
static size_t n_inputs, cap_inputs;

static int
add_input (const char *path, const struct stat *st, int type, struct FTW *ftw)
{
  if (type != FTW_F)
    return 0;
  if (n_inputs == cap_inputs)
    {
      size_t cap = cap_inputs ? cap_inputs * 2 : 64;
      char **grown = realloc (inputs, cap * sizeof *grown);
      if (grown == NULL)
        return -1;
      inputs = grown;
      cap_inputs = cap;
    }
  inputs[n_inputs] = strdup (path);
  if (inputs[n_inputs] == NULL)
    return -1;
  n_inputs++;
  return 0;
}

static int
by_name (const void *a, const void *b)
{
  return strcmp (*(char *const *) a, *(char *const *) b);
}

/* Reads `path` whole into an allocation of exactly its size (1 byte for an
 * empty file, so the pointer is never NULL). Returns NULL with errno. */
static uint8_t *
read_whole (const char *path, size_t *len)
{
  int fd = open (path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return NULL;
  struct stat st;
  if (fstat (fd, &st) < 0)
    {
      int e = errno;
      close (fd);
      errno = e;
      return NULL;
    }
  size_t size = (size_t) st.st_size;
  uint8_t *data = malloc (size ? size : 1);
  size_t off = 0;
  while (data != NULL && off < size)
    {
      ssize_t n = read (fd, data + off, size - off);
      if (n < 0 && errno == EINTR)
        continue;
      if (n <= 0)
        {
          int e = n < 0 ? errno : EIO; /* shrank while read */
          free (data);
          data = NULL;
          errno = e;
          break;
        }
      off += (size_t) n;
    }
  close (fd);
  *len = size;
  return data;
}

static void
release_inputs (void)
{
  for (size_t i = 0; i < n_inputs; i++)
    free (inputs[i]);
  free (inputs);
}

int
main (int argc, char **argv)
{
  if (argc < 2)
    {
      fprintf (stderr, "usage: %s DIR_OR_FILE...\n", argv[0]);
      return 2;
    }
  const char *test_tmp = getenv ("TEST_TMPDIR");
  if (getenv ("TMPDIR") == NULL && test_tmp != NULL)
    setenv ("TMPDIR", test_tmp, 1);

  for (int i = 1; i < argc; i++)
    {
      size_t first = n_inputs;
      /* Not FTW_PHYS: Bazel's runfiles are symlinks to the committed files. */
      if (nftw (argv[i], add_input, 16, 0) != 0)
        {
          fprintf (stderr, "replay: cannot read `%s`: %s\n", argv[i], strerror (errno));
          release_inputs ();
          return 1;
        }
      qsort (inputs + first, n_inputs - first, sizeof *inputs, by_name);
    }
  if (n_inputs == 0)
    {
      fprintf (stderr, "replay: no input found\n");
      release_inputs ();
      return 1;
    }

  if (LLVMFuzzerInitialize != NULL)
    LLVMFuzzerInitialize (&argc, &argv);
  for (size_t i = 0; i < n_inputs; i++)
    {
      size_t len = 0;
      uint8_t *data = read_whole (inputs[i], &len);
      if (data == NULL)
        {
          fprintf (stderr, "replay: read `%s`: %s\n", inputs[i], strerror (errno));
          release_inputs ();
          return 1;
        }
      fprintf (stderr, "replay: %s (%zu bytes)\n", inputs[i], len);
      LLVMFuzzerTestOneInput (data, len);
      free (data);
    }
  printf ("replay: %zu inputs passed\n", n_inputs);
  release_inputs ();
  return 0;
}
