/* Confinement of a sandbox beyond its namespaces, as data: the /proc paths it must not read or
 * write (runc's and Docker's masked and read-only paths, and a few more), and the seccomp filter
 * every process in it runs under (seccomp_policy.h).
 *
 * Everything here must survive a CRIU dump and restore, so it is made only of things CRIU
 * saves cheaply: bind mounts inside the sandbox's own mount namespace (no tmpfs, which CRIU
 * would tar on every dump) and a seccomp filter (CRIU dumps and restores filters). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <linux/capability.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <seccomp.h>
#include <unistd.h>

#include "fp.h"
#include "seccomp_policy.h"

/* Hidden: files get the sandbox's own /dev/null bound over them, directories an empty
 * read-only directory of the agent layer. Called inside the sandbox's root, after pivot_root. */
static const char *const masked_paths[] = {
  "/proc/acpi", "/proc/asound", "/proc/interrupts", "/proc/kcore", "/proc/keys", "/proc/key-users",
  "/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi",
  /* beyond Docker's list: kernel addresses, allocator state and the kernel's log and config */
  "/proc/kallsyms", "/proc/kmsg", "/proc/slabinfo", "/proc/vmallocinfo", "/proc/pagetypeinfo", "/proc/config.gz",
};

/* Readable but never writable: sysctls (core_pattern, drop_caches, ...), IRQ affinity, bus and
 * filesystem knobs, SysRq. */
static const char *const readonly_paths[] = {
  "/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger",
};

#define RO_FLAGS (MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)

static int bind_readonly(const char *source, const char *target, char *err, size_t errlen) {
  if (mount(source, target, NULL, MS_BIND | MS_REC, NULL) < 0 || mount(NULL, target, NULL, RO_FLAGS, NULL) < 0) {
    snprintf(err, errlen, "read-only %s: %s", target, strerror(errno));
    return -1;
  }
  return 0;
}

int confine_proc(char *err, size_t errlen) {
  for (size_t i = 0; i < sizeof(masked_paths) / sizeof(*masked_paths); i++) {
    struct stat st;
    const char *path = masked_paths[i];
    if (lstat(path, &st) < 0) {
      if (errno == ENOENT) continue;
      snprintf(err, errlen, "mask %s: %s", path, strerror(errno));
      return -1;
    }
    if (S_ISDIR(st.st_mode)) {
      if (bind_readonly("/" CONFINE_EMPTY_DIR, path, err, errlen) < 0) return -1;
    } else if (mount("/dev/null", path, NULL, MS_BIND, NULL) < 0) {
      snprintf(err, errlen, "mask %s: %s", path, strerror(errno));
      return -1;
    }
  }
  for (size_t i = 0; i < sizeof(readonly_paths) / sizeof(*readonly_paths); i++) {
    if (access(readonly_paths[i], F_OK) < 0) continue;
    if (bind_readonly(readonly_paths[i], readonly_paths[i], err, errlen) < 0) return -1;
  }
  return 0;
}

/* Loads the filter; from here on it binds this process and everything it starts. Needs
 * CAP_SYS_ADMIN (its user namespace's will do): whether no_new_privs goes with it is the
 * caller's to say (libseccomp would set it by itself). */
int install_seccomp(char *err, size_t errlen) {
  scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ERRNO(EPERM));
  int rc = ctx ? seccomp_attr_set(ctx, SCMP_FLTATR_CTL_NNP, 0) : -ENOMEM;
  for (size_t i = 0; rc == 0 && i < sizeof(seccomp_allowed) / sizeof(*seccomp_allowed); i++) {
    int nr = seccomp_syscall_resolve_name(seccomp_allowed[i]);
    if (nr == __NR_SCMP_ERROR) continue; /* not a syscall of this architecture */
    rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, nr, 0);
  }
  /* clone without any namespace flag; clone3 hides its flags in memory the filter cannot
   * read, so it answers ENOSYS and libc falls back to clone. */
  if (rc == 0) rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(clone), 1, SCMP_A0(SCMP_CMP_MASKED_EQ, SECCOMP_NAMESPACE_FLAGS, 0));
  if (rc == 0) rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0);
  for (size_t i = 0; rc == 0 && i < sizeof(seccomp_personalities) / sizeof(*seccomp_personalities); i++)
    rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(personality), 1, SCMP_A0(SCMP_CMP_EQ, seccomp_personalities[i]));
  if (rc == 0) rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(socket), 1, SCMP_A0(SCMP_CMP_NE, SECCOMP_AF_VSOCK));
  if (rc == 0) rc = seccomp_load(ctx);
  if (ctx) seccomp_release(ctx);
  if (rc < 0) {
    snprintf(err, errlen, "seccomp: %s", strerror(-rc));
    return -1;
  }
  return 0;
}

/* Every capability set, not the bounding set alone, down to what KEPT keeps: a server started
 * with inheritable or ambient capabilities (a systemd unit's AmbientCapabilities, some pods)
 * would otherwise hand them on through exec. -1 with errno when a step fails. */
int keep_capabilities(int (*kept)(int cap)) {
  int last = 40;
  FILE *f = fopen("/proc/sys/kernel/cap_last_cap", "re");
  if (f) {
    if (fscanf(f, "%d", &last) != 1) last = 40;
    fclose(f);
  }
  struct __user_cap_header_struct head = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
  struct __user_cap_data_struct data[2];
  if (syscall(SYS_capget, &head, data) < 0) return -1;
  for (int cap = 0; cap <= last; cap++) {
    if (kept(cap)) continue;
    if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 && errno != EINVAL) return -1;
    data[cap / 32].effective &= ~(1u << (cap % 32));
    data[cap / 32].permitted &= ~(1u << (cap % 32));
  }
  data[0].inheritable = data[1].inheritable = 0;
  if (syscall(SYS_capset, &head, data) < 0) return -1;
  return prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
}
