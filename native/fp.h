#ifndef FP_H
#define FP_H
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
int agent_main(void);
int agent_serve_files(int conn_fd);
int volume_files_main(int argc, char **argv);
int boot_main(int argc, char **argv);
int shim_main(int argc, char **argv);
int spawner_main(int argc, char **argv);
int criu_run_main(int argc, char **argv);
int overlay_main(int argc, char **argv);
int syncfs_main(int argc, char **argv);
int fhpath_main(int argc, char **argv);
int wp_hold_main(int argc, char **argv);
int pages_flatten_main(int argc, char **argv);
int read_full(int fd, void *buf, size_t len);
int write_full(int fd, const void *buf, size_t len);
int loopback_up(void);
int netns_defaults(void);
int write_sysctl(const char *path, const char *value);
int net_setup(int host_ns, int sandbox_ns, const char *host_if, const char *addr, const char *gw, const char *mac, int with_route, char *err, size_t errlen);
int net_route(int host_ns, const char *host_if, const char *addr, const char *gw, char *err, size_t errlen);
int net_setup_main(int argc, char **argv);
#include <stddef.h>
int replace_overlay(const char *dir, const char *target, const char *options, char *err, size_t errlen);
int mkdev_main(int argc, char **argv);
/* A sandbox's uid range: its 0..65535 are host BASE..BASE+65535 (idmap.c). */
#define FP_RANGE_SIZE 65536u
#include <sys/types.h>
int write_id_maps(pid_t pid, unsigned long base, char *err, size_t errlen);
int userns_for_range(unsigned long base, char *err, size_t errlen);
int replace_overlay_idmapped(const char *dir, const char *target, const char *options, unsigned long base, char *err, size_t errlen);
int userns_limits(char *err, size_t errlen);
/* A forked helper (helper.c): FN runs in the child; its message, if it fails, comes back
 * through helper_finish. A pid of -1 is no helper. */
struct helper { pid_t pid; int pipe; };
typedef int (*helper_fn)(const void *arg, char *err, size_t errlen);
int helper_start(struct helper *h, helper_fn fn, const void *arg, char *err, size_t errlen);
int helper_finish(struct helper *h, char *err, size_t errlen);
/* A helper bounding the per-user counters of the user namespace PID is in. */
int userns_limits_start(pid_t pid, struct helper *h, char *err, size_t errlen);

/* sched_slice.c: short scheduler slices for a checkpoint's pause. */
struct slice_saved { pid_t tid; uint64_t runtime; };
struct slices { struct slice_saved *saved; size_t n, cap; char group[4096]; };
void slices_shorten_workers(pid_t criu);
int slices_shorten_group(const char *group_dir, struct slices *s, char *err, size_t errlen);
void slices_restore(struct slices *s);
void slices_finish(struct slices *s);
int volume_tree(const char *dir, long base, int read_only, char *err, size_t errlen);
/* Closes of an idmapped disk's layer trees left until close_deferred_trees() (idmap.c). */
void defer_tree_closes(void);
void close_deferred_trees(void);
int mount_disk_for(const char *dir, const char *target, const char *options, long base, char *err, size_t errlen);
/* An empty directory of the agent layer, bound read-only over masked /proc directories. */
#define CONFINE_EMPTY_DIR ".fp/empty"
int confine_proc(char *err, size_t errlen);
int install_seccomp(char *err, size_t errlen);
int keep_capabilities(int (*kept)(int cap));
#endif
