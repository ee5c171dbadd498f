import { benchServer } from './bench/lib.ts';
const s = await benchServer({ config: { warmForks: '4' } });
const med = (x: number[]) => [...x].sort((p, q) => p - q)[x.length >> 1]!.toFixed(2);
try {
  const r = await s.api('POST', '/instances', {});
  const id = r.body.id as string;
  await s.api('POST', `/instances/${id}/exec`, { command: 'true' });
  const ck = (await s.api('POST', `/instances/${id}/checkpoints?wait=true`, {})).body.id as string;
  await s.api('POST', `/instances/${id}/rollback`, { checkpoint_id: ck });
  const rb: number[] = [], e1: number[] = [], e2: number[] = [], e3: number[] = [], base: number[] = [];
  for (let i = 0; i < 20; i++) {
    await s.fp.warm.settled(); await new Promise((res) => setTimeout(res, 300));
    let t = performance.now(); await s.api('POST', `/instances/${id}/exec`, { command: 'true' }); base.push(performance.now() - t);
    t = performance.now(); await s.api('POST', `/instances/${id}/rollback`, { checkpoint_id: ck }); rb.push(performance.now() - t);
    for (const arr of [e1, e2, e3]) { t = performance.now(); await s.api('POST', `/instances/${id}/exec`, { command: 'true' }); arr.push(performance.now() - t); }
  }
  console.log('exec before', med(base), 'rollback', med(rb), 'exec1', med(e1), 'exec2', med(e2), 'exec3', med(e3));
} finally { await s.close(); }
