"""The halo kernels' copy pipeline (kernels/conv2d_fused/conv2d_fused_sm90_halo.cuh: produce and
mma_tile) replayed on the CPU under random interleavings: a producer thread issues each tile's three
TMA copies into stage (3j + s) % 6, waiting on the stage's "empty" mbarrier; the copies land later,
completing its "full" mbarrier; two consumer groups wait on "full" for their tiles, read them and
arrive on "empty".  An mbarrier wait is by phase parity: it returns once the barrier's phase count
has a parity other than the one asked for, so phase k and phase k + 2 look alike.

Checked: every read finds the copy it waits for, nothing deadlocks, for the tile orders the two
kernels use (conv2d_fused's: tile j to group j % 2; conv2d_fused_se_gate's: image k to group k % 2
as tiles 2k - k % 2 and 2k - k % 2 + 2), with any number of images a CTA; and the order a first
version of the se_gate kernel used (image k as tiles 2k and 2k + 1), which the replay must catch:
on an H100 it faulted or gave wrong outputs whenever a CTA took two images."""
import random

import pytest

STAGES = 6


class Barrier:
    def __init__(self, count):
        self.count, self.arrived, self.phase = count, 0, 0

    def arrive(self):
        self.arrived += 1
        if self.arrived == self.count:
            self.arrived, self.phase = 0, self.phase + 1

    def ready(self, parity):  # mbarrier.try_wait.parity
        return self.phase % 2 != parity


def replay(tiles, groups, rng):
    """tiles: the producer's list of tile ids j (None: skipped); groups: each consumer group's
    tiles in order.  Returns None, or what went wrong."""
    full = [Barrier(1) for _ in range(STAGES)]
    empty = [Barrier(1) for _ in range(STAGES)]  # one arrival per group (128 threads in the kernel)
    content = [None] * STAGES
    in_flight = []  # (stage, what) copies issued, not landed
    producer = [(j, s) for j in tiles if j is not None for s in range(3)]
    consumers = [[(j, s) for j in g for s in range(3)] for g in groups]
    pos = [0] * len(groups)
    reading = [None] * len(groups)  # a stage a group has waited on and not released yet
    p = 0
    while True:
        moves = []
        if p < len(producer):
            j, s = producer[p]
            it = 3 * j + s
            if empty[it % STAGES].ready((it // STAGES) % 2 ^ 1):
                moves.append("produce")
        if in_flight:
            moves.append("land")
        for g in range(len(groups)):
            if reading[g] is not None:
                moves.append(("release", g))
            elif pos[g] < len(consumers[g]):
                j, s = consumers[g][pos[g]]
                it = 3 * j + s
                if full[it % STAGES].ready((it // STAGES) % 2):
                    moves.append(("read", g))
        if not moves:
            done = p == len(producer) and all(pos[g] == len(c) for g, c in enumerate(consumers))
            return None if done else f"deadlock: producer at {p}, groups at {pos}"
        move = rng.choice(moves)
        if move == "produce":
            j, s = producer[p]
            in_flight.append(((3 * j + s) % STAGES, (j, s)))
            p += 1
        elif move == "land":
            stage, what = in_flight.pop(rng.randrange(len(in_flight)))
            content[stage] = what
            full[stage].arrive()
        elif move[0] == "read":
            g = move[1]
            j, s = consumers[g][pos[g]]
            stage = (3 * j + s) % STAGES
            if content[stage] != (j, s):
                return f"group {g} read stage {stage} for tile {j} copy {s} and found {content[stage]}"
            reading[g] = stage
        else:
            g = move[1]
            empty[reading[g]].arrive()
            reading[g] = None
            pos[g] += 1


def conv_order(tiles):
    """conv2d_fused's halo kernel: tile j to group j % 2."""
    return list(range(tiles)), [list(range(g, tiles, 2)) for g in (0, 1)]


def se_gate_order(images):
    """conv2d_fused_se_gate's: image k to group k % 2, tiles 2k - k % 2 and 2k - k % 2 + 2; the
    producer walks j < 4 ceil(images / 2), skipping the tiles of images past the last."""
    tiles = [j if 2 * (j // 4) + j % 2 < images else None for j in range(4 * ((images + 1) // 2))]
    groups = [[t for k in range(g, images, 2) for t in (2 * k - g, 2 * k - g + 2)] for g in (0, 1)]
    return tiles, groups


def first_se_gate_order(images):
    """The first version's: image k as tiles 2k and 2k + 1, image k to group k % 2."""
    return list(range(2 * images)), [[t for k in range(g, images, 2) for t in (2 * k, 2 * k + 1)] for g in (0, 1)]


@pytest.mark.parametrize("order, count", [(conv_order, n) for n in (1, 2, 3, 8, 9)] +
                         [(se_gate_order, n) for n in (1, 2, 3, 4, 7, 16)],
                         ids=lambda v: getattr(v, "__name__", str(v)))
def test_every_read_finds_its_copy(order, count, rng_seed):
    rng = random.Random(rng_seed)
    tiles, groups = order(count)
    assert sorted(t for g in groups for t in g) == sorted(t for t in tiles if t is not None)
    for trial in range(300):
        fail = replay(tiles, groups, rng)
        assert fail is None, f"trial {trial}: {fail}"


@pytest.mark.parametrize("images", [2, 3, 16])
def test_the_first_se_gate_order_is_caught(images, rng_seed):
    rng = random.Random(rng_seed)
    tiles, groups = first_se_gate_order(images)
    fails = [replay(tiles, groups, rng) for _ in range(300)]
    assert any(f is not None for f in fails)
