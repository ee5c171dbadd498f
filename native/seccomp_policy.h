/* The seccomp policy of every sandbox process, modelled on Docker's default profile
 * (moby/profiles/seccomp/default.json) for a container without CAP_SYS_ADMIN, CAP_SYS_PTRACE,
 * CAP_SYS_MODULE and the other capabilities a sandbox does not hold. Anything not listed answers
 * EPERM: among them keyctl, add_key and request_key (kernel keyrings are not namespaced), unshare,
 * setns and the mount API, bpf, perf_event_open, kexec_*, open_by_handle_at, userfaultfd,
 * fanotify_init, syslog, quotactl, reboot, the module calls, and io_uring (which Docker also
 * dropped: it bypasses this filter for the work it queues). Names this architecture lacks are
 * skipped. Only the native ABI is allowed: 32-bit (int 0x80) and x32 calls kill the caller. */
#ifndef FP_SECCOMP_POLICY_H
#define FP_SECCOMP_POLICY_H

static const char *const seccomp_allowed[] = {
  "accept", "accept4", "access", "adjtimex", "alarm", "arch_prctl", "bind", "brk", "capget", "capset",
  "chdir", "chmod", "chown", "chroot", "clock_adjtime", "clock_getres", "clock_gettime", "clock_nanosleep",
  "close", "close_range", "connect", "copy_file_range", "creat", "dup", "dup2", "dup3",
  "epoll_create", "epoll_create1", "epoll_ctl", "epoll_pwait", "epoll_pwait2", "epoll_wait",
  "eventfd", "eventfd2", "execve", "execveat", "exit", "exit_group", "faccessat", "faccessat2",
  "fadvise64", "fallocate", "fanotify_mark", "fchdir", "fchmod", "fchmodat", "fchmodat2", "fchown", "fchownat",
  "fcntl", "fdatasync", "fgetxattr", "flistxattr", "flock", "fork", "fremovexattr", "fsetxattr",
  "fstat", "fstatfs", "fsync", "ftruncate", "futex", "futex_waitv", "futimesat", "getcpu", "getcwd",
  "getdents", "getdents64", "getegid", "geteuid", "getgid", "getgroups", "getitimer", "getpeername",
  "getpgid", "getpgrp", "getpid", "getppid", "getpriority", "getrandom", "getresgid", "getresuid",
  "getrlimit", "get_robust_list", "getrusage", "getsid", "getsockname", "getsockopt", "get_thread_area",
  "gettid", "gettimeofday", "getuid", "getxattr", "inotify_add_watch", "inotify_init", "inotify_init1",
  "inotify_rm_watch", "io_cancel", "ioctl", "io_destroy", "io_getevents", "io_pgetevents", "ioprio_get",
  "ioprio_set", "io_setup", "io_submit", "ipc", "kill", "landlock_add_rule", "landlock_create_ruleset",
  "landlock_restrict_self", "lchown", "lgetxattr", "link", "linkat", "listen", "listxattr", "llistxattr",
  "lremovexattr", "lseek", "lsetxattr", "lstat", "madvise", "membarrier", "memfd_create", "memfd_secret",
  "mincore", "mkdir", "mkdirat", "mknod", "mknodat", "mlock", "mlock2", "mlockall", "mmap", "modify_ldt",
  "mprotect", "mq_getsetattr", "mq_notify", "mq_open", "mq_timedreceive", "mq_timedsend", "mq_unlink",
  "mremap", "msgctl", "msgget", "msgrcv", "msgsnd", "msync", "munlock", "munlockall", "munmap",
  "name_to_handle_at", "nanosleep", "newfstatat", "open", "openat", "openat2", "pause", "pidfd_open",
  "pidfd_send_signal", "pipe", "pipe2", "pkey_alloc", "pkey_free", "pkey_mprotect", "poll", "ppoll",
  "prctl", "pread64", "preadv", "preadv2", "prlimit64", "process_mrelease", "process_vm_readv",
  "process_vm_writev", "pselect6", "ptrace", "pwrite64", "pwritev", "pwritev2", "read", "readahead",
  "readlink", "readlinkat", "readv", "recvfrom", "recvmmsg", "recvmsg", "remap_file_pages", "removexattr",
  "rename", "renameat", "renameat2", "restart_syscall", "rmdir", "rseq", "rt_sigaction", "rt_sigpending",
  "rt_sigprocmask", "rt_sigqueueinfo", "rt_sigreturn", "rt_sigsuspend", "rt_sigtimedwait",
  "rt_tgsigqueueinfo", "sched_getaffinity", "sched_getattr", "sched_getparam", "sched_get_priority_max",
  "sched_get_priority_min", "sched_getscheduler", "sched_rr_get_interval", "sched_setaffinity",
  "sched_setattr", "sched_setparam", "sched_setscheduler", "sched_yield", "seccomp", "select", "semctl",
  "semget", "semop", "semtimedop", "sendfile", "sendmmsg", "sendmsg", "sendto", "setfsgid", "setfsuid",
  "setgid", "setgroups", "setitimer", "setpgid", "setpriority", "setregid", "setresgid", "setresuid",
  "setreuid", "setrlimit", "set_robust_list", "setsid", "setsockopt", "set_thread_area", "set_tid_address",
  "setuid", "setxattr", "shmat", "shmctl", "shmdt", "shmget", "shutdown", "sigaltstack", "signalfd",
  "signalfd4", "socketpair", "splice", "stat", "statfs", "statx", "symlink", "symlinkat", "sync",
  "sync_file_range", "syncfs", "sysinfo", "tee", "tgkill", "time", "timer_create", "timer_delete",
  "timer_getoverrun", "timer_gettime", "timer_settime", "timerfd_create", "timerfd_gettime",
  "timerfd_settime", "times", "tkill", "truncate", "umask", "uname", "unlink", "unlinkat", "utime",
  "utimensat", "utimes", "vfork", "vmsplice", "wait4", "waitid", "write", "writev",
  /* arm64 spellings */
  "sync_file_range2",
};

/* CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET, as Docker masks them. */
#define SECCOMP_NAMESPACE_FLAGS 0x7E020000ULL
#define SECCOMP_AF_VSOCK 40

/* PER_LINUX, PER_LINUX32, UNAME26 and both together, and the query 0xffffffff. */
static const unsigned long seccomp_personalities[] = { 0x0, 0x8, 0x20000, 0x20008, 0xffffffffUL };

#endif
