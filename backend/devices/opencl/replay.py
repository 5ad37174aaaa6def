"""Recorded command lists for the OpenCL backend (capability "replay"): the launches, copies, fills and
uploads one piece of host code queues, kept with their prepared arguments and enqueued again without
it (``backend/learn/replay.py`` replays training steps this way: the digits CNN's step 6.9 -> ~3 ms
here, its Python being two thirds of it).

While ``record()`` is open on a thread, every command that thread queues is also appended to the
``Recording`` (it runs as usual too). Replaying enqueues the same commands on the same buffers:

- Buffers: each buffer a recorded command touches is pinned in the pool (``BufferPool.pin``): when the
  array holding it is dropped the buffer stays with the recording instead of going back to the free
  lists, so nothing else is ever handed a buffer a replay writes (and temporaries are not reused
  inside the recording). ``close()`` gives them back.
- Uploads of host data: one of the ``inputs`` named when recording (that array or a reshaped view of it)
  is replayed from the array the replay gets under that name; any other upload from a copy taken when
  recorded.
- Scalars that change from step to step (Adam's bias corrections): ``cell(fn)`` is a ``Cell`` to pass
  as a kernel argument; before each replay the ``on_replay`` hooks run, then every cell is set to its
  ``fn()``.
- Read-backs: a host decision taken on device data cannot be replayed. ``guard_finite`` (the finiteness
  checks of some conv paths) records the check instead, assumed to pass; ``replay`` returns False
  when one fails (the caller stops replaying). Any other read-back while recording makes the
  recording unusable (``ok`` False, ``reason`` says why); so does a command queued from another thread.
"""
from __future__ import annotations

import contextlib
import threading

import numpy as np

from .params import SIGS

_OPEN = threading.Lock()  # (record()'s check-and-set of the open recording)

#: the most guards one recording keeps (each is a read-back after the replay, ~20 us once the queue is done: a
#: compiled upscaler keeps 17, one a Winograd conv)
MAX_GUARDS = 64
#: the most buffer bytes the open recordings of a device pin together (what a replay writes stays allocated
#: while it lives): a piece of work that would pass it is not recorded (its buffers go back when closed)
MAX_PINNED_BYTES = 1 << 30


def _copy_kw(dst, src) -> dict:
    """enqueue_copy's keywords copying array ``src`` into array ``dst``."""
    return {"byte_count": src.nbytes, "src_offset": src.ITEM * src.offset, "dst_offset": dst.ITEM * dst.offset}


class Cell:
    """A kernel's scalar argument recomputed before each replay (``Recording.cell``)."""
    __slots__ = ("fn", "value")

    def __init__(self, fn):
        self.fn = fn
        self.value = fn()


class Recording:
    """The commands queued inside ``record()`` (see the module docstring)."""

    def __init__(self, be, inputs: dict | None = None):
        self.be = be
        self.thread = threading.get_ident()
        self.inputs = {name: np.asarray(a) for name, a in (inputs or {}).items()}
        self.meta = {name: (a.shape, a.dtype) for name, a in self.inputs.items()}
        self.bound: set = set()  # input names an upload was bound to
        self.actions: list = []
        self.cells: list = []
        self.hooks: list = []
        self.guards: list = []
        self.written: list = []  # blocks of the arrays ``carry`` writes
        self.pinned: dict = {}
        self.ok, self.reason = True, None
        self._prepared = None
        self._keep = []  # host arrays of the last replay's uploads (until its commands are done)

    # ---- while recording ------------------------------------------------------------------------
    def fail(self, reason: str) -> None:
        """The recording is unusable: its buffers go back now (the work goes on unrecorded: ``recording()``
        is None from here, so the ops check their data again); its guards stay to be checked."""
        if self.ok:
            self.ok, self.reason = False, reason
            self.close()

    def _pin(self, buf) -> None:
        if self.ok and id(buf) not in self.pinned:  # (a failed recording pins nothing more: it gave its buffers back)
            self.pinned[id(buf)] = buf
            # a sub-buffer (wgrad.py's shifted panels) counts nothing: its memory is its parent's, pinned by the
            # command that wrote it (the panels' packing launch), not once more per view
            sub = buf.get_info(self.be.cl.mem_info.ASSOCIATED_MEMOBJECT) is not None
            if self.be.pool.pin(buf, 0 if sub else None) > MAX_PINNED_BYTES:
                self.fail(f"the open recordings would keep more than {MAX_PINNED_BYTES >> 20} MiB of buffers")

    def _mine(self) -> bool:
        if threading.get_ident() != self.thread:
            self.fail("a command was queued from another thread while recording")
            return False
        return self.ok

    def launch(self, kernel, name, gsize, lsize, args):
        """The arguments to launch with now (cells as their values); the launch is kept."""
        cl = self.be.cl
        cells = [i for i, a in enumerate(args) if type(a) is Cell]
        values = tuple(a.value if type(a) is Cell else a for a in args) if cells else args
        if self._mine():
            for a in args:
                if isinstance(a, cl.MemoryObjectHolder):
                    self._pin(a)
            self.actions.append(("k", kernel, name, tuple(gsize), None if lsize is None else tuple(lsize), args, cells))
        return values

    def copy(self, dst, src, kw) -> None:
        if self._mine():
            self._pin(dst)
            self._pin(src)
            self.actions.append(("c", dst, src, dict(kw)))

    def fill(self, buf, pattern, offset: int, size: int) -> None:
        if self._mine():
            self._pin(buf)
            self.actions.append(("f", buf, pattern, offset, size))

    def upload(self, buf, host, offset: int = 0) -> None:
        if self._mine():
            self._pin(buf)
            name = self._input_of(host)
            if name is not None:
                self.bound.add(name)
            self.actions.append(("u", buf, name, None if name is not None else np.array(host, copy=True),
                                 offset, host.shape, host.dtype))

    def _input_of(self, host):
        """The name of the input ``host`` is (that array, or a view of its memory with all its bytes: a
        reshape), or None. (Equal values alone prove nothing: a scalar 1.0 is no target of 1.0.)"""
        for name, a in self.inputs.items():
            if host is a or (host.dtype == a.dtype and host.nbytes == a.nbytes and host.nbytes
                             and np.shares_memory(host, a)):
                return name
        return None

    def carry(self, dst, src, first: bool = False) -> None:
        """Copy array ``src`` into ``dst`` (same size) now and at the end of every replay: the state a step
        makes (new weights) into the arrays the recording reads (the only writes into an array an op
        did not make: the device's caches keyed by array, ``_finite_flags``, forget ``dst``). ``first``: before the
        recorded commands (a copy of the state they start from) instead of after them."""
        kw = _copy_kw(dst, src)
        self._pin(dst.buffer)
        self._pin(src.buffer)
        self.actions.insert(0 if first else len(self.actions), ("c", dst.buffer, src.buffer, kw))
        self.written.append(dst.block)
        self.be._assign(dst, src)

    def swapped(self, mapping: dict) -> "Recording":
        """This recording with buffers exchanged (``mapping``: id(buffer) -> buffer, both ways): the same
        commands on the other one of two sets of state arrays (learn/replay.py alternates the two instead
        of copying the new state back). Shares the cells, hooks and guards; this one keeps the pins."""
        cl = self.be.cl
        sub = lambda b: mapping.get(id(b), b)  # noqa: E731
        twin = object.__new__(Recording)
        twin.__dict__.update(self.__dict__)
        twin.pinned, twin._prepared, twin._keep, twin.written = {}, None, [], []
        acts = []
        for act in self.actions:
            kind = act[0]
            if kind == "k":
                args = tuple(sub(a) if isinstance(a, cl.MemoryObjectHolder) else a for a in act[5])
                acts.append(act[:5] + (args,) + act[6:])
            elif kind == "c":
                acts.append((kind, sub(act[1]), sub(act[2]), act[3]))
            else:
                acts.append((kind, sub(act[1])) + act[2:])
        twin.actions = acts
        return twin

    def signature(self) -> list:
        """What the recorded commands would do, without the buffers they do it to: kernels, sizes and scalar
        arguments (a local-memory argument by its size), the uploads' data (or input names), copies' and fills' sizes. Two recordings of one piece
        of code with equal signatures took the same path on the same constants; one whose scalars or
        uploads came from the step's data (a count, a host-made index) shows up as a difference."""
        cl = self.be.cl
        out = []
        for act in self.actions:
            kind = act[0]
            if kind == "k":
                _, _, name, g, l, args, _ = act
                out.append((kind, name, g, l, tuple("cell" if type(a) is Cell else "buf" if
                                                    isinstance(a, cl.MemoryObjectHolder) else ("local", a.size) if
                                                    isinstance(a, cl.LocalMemory) else a for a in args)))
            elif kind == "u":
                _, _, name, snap, offset, shape, dtype = act
                out.append((kind, name, offset, shape, str(dtype), None if snap is None else snap.tobytes()))
            elif kind == "c":
                out.append((kind, tuple(sorted(act[3].items()))))
            else:
                out.append((kind, bytes(np.asarray(act[2])), act[3], act[4]))
        return out

    def cell(self, fn) -> Cell:
        c = Cell(fn)
        self.cells.append(c)
        return c

    def on_replay(self, fn) -> None:
        self.hooks.append(fn)

    def guard_finite(self, scalar) -> None:
        """``scalar`` (a 0-d device array computed by recorded launches) must be finite for the recorded
        path to be the one taken."""
        if self._mine():
            if len(self.guards) >= MAX_GUARDS:
                self.fail("too many data-dependent checks")
            self._pin(scalar.buffer)
            self.guards.append(scalar)

    # ---- replaying ----------------------------------------------------------------------------------
    def _prepare(self):
        """Each launch gets its own kernel object with its arguments set once."""
        cl = self.be.cl
        out = []
        for act in self.actions:
            if act[0] != "k":
                out.append(act)
                continue
            _, kernel, name, g, l, args, cells = act
            k = cl.Kernel(kernel.program, kernel.function_name)
            sig = SIGS[name]
            k.set_scalar_arg_dtypes(sig)
            k.set_args(*(a.value if type(a) is Cell else a for a in args))
            out.append(("k", k, g, l, [(i, args[i], sig[i]) for i in cells]))
        return out

    def matches(self, inputs: dict) -> bool:
        """Whether ``inputs`` fit the recorded uploads (same names, shapes and dtypes)."""
        if not self.ok or set(inputs) != set(self.meta):
            return False
        return all((np.shape(a), np.asarray(a).dtype) == self.meta[k] for k, a in inputs.items())

    def replay(self, inputs: dict | None = None) -> None:
        """Enqueue the recorded commands again (``inputs``: the arrays for the named uploads)."""
        cl, q = self.be.cl, self.be.queue
        if self._prepared is None:
            self._prepared = self._prepare()
        for fn in self.hooks:
            fn()
        for c in self.cells:
            c.value = c.fn()
        keep = []
        for act in self._prepared:
            kind = act[0]
            if kind == "k":
                _, k, g, l, cells = act
                for i, c, dt in cells:
                    k.set_arg(i, dt(c.value))
                cl.enqueue_nd_range_kernel(q, k, g, l)
            elif kind == "c":
                cl.enqueue_copy(q, act[1], act[2], **act[3])
            elif kind == "f":
                cl.enqueue_fill_buffer(q, act[1], act[2], act[3], act[4])
            else:
                _, buf, name, snap, offset, shape, dtype = act
                host = snap if name is None else np.ascontiguousarray(inputs[name], dtype).reshape(shape)
                keep.append(host)
                cl.enqueue_copy(q, buf, host, dst_offset=offset, is_blocking=False)
        self._keep = keep
        if self.written:
            self.be._forget_values(self.written)

    def guards_pass(self) -> bool:
        """Whether every guard held in the last replay (reads them back: waits for the queue)."""
        return all(bool(np.isfinite(self.be._to_numpy(g)).all()) for g in self.guards)

    def close(self) -> None:
        """Stop pinning: the buffers go back to the pool once no array holds them."""
        self._prepared, self.actions, self._keep, self.written = None, [], [], []
        pinned, self.pinned = self.pinned, {}
        self.be.pool.unpin(pinned.values())


class CLReplay:
    """Recording and the queue's commands (a mixin of OpenCLBackend): every command goes through
    ``_q_*`` (or ``_run``), which also records it while ``record()`` is open on the calling thread."""

    _rec = None

    @contextlib.contextmanager
    def record(self, inputs: dict | None = None):
        """Record the commands the block queues (``inputs``: name -> host array the block uploads,
        replayed from new arrays); yields the ``Recording``. One recording at a time."""
        rec = Recording(self, inputs)
        with _OPEN:
            if self._rec is not None:
                raise RuntimeError("a recording is already open on this backend")
            self._rec = rec
        try:
            yield rec
        finally:
            self._rec = None
            rec.inputs = {}

    def recording(self):
        """The open recording when the calling thread is the one recording and it is still usable (else None)."""
        rec = self._rec
        return rec if rec is not None and rec.ok and rec.thread == threading.get_ident() else None

    @staticmethod
    def _pair_buffers(pairs, unchanged) -> dict | None:
        """id(buffer) -> buffer exchanging the buffers of the arrays in ``pairs`` ((a, b): a step's input and
        output state arrays) both ways, or None where they do not pair up buffer for buffer (other offsets,
        a buffer in two pairs of buffers or under an ``unchanged`` array)."""
        m: dict = {}
        for b, a in pairs:
            bb, ab = b.buffer, a.buffer
            if b.offset != a.offset or bb is ab or m.get(id(bb), ab) is not ab or m.get(id(ab), bb) is not bb:
                return None
            m[id(bb)], m[id(ab)] = ab, bb
        if any(u is not None and id(u.buffer) in m for u in unchanged):
            return None
        return m

    def _assign(self, dst, src) -> None:
        """Array ``src`` copied into ``dst`` (same size): only for state a recording replays into
        (learn/replay.py), never an op's input."""
        self.cl.enqueue_copy(self.queue, dst.buffer, src.buffer, **_copy_kw(dst, src))
        self._forget_values([dst.block])

    def _forget_values(self, blocks) -> None:
        """Drop what is cached about the values of arrays on ``blocks`` (written in place by a replay)."""
        flags = self.__dict__.get("_finite_flags")
        if flags:
            for b in blocks:
                flags.pop(b, None)

    def _q_copy(self, dst, src, **kw) -> None:
        """Device-to-device copy (``enqueue_copy`` keywords)."""
        rec = self._rec
        if rec is not None:
            rec.copy(dst, src, kw)
        self.cl.enqueue_copy(self.queue, dst, src, **kw)

    def _q_fill(self, buf, pattern, offset: int, size: int) -> None:
        rec = self._rec
        if rec is not None:
            rec.fill(buf, pattern, offset, size)
        self.cl.enqueue_fill_buffer(self.queue, buf, pattern, offset, size)

    def _q_upload(self, buf, host, offset: int = 0) -> None:
        """Host array to a device buffer (waits until copied)."""
        rec = self._rec
        if rec is not None:
            rec.upload(buf, host, offset)
        self.cl.enqueue_copy(self.queue, buf, host, dst_offset=offset, is_blocking=True)

    def _q_read(self, host, buf, offset: int = 0) -> None:
        """A device buffer into a host array (waits for the queue)."""
        rec = self.recording()
        if rec is not None:
            rec.fail("data was read back to the host while recording")
        self.cl.enqueue_copy(self.queue, host, buf, src_offset=offset, is_blocking=True)
