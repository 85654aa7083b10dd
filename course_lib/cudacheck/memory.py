"""Memory as a checked kernel sees it: each allocation logs who touched which element, through ``TracedArray``."""
from __future__ import annotations

import sys

import numpy as np


def uninitialized(shape, dtype=np.float32):
    """An argument standing for ``cuda.device_array(shape, dtype)``: GPU memory nobody has written yet.

    After the check, ``copy_to_host()`` gives what the kernel left in it.
    """
    shape = (shape,) if isinstance(shape, (int, np.integer)) else shape
    return Uninitialized(tuple(int(n) for n in shape), numpy_dtype(dtype))


class Uninitialized:
    """What ``uninitialized`` gives: a shape and a dtype until a check runs, then what the kernel left."""

    def __init__(self, shape, dtype):
        self.shape, self.dtype = shape, dtype
        self._host = None

    def copy_to_host(self):
        if self._host is None:
            raise RuntimeError("this uninitialized array has not been through cudacheck.check yet")
        return self._host.copy()


class DeviceArray:
    """An argument standing for ``cuda.to_device(host)``: GPU memory holding a copy of ``host``.

    One object passed as two arguments is one buffer, as one device array is on the GPU, and
    so are slices of it (``x[1:]`` and ``x[:-1]`` overlap, as device array slices do).
    ``copy_to_host()`` gives what it holds (after a check: what the kernel left in it).
    """

    def __init__(self, host, root=None, index=None):
        self._host = np.array(host, order="C") if root is None else host
        self.root, self.index = root or self, index   # a slice: the array it was cut from, and how
        self.shape, self.dtype = self._host.shape, self._host.dtype

    def __getitem__(self, index):
        if self.root is not self:
            raise TypeError("cudacheck models slices of the array to_device gave, not slices of a slice: "
                            "cut it from the array itself")
        view = self._host[index]
        if not isinstance(view, np.ndarray):
            raise TypeError(f"index {index!r} names an element, not a slice of the device array")
        return DeviceArray(view, self, index)

    def view_of(self, data):
        """This array's elements within ``data``, a copy of its root's."""
        return data if self.root is self else data[self.index]

    def copy_to_host(self):
        return self._host.copy()

    def copy_to_device(self, data):
        self._host[...] = data

    def __array__(self, dtype=None, copy=None):
        return self.copy_to_host() if dtype is None else self.copy_to_host().astype(dtype)


def to_device(host):
    """What ``cuda.to_device(host)`` gives a launch: device memory initialized with a copy of ``host``."""
    return DeviceArray(host)


def numpy_dtype(dtype):
    try:
        return np.dtype(dtype)
    except TypeError:
        from numba.np import numpy_support  # a numba type such as numba.float32
        return numpy_support.as_dtype(dtype)


def junk(dtype):
    """What never-written memory holds here: NaN, or the largest int (an index that far is out of bounds)."""
    if dtype.kind == "f" or dtype.kind == "c":
        return np.nan
    if dtype.kind == "b":
        return True
    return np.iinfo(dtype).max


def outside(dtype):
    """What an out-of-bounds read gives here (it is reported): NaN, or 0 for an int, which a loop
    bound read past the end can take without running for ever."""
    return dtype.type(np.nan if dtype.kind in "fc" else 0)


class Memory:
    """One allocation: its data, and who touched each element when, for the checks in ``log``."""

    def __init__(self, log, name, space, data, initialized):
        self.log, self.name, self.space = log, name, space   # space: global | shared | local
        self.data = data                 # C-contiguous: element keys are flat indices
        self.flat = data.reshape(-1)
        self.initialized = initialized   # False: a read of an element never written is reported
        self.private = space == "local"  # one thread's own: no races possible
        self.writes = {}   # flat index -> (thread, interval, site, atomic, clock) of the last write
        self.reads = {}    # flat index -> [interval, thread, site, other thread, other site, older-block thread, site]
        self.n_reads = self.n_writes = 0
        self.names = [name]      # global: every argument this buffer was passed as
        self.releases = {}       # flat index -> {thread: clock of its last threadfence before an atomic here}
        self.redeclared = False  # shared: a thread ran its declaration again (a second call, a loop's next trip)
        # an integer array: (lo, hi) it can hold; its elements read as Python ints, as numba widens them
        self.int_range = (int(np.iinfo(data.dtype).min), int(np.iinfo(data.dtype).max)) \
            if data.dtype.kind in "iu" else None

    def alias(self, name):
        """The same buffer passed again, as argument ``name``: one log, its own name and counts."""
        twin = Memory(self.log, name, self.space, self.data, self.initialized)
        twin.writes, twin.reads, twin.releases, twin.names = self.writes, self.reads, self.releases, self.names
        self.names.append(name)
        return twin

    def title(self):
        if self.space != "global":
            return f"{self.space} array `{self.name}`"
        others = [f"`{n}`" for n in self.names if n != self.name]
        return f"`{self.name}`" + (f" (the same device array as {' and '.join(others)})" if others else "")


class TracedArray:
    """A numba array as the kernel sees it: indexing goes through the checks."""
    __slots__ = ("_mem", "_offset", "_strides", "_view", "name", "shape", "ndim", "dtype", "size")

    def __init__(self, mem, view, name):
        self._mem, self._view, self.name = mem, view, name
        item = view.itemsize
        self._offset = (view.__array_interface__["data"][0] - mem.data.__array_interface__["data"][0]) // item
        self._strides = tuple(s // item for s in view.strides)
        self.shape, self.ndim, self.dtype, self.size = view.shape, view.ndim, view.dtype, view.size

    def __len__(self):
        return self.shape[0]

    def __repr__(self):
        return f"<{self._mem.space} array {self.name} {self.dtype}{list(self.shape)}>"

    def _locate(self, index, access, frame):
        """The flat key of the element ``index`` names, a sub-array, or None when out of bounds."""
        if type(index) is not tuple:
            index = (index,)
        if len(index) != self.ndim or not all(type(i) is int for i in index):
            index = tuple(_as_index(i, self.name) for i in index)
            if len(index) > self.ndim:
                raise IndexError(f"{self.name} has {self.ndim} axes, indexed with {len(index)}: {index}")
            if len(index) < self.ndim or any(type(i) is slice for i in index):
                return self._subarray(index, access, frame)
        key = self._offset
        for axis, (i, n, s) in enumerate(zip(index, self.shape, self._strides)):
            if i < 0 or i >= n:
                self._mem.log.out_of_bounds(self, index, axis, access, frame)
                if not -n <= i < 0:
                    return None
                i += n   # numba wraps a negative index, as Python does
            key += i * s
        return key

    def _subarray(self, index, access, frame):
        for axis, i in enumerate(index):
            if type(i) is int and not 0 <= i < self.shape[axis]:
                self._mem.log.out_of_bounds(self, index, axis, access, frame)
                if not -self.shape[axis] <= i < 0:   # nowhere to point: scratch memory, so the kernel runs on
                    return _detached(self._mem.log, self.name, np.zeros(_sub_shape(self.shape, index),
                                                                        self.dtype))
        name = f"{self.name}[{', '.join(_index_text(i) for i in index)}]"
        return TracedArray(self._mem, self._view[index], name)

    def _fast_key(self, index):
        """The flat key of an in-bounds element named by plain ints (nearly every access), else None."""
        if type(index) is int:
            if self.ndim == 1 and 0 <= index < self.shape[0]:
                return self._offset + index * self._strides[0]
            return None
        if type(index) is not tuple or len(index) != self.ndim:
            return None
        key = self._offset
        for i, n, s in zip(index, self.shape, self._strides):
            if type(i) is not int or not 0 <= i < n:
                return None
            key += i * s
        return key

    def __getitem__(self, index):
        frame = sys._getframe(1)
        key = self._fast_key(index)
        if key is not None:
            return self._mem.log.read(self._mem, key, self, index, frame)
        key = self._locate(index, "reads", frame)
        if type(key) is int:
            return self._mem.log.read(self._mem, key, self, index, frame)
        if key is None:
            return outside(self.dtype)
        return key

    def __setitem__(self, index, value):
        frame = sys._getframe(1)
        key = self._fast_key(index)
        if key is not None:
            return self._mem.log.write(self._mem, key, self, index, frame, value)
        key = self._locate(index, "writes", frame)
        if type(key) is int:
            self._mem.log.write(self._mem, key, self, index, frame, value)
        elif key is not None:
            raise TypeError(f"cudacheck models element assignments only: `{self.name}[{index}] = ...` "
                            "assigns a whole sub-array; write a loop over its elements")


def _as_index(i, name):
    if isinstance(i, (bool, np.bool_)) or not isinstance(i, (int, np.integer, slice)):
        raise TypeError(f"index into {name} must be an integer, got {type(i).__name__} {i!r}: "
                        "use // for integer division, or int(...)")
    return i if type(i) is slice else int(i)


def _index_text(i):
    if type(i) is slice:
        return ":" if i == slice(None) else f"{'' if i.start is None else i.start}:{'' if i.stop is None else i.stop}"
    return str(i)


def _sub_shape(shape, index):
    kept = [len(range(n)[i]) for i, n in zip(index, shape) if type(i) is slice]
    return tuple(kept) + tuple(shape[len(index):])


def _detached(log, name, data):
    return TracedArray(Memory(log, name, "local", data, True), data, name)


def _index_tuple(index):
    return tuple(index) if isinstance(index, tuple) else (index,)


def index_str(index):
    return ", ".join(_index_text(i) if type(i) is slice else str(i) for i in _index_tuple(index))
