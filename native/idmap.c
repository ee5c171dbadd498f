/* A sandbox's disk seen through its uid range: an overlay whose every layer is an idmapped
 * mount (MOUNT_ATTR_IDMAP), so that layers stay on disk in canonical ids (0..65535, as images
 * have them) and are shared by sandboxes of different ranges, while the sandbox's processes,
 * host uids BASE..BASE+65535, see them as 0..65535.
 *
 * The overlay is built with the fd-based mount API (layers passed as detached idmapped mounts,
 * "lowerdir+" by fd: no path of them in the option string, no mount left in any namespace) and
 * created with fsuid/fsgid BASE: overlayfs does its own work in the upper (work dirs,
 * whiteouts, copy-up) with its creator's credentials, and host uid 0 has no id in the upper's
 * map (EOVERFLOW). Everything here runs on the host, as root, before the sandbox exists. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/fsuid.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <unistd.h>
#include <linux/mount.h>
#include <linux/securebits.h>

#include "fp.h"

#define OVERLAYFS_SUPER_MAGIC 0x794c7630
/* The kernel's limit on lower layers (overlay.ts checks it first). */
#define MAX_LAYERS 500

static int fail_errno(char *err, size_t errlen, const char *what, const char *arg) {
  snprintf(err, errlen, "%s%s%.300s: %s", what, arg ? " " : "", arg ? arg : "", strerror(errno));
  return -1;
}

int write_id_maps(pid_t pid, unsigned long base, char *err, size_t errlen) {
  char path[64], map[64];
  int n = snprintf(map, sizeof(map), "0 %lu %u\n", base, FP_RANGE_SIZE);
  const char *files[] = {"uid_map", "gid_map"};
  for (int k = 0; k < 2; k++) {
    snprintf(path, sizeof(path), "/proc/%d/%s", (int)pid, files[k]);
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0 || write(fd, map, (size_t)n) != n) {
      if (fd >= 0) close(fd);
      return fail_errno(err, errlen, "write", path);
    }
    close(fd);
  }
  return 0;
}

/* A user namespace mapping 0..65535 to BASE..: only its map is used (MOUNT_ATTR_IDMAP holds a
 * reference to it); the child that made it exits at once. */
int userns_for_range(unsigned long base, char *err, size_t errlen) {
  int made[2], done[2];
  if (pipe2(made, O_CLOEXEC) < 0 || pipe2(done, O_CLOEXEC) < 0) return fail_errno(err, errlen, "pipe", NULL);
  pid_t child = fork();
  if (child < 0) return fail_errno(err, errlen, "fork", NULL);
  if (child == 0) {
    close(made[0]);
    close(done[1]);
    char c = unshare(CLONE_NEWUSER) == 0 ? 'u' : 'x';
    if (write(made[1], &c, 1) < 0) {}
    if (read(done[0], &c, 1) < 0) {} /* EOF: the parent has what it needs */
    _exit(0);
  }
  close(made[1]);
  close(done[0]);
  char c = 0;
  int fd = -1;
  if (read(made[0], &c, 1) != 1 || c != 'u') {
    errno = c == 'x' ? EPERM : EIO;
    fail_errno(err, errlen, "unshare a user namespace", NULL);
  } else if (write_id_maps(child, base, err, errlen) == 0) {
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/ns/user", (int)child);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail_errno(err, errlen, "open", path);
  }
  close(made[0]);
  close(done[1]);
  while (waitpid(child, NULL, 0) < 0 && errno == EINTR) {}
  return fd;
}

/* A detached clone of the mount at DIRFD/PATH, idmapped by USERNS. */
static int idmapped_tree(int dirfd, const char *path, int userns, char *err, size_t errlen) {
  int tree = (int)syscall(SYS_open_tree, dirfd, path, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
  if (tree < 0) return fail_errno(err, errlen, "clone the mount of", path);
  struct mount_attr attr = {.attr_set = MOUNT_ATTR_IDMAP, .userns_fd = (unsigned long long)userns};
  if (syscall(SYS_mount_setattr, tree, "", AT_EMPTY_PATH, &attr, sizeof(attr)) < 0) {
    fail_errno(err, errlen, "idmap", path);
    close(tree);
    return -1;
  }
  return tree;
}

static int set_fd(int fs, const char *key, int fd, const char *path, char *err, size_t errlen) {
  if (syscall(SYS_fsconfig, fs, FSCONFIG_SET_FD, key, NULL, fd) < 0) return fail_errno(err, errlen, key, path);
  return 0;
}

/* Splits "PARENT/NAME" at its last slash (upper and work must share PARENT: overlayfs wants
 * them on one mount, and each idmapped clone is a mount of its own). */
static const char *leaf(char *path) {
  char *slash = strrchr(path, '/');
  if (!slash) return NULL;
  *slash = 0;
  return slash + 1;
}

/* The overlay's superblock, its creator mapped into the range (see the top of this file). */
static int create_as_range(int fs, unsigned long base, char *err, size_t errlen) {
  int bits = prctl(PR_GET_SECUREBITS);
  /* Without NO_SETUID_FIXUP a change of fsuid from 0 drops the fs capabilities, which overlayfs
   * needs (copy-up of files the owner cannot read, trusted.* xattrs, whiteouts). */
  if (bits < 0 || prctl(PR_SET_SECUREBITS, (unsigned long)bits | SECBIT_NO_SETUID_FIXUP) < 0)
    return fail_errno(err, errlen, "securebits", NULL);
  setfsgid((gid_t)base);
  setfsuid((uid_t)base);
  int rc = (int)syscall(SYS_fsconfig, fs, FSCONFIG_CMD_CREATE, NULL, NULL, 0);
  int saved = errno;
  setfsuid(0);
  setfsgid(0);
  prctl(PR_SET_SECUREBITS, (unsigned long)bits);
  errno = saved;
  if (rc < 0) {
    char log[256];
    ssize_t n = read(fs, log, sizeof(log) - 1); /* the kernel's reason, if it gave one */
    log[n > 0 ? n : 0] = 0;
    snprintf(err, errlen, "create the overlay: %s%s%s", strerror(saved), n > 0 ? ": " : "", log);
    return -1;
  }
  return 0;
}

/* The layers' detached trees once the overlay holds its own clones of them. The last close of a
 * detached tree unmounts it and waits out an expedited RCU grace period, one a layer: ~0.4 ms of
 * a fork's disk, more behind other grace periods. A caller that has something more urgent to do
 * first (the CRIU relay: the restore) defers them and closes them when it is done. */
static int deferred[MAX_LAYERS + 1];
static int ndeferred = -1; /* -1: closed at once */

void defer_tree_closes(void) {
  if (ndeferred < 0) ndeferred = 0;
}

void close_deferred_trees(void) {
  while (ndeferred > 0) close(deferred[--ndeferred]);
}

static void close_tree(int fd) {
  if (fd < 0) return;
  if (ndeferred >= 0 && ndeferred < (int)(sizeof(deferred) / sizeof(*deferred))) deferred[ndeferred++] = fd;
  else close(fd);
}

/* OPTIONS as overlay_options() writes them: lowerdir=A:B:...,upperdir=U,workdir=W[,index=off],
 * paths relative to DIR. Returns a detached mount, or -1 with a message in ERR. */
static int idmapped_overlay(const char *dir, const char *options, unsigned long base, char *err, size_t errlen) {
  char opts[4096];
  if (snprintf(opts, sizeof(opts), "%s", options) >= (int)sizeof(opts)) {
    snprintf(err, errlen, "overlay options too long");
    return -1;
  }
  int dirfd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (dirfd < 0) return fail_errno(err, errlen, "open", dir);
  int userns = userns_for_range(base, err, errlen);
  int fs = userns < 0 ? -1 : (int)syscall(SYS_fsopen, "overlay", FSOPEN_CLOEXEC);
  int rc = -1, disk = -1, mnt = -1, ntrees = 0;
  /* A detached tree's anonymous namespace dies with its last fd, and overlayfs clones the
   * layers only when the superblock is created: every fd stays open until then. */
  static int trees[MAX_LAYERS];
  char *upper = NULL, *work = NULL;
  if (userns >= 0 && fs < 0) fail_errno(err, errlen, "fsopen overlay", NULL);
  if (fs < 0) goto out;
  rc = 0;
  for (char *save = NULL, *opt = strtok_r(opts, ",", &save); rc == 0 && opt; opt = strtok_r(NULL, ",", &save)) {
    if (!strncmp(opt, "lowerdir=", 9)) {
      for (char *s2 = NULL, *lower = strtok_r(opt + 9, ":", &s2); rc == 0 && lower; lower = strtok_r(NULL, ":", &s2)) {
        if (ntrees == MAX_LAYERS) {
          snprintf(err, errlen, "more than %d layers", MAX_LAYERS);
          rc = -1;
          break;
        }
        int tree = idmapped_tree(dirfd, lower, userns, err, errlen);
        if (tree >= 0) trees[ntrees++] = tree;
        rc = tree < 0 ? -1 : set_fd(fs, "lowerdir+", tree, lower, err, errlen);
      }
    } else if (!strncmp(opt, "upperdir=", 9)) upper = opt + 9;
    else if (!strncmp(opt, "workdir=", 8)) work = opt + 8;
    else {
      char *eq = strchr(opt, '=');
      if (eq) *eq = 0;
      if (syscall(SYS_fsconfig, fs, FSCONFIG_SET_STRING, opt, eq ? eq + 1 : NULL, 0) < 0) rc = fail_errno(err, errlen, "overlay option", opt);
    }
  }
  if (rc < 0) goto out;
  rc = -1;
  const char *upper_leaf = upper ? leaf(upper) : NULL, *work_leaf = work ? leaf(work) : NULL;
  if (!upper_leaf || !work_leaf || strcmp(upper, work)) {
    snprintf(err, errlen, "upper and work dirs must share a parent");
    goto out;
  }
  disk = idmapped_tree(dirfd, upper, userns, err, errlen);
  if (disk < 0) goto out;
  int up = openat(disk, upper_leaf, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  int wk = openat(disk, work_leaf, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (up < 0 || wk < 0) fail_errno(err, errlen, "open the upper and work dirs in", upper);
  else if (set_fd(fs, "upperdir", up, upper_leaf, err, errlen) == 0 && set_fd(fs, "workdir", wk, work_leaf, err, errlen) == 0 &&
           create_as_range(fs, base, err, errlen) == 0) {
    mnt = (int)syscall(SYS_fsmount, fs, FSMOUNT_CLOEXEC, 0);
    if (mnt < 0) fail_errno(err, errlen, "fsmount", NULL);
  }
  if (up >= 0) close(up);
  if (wk >= 0) close(wk);
out:
  while (ntrees > 0) close_tree(trees[--ntrees]);
  close_tree(disk);
  if (fs >= 0) close(fs);
  if (userns >= 0) close(userns);
  close(dirfd);
  return mnt;
}

/* As replace_overlay, with every layer idmapped to the range at BASE. */
int replace_overlay_idmapped(const char *dir, const char *target, const char *options, unsigned long base, char *err, size_t errlen) {
  int mnt = idmapped_overlay(dir, options, base, err, errlen);
  if (mnt < 0) return -1;
  int rc = -1;
  if (umount2(target, MNT_DETACH) < 0 && errno != EINVAL) fail_errno(err, errlen, "detach", target);
  else if (syscall(SYS_move_mount, mnt, "", AT_FDCWD, target, MOVE_MOUNT_F_EMPTY_PATH) < 0) fail_errno(err, errlen, "attach the overlay on", target);
  else {
    struct statfs st;
    if (statfs(target, &st) < 0 || st.f_type != OVERLAYFS_SUPER_MAGIC) snprintf(err, errlen, "%s is not an overlay after mounting it", target);
    else rc = 0;
  }
  close(mnt);
  return rc;
}

/* The overlay mount a sandbox needs: idmapped when BASE is a range (>= 0). */
int mount_disk_for(const char *dir, const char *target, const char *options, long base, char *err, size_t errlen) {
  return base >= 0 ? replace_overlay_idmapped(dir, target, options, (unsigned long)base, err, errlen)
                   : replace_overlay(dir, target, options, err, errlen);
}

/* The calling thread's user namespace's own bounds on the kernel's per-user counters (each is
 * also charged to the namespace's owner, the host's root, up to the host's limit): a sandbox
 * gets what one Linux user gets by default, and can make no namespace (its seccomp filter
 * refuses that too; mount namespaces are left: an fd-based mount clone is one). Written as the
 * namespace's root, from inside it. */
int userns_limits(char *err, size_t errlen) {
  static const struct { const char *name, *value; } limits[] = {
    /* the inotify bounds are engine/kernel-limits.ts INOTIFY_PER_SANDBOX */
    {"max_inotify_instances", "128"}, {"max_inotify_watches", "65536"}, {"max_fanotify_groups", "0"},
    {"max_fanotify_marks", "0"}, {"max_user_namespaces", "0"},
    {"max_net_namespaces", "0"}, {"max_pid_namespaces", "0"}, {"max_ipc_namespaces", "0"},
    {"max_uts_namespaces", "0"}, {"max_cgroup_namespaces", "0"}, {"max_time_namespaces", "0"},
  };
  for (size_t i = 0; i < sizeof(limits) / sizeof(*limits); i++) {
    char path[96];
    snprintf(path, sizeof(path), "/proc/sys/user/%s", limits[i].name);
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT) continue; /* a counter this kernel does not have */
    ssize_t n = fd < 0 ? -1 : write(fd, limits[i].value, strlen(limits[i].value));
    if (fd >= 0) close(fd);
    if (n != (ssize_t)strlen(limits[i].value)) return fail_errno(err, errlen, "limit", path);
  }
  return 0;
}

/* userns_limits for the user namespace PID is in (a tree CRIU restored: it made the namespace
 * afresh, unbounded), from a helper that joins it, while the caller goes on. */
static int limits_in(const void *arg, char *err, size_t errlen) {
  int ns = *(const int *)arg;
  if (setns(ns, CLONE_NEWUSER) < 0) return fail_errno(err, errlen, "join the tree's user namespace", NULL);
  return userns_limits(err, errlen);
}

int userns_limits_start(pid_t pid, struct helper *h, char *err, size_t errlen) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/ns/user", (int)pid);
  h->pid = -1;
  int ns = open(path, O_RDONLY | O_CLOEXEC);
  if (ns < 0) return fail_errno(err, errlen, "open", path);
  int rc = helper_start(h, limits_in, &ns, err, errlen);
  close(ns);
  return rc;
}

/* A detached clone of a volume's directory DIR, as a sandbox mounts it: nosuid, nodev,
 * read-only if asked, and idmapped to the range at BASE when BASE >= 0 (the volume's files stay
 * in canonical ids on its disk, like layers, so that sandboxes of other ranges share them).
 * DIR is forkpoint's own path (the volume's disk, mounted by the engine); O_NOFOLLOW on its
 * last component all the same. Made on the host, as its root: idmapping a mount needs the
 * host's CAP_SYS_ADMIN, which the sandbox's user namespace never has. */
int volume_tree(const char *dir, long base, int read_only, char *err, size_t errlen) {
  int tree = (int)syscall(SYS_open_tree, AT_FDCWD, dir, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_SYMLINK_NOFOLLOW);
  if (tree < 0) return fail_errno(err, errlen, "clone the volume", dir);
  struct mount_attr attr = {.attr_set = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | (read_only ? MOUNT_ATTR_RDONLY : 0)};
  int userns = -1;
  if (base >= 0) {
    userns = userns_for_range((unsigned long)base, err, errlen);
    if (userns < 0) {
      close(tree);
      return -1;
    }
    attr.attr_set |= MOUNT_ATTR_IDMAP;
    attr.userns_fd = (unsigned long long)userns;
  }
  int rc = (int)syscall(SYS_mount_setattr, tree, "", AT_EMPTY_PATH, &attr, sizeof(attr));
  if (rc < 0) fail_errno(err, errlen, "set the volume's mount attributes", dir);
  if (userns >= 0) close(userns);
  if (rc < 0) {
    close(tree);
    return -1;
  }
  return tree;
}
