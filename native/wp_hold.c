/* fp-agent wp-hold SOCKET PID: keeps the userfaultfds of one sandbox's dirty-page tracking.
 *
 * forkpoint's CRIU (deploy/criu/0009-*) write-protects a tree's private memory through a
 * userfaultfd per process as a checkpoint's dump ends, and a page written after that loses its
 * protection: the next dump copies only those. The protection lasts as long as its userfaultfd
 * is open, and CRIU exits, so it hands them to this holder: 'R' closes those it holds (the
 * previous dump's: a mapping can have one at most), 'H' with descriptors keeps them, each with
 * its task's pid; each is answered 'k'. 'G' gives copies of those held back, with their pids: the
 * next dump reuses those of the same tasks rather than drop their protection and build it again. The holder exits when the sandbox's PID 1 (PID, on the host) is gone.
 *
 * It trusts nothing it is sent: the socket is root's alone (0600, in the instance's run
 * directory), and a descriptor that is not a userfaultfd is closed at once. Dropping a
 * userfaultfd is always safe: its pages read as written again, a full copy next time. */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>

#include "fp.h"

/* Linux 6.7's, newer than the headers this may be built with. */
#define FP_UFFD_FEATURE_WP_ASYNC (1 << 15)
#define FP_PAGE_IS_WRITTEN (1 << 1)
#define FP_PAGE_IS_PRESENT (1 << 3)
struct fp_page_region {
  unsigned long long start, end, categories;
};
struct fp_pm_scan_arg {
  unsigned long long size, flags, start, end, walk_end, vec, vec_len, max_pages, category_inverted, category_mask,
      category_anyof_mask, return_mask;
};
#define FP_PAGEMAP_SCAN _IOWR('f', 16, struct fp_pm_scan_arg)

#define MAX_HELD 8192
#define MAX_PER_MESSAGE 253
#define CLIENT_TIMEOUT_S 5

static int held[MAX_HELD];
static pid_t held_pid[MAX_HELD];
static int nheld;

static int is_userfaultfd(int fd) {
  char path[64], link[64];
  snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
  ssize_t n = readlink(path, link, sizeof(link) - 1);
  if (n < 0) return 0;
  link[n] = '\0';
  return !strcmp(link, "anon_inode:[userfaultfd]");
}

static void release_all(void) {
  for (int i = 0; i < nheld; i++) close(held[i]);
  nheld = 0;
}

/* 'G': copies of what is held, with their pids, in messages 'g' + pids, then 'e'. */
static int give(int conn) {
  for (int at = 0;; at += MAX_PER_MESSAGE) {
    int n = nheld - at < MAX_PER_MESSAGE ? nheld - at : MAX_PER_MESSAGE;
    if (n <= 0) break;
    char data[1 + sizeof(pid_t) * MAX_PER_MESSAGE];
    char ctl[CMSG_SPACE(sizeof(int) * MAX_PER_MESSAGE)];
    memset(ctl, 0, sizeof(ctl));
    data[0] = 'g';
    memcpy(data + 1, held_pid + at, sizeof(pid_t) * (size_t)n);
    struct iovec iov = {.iov_base = data, .iov_len = 1 + sizeof(pid_t) * (size_t)n};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)n)};
    struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)n);
    memcpy(CMSG_DATA(cm), held + at, sizeof(int) * (size_t)n);
    if (sendmsg(conn, &mh, MSG_NOSIGNAL) != (ssize_t)iov.iov_len) return -1;
  }
  return send(conn, "e", 1, MSG_NOSIGNAL) == 1 ? 0 : -1;
}

/* One client (a CRIU dump): commands until it hangs up or stalls. 'H' carries descriptors and
 * the pid of each's task (int32 each, after the command byte); a message that does not add up
 * is dropped, its descriptors closed. */
static void serve(int conn) {
  struct timeval tv = {.tv_sec = CLIENT_TIMEOUT_S};
  setsockopt(conn, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(conn, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  for (;;) {
    char data[1 + sizeof(pid_t) * MAX_PER_MESSAGE];
    char ctl[CMSG_SPACE(sizeof(int) * MAX_PER_MESSAGE)];
    struct iovec iov = {.iov_base = data, .iov_len = sizeof(data)};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof(ctl)};
    ssize_t n = recvmsg(conn, &mh, MSG_CMSG_CLOEXEC);
    if (n <= 0) return;
    char cmd = data[0];
    int nfds = 0, *fds = NULL;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
      if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
      nfds = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
      fds = (int *)CMSG_DATA(cm);
    }
    int npids = (int)((n - 1) / (ssize_t)sizeof(pid_t));
    int keep = cmd == 'H' && !(mh.msg_flags & (MSG_CTRUNC | MSG_TRUNC)) && npids == nfds;
    for (int i = 0; i < nfds; i++) {
      if (keep && nheld < MAX_HELD && is_userfaultfd(fds[i])) {
        memcpy(&held_pid[nheld], data + 1 + sizeof(pid_t) * (size_t)i, sizeof(pid_t));
        held[nheld++] = fds[i];
      } else {
        close(fds[i]);
      }
    }
    if (mh.msg_flags & (MSG_CTRUNC | MSG_TRUNC)) return;
    if (cmd == 'G') {
      if (give(conn)) return;
      continue;
    }
    if (cmd == 'R') release_all();
    else if (cmd == 'Q') {
      /* A holder started for the same sandbox by a server that came after (this one's died). */
      send(conn, "k", 1, MSG_NOSIGNAL);
      exit(0);
    } else if (cmd != 'H') return;
    if (send(conn, "k", 1, MSG_NOSIGNAL) != 1) return;
  }
}

/* Whether this kernel tracks writes the way forkpoint's CRIU asks it to: a page write-protected
 * through an async userfaultfd reads as not written in PAGEMAP_SCAN until it is written. */
static int probe(void) {
  int uffd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | UFFD_USER_MODE_ONLY);
  int pm = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  if (uffd < 0 || pm < 0) return 1;
  struct uffdio_api api = {.api = UFFD_API, .features = FP_UFFD_FEATURE_WP_ASYNC};
  if (ioctl(uffd, UFFDIO_API, &api)) return 1;
  long page = sysconf(_SC_PAGESIZE);
  volatile char *p = mmap(NULL, (size_t)page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return 1;
  p[0] = 1;
  struct uffdio_register reg = {.range = {.start = (unsigned long)p, .len = (unsigned long)page}, .mode = UFFDIO_REGISTER_MODE_WP};
  struct uffdio_writeprotect wp = {.range = reg.range, .mode = UFFDIO_WRITEPROTECT_MODE_WP};
  if (ioctl(uffd, UFFDIO_REGISTER, &reg) || ioctl(uffd, UFFDIO_WRITEPROTECT, &wp)) return 1;
  int written[2];
  for (int k = 0; k < 2; k++) {
    struct fp_page_region r = {0};
    struct fp_pm_scan_arg a = {.size = sizeof(a), .start = (unsigned long)p, .end = (unsigned long)p + (unsigned long)page,
                               .vec = (unsigned long)&r, .vec_len = 1, .category_anyof_mask = FP_PAGE_IS_PRESENT, .return_mask = FP_PAGE_IS_WRITTEN};
    if (ioctl(pm, FP_PAGEMAP_SCAN, &a) != 1) return 1;
    written[k] = (r.categories & FP_PAGE_IS_WRITTEN) != 0;
    p[0] = 2;
  }
  return !written[0] && written[1] ? 0 : 1;
}

int wp_hold_main(int argc, char **argv) {
  if (argc == 2 && !strcmp(argv[1], "--probe")) return probe();
  if (argc != 3) {
    fprintf(stderr, "usage: fp-agent wp-hold SOCKET PID\n");
    return 2;
  }
  const char *path = argv[1];
  long pid = strtol(argv[2], NULL, 10);
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  /* Bound and listening under a name of its own, then renamed onto PATH: the engine takes a new
   * file at PATH for a holder that listens (bound there, one could be refused before its listen). */
  char bound[sizeof(addr.sun_path)];
  if (pid <= 0 || snprintf(bound, sizeof(bound), "%s~", path) >= (int)sizeof(bound)) {
    fprintf(stderr, "wp-hold: bad arguments\n");
    return 2;
  }
  int pidfd = (int)syscall(SYS_pidfd_open, (pid_t)pid, 0);
  if (pidfd < 0) {
    fprintf(stderr, "wp-hold: pid %ld: %s\n", pid, strerror(errno));
    return 1;
  }
  strcpy(addr.sun_path, path);
  /* A holder still listening there is one a server before this one started for the same
   * sandbox: it goes first, with what it holds (its protection would outlast every re-arming). */
  int old = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  struct timeval tv = {.tv_sec = 1};
  if (old >= 0 && !setsockopt(old, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) && !connect(old, (struct sockaddr *)&addr, sizeof(addr))) {
    char ack;
    if (send(old, "Q", 1, MSG_NOSIGNAL) == 1) (void)!recv(old, &ack, 1, 0);
  }
  if (old >= 0) close(old);
  int sk = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  umask(077);
  strcpy(addr.sun_path, bound);
  unlink(bound);
  if (sk < 0 || bind(sk, (struct sockaddr *)&addr, sizeof(addr)) || listen(sk, 4) || rename(bound, path)) {
    fprintf(stderr, "wp-hold: %s: %s\n", path, strerror(errno));
    return 1;
  }
  for (;;) {
    struct pollfd p[2] = {{.fd = pidfd, .events = POLLIN}, {.fd = sk, .events = POLLIN}};
    if (poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return 1;
    }
    if (p[0].revents) break;
    if (p[1].revents & POLLIN) {
      int conn = accept4(sk, NULL, NULL, SOCK_CLOEXEC);
      if (conn >= 0) {
        serve(conn);
        close(conn);
      }
    }
  }
  /* The socket file stays: the next holder, of a tree restored since, may be bound there. */
  return 0;
}
