/* fp-agent boot: turn a mounted overlay into a sandbox and exec the agent as its PID 1.
 *
 * New pid, mount, uts, ipc and net namespaces; private propagation; proc, a small /dev and a
 * devpts of its own; pivot_root (chroot cannot be dumped by CRIU); lo up; a container-like
 * capability set without CAP_SYS_ADMIN and friends; no_new_privs; no fd from the host.
 *
 * The parent writes the host pid of the sandbox's PID 1 to --pidfile once the child is ready,
 * then exits, leaving the sandbox to the shim that started it. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>
#include <grp.h>
#include <sys/wait.h>
#include <linux/capability.h>
#include <linux/mount.h>
#include <linux/openat2.h>

#include "fp.h"

static int report_fd = -1;
/* --userns BASE: the sandbox's ids 0..65535 are the host's BASE..BASE+65535 (-1: none). */
static long userns_base = -1;
/* --unconfined (benchmarks only: the cost of the masks and the filter, measured in one run)
 * leaves /proc unmasked and installs no seccomp filter. */
static int confined = 1;

/* --volume DIR TARGET ro|rw: a persistent volume (the engine's volumes.ts), its directory on
 * the host and where the sandbox sees it. The trees are cloned on the host before anything is
 * unshared (volume_tree), attached inside the new root before the sandbox runs anything. */
#define MAX_VOLUMES 16
static struct {
  const char *dir, *target;
  int read_only, tree;
} volumes[MAX_VOLUMES];
static int nvolumes = 0;

/* --own-mount PATH: a directory of the sandbox's own disk mounted on itself (its image's
 * VOLUME), so that it is a mount point of its own, as tools that look for a separate filesystem
 * expect. Made after the volumes, whose mount points the engine keeps apart from these. */
#define MAX_OWN_MOUNTS 16
static const char *own_mounts[MAX_OWN_MOUNTS];
static int nown_mounts = 0;

static void fail(const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  n += snprintf(msg + n, sizeof(msg) - (size_t)n, ": %s", strerror(errno));
  if (report_fd >= 0 && write(report_fd, msg, strlen(msg))) {}
  _exit(1);
}

static int make_dev(const char *dir, const char *name, mode_t mode, unsigned maj, unsigned min) {
  char path[PATH_MAX];
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  if (mknod(path, S_IFCHR | mode, makedev(maj, min)) < 0 && errno != EEXIST) return -1;
  return chmod(path, mode);
}

static int make_link(const char *dir, const char *name, const char *target) {
  char path[PATH_MAX];
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  return symlink(target, path) < 0 && errno != EEXIST ? -1 : 0;
}

/* The device nodes, links and mount points a sandbox's /dev holds, created in DIR. */
static int populate_dev(const char *dir) {
  char path[PATH_MAX];
  snprintf(path, sizeof(path), "%s/pts", dir);
  if (mkdir(path, 0755) < 0 && errno != EEXIST) return -1;
  snprintf(path, sizeof(path), "%s/shm", dir);
  if ((mkdir(path, 01777) < 0 && errno != EEXIST) || chmod(path, 01777) < 0) return -1;
  if (make_dev(dir, "null", 0666, 1, 3) || make_dev(dir, "zero", 0666, 1, 5) || make_dev(dir, "full", 0666, 1, 7) ||
      make_dev(dir, "random", 0666, 1, 8) || make_dev(dir, "urandom", 0666, 1, 9) || make_dev(dir, "tty", 0666, 5, 0))
    return -1;
  if (make_link(dir, "ptmx", "pts/ptmx") || make_link(dir, "fd", "/proc/self/fd") || make_link(dir, "stdin", "/proc/self/fd/0") ||
      make_link(dir, "stdout", "/proc/self/fd/1") || make_link(dir, "stderr", "/proc/self/fd/2"))
    return -1;
  return 0;
}

/* fp-agent mkdev DIR: fills the agent layer's /dev, so that sandboxes need no tmpfs there
 * (CRIU saves a tmpfs by running tar and gzip, on every dump and every restore). */
int mkdev_main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: fp-agent mkdev DIR\n");
    return 2;
  }
  if (populate_dev(argv[1]) < 0) {
    perror("mkdev");
    return 1;
  }
  return 0;
}

static int is_chardev(const char *path, unsigned maj, unsigned min) {
  struct stat st;
  return lstat(path, &st) == 0 && S_ISCHR(st.st_mode) && st.st_rdev == makedev(maj, min);
}

/* A directory of the sandbox's own, not a symlink: mounts go on it. */
static void need_dir(const char *path, mode_t mode) {
  struct stat st;
  if (mkdir(path, mode) < 0 && errno != EEXIST) fail("mkdir %s", path);
  if (lstat(path, &st) < 0 || !S_ISDIR(st.st_mode)) {
    errno = ENOTDIR;
    fail("%s", path);
  }
}

/* A boot id of the sandbox's own, bound over the kernel's (the host's, the same in every
 * sandbox): new at every boot, and what it was after a checkpoint's restore, a rollback, a fork
 * or a wake (its file is on the disk the restore mounts, the bind mount in the tree CRIU
 * restores), as a VM's is across a snapshot. E2B's SDK tells a cold boot from a memory restore
 * by it. Paths resolve in the sandbox's own root (after pivot_root). */
static void own_boot_id(void) {
  char id[64];
  int in = open("/proc/sys/kernel/random/uuid", O_RDONLY | O_CLOEXEC);
  ssize_t n = in >= 0 ? read(in, id, sizeof(id)) : -1;
  if (in >= 0) close(in);
  if (n != 37) fail("read a uuid");
  int out = open("/.fp/boot_id", O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0444);
  if (out < 0 || write(out, id, (size_t)n) != n) fail("write /.fp/boot_id");
  close(out);
  if (mount("/.fp/boot_id", "/proc/sys/kernel/random/boot_id", NULL, MS_BIND, NULL) < 0) fail("bind the boot id");
}

/* /dev comes from the agent layer; a tmpfs only when the image hides it (or the instance
 * runs on an agent layer from before /dev was in it). */
static void setup_dev(void) {
  need_dir("/dev", 0755);
  if (!is_chardev("/dev/null", 1, 3) || !is_chardev("/dev/tty", 5, 0)) {
    if (mount("tmpfs", "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC | MS_STRICTATIME, "mode=755,size=65536k") < 0)
      fail("mount /dev");
    if (populate_dev("/dev") < 0) fail("populate /dev");
  }
  need_dir("/dev/pts", 0755);
  if (mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620") < 0)
    fail("mount devpts");
}

/* Docker's default set, less CAP_MKNOD: everything else leaves the bounding set. */
static int cap_kept(int cap) {
  switch (cap) {
    case CAP_CHOWN: case CAP_DAC_OVERRIDE: case CAP_FSETID: case CAP_FOWNER: case CAP_NET_RAW:
    case CAP_SETGID: case CAP_SETUID: case CAP_SETFCAP: case CAP_SETPCAP: case CAP_NET_BIND_SERVICE:
    case CAP_SYS_CHROOT: case CAP_KILL: case CAP_AUDIT_WRITE:
      return 1;
    default:
      return 0;
  }
}

/* Every capability set, not the bounding set alone (confine.c). */
static void drop_capabilities(void) {
  if (keep_capabilities(cap_kept) < 0) fail("drop capabilities");
}

/* Every fd but the report pipe is the host's: close them and put /dev/null on stdio. */
static void close_host_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  if (!d) fail("opendir fd");
  int dfd = dirfd(d);
  struct dirent *e;
  while ((e = readdir(d))) {
    int fd = atoi(e->d_name);
    if (e->d_name[0] == '.' || fd == dfd || fd == report_fd) continue;
    close(fd);
  }
  closedir(d);
  int null = open("/dev/null", O_RDWR);
  if (null != 0) fail("reopen stdio");
  dup2(0, 1);
  dup2(0, 2);
}

/* The directory TARGET names under ROOT (an fd of the sandbox's root), made where missing, one
 * component at a time: a symlink, "..", or another mount on the way fails (the layers under it
 * may come from a sandbox's own checkpoint, so nothing on the path is trusted). */
static int volume_mountpoint(int root, const char *target) {
  char path[PATH_MAX];
  if (snprintf(path, sizeof(path), "%s", target) >= (int)sizeof(path)) {
    errno = ENAMETOOLONG;
    return -1;
  }
  struct open_how how = {
    .flags = O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC,
    .resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV,
  };
  int dir = dup(root);
  for (char *save = NULL, *name = strtok_r(path, "/", &save); dir >= 0 && name; name = strtok_r(NULL, "/", &save)) {
    if (!strcmp(name, ".") || !strcmp(name, "..")) {
      close(dir);
      errno = EINVAL;
      return -1;
    }
    int next = (int)syscall(SYS_openat2, dir, name, &how, sizeof(how));
    if (next < 0 && errno == ENOENT && (mkdirat(dir, name, 0755) == 0 || errno == EEXIST))
      next = (int)syscall(SYS_openat2, dir, name, &how, sizeof(how));
    close(dir);
    dir = next;
  }
  return dir;
}

/* Every volume on its mount point in the new root (the current directory). */
static void attach_volumes(void) {
  if (nvolumes == 0) return;
  int root = open(".", O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (root < 0) fail("open the root");
  for (int i = 0; i < nvolumes; i++) {
    int at = volume_mountpoint(root, volumes[i].target);
    if (at < 0) fail("volume mount point %s", volumes[i].target);
    if (syscall(SYS_move_mount, volumes[i].tree, "", at, "", MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH) < 0)
      fail("mount the volume on %s", volumes[i].target);
    close(at);
    close(volumes[i].tree);
  }
  close(root);
}

/* Every own mount on itself, in the new root (the current directory): the directory (made where
 * missing, nothing on its path followed: volume_mountpoint) cloned and attached on itself. */
static void attach_own_mounts(void) {
  if (nown_mounts == 0) return;
  int root = open(".", O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (root < 0) fail("open the root");
  for (int i = 0; i < nown_mounts; i++) {
    int at = volume_mountpoint(root, own_mounts[i]);
    if (at < 0) fail("mount point %s", own_mounts[i]);
    int tree = (int)syscall(SYS_open_tree, at, "", OPEN_TREE_CLONE | AT_EMPTY_PATH | O_CLOEXEC);
    if (tree < 0) fail("clone %s", own_mounts[i]);
    if (syscall(SYS_move_mount, tree, "", at, "", MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH) < 0) fail("mount %s on itself", own_mounts[i]);
    close(tree);
    close(at);
  }
  close(root);
}

/* The sandbox's PID 1, in its namespaces, its cwd the root of its disk (a mount point): turns
 * that into its root and execs the agent. */
static void sandbox_init(const char *hostname) {
  if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0) fail("make / private");
  /* pivot_root refuses a locked mount, and every mount copied into a user namespace's mount
   * namespace is locked: the root becomes a clone of itself, made here (so not locked), reached
   * by its fd (the host's path to it may not be searchable by the sandbox's ids). */
  int tree = (int)syscall(SYS_open_tree, AT_FDCWD, ".", OPEN_TREE_CLONE | O_CLOEXEC);
  if (tree < 0) fail("clone the root mount");
  if (syscall(SYS_move_mount, tree, "", AT_FDCWD, ".", MOVE_MOUNT_F_EMPTY_PATH) < 0) fail("attach the root mount");
  if (fchdir(tree) < 0) fail("enter the root mount");
  close(tree);
  attach_volumes();
  attach_own_mounts();
  /* /proc before the old root goes: in a user namespace the kernel mounts a procfs only while
   * a fully visible one is in the mount namespace. "proc" is one name, checked to be a
   * directory of the sandbox's own (need_dir), and nothing of the sandbox runs yet. */
  need_dir("proc", 0555);
  if (mount("proc", "proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0) fail("mount proc");
  /* Into the sandbox's root, and only then mount inside it: every path below resolves against
   * the sandbox's own root, so a symlink it left on its disk points inside it. */
  if (syscall(SYS_pivot_root, ".", ".") < 0) fail("pivot_root");
  if (umount2(".", MNT_DETACH) < 0) fail("detach old root");
  if (chdir("/") < 0) fail("chdir /");
  /* Before the masks make /proc/sys read-only. */
  if (loopback_up() < 0 || netns_defaults() < 0) fail("lo up");
  need_dir("/tmp", 01777);
  setup_dev();
  need_dir("/" CONFINE_EMPTY_DIR, 0555);
  char err[256];
  if (confined && confine_proc(err, sizeof(err)) < 0) {
    errno = EPERM;
    fail("%s", err);
  }
  /* After the masks: bound before, it would be copied into the read-only /proc/sys and left
   * under it, a second mount every dump and restore carries for nothing. */
  own_boot_id();
  if (sethostname(hostname, strlen(hostname)) < 0) fail("sethostname");
  if (setsid() < 0) fail("setsid");
  close_host_fds();
  /* The agent is the last thing the OOM killer should pick; it resets this for its children.
   * (In a user namespace the boot process does it: lowering it needs the host's CAP_SYS_RESOURCE.) */
  int oom = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
  if (oom >= 0) {
    if (write(oom, "-1000", 5) < 0) {}
    close(oom);
  }
  /* The filter goes on while this process still holds CAP_SYS_ADMIN (the host's, or its user
   * namespace's), which loading it without no_new_privs needs; it allows what comes after. */
  if (confined && install_seccomp(err, sizeof(err)) < 0) {
    errno = EPERM;
    fail("%s", err);
  }
  drop_capabilities();
  /* no_new_privs: a set-user-id program gains nothing. In a user namespace the most it could
   * gain is the sandbox's own root, a host id of the sandbox's range with the capabilities above
   * (Docker's default posture), and sudo in E2B's base needs it; on the host's ids that root is
   * the host's uid 0, so there every process of the sandbox keeps no_new_privs. */
  if (userns_base < 0 && prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) fail("no_new_privs");
  /* A sandbox starts no higher than the default priority, whatever the server runs at (it may
   * run above its sandboxes: FORKPOINT_SERVER_NICE). Raising one's nice value needs no
   * privilege; a server run below the default leaves its sandboxes there too. */
  errno = 0;
  int nice_now = getpriority(PRIO_PROCESS, 0);
  if (errno == 0 && nice_now < 0 && setpriority(PRIO_PROCESS, 0, 0) < 0) fail("setpriority");
  char *argv[] = {"fp-agent", "init", NULL};
  char *envp[] = {"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", NULL};
  /* The report pipe is close-on-exec: EOF on it tells the parent the exec happened. */
  execve("/.fp/agent", argv, envp);
  fail("exec /.fp/agent");
}

/* Without a user namespace: the boot process made the pid namespace; the rest is the child's. */
static void sandbox_child(const char *root, const char *hostname) {
  /* Only the child enters the new mount namespace: pivot_root moves the root of every
   * process in it, and the parent still has a pidfile to write on the host. No cgroup
   * namespace: CRIU, run with its cgroup handling off to keep pauses short, would not
   * restore one (README, "Security"). */
  if (chdir(root) < 0) fail("chdir root");
  if (unshare(CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWNET) < 0) fail("unshare");
  sandbox_init(hostname);
}

/* With a user namespace: the child makes it (as the host's root, so that CRIU, run as root,
 * owns it and holds every capability in it: on hosts whose root lacks CAP_SYS_RESOURCE, as
 * here, CRIU could not read the rlimits of a tree of another owner), the parent writes its map,
 * the child takes the ids of its root (host BASE), bounds its per-user counters (see
 * userns_limits), makes the other namespaces, owned by the new one, and forks the sandbox's
 * PID 1. Every namespace but the user namespace belongs to it, the network's included: CRIU
 * restores a tree's TCP connections from inside it, which takes CAP_NET_ADMIN over the network
 * namespace (a sandbox's own processes hold none: it is not in their bounding set). */
static pid_t boot_userns(const char *root, const char *hostname, int report_wr) {
  int up[2], down[2];
  if (pipe2(up, O_CLOEXEC) < 0 || pipe2(down, O_CLOEXEC) < 0) return -1;
  pid_t maker = fork();
  if (maker < 0) return -1;
  if (maker == 0) {
    close(up[0]);
    close(down[1]);
    report_fd = report_wr;
    if (chdir(root) < 0) fail("chdir root");
    if (unshare(CLONE_NEWUSER) < 0) fail("unshare user");
    char c = 'u';
    if (write(up[1], &c, 1) != 1 || read(down[0], &c, 1) != 1 || c != 'm') _exit(1);
    /* Ids of the namespace from here on: its root is the host's BASE, never the host's 0. */
    if (setgroups(0, NULL) < 0 || setresgid(0, 0, 0) < 0 || setresuid(0, 0, 0) < 0) fail("take the range's ids");
    if (unshare(CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWNET) < 0) fail("unshare");
    /* After its own namespaces: the limits allow the sandbox to make none. */
    char err[256];
    if (userns_limits(err, sizeof(err)) < 0) {
      errno = EPERM;
      fail("%s", err);
    }
    pid_t init = fork();
    if (init < 0) fail("fork");
    if (init == 0) {
      close(up[1]);
      close(down[0]);
      sandbox_init(hostname);
    }
    if (write(up[1], &init, sizeof(init)) != sizeof(init)) _exit(1);
    _exit(0);
  }
  close(up[1]);
  close(down[0]);
  pid_t init = -1;
  char c = 0, err[256];
  if (read(up[0], &c, 1) == 1 && c == 'u') {
    if (write_id_maps(maker, (unsigned long)userns_base, err, sizeof(err)) < 0) {
      if (write(report_wr, err, strlen(err))) {}
    } else if (write(down[1], "m", 1) == 1 && read_full(up[0], &init, sizeof(init)) < 0) {
      init = -1;
    }
  }
  close(up[0]);
  close(down[1]);
  while (waitpid(maker, NULL, 0) < 0 && errno == EINTR) {}
  return init;
}

int boot_main(int argc, char **argv) {
  const char *root = NULL, *hostname = "sandbox", *pidfile = NULL, *ov_dir = NULL, *ov_options = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--unconfined")) confined = 0;
    else if (!strcmp(argv[i], "--userns") && i + 1 < argc) userns_base = atol(argv[++i]);
    else if (i + 1 >= argc) break;
    else if (!strcmp(argv[i], "--root")) root = argv[++i];
    else if (!strcmp(argv[i], "--hostname")) hostname = argv[++i];
    else if (!strcmp(argv[i], "--pidfile")) pidfile = argv[++i];
    else if (!strcmp(argv[i], "--overlay") && i + 2 < argc) ov_dir = argv[i + 1], ov_options = argv[i + 2], i += 2;
    else if (!strcmp(argv[i], "--own-mount") && nown_mounts < MAX_OWN_MOUNTS) own_mounts[nown_mounts++] = argv[++i];
    else if (!strcmp(argv[i], "--volume") && i + 3 < argc && nvolumes < MAX_VOLUMES) {
      volumes[nvolumes].dir = argv[i + 1], volumes[nvolumes].target = argv[i + 2];
      volumes[nvolumes++].read_only = !strcmp(argv[i + 3], "ro");
      i += 3;
    }
  }
  if (!root || !pidfile) {
    fprintf(stderr, "boot: --root and --pidfile are required\n");
    return 2;
  }
  /* --overlay DIR OPTIONS: mount the disk on --root first, in the host's mount namespace. */
  char err[512];
  if (ov_dir && mount_disk_for(ov_dir, root, ov_options, userns_base, err, sizeof(err)) < 0) {
    fprintf(stderr, "boot: %s\n", err);
    return 1;
  }
  for (int i = 0; i < nvolumes; i++) {
    volumes[i].tree = volume_tree(volumes[i].dir, userns_base, volumes[i].read_only, err, sizeof(err));
    if (volumes[i].tree < 0) {
      fprintf(stderr, "boot: %s\n", err);
      return 1;
    }
  }
  int pipefd[2];
  if (pipe2(pipefd, O_CLOEXEC) < 0) return 1;
  pid_t child;
  if (userns_base >= 0) {
    child = boot_userns(root, hostname, pipefd[1]);
  } else {
    if (unshare(CLONE_NEWPID) < 0) {
      perror("boot: unshare");
      return 1;
    }
    child = fork();
    if (child == 0) {
      close(pipefd[0]);
      report_fd = pipefd[1];
      sandbox_child(root, hostname);
    }
  }
  close(pipefd[1]);
  char msg[512];
  ssize_t n, total = 0;
  while ((n = read(pipefd[0], msg + total, sizeof(msg) - 1 - (size_t)total)) > 0) total += n;
  msg[total] = 0;
  if (total > 0 || child < 0) {
    fprintf(stderr, "boot: %s\n", total > 0 ? msg : "the sandbox did not start");
    return 1;
  }
  if (userns_base >= 0) {
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/oom_score_adj", (int)child);
    int oom = open(path, O_WRONLY | O_CLOEXEC);
    if (oom >= 0) {
      if (write(oom, "-1000", 5) < 0) {}
      close(oom);
    }
  }
  FILE *f = fopen(pidfile, "w");
  if (!f) {
    perror("boot: pidfile");
    return 1;
  }
  fprintf(f, "%d\n", child);
  fclose(f);
  return 0;
}
