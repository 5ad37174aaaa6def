"""One training step (forward, loss, backward, optimizer), run op by op or replayed from recorded launches.

``train()`` and ``anydevice bench --train`` take their steps through ``TrainStep``. On a backend with
"replay" (OpenCL: backend/devices/opencl/replay.py) the steps RECORD_AT and RECORD_AT + 1 are recorded in
two pieces, the forward with the loss, and the backward with the optimizer's update; if both steps queued
the same kernels with the same scalars and uploads (``Recording.signature``: nothing in them was made from
the step's data but the uploaded batch), the later steps replay the second recording
without running the Python of the ops (the digits CNN's step on PoCL: ~100 ops of Python, two thirds of
its time). Between the pieces the loss is read, as in the eager step: a non-finite loss leaves the
weights as they were (the backward piece is not run).

The state the update replaces (parameters, the optimizer's moments) lives in two sets of arrays, the
recorded step's input and output: the replays alternate between the recording and its twin on exchanged
buffers (``Recording.swapped``), and the Python objects follow the current set. State the forward piece
writes (batch norm's running statistics), and state whose arrays do not pair up buffer for buffer, is
copied instead: the backward piece first copies it aside (what ``previous`` returns after a NaN) and
ends by copying the new values into the arrays the recording reads. Each replay uploads the new batch
into the recorded input buffers.

Inputs are uploaded as float32 and class targets as int64, so each upload of them is bound to the new
batch. Two recorded steps with equal class targets but other inputs are not compared (the later is kept
for the next step): their equal uploads would not show what was made from the targets; two recorded
steps with the very same batch replay only that batch (``anydevice bench --train``'s case). Recordings
that differ are tried again with the next step, up to MAX_RECORDINGS.

Not replayed (op by op instead, and logged at debug level): networks with dropout (a replay would repeat
its mask), batches of another shape (the last, short one), class targets holding the loss's
ignore_index (the mean's count would change), a recording that read data back to the host or hit a
path that depends on the values (``Recording.reason``), and everything with ANYDEVICE_GRAPHS=0. A
replay whose data-dependent check fails (non-finite weights on a strided transposed conv) ends the
replaying: the following steps run op by op.
"""
from __future__ import annotations

import logging
import math

import numpy as np

from ..system import config

log = logging.getLogger("anydevice")

#: the step recorded (the first builds and tunes kernels and creates the optimizer's state)
RECORD_AT = 2
#: steps recorded at most while looking for two that match
MAX_RECORDINGS = 5
#: layer types whose output changes from step to step for the same input (never replayed)
STOCHASTIC = frozenset({"dropout"})


def _stochastic(layers) -> bool:
    for layer in layers:
        if layer.get("type") in STOCHASTIC and float(layer.get("p", 0.5)) > 0:
            return True
        if isinstance(layer.get("body"), list) and _stochastic(layer["body"]):
            return True
    return False


class TrainStep:
    """Training steps of ``net`` with parameters ``pvars`` (name -> Var), optimizer ``opt`` and running
    statistics ``buffers`` (name -> device array; ``self.buffers`` holds the current ones) on ``be``;
    ``loss_fn(pred, target)`` is the loss Var; class targets equal to ``ignore_index`` are never replayed."""

    def __init__(self, be, net, pvars: dict, opt, buffers: dict, loss_fn, ignore_index: int = -100):
        self.be, self.net, self.pvars, self.opt, self.loss_fn = be, net, pvars, opt, loss_fn
        self.buffers = dict(buffers)
        self.ignore_index = ignore_index
        self.n = self.recorded = 0
        self.loss = self.first = None
        self.variants, self._sets, self._cur, self._first_inputs, self._only = [], None, 0, None, None
        self._in = self._backup = None
        self.off = None
        self._prev = self._state()  # the state before the last update (train() returns it after a NaN)
        if "replay" not in be.caps.fused:
            self.off = f"{be.name} has no launch replay"
        elif not config.get("ANYDEVICE_GRAPHS"):
            self.off = "ANYDEVICE_GRAPHS=0"
        elif _stochastic(net.layers):
            self.off = "the network has dropout"

    @property
    def replaying(self) -> bool:
        return bool(self.variants)

    def __call__(self, x, t, seed=None) -> float:
        """One step on inputs ``x`` and targets ``t`` (host arrays): the loss value. A non-finite loss
        leaves the parameters, the optimizer's state and the buffers as they were."""
        self.n += 1
        t = np.asarray(t)
        inputs = {"inputs": np.ascontiguousarray(x, np.float32),
                  "targets": np.ascontiguousarray(t, np.int64) if t.dtype.kind in "iu" else
                  np.ascontiguousarray(t, np.float32) if t.dtype.kind == "f" else np.ascontiguousarray(t)}
        t = inputs["targets"]
        ok_batch = t.dtype.kind == "f" or not bool(np.any(t == self.ignore_index))
        if self.variants:
            if ok_batch and self.variants[0][0].matches(inputs) and (self._only is None or _same(self._only, inputs)):
                return self._replayed(inputs)
        elif self.off is None and ok_batch and self.n >= RECORD_AT:
            try:
                return self._recorded(inputs, seed)
            except RuntimeError as exc:  # another recording open on this device (another thread's training)
                if "already open" not in str(exc):
                    raise
                log.debug("AnyDevice train: step %d op by op (%s)", self.n, exc)
        return self._eager(inputs, seed)

    # ---- op by op -------------------------------------------------------------------------------
    def _forward(self, inputs, seed):
        from .autograd import Var
        be = self.be
        xb = Var(be, inputs["inputs"], name="inputs")
        t = inputs["targets"]
        tb = Var(be, t, name="targets") if t.dtype.kind == "f" else t
        pred, new_buffers = self.net.forward(be, xb, training=True, seed=seed, params=self.pvars,
                                             buffers=self.buffers, return_buffers=True)
        return self.loss_fn(pred, tb), new_buffers

    def _update(self, lv):
        self.opt.zero_grad()
        lv.backward()
        self.opt.step()

    def _eager(self, inputs, seed) -> float:
        lv, new_buffers = self._forward(inputs, seed)
        value = lv.item()
        if not math.isfinite(value):
            return value
        if not self.variants:
            self._prev = self._state()
            self._update(lv)
            self.buffers = new_buffers
            return value
        # while replaying: the new state goes into the arrays the recordings read
        be = self.be
        if self._sets is not None:
            self._forget_sets()
            src, dst = self._sets[self._cur], self._sets[self._cur ^ 1]
        else:
            src, dst = self._in, self._in
        for k, b in zip(self._backup, src):  # the copied state aside first (what ``previous`` returns)
            if k is not b:
                be._assign(k, b)
        self._prev = [k if k is not b else s_ for k, b, s_ in zip(self._backup, self._in, src)]
        self._update(lv)
        self.buffers = new_buffers
        for b, a in zip(dst, self._state()):
            if a is not b:
                be._assign(b, a)
        if self._sets is not None:
            self._cur ^= 1
        self._restore(dst)
        return value

    # ---- recorded, replayed ---------------------------------------------------------------------
    def _state(self) -> list:
        """The device arrays of the state a step replaces, in a fixed order."""
        out = [self.pvars[k].data for k in self.pvars]
        for st in self.opt.state.values():
            out += [st.get(k) for k in self.opt.BUFFERS]
        return out + [self.buffers[k] for k in sorted(self.buffers)]

    def _restore(self, arrays) -> None:
        """The Python objects back on ``arrays`` (``_state``'s order)."""
        it = iter(arrays)
        for k in self.pvars:
            self.pvars[k].data = next(it)
        for st in self.opt.state.values():
            for k in self.opt.BUFFERS:
                a = next(it)
                if a is not None:
                    st[k] = a
        self.buffers = {k: next(it) for k in sorted(self.buffers)}

    def _forget_sets(self) -> None:
        """The device's caches of values forget both state sets (they are written in place)."""
        self.be._forget_values([a.block for a in self._sets[0] + self._sets[1] if a is not None])

    def _give_up(self, why: str) -> None:
        if self._sets is not None:
            self._forget_sets()
        for pair in self.variants:
            for rec in pair:
                rec.close()
        self.variants, self._sets, self._only, self.loss = [], None, None, None
        self._drop_first(why)

    def _recorded(self, inputs, seed) -> float:
        """A step run op by op and recorded; see the module docstring for when the recording is replayed."""
        be = self.be
        before = self._state()
        fwd = bwd = None
        try:
            with be.record(inputs) as fwd:
                lv, new_buffers = self._forward(inputs, seed)
            value = lv.item()
            if not math.isfinite(value) or not fwd.ok or "inputs" not in fwd.bound:
                fwd.close()
                if math.isfinite(value):
                    self._prev = before
                    self._update(lv)
                    self.buffers = new_buffers
                    self._drop_first(fwd.reason or "the inputs were not uploaded inside the step")
                return value
            self._prev = before
            with be.record(inputs) as bwd:
                self._update(lv)
        except BaseException:
            for rec in (fwd, bwd):
                if rec is not None:
                    rec.close()
            raise
        self.buffers = new_buffers
        self.recorded += 1
        self._compare(before, self._state(), fwd, bwd, inputs, lv)
        return value

    def _compare(self, before, after, fwd, bwd, inputs, lv) -> None:
        """Keep (fwd, bwd) to compare with the next step's, or replay them from now on, or give up."""
        be = self.be
        pairs = [(b, a) for b, a in zip(before, after) if a is not b]
        first, self.first = self.first, None
        why = bwd.reason if not bwd.ok else None
        if why is None and (len(before) != len(after) or any(
                b is None or a is None or be._shape(a) != be._shape(b) or be._dtype(a) != be._dtype(b)
                for b, a in pairs)):
            why = "the step's state changed its layout"
        again = first is None or self._same_targets_only(inputs) or (
            why is None and (first[0].signature() != fwd.signature() or first[1].signature() != bwd.signature()))
        for rec in (first or ()):
            rec.close()
        if why is None and again:
            if self.recorded < MAX_RECORDINGS:  # compared with the next step's recording
                self.first, self._first_inputs = (fwd, bwd), inputs
                return
            why = "no two recorded steps matched (scalars or uploads made from the step's data)"
        if why is not None:
            fwd.close()
            bwd.close()
            self._drop_first(why)
            return
        if _same(self._first_inputs, inputs):  # the same batch twice: what came from it is unknown
            self._only = {k: a.copy() for k, a in inputs.items()}
        self.loss = lv.data
        # state the forward writes, or that does not pair up buffer for buffer: copied (and set aside first)
        written = set(fwd.pinned)
        mapping = be._pair_buffers([(b, a) for b, a in pairs if id(a.buffer) not in written],
                                   [b for b, a in zip(before, after) if a is b]
                                   + [x for b, a in pairs if id(a.buffer) in written for x in (b, a)])
        copied = [(b, a) for b, a in pairs if mapping is None or id(a.buffer) in written]
        backup = {id(b): be._empty(be._shape(b), be._dtype(b)) for b, _ in copied}
        for b, _ in copied:
            bwd.carry(backup[id(b)], b, first=True)
        for b, a in copied:
            bwd.carry(b, a)
        self._in = list(before)
        self._backup = [backup.get(id(b), b) for b in before]
        self._prev = list(self._backup)
        if mapping is not None:
            # the rest in two sets, the step's input and its output: the replays alternate between the
            # recording and its twin on exchanged buffers, so nothing is copied
            self.variants = [(fwd, bwd), (fwd.swapped(mapping), bwd.swapped(mapping))]
            cur = [b if id(b) in backup else a for b, a in zip(before, after)]
            self._sets, self._cur = [list(before), cur], 1
            self._restore(cur)
        else:
            self.variants, self._sets = [(fwd, bwd)], None
            self._restore(before)

    def _same_targets_only(self, inputs) -> bool:
        a, b = self._first_inputs, inputs
        return (a is not None and b["targets"].dtype.kind in "iu" and np.array_equal(a["targets"], b["targets"])
                and not np.array_equal(a["inputs"], b["inputs"]))

    def _drop_first(self, why: str) -> None:
        self.off = why
        log.debug("AnyDevice train: training steps run op by op (%s)", why)
        if self.first is not None:
            for rec in self.first:
                rec.close()
            self.first = None

    def _replayed(self, inputs) -> float:
        be = self.be
        fwd, bwd = self.variants[self._cur if self._sets is not None else 0]
        fwd.replay(inputs)
        value = float(np.asarray(be.to_numpy(self.loss)).reshape(-1)[0])
        if not math.isfinite(value):
            return value
        bwd.replay(inputs)
        if self._sets is not None:  # the swapped state is now in the other set
            self._prev = [k if k is not b else p for k, b, p in zip(self._backup, self._in, self._sets[self._cur])]
            self._cur ^= 1
            self._restore(self._sets[self._cur])
        if (fwd.guards or bwd.guards) and not (fwd.guards_pass() and bwd.guards_pass()):
            self._give_up("a data-dependent check failed in a replay (non-finite weights)")
        return value

    def _named(self, arrays) -> tuple[dict, dict]:
        names = sorted(self.buffers)
        tail = list(arrays[len(arrays) - len(names):]) if names else []
        return dict(zip(self.pvars, arrays)), dict(zip(names, tail))

    def current(self) -> tuple[dict, dict]:
        """(parameters, buffers) as device arrays, name -> array: the state now."""
        return self._named(self._state())

    def previous(self) -> tuple[dict, dict]:
        """(parameters, buffers) before the last update: those the last finite loss was computed with."""
        return self._named(self._prev)

    def close(self) -> None:
        """Drop the recordings (their buffers go back to the pool); later steps run op by op."""
        self._give_up("closed")


def _same(a: dict | None, b: dict) -> bool:
    """Whether two steps' host inputs are the same batch."""
    return a is not None and all(a[k].shape == b[k].shape and a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k])
                                 for k in b)
