/* What the agent's parts share: a client connection and the replies sent on it. */
#ifndef FP_AGENT_H
#define FP_AGENT_H

#include <stddef.h>
#include <stdint.h>
#include "protocol.h"

struct conn {
  int fd;
  char *in;
  uint32_t in_len, in_cap;
  char *out;
  uint32_t out_len, out_off, out_cap;
};

void send_frame(struct conn *c, uint8_t type, uint8_t flags, uint32_t id, const void *p, uint32_t n);
void send_frame2(struct conn *c, uint8_t type, uint8_t flags, uint32_t id, const void *a, uint32_t alen,
                 const void *b, uint32_t blen);
void send_error(struct conn *c, uint32_t id, int err, const char *msg);

/* agent_ids.c: the user an FP_AS_USER frame is for (the sandbox's own ids) */
struct unix_ids {
  uint32_t uid, gid, ngroups;
  uint32_t groups[FP_MAX_GROUPS];
};
/* Takes the ids off the front of the payload (*len and *pl move past them). */
int ids_take(uint32_t *len, char **pl, struct unix_ids *ids, const char **why);
/* File access as that user (fsuid, fsgid, groups) until ids_leave: 0 or an errno. */
int ids_enter(const struct unix_ids *ids);
void ids_leave(void);
/* In a child before exec: every id of the process becomes the user's; 0 or an errno. */
int ids_become(const struct unix_ids *ids);

/* agent_spawn.c: a spawn frame's request, checked, and the process it starts */
struct spawn_request {
  uint16_t rows, cols;
  int pty, noecho;
  const struct unix_ids *ids; /* NULL: the agent's own (root) */
  char *cwd;
  char **argv, **envp; /* NULL-terminated, pointing into the frame */
  char **strs;
};
struct spawned {
  int pid;
  int pty, pty_slave;  /* master and slave, or -1 */
  int in_fd, out_fd, err_fd;
  char cmd[96];
};
int spawn_parse(const struct fp_header *h, char *pl, struct spawn_request *r, const char **why);
int spawn_start(const struct spawn_request *r, struct spawned *s, char *msg, size_t msgsz);
void spawn_request_free(struct spawn_request *r);

/* agent_files.c: file operations, run inside the sandbox's root for the host */
void do_write_file(struct conn *c, struct fp_header *h, char *pl);
void do_write_at(struct conn *c, struct fp_header *h, char *pl);
void do_read_file(struct conn *c, struct fp_header *h, char *pl);
void do_remove_file(struct conn *c, struct fp_header *h, char *pl);
void do_list_dir(struct conn *c, struct fp_header *h, char *pl);
void do_mkdir(struct conn *c, struct fp_header *h, char *pl);
void do_rename(struct conn *c, struct fp_header *h, char *pl);
void do_stat(struct conn *c, struct fp_header *h, char *pl);
void do_set_metadata(struct conn *c, struct fp_header *h, char *pl);
void do_set_owner_mode(struct conn *c, struct fp_header *h, char *pl);

/* agent_watch.c: directory watches, each owned by a connection */
#define MAX_WATCH_FDS 16
struct pollfd;
void do_watch(struct conn *c, struct fp_header *h, char *pl);
void do_unwatch(struct conn *c, struct fp_header *h);
void watches_end(struct conn *c);
int watches_poll(struct pollfd *pfds, void **owners, uint32_t high_water);
void watch_ready(void *owner);

#endif
