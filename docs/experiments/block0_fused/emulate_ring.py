"""CPU check of block0_stream_kernel.cuh's filter ring: its mbarrier protocol under random
interleavings of the two warpgroups, the producer (thread 0) and the bulk copies; and the
host's packing of the filters into the taps the ring copies (check_packing).

    python docs/experiments/block0_fused/emulate_ring.py [--trials 2000]

The kernel's per-thread program, step by step, as the ring sees it (ring.issue and
conv3x3_ring): the prologue issues taps 0..kSlots-1; per conv and tap a warpgroup waits for the
tap's full barrier, issues its wgmma group (which reads the slot until the group completes),
and from the second tap on waits until at most one group is in flight, then releases the
previous tap's slot (one arrival per warpgroup), after which warpgroup 0's thread 0 issues tap
t - 1 + kSlots (waiting for that slot's empty barrier first); after a conv's last tap, wait for
all groups, release, issue.  Bulk copies and wgmma groups complete at random later steps.
Checked in every trial: every wgmma group reads its own tap's data for its whole life (no
copy lands in a slot a group still reads), no deadlock, and no copy outstanding at the end.
mbarrier semantics (PTX ISA): a phase completes when its pending arrivals reach zero and its
transaction count is zero; try_wait.parity(p) succeeds once the phase of parity p has
completed, i.e. while the current phase's parity differs from p.
"""
from __future__ import annotations

import argparse
import random

K_SLOTS = 3
TAPS_PER_IMAGE = 18
TAP_BYTES = 8192


class MBarrier:
    def __init__(self, count: int):
        self.count, self.pending, self.tx, self.phase = count, count, 0, 0

    def _maybe_complete(self):
        if self.pending == 0 and self.tx == 0:
            self.phase += 1
            self.pending = self.count

    def arrive(self, expect_tx: int = 0):
        assert self.pending > 0, "more arrivals than the barrier's count in one phase"
        self.tx += expect_tx
        self.pending -= 1
        self._maybe_complete()

    def complete_tx(self, nbytes: int):
        self.tx -= nbytes
        self._maybe_complete()

    def try_wait(self, parity: int) -> bool:
        return (self.phase & 1) != parity


class Sim:
    def __init__(self, images: int, rng: random.Random):
        self.rng = rng
        self.total = images * TAPS_PER_IMAGE
        self.full = [MBarrier(1) for _ in range(K_SLOTS)]
        self.empty = [MBarrier(2) for _ in range(K_SLOTS)]
        self.slot_data = [None] * K_SLOTS      # which tap a slot holds (None: being written or empty)
        self.copies = []                        # in flight: (tap,)
        self.groups = {0: [], 1: []}            # per warpgroup: in-flight wgmma groups (tap they read)

    # ---- the producer's issue(t) as a generator of blocking steps ----
    def issue(self, t):
        if t >= self.total:
            return
        s = t % K_SLOTS
        if t >= K_SLOTS:
            while not self.empty[s].try_wait(((t // K_SLOTS) - 1) & 1):
                yield "producer waits empty"
        # no wgmma group may still read the slot the copy overwrites
        for wg, gs in self.groups.items():
            assert all(g % K_SLOTS != s for g in gs), f"tap {t}'s copy lands in slot {s} while warpgroup {wg} reads it"
        self.full[s].arrive(expect_tx=TAP_BYTES)
        self.slot_data[s] = None
        self.copies.append(t)

    def warpgroup(self, wg: int):
        producer, rel = wg == 0, True
        if producer:
            for t in range(K_SLOTS):
                yield from self.issue(t)
        for it in range(self.total // TAPS_PER_IMAGE):
            for conv in range(2):
                t0 = it * TAPS_PER_IMAGE + conv * 9
                for tap in range(9):
                    t = t0 + tap
                    while not self.full[t % K_SLOTS].try_wait((t // K_SLOTS) & 1):
                        yield f"wg{wg} waits full {t}"
                    assert self.slot_data[t % K_SLOTS] == t, f"wg{wg} reads slot {t % K_SLOTS} for tap {t}: holds {self.slot_data[t % K_SLOTS]}"
                    self.groups[wg].append(t)
                    yield "issued"
                    if tap > 0:
                        while len(self.groups[wg]) > 1:
                            yield f"wg{wg} waits group<=1"
                        if rel:
                            self.empty[(t - 1) % K_SLOTS].arrive()
                        if producer:
                            yield from self.issue(t - 1 + K_SLOTS)
                while self.groups[wg]:
                    yield f"wg{wg} waits group 0"
                if rel:
                    self.empty[(t0 + 8) % K_SLOTS].arrive()
                if producer:
                    yield from self.issue(t0 + 8 + K_SLOTS)
                yield "barrier"  # the epilogue's __syncthreads (both warpgroups meet)

    def run(self) -> None:
        threads = {0: self.warpgroup(0), 1: self.warpgroup(1)}
        at_barrier = set()
        stalled = 0
        while threads:
            # asynchronous completions: a bulk copy, a wgmma group (oldest first)
            if self.copies and self.rng.random() < 0.3:
                t = self.copies.pop(self.rng.randrange(len(self.copies)))
                self.slot_data[t % K_SLOTS] = t
                self.full[t % K_SLOTS].complete_tx(TAP_BYTES)
            for wg in (0, 1):
                if self.groups[wg] and self.rng.random() < 0.3:
                    self.groups[wg].pop(0)
            runnable = [wg for wg in threads if wg not in at_barrier]
            if not runnable:  # both at the barrier: release it
                at_barrier.clear()
                continue
            wg = self.rng.choice(runnable)
            try:
                what = next(threads[wg])
            except StopIteration:
                del threads[wg]
                continue
            if what == "barrier":
                at_barrier.add(wg)
            stalled = stalled + 1 if "waits" in what else 0
            if stalled > 100000:
                raise AssertionError(f"deadlock: {what}")
        assert not self.copies, f"copies outstanding at the end: {self.copies}"


def check_packing() -> None:
    """block0_fused.cu's pack_taps, its torch ops mirrored: each weight (conv, tap, output
    channel n, input channel ch) lands at the byte the resident kernels' weight_offset gives
    within that tap's 8192-byte block (so a slot filled by one bulk copy holds what a
    resident filter buffer holds for that tap)."""
    import torch
    w = torch.randn(2, 64, 64, 3, 3, generator=torch.Generator().manual_seed(0)).half()  # KCRS
    n, j = torch.arange(64).unsqueeze(1), torch.arange(8).unsqueeze(0)
    src_chunk = j ^ (n & 7)
    krsc = [w[i].permute(0, 2, 3, 1).contiguous() for i in range(2)]
    packed = torch.cat([k.reshape(64, 9, 8, 8).permute(1, 0, 2, 3)[:, n, src_chunk] for k in krsc]).reshape(-1)
    conv, tap, out_ch, ch = torch.meshgrid(torch.arange(2), torch.arange(9), torch.arange(64), torch.arange(64),
                                           indexing="ij")
    byte = (conv * 9 + tap) * TAP_BYTES + out_ch * 128 + (((ch // 8) ^ (out_ch & 7)) << 4) + 2 * (ch % 8)
    assert torch.equal(packed[byte // 2], w[conv, out_ch, ch, tap // 3, tap % 3]), "pack_taps misplaces a weight"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=2000)
    args = ap.parse_args()
    for trial in range(args.trials):
        rng = random.Random(f"ring {trial}")
        Sim(images=rng.randint(1, 4), rng=rng).run()
    check_packing()
    print("packing: every weight where the resident kernels' weight_offset puts it")
    print(f"ring protocol: {args.trials} random interleavings, 1-4 images each: every wgmma group read its own "
          f"tap, no copy overwrote a slot in use, no deadlock, no copy outstanding at the end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
