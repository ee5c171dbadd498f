/* fhpath: where the inode an overlay file handle names lives on the host, for CRIU to find the
 * path of a sandbox's inotify watch (engine/watch-paths.ts). The kernel writes an overlay
 * handle (struct ovl_fh) into the watch's fdinfo: a header, then the handle of the real inode
 * on the filesystem under the overlay. That inner handle is opened (O_PATH, nothing followed,
 * nothing read) on the filesystem of DIR, and the path the kernel gives the result is printed.
 *
 *   fp-agent fhpath DIR FHANDLE_TYPE_HEX F_HANDLE_HEX
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define OVL_FILEID_V0 0xfb
#define OVL_FILEID_V1 0xf8
#define OVL_FB_MAGIC 0xfb
#define OVL_FB_HEADER 21 /* version, magic, len, flags, type, uuid[16] */
#define MAX_HANDLE 128

static int unhex(const char *s, unsigned char *out, size_t max) {
  size_t n = strlen(s);
  if (n % 2 || n / 2 > max) return -1;
  for (size_t i = 0; i < n / 2; i++) {
    unsigned v;
    if (sscanf(s + 2 * i, "%2x", &v) != 1) return -1;
    out[i] = (unsigned char)v;
  }
  return (int)(n / 2);
}

int fhpath_main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: fp-agent fhpath DIR FHANDLE_TYPE_HEX F_HANDLE_HEX\n");
    return 2;
  }
  unsigned long type = strtoul(argv[2], NULL, 16);
  unsigned char fh[MAX_HANDLE];
  int n = unhex(argv[3], fh, sizeof(fh));
  /* V1 handles carry 3 bytes of padding before the header (fb.fid 32-bit aligned). */
  int at = type == OVL_FILEID_V1 ? 3 : type == OVL_FILEID_V0 ? 0 : -1;
  if (n < 0 || at < 0 || n < at + OVL_FB_HEADER || fh[at + 1] != OVL_FB_MAGIC || fh[at + 2] > n - at || fh[at + 2] < OVL_FB_HEADER) {
    fprintf(stderr, "fhpath: not an overlay file handle\n");
    return 1;
  }
  int inner = fh[at + 2] - OVL_FB_HEADER;
  struct {
    struct file_handle h;
    unsigned char bytes[MAX_HANDLE];
  } real;
  real.h.handle_bytes = (unsigned)inner;
  real.h.handle_type = fh[at + 4];
  memcpy(real.h.f_handle, fh + at + OVL_FB_HEADER, (size_t)inner);
  int mount = open(argv[1], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (mount < 0) {
    perror("fhpath: open DIR");
    return 1;
  }
  int fd = open_by_handle_at(mount, &real.h, O_PATH | O_CLOEXEC);
  if (fd < 0) {
    fprintf(stderr, "fhpath: open by handle: %s\n", strerror(errno));
    return 1;
  }
  char link[64], path[4096];
  snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
  ssize_t len = readlink(link, path, sizeof(path) - 1);
  if (len < 0) {
    perror("fhpath: readlink");
    return 1;
  }
  path[len] = 0;
  puts(path);
  return 0;
}
