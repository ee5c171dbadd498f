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
#include <sys/vfs.h>
#include <unistd.h>

#include "fp.h"

#define OVERLAYFS_SUPER_MAGIC 0x794c7630

/* Mounts an overlay on TARGET in place of whatever is there: the old mount is detached
 * (lazily: its last user, if any, lets go of it later, which keeps its flush off the
 * checkpoint pause), then the new one is mounted with OPTIONS, relative to DIR, and checked.
 * Returns 0, or -1 with a message in ERR. */
int replace_overlay(const char *dir, const char *target, const char *options, char *err, size_t errlen) {
  if (umount2(target, MNT_DETACH) < 0 && errno != EINVAL) {
    snprintf(err, errlen, "detach %s: %s", target, strerror(errno));
    return -1;
  }
  int cwd = open(".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (chdir(dir) < 0 || mount("overlay", target, "overlay", 0, options) < 0) {
    snprintf(err, errlen, "mount overlay on %s: %s", target, strerror(errno));
    return -1;
  }
  struct statfs st;
  if (statfs(target, &st) < 0 || st.f_type != OVERLAYFS_SUPER_MAGIC) {
    snprintf(err, errlen, "%s is not an overlay after mounting it", target);
    return -1;
  }
  if (cwd >= 0) {
    if (fchdir(cwd) < 0) {}
    close(cwd);
  }
  return 0;
}

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
