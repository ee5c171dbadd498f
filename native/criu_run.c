/* fp-agent criu-run --cache DIR [--netns-of PID | --new-netns] -- CRIU ARGS...
 *
 * CRIU keeps its kernel-probe cache (kdat) only when /run is a tmpfs; on hosts whose /run is
 * not, every call re-probes the kernel (15-20 ms). This runs CRIU in a mount namespace of its
 * own with DIR, a tmpfs that outlives the call, bound on /run.
 *
 * CRIU also dumps and restores a network namespace only when it differs from its own, and
 * doing so costs it a sysfs mount and two walks of the host's conntrack table (~20 ms). The
 * sandbox's netns holds nothing but lo, so CRIU runs inside it instead: --netns-of PID for a
 * dump, --new-netns (a fresh netns with lo up, inherited by the restored tree) for a restore. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <unistd.h>

#include "fp.h"

static int enter_netns_of(const char *pid) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/ns/net", atoi(pid));
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  int rc = setns(fd, CLONE_NEWNET);
  close(fd);
  return rc;
}

int criu_run_main(int argc, char **argv) {
  const char *cache = NULL, *netns_of = NULL;
  int new_netns = 0;
  int i = 1;
  for (; i < argc; i++) {
    if (!strcmp(argv[i], "--cache") && i + 1 < argc) cache = argv[++i];
    else if (!strcmp(argv[i], "--netns-of") && i + 1 < argc) netns_of = argv[++i];
    else if (!strcmp(argv[i], "--new-netns")) new_netns = 1;
    else if (!strcmp(argv[i], "--")) { i++; break; }
  }
  if (i >= argc) {
    fprintf(stderr, "criu-run: no command\n");
    return 2;
  }
  if (netns_of && enter_netns_of(netns_of) < 0) {
    perror("criu-run: enter the sandbox's netns");
    return 1;
  }
  if (new_netns && (unshare(CLONE_NEWNET) < 0 || loopback_up() < 0)) {
    perror("criu-run: new netns");
    return 1;
  }
  if (cache) {
    if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0 ||
        mount(cache, "/run", NULL, MS_BIND, NULL) < 0) {
      perror("criu-run: private /run");
      /* Without the cache CRIU still works, only slower. */
    }
  }
  execv(argv[i], argv + i);
  perror("criu-run: exec");
  return 127;
}
