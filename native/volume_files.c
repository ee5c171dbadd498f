/* fp-agent volume-files DIR: the agent's file operations over the connected socket on fd 3,
 * rooted in a persistent volume's directory DIR with no instance mounting it (E2B's volume
 * content API).
 *
 * A volume's files are a sandbox's to shape: symlinks to host paths, `..` chains, FIFOs. The
 * server never resolves a path in it itself; this process does, from inside a mount namespace
 * whose only mount is DIR (bound onto itself, pivoted to, the host's tree detached), nosuid,
 * nodev and noexec: every path, symlinks and `..` included, ends inside the volume. It keeps
 * only the capabilities a file operation on another user's files takes (chown, dac_override,
 * fowner, fsetid, setuid and setgid for a user's fs ids), none of those that mount, chroot,
 * make devices or open by file handle (dac_read_search: a handle reaches past a bind mount's
 * root), with no_new_privs: it cannot get out of that root again. The files
 * are in canonical ids (as layers are), which this process, on the host's ids, sees as they are.
 * DIR is forkpoint's own path, the directory the volume's sandboxes see as its root. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "fp.h"

static int cap_kept(int cap) {
  switch (cap) {
    case CAP_CHOWN: case CAP_DAC_OVERRIDE: case CAP_FOWNER:
    case CAP_FSETID: case CAP_SETUID: case CAP_SETGID:
      return 1;
    default:
      return 0;
  }
}

static int fail(const char *what) {
  fprintf(stderr, "volume-files: %s: %s\n", what, strerror(errno));
  return 1;
}

static int keep_file_capabilities(void) {
  if (keep_capabilities(cap_kept) < 0) return -1;
  return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
}

int volume_files_main(int argc, char **argv) {
  if (argc != 2 || argv[1][0] != '/') {
    fprintf(stderr, "usage: fp-agent volume-files DIR (the connection on fd 3)\n");
    return 2;
  }
  const char *dir = argv[1];
  struct stat st;
  if (fstat(3, &st) < 0 || !S_ISSOCK(st.st_mode)) {
    fprintf(stderr, "volume-files: fd 3 is not a socket\n");
    return 2;
  }
  if (lstat(dir, &st) < 0 || !S_ISDIR(st.st_mode)) return fail(dir);
  if (unshare(CLONE_NEWNS) < 0) return fail("unshare the mount namespace");
  if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0) return fail("make the mounts private");
  if (mount(dir, dir, NULL, MS_BIND, NULL) < 0) return fail("bind the volume");
  if (mount(NULL, dir, NULL, MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0) return fail("remount the volume");
  if (chdir(dir) < 0) return fail("enter the volume");
  if (syscall(SYS_pivot_root, ".", ".") < 0) return fail("pivot into the volume");
  if (umount2(".", MNT_DETACH) < 0) return fail("detach the host's tree");
  if (chdir("/") < 0) return fail("chdir /");
  if (keep_file_capabilities() < 0) return fail("drop capabilities");
  umask(022);
  return agent_serve_files(3);
}
