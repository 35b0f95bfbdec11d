"""Writes the sample timer logs (README.md) with the format strings of
Megatron-LM and DeepSpeed, copied from their code as it writes them (hence
``str.format`` calls where an f-string would do)."""
# ruff: noqa: UP032, C408

import datetime as _dt
from pathlib import Path

OUT = Path(__file__).resolve().parent

# ---- Megatron-LM (training.py training_log + core/timers.py Timers.log, minmax), torchrun --tee
def mega_iter(ts, it, total, consumed, elapsed, gbs, loss):
    s = f" [{ts}]"
    s += ' iteration {:8d}/{:8d} |'.format(it, total)
    s += ' consumed samples: {:12d} |'.format(consumed)
    s += ' elapsed time per iteration (ms): {:.1f} |'.format(elapsed)
    s += ' throughput per GPU (TFLOP/s/GPU): {:.1f} |'.format(31.4)
    s += f' learning rate: {3.0e-4:.6E} |'
    s += f' global batch size: {gbs:5d} |'
    s += ' {}: {:.6E} |'.format('lm loss', loss)
    s += f' loss scale: {1.0:.1f} |'
    s += f' grad norm: {1.234:.3f} |'
    s += ' number of skipped iterations: {:3d} |'.format(0)
    s += ' number of nan iterations: {:3d} |'.format(0)
    return s

def mega_block(pairs):
    out = '(min, max) time across ranks (ms):'
    for name, (mn, mx) in pairs:
        out += '\n    {}: ({:.2f}, {:.2f})'.format((name + ' ').ljust(48, '.'), mn, mx)
    return out

def block_for(fb, ls, es, ags, pag, c2m, unscale, clip, zeros, inner, m2p, opt, bg, fc, bc):
    order = [('forward-backward', fb), ('layernorm-grads-all-reduce', ls),
             ('embedding-grads-all-reduce', es), ('all-grads-sync', ags),
             ('params-all-gather', pag), ('optimizer-copy-to-main-grad', c2m),
             ('optimizer-unscale-and-check-inf', unscale), ('optimizer-clip-main-grad', clip),
             ('optimizer-count-zeros', zeros), ('optimizer-inner-step', inner),
             ('optimizer-copy-main-to-model-params', m2p), ('optimizer', opt),
             ('batch-generator', bg), ('forward-compute', fc), ('backward-compute', bc)]
    return mega_block([(n, v) for n, v in order if v is not None])

def tee(rank, text):
    return "\n".join(f"[default{rank}]:{line}" for line in text.split("\n"))

L = []
L += [tee(0, "using world size: 4, data-parallel size: 4, context-parallel size: 1, tensor-model-parallel size: 1, pipeline-model-parallel size: 1"),
      tee(0, "------------------------ arguments ------------------------"),
      *[tee(0, '  {} {} {}'.format(a, '.' * (48 - len(a)), v)) for a, v in
        sorted([("log_interval", 5), ("timing_log_level", 2), ("global_batch_size", 32),
                ("seq_length", 2048)], key=lambda x: x[0].lower())],
      tee(0, "-------------------- end of arguments ---------------------"),
      tee(1, "/usr/lib/python3/dist-packages/torch/utils/data/dataloader.py:558: UserWarning: This DataLoader will create 16 worker processes in total."),
      tee(0, "[after dataloaders are built] datetime: 2024-05-01 12:00:00"),
      tee(0, "training ..."),
      tee(0, "[before the start of training step] datetime: 2024-05-01 12:00:00")]
# iteration 1 (first-iteration line, timers not reset), then every 5
rows = [  # ts, it, consumed, elapsed, per-timer (min,max)
    ("2024-05-01 12:00:02.500000", 1, 32, 2500.0,
     dict(fb=(2000.0, 2100.0), ls=(0.4, 0.5), es=(0.2, 0.3), ags=(60.0, 80.0), pag=(4.0, 5.0),
          c2m=(9.0, 10.0), unscale=(7.0, 8.0), clip=(11.0, 12.0), zeros=None, inner=(180.0, 200.0),
          m2p=(8.0, 9.0), opt=(230.0, 250.0), bg=(900.0, 1200.0), fc=(1300.0, 1400.0), bc=(500.0, 600.0))),
    ("2024-05-01 12:00:06.500000", 5, 160, 1000.0,
     dict(fb=(780.0, 800.0), ls=(0.4, 0.5), es=(0.2, 0.3), ags=(30.0, 40.0), pag=(4.0, 5.0),
          c2m=(9.0, 10.0), unscale=(7.0, 8.0), clip=(11.0, 12.0), zeros=None, inner=(90.0, 100.0),
          m2p=(8.0, 9.0), opt=(140.0, 150.0), bg=(300.0, 450.0), fc=(480.0, 500.0), bc=(240.0, 250.0))),
    ("2024-05-01 12:00:12.000000", 10, 320, 1100.0,
     dict(fb=(880.0, 900.0), ls=(0.4, 0.5), es=(0.2, 0.3), ags=(30.0, 40.0), pag=(4.0, 5.0),
          c2m=(9.0, 10.0), unscale=(7.0, 8.0), clip=(11.0, 12.0), zeros=None, inner=(90.0, 100.0),
          m2p=(8.0, 9.0), opt=(140.0, 150.0), bg=(400.0, 550.0), fc=(580.0, 600.0), bc=(240.0, 250.0))),
    ("2024-05-01 12:00:17.000000", 15, 480, 1000.0,
     dict(fb=(780.0, 800.0), ls=(0.4, 0.5), es=(0.2, 0.3), ags=(30.0, 40.0), pag=(4.0, 5.0),
          c2m=(9.0, 10.0), unscale=(7.0, 8.0), clip=(11.0, 12.0), zeros=None, inner=(90.0, 100.0),
          m2p=(8.0, 9.0), opt=(140.0, 150.0), bg=(300.0, 450.0), fc=(480.0, 500.0), bc=(240.0, 250.0))),
    ("2024-05-01 12:00:22.000000", 20, 640, 1000.0,
     dict(fb=(780.0, 800.0), ls=(0.4, 0.5), es=(0.2, 0.3), ags=(30.0, 40.0), pag=(4.0, 5.0),
          c2m=(9.0, 10.0), unscale=(7.0, 8.0), clip=(11.0, 12.0), zeros=None, inner=(90.0, 100.0),
          m2p=(8.0, 9.0), opt=(140.0, 150.0), bg=(300.0, 450.0), fc=(480.0, 500.0), bc=(240.0, 250.0))),
]
losses = [10.91, 10.2, 9.8, 9.5, 9.1]
for (ts, it, consumed, el, t), loss in zip(rows, losses):
    L.append(tee(3, mega_iter(ts, it, 20, consumed, el, 32, loss)))
    if it == 1:
        L.append(tee(0, "[Rank 0] (after 1 iterations) memory (MB) | allocated: 3120.5 | max allocated: 9876.1 | reserved: 10240.0 | max reserved: 10240.0"))
    if it == 10:   # another rank's text lands inside the block
        blk = tee(3, block_for(**t)).split("\n")
        blk.insert(6, tee(1, "W0501 12:00:12.001000 140 torch/distributed/c10d/socket.cpp:123] [c10d] slow send"))
        L.append("\n".join(blk))
    else:
        L.append(tee(3, block_for(**t)))
L += [tee(0, "[after training is done] datetime: 2024-05-01 12:00:23"),
      tee(0, "saving checkpoint at iteration      20 to /ckpt in torch_dist format"),
      tee(0, "  successfully saved checkpoint from iteration      20 to /ckpt [ t 1/1, p 1/1 ]")]
d = OUT / "megatron_starved"; d.mkdir(parents=True, exist_ok=True)
(d / "train.log").write_text("\n".join(L) + "\n")

# ---- Megatron-LM before August 2022: one "time (ms)" line, no timestamps
def old_iter(it, total, consumed, elapsed, gbs, loss, skipped=0):
    s = ' iteration {:8d}/{:8d} |'.format(it, total)
    s += ' consumed samples: {:12d} |'.format(consumed)
    s += ' elapsed time per iteration (ms): {:.1f} |'.format(elapsed)
    s += ' learning rate: {:.3E} |'.format(1.5e-6)
    s += ' global batch size: {:5d} |'.format(gbs)
    s += ' {}: {:.6E} |'.format('lm loss', loss)
    s += ' loss scale: {:.1f} |'.format(4096.0)
    s += ' grad norm: {:.3f} |'.format(2.5)
    s += ' number of skipped iterations: {:3d} |'.format(skipped)
    s += ' number of nan iterations: {:3d} |'.format(0)
    return s

def old_time(pairs):
    s = 'time (ms)'
    for name, v in pairs:
        s += ' | {}: {:.2f}'.format(name, v)
    return s

L = [" > number of parameters on (tensor, pipeline) model parallel rank (0, 0): 336226304",
     "> learning rate decay style: cosine",
     " loading checkpoint from /ckpt at iteration 1000",
     "  successfully loaded checkpoint from /ckpt at iteration 1000",
     "time (ms) | model-and-optimizer-setup: 2571.12 | train/valid/test-data-iterators-setup: 812.33",
     "training ..."]
for it, el, fc, bc, rmg, pa, la, ea, opt in [(1010, 200.0, 60.0, 90.0, 30.0, 29.5, 0.2, 0.3, 15.0),
                                             (1020, 210.0, 62.0, 92.0, 31.0, 30.5, 0.2, 0.3, 15.0),
                                             (1030, 400.0, 61.0, 91.0, 230.0, 229.5, 0.2, 0.3, 15.0)]:
    L.append(old_iter(it, 2000, it * 8, el, 8, 7.1))
    L.append(old_time([('forward-compute', fc), ('backward-compute', bc),
                       ('backward-params-all-reduce', pa), ('backward-layernorm-all-reduce', la),
                       ('backward-embedding-all-reduce', ea), ('backward-reduce-model-grads', rmg),
                       ('backward-gather-model-params', 0.01), ('optimizer-copy-to-main-grad', 2.0),
                       ('optimizer-unscale-and-check-inf', 1.5), ('optimizer-clip-main-grad', 1.0),
                       ('optimizer-count-zeros', 0.0), ('optimizer-inner-step', 9.0),
                       ('optimizer-copy-main-to-model-params', 1.2), ('optimizer', opt),
                       ('batch-generator', 3.0)]))
    if it == 1010:
        L.append("[Rank 0] (after 1010 iterations) memory (MB) | allocated: 6245.03 | max allocated: 8132.50 | reserved: 9554.0 | max reserved: 9554.0")
d = OUT / "megatron_2021"; d.mkdir(parents=True, exist_ok=True)
(d / "pretrain_bert.out").write_text("\n".join(L) + "\n")

# ---- DeepSpeed before July 2023 (log_dist, "rank=0 time (ms)"), HF Trainer with tqdm, GAS 2
def ds_old(ts, body):
    return f"[{ts}] [INFO] [logging.py:96:log_dist] [Rank 0] rank=0 time (ms) | {body}"
def fmt(pairs):
    return " | ".join("{}: {:.2f}".format(n, v) for n, v in pairs)
L = ["[2023-06-21 07:39:01,002] [INFO] [real_accelerator.py:110:get_accelerator] Setting ds_accelerator to cuda (auto detect)",
     "[INFO|trainer.py:1786] 2023-06-21 07:39:02,100 >> ***** Running training *****",
     "[INFO|trainer.py:1787] 2023-06-21 07:39:02,100 >>   Num examples = 1,000",
     "[INFO|trainer.py:1790] 2023-06-21 07:39:02,100 >>   Gradient Accumulation steps = 2"]
t0 = _dt.datetime(2023, 6, 21, 7, 39, 10)
steps = [  # per micro-step (fwd, bwd, inner, allreduce, step) and the boundary sums
    [(27.0, 73.0, 51.0, 22.0, 0.0), (28.0, 74.0, 52.0, 22.0, 72.0)],
    [(27.0, 73.0, 51.0, 22.0, 0.0), (27.0, 75.0, 52.0, 23.0, 70.0)],
    [(29.0, 77.0, 54.0, 23.0, 0.0), (27.0, 73.0, 51.0, 22.0, 71.0)],
]
for i, micro in enumerate(steps):
    end = t0 + _dt.timedelta(milliseconds=500 * (i + 1))
    ts = end.strftime("%Y-%m-%d %H:%M:%S,") + f"{end.microsecond // 1000:03d}"
    bar = f"  {i}%|{'#' * i}{' ' * (10 - i)}| {i}/345 [00:0{i}<06:50,  1.23s/it]"
    first = True
    for f, b, bi, ba, s in micro:
        line = ds_old(ts, fmt([('forward_microstep', f), ('backward_microstep', b),
                               ('backward_inner_microstep', bi), ('backward_allreduce_microstep', ba),
                               ('step_microstep', s)]))
        L.append((bar + line) if first else line)
        first = False
    L.append(f"[{ts}] [INFO] [logging.py:96:log_dist] [Rank 0] rank=0 time (ms) | " +
             fmt([('optimizer_allgather', 7.5), ('optimizer_gradients', 0.02), ('optimizer_step', 60.0)]))
    tot = [sum(m[k] for m in micro) for k in range(5)]
    L.append(ds_old(ts, fmt([('forward', tot[0]), ('backward', tot[1]), ('backward_inner', tot[2]),
                             ('backward_allreduce', tot[3]), ('step', tot[4])])))
L.append("[INFO|trainer.py:2039] 2023-06-21 07:39:12,000 >> Training completed. Do not forget to share your model on huggingface.co/models =)")
d = OUT / "deepspeed_2023"; d.mkdir(parents=True, exist_ok=True)
(d / "hf_trainer.log").write_text("\n".join(L) + "\n")

# ---- DeepSpeed after July 2023 (print_dist "[Rank N] time (ms)"), two nodes via pdsh, ranks 0 and 4
L = ["node-a: [2024-05-01 09:00:00,000] [INFO] [runner.py:568:main] cmd = /usr/bin/python -u -m deepspeed.launcher.launch --world_info=... train.py --deepspeed ds.json",
     "node-b: [2024-05-01 09:00:01,000] [INFO] [launch.py:146:main] WORLD INFO DICT: {'node-a': [0, 1, 2, 3], 'node-b': [0, 1, 2, 3]}"]
for i in range(4):
    for host, rank, ar in (("node-a", 0, 40.0), ("node-b", 4, 90.0)):
        fwd, inner, step = 20.0, 45.0, 15.0
        bwd = inner + ar + 1.0
        L.append(f"{host}: [Rank {rank}] time (ms) | " + fmt([('fwd_microstep', fwd), ('bwd_microstep', bwd),
                 ('bwd_inner_microstep', inner), ('bwd_allreduce_microstep', ar), ('step_microstep', step)]))
        L.append(f"{host}: [Rank {rank}] time (ms) | " + fmt([('fwd', fwd), ('bwd', bwd), ('bwd_inner', inner),
                 ('bwd_allreduce', ar), ('step', step)]))
    L.append(f"node-a: [2024-05-01 09:00:0{2 + i},500] [INFO] [logging.py:128:log_dist] [Rank 0] step={i + 1}, skipped=0, lr=[0.0001], mom=[(0.9, 0.999)]")
d = OUT / "deepspeed_2024"; d.mkdir(parents=True, exist_ok=True)
(d / "job.out").write_text("\n".join(L) + "\n")
