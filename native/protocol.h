/* Wire protocol between the host engine and the in-sandbox agent.
 * Every frame: a 12-byte little-endian header, then `len` bytes of payload.
 * The TypeScript side (src/engine/agent/protocol.ts) mirrors these numbers. */
#ifndef FP_PROTOCOL_H
#define FP_PROTOCOL_H

#include <stdint.h>

#define FP_HEADER_LEN 12
#define FP_MAX_FRAME (8u << 20)

struct fp_header {
  uint32_t len;   /* payload bytes */
  uint8_t type;   /* FP_T_* */
  uint8_t flags;  /* stream for OUTPUT, options for SPAWN/SIGNAL */
  uint16_t reserved;
  uint32_t id;    /* process id chosen by the client */
} __attribute__((packed));

/* client -> agent */
enum {
  FP_T_SPAWN = 1,   /* payload: u16 rows, u16 cols, u16 argc, u16 envc, cwd\0 argv\0... env\0... */
  FP_T_STDIN = 2,   /* payload: bytes; empty payload closes stdin */
  FP_T_SIGNAL = 3,  /* payload: i32 signo; flags & FP_SIG_FOREGROUND: the pty's foreground group */
  FP_T_RESIZE = 4,  /* payload: u16 rows, u16 cols */
  FP_T_ATTACH = 5,  /* payload: u64 stdout offset, u64 stderr offset: replay from there, then live */
  FP_T_DETACH = 6,
  FP_T_LIST = 7,
  FP_T_FORGET = 8,  /* drop the record of an exited process */
  FP_T_PING = 9,    /* flags & FP_PING_DUMP_FOLLOWS: CRIU dumps the sandbox next (see agent_main) */
  FP_T_WRITE_FILE = 10, /* payload: u32 mode, path\0, bytes: create or replace, inside the sandbox's root */
  FP_T_READ_FILE = 11,  /* payload: u32 max bytes, path\0; a directory is EISDIR */
  FP_T_REMOVE_FILE = 12, /* payload: path\0; a missing file is not an error; empty dirs too */
  FP_T_LIST_DIR = 13,   /* payload: path\0; reply FILE with lines "name\ttype\tsize\n", type d|f|l|o */
  FP_T_MKDIR = 14,      /* payload: path\0; parents made as needed */
  FP_T_READ_AT = 15,    /* payload: u32 max bytes, u64 offset, path\0 (agents from before it: EINVAL) */
  FP_T_WRITE_AT = 16,   /* payload: u32 mode, u32 flags, u64 offset, path\0, bytes (likewise) */
  FP_T_RENAME = 17,     /* payload: from\0 to\0 (likewise) */
  FP_T_STAT = 18,       /* payload: path\0; reply FILE "type\tsize\tmode\tmtime_ms\ttarget\n" then "u\tUID\tGID\n" (likewise) */
  FP_T_WATCH = 19,      /* payload: u32 flags (1 recursive), path\0; reply OK, then WATCH_EVENT frames (agent_watch.c) */
  FP_T_UNWATCH = 20,    /* ends the watch of this id */
  FP_T_SET_METADATA = 21, /* payload: path\0, "KEY\tVALUE\n"...: xattrs user.e2b.KEY; STAT answers them as "x\tKEY\tVALUE\n" lines */
  FP_T_SET_OWNER_MODE = 22, /* payload: u32 what (FP_SET_*), u32 uid, u32 gid, u32 mode, path\0: a link is not followed */
};

/* agent -> client */
enum {
  FP_T_OUTPUT = 128,  /* flags: 1 stdout, 2 stderr; payload: u64 offset, bytes */
  FP_T_SPAWNED = 129, /* payload: i32 pid */
  FP_T_EXIT = 130,    /* payload: i32 exit code (-1 when signalled), i32 signal */
  FP_T_LIST_REPLY = 131,
  FP_T_ERROR = 133,   /* payload: i32 errno, message */
  FP_T_PONG = 134,
  FP_T_FILE = 135,    /* payload: the file's bytes; flags 1: cut at the requested maximum */
  FP_T_OK = 136,
  FP_T_WATCH_EVENT = 137, /* flags: FP_WATCH_*; payload: the name, relative to the watched directory */
};

enum { FP_SPAWN_PTY = 1, FP_SPAWN_NOECHO = 2 };
/* On SPAWN and the file operations (WRITE_FILE .. SET_METADATA, WATCH): the payload starts with
 * u32 uid, u32 gid, u32 ngroups, u32 groups[ngroups] (at most FP_MAX_GROUPS), the sandbox's own
 * ids of the user the process runs as, or who owns what a file operation makes (done with root's
 * access, as E2B's envd does: agent_ids.c). Agents before it refuse the frame with EINVAL. */
enum { FP_AS_USER = 0x80 };
#define FP_MAX_GROUPS 32
enum { FP_WRITE_TRUNCATE = 1 };
enum { FP_SET_UID = 1, FP_SET_GID = 2, FP_SET_MODE = 4 };
enum { FP_SIG_FOREGROUND = 1 };
enum { FP_PING_DUMP_FOLLOWS = 1 };
enum { FP_WATCH_CREATE = 1, FP_WATCH_WRITE = 2, FP_WATCH_REMOVE = 3, FP_WATCH_RENAME = 4, FP_WATCH_CHMOD = 5 };

#endif
