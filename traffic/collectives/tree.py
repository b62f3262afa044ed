"""Tree algorithms: binary-tree reduce and broadcast, tree all-reduce and NCCL's double binary tree.

A tree is given as ``parent[r]`` (None at the root) and ``children[r]``.  Data moves in ``chunks`` pieces:
piece k goes up (reduce) and down (broadcast) independently of piece k+1, so pieces pipeline along the tree.
Reductions receive each child's piece into its own ``scratch`` slot (so children send concurrently), then
sum the slots into the accumulator with local ops before forwarding to the parent.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..schedule import Schedule, ScheduleBuilder, ScheduleError
from ._common import pieces

__all__ = ["Tree", "heap_tree", "nccl_btree", "nccl_double_tree", "tree_allreduce", "double_tree_allreduce",
           "tree_reduce"]


@dataclass(frozen=True)
class Tree:
    """A rooted spanning tree of ranks 0..n-1 (children in increasing rank order)."""

    root: int
    parent: tuple[int | None, ...]
    children: tuple[tuple[int, ...], ...]

    @classmethod
    def from_parents(cls, parent: list[int | None]) -> "Tree":
        n = len(parent)
        roots = [r for r in range(n) if parent[r] is None]
        if len(roots) != 1:
            raise ScheduleError(f"tree must have exactly one root, has {len(roots)}")
        children: list[list[int]] = [[] for _ in range(n)]
        for r, p in enumerate(parent):
            if p is not None:
                children[p].append(r)
        tree = cls(roots[0], tuple(parent), tuple(tuple(sorted(c)) for c in children))
        # every rank must reach the root
        for r in range(n):
            seen, x = 0, r
            while tree.parent[x] is not None:
                x = tree.parent[x]  # type: ignore[assignment]
                seen += 1
                if seen > n:
                    raise ScheduleError("tree parent links contain a cycle")
        return tree

    def depth(self) -> int:
        best = 0
        for r in range(len(self.parent)):
            d, x = 0, r
            while self.parent[x] is not None:
                x = self.parent[x]  # type: ignore[assignment]
                d += 1
            best = max(best, d)
        return best


def heap_tree(n: int, root: int = 0) -> Tree:
    """The binary heap tree over ranks relabelled so ``root`` is position 0: children of p are 2p+1, 2p+2."""
    parent: list[int | None] = []
    for r in range(n):
        p = (r - root) % n
        parent.append(None if p == 0 else ((p - 1) // 2 + root) % n)
    return Tree.from_parents(parent)


def _btree_parent(n: int, r: int) -> int | None:
    if r == 0:
        return None
    bit = r & -r  # lowest set bit
    up = (r ^ bit) | (bit << 1)
    if up >= n:
        up = r ^ bit
    return up


def nccl_btree(n: int) -> Tree:
    """NCCL's ``ncclGetBtree``: an in-order binary tree whose leaves are the odd ranks; rank 0 is the root."""
    return Tree.from_parents([_btree_parent(n, r) for r in range(n)])


def nccl_double_tree(n: int) -> tuple[Tree, Tree]:
    """NCCL's ``ncclGetDtree``: the btree and its mirror (n even) or shift by one (n odd).

    Most ranks are a leaf in one tree and an interior node in the other, so the two trees together use every
    rank's send and receive bandwidth about evenly.
    """
    t1 = nccl_btree(n)
    if n % 2 == 1:
        m = lambda r: (r + 1) % n  # noqa: E731  tree-2 rank of tree-1 position
        inv = lambda r: (r - 1) % n  # noqa: E731
    else:
        m = lambda r: n - 1 - r  # noqa: E731
        inv = m
    parent: list[int | None] = []
    for r in range(n):
        p = t1.parent[inv(r)]
        parent.append(None if p is None else m(p))
    return t1, Tree.from_parents(parent)


def _tree_phases(
    b: ScheduleBuilder,
    tree: Tree,
    region: tuple[int, int],
    count: int,
    chunks: int,
    *,
    up: bool,
    down: bool,
    acc: "callable",
    name: str,
) -> None:
    """Add a reduce (``up``) and/or broadcast (``down``) over ``tree`` for elements ``region`` of the data.

    ``acc(r)`` -> (buffer, base): where rank r accumulates / holds the data (element i at base + i).
    Scratch slot c of a rank (c-th child) holds that child's pieces at ``c * count + i``.
    """
    n = len(tree.parent)
    off0, size = region
    prev: dict[tuple[int, str], tuple[int, int] | None] = {}
    for k, (off, cnt) in enumerate(pieces(off0, size, chunks)):
        for r in range(n):
            buf, base = acc(r)
            mine = (buf, base + off, cnt)
            parent = tree.parent[r]
            h_up = None
            if up:
                h_c = b.step(r, [prev.get((r, "c"))], label=f"{name} gather-children k={k}")
                h_up = b.step(r, [h_c, prev.get((r, "u"))], label=f"{name} reduce-up k={k}")
                prev[(r, "c")], prev[(r, "u")] = h_c, h_up
                b.local(h_up, ("input", off, cnt), mine)
                for slot, _child in enumerate(tree.children[r]):
                    b.local(h_up, ("scratch", slot * count + off, cnt), mine, op="reduce")
            if down:
                h_d = b.step(r, [h_up, prev.get((r, "d"))], label=f"{name} from-parent k={k}")
                h_b = b.step(r, [h_d, prev.get((r, "b"))], label=f"{name} broadcast-down k={k}")
                prev[(r, "d")], prev[(r, "b")] = h_d, h_b
                if not up and parent is None:
                    b.local(h_b, ("input", off, cnt), mine)
        for r in range(n):
            buf, base = acc(r)
            parent = tree.parent[r]
            if parent is None:
                continue
            pbuf, pbase = acc(parent)
            if up:
                slot = tree.children[parent].index(r)
                b.transfer(prev[(r, "u")], (buf, base + off, cnt),
                           prev[(parent, "c")], ("scratch", slot * count + off, cnt))
            if down:
                src = ("input", off, cnt) if (not up and tree.parent[parent] is None) else (pbuf, pbase + off, cnt)
                b.transfer(prev[(parent, "b")], src, prev[(r, "d")], (buf, base + off, cnt))


def _max_children(*trees: Tree) -> int:
    return max(len(c) for t in trees for c in t.children)


def tree_allreduce(ranks: int, count: int, *, dtype: str, chunks: int, params: dict) -> Schedule:
    """Binary-tree all-reduce: reduce every piece up a heap binary tree to rank 0, then broadcast it back down.

    ``scratch`` holds one slot of ``count`` elements per child.  Interior ranks send and receive up to 3x the
    message (2 children + parent); depth is ceil(log2(n+1)) - 1.
    """
    tree = heap_tree(ranks, 0)
    b = ScheduleBuilder(ranks)
    _tree_phases(b, tree, (0, count), count, chunks, up=True, down=True, acc=lambda r: ("output", 0), name="tree")
    bufs = [{"input": count, "output": count, "scratch": len(tree.children[r]) * count} for r in range(ranks)]
    return b.build(collective="allreduce", algorithm="tree", count=count, dtype=dtype, buffers=bufs, params=params)


def double_tree_allreduce(ranks: int, count: int, *, dtype: str, chunks: int, params: dict) -> Schedule:
    """NCCL-style double binary tree all-reduce: the first half of the data is all-reduced (reduce up, then
    broadcast down) on :func:`nccl_btree`, the second half on its mirror/shift, concurrently.

    Each tree uses its own ``scratch`` slots (offsets of its half), so ``scratch`` is 2 x count.
    """
    t1, t2 = nccl_double_tree(ranks)
    half = count // 2
    b = ScheduleBuilder(ranks)
    for i, (tree, region) in enumerate(((t1, (0, half)), (t2, (half, count - half)))):
        _tree_phases(b, tree, region, count, chunks, up=True, down=True, acc=lambda r: ("output", 0), name=f"tree{i}")
    slots = [max(len(t1.children[r]), len(t2.children[r])) for r in range(ranks)]
    bufs = [{"input": count, "output": count, "scratch": slots[r] * count} for r in range(ranks)]
    return b.build(collective="allreduce", algorithm="double_tree", count=count, dtype=dtype, buffers=bufs,
                   params=params)


def tree_reduce(ranks: int, count: int, *, dtype: str, chunks: int, params: dict, root: int = 0) -> Schedule:
    """Binary-tree reduce to ``root`` (heap tree rooted there).  Non-root ranks accumulate partial sums in
    ``scratch`` after their child slots; only the root's ``output`` is non-empty.
    """
    tree = heap_tree(ranks, root)
    b = ScheduleBuilder(ranks)
    slots = [len(tree.children[r]) for r in range(ranks)]

    def acc(r: int) -> tuple[str, int]:
        return ("output", 0) if r == root else ("scratch", slots[r] * count)

    _tree_phases(b, tree, (0, count), count, chunks, up=True, down=False, acc=acc, name="reduce")
    bufs = [
        {"input": count, "output": count if r == root else 0, "scratch": (slots[r] + (0 if r == root else 1)) * count}
        for r in range(ranks)
    ]
    return b.build(collective="reduce", algorithm="tree", count=count, dtype=dtype, buffers=bufs, root=root,
                   params=params)


def tree_broadcast(ranks: int, count: int, *, dtype: str, chunks: int, params: dict, root: int = 0) -> Schedule:
    """Binary-tree broadcast from ``root`` (heap tree rooted there), pieces pipelined down the tree.

    The root copies its input to its output and sends from its input; other ranks forward from ``output``.
    """
    tree = heap_tree(ranks, root)
    b = ScheduleBuilder(ranks)
    _tree_phases(b, tree, (0, count), count, chunks, up=False, down=True, acc=lambda r: ("output", 0), name="bcast")
    bufs = [{"input": count, "output": count}] * ranks
    return b.build(collective="broadcast", algorithm="tree", count=count, dtype=dtype, buffers=bufs, root=root,
                   params=params)
