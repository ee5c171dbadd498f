/* fp-agent criu-run --cache DIR [--netns-of PID | --new-netns] [--overlay DIR TARGET OPTIONS]
 *                  [--swrk [--pidfile FILE]] -- CRIU ARGS...
 *
 * CRIU keeps its kernel-probe cache (kdat) only when /run is a tmpfs; on hosts whose /run is
 * not, every call re-probes the kernel (15-20 ms). This runs CRIU in a mount namespace of its
 * own with DIR, a tmpfs that outlives the call, bound on /run.
 *
 * CRIU also dumps and restores a network namespace only when it differs from its own, and
 * doing so costs it a sysfs mount and two walks of the host's conntrack table (~20 ms). The
 * sandbox's netns holds nothing but lo, so CRIU runs inside it instead: --netns-of PID for a
 * dump, --new-netns (a fresh netns with lo up, inherited by the restored tree) for a restore.
 *
 * --overlay mounts the sandbox's disk first (see replace_overlay), saving the restore path a
 * process of its own.
 *
 * --ready-file FILE (a daemon: `criu lazy-pages`) has CRIU write a byte to FILE once it serves
 * (its --status-fd, on FILE opened here before any namespace changes). A lazy-pages daemon's
 * socket exists from its bind, before its listen: a restore that connects in between is refused.
 *
 * --swrk starts CRIU as an RPC worker (`criu swrk`) and relays requests to it, so that CRIU's
 * own start-up (dynamic loading, kernel probes: ~10 ms) happens before a pause, not in it.
 * Frames on stdin, answers on fd 3, each a u32 little-endian length, a kind byte and data:
 *   'O' PATH                    open a directory for CRIU  -> 'K' its fd number, in decimal
 *   'M' DIR\0TARGET\0OPTIONS[\0BASE]  replace_overlay, its layers idmapped to the uid range
 *                               at BASE if given (idmap.c)  -> 'K'
 *   'R' criu_req (protobuf)     passed to CRIU             -> 'R' criu_resp
 *   'V' DIR\0TARGET\0BASE\0RO    a persistent volume's directory (volume_tree: idmapped to the
 *                               range at BASE unless BASE is empty, read-only if RO is "1"),
 *                               cloned in the host's mount namespace and mounted on TARGET in
 *                               the worker's: the source of CRIU's external mount -> 'K'
 *   'H' PID\0HOSTNAME           set the hostname in PID's uts namespace (a fork's) -> 'K'
 *   'P' FILE                    write the pid of what CRIU restores to FILE (as --pidfile) -> 'K'
 *   'C' PROCS\0PROCS...         move CRIU into these cgroups (cgroup.procs files), so what
 *                               it restores is born inside the sandbox's limits: done by a
 *                               helper while the relay goes on (see join_cgroups), and waited
 *                               for by the next 'R', which fails with the join's error -> 'K'
 *   'N' HOSTIF\0ADDR\0GW\0MAC[\0FLAGS]   the sandbox's network link (netlink.c), in the netns
 *                               CRIU restores into, before the restore: sockets come back on it;
 *                               the host's route to ADDR moves to it when the next 'R' is
 *                               answered. FLAGS: '1', in the netns CRIU makes for the tree (a
 *                               tree in a user namespace: --empty-ns net), when it notifies
 *                               "setup-namespaces"; 'h', the route stays where it is (a
 *                               rollback's standby, restored beside the sandbox it is to
 *                               replace, until 'T') -> 'K'
 *   'T' HOSTIF\0ADDR\0GW         the host's route to ADDR moves to HOSTIF now -> 'K'
 *   'S' GROUP                   a pause's short scheduler slices (sched_slice.c): for the relay,
 *                               CRIU and every thread of the cgroup directory GROUP (about to be
 *                               frozen), whose threads get theirs back once the next 'R' is
 *                               answered (one born meanwhile, when the relay ends) -> 'K'
 * and 'E' MESSAGE for a failure. CRIU's notifications during an 'R' (a restore with
 * notify_scripts: a tree in a user namespace) are answered here: from "setup-namespaces" to
 * "post-setup-namespaces", two helpers bound the per-user counters of the user namespace CRIU
 * made (afresh, unbounded: see userns_limits) and bring up the network namespace CRIU made (lo,
 * the sandbox's settings, the link of a deferred 'N'), before any task of the tree is forked;
 * every other one is just acked. 'M' mounts in the host's mount namespace (where the engine finds
 * every sandbox's disk: re-adoption after a restart, teardown) and gives CRIU, in the worker's
 * private one, a clone of that mount (see mount_disk). With --pidfile, the pid of a restored tree is written there
 * as soon as CRIU answers, so that a server that dies meanwhile can still find it. EOF on stdin ends the worker; with it CRIU, whose restored
 * tree passes to the shim above. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <stdint.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fp.h"

#define CRIU_NICE (-10)

#define REPLY_FD 3
#define MAX_FRAME (1 << 20)

#ifndef OPEN_TREE_CLONE
#define OPEN_TREE_CLONE 1
#endif
#ifndef MOVE_MOUNT_F_EMPTY_PATH
#define MOVE_MOUNT_F_EMPTY_PATH 0x00000004
#endif

/* Mount namespaces: the host's, where the worker started, and its own private one. */
static int host_mntns = -1, own_mntns = -1;
/* Network namespaces: the host's, and the one CRIU works in (the sandbox's, or a fresh one). */
static int host_netns = -1, own_netns = -1;

static int reply(char kind, const void *data, size_t len) {
  uint8_t head[5];
  uint32_t n = (uint32_t)len + 1;
  for (int k = 0; k < 4; k++) head[k] = (uint8_t)(n >> (8 * k));
  head[4] = (uint8_t)kind;
  return write_full(REPLY_FD, head, 5) < 0 || write_full(REPLY_FD, data, len) < 0 ? -1 : 0;
}

static int reply_text(char kind, const char *text) {
  return reply(kind, text, strlen(text));
}

/* The restored root's pid in a criu_resp: field 4 (restore), its field 1 (pid). Just enough
 * protobuf to write the pidfile without waiting for the server. */
static int varint(const uint8_t **p, const uint8_t *end, uint64_t *v) {
  *v = 0;
  for (int shift = 0; *p < end && shift < 64; shift += 7) {
    uint8_t b = *(*p)++;
    *v |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80)) return 0;
  }
  return -1;
}

static long field_varint(const uint8_t *p, const uint8_t *end, unsigned want_field, unsigned want_sub) {
  while (p < end) {
    uint64_t key, v;
    if (varint(&p, end, &key) < 0) return -1;
    unsigned field = (unsigned)(key >> 3), type = key & 7;
    if (type == 0) {
      if (varint(&p, end, &v) < 0) return -1;
      if (field == want_field && !want_sub) return (long)v;
    } else if (type == 2) {
      if (varint(&p, end, &v) < 0 || v > (uint64_t)(end - p)) return -1;
      if (field == want_field && want_sub) return field_varint(p, p + v, want_sub, 0);
      p += v;
    } else if (type == 5) p += 4;
    else if (type == 1) p += 8;
    else return -1;
  }
  return -1;
}

static void write_pidfile(const char *path, const uint8_t *resp, size_t len) {
  long pid = field_varint(resp, resp + len, 4, 1);
  if (pid <= 0) return;
  FILE *f = fopen(path, "we");
  if (!f) return;
  fprintf(f, "%ld\n", pid);
  fclose(f);
}

static int enter_ns_of(const char *pid, const char *ns, int type) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/ns/%s", atoi(pid), ns);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  int rc = setns(fd, type);
  close(fd);
  return rc;
}

/* Mounts the sandbox's disk on TARGET in the host's mount namespace, where every layer and
 * volume is (one mounted after this worker started included), in place of what the host has
 * there; then puts a clone of that mount (the same superblock, so no second overlay over the
 * same upper) on TARGET in this worker's private namespace, where CRIU looks for it. The old
 * mounts are pinned by *HOST_OLD and *OWN_OLD: their superblock's teardown (a sync of the
 * filesystem under it) waits until this relay exits, after the restore. */
static int mount_disk(const char *dir, const char *target, const char *options, long base, int *host_old, int *own_old,
                      char *err, size_t errlen) {
  if (host_mntns < 0) { /* no private namespace: the host's is this one */
    if (*own_old < 0) *own_old = open(target, O_PATH | O_DIRECTORY | O_CLOEXEC);
    return mount_disk_for(dir, target, options, base, err, errlen);
  }
  int rc = -1, tree = -1;
  if (setns(host_mntns, CLONE_NEWNS) < 0) {
    snprintf(err, errlen, "enter the host's mount namespace: %s", strerror(errno));
    return -1;
  }
  if (*host_old < 0) *host_old = open(target, O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (mount_disk_for(dir, target, options, base, err, errlen) == 0) {
    tree = (int)syscall(SYS_open_tree, AT_FDCWD, target, OPEN_TREE_CLONE | O_CLOEXEC);
    if (tree < 0) snprintf(err, errlen, "clone the mount of %s: %s", target, strerror(errno));
  }
  /* Back where CRIU looks; a relay that cannot get there must not go on. */
  if (setns(own_mntns, CLONE_NEWNS) < 0) {
    perror("criu-run: back to the private mount namespace");
    _exit(1);
  }
  if (tree >= 0) {
    if (*own_old < 0) *own_old = open(target, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (umount2(target, MNT_DETACH) < 0 && errno != EINVAL)
      snprintf(err, errlen, "detach %s: %s", target, strerror(errno));
    else if (syscall(SYS_move_mount, tree, "", AT_FDCWD, target, MOVE_MOUNT_F_EMPTY_PATH) < 0)
      snprintf(err, errlen, "attach %s for CRIU: %s", target, strerror(errno));
    else
      rc = 0;
    close(tree);
  }
  return rc;
}


/* A criu_resp that is a notification (type NOTIFY, 6): its script name and pid. */
static int notification(const uint8_t *p, const uint8_t *end, char *script, size_t size, long *pid) {
  if (field_varint(p, end, 1, 0) != 6) return 0;
  *pid = field_varint(p, end, 5, 2);
  script[0] = 0;
  while (p < end) { /* field 5 (notify), then its field 1 (script) */
    uint64_t key, v;
    if (varint(&p, end, &key) < 0) return 1;
    unsigned field = (unsigned)(key >> 3), type = key & 7;
    if (type == 0) { if (varint(&p, end, &v) < 0) return 1; continue; }
    if (type != 2 || varint(&p, end, &v) < 0 || v > (uint64_t)(end - p)) return 1;
    if (field == 5) {
      const uint8_t *q = p, *qend = p + v;
      while (q < qend) {
        uint64_t k2, v2;
        if (varint(&q, qend, &k2) < 0) break;
        if ((k2 & 7) == 0) { if (varint(&q, qend, &v2) < 0) break; continue; }
        if ((k2 & 7) != 2 || varint(&q, qend, &v2) < 0 || v2 > (uint64_t)(qend - q)) break;
        if ((k2 >> 3) == 1) snprintf(script, size, "%.*s", (int)(v2 < size ? v2 : size - 1), (const char *)q);
        q += v2;
      }
    }
    p += v;
  }
  return 1;
}

struct pending_link { int set; char hostif[32], addr[32], gw[32], mac[32]; };

/* "setup-namespaces" of a tree in a user namespace: CRIU made its network namespace (empty,
 * lo down); the sandbox's link and settings go in before any socket is restored. */
static int set_up_restored_netns(long pid, const struct pending_link *link, char *msg, size_t len) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/%ld/ns/net", pid);
  int ns = open(path, O_RDONLY | O_CLOEXEC);
  if (ns < 0) {
    snprintf(msg, len, "open %s: %s", path, strerror(errno));
    return -1;
  }
  int rc = -1;
  if (setns(ns, CLONE_NEWNET) < 0) snprintf(msg, len, "enter the restored netns: %s", strerror(errno));
  else if (loopback_up() < 0 || netns_defaults() < 0) snprintf(msg, len, "set up the restored netns: %s", strerror(errno));
  else rc = 0;
  if (setns(own_netns, CLONE_NEWNET) < 0) {
    perror("criu-run: back to the worker's netns");
    _exit(1);
  }
  if (rc == 0 && link->set) rc = net_setup(host_netns, ns, link->hostif, link->addr, link->gw, link->mac, 0, msg, len);
  close(ns);
  return rc;
}

struct tree_net { long pid; const struct pending_link *link; };

static int tree_net_setup(const void *arg, char *err, size_t errlen) {
  const struct tree_net *t = arg;
  return set_up_restored_netns(t->pid, t->link, err, errlen);
}

/* Waits for both helpers; MSG says why the first that failed did. */
static int finish_both(struct helper *a, struct helper *b, char *msg, size_t len) {
  char other[512];
  int ra = helper_finish(a, msg, len);
  int rb = helper_finish(b, ra < 0 ? other : msg, ra < 0 ? sizeof(other) : len);
  return ra < 0 || rb < 0 ? -1 : 0;
}

/* The 'V' request: DIR's volume tree, made where the engine mounted the volume (the host's
 * namespace: the worker's own may predate the volume), attached on TARGET where CRIU binds from. */
static int mount_volume(const char *dir, const char *target, long base, int read_only, char *err, size_t errlen) {
  if (host_mntns >= 0 && setns(host_mntns, CLONE_NEWNS) < 0) {
    snprintf(err, errlen, "enter the host's mount namespace: %s", strerror(errno));
    return -1;
  }
  int tree = volume_tree(dir, base, read_only, err, errlen);
  if (host_mntns >= 0 && setns(own_mntns, CLONE_NEWNS) < 0) {
    perror("criu-run: back to the private mount namespace");
    _exit(1);
  }
  if (tree < 0) return -1;
  int rc = (int)syscall(SYS_move_mount, tree, "", AT_FDCWD, target, MOVE_MOUNT_F_EMPTY_PATH);
  if (rc < 0) snprintf(err, errlen, "attach the volume on %.300s: %s", target, strerror(errno));
  close(tree);
  return rc;
}

/* A join of CRIU into the sandbox's cgroups, by a helper while the relay goes on: the first
 * move into a cgroup after a while waits out an RCU grace period (5-15 ms here), which the relay
 * spends on the restore's other requests (the disk, the link) instead. The helper writes CRIU's
 * pid, which stays CRIU's: only this relay reaps it. */
struct join_req { pid_t criu; const char *procs; size_t len; };

static int join_cgroups(const void *arg, char *err, size_t errlen) {
  const struct join_req *j = arg;
  char self[24];
  snprintf(self, sizeof(self), "%d", (int)j->criu);
  for (const char *procs = j->procs; procs < j->procs + j->len; procs += strlen(procs) + 1) {
    int fd = open(procs, O_WRONLY | O_CLOEXEC);
    int ok = fd >= 0 && write(fd, self, strlen(self)) > 0;
    if (!ok) snprintf(err, errlen, "join %.400s: %s", procs, strerror(errno));
    if (fd >= 0) close(fd);
    if (!ok) return -1;
  }
  return 0;
}

static int relay(int sk, pid_t criu, const char *pidfile_arg) {
  static char buf[MAX_FRAME + 1];
  static char pidfile_buf[4096];
  const char *pidfile = pidfile_arg;
  int old_root = -1, host_old_root = -1;
  char route_if[32] = "", route_addr[32] = "", route_gw[32] = "";
  struct pending_link later = {0};
  struct helper joining = {-1, -1};
  struct slices paused = {0};
  /* An 'M' disk's layer trees are closed once the restore after it is answered (idmap.c). */
  defer_tree_closes();
  for (;;) {
    uint8_t head[4];
    if (read_full(0, head, 4) < 0) break;
    uint32_t n = head[0] | head[1] << 8 | head[2] << 16 | (uint32_t)head[3] << 24;
    if (n < 1 || n > MAX_FRAME || read_full(0, buf, n) < 0) break;
    buf[n] = 0;
    char kind = buf[0], *data = buf + 1;
    size_t len = n - 1;
    char msg[512];
    if (kind == 'O') {
      int fd = open(data, O_RDONLY | O_DIRECTORY);
      if (fd < 0) snprintf(msg, sizeof(msg), "open %.400s: %s", data, strerror(errno));
      else snprintf(msg, sizeof(msg), "%d", fd);
      if (reply_text(fd < 0 ? 'E' : 'K', msg) < 0) break;
    } else if (kind == 'M') {
      /* Three or four NUL-separated fields; buf[n] is a NUL too, so strlen stays inside the frame. */
      size_t a = strlen(data), b = a < len ? strlen(data + a + 1) : 0;
      size_t c = a + b + 2 <= len ? strlen(data + a + b + 2) : 0;
      long base = a + b + c + 3 < len ? atol(data + a + b + c + 3) : -1;
      int rc = -1;
      if (a + 1 + b + 1 > len) snprintf(msg, sizeof(msg), "bad mount request");
      else
        rc = mount_disk(data, data + a + 1, data + a + b + 2, base, &host_old_root, &old_root, msg, sizeof(msg));
      if (reply_text(rc < 0 ? 'E' : 'K', rc < 0 ? msg : "") < 0) break;
    } else if (kind == 'V') {
      /* Four NUL-separated fields, each found inside the frame (buf[n] is a NUL). */
      const char *f[4] = {data, NULL, NULL, NULL};
      int k = 1;
      for (; k < 4 && (size_t)(f[k - 1] - data) + strlen(f[k - 1]) < len; k++) f[k] = f[k - 1] + strlen(f[k - 1]) + 1;
      int rc = -1;
      if (k < 4) snprintf(msg, sizeof(msg), "bad volume request");
      else rc = mount_volume(f[0], f[1], f[2][0] ? atol(f[2]) : -1, !strcmp(f[3], "1"), msg, sizeof(msg));
      if (reply_text(rc < 0 ? 'E' : 'K', rc < 0 ? msg : "") < 0) break;
    } else if (kind == 'R') {
      ssize_t got = -1;
      int setup_failed = 0;
      /* What CRIU restores is born in the sandbox's cgroups, or not at all. */
      if (helper_finish(&joining, msg, sizeof(msg)) < 0) {
        if (reply_text('E', msg) < 0) break;
        continue;
      }
      /* A tree in a user namespace: its counters bounded and its network set up by two helpers
       * from "setup-namespaces" on, while CRIU restores the tree's other namespaces; waited for
       * at "post-setup-namespaces" (or whatever CRIU says next), before it forks any task of the
       * tree. They are started once CRIU has its answer to "setup-namespaces": started before
       * it, their two forks kept CRIU waiting ~0.9 ms (its log at level 4). A helper that could
       * not start fails the next answer, or the restore if none comes. */
      struct helper limits = {-1, -1}, tree_net = {-1, -1};
      struct tree_net tn = {-1, &later};
      int start_failed = 0;
      if (send(sk, data, len, 0) == (ssize_t)len) {
        for (;;) {
          do got = recv(sk, buf, MAX_FRAME, 0); while (got < 0 && errno == EINTR);
          char script[64];
          long npid = -1;
          if (got <= 0 || !notification((const uint8_t *)buf, (const uint8_t *)buf + got, script, sizeof(script), &npid)) break;
          int ok = 1, start_helpers = 0;
          if (!strcmp(script, "setup-namespaces") && npid > 0) {
            tn.pid = npid;
            start_helpers = 1;
          } else if (start_failed || limits.pid > 0 || tree_net.pid > 0) {
            /* After a failed start, MSG keeps why it failed. */
            char why[512];
            if (finish_both(&limits, &tree_net, start_failed ? why : msg, start_failed ? sizeof(why) : sizeof(msg)) < 0 || start_failed) ok = 0;
            start_failed = 0;
          }
          if (!ok) setup_failed = 1;
          const uint8_t ack[] = {0x08, 0x06, 0x18, (uint8_t)ok}; /* criu_req: type NOTIFY, notify_success */
          if (send(sk, ack, sizeof(ack), 0) != (ssize_t)sizeof(ack)) { got = -1; break; }
          if (start_helpers && (userns_limits_start((pid_t)npid, &limits, msg, sizeof(msg)) < 0 ||
                                helper_start(&tree_net, tree_net_setup, &tn, msg, sizeof(msg)) < 0))
            start_failed = setup_failed = 1;
        }
        later.set = 0;
      }
      /* CRIU is done with the tree: its threads get their own slices back while still frozen. */
      slices_restore(&paused);
      /* Never left running: a restore that ended before "post-setup-namespaces" (it failed). */
      if ((limits.pid > 0 || tree_net.pid > 0) && finish_both(&limits, &tree_net, msg, sizeof(msg)) < 0) setup_failed = 1;
      if (setup_failed) { /* CRIU gave up on our word; its answer says only that */
        if (reply_text('E', msg) < 0) break;
        continue;
      }
      /* The address moves to the new link only once CRIU is done: its sockets exist then, and
       * a packet that came earlier was lost (and is sent again), not answered with a reset by
       * a netns that did not have them yet. */
      if (route_if[0] && got > 0) {
        int rc = net_route(host_netns, route_if, route_addr, route_gw, msg, sizeof(msg));
        route_if[0] = 0;
        if (rc < 0) {
          if (reply_text('E', msg) < 0) break;
          continue;
        }
      }
      if (got <= 0) {
        int st = 0;
        snprintf(msg, sizeof(msg), "criu swrk went away%s", waitpid(criu, &st, WNOHANG) == criu ? " (it exited)" : "");
        reply_text('E', msg);
        break;
      }
      if (pidfile) write_pidfile(pidfile, (const uint8_t *)buf, (size_t)got);
      if (reply('R', buf, (size_t)got) < 0) break;
      close_deferred_trees();
    } else if (kind == 'H') {
      const char *name = data + strlen(data) + 1;
      int rc = strlen(data) + 1 < len && enter_ns_of(data, "uts", CLONE_NEWUTS) == 0 && sethostname(name, strlen(name)) == 0;
      if (!rc) snprintf(msg, sizeof(msg), "hostname of %.32s: %s", data, strerror(errno));
      if (reply_text(rc ? 'K' : 'E', rc ? "" : msg) < 0) break;
    } else if (kind == 'P') {
      snprintf(pidfile_buf, sizeof(pidfile_buf), "%.4000s", data);
      pidfile = pidfile_buf;
      if (reply_text('K', "") < 0) break;
    } else if (kind == 'C') {
      /* One join at a time: a second waits for the first (and fails with it). */
      struct join_req req = {criu, data, len};
      int rc = helper_finish(&joining, msg, sizeof(msg)) == 0 && helper_start(&joining, join_cgroups, &req, msg, sizeof(msg)) == 0;
      if (reply_text(rc ? 'K' : 'E', rc ? "" : msg) < 0) break;
    } else if (kind == 'N') {
      /* HOSTIF\0ADDR\0GW\0MAC: the sandbox's link, made in the netns CRIU restores into. */
      const char *f[4] = {data, NULL, NULL, NULL};
      for (int k = 1; k < 4; k++) f[k] = f[k - 1] + strlen(f[k - 1]) + 1;
      const char *end4 = f[3] + strlen(f[3]);
      const char *flags = (size_t)(end4 - data) + 1 < len ? end4 + 1 : "";
      int rc = -1, deferred = strchr(flags, '1') != NULL, held = strchr(flags, 'h') != NULL;
      if ((size_t)(f[3] - data) >= len) snprintf(msg, sizeof(msg), "bad network request");
      else if (deferred) {
        later.set = 1;
        snprintf(later.hostif, sizeof(later.hostif), "%.31s", f[0]);
        snprintf(later.addr, sizeof(later.addr), "%.31s", f[1]);
        snprintf(later.gw, sizeof(later.gw), "%.31s", f[2]);
        snprintf(later.mac, sizeof(later.mac), "%.31s", f[3]);
        rc = 0;
      } else rc = net_setup(host_netns, own_netns, f[0], f[1], f[2], f[3], 0, msg, sizeof(msg));
      if (rc == 0 && !held) {
        snprintf(route_if, sizeof(route_if), "%.31s", f[0]);
        snprintf(route_addr, sizeof(route_addr), "%.31s", f[1]);
        snprintf(route_gw, sizeof(route_gw), "%.31s", f[2]);
      }
      if (reply_text(rc < 0 ? 'E' : 'K', rc < 0 ? msg : "") < 0) break;
    } else if (kind == 'T') {
      /* HOSTIF\0ADDR\0GW, each found inside the frame (buf[n] is a NUL). */
      const char *f[3] = {data, NULL, NULL};
      int k = 1;
      for (; k < 3 && (size_t)(f[k - 1] - data) + strlen(f[k - 1]) < len; k++) f[k] = f[k - 1] + strlen(f[k - 1]) + 1;
      int rc = -1;
      if (k < 3) snprintf(msg, sizeof(msg), "bad route request");
      else rc = net_route(host_netns, f[0], f[1], f[2], msg, sizeof(msg));
      if (reply_text(rc < 0 ? 'E' : 'K', rc < 0 ? msg : "") < 0) break;
    } else if (kind == 'S') {
      /* GROUP: short slices for the pause (sched_slice.c): this relay, CRIU, and every thread
       * of the group GROUP until the next 'R' is answered. */
      slices_shorten_workers(criu);
      int rc = slices_shorten_group(data, &paused, msg, sizeof(msg));
      if (reply_text(rc < 0 ? 'E' : 'K', rc < 0 ? msg : "") < 0) break;
    } else {
      reply_text('E', "unknown request");
    }
  }
  /* The pause is over (or the server gone before it asked for the dump): nothing of the tree is
   * left with a short slice. */
  slices_finish(&paused);
  close(sk);
  char ignored[512];
  helper_finish(&joining, ignored, sizeof(ignored));
  int st = 0;
  while (waitpid(criu, &st, 0) < 0 && errno == EINTR) {}
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static int run_swrk(char **criu_argv, const char *pidfile) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) < 0) {
    perror("criu-run: socketpair");
    return 1;
  }
  pid_t pid = fork();
  if (pid < 0) {
    perror("criu-run: fork");
    return 1;
  }
  if (pid == 0) {
    close(sv[0]);
    close(0);
    close(REPLY_FD);
    int argc = 0;
    while (criu_argv[argc]) argc++;
    char fdarg[16];
    snprintf(fdarg, sizeof(fdarg), "%d", sv[1]);
    char **argv = calloc((size_t)argc + 3, sizeof(char *));
    if (!argv) _exit(127);
    for (int k = 0; k < argc; k++) argv[k] = criu_argv[k];
    argv[argc] = "swrk";
    argv[argc + 1] = fdarg;
    execv(argv[0], argv);
    perror("criu-run: exec");
    _exit(127);
  }
  close(sv[1]);
  return relay(sv[0], pid, pidfile);
}

/* CRIU_ARGV with "--status-fd N" appended, N the file READY_FILE opened for CRIU to write to
 * (created afresh, never through a link: its directory is the engine's). */
static char **with_status_fd(char **criu_argv, const char *ready_file) {
  int fd = open(ready_file, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    perror("criu-run: ready file");
    return NULL;
  }
  int argc = 0;
  while (criu_argv[argc]) argc++;
  char **argv = calloc((size_t)argc + 3, sizeof(char *));
  char *fdarg = malloc(16);
  if (!argv || !fdarg) return NULL;
  snprintf(fdarg, 16, "%d", fd);
  for (int k = 0; k < argc; k++) argv[k] = criu_argv[k];
  argv[argc] = "--status-fd";
  argv[argc + 1] = fdarg;
  return argv;
}

int criu_run_main(int argc, char **argv) {
  const char *cache = NULL, *netns_of = NULL, *pidfile = NULL, *ov_dir = NULL, *ov_target = NULL, *ov_options = NULL, *ready_file = NULL;
  int new_netns = 0, swrk = 0;
  int i = 1;
  for (; i < argc; i++) {
    if (!strcmp(argv[i], "--cache") && i + 1 < argc) cache = argv[++i];
    else if (!strcmp(argv[i], "--netns-of") && i + 1 < argc) netns_of = argv[++i];
    else if (!strcmp(argv[i], "--new-netns")) new_netns = 1;
    else if (!strcmp(argv[i], "--swrk")) swrk = 1;
    else if (!strcmp(argv[i], "--pidfile") && i + 1 < argc) pidfile = argv[++i];
    else if (!strcmp(argv[i], "--ready-file") && i + 1 < argc) ready_file = argv[++i];
    else if (!strcmp(argv[i], "--overlay") && i + 3 < argc) {
      ov_dir = argv[++i];
      ov_target = argv[++i];
      ov_options = argv[++i];
    }
    else if (!strcmp(argv[i], "--")) { i++; break; }
  }
  if (i >= argc) {
    fprintf(stderr, "criu-run: no command\n");
    return 2;
  }
  char **criu_argv = argv + i;
  if (ready_file && !(criu_argv = with_status_fd(criu_argv, ready_file))) return 1;
  /* CRIU works while a sandbox is paused: on a host whose CPUs are busy, at the same priority
   * as what keeps them busy it waits for a time slice at every step. Raised above it (and above
   * the node's server); with the sandbox's CPU group weighed up for the pause (cgroups.ts,
   * boost), four spinning sandboxes per CPU stretched a pause from 29 to 49 ms, not to 72. What
   * CRIU restores gets back its own nice value (CRIU restores it per thread). */
  setpriority(PRIO_PROCESS, 0, CRIU_NICE);
  char err[512];
  if (ov_dir && replace_overlay(ov_dir, ov_target, ov_options, err, sizeof(err)) < 0) {
    fprintf(stderr, "criu-run: %s\n", err);
    return 1;
  }
  host_netns = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
  if (netns_of && enter_ns_of(netns_of, "net", CLONE_NEWNET) < 0) {
    perror("criu-run: enter the sandbox's netns");
    return 1;
  }
  if (new_netns && (unshare(CLONE_NEWNET) < 0 || loopback_up() < 0 || netns_defaults() < 0)) {
    perror("criu-run: new netns");
    return 1;
  }
  own_netns = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
  if (cache) {
    host_mntns = open("/proc/self/ns/mnt", O_RDONLY | O_CLOEXEC);
    if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0 ||
        mount(cache, "/run", NULL, MS_BIND, NULL) < 0) {
      perror("criu-run: private /run");
      /* Without the cache CRIU still works, only slower. */
    }
    own_mntns = open("/proc/self/ns/mnt", O_RDONLY | O_CLOEXEC);
    if (own_mntns < 0 || host_mntns < 0) {
      perror("criu-run: mount namespaces");
      return 1;
    }
  }
  if (swrk) return run_swrk(criu_argv, pidfile);
  execv(criu_argv[0], criu_argv);
  perror("criu-run: exec");
  return 127;
}
