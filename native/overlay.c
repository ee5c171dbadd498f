/* fp-agent mount-overlay DIR TARGET OPTIONS | fp-agent umount TARGET
 *
 * mount(2) and umount2(2) without util-linux: the checkpoint pause runs one of each, and a
 * static helper starts in a fraction of the time mount(8) takes. Overlay paths in OPTIONS
 * are relative to DIR, which keeps the option string short (the kernel cuts it at a page). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <unistd.h>

#include "fp.h"

int overlay_main(int argc, char **argv) {
  if (argc == 4 && !strcmp(argv[0], "mount-overlay")) {
    if (chdir(argv[1]) < 0) {
      fprintf(stderr, "mount-overlay: chdir %s: %s\n", argv[1], strerror(errno));
      return 1;
    }
    if (mount("overlay", argv[2], "overlay", 0, argv[3]) < 0) {
      fprintf(stderr, "mount-overlay: %s: %s\n", argv[2], strerror(errno));
      return 1;
    }
    return 0;
  }
  if (argc == 2 && !strcmp(argv[0], "umount")) {
    if (umount2(argv[1], 0) < 0) {
      fprintf(stderr, "umount: %s: %s\n", argv[1], strerror(errno));
      return errno == EBUSY ? 16 : 1;
    }
    return 0;
  }
  fprintf(stderr, "usage: fp-agent mount-overlay DIR TARGET OPTIONS | umount TARGET\n");
  return 2;
}

/* fp-agent syncfs PATH: flush the filesystem PATH is on (sync -f, without coreutils' start-up). */
int syncfs_main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: fp-agent syncfs PATH\n");
    return 2;
  }
  int fd = open(argv[1], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0 || syncfs(fd) < 0) {
    fprintf(stderr, "syncfs %s: %s\n", argv[1], strerror(errno));
    return 1;
  }
  close(fd);
  return 0;
}
