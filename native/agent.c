/* fp-agent init: PID 1 of a forkpoint sandbox.
 *
 * It owns every process started in the sandbox (pipes or a PTY), reaps zombies, keeps a
 * bounded scrollback per stream while no client is attached, and serves the framed protocol
 * of protocol.h on a unix socket inside the sandbox's filesystem. Everything it holds is
 * something CRIU can dump: pipes, ptys of the sandbox's own devpts, unix sockets, plain
 * memory. No pidfd, signalfd, epoll or io_uring; inotify only for a directory watch, which
 * ends before a dump (agent_watch.c). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include "agent.h"
#include "fp.h"

#define SOCKET_PATH "/.fp/agent.sock"
#define MAX_CONNS 32
#define MAX_PROCS 256
#define MAX_SUBS 4
#define RING_CAP (256u << 10)
#define CONN_HIGH_WATER (1u << 20)
#define MAX_EXITED_KEPT 128
/* Input a process has not read yet, per process: an exec's stdin (at most 8 Mi characters of
 * UTF-8) fits, and the agent's memory is the sandbox's own. */
#define STDIN_BACKLOG_MAX (32u << 20)

struct ring {
  char *buf;
  uint32_t cap;      /* allocated; grows to RING_CAP */
  uint64_t total;    /* bytes ever written: the offset of the next byte */
};


struct proc {
  uint32_t id;
  pid_t pid;
  int pty;              /* master, or -1 */
  int pty_slave;        /* kept open so the master never sees EIO between commands */
  int in_fd, out_fd, err_fd;
  int exited, code, sig;
  long exited_seq;
  struct ring out, err;
  /* Input written as the process reads it (never blocking the agent on a process that does
   * not): in_buf[in_off..in_len); in_eof: close stdin (a PTY: send ^D) once it is all written. */
  char *in_buf;
  uint32_t in_off, in_len, in_cap;
  int in_eof;
  struct conn *subs[MAX_SUBS];
  char cmd[96];
};

static struct conn conns[MAX_CONNS];
static struct proc procs[MAX_PROCS];
static int listen_fd = -1;
/* Serving one connection's file operations only (volume_files.c): no processes, no watches. */
static int files_only;
static long exit_seq;
static volatile sig_atomic_t got_sigchld;

/* ---------- rings ---------- */

static void ring_write(struct ring *r, const char *data, uint32_t n) {
  if (r->cap < RING_CAP && r->total + n > r->cap) {
    uint32_t want = r->cap ? r->cap : 4096;
    while (want < RING_CAP && want < r->total + n) want *= 2;
    if (want > RING_CAP) want = RING_CAP;
    char *nb = malloc(want);
    if (!nb) return;
    /* relinearise: the ring has never wrapped while cap < RING_CAP */
    if (r->buf) memcpy(nb, r->buf, (size_t)(r->total < r->cap ? r->total : r->cap));
    free(r->buf);
    r->buf = nb;
    r->cap = want;
  }
  if (n > r->cap) data += n - r->cap, r->total += n - r->cap, n = r->cap;
  uint32_t pos = (uint32_t)(r->total % r->cap), first = r->cap - pos < n ? r->cap - pos : n;
  memcpy(r->buf + pos, data, first);
  memcpy(r->buf, data + first, n - first);
  r->total += n;
}

static uint64_t ring_start(const struct ring *r) {
  return r->total > r->cap ? r->total - r->cap : 0;
}

/* ---------- connections ---------- */

static void conn_close(struct conn *c) {
  if (files_only) _exit(0); /* its one connection is gone: so is its reason to be */
  watches_end(c);
  for (int i = 0; i < MAX_PROCS; i++)
    for (int s = 0; s < MAX_SUBS; s++)
      if (procs[i].subs[s] == c) procs[i].subs[s] = NULL;
  close(c->fd);
  free(c->in);
  free(c->out);
  memset(c, 0, sizeof(*c));
  c->fd = -1;
}

static int conn_reserve(struct conn *c, uint32_t extra) {
  if (c->out_off > 0 && c->out_off == c->out_len) c->out_off = c->out_len = 0;
  if (c->out_len + extra <= c->out_cap) return 0;
  if (c->out_off > 0) {
    memmove(c->out, c->out + c->out_off, c->out_len - c->out_off);
    c->out_len -= c->out_off;
    c->out_off = 0;
    if (c->out_len + extra <= c->out_cap) return 0;
  }
  uint32_t want = c->out_cap ? c->out_cap : 8192;
  while (want < c->out_len + extra) want *= 2;
  char *nb = realloc(c->out, want);
  if (!nb) return -1;
  c->out = nb;
  c->out_cap = want;
  return 0;
}

void send_frame2(struct conn *c, uint8_t type, uint8_t flags, uint32_t id, const void *a,
                        uint32_t alen, const void *b, uint32_t blen) {
  struct fp_header h = {.len = alen + blen, .type = type, .flags = flags, .id = id};
  if (conn_reserve(c, FP_HEADER_LEN + alen + blen) < 0) return;
  memcpy(c->out + c->out_len, &h, FP_HEADER_LEN);
  c->out_len += FP_HEADER_LEN;
  if (alen) memcpy(c->out + c->out_len, a, alen), c->out_len += alen;
  if (blen) memcpy(c->out + c->out_len, b, blen), c->out_len += blen;
}

void send_frame(struct conn *c, uint8_t type, uint8_t flags, uint32_t id, const void *p,
                       uint32_t n) {
  send_frame2(c, type, flags, id, p, n, NULL, 0);
}

void send_error(struct conn *c, uint32_t id, int err, const char *msg) {
  int32_t e = err;
  send_frame2(c, FP_T_ERROR, 0, id, &e, 4, msg, (uint32_t)strlen(msg));
}

static void send_output(struct conn *c, uint32_t id, uint8_t stream, uint64_t off, const char *d,
                        uint32_t n) {
  send_frame2(c, FP_T_OUTPUT, stream, id, &off, 8, d, n);
}

static void send_exit(struct conn *c, struct proc *p) {
  int32_t v[2] = {p->code, p->sig};
  send_frame(c, FP_T_EXIT, 0, p->id, v, 8);
}

/* ---------- processes ---------- */

static struct proc *proc_by_id(uint32_t id) {
  for (int i = 0; i < MAX_PROCS; i++)
    if (procs[i].pid > 0 && procs[i].id == id) return &procs[i];
  return NULL;
}

static void proc_free(struct proc *p) {
  if (p->pty >= 0) close(p->pty);
  if (p->pty_slave >= 0) close(p->pty_slave);
  if (p->in_fd >= 0) close(p->in_fd);
  if (p->out_fd >= 0) close(p->out_fd);
  if (p->err_fd >= 0) close(p->err_fd);
  free(p->out.buf);
  free(p->err.buf);
  free(p->in_buf);
  memset(p, 0, sizeof(*p));
  p->pty = p->pty_slave = p->in_fd = p->out_fd = p->err_fd = -1;
}

static struct proc *proc_alloc(void) {
  struct proc *oldest = NULL;
  int exited = 0;
  for (int i = 0; i < MAX_PROCS; i++) {
    if (procs[i].pid == 0) return &procs[i];
    if (procs[i].exited) {
      exited++;
      if (!oldest || procs[i].exited_seq < oldest->exited_seq) oldest = &procs[i];
    }
  }
  if (oldest) {
    proc_free(oldest);
    return oldest;
  }
  return NULL;
}

static void forget_oldest_exited(void) {
  int exited = 0;
  struct proc *oldest = NULL;
  for (int i = 0; i < MAX_PROCS; i++)
    if (procs[i].pid > 0 && procs[i].exited) {
      exited++;
      if (!oldest || procs[i].exited_seq < oldest->exited_seq) oldest = &procs[i];
    }
  if (exited > MAX_EXITED_KEPT && oldest) proc_free(oldest);
}

static void deliver(struct proc *p, uint8_t stream, const char *d, uint32_t n) {
  struct ring *r = stream == 1 ? &p->out : &p->err;
  uint64_t off = r->total;
  ring_write(r, d, n);
  for (int s = 0; s < MAX_SUBS; s++)
    if (p->subs[s]) send_output(p->subs[s], p->id, stream, off, d, n);
}

/* Reads what is there now; returns 0 on EOF or error (the fd is then closed). */
static int drain_fd(struct proc *p, int *fd, uint8_t stream) {
  char buf[16384];
  for (;;) {
    ssize_t n = read(*fd, buf, sizeof(buf));
    if (n > 0) {
      deliver(p, stream, buf, (uint32_t)n);
      if ((size_t)n < sizeof(buf)) return 1;
      continue;
    }
    if (n < 0 && (errno == EINTR)) continue;
    if (n < 0 && errno == EAGAIN) return 1;
    close(*fd);
    *fd = -1;
    return 0;
  }
}

static void proc_exited(struct proc *p, int status) {
  /* What the process wrote before it exited is in the pipe or pty buffer: take it now. */
  if (p->pty >= 0) {
    drain_fd(p, &p->pty, 1);
  } else {
    if (p->out_fd >= 0) drain_fd(p, &p->out_fd, 1);
    if (p->err_fd >= 0) drain_fd(p, &p->err_fd, 2);
  }
  free(p->in_buf);
  p->in_buf = NULL;
  p->in_off = p->in_len = p->in_cap = 0;
  p->exited = 1;
  p->exited_seq = ++exit_seq;
  p->code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  p->sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  for (int s = 0; s < MAX_SUBS; s++)
    if (p->subs[s]) send_exit(p->subs[s], p);
  if (p->pty >= 0) close(p->pty), p->pty = -1;
  if (p->pty_slave >= 0) close(p->pty_slave), p->pty_slave = -1;
  if (p->in_fd >= 0) close(p->in_fd), p->in_fd = -1;
  if (p->out_fd >= 0) close(p->out_fd), p->out_fd = -1;
  if (p->err_fd >= 0) close(p->err_fd), p->err_fd = -1;
  forget_oldest_exited();
}

static void reap(void) {
  int status;
  pid_t pid;
  while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
    for (int i = 0; i < MAX_PROCS; i++)
      if (procs[i].pid == pid && !procs[i].exited) proc_exited(&procs[i], status);
  }
}

static void subscribe(struct proc *p, struct conn *c) {
  for (int s = 0; s < MAX_SUBS; s++)
    if (p->subs[s] == c) return;
  for (int s = 0; s < MAX_SUBS; s++)
    if (!p->subs[s]) {
      p->subs[s] = c;
      return;
    }
  p->subs[0] = c; /* the newest client wins a full list */
}

static void do_spawn(struct conn *c, struct fp_header *h, char *pl, const struct unix_ids *ids) {
  if (proc_by_id(h->id)) return send_error(c, h->id, EEXIST, "process id in use");
  struct spawn_request r;
  const char *why = NULL;
  int err = spawn_parse(h, pl, &r, &why);
  if (err) return send_error(c, h->id, err, why);
  r.ids = ids;
  struct proc *p = proc_alloc();
  if (!p) {
    spawn_request_free(&r);
    return send_error(c, h->id, EAGAIN, "process table full");
  }
  struct spawned s;
  char msg[256];
  err = spawn_start(&r, &s, msg, sizeof(msg));
  spawn_request_free(&r);
  if (err) return send_error(c, h->id, err, msg);
  p->id = h->id;
  p->pid = s.pid;
  p->pty = s.pty;
  p->pty_slave = s.pty_slave;
  p->in_fd = s.in_fd, p->out_fd = s.out_fd, p->err_fd = s.err_fd;
  memcpy(p->cmd, s.cmd, sizeof(p->cmd));
  subscribe(p, c);
  int32_t pid32 = s.pid;
  send_frame(c, FP_T_SPAWNED, 0, p->id, &pid32, 4);
}

/* The end of a process's input: a pipe is closed; on a PTY, ^D at the start of a line is end of
 * input (the terminal stays: its output is still read). */
static void stdin_end(struct proc *p) {
  if (p->pty >= 0) {
    char eot = 4;
    if (write(p->pty, &eot, 1)) {}
  } else if (p->in_fd >= 0) {
    close(p->in_fd), p->in_fd = -1;
  }
  p->in_eof = 0;
}

static int stdin_fd(const struct proc *p) { return p->pty >= 0 ? p->pty : p->in_fd; }

/* Writes what the process will take of its pending input now (its fd is non-blocking): a
 * process that does not read holds up its own input only. Input its reader closed (EPIPE) is
 * dropped, as a blocking write's was. */
static void stdin_flush(struct proc *p) {
  int fd = stdin_fd(p);
  while (fd >= 0 && p->in_off < p->in_len) {
    ssize_t n = write(fd, p->in_buf + p->in_off, p->in_len - p->in_off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n <= 0) break;
    p->in_off += (uint32_t)n;
  }
  p->in_off = p->in_len = 0;
  if (p->in_eof) stdin_end(p);
}

static int stdin_pending(const struct proc *p) { return p->in_off < p->in_len && stdin_fd(p) >= 0; }

static void do_stdin(struct conn *c, struct fp_header *h, char *pl) {
  struct proc *p = proc_by_id(h->id);
  if (!p) return send_error(c, h->id, ESRCH, "no such process");
  if (p->exited) return; /* nobody reads it any more */
  if (h->len == 0) {
    p->in_eof = 1;
    if (!stdin_pending(p)) stdin_end(p);
    return;
  }
  if (stdin_fd(p) < 0 || p->in_eof) return send_error(c, h->id, EPIPE, "stdin closed");
  uint32_t queued = p->in_len - p->in_off;
  if (queued + h->len > STDIN_BACKLOG_MAX)
    return send_error(c, h->id, ENOBUFS, "the process has not read 32 MiB of its input: more is refused");
  if (p->in_off > 0) {
    memmove(p->in_buf, p->in_buf + p->in_off, queued);
    p->in_off = 0, p->in_len = queued;
  }
  if (p->in_len + h->len > p->in_cap) {
    uint32_t want = p->in_cap ? p->in_cap : 4096;
    while (want < p->in_len + h->len) want *= 2;
    char *nb = realloc(p->in_buf, want);
    if (!nb) return send_error(c, h->id, ENOMEM, "no memory for the process's input");
    p->in_buf = nb, p->in_cap = want;
  }
  memcpy(p->in_buf + p->in_len, pl, h->len);
  p->in_len += h->len;
  stdin_flush(p);
}

static void do_signal(struct conn *c, struct fp_header *h, char *pl) {
  struct proc *p = proc_by_id(h->id);
  if (!p || h->len < 4) return send_error(c, h->id, ESRCH, "no such process");
  if (p->exited) return;
  int32_t sig;
  memcpy(&sig, pl, 4);
  pid_t target = -p->pid; /* each process leads its own session and group */
  if ((h->flags & FP_SIG_FOREGROUND) && p->pty >= 0) {
    pid_t fg = tcgetpgrp(p->pty);
    if (fg > 0) target = -fg;
    /* SIGKILL to the foreground group is meant for a command, never for the shell itself */
    if (fg == p->pid && sig == SIGKILL) return;
  }
  if (kill(target, sig) < 0 && errno != ESRCH) send_error(c, h->id, errno, strerror(errno));
}

static void do_resize(struct conn *c, struct fp_header *h, char *pl) {
  struct proc *p = proc_by_id(h->id);
  if (!p || h->len < 4) return send_error(c, h->id, ESRCH, "no such process");
  if (p->pty < 0) return;
  uint16_t rows, cols;
  memcpy(&rows, pl, 2), memcpy(&cols, pl + 2, 2);
  struct winsize ws = {.ws_row = rows, .ws_col = cols};
  ioctl(p->pty, TIOCSWINSZ, &ws);
  kill(-p->pid, SIGWINCH);
}

static void replay(struct conn *c, struct proc *p, struct ring *r, uint8_t stream, uint64_t from) {
  uint64_t start = ring_start(r);
  if (from < start) from = start;
  while (from < r->total) {
    uint32_t pos = (uint32_t)(from % r->cap);
    uint32_t n = (uint32_t)(r->total - from);
    if (n > r->cap - pos) n = r->cap - pos;
    if (n > 65536) n = 65536;
    send_output(c, p->id, stream, from, r->buf + pos, n);
    from += n;
  }
}

static void do_attach(struct conn *c, struct fp_header *h, char *pl) {
  struct proc *p = proc_by_id(h->id);
  if (!p) return send_error(c, h->id, ESRCH, "no such process");
  uint64_t offs[2] = {0, 0};
  if (h->len >= 16) memcpy(offs, pl, 16);
  replay(c, p, &p->out, 1, offs[0]);
  replay(c, p, &p->err, 2, offs[1]);
  if (p->exited) send_exit(c, p);
  else subscribe(p, c);
}

static void do_list(struct conn *c, struct fp_header *h) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (!f) return send_error(c, h->id, ENOMEM, "no memory");
  for (int i = 0; i < MAX_PROCS; i++) {
    struct proc *p = &procs[i];
    if (p->pid <= 0) continue;
    fprintf(f, "%u\t%d\t%s\t%d\t%d\t%d\t%llu\t%llu\t%s\n", p->id, p->pid, p->exited ? "exited" : "running",
            p->code, p->sig, p->pty >= 0 || p->pty_slave >= 0, (unsigned long long)p->out.total,
            (unsigned long long)p->err.total, p->cmd);
  }
  fclose(f);
  send_frame(c, FP_T_LIST_REPLY, 0, h->id, buf, (uint32_t)len);
  free(buf);
}

static void handle_frame(struct conn *c, struct fp_header *h, char *pl);

static int is_file_op(uint8_t type) {
  return (type >= FP_T_WRITE_FILE && type <= FP_T_WATCH) || type == FP_T_SET_METADATA || type == FP_T_SET_OWNER_MODE;
}

/* A file operation, or a spawn, for a user of the sandbox (FP_AS_USER): its ids come off the
 * front of the payload; a file operation is done wearing them (agent_ids.c). */
static void handle_as_user(struct conn *c, struct fp_header *h, char *pl) {
  struct fp_header own = *h;
  own.flags &= (uint8_t)~FP_AS_USER;
  struct unix_ids ids;
  const char *why = NULL;
  if (own.type != FP_T_SPAWN && !is_file_op(own.type)) return send_error(c, h->id, EINVAL, "not a frame for a user");
  uint32_t len = own.len;
  int err = ids_take(&len, &pl, &ids, &why);
  if (err) return send_error(c, h->id, err, why);
  own.len = len;
  if (own.type == FP_T_SPAWN) return do_spawn(c, &own, pl, &ids);
  err = ids_enter(&ids);
  if (err) return send_error(c, h->id, err, "cannot act as that user");
  handle_frame(c, &own, pl);
  ids_leave();
}

static void handle_frame(struct conn *c, struct fp_header *h, char *pl) {
  if (files_only && h->type != FP_T_PING && (!is_file_op(h->type) || h->type == FP_T_WATCH)) return send_error(c, h->id, EPERM, "file operations only");
  if (h->flags & FP_AS_USER) return handle_as_user(c, h, pl);
  switch (h->type) {
    case FP_T_SPAWN: return do_spawn(c, h, pl, NULL);
    case FP_T_STDIN: return do_stdin(c, h, pl);
    case FP_T_SIGNAL: return do_signal(c, h, pl);
    case FP_T_RESIZE: return do_resize(c, h, pl);
    case FP_T_ATTACH: return do_attach(c, h, pl);
    case FP_T_DETACH: {
      struct proc *p = proc_by_id(h->id);
      if (p)
        for (int s = 0; s < MAX_SUBS; s++)
          if (p->subs[s] == c) p->subs[s] = NULL;
      return;
    }
    case FP_T_LIST: return do_list(c, h);
    case FP_T_FORGET: {
      struct proc *p = proc_by_id(h->id);
      if (p && p->exited) proc_free(p);
      return;
    }
    case FP_T_PING:
      /* CRIU, checking a tree in a user namespace, opens the namespaces of its PID 1 as that
       * namespace's root, which a non-dumpable task restored by CRIU (its memory the initial
       * namespace's) refuses: dumpable until the engine's next connection. */
      if (h->flags & FP_PING_DUMP_FOLLOWS) {
        prctl(PR_SET_DUMPABLE, 1, 0, 0, 0);
        watches_end(NULL);
      }
      return send_frame(c, FP_T_PONG, 0, h->id, NULL, 0);
    case FP_T_WRITE_FILE: return do_write_file(c, h, pl);
    case FP_T_WRITE_AT: return do_write_at(c, h, pl);
    case FP_T_RENAME: return do_rename(c, h, pl);
    case FP_T_STAT: return do_stat(c, h, pl);
    case FP_T_SET_METADATA: return do_set_metadata(c, h, pl);
    case FP_T_SET_OWNER_MODE: return do_set_owner_mode(c, h, pl);
    case FP_T_READ_FILE:
    case FP_T_READ_AT: return do_read_file(c, h, pl);
    case FP_T_REMOVE_FILE: return do_remove_file(c, h, pl);
    case FP_T_LIST_DIR: return do_list_dir(c, h, pl);
    case FP_T_MKDIR: return do_mkdir(c, h, pl);
    case FP_T_WATCH: return do_watch(c, h, pl);
    case FP_T_UNWATCH: return do_unwatch(c, h);
    default: return send_error(c, h->id, EINVAL, "unknown frame type");
  }
}

static void conn_read(struct conn *c) {
  if (c->in_cap - c->in_len < 65536) {
    uint32_t want = c->in_cap ? c->in_cap * 2 : 131072;
    char *nb = realloc(c->in, want);
    if (!nb) return conn_close(c);
    c->in = nb, c->in_cap = want;
  }
  ssize_t n = read(c->fd, c->in + c->in_len, c->in_cap - c->in_len);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
  if (n <= 0) return conn_close(c);
  c->in_len += (uint32_t)n;
  uint32_t off = 0;
  while (c->in_len - off >= FP_HEADER_LEN) {
    struct fp_header h;
    memcpy(&h, c->in + off, FP_HEADER_LEN);
    if (h.len > FP_MAX_FRAME) return conn_close(c);
    if (c->in_len - off < FP_HEADER_LEN + h.len) {
      if (FP_HEADER_LEN + h.len > c->in_cap) {
        char *nb = realloc(c->in, FP_HEADER_LEN + h.len + 65536);
        if (!nb) return conn_close(c);
        c->in = nb, c->in_cap = FP_HEADER_LEN + h.len + 65536;
      }
      break;
    }
    handle_frame(c, &h, c->in + off + FP_HEADER_LEN);
    if (c->fd < 0) return;
    off += FP_HEADER_LEN + h.len;
  }
  memmove(c->in, c->in + off, c->in_len - off);
  c->in_len -= off;
}

static void conn_flush(struct conn *c) {
  while (c->out_off < c->out_len) {
    ssize_t n = write(c->fd, c->out + c->out_off, c->out_len - c->out_off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return;
    if (n <= 0) return conn_close(c);
    c->out_off += (uint32_t)n;
  }
}

/* A process whose subscribers cannot keep up is not read until they do: backpressure
 * instead of dropping bytes an attached client is waiting for. */
static int proc_blocked(struct proc *p) {
  for (int s = 0; s < MAX_SUBS; s++)
    if (p->subs[s] && p->subs[s]->out_len - p->subs[s]->out_off > CONN_HIGH_WATER) return 1;
  return 0;
}

static void on_sigchld(int sig) {
  (void)sig;
  got_sigchld = 1;
}

static int open_listener(void) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", SOCKET_PATH);
  mkdir("/.fp", 0700);
  unlink(SOCKET_PATH);
  if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, 16) < 0) return -1;
  chmod(SOCKET_PATH, 0600);
  return fd;
}

static int agent_run(int conn_fd);

int agent_main(void) { return agent_run(-1); }

/* The file operations of the one connection on CONN_FD (volume_files.c), until it closes. */
int agent_serve_files(int conn_fd) {
  files_only = 1;
  return agent_run(conn_fd);
}

static int agent_run(int conn_fd) {
  /* Not dumpable: a process of the sandbox, root or not, cannot ptrace the agent, read its
   * memory or take its file descriptors (that needs CAP_SYS_PTRACE, which no sandbox has).
   * CRIU saves and restores the flag; what the agent starts is dumpable again after exec. */
  prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  for (int i = 0; i < MAX_CONNS; i++) conns[i].fd = -1;
  for (int i = 0; i < MAX_PROCS; i++) procs[i].pty = procs[i].pty_slave = procs[i].in_fd = procs[i].out_fd = procs[i].err_fd = -1;

  sigset_t block, waitmask;
  sigemptyset(&block);
  sigaddset(&block, SIGCHLD);
  sigprocmask(SIG_BLOCK, &block, &waitmask);
  sigdelset(&waitmask, SIGCHLD);
  struct sigaction sa = {.sa_handler = on_sigchld, .sa_flags = SA_NOCLDSTOP};
  sigaction(SIGCHLD, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);

  if (conn_fd >= 0) {
    if (fcntl(conn_fd, F_SETFL, fcntl(conn_fd, F_GETFL) | O_NONBLOCK) < 0 || fcntl(conn_fd, F_SETFD, FD_CLOEXEC) < 0) return 1;
    conns[0].fd = conn_fd;
  } else {
    listen_fd = open_listener();
    if (listen_fd < 0) return 1;
  }

  enum { MAX_POLLED = 1 + MAX_CONNS + MAX_PROCS * 4 + MAX_WATCH_FDS };
  struct pollfd pfds[MAX_POLLED];
  void *owners[MAX_POLLED];
  uint8_t kinds[MAX_POLLED];
  for (;;) {
    if (got_sigchld) {
      got_sigchld = 0;
      reap();
    }
    int n = 0;
    if (listen_fd >= 0) {
      pfds[n] = (struct pollfd){.fd = listen_fd, .events = POLLIN};
      kinds[n++] = 0;
    }
    for (int i = 0; i < MAX_CONNS; i++) {
      if (conns[i].fd < 0) continue;
      short ev = POLLIN;
      if (conns[i].out_off < conns[i].out_len) ev |= POLLOUT;
      pfds[n] = (struct pollfd){.fd = conns[i].fd, .events = ev};
      owners[n] = &conns[i];
      kinds[n++] = 1;
    }
    for (int i = 0; i < MAX_PROCS; i++) {
      struct proc *p = &procs[i];
      if (p->pid <= 0 || p->exited) continue;
      if (stdin_pending(p)) {
        pfds[n] = (struct pollfd){.fd = stdin_fd(p), .events = POLLOUT};
        owners[n] = p;
        kinds[n++] = 6;
      }
      if (proc_blocked(p)) continue;
      int fds[3] = {p->pty, p->out_fd, p->err_fd};
      for (int k = 0; k < 3; k++) {
        if (fds[k] < 0) continue;
        pfds[n] = (struct pollfd){.fd = fds[k], .events = POLLIN};
        owners[n] = p;
        kinds[n++] = (uint8_t)(2 + k);
      }
    }
    int watched = watches_poll(pfds + n, owners + n, CONN_HIGH_WATER);
    for (int k = 0; k < watched; k++) kinds[n++] = 5;
    int r = ppoll(pfds, (nfds_t)n, NULL, &waitmask);
    if (r < 0) continue; /* EINTR: SIGCHLD, handled at the top */
    for (int i = 0; i < n; i++) {
      if (!pfds[i].revents) continue;
      if (kinds[i] == 0) {
        int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) continue;
        /* The server's connections come from outside the sandbox's pid namespace (their pid reads
         * 0 here); one of the sandbox's own processes (its root may open the socket) could only
         * take the connection slots the server needs. */
        struct ucred peer;
        socklen_t peer_len = sizeof(peer);
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &peer_len) < 0 || peer.pid != 0) {
          close(fd);
          continue;
        }
        prctl(PR_SET_DUMPABLE, 0, 0, 0, 0); /* again, after a dump (see FP_T_PING) */
        int slot = -1;
        for (int k = 0; k < MAX_CONNS; k++)
          if (conns[k].fd < 0) {
            slot = k;
            break;
          }
        if (slot < 0) {
          close(fd);
          continue;
        }
        memset(&conns[slot], 0, sizeof(conns[slot]));
        conns[slot].fd = fd;
      } else if (kinds[i] == 1) {
        struct conn *c = owners[i];
        if (c->fd < 0) continue;
        if (pfds[i].revents & POLLOUT) conn_flush(c);
        if (c->fd >= 0 && (pfds[i].revents & (POLLIN | POLLHUP | POLLERR))) conn_read(c);
      } else if (kinds[i] == 5) {
        watch_ready(owners[i]);
      } else {
        struct proc *p = owners[i];
        if (p->pid <= 0 || p->exited) continue;
        if (kinds[i] == 6) {
          stdin_flush(p);
          continue;
        }
        if (kinds[i] == 2 && p->pty >= 0) drain_fd(p, &p->pty, 1);
        if (kinds[i] == 3 && p->out_fd >= 0) drain_fd(p, &p->out_fd, 1);
        if (kinds[i] == 4 && p->err_fd >= 0) drain_fd(p, &p->err_fd, 2);
      }
    }
    for (int i = 0; i < MAX_CONNS; i++)
      if (conns[i].fd >= 0 && conns[i].out_off < conns[i].out_len) conn_flush(&conns[i]);
  }
}
