/* Whole reads and writes on pipes and sockets, for the host-side roles. */
#include <errno.h>
#include <unistd.h>

#include "fp.h"

/* Reads exactly LEN bytes; -1 on EOF or an error. */
int read_full(int fd, void *buf, size_t len) {
  size_t got = 0;
  while (got < len) {
    ssize_t n = read(fd, (char *)buf + got, len - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return -1;
    got += (size_t)n;
  }
  return 0;
}

/* Writes all of BUF; -1 on an error. */
int write_full(int fd, const void *buf, size_t len) {
  size_t put = 0;
  while (put < len) {
    ssize_t n = write(fd, (const char *)buf + put, len - put);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return -1;
    put += (size_t)n;
  }
  return 0;
}
