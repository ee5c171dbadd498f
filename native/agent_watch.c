/* Directory watches for the host (envd's watchDir), over inotify, inside the sandbox's root.
 *
 * A watch belongs to the connection that asked for it and ends with it. Every connection is
 * closed before CRIU dumps the sandbox, and a ping that announces a dump ends whatever watch
 * is left (a connection of the sandbox's own): the agent holds no inotify descriptor when it
 * is dumped, as its header promises. Bounds: MAX_WATCHES at once; MAX_WATCH_DIRS directories
 * each (as many as the sandbox's own max_user_watches): a watch that would need more ends with
 * ENOSPC, it never leaves a directory unwatched and says nothing. A watch whose client cannot
 * keep up is not read, so the kernel's queue overflows and the watch ends with EOVERFLOW
 * rather than the agent buffering without limit. What a watch holds is the sandbox's memory. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent.h"

#define MAX_WATCHES MAX_WATCH_FDS
#define MAX_WATCH_DIRS 65536
/* wds grow with every directory made and removed under a watch: past this the watch ends. */
#define MAX_WD (1 << 20)
#define MAX_WATCH_DEPTH 64
#define EVENT_MASK (IN_CREATE | IN_MOVED_TO | IN_MODIFY | IN_CLOSE_WRITE | IN_DELETE | IN_MOVED_FROM | IN_ATTRIB | IN_DELETE_SELF | IN_MOVE_SELF)

struct watch {
  int fd; /* inotify */
  uint32_t id;
  struct conn *c;
  int recursive;
  int ndirs;
  /* by wd (the kernel hands them out in increasing order): the directory's path relative to
   * the root, "" for the root itself, NULL for a wd no longer watched */
  char **rel;
  int nrel;
  char root[PATH_MAX];
};

static struct watch *watches[MAX_WATCHES];

static struct watch *watch_by(struct conn *c, uint32_t id) {
  for (int i = 0; i < MAX_WATCHES; i++)
    if (watches[i] && watches[i]->c == c && watches[i]->id == id) return watches[i];
  return NULL;
}

static void watch_free(int slot) {
  struct watch *w = watches[slot];
  if (!w) return;
  close(w->fd);
  for (int i = 0; i < w->nrel; i++) free(w->rel[i]);
  free(w->rel);
  free(w);
  watches[slot] = NULL;
}

static int slot_of(struct watch *w) {
  for (int i = 0; i < MAX_WATCHES; i++)
    if (watches[i] == w) return i;
  return -1;
}

static int remember(struct watch *w, int wd, const char *rel) {
  if (wd >= MAX_WD) return ENOSPC;
  if (wd >= w->nrel) {
    int want = w->nrel ? w->nrel : 64;
    while (want <= wd) want *= 2;
    char **grown = realloc(w->rel, sizeof(char *) * (size_t)want);
    if (!grown) return ENOMEM;
    memset(grown + w->nrel, 0, sizeof(char *) * (size_t)(want - w->nrel));
    w->rel = grown, w->nrel = want;
  }
  if (w->rel[wd]) return 0; /* the same directory again */
  if (w->ndirs == MAX_WATCH_DIRS) return ENOSPC;
  if (!(w->rel[wd] = strdup(rel))) return ENOMEM;
  w->ndirs++;
  return 0;
}

/* Adds DIR (relative to the root; "" is the root) and, for a recursive watch, what is below it.
 * Returns 0 or an errno: a directory that vanished meanwhile is no error, one that cannot be
 * watched (too many, too deep) is. */
static int add_dir(struct watch *w, const char *rel, int depth) {
  char path[PATH_MAX];
  if (snprintf(path, sizeof(path), "%s%s%s", w->root, *rel ? "/" : "", rel) >= (int)sizeof(path)) return ENAMETOOLONG;
  /* Below the root no link is followed: a link to a parent would make the walk endless. */
  uint32_t mask = EVENT_MASK | IN_ONLYDIR | (*rel ? IN_DONT_FOLLOW : 0);
  int wd = inotify_add_watch(w->fd, path, mask);
  if (wd < 0) return *rel && (errno == ENOENT || errno == ENOTDIR) ? 0 : errno;
  int e = remember(w, wd, rel);
  if (e || !w->recursive) return e;
  if (depth >= MAX_WATCH_DEPTH) return ELOOP;
  DIR *d = opendir(path);
  if (!d) return 0;
  struct dirent *de;
  while (!e && (de = readdir(d))) {
    if (de->d_type != DT_DIR || !strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
    char sub[PATH_MAX];
    if (snprintf(sub, sizeof(sub), "%s%s%s", rel, *rel ? "/" : "", de->d_name) >= (int)sizeof(sub)) e = ENAMETOOLONG;
    else e = add_dir(w, sub, depth + 1);
  }
  closedir(d);
  return e;
}

/* WATCH: u32 flags (1: recursive), path\0 -> OK, then WATCH_EVENT frames until UNWATCH, the
 * connection's end, or an ERROR frame with the watch's id. */
void do_watch(struct conn *c, struct fp_header *h, char *pl) {
  if (h->len < 6 || !memchr(pl + 4, 0, h->len - 4)) return send_error(c, h->id, EINVAL, "bad watch");
  uint32_t flags;
  memcpy(&flags, pl, 4);
  const char *path = pl + 4;
  if (path[0] != '/' || strlen(path) >= PATH_MAX) return send_error(c, h->id, EINVAL, "bad watch path");
  if (watch_by(c, h->id)) return send_error(c, h->id, EEXIST, "a watch of that id exists");
  int slot = -1;
  for (int i = 0; i < MAX_WATCHES && slot < 0; i++)
    if (!watches[i]) slot = i;
  if (slot < 0) return send_error(c, h->id, EMFILE, "too many directory watches in this sandbox");
  struct stat st;
  if (stat(path, &st) < 0) return send_error(c, h->id, errno, strerror(errno));
  if (!S_ISDIR(st.st_mode)) return send_error(c, h->id, ENOTDIR, "not a directory");
  struct watch *w = calloc(1, sizeof(*w));
  if (!w) return send_error(c, h->id, ENOMEM, "no memory");
  w->fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  if (w->fd < 0) {
    int e = errno;
    free(w);
    return send_error(c, h->id, e, strerror(e));
  }
  w->id = h->id, w->c = c, w->recursive = flags & 1;
  snprintf(w->root, sizeof(w->root), "%s", path);
  size_t n = strlen(w->root);
  while (n > 1 && w->root[n - 1] == '/') w->root[--n] = 0;
  watches[slot] = w;
  int e = add_dir(w, "", 0);
  if (e) {
    watch_free(slot);
    return send_error(c, h->id, e, e == ENOSPC ? "more directories than a watch may hold" : strerror(e));
  }
  send_frame(c, FP_T_OK, 0, h->id, NULL, 0);
}

void do_unwatch(struct conn *c, struct fp_header *h) {
  struct watch *w = watch_by(c, h->id);
  if (w) watch_free(slot_of(w));
}

/* Ends every watch of C (its connection closes), or every watch when C is NULL (a dump is
 * next): the client of each is told why, if it is still there. */
void watches_end(struct conn *c) {
  for (int i = 0; i < MAX_WATCHES; i++) {
    if (!watches[i] || (c && watches[i]->c != c)) continue;
    if (!c) send_error(watches[i]->c, watches[i]->id, EINTR, "the sandbox is being checkpointed");
    watch_free(i);
  }
}

static uint8_t op_of(uint32_t mask) {
  if (mask & (IN_CREATE | IN_MOVED_TO)) return FP_WATCH_CREATE;
  if (mask & (IN_MODIFY | IN_CLOSE_WRITE)) return FP_WATCH_WRITE;
  if (mask & (IN_DELETE | IN_DELETE_SELF)) return FP_WATCH_REMOVE;
  if (mask & (IN_MOVED_FROM | IN_MOVE_SELF)) return FP_WATCH_RENAME;
  if (mask & IN_ATTRIB) return FP_WATCH_CHMOD;
  return 0;
}

static void watch_fail(struct watch *w, int err, const char *why) {
  send_error(w->c, w->id, err, why);
  watch_free(slot_of(w));
}

static void watch_read(struct watch *w) {
  char buf[16384] __attribute__((aligned(__alignof__(struct inotify_event))));
  for (;;) {
    ssize_t n = read(w->fd, buf, sizeof(buf));
    if (n <= 0) return;
    for (char *p = buf; p < buf + n;) {
      struct inotify_event *ev = (struct inotify_event *)p;
      p += sizeof(*ev) + ev->len;
      if (ev->mask & IN_Q_OVERFLOW) return watch_fail(w, EOVERFLOW, "more changes than the watch could hold; watch again");
      const char *dir = ev->wd >= 0 && ev->wd < w->nrel ? w->rel[ev->wd] : NULL;
      if (!dir) continue;
      if (ev->mask & IN_IGNORED) {
        free(w->rel[ev->wd]);
        w->rel[ev->wd] = NULL;
        w->ndirs--;
        continue;
      }
      /* The watched directory's own removal or move is told by its parent's watch, if any. */
      if (!ev->len && (ev->mask & (IN_DELETE_SELF | IN_MOVE_SELF))) continue;
      /* envd says a file was written once it is closed, not at every write(2). */
      if ((ev->mask & IN_MODIFY) && !(ev->mask & ~(uint32_t)(IN_MODIFY | IN_ISDIR))) continue;
      uint8_t op = op_of(ev->mask);
      if (!op || !ev->len) continue;
      char name[PATH_MAX];
      int len = snprintf(name, sizeof(name), "%s%s%s", dir, *dir ? "/" : "", ev->name);
      if (len < 0 || len >= (int)sizeof(name)) continue;
      send_frame(w->c, FP_T_WATCH_EVENT, op, w->id, name, (uint32_t)len);
      if (w->recursive && (ev->mask & IN_ISDIR) && (ev->mask & (IN_CREATE | IN_MOVED_TO))) {
        int depth = 1;
        for (const char *q = name; *q; q++) depth += *q == '/';
        int e = add_dir(w, name, depth);
        if (e) return watch_fail(w, e, e == ENOSPC ? "more directories than a watch may hold" : strerror(e));
      }
    }
  }
}

/* For the poll loop: the watch descriptors to poll (those whose client keeps up). */
int watches_poll(struct pollfd *pfds, void **owners, uint32_t high_water) {
  int n = 0;
  for (int i = 0; i < MAX_WATCHES; i++) {
    struct watch *w = watches[i];
    if (!w || w->c->out_len - w->c->out_off > high_water) continue;
    pfds[n] = (struct pollfd){.fd = w->fd, .events = POLLIN};
    owners[n++] = w;
  }
  return n;
}

void watch_ready(void *owner) {
  for (int i = 0; i < MAX_WATCHES; i++)
    if (watches[i] == owner) return watch_read(watches[i]);
}
