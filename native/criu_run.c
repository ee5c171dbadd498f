/* fp-agent criu-run --cache DIR -- CRIU ARGS...
 *
 * CRIU keeps its kernel-probe cache (kdat) only when /run is a tmpfs; on hosts whose /run is
 * not, every call re-probes the kernel (15-20 ms). This runs CRIU in a mount namespace of its
 * own with DIR, a tmpfs that outlives the call, bound on /run. */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <unistd.h>

#include "fp.h"

int criu_run_main(int argc, char **argv) {
  const char *cache = NULL;
  int i = 1;
  for (; i < argc; i++) {
    if (!strcmp(argv[i], "--cache") && i + 1 < argc) cache = argv[++i];
    else if (!strcmp(argv[i], "--")) { i++; break; }
  }
  if (i >= argc) {
    fprintf(stderr, "criu-run: no command\n");
    return 2;
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
