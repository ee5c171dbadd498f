/* Short scheduler slices for a checkpoint's pause.
 *
 * On a host whose CPUs are busy, most of what load added to a pause was its tasks waiting for a
 * CPU each time they woke: CRIU and its relay (at nice -10) and the sandbox's own threads, in
 * which CRIU's parasite runs (in a CPU group weighing ten times another's for the pause). A
 * weight decides a task's share, not how soon it runs: Linux's EEVDF scheduler lets the running
 * task finish its slice first (1.4 ms here). Since 6.12 a task may ask for a shorter slice
 * (sched_setattr's sched_runtime for a fair task), and one woken with a shorter slice than the
 * running task's preempts it. So, for the pause only: CRIU, the relay and every thread of the
 * sandbox get SHORT_SLICE_NS, and the sandbox's threads get back what they had before the thaw
 * (a slice a tenant chose, or the default; one born in between, which inherited the short
 * slice, gets the default once the pause is over). Their share of the CPU is unchanged: a
 * shorter slice is shorter turns, not more of them. A kernel without custom slices ignores the
 * field for a fair task: then nothing changes.
 *
 * The sandbox's threads are taken from its group's `tasks` (v1) or `cgroup.threads` (v2) just
 * before it is frozen (the freeze's wake-ups are the first to gain), and get their slices back
 * once CRIU is done, still frozen. Only the slice is given back, with the policy and nice value
 * each has then: an id that ended before the freeze and was taken by another process (the whole
 * pid space round within milliseconds) would only have had a short slice for the pause. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "fp.h"

#define SHORT_SLICE_NS 100000ull /* the kernel's smallest: 0.1 ms */

struct sched_attr_v1 {
  uint32_t size, sched_policy;
  uint64_t sched_flags;
  int32_t sched_nice;
  uint32_t sched_priority;
  uint64_t sched_runtime, sched_deadline, sched_period;
};

static int get_attr(pid_t tid, struct sched_attr_v1 *a) {
  memset(a, 0, sizeof(*a));
  return (int)syscall(SYS_sched_getattr, tid, a, sizeof(*a), 0);
}

/* Only fair tasks (SCHED_OTHER, SCHED_BATCH) have a slice of their own. */
static int set_slice(pid_t tid, const struct sched_attr_v1 *now, uint64_t runtime) {
  if (now->sched_policy != SCHED_OTHER && now->sched_policy != SCHED_BATCH) return 0;
  struct sched_attr_v1 a = {.size = sizeof(a), .sched_policy = now->sched_policy, .sched_nice = now->sched_nice, .sched_runtime = runtime};
  return (int)syscall(SYS_sched_setattr, tid, &a, 0);
}

/* The slice a task has when none was asked for: what this process has before it asks. */
static uint64_t default_slice(void) {
  static uint64_t known;
  struct sched_attr_v1 a;
  if (!known && get_attr(0, &a) == 0) known = a.sched_runtime;
  return known;
}

static void shorten_threads_of(pid_t pid) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
  DIR *d = opendir(path);
  if (!d) return;
  struct dirent *e;
  struct sched_attr_v1 a;
  while ((e = readdir(d)))
    if (e->d_name[0] != '.' && get_attr(atoi(e->d_name), &a) == 0) set_slice(atoi(e->d_name), &a, SHORT_SLICE_NS);
  closedir(d);
}

/* Remembers what TID had, for slices_restore. */
static int remember(struct slices *s, pid_t tid, uint64_t runtime) {
  if (s->n == s->cap) {
    size_t cap = s->cap ? s->cap * 2 : 64;
    struct slice_saved *more = realloc(s->saved, cap * sizeof(*more));
    if (!more) return -1;
    s->saved = more, s->cap = cap;
  }
  /* A slice equal to the default is given back as "none asked for"; so is one at the short
   * slice, taken for one a pause left behind (its relay killed past its deadline before it gave
   * them back): a thread that chose exactly that itself gets the default after a checkpoint. */
  s->saved[s->n++] = (struct slice_saved){tid, runtime == default_slice() || runtime == SHORT_SLICE_NS ? 0 : runtime};
  return 0;
}

/* One task's slice shortened, what it had remembered. */
static int shorten(pid_t tid, struct slices *s) {
  struct sched_attr_v1 a;
  if (get_attr(tid, &a) < 0 || (a.sched_policy != SCHED_OTHER && a.sched_policy != SCHED_BATCH)) return -1;
  if (remember(s, tid, a.sched_runtime) < 0) return -1;
  if (set_slice(tid, &a, SHORT_SLICE_NS) < 0) {
    s->n--;
    return -1;
  }
  return 0;
}

void slices_shorten_workers(pid_t criu) {
  default_slice(); /* learnt before this process's own changes */
  shorten_threads_of(getpid());
  if (criu > 0) shorten_threads_of(criu);
}

/* The group's threads, one id per line. */
static FILE *threads_of(const char *group_dir) {
  char path[4096];
  snprintf(path, sizeof(path), "%s/tasks", group_dir);
  FILE *f = fopen(path, "re");
  if (f) return f;
  snprintf(path, sizeof(path), "%s/cgroup.threads", group_dir);
  return fopen(path, "re");
}

int slices_shorten_group(const char *group_dir, struct slices *s, char *err, size_t errlen) {
  FILE *f = threads_of(group_dir);
  if (!f) {
    snprintf(err, errlen, "the threads of %.300s: %s", group_dir, strerror(errno));
    return -1;
  }
  snprintf(s->group, sizeof(s->group), "%s", group_dir);
  default_slice();
  long tid;
  while (fscanf(f, "%ld", &tid) == 1)
    if (tid > 0) shorten((pid_t)tid, s);
  fclose(f);
  return 0;
}

void slices_restore(struct slices *s) {
  for (size_t i = 0; i < s->n; i++) {
    /* Its slice only, with the policy and nice value it has now: a thread whose id another
     * process took meanwhile (one that ended before its group froze) loses nothing of its own. */
    struct sched_attr_v1 now;
    if (get_attr(s->saved[i].tid, &now) == 0) set_slice(s->saved[i].tid, &now, s->saved[i].runtime);
  }
  s->n = 0;
}

void slices_finish(struct slices *s) {
  slices_restore(s);
  if (!s->group[0]) return;
  /* A thread born between the shortening and the freeze inherited the short slice: the default.
   * Here, once the pause is over, not in it: one more pass over the group. */
  FILE *f = threads_of(s->group);
  long tid;
  while (f && fscanf(f, "%ld", &tid) == 1) {
    struct sched_attr_v1 now;
    if (tid > 0 && get_attr((pid_t)tid, &now) == 0 && now.sched_runtime == SHORT_SLICE_NS) set_slice((pid_t)tid, &now, 0);
  }
  if (f) fclose(f);
  s->group[0] = 0;
}
