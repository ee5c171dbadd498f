/**
 * Issue 25: the pause of a files-only checkpoint (`memory: false`) of a running sandbox. A small
 * upper is copied while the sandbox is frozen (no CRIU); beyond the copy bound the upper is
 * frozen by rename, which needs a dump and a restore (what every checkpoint paid before). Next to
 * it, in the same run and interleaved, the same sandboxes' memory checkpoint of a small upper:
 * copied and dumped in the same freeze, the processes left running.
 */
import { benchServer, stats, table, type Stats } from './lib.js';

const N = Number(process.env.BENCH_N ?? 10);
const s = await benchServer();

async function instance(body: Record<string, unknown> = {}): Promise<string> {
  const r = await s.api('POST', '/instances', body);
  if (r.status !== 201) throw new Error(JSON.stringify(r.body));
  return r.body.id;
}
async function exec(id: string, command: string): Promise<string> {
  const r = await s.api('POST', `/instances/${id}/exec`, { command, timeout_ms: 120_000 });
  if (r.status !== 200 || r.body.exit_code !== 0) throw new Error(`${command}: ${JSON.stringify(r.body)}`);
  return r.body.stdout;
}
async function pause(id: string, memory: boolean): Promise<number> {
  const r = await s.api('POST', `/instances/${id}/checkpoints?wait=true`, { memory, retention: { mode: 'delete_oldest' } });
  if (r.body.status !== 'ready') throw new Error(JSON.stringify(r.body));
  return r.body.pause_ms;
}

try {
  const idle = await instance();
  await exec(idle, 'echo small > /root/f');
  const loaded = await instance({ limits: { memory_mb: 1024, pids: 256 } });
  // 40 processes (the agent and its shell among them) and 512 MiB of dirty memory.
  await s.api('POST', `/instances/${loaded}/processes`, {
    command: `for i in $(seq 36); do sleep 100000 & done; awk 'BEGIN { s = sprintf("%536870912s", ""); print "filled" > "/tmp/filled"; close("/tmp/filled"); system("sleep 100000") }'`,
  });
  for (let i = 0; ; i++) {
    if ((await exec(loaded, 'cat /tmp/filled 2>/dev/null || true')) === 'filled\n') break;
    if (i > 240) throw new Error('the loaded sandbox did not fill its memory in 2 minutes');
    await new Promise((r) => setTimeout(r, 500));
  }
  const processes = Number((await exec(loaded, 'ls -d /proc/[0-9]* | wc -l')).trim());
  await exec(loaded, 'echo small > /root/f');

  const rows = { idleCopy: [] as number[], loadedCopy: [] as number[], loadedMemory: [] as number[], loadedRename: [] as number[] };
  for (let i = -1; i < N; i++) {
    // Round -1 warms up (page cache, the restorer pool).
    const idleCopy = await pause(idle, false);
    const loadedCopy = await pause(loaded, false);
    const loadedMemory = await pause(loaded, true);
    // Beyond the copy bound (32 MiB): frozen by rename, through a dump and a restore.
    await exec(loaded, `head -c ${40 * 1048576} /dev/zero > /root/big${i + 1}`);
    const loadedRename = await pause(loaded, false);
    if (i < 0) continue;
    rows.idleCopy.push(idleCopy);
    rows.loadedCopy.push(loadedCopy);
    rows.loadedMemory.push(loadedMemory);
    rows.loadedRename.push(loadedRename);
  }
  const row = (name: string, st: Stats, target?: string) => ({ name, stats: st, ...(target ? { target } : {}) });
  table(`files-only checkpoint pause (issue 25): idle sandbox, and one with ${processes} processes and 512 MiB of dirty memory`, [
    row('files-only, idle, small upper (copied in a freeze)', stats(rows.idleCopy)),
    row(`files-only, ${processes} processes + 512 MiB, small upper (copied)`, stats(rows.loadedCopy), '≤ 20'),
    row(`memory checkpoint, ${processes} processes + 512 MiB, small upper (copied + dumped, left running)`, stats(rows.loadedMemory)),
    row(`  baseline: files-only, ${processes} processes + 512 MiB, 40 MiB upper (renamed: dump + restore)`, stats(rows.loadedRename)),
  ]);
} finally {
  await s.close();
}
