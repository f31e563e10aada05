"""Pure core: a node's memory, counted out as jobs hold it.

A job holds its `--mem` (per node) on each of its nodes while it runs, as it holds its
GPUs: two jobs of 100 GiB do not both start on a node of 128 GiB, though each alone
would fit (its cgroup caps the job; the node's total is what the kernel's OOM killer
guards). A job goes only where its memory fits beside what the running jobs, and those
this pass has started, hold (`short`, in the node filter of place.py). A job without
`--mem` holds none, and a node whose memory is not known (0) is never short.
`--mem=0` is Slurm's "all of each node's memory": such a job holds the whole of its
nodes' memory and needs all of it free (`WHOLE`, what `asks` gives for it).

Most clusters give memory by GPU (a partition's `def_mem_per_gpu`), so every job asks
some, and a node's free memory is then its free GPUs' share. Memory cannot change such
a job's choice: `binds` says so in O(1) from the lowest memory per free GPU of any node
(kept as a lower bound through the pass), and the job takes the fast paths as one
asking nothing does (quick.py, the plain check of place.py).

Starts count memory; bookings plan on GPUs alone (memory frees as the jobs holding it
end, and a booked start that finds it still held waits on). A preemptor leaves out the
nodes short of its memory even were every job it may preempt gone (`short_beside`),
and where its victims' GPUs leave memory short, the cheapest candidates holding memory
there go too (`more_victims`): a preemption never stops jobs for a start that cannot be.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from services.placer.core.index import ClusterIndex
from services.placer.core.model import JobRequest, Running

NONE: frozenset[int] = frozenset()
WHOLE = -1  # an ask of all of each node's memory (`--mem=0`)


def asks(job: JobRequest | Running) -> int:
    """What the job asks (or holds) of each node: MiB, `WHOLE`, or 0 (nothing)."""
    return WHOLE if job.mem_whole else job.mem_per_node_mib


class HeldMemory:
    """MiB held per node id, and the nodes short of a job's memory (cached per ask)."""

    def __init__(self, ix: ClusterIndex, running: Sequence[Running]) -> None:
        self.cap = [n.memory_mib for n in ix.nodes]
        self.id_of = ix.id_of
        self.held: dict[int, int] = {}
        self._short: dict[int, frozenset[int]] = {}
        # each node's free GPUs, an upper bound through the pass (only starts lower it;
        # a node taking no work has none): what `binds` divides free memory by
        self.free = [f.bit_count() if a >= 0 else 0 for f, a in zip(ix.free, ix.avail, strict=True)]
        self._lowest: tuple[int, int] | None = None  # (MiB, GPUs) free, least MiB per GPU
        self._lowest_known = False
        id_of = ix.id_of
        for r in running:
            if ask := asks(r):
                self.hold(ask, (id_of[g.node] for g in r.grants if g.node in id_of))

    def _need(self, i: int, ask: int) -> int:
        return self.cap[i] if ask == WHOLE else ask

    def short(self, ask: int) -> frozenset[int]:
        """Ids of the nodes without `ask` free beside what is held there. Only a node
        holding some can be: one too small for it whole is sizes.py's."""
        if not ask or not self.held:
            return NONE
        found = self._short.get(ask)
        if found is None:
            cap, need = self.cap, self._need
            found = self._short[ask] = frozenset(
                i for i, used in self.held.items() if cap[i] and used + need(i, ask) > cap[i]
            )
        return found

    def binds(self, ask: int, g: int) -> bool:
        """Whether memory may keep a job asking `ask` of each node, with `g` GPUs on each
        (at least), off a node its GPUs alone would allow; False: `short` leaves out no
        node such a job could take. A node is short for it only where less than `ask` is
        free, and takes it only with `g` GPUs free: less than ask/g per free GPU. If no
        node has less memory per free GPU than that, none is short for it."""
        if not ask or not self.held:
            return False
        if ask == WHOLE or g <= 0:
            return bool(self.short(ask))
        low = self._lowest_ratio()
        return low is not None and ask * low[1] > g * low[0]

    def lacks(self, i: int, ask: int) -> bool:
        """Whether node i is short of `ask` now (one node of `short`, in O(1))."""
        cap = self.cap[i]
        return bool(cap) and self.held.get(i, 0) + self._need(i, ask) > cap

    def out(self, ask: int, g: int) -> frozenset[int]:
        """`short(ask)` where memory `binds` the job, else none."""
        return self.short(ask) if self.binds(ask, g) else NONE

    def _lowest_ratio(self) -> tuple[int, int] | None:
        if not self._lowest_known:
            self._lowest_known = True
            self._lowest = None
            for i in self.held:
                self._lower(i)
        return self._lowest

    def _lower(self, i: int) -> None:
        """Node i's free memory per free GPU into the lowest, where it is lower."""
        cap, gpus = self.cap[i], self.free[i]
        if not cap or gpus <= 0:
            return
        mib, low = cap - self.held.get(i, 0), self._lowest
        if low is None or mib * low[1] < low[0] * gpus:
            self._lowest = (mib, gpus)

    def hold(self, ask: int, nodes: Iterable[int]) -> None:
        """A job holding `ask` on each of `nodes` (a running job, or one started now)."""
        held = self.held
        for i in nodes:
            held[i] = held.get(i, 0) + self._need(i, ask)
        self._short = {}

    def start(self, ask: int, picks: Iterable[tuple[int, int]]) -> None:
        """A job started now, holding `ask` and the GPUs `picks` (node id, mask) give:
        its nodes' memory per free GPU may fall, and the lowest with it."""
        picks = list(picks)
        self.hold(ask, (i for i, _ in picks))
        for i, mask in picks:
            self.free[i] = max(0, self.free[i] - mask.bit_count())
            if self._lowest_known:
                self._lower(i)

    def short_beside(self, ask: int, cands: Sequence[Running]) -> frozenset[int]:
        """Ids of the nodes short of `ask` even once every job of `cands` has gone."""
        if not ask or not self.held:
            return NONE
        freed = self._on_nodes(cands)
        cap, need = self.cap, self._need
        return frozenset(
            i
            for i, used in self.held.items()
            if cap[i] and used - freed.get(i, 0) + need(i, ask) > cap[i]
        )

    def more_victims(
        self,
        ask: int,
        nodes: Iterable[int],
        victims: Sequence[Running],
        cands: Sequence[Running],
    ) -> list[Running] | None:
        """`victims`, then the candidates (cheapest first) whose memory on `nodes` the
        preemptor's `ask` there still needs; None: not even every candidate frees it."""
        out = list(victims)
        if not ask or not self.held:
            return out
        chosen = {r.job_id for r in out}
        rest = [r for r in cands if r.job_id not in chosen and asks(r)]
        for i in nodes:
            over = self._over(i, ask, out)
            while over > 0 and (r := self._next_on(i, rest)) is not None:
                rest.remove(r)
                out.append(r)
                over -= self._need(i, asks(r))
            if over > 0:
                return None
        return out

    def _over(self, i: int, ask: int, leaving: Sequence[Running]) -> int:
        """MiB node i lacks for `ask` once `leaving` has gone (<= 0: none)."""
        cap = self.cap[i]
        if not cap:
            return 0
        return self.held.get(i, 0) - self._on_nodes(leaving).get(i, 0) + self._need(i, ask) - cap

    def _next_on(self, i: int, rest: Sequence[Running]) -> Running | None:
        id_of = self.id_of
        return next((r for r in rest if any(id_of.get(g.node) == i for g in r.grants)), None)

    def _on_nodes(self, jobs: Sequence[Running]) -> dict[int, int]:
        """MiB the jobs hold per node id."""
        got: dict[int, int] = {}
        id_of = self.id_of
        for r in jobs:
            if ask := asks(r):
                for g in r.grants:
                    if (i := id_of.get(g.node)) is not None:
                        got[i] = got.get(i, 0) + self._need(i, ask)
        return got
