/* The user a frame is for. The host names a user of the sandbox (E2B's `user`, a Firecase exec's
 * `user`) by the ids the core read from the sandbox's own /etc/passwd; the agent, the sandbox's
 * root, takes them on: all of them for a process it starts; for a file operation the filesystem
 * ones (fsuid, fsgid, groups), so that what it makes (files, parent directories) is that user's,
 * with root's access kept (CAP_DAC_OVERRIDE, CAP_FOWNER raised again), as E2B's envd, root,
 * writes a user's files and hands them over. Only for the length of that operation: the agent
 * is single-threaded, so nothing else runs while it wears them. */
#define _GNU_SOURCE
#include <errno.h>
#include <grp.h>
#include <string.h>
#include <linux/capability.h>
#include <sys/fsuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "agent.h"

int ids_take(uint32_t *len, char **pl, struct unix_ids *ids, const char **why) {
  if (*len < 12) return *why = "short user ids", EINVAL;
  memcpy(&ids->uid, *pl, 4), memcpy(&ids->gid, *pl + 4, 4), memcpy(&ids->ngroups, *pl + 8, 4);
  if (ids->ngroups > FP_MAX_GROUPS) return *why = "too many groups", EINVAL;
  uint32_t need = 12 + 4 * ids->ngroups;
  if (*len < need) return *why = "short user ids", EINVAL;
  memcpy(ids->groups, *pl + 12, 4 * ids->ngroups);
  /* (uid_t)-1 means "unchanged" to the set*id calls: never a user's id. */
  if (ids->uid == (uint32_t)-1 || ids->gid == (uint32_t)-1) return *why = "bad user ids", EINVAL;
  for (uint32_t i = 0; i < ids->ngroups; i++)
    if (ids->groups[i] == (uint32_t)-1) return *why = "bad user ids", EINVAL;
  *pl += need, *len -= need;
  return 0;
}

/* A non-zero fsuid takes the filesystem capabilities out of the effective set: root's access
 * comes back from the permitted set (whatever of it the sandbox kept). */
static int keep_access(void) {
  struct __user_cap_header_struct head = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
  struct __user_cap_data_struct data[2];
  if (syscall(SYS_capget, &head, data) < 0) return errno;
  const int caps[] = {CAP_DAC_OVERRIDE, CAP_FOWNER};
  for (size_t i = 0; i < sizeof(caps) / sizeof(*caps); i++) {
    uint32_t bit = 1u << (caps[i] % 32);
    if (data[caps[i] / 32].permitted & bit) data[caps[i] / 32].effective |= bit;
  }
  return syscall(SYS_capset, &head, data) < 0 ? errno : 0;
}

int ids_enter(const struct unix_ids *ids) {
  if (setgroups(ids->ngroups, (const gid_t *)ids->groups) < 0) return errno;
  /* setfsuid answers the previous id and never fails out loud: asking again (with an id that
   * cannot be set) tells whether it took. */
  setfsgid(ids->gid);
  if ((uint32_t)setfsgid((gid_t)-1) != ids->gid) return ids_leave(), EPERM;
  setfsuid(ids->uid);
  if ((uint32_t)setfsuid((uid_t)-1) != ids->uid) return ids_leave(), EPERM;
  int e = keep_access();
  if (e) ids_leave();
  return e;
}

void ids_leave(void) {
  setfsuid(0);
  setfsgid(0);
  if (setgroups(0, NULL) < 0) {}
}

int ids_become(const struct unix_ids *ids) {
  if (setgroups(ids->ngroups, (const gid_t *)ids->groups) < 0) return errno;
  if (setresgid(ids->gid, ids->gid, ids->gid) < 0) return errno;
  if (setresuid(ids->uid, ids->uid, ids->uid) < 0) return errno;
  return 0;
}
