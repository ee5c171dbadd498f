/* A forked helper: work the relay hands off so that it can go on meanwhile (a cgroup join's
 * grace period, a restored tree's network), whose failure comes back as a message on a pipe. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fp.h"

int helper_start(struct helper *h, helper_fn fn, const void *arg, char *err, size_t errlen) {
  int fds[2];
  h->pid = -1;
  h->pipe = -1;
  if (pipe2(fds, O_CLOEXEC) < 0) {
    snprintf(err, errlen, "pipe: %s", strerror(errno));
    return -1;
  }
  pid_t child = fork();
  if (child < 0) {
    snprintf(err, errlen, "fork: %s", strerror(errno));
    close(fds[0]);
    close(fds[1]);
    return -1;
  }
  if (child == 0) {
    char msg[512] = "";
    close(fds[0]);
    if (fn(arg, msg, sizeof(msg)) < 0 && !msg[0]) snprintf(msg, sizeof(msg), "failed");
    if (msg[0] && write(fds[1], msg, strlen(msg)) < 0) {}
    _exit(msg[0] ? 1 : 0);
  }
  close(fds[1]);
  h->pid = child;
  h->pipe = fds[0];
  return 0;
}

int helper_finish(struct helper *h, char *err, size_t errlen) {
  if (h->pid <= 0) return 0;
  ssize_t n;
  do n = read(h->pipe, err, errlen - 1); while (n < 0 && errno == EINTR);
  close(h->pipe);
  int st = 0;
  while (waitpid(h->pid, &st, 0) < 0 && errno == EINTR) {}
  h->pid = -1;
  h->pipe = -1;
  if (n > 0) {
    err[n] = 0;
    return -1;
  }
  if (!WIFEXITED(st) || WEXITSTATUS(st)) {
    snprintf(err, errlen, "a helper ended with status %d", st);
    return -1;
  }
  return 0;
}
