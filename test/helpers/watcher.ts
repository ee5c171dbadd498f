/** A dev server's way of watching files, in Python (the debian image has it): an inotify watch on
 * each path given, every event appended to /tmp/events as `WD NAME`, "watching" once they are in. */
export const WATCHER = [
  'import ctypes, os, struct, sys',
  'libc = ctypes.CDLL(None, use_errno=True)',
  'fd = libc.inotify_init1(0)',
  'for p in sys.argv[1:]:',
  '    if libc.inotify_add_watch(fd, p.encode(), 0x100 | 0x2 | 0x8) < 0: raise SystemExit("watch failed: " + p)',
  'out = open("/tmp/events", "a")',
  'print("watching", file=out, flush=True)',
  'while True:',
  '    buf = os.read(fd, 4096)',
  '    i = 0',
  '    while i < len(buf):',
  '        wd, mask, cookie, ln = struct.unpack_from("iIII", buf, i)',
  '        print(wd, buf[i + 16:i + 16 + ln].rstrip(b"\\0").decode(), file=out, flush=True)',
  '        i += 16 + ln',
].join('\n');
